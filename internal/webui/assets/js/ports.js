// PortsPanel lists the servers the session's code listens with (a Flask
// app, a dashboard) and opens each in a new tab through sandloop: the link
// is a signed, expiring URL of the port's own host name
// (PORT-ID.localhost:N, which the browser resolves to this machine), so
// the app's absolute paths work and no token is put in the address.

import { h, toast } from './dom.js';
import { getJSON, postJSON } from './api.js';

export class PortsPanel {
  constructor(base) {
    this.base = base;
    this.summary = h('p', { class: 'small muted', id: 'ports-summary' }, 'Loading…');
    this.list = h('ul', { class: 'port-list', id: 'port-list' });
    this.el = h('section', { class: 'nb-ports card', id: 'ports-panel', 'aria-labelledby': 'ports-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'ports-title' }, 'Ports'),
        h('button', { type: 'button', class: 'btn btn-ghost btn-sm nb-live', id: 'ports-refresh', onclick: () => this.load() }, 'Refresh')),
      this.summary, this.list);
  }

  // afterCell looks now and once more a moment later: a server started in
  // the background may begin listening just after its cell ends.
  afterCell() {
    this.load();
    clearTimeout(this.again);
    this.again = setTimeout(() => this.load(), 1000);
  }

  async load() {
    let ports;
    try {
      ({ ports } = await getJSON(this.base + '/ports'));
    } catch (e) {
      if (e.status !== 404) this.summary.textContent = 'Ports cannot be listed: ' + e.message;
      this.list.replaceChildren();
      return;
    }
    if (!ports.length) {
      this.summary.textContent = 'No server is listening. Start one on 127.0.0.1 or 0.0.0.0 (Flask, http.server, …) and it shows here.';
      this.list.replaceChildren();
      return;
    }
    this.summary.textContent = ports.length === 1 ? 'One server is listening:' : `${ports.length} servers are listening:`;
    // A signed link each (valid an hour), so a click opens the app at once.
    const items = await Promise.all(ports.map(async p => {
      let href = null;
      try {
        href = (await postJSON(this.base + '/previews', { port: p.port })).url;
      } catch (e) { toast('No link for port ' + p.port + ': ' + e.message, 'error'); }
      return h('li', { class: 'port' },
        h('span', { class: 'mono' }, String(p.port)),
        href ? h('a', { class: 'btn btn-sm', id: 'port-open-' + p.port, href, target: '_blank', rel: 'noopener noreferrer',
          title: 'Open the app on port ' + p.port + ' in a new tab' }, 'Open') : null);
    }));
    this.list.replaceChildren(...items);
  }
}
