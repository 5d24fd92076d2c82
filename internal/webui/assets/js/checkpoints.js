// The notebook's checkpoint strip: the session's state (running or paused,
// with resume), its checkpoints (take one, restore one with a click, drop
// one), undo of the last cell, and fork into a new tab.

import { h, toast, fmtBytes, fmtAgo } from './dom.js';
import { api, getJSON, postJSON } from './api.js';

export class CheckpointStrip {
  // nb is the Notebook: its base path, its queue of runs, and what to
  // reload after a restore.
  constructor(nb) {
    this.nb = nb;
    this.base = nb.base;
    this.list = [];
    this.stateGen = 0; // counts pauses and resumes (changeState)
    const btn = (label, id, fn, title, cls = 'btn btn-sm') => h('button', { type: 'button', class: cls, id, title, onclick: fn }, label);
    this.stateEl = h('span', { class: 'badge', id: 'ck-state' }, '…');
    this.pauseBtn = btn('Pause', 'ck-pause', () => this.pause(), 'Freeze the session: it uses no CPU and keeps its memory; running a cell resumes it', 'btn btn-sm btn-ghost');
    this.resumeBtn = btn('Resume', 'ck-resume', () => this.resume(), 'Thaw the session');
    this.resumeBtn.hidden = true;
    this.name = h('input', { type: 'text', id: 'ck-name', class: 'ck-name', placeholder: 'name (optional)', maxlength: 100, 'aria-label': 'Checkpoint name' });
    this.name.addEventListener('keydown', e => { if (e.key === 'Enter') { e.preventDefault(); this.take(); } });
    this.takeBtn = btn('Checkpoint', 'ck-take', () => this.take(), 'Save the exact state: variables, imports and files');
    this.undoBtn = btn('Undo last cell', 'ck-undo', () => this.undo(), 'Go back to just before the last cell ran (variables and files)');
    this.forkBtn = btn('Fork', 'ck-fork', () => this.fork(), 'Copy this session (variables and files) into a new one, opened in a new tab', 'btn btn-sm btn-ghost');
    this.items = h('ol', { class: 'ck-list', id: 'ck-list', 'aria-label': 'Checkpoints, oldest first' });
    this.note = h('span', { class: 'small muted', id: 'ck-note' });
    this.el = h('section', { class: 'ck-strip card', id: 'ck-strip', 'aria-label': 'Checkpoints' },
      h('div', { class: 'ck-row' },
        h('strong', {}, 'Checkpoints'), this.stateEl, this.resumeBtn, this.pauseBtn,
        h('span', { class: 'ck-spacer' }),
        h('span', { class: 'actions nb-live' }, this.name, this.takeBtn, this.undoBtn, this.forkBtn)),
      h('div', { class: 'ck-row' }, this.items, this.note));
  }

  async load() {
    // A pause or resume answered while this load was on its way knows
    // better: its state is not overwritten by the older one (stateGen).
    const gen = this.stateGen;
    try {
      const [s, cps] = await Promise.all([getJSON(this.base), getJSON(this.base + '/checkpoints')]);
      if (gen === this.stateGen) this.showState(s.state || 'running');
      this.render(cps);
    } catch (e) {
      if (e.status === 404) return; // the notebook says the session is gone
      this.note.textContent = e.status === 501 ? 'This server has no checkpoints.' : 'Could not load the checkpoints: ' + e.message;
      this.el.classList.toggle('ck-off', e.status === 501);
    }
  }

  showState(state) {
    this.state = state;
    this.stateEl.textContent = state;
    this.stateEl.className = 'badge ' + (state === 'paused' || state === 'hibernated' ? 'badge-warn' : state === 'closed' ? '' : 'badge-ok');
    this.resumeBtn.hidden = state !== 'paused';
    this.pauseBtn.hidden = state === 'paused';
  }

  render({ checkpoints = [], held_bytes = 0 }) {
    this.list = checkpoints;
    this.undoBtn.disabled = !checkpoints.some(c => c.auto);
    this.items.replaceChildren(...checkpoints.map(c => h('li', { class: 'ck-item' + (c.auto ? ' ck-auto' : ''), dataset: { id: c.id } },
      h('span', { class: 'ck-label', title: c.id }, c.name || c.id),
      c.auto ? h('span', { class: 'small muted' }, `auto, after [${c.execution_count}]`) : null,
      h('span', { class: 'small muted', title: new Date(c.created_at).toLocaleString() }, fmtAgo(c.created_at)),
      h('span', { class: 'small muted ck-size', title: `${fmtBytes(c.memory_bytes)} of memory of its own (copy-on-write: it grows as the session changes what it shares), ${c.files} files (${fmtBytes(c.file_bytes)})` }, fmtBytes(c.memory_bytes + c.file_bytes)),
      h('button', { type: 'button', class: 'btn btn-sm ck-restore nb-live', title: `Restore ${c.id}: variables and files as they were`, onclick: () => this.restore(c) }, 'Restore'),
      h('button', { type: 'button', class: 'btn btn-sm btn-ghost ck-drop nb-live', title: `Drop ${c.id}`, 'aria-label': `Drop checkpoint ${c.id}`, onclick: () => this.drop(c) }, '×'))));
    this.note.textContent = checkpoints.length ? `${fmtBytes(held_bytes)} held` : 'None yet.';
  }

  // after runs fn once the cells queued before it have run: a session
  // runs one thing at a time.
  after(fn) {
    const p = this.nb.queue.then(fn);
    this.nb.queue = p.catch(() => {});
    return p;
  }

  async take() {
    this.takeBtn.disabled = true;
    try {
      const cp = await this.after(() => postJSON(this.base + '/checkpoints', this.name.value ? { name: this.name.value } : {}));
      this.name.value = '';
      toast(`Checkpoint ${cp.name || cp.id} taken` + (cp.not_carried?.length ? ` (not carried: ${cp.not_carried.join('; ')})` : ''));
    } catch (e) { this.failed('Checkpoint', e); }
    this.takeBtn.disabled = false;
    this.load();
  }

  async restore(c) {
    await this.restoreWith('Restore', () => postJSON(this.base + '/checkpoints/' + encodeURIComponent(c.id) + '/restore'));
  }

  async undo() { await this.restoreWith('Undo', () => postJSON(this.base + '/undo')); }

  async restoreWith(what, call) {
    try {
      const s = await this.after(call);
      this.restored(s.restored);
    } catch (e) { this.failed(what, e); }
    this.load();
  }

  // restored shows what came back: cells that ran after the restored
  // point are marked, their effects undone; the files and notebook reload.
  restored(r) {
    if (!r) return;
    for (const c of this.nb.cells) c.el.classList.toggle('cell-undone', c.count != null && c.count > r.execution_count);
    const lost = r.not_restored?.length ? ` Not restored: ${r.not_restored.join('; ')}.` : '';
    toast(`Restored from ${r.from}: ${r.files} files, execution count ${r.execution_count}.${lost}`, lost ? 'error' : 'info');
    this.nb.files.reload();
    this.nb.load();
  }

  async drop(c) {
    try {
      await api('DELETE', this.base + '/checkpoints/' + encodeURIComponent(c.id));
    } catch (e) { this.failed('Drop', e); }
    this.load();
  }

  // fork opens the tab at once (a tab opened after an await would be a
  // blocked popup), then points it at the new session.
  async fork() {
    const tab = window.open('', '_blank');
    try {
      await this.nb.save();
      const { sessions, restored } = await this.after(() => postJSON(this.base + '/fork', { count: 1 }));
      const url = location.origin + location.pathname + '#/notebook/' + encodeURIComponent(sessions[0].id);
      if (tab) tab.location.href = url;
      else location.hash = '#/notebook/' + encodeURIComponent(sessions[0].id);
      const lost = restored?.not_restored?.length ? ` Not copied: ${restored.not_restored.join('; ')}.` : '';
      toast(`Forked into ${sessions[0].id}.${lost}`, lost ? 'error' : 'info');
    } catch (e) {
      tab?.close();
      this.failed('Fork', e);
    }
  }

  async pause() { await this.changeState('/pause', 'Pause'); }

  async resume() { await this.changeState('/resume', 'Resume'); }

  // changeState posts a pause or a resume and shows the state it answers;
  // a load begun before that answer leaves the state alone (stateGen).
  async changeState(path, what) {
    this.stateGen++;
    try {
      const { state } = await postJSON(this.base + path);
      this.stateGen++;
      this.showState(state);
    } catch (e) { this.failed(what, e); }
  }

  // failed says what went wrong; a 404 is a missing checkpoint (or
  // nothing to undo) unless the session itself is gone, which the
  // notebook then shows.
  failed(what, e) {
    toast(what + ' failed: ' + e.message, 'error');
    if (e.status === 404) this.nb.refreshInfo();
  }
}
