// The Notebook page: a sandbox session used like Jupyter, with a file browser.

import { h, clear, toast, fmtBytes, fmtDuration, fmtAgo } from './dom.js';
import { api, getJSON, postJSON, ndjson, download, filePath, APIError, onSessionRestored, onSessionWoken } from './api.js';
import { highlight } from './highlight.js';
import { Output, statusBadge } from './render.js';
import { CheckpointStrip } from './checkpoints.js';
import { SnapshotPanel, restoredNotice } from './snapshots.js';
import { PortsPanel } from './ports.js';
import { UsagePanel } from './usage.js';
import { HistoryPanel, closedInfo } from './history.js';
import { TerminalPanel } from './terminal.js';

export function mountNotebook(root, sessionID) {
  if (!sessionID) return chooser(root);
  const nb = new Notebook(root, sessionID);
  return { dispose() { nb.dispose(); }, unsaved: () => nb.wouldLose() };
}

// A cell's id, unique in its notebook (nbformat's pattern).
const newID = () => Math.random().toString(36).slice(2, 10) + Date.now().toString(36).slice(-4);

// chooser lists this token's sessions and starts new ones.
function chooser(root) {
  const list = h('ul', { class: 'session-list', id: 'session-list' });
  // The environment: the server's default, the plain sandbox Python, or
  // one of its templates (GET /v1/templates); hidden without templates.
  const tmpl = h('select', { id: 'session-template', 'aria-label': 'Environment' },
    h('option', { value: 'default' }, 'Server default environment'),
    h('option', { value: '' }, 'Plain Python (no template)'));
  const tmplRow = h('label', { class: 'row small', hidden: true }, 'Environment ', tmpl);
  const start = h('button', { type: 'button', class: 'btn btn-primary', id: 'session-new', onclick: () => newSession(start, tmpl.value) }, 'Start a new session');
  root.append(h('div', { class: 'narrow' }, h('section', { class: 'card stack' },
    h('h2', {}, 'Notebook'),
    h('p', { class: 'muted' }, 'A session is a sandboxed Python kernel: variables persist between cells, plots and DataFrames display inline, and files live in its workspace.'),
    tmplRow,
    h('div', { class: 'row' }, start),
    h('h3', {}, 'Open sessions'), list)));
  getJSON('/v1/sessions').then(({ sessions }) => {
    if (!sessions.length) list.append(h('li', { class: 'empty' }, 'None yet.'));
    for (const s of sessions) {
      list.append(h('li', {}, h('a', { href: '#/notebook/' + encodeURIComponent(s.id), class: 'session-item' },
        h('span', { class: 'mono' }, s.id), statusBadge(s.status), s.state === 'paused' || s.state === 'hibernated' ? h('span', { class: 'badge badge-warn' }, s.state) : null,
        h('span', { class: 'muted small' }, 'last used ' + fmtAgo(s.last_used_at)))));
    }
  }, e => list.append(h('li', { class: 'empty' }, e.message)));
  getJSON('/v1/templates').then(({ templates }) => {
    for (const t of templates) {
      t.packages = t.packages || [];
      tmpl.append(h('option', { value: 'template:' + t.name },
        `${t.name} — Python ${t.python}, ${t.packages.length} package${t.packages.length === 1 ? '' : 's'}${t.warm ? ', warm' : ''}`));
    }
    tmplRow.hidden = !templates.length;
  }, () => {});
  return { dispose() {} };
}

async function newSession(btn, env) {
  btn.disabled = true;
  try {
    // A checkpoint before every cell, so Undo reverts the last one.
    const body = { checkpoints: 'auto' };
    // No template field: the server's default; "": the plain sandbox.
    if (env === '') body.template = '';
    else if (env.startsWith('template:')) body.template = env.slice('template:'.length);
    const s = await postJSON('/v1/sessions', body);
    location.hash = '#/notebook/' + encodeURIComponent(s.id);
  } catch (e) {
    toast('Could not start a session: ' + e.message, 'error');
  } finally {
    btn.disabled = false;
  }
}

// handoff carries a notebook's cells to the notebook of the session it
// was restored as (the server kept them with the lost host).
let handoff = null;

class Notebook {
  constructor(root, id) {
    this.id = id;
    this.carried = handoff?.to === id ? handoff : null;
    handoff = null;
    this.moving = false; // restored under another id: leaving for it
    onSessionRestored((from, to) => { if (from === this.id) this.restoredAs(to); });
    // Whichever request woke the session (a panel's poll may come before
    // the cell), the notice says what came back.
    onSessionWoken(id => { if (id === this.id) this.refreshInfo(); });
    this.movedEl = h('div', { id: 'nb-moved-slot' });
    if (this.carried) {
      this.movedEl.append(h('div', { class: 'callout callout-note', id: 'nb-moved', role: 'status' },
        h('strong', {}, 'Restored under a new id. '),
        `The host of session ${this.carried.from} was lost; the session was restored from its latest snapshot as ${id}. ` +
        'Work done after that snapshot is not in it. This notebook continues here, with its cells.'));
    }
    this.base = '/v1/sessions/' + encodeURIComponent(id);
    this.queue = Promise.resolve();
    this.cells = [];
    this.running = null;
    // The notebook is kept on the server: every change is saved (after a
    // pause in typing; at once after a run), so a reload, another tab or
    // another browser shows it as it is.
    this.rev = null;      // the server's revision these cells are based on
    this.saveTimer = null;
    this.saving = null;   // the PUT under way
    this.dirty = false;   // changed since the last save began
    this.saveError = null;
    this.saveState = h('span', { class: 'small muted', id: 'nb-saved', role: 'status', dataset: { state: 'loading' } }, 'Loading…');
    this.conflict = h('div', { class: 'callout callout-error', id: 'nb-conflict', role: 'alert', hidden: true },
      'This notebook was saved from another tab or browser since you opened it. ',
      h('button', { type: 'button', class: 'btn btn-sm', id: 'nb-load-theirs', onclick: () => this.load() }, 'Load that version'), ' ',
      h('button', { type: 'button', class: 'btn btn-sm btn-ghost', id: 'nb-keep-mine', onclick: () => { this.rev = null; this.conflict.hidden = true; this.save(); } }, 'Keep mine (overwrite)'));
    this.importInput = h('input', { type: 'file', accept: '.ipynb,application/x-ipynb+json,application/json', id: 'nb-import-file', hidden: true });
    this.importInput.addEventListener('change', () => this.importFile());
    this.sessionInfo = h('span', { class: 'session-info', id: 'session-info' });
    this.cellsEl = h('div', { class: 'cells', id: 'cells' });
    const btn = (label, id, fn, cls = 'btn') => h('button', { type: 'button', class: cls, id, onclick: fn }, label);
    this.files = new FileBrowser(this.base, () => this.gone());
    this.net = new NetworkPanel(this.base);
    this.ck = new CheckpointStrip(this);
    this.snaps = new SnapshotPanel(this);
    this.restoredEl = h('div', { id: 'nb-restored-slot' });
    this.ports = new PortsPanel(this.base);
    this.usage = new UsagePanel(this.base);
    this.history = new HistoryPanel(this);
    this.term = new TerminalPanel(this.base);
    this.goneWhy = h('span', { id: 'nb-gone-why' }, ' (it was closed, or ended after being idle)');
    this.goneNote = h('div', { class: 'callout callout-error', id: 'nb-gone', role: 'alert', hidden: true },
      h('strong', {}, 'This session no longer exists'), this.goneWhy, '; its kernel and files are gone. ',
      h('a', { href: '#/notebook' }, 'Start another session'), '.');
    this.layout = h('div', { class: 'nb-layout' },
      h('section', { class: 'nb-main', 'aria-labelledby': 'nb-title' },
        h('div', { class: 'nb-toolbar card' },
          h('div', { class: 'nb-title-row' }, h('h2', { id: 'nb-title' }, 'Notebook'), this.sessionInfo),
          h('div', { class: 'actions nb-live' },
            btn('Run all', 'nb-run-all', () => this.cells.forEach(c => c.type === 'code' && this.run(c))),
            btn('Interrupt', 'nb-interrupt', () => this.interrupt()),
            btn('Restart', 'nb-restart', () => this.restart()),
            btn('Export .ipynb', 'nb-export', () => this.exportIpynb(), 'btn btn-ghost'),
            btn('Import .ipynb', 'nb-import', () => this.importInput.click(), 'btn btn-ghost'), this.importInput,
            btn('Close session', 'nb-close', () => this.closeSession(), 'btn btn-ghost')),
          this.saveState),
        this.ck.el, this.movedEl, this.restoredEl,
        this.goneNote, this.conflict,
        h('p', { class: 'hint nb-live' }, 'Shift+Enter runs a cell and moves on; Ctrl+Enter runs it in place. Tab moves focus out of the editor.'),
        this.cellsEl,
        h('div', { class: 'row nb-live' }, btn('+ Add cell', 'nb-add', () => this.addCell('', true).focus(), 'btn btn-ghost')),
        this.term.el),
      h('div', { class: 'nb-side' }, this.files.el, this.snaps.el, this.ports.el, this.usage.el, this.history.el, this.net.el));
    root.append(this.layout);
    this.refreshInfo();
    this.files.load('');
    this.net.load();
    this.ck.load();
    this.snaps.load();
    this.ports.load();
    this.usage.start();
    this.history.start();
    this.load();
    // A session may end while the tab is elsewhere (idle timeout), and
    // another tab may have changed the notebook: look again when the
    // reader comes back.
    this.onVisible = () => {
      if (document.visibilityState !== 'visible') return;
      this.refreshInfo();
      this.ck.load();
      if (!this.unsaved() && !this.running) this.load();
    };
    document.addEventListener('visibilitychange', this.onVisible);
    // Leaving the page with input the server does not have yet: the
    // browser asks first.
    this.onUnload = e => { if (this.unsaved()) { e.preventDefault(); e.returnValue = ''; } };
    window.addEventListener('beforeunload', this.onUnload);
  }

  dispose() {
    onSessionRestored(() => {});
    onSessionWoken(() => {});
    document.removeEventListener('visibilitychange', this.onVisible);
    window.removeEventListener('beforeunload', this.onUnload);
    clearTimeout(this.net.again);
    clearTimeout(this.ports.again);
    this.usage.stop();
    this.history.stop();
    this.term.dispose();
    if (this.saveTimer) this.save(); // now, not after the pause
  }

  // unsaved reports input the server does not have: a change not yet
  // saved, a save under way, or one that failed.
  unsaved() { return this.dirty || !!this.saving || this.wouldLose(); }

  // wouldLose reports input that leaving this page within the app would
  // lose (a pending save is made as the page goes): a save that failed, or
  // the cells of a session that is gone.
  wouldLose() {
    if (this.layout.classList.contains('nb-gone')) return this.cells.some(c => c.input.value.trim());
    return !!this.saveError;
  }

  // restoredAs leaves for session to, which this one was restored as,
  // once the cells queued have run (they reach it too), taking the cells.
  async restoredAs(to) {
    if (this.moving) return;
    this.moving = true;
    toast(`The host of this session was lost: it was restored from its latest snapshot as ${to}.`);
    await this.queue.catch(() => {});
    handoff = { from: this.id, to, cells: this.cells.map(c => c.toJSON()) };
    clearTimeout(this.saveTimer);
    this.saveTimer = null;
    this.dirty = false;
    this.saveError = null;
    location.hash = '#/notebook/' + encodeURIComponent(to);
  }

  // load shows the notebook the server holds (one empty cell if none).
  async load() {
    if (this.carried?.cells) {
      // The lost host's cells, saved to the new session over whatever
      // the redirected requests saved there.
      const cells = this.carried.cells;
      this.carried.cells = null;
      this.show({ cells, revision: 0 });
      this.rev = null;
      this.changed(true);
      return;
    }
    let nb;
    try {
      nb = await getJSON(this.base + '/notebook');
    } catch (e) {
      if (e.status === 404) this.gone();
      else this.setSaveState('error', 'Could not load the notebook: ' + e.message);
      if (!this.cells.length) this.addCell('', false);
      return;
    }
    if (nb.revision === this.rev && this.cells.length) return;
    this.show(nb);
  }

  show(nb) {
    this.rev = nb.revision;
    this.conflict.hidden = true;
    for (const c of this.cells) c.el.remove();
    this.cells = [];
    for (const saved of nb.cells || []) this.addCell(saved, false);
    if (!this.cells.length) this.addCell({ source: '' }, false);
    this.setSaveState('saved', nb.revision ? 'Saved' : '');
  }

  setSaveState(state, text) {
    this.saveState.dataset.state = state;
    this.saveState.textContent = text;
    this.saveState.classList.toggle('err', state === 'error');
  }

  // changed notes an edit: saved after a pause in typing, or at once.
  changed(now) {
    this.dirty = true;
    this.setSaveState('dirty', 'Unsaved changes');
    clearTimeout(this.saveTimer);
    this.saveTimer = setTimeout(() => this.save(), now ? 0 : 800);
  }

  async save() {
    clearTimeout(this.saveTimer);
    this.saveTimer = null;
    if (this.moving) return; // the next notebook saves the cells
    if (this.layout.classList.contains('nb-gone')) return;
    while (this.saving) await this.saving.catch(() => {});
    if (!this.dirty && !this.saveError) return;
    this.dirty = false;
    this.setSaveState('saving', 'Saving…');
    const body = { cells: this.cells.map(c => c.toJSON()) };
    if (this.rev != null) body.revision = this.rev;
    this.saving = api('PUT', this.base + '/notebook', { json: body }).then(r => r.json());
    try {
      const nb = await this.saving;
      this.rev = nb.revision;
      this.saveError = null;
      if (!this.dirty) this.setSaveState('saved', 'Saved');
    } catch (e) {
      this.saveError = e;
      if (e.status === 404) this.gone();
      else if (e.code === 'notebook_changed') { this.conflict.hidden = false; this.setSaveState('error', 'Not saved: changed elsewhere'); }
      else {
        this.setSaveState('error', 'Not saved: ' + e.message);
        if (e.status !== 413 && e.status !== 400 && !this.saveTimer) this.saveTimer = setTimeout(() => this.save(), 5000); // try again
      }
    } finally {
      this.saving = null;
    }
  }

  async exportIpynb() {
    if (this.saveTimer || this.saving) await this.save();
    try {
      await download(this.base + '/notebook.ipynb', 'notebook.ipynb');
    } catch (e) { this.failed('Export', e); }
  }

  async importFile() {
    const f = this.importInput.files[0];
    this.importInput.value = '';
    if (!f) return;
    if (this.cells.some(c => c.input.value.trim()) && !confirm(`Replace this notebook's cells with those of ${f.name}?`)) return;
    try {
      const resp = await api('PUT', this.base + '/notebook.ipynb', { body: f, headers: { 'Content-Type': 'application/x-ipynb+json' } });
      this.saveError = null;
      this.dirty = false;
      this.show(await resp.json());
      toast(`Imported ${f.name}: ${this.cells.length} cell${this.cells.length === 1 ? '' : 's'}`);
    } catch (e) { this.failed('Import', e); }
  }

  async refreshInfo() {
    try {
      const s = await getJSON(this.base);
      this.sessionInfo.replaceChildren(h('span', { class: 'mono' }, s.id), statusBadge(s.status, { id: 'session-status' }),
        h('span', { class: 'muted small' }, `${s.memory_mb} MB · ${s.cpus} CPU · ${s.timeout_s}s per cell`));
      if (s.template) this.sessionInfo.append(h('span', { class: 'badge', id: 'session-template-badge', title: 'the session runs in this template' }, 'template ' + s.template));
      if (s.message) this.sessionInfo.append(h('span', { class: 'small err' }, s.message));
      this.restoredEl.replaceChildren(...[restoredNotice(s.restored)].filter(Boolean));
    } catch (e) {
      if (e.status === 404) this.gone(closedInfo(e.message));
      else this.sessionInfo.replaceChildren(h('span', { class: 'err' }, e.message));
    }
  }

  // gone shows that the session has ended (closed elsewhere, expired, or
  // the server restarted): its controls go, since none of them can work.
  // gone marks the session closed; closed, if given, is when and why
  // ({at, reason}: its close event, or its 404's words).
  gone(closed) {
    if (closed?.at) this.goneWhy.textContent = ` (closed ${new Date(closed.at).toLocaleString()}: ${closed.reason})`;
    if (this.layout.classList.contains('nb-gone')) return;
    this.ck.showState('closed');
    this.layout.classList.add('nb-gone');
    this.goneNote.hidden = false;
    this.sessionInfo.replaceChildren(h('span', { class: 'mono' }, this.id), statusBadge('closed', { id: 'session-status' }));
    for (const c of this.cells) c.input.readOnly = true;
  }

  addCell(code, focus, after) {
    const c = new Cell(this, code);
    const idx = after ? this.cells.indexOf(after) + 1 : this.cells.length;
    this.cells.splice(idx, 0, c);
    const next = this.cells[idx + 1];
    this.cellsEl.insertBefore(c.el, next ? next.el : null);
    this.renumber();
    if (focus) c.focus();
    if (this.rev != null && typeof code === 'string') this.changed();
    return c;
  }

  removeCell(c) {
    const i = this.cells.indexOf(c);
    if (i < 0) return;
    this.cells.splice(i, 1);
    c.el.remove();
    if (!this.cells.length) this.addCell('', true);
    else this.cells[Math.min(i, this.cells.length - 1)].focus();
    this.renumber();
    this.changed();
  }

  renumber() { this.cells.forEach((c, i) => c.input.setAttribute('aria-label', `Code cell ${i + 1}`)); }

  // run queues a cell: a session runs one execution at a time.
  run(cell) {
    if (this.layout.classList.contains('nb-gone') || cell.type !== 'code') return this.queue;
    cell.queued();
    this.queue = this.queue.then(() => this.execute(cell));
    return this.queue;
  }

  async execute(cell) {
    cell.el.classList.remove('cell-undone');
    const ctl = new AbortController();
    this.running = { cell, ctl };
    cell.start();
    try {
      const resp = await api('POST', this.base + '/execute', { json: { code: cell.input.value }, headers: { Accept: 'application/x-ndjson' }, signal: ctl.signal });
      for await (const ev of ndjson(resp)) {
        if (ev.type === 'keepalive') continue;
        if (ev.type === 'restored') { toast(ev.text); this.refreshInfo(); continue; } // woken from hibernation
        if (ev.type === 'end') cell.end(ev);
        else cell.output(ev);
      }
    } catch (e) {
      if (e.name !== 'AbortError') cell.fail(e);
      if (e.status === 404) this.gone();
    } finally {
      this.running = null;
      cell.done();
      this.changed(true);
      this.files.reload();
      this.net.afterCell();
      this.ck.load();
      this.ports.afterCell();
      this.history.load();
    }
  }

  async interrupt() {
    try {
      await api('POST', this.base + '/interrupt');
      toast('Interrupt sent');
    } catch (e) { this.failed('Interrupt', e); }
  }

  async restart() {
    if (this.running) await this.interrupt();
    try {
      await api('POST', this.base + '/restart');
      for (const c of this.cells) { c.count = null; c.prompt.textContent = '[ ]'; }
      this.changed(true);
      toast('Kernel restarted: variables are cleared, files are kept');
      this.refreshInfo();
      this.history.load();
    } catch (e) { this.failed('Restart', e); }
  }

  failed(what, e) {
    if (e.status === 404) this.gone(closedInfo(e.message));
    else toast(what + ' failed: ' + e.message, 'error');
  }

  async closeSession() {
    if (!confirm('Close this session? Its kernel and workspace files are deleted.')) return;
    try {
      await api('DELETE', this.base);
      location.hash = '#/notebook';
    } catch (e) { toast('Close failed: ' + e.message, 'error'); }
  }
}

class Cell {
  // saved is a cell as the server keeps it, or the code of a new one.
  constructor(nb, saved) {
    if (typeof saved === 'string') saved = { source: saved };
    this.nb = nb;
    this.id = saved.id || newID();
    this.type = saved.type || 'code';
    this.count = saved.execution_count ?? null;
    this.result = null; // the end of the last execution: status, duration, memory
    this.outputs = [];
    const code = saved.source || '';
    this.prompt = h('div', { class: 'prompt', 'aria-hidden': 'true' }, this.type === 'code' ? '[ ]' : this.type);
    this.hl = h('pre', { class: 'editor-hl', 'aria-hidden': 'true' });
    this.input = h('textarea', { class: 'editor-input', spellcheck: 'false', autocapitalize: 'off', autocomplete: 'off', rows: 1, wrap: 'soft' });
    this.input.value = code;
    this.outEl = h('div', { class: 'output', 'aria-live': 'polite' });
    this.out = new Output(this.outEl);
    this.status = h('div', { class: 'cell-status' });
    const runBtn = h('button', { type: 'button', class: 'btn btn-sm btn-primary cell-run', title: 'Run (Shift+Enter)', onclick: () => nb.run(this) }, 'Run');
    const delBtn = h('button', { type: 'button', class: 'btn btn-sm btn-ghost cell-del', title: 'Delete cell', onclick: () => nb.removeCell(this) }, 'Delete');
    this.el = h('div', { class: 'cell' + (this.type === 'code' ? '' : ' cell-text'), dataset: { id: this.id } }, this.prompt,
      h('div', { class: 'cell-main' },
        h('div', { class: 'editor' }, this.hl, this.input),
        h('div', { class: 'cell-bar' }, this.status, h('div', { class: 'actions nb-live' }, runBtn, delBtn)),
        this.outEl));
    if (this.type !== 'code') runBtn.hidden = true;
    this.input.addEventListener('input', () => { this.paint(); nb.changed(); });
    this.input.addEventListener('keydown', e => this.key(e));
    this.paint();
    for (const o of saved.outputs || []) this.output(o);
    if (saved.status) this.end({ status: saved.status, execution_count: this.count, duration_ms: saved.duration_ms, memory_peak_bytes: saved.memory_peak_bytes });
    else if (this.count != null) this.prompt.textContent = `[${this.count}]`;
  }

  // output shows one event of an execution and keeps it for the server;
  // stream text is joined to the stream before it.
  output(ev) {
    this.out.event(ev);
    const last = this.outputs.at(-1);
    switch (ev.type) {
      case 'stdout': case 'stderr':
        if (last && last.type === ev.type) last.text += ev.text || '';
        else this.outputs.push({ type: ev.type, text: ev.text || '' });
        break;
      case 'result': this.outputs.push({ type: 'result', is_main_result: !!ev.is_main_result, data: ev.data || {} }); break;
      case 'error': this.outputs.push({ type: 'error', name: ev.name || '', value: ev.value || '', traceback: ev.traceback || '' }); break;
    }
  }

  toJSON() {
    const c = { id: this.id, type: this.type, source: this.input.value, execution_count: this.type === 'code' ? this.count : null, outputs: this.type === 'code' ? this.outputs : [] };
    if (this.result && this.type === 'code') {
      c.status = this.result.status;
      if (this.result.duration_ms) c.duration_ms = this.result.duration_ms;
      if (this.result.memory_peak_bytes) c.memory_peak_bytes = this.result.memory_peak_bytes;
    }
    return c;
  }

  // paint redraws the highlighted copy behind the transparent textarea; the
  // trailing newline keeps their heights equal when the code ends with one.
  paint() { this.hl.replaceChildren(highlight(this.input.value), '\n'); }

  focus() { this.input.focus(); }

  key(e) {
    if (e.key === 'Enter' && e.shiftKey) {
      e.preventDefault();
      this.nb.run(this);
      const i = this.nb.cells.indexOf(this);
      const next = this.nb.cells[i + 1] || this.nb.addCell('', false, this);
      next.focus();
    } else if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      this.nb.run(this);
    } else if (e.key === 'Enter' && !e.altKey) {
      // Keep the indentation of the current line, and indent after a colon.
      const { selectionStart: s, value: v } = this.input;
      const lineStart = v.lastIndexOf('\n', s - 1) + 1;
      const line = v.slice(lineStart, s);
      let indent = /^[ \t]*/.exec(line)[0];
      if (/:\s*$/.test(line)) indent += '    ';
      if (indent) {
        e.preventDefault();
        this.input.setRangeText('\n' + indent, s, this.input.selectionEnd, 'end');
        this.paint();
      }
    }
  }

  queued() { this.prompt.textContent = '[*]'; this.el.classList.add('queued'); }

  start() {
    this.el.classList.remove('queued', 'has-error');
    this.el.classList.add('running');
    this.out.reset();
    this.outputs = [];
    this.result = null;
    this.status.replaceChildren(h('span', { class: 'muted small' }, 'running…'));
  }

  end(ev) {
    this.count = ev.execution_count || null;
    this.result = { status: ev.status, duration_ms: ev.duration_ms, memory_peak_bytes: ev.memory_peak_bytes };
    this.prompt.textContent = `[${ev.execution_count || ' '}]`;
    const bits = [statusBadge(ev.status)];
    if (ev.duration_ms != null) bits.push(h('span', { class: 'muted small' }, fmtDuration(ev.duration_ms)));
    if (ev.memory_peak_bytes) bits.push(h('span', { class: 'muted small' }, fmtBytes(ev.memory_peak_bytes) + ' peak'));
    this.status.replaceChildren(...bits);
    if (ev.status !== 'ok') this.el.classList.add('has-error');
    if (ev.status === 'killed') this.outEl.append(h('div', { class: 'callout callout-error' }, 'The kernel died (out of memory, or killed). Restart the session to go on.'));
  }

  fail(e) {
    this.prompt.textContent = '[!]';
    this.el.classList.add('has-error');
    this.status.replaceChildren(statusBadge('error'));
    const msg = e instanceof APIError && e.code === 'busy' ? 'The session is busy with another execution.' : e.message;
    this.outEl.append(h('div', { class: 'callout callout-error' }, msg));
  }

  done() { this.el.classList.remove('running', 'queued'); }
}

// NetworkPanel shows the session's network mode and every connection its
// code made through the egress proxy (time, host, port, bytes, allowed or
// refused and why), newest first; the notebook reloads it after each cell.
class NetworkPanel {
  constructor(base) {
    this.base = base;
    this.summary = h('p', { class: 'small muted', id: 'net-summary' }, 'Loading…');
    this.rows = h('tbody', {});
    this.table = h('table', { class: 'net-table', id: 'net-table', hidden: true },
      h('thead', { class: 'sr-only' }, h('tr', {}, h('th', { scope: 'col' }, 'Result'), h('th', { scope: 'col' }, 'Connection'))),
      this.rows);
    this.el = h('section', { class: 'nb-network card', id: 'net-panel', 'aria-labelledby': 'net-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'net-title' }, 'Network'),
        h('button', { type: 'button', class: 'btn btn-ghost btn-sm nb-live', id: 'net-refresh', onclick: () => this.load() }, 'Refresh')),
      this.summary, h('div', { class: 'net-scroll' }, this.table));
  }

  // afterCell loads the log now and once more a moment later: the proxy
  // logs a connection when it ends, which can be just after the cell.
  afterCell() {
    this.load();
    clearTimeout(this.again);
    this.again = setTimeout(() => this.load(), 1000);
  }

  async load() {
    try {
      this.render(await getJSON(this.base + '/network'));
    } catch (e) {
      if (e.status !== 404) this.summary.textContent = 'Could not load the network log: ' + e.message;
    }
  }

  render(log) {
    const entries = (log.entries || []).slice().reverse();
    this.table.hidden = log.mode !== 'allow' || !entries.length;
    switch (log.mode) {
      case 'none':
        this.summary.textContent = 'No network: the code reaches only its own loopback.';
        return;
      case 'host':
        this.summary.textContent = "The host's whole network: connections are not logged.";
        return;
    }
    const bits = [`Through sandloop's proxy to ${(log.allow || []).join(', ') || 'nothing'}`,
      `${fmtBytes(log.bytes || 0)} of ${fmtBytes(log.max_bytes || 0)} used`];
    if (!entries.length) bits.push('no connections yet');
    if (log.dropped) bits.push(`${log.dropped} older connections not kept`);
    this.summary.textContent = bits.join(' · ') + '.';
    this.rows.replaceChildren(...entries.map(e => h('tr', { class: e.allowed ? 'net-allowed' : 'net-refused' },
      h('td', {}, h('span', { class: 'badge ' + (e.allowed && !e.reason ? 'badge-ok' : 'badge-err') }, e.allowed ? (e.reason ? 'cut' : e.open ? 'open' : 'allowed') : 'refused')),
      h('td', {},
        h('div', { class: 'mono net-target' }, `${e.method} ${e.host}:${e.port}`),
        h('div', { class: 'small muted' }, [new Date(e.time).toLocaleTimeString(),
          `${fmtBytes(e.bytes_out || 0)} sent`, `${fmtBytes(e.bytes_in || 0)} received`, e.open ? 'under way' : null, e.cache ? 'package cache: ' + e.cache : null].filter(Boolean).join(' · ')),
        e.reason ? h('div', { class: 'small net-reason' }, e.reason) : null))));
  }
}

// FileBrowser lists the session's workspace, with upload, download and delete.
class FileBrowser {
  constructor(base, onGone) {
    this.base = base;
    this.onGone = onGone;
    this.dir = '';
    this.crumbs = h('nav', { class: 'crumbs', 'aria-label': 'Folder' });
    this.list = h('ul', { class: 'file-list', id: 'file-list' });
    this.upload = h('input', { type: 'file', multiple: true, id: 'file-upload' });
    this.upload.addEventListener('change', () => this.send());
    this.el = h('aside', { class: 'nb-files card', 'aria-labelledby': 'files-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'files-title' }, 'Files'),
        h('button', { type: 'button', class: 'btn btn-ghost btn-sm nb-live', id: 'files-refresh', onclick: () => this.reload() }, 'Refresh')),
      this.crumbs, this.list,
      h('div', { class: 'field upload nb-live' }, h('label', { for: 'file-upload' }, 'Upload to this folder'), this.upload),
      this.archive = h('div', { class: 'row nb-live', hidden: true },
        h('button', { type: 'button', class: 'btn btn-sm', id: 'files-archive', onclick: () => download(this.base + '/archive?format=zip', 'workspace.zip').catch(e => toast(e.message, 'error')) }, 'Download workspace (.zip)')));
  }

  reload() { return this.load(this.dir); }

  async load(dir) {
    this.dir = dir;
    this.renderCrumbs();
    try {
      const { files } = await getJSON(this.base + '/files?path=' + encodeURIComponent(dir || '.'));
      files.sort((a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name));
      clear(this.list);
      if (!files.length) this.list.append(h('li', { class: 'empty' }, dir ? 'Empty folder.' : 'No files yet.'));
      for (const f of files) this.list.append(this.entry(f));
      // Nothing to download from an empty workspace.
      if (!dir) this.archive.hidden = !files.length;
    } catch (e) {
      if (e.status === 404) { clear(this.list); this.onGone(); return; }
      clear(this.list).append(h('li', { class: 'empty' }, e.message));
    }
  }

  renderCrumbs() {
    const parts = this.dir ? this.dir.split('/') : [];
    const items = [h('button', { type: 'button', class: 'link', onclick: () => this.load('') }, 'workspace')];
    parts.forEach((p, i) => items.push(' / ', h('button', { type: 'button', class: 'link', onclick: () => this.load(parts.slice(0, i + 1).join('/')) }, p)));
    this.crumbs.replaceChildren(...items);
  }

  entry(f) {
    const path = f.path || (this.dir ? this.dir + '/' + f.name : f.name);
    if (f.type === 'dir') {
      return h('li', { class: 'file dir' }, h('button', { type: 'button', class: 'link file-name', onclick: () => this.load(path) }, f.name + '/'));
    }
    return h('li', { class: 'file' },
      h('span', { class: 'file-name mono', title: path }, f.name),
      h('span', { class: 'muted small file-size' }, fmtBytes(f.size)),
      h('span', { class: 'file-actions nb-live' },
        h('button', { type: 'button', class: 'btn btn-sm btn-ghost', 'aria-label': 'Download ' + f.name, onclick: () => download(this.base + '/files/' + filePath(path), f.name).catch(e => toast(e.message, 'error')) }, 'Download'),
        h('button', { type: 'button', class: 'btn btn-sm btn-ghost', 'aria-label': 'Delete ' + f.name, onclick: () => this.remove(path) }, 'Delete')));
  }

  async send() {
    const files = [...this.upload.files];
    try {
      for (const f of files) {
        const p = this.dir ? this.dir + '/' + f.name : f.name;
        await api('PUT', this.base + '/files/' + filePath(p), { body: f, headers: { 'Content-Type': 'application/octet-stream' } });
      }
      toast(`Uploaded ${files.length} file${files.length === 1 ? '' : 's'}`);
    } catch (e) {
      toast('Upload failed: ' + e.message, 'error');
    }
    this.upload.value = '';
    this.reload();
  }

  async remove(path) {
    if (!confirm(`Delete ${path}?`)) return;
    try {
      await api('DELETE', this.base + '/files/' + filePath(path));
    } catch (e) { toast('Delete failed: ' + e.message, 'error'); }
    this.reload();
  }
}
