// The notebook's snapshots panel: durable snapshots of the session (files
// exactly, variables as far as they serialize), a list of this session's
// with what each could not keep, one opened as a new session in a new tab,
// one deleted; and the notice of a session restored from a snapshot or
// woken from hibernation, saying what came back and what did not.

import { h, toast, fmtBytes, fmtAgo } from './dom.js';
import { api, getJSON, postJSON } from './api.js';

// restoredNotice is the callout of a session whose last restore came from
// storage (a snapshot, a hibernation); null for any other.
export function restoredNotice(r) {
  if (!r || !(r.snapshot || r.from === 'hibernation')) return null;
  const what = r.from === 'hibernation' ? 'Woken from hibernation' : `Restored from snapshot ${r.snapshot}`;
  const vars = r.variables?.length ? ` Variables restored: ${r.variables.join(', ')}.` : ' No variables restored.';
  return h('div', { class: 'callout' + (r.not_restored?.length ? ' callout-error' : ''), id: 'nb-restored', role: 'status' },
    h('strong', {}, what), `: files exact (${r.files} files).${vars}`,
    r.not_restored?.length ? h('ul', { class: 'small' }, ...r.not_restored.map(n => h('li', {}, 'Not restorable: ' + n))) : null);
}

export class SnapshotPanel {
  constructor(nb) {
    this.nb = nb;
    this.base = nb.base;
    this.name = h('input', { type: 'text', id: 'sn-name', class: 'ck-name', placeholder: 'name (optional)', maxlength: 200, 'aria-label': 'Snapshot name' });
    this.takeBtn = h('button', { type: 'button', class: 'btn btn-sm nb-live', id: 'sn-take', title: 'Save the files and variables to durable storage', onclick: () => this.take() }, 'Snapshot');
    this.items = h('ul', { class: 'ck-list', id: 'sn-list', 'aria-label': 'Snapshots, newest first' });
    this.note = h('span', { class: 'small muted', id: 'sn-note' });
    this.el = h('section', { class: 'card stack', id: 'sn-panel', 'aria-label': 'Snapshots' },
      h('div', { class: 'ck-row' }, h('strong', {}, 'Snapshots'), h('span', { class: 'ck-spacer' }), h('span', { class: 'actions' }, this.name, this.takeBtn)),
      this.items, this.note);
  }

  async load() {
    try {
      const { snapshots } = await getJSON(this.base + '/snapshots');
      this.render(snapshots);
    } catch (e) {
      if (e.status === 404) return;
      this.note.textContent = e.status === 501 ? 'This server keeps no snapshots.' : 'Could not load the snapshots: ' + e.message;
      this.takeBtn.disabled = e.status === 501;
    }
  }

  render(list) {
    this.items.replaceChildren(...list.filter(s => !s.hibernation).map(s => h('li', { class: 'ck-item', dataset: { id: s.id } },
      h('span', { class: 'ck-label mono', title: s.id }, s.name || s.id),
      h('span', { class: 'small muted', title: new Date(s.created_at).toLocaleString() }, fmtAgo(s.created_at)),
      h('span', { class: 'small muted', title: `${fmtBytes(s.new_bytes)} written, the rest stored already` }, `${s.files} files · ${fmtBytes(s.total_bytes)}`),
      s.not_restorable.length ? h('span', { class: 'small err', title: s.not_restorable.map(n => `${n.name}: ${n.reason}`).join('\n') }, `${s.not_restorable.length} not restorable`) : null,
      h('button', { type: 'button', class: 'btn btn-sm sn-open', title: `Open a new session from ${s.id} in a new tab`, onclick: () => this.open(s) }, 'Open'),
      h('button', { type: 'button', class: 'btn btn-sm btn-ghost sn-drop', 'aria-label': `Delete snapshot ${s.id}`, onclick: () => this.drop(s) }, '×'))));
    this.note.textContent = this.items.children.length ? '' : 'None yet.';
  }

  async take() {
    this.takeBtn.disabled = true;
    try {
      const s = await this.nb.ck.after(() => postJSON(this.base + '/snapshots', this.name.value ? { name: this.name.value } : {}));
      this.name.value = '';
      const lost = s.not_restorable.length ? ` Not restorable: ${s.not_restorable.map(n => n.name).join(', ')}.` : '';
      toast(`Snapshot ${s.name || s.id} saved: ${s.files} files, ${fmtBytes(s.new_bytes)} written.${lost}`, lost ? 'error' : 'info');
    } catch (e) { toast('Snapshot failed: ' + e.message, 'error'); }
    this.takeBtn.disabled = false;
    this.load();
  }

  // open starts a session from the snapshot in a new tab (opened at once:
  // a tab opened after an await would be a blocked popup).
  async open(s) {
    const tab = window.open('', '_blank');
    try {
      const n = await postJSON('/v1/sessions', { snapshot: s.id, checkpoints: 'auto' });
      const url = location.origin + location.pathname + '#/notebook/' + encodeURIComponent(n.id);
      if (tab) tab.location.href = url;
      else location.hash = '#/notebook/' + encodeURIComponent(n.id);
    } catch (e) {
      tab?.close();
      toast('Open failed: ' + e.message, 'error');
    }
  }

  async drop(s) {
    try {
      await api('DELETE', '/v1/snapshots/' + encodeURIComponent(s.id));
    } catch (e) { toast('Delete failed: ' + e.message, 'error'); }
    this.load();
  }
}
