// HistoryPanel is what happened to the session, one line per transition
// of its life (GET /v1/sessions/{id}/events): created and how, paused and
// resumed, hibernated and woken, checkpoints, undo, forks, snapshots,
// restarts, a kernel that died, a loss of its processes, its close, each
// with why and what came back. It polls while the page is visible (a
// stream would hold one of the browser's few connections to the server
// for as long as the tab is open); reading does not count as using the
// session. The close's reason goes to the notebook's "gone" note.

import { h, fmtAgo } from './dom.js';
import { getJSON } from './api.js';

const POLL_MS = 5000;
const KEEP = 50; // lines shown, the latest

// label is an event's type in words.
const LABELS = {
  created: 'Created', paused: 'Paused', resumed: 'Resumed', hibernated: 'Hibernated', woken: 'Woken',
  checkpoint: 'Checkpoint', checkpoint_restored: 'Checkpoint restored', undone: 'Undone', forked: 'Forked',
  snapshot: 'Snapshot', kernel_restarted: 'Restarted', kernel_died: 'Kernel died', taken_over: 'Taken over', lost: 'Processes lost', closed: 'Closed',
};
const HOW = { new: 'a new kernel', pool: 'from the warm pool', template: 'in a template', snapshot: 'from a snapshot', fork: 'a fork' };

// detail says in one line what an event carries.
export function eventDetail(e) {
  const parts = [];
  if (e.how) parts.push(HOW[e.how] || e.how);
  if (e.parent) parts.push('of ' + e.parent);
  if (e.template) parts.push('template ' + e.template);
  if (e.checkpoint) parts.push(e.checkpoint);
  if (e.snapshot) parts.push(e.snapshot);
  if (e.children?.length) parts.push('into ' + e.children.join(', '));
  if (e.reason) parts.push(e.reason);
  const r = e.restored;
  if (r) {
    parts.push(`${r.files} files` + (r.variables?.length ? `, variables ${r.variables.join(', ')}` : ''));
    if (r.not_restored?.length) parts.push('not restored: ' + r.not_restored.join('; '));
    if (r.lost) parts.push('lost: ' + r.lost);
  }
  return parts.join(' · ');
}

// closedInfo is when and why a session closed, from the words of its
// 404 ({at, reason}); null if they do not say.
export function closedInfo(message) {
  const m = message?.match(/was closed at (\S+): (.*?)(?: \(its events|$)/);
  return m ? { at: m[1], reason: m[2] } : null;
}

export class HistoryPanel {
  constructor(nb) {
    this.nb = nb;
    this.base = nb.base;
    this.since = 0;
    this.items = h('ol', { class: 'ev-list', id: 'ev-list', 'aria-label': 'What happened to the session, oldest first' });
    this.note = h('p', { class: 'small muted', id: 'ev-note' }, 'Loading…');
    this.el = h('section', { class: 'card stack', id: 'ev-panel', 'aria-labelledby': 'ev-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'ev-title' }, 'History')), this.items, this.note);
  }

  start() {
    this.stop();
    const tick = async () => {
      if (document.visibilityState === 'visible' && !this.ended) await this.load();
      if (!this.ended) this.timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  stop() { clearTimeout(this.timer); }

  // load reads the events since the last one shown (one read at a time:
  // a call during one waits for it).
  load() {
    this.loading ??= this.read().finally(() => { this.loading = null; });
    return this.loading;
  }

  async read() {
    let r;
    const gen = this.nb.ck.stateGen; // a pause or resume answered meanwhile knows better
    try {
      r = await getJSON(`${this.base}/events?since=${this.since}`);
    } catch (e) {
      if (e.status === 404) {
        // A session closed within the hour answers with its events; one
        // that does not was closed longer ago, or never existed here.
        this.ended = true;
        this.note.textContent = 'The session is gone.';
        this.nb.gone(closedInfo(e.message));
        return;
      }
      this.note.textContent = 'The history cannot be read: ' + e.message;
      return;
    }
    for (const e of r.events) {
      this.since = e.seq;
      const detail = eventDetail(e);
      this.items.append(h('li', { class: 'ev-item ev-' + e.type, dataset: { seq: e.seq, type: e.type } },
        h('span', { class: 'small muted', title: new Date(e.time).toLocaleString() }, fmtAgo(e.time)), ' ',
        h('strong', {}, LABELS[e.type] || e.type),
        detail ? h('span', { class: 'small' }, ' — ' + detail) : null));
      if (e.type === 'closed') {
        this.nb.gone({ at: e.time, reason: e.reason });
        this.ended = true;
      }
    }
    // A pause, resume or hibernation made elsewhere (the API, the CLI, the
    // reaper) shows in the checkpoint strip's state too.
    const last = r.events.at(-1);
    if (last && gen === this.nb.ck.stateGen) this.nb.ck.showState(last.state);
    while (this.items.children.length > KEEP) this.items.firstChild.remove();
    this.note.textContent = this.items.children.length ? '' : 'Nothing yet.';
    // A history that ended without a close was handed over: the server is
    // restarting and the next one takes the session on (its history goes
    // on there, numbered after this one's), so the panel keeps polling.
    if (r.ended && !this.ended) this.note.textContent = 'The server is handing the session over to the next one; its history goes on there.';
  }
}
