// The notebook's terminal: a shell in the session's sandbox, drawn by
// xterm.js (a copy from npm, served by sandloop from /ui/vendor) over the
// session's terminal WebSocket (GET /v1/sessions/{id}/terminal).

import { h, toast } from './dom.js';
import { getToken } from './api.js';

export class TerminalPanel {
  constructor(base) {
    this.base = base;
    this.status = h('span', { class: 'small muted', id: 'term-status', role: 'status' }, '');
    this.openBtn = h('button', { type: 'button', class: 'btn btn-sm nb-live', id: 'term-open', onclick: () => this.open() }, 'Open terminal');
    this.closeBtn = h('button', { type: 'button', class: 'btn btn-ghost btn-sm', id: 'term-close', hidden: true, onclick: () => this.close() }, 'Close terminal');
    this.screen = h('div', { class: 'term-screen', id: 'term-screen', hidden: true });
    this.el = h('section', { class: 'nb-terminal card', id: 'term-panel', 'aria-labelledby': 'term-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'term-title' }, 'Terminal'),
        h('div', { class: 'actions' }, this.status, this.openBtn, this.closeBtn)),
      h('p', { class: 'small muted' }, "A shell in this session's sandbox. It shares the workspace's files with the notebook, not its variables or processes; closing it ends what runs in it."),
      this.screen);
  }

  async open() {
    if (this.ws) return;
    this.openBtn.disabled = true;
    this.status.textContent = 'Starting…';
    try {
      const [{ Terminal }, { FitAddon }] = await Promise.all([import('../vendor/xterm.mjs'), import('../vendor/addon-fit.mjs')]);
      loadStylesheet('/ui/vendor/xterm.css');
      this.screen.hidden = false;
      this.unadopt = adoptStyles(this.screen);
      const term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000,
        fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace' });
      const fit = new FitAddon();
      term.loadAddon(fit);
      openStyled(term, this.screen);
      fit.fit();
      const u = new URL(this.base + '/terminal', location.href);
      u.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
      u.searchParams.set('cols', term.cols);
      u.searchParams.set('rows', term.rows);
      // Browsers send no headers of ours on a WebSocket: the token goes in
      // the query, which this route alone accepts.
      const t = getToken();
      if (t) u.searchParams.set('token', t);
      const ws = new WebSocket(u);
      ws.binaryType = 'arraybuffer';
      const enc = new TextEncoder();
      ws.onopen = () => { this.status.textContent = 'Connected'; term.focus(); };
      ws.onmessage = e => {
        if (typeof e.data !== 'string') { term.write(new Uint8Array(e.data)); return; }
        const m = JSON.parse(e.data);
        if (m.type === 'exit') this.exit = m;
      };
      ws.onclose = () => this.ended();
      term.onData(d => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
      term.onResize(({ cols, rows }) => {
        if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols, rows }));
      });
      this.resizer = new ResizeObserver(() => fit.fit());
      this.resizer.observe(this.screen);
      this.term = term;
      this.ws = ws;
      this.exit = null;
      this.closeBtn.hidden = false;
      this.openBtn.hidden = true;
    } catch (e) {
      this.status.textContent = '';
      toast('Could not open the terminal: ' + e.message, 'error');
    } finally {
      this.openBtn.disabled = false;
    }
  }

  // ended: the socket closed (the shell exited, the session ended, or we
  // closed it). The screen stays, for reading, until the next open.
  ended() {
    if (!this.ws) return;
    const x = this.exit;
    this.status.textContent = x ? (x.signal ? `Ended (${x.signal})` : `Exited (${x.exit_code})`) : 'Disconnected';
    this.ws = null;
    this.resizer?.disconnect();
    this.openBtn.hidden = false;
    this.closeBtn.hidden = true;
  }

  close() {
    this.ws?.close();
    this.ended();
  }

  dispose() {
    this.close();
    this.term?.dispose();
    this.unadopt?.();
  }
}

function loadStylesheet(href) {
  if (document.querySelector(`link[href="${href}"]`)) return;
  document.head.append(h('link', { rel: 'stylesheet', href }));
}

// openStyled opens term in el. xterm.js styles its rows with <style>
// elements it makes as it opens and fills later, which the page's
// Content-Security-Policy (style-src 'self': no inline styles) refuses. It
// gets inert <template> elements instead, which adoptStyles turns into
// stylesheets.
function openStyled(term, el) {
  const create = document.createElement;
  document.createElement = function (tag, opts) {
    if (String(tag).toLowerCase() !== 'style') return create.call(document, tag, opts);
    const stand = create.call(document, 'template');
    stand.dataset.xtermStyle = '';
    return stand;
  };
  try {
    term.open(el);
  } finally {
    document.createElement = create;
  }
}

// adoptStyles mirrors what xterm.js writes into its style stand-ins under
// root into constructed stylesheets (the CSSOM, which the policy leaves to
// the page's own scripts), kept in step as it changes them. Returns what
// removes them.
function adoptStyles(root) {
  const sheets = new Map();
  const sync = () => {
    for (const el of root.querySelectorAll('template[data-xterm-style]')) {
      let s = sheets.get(el);
      if (!s) {
        s = { sheet: new CSSStyleSheet(), text: null };
        sheets.set(el, s);
        document.adoptedStyleSheets = [...document.adoptedStyleSheets, s.sheet];
      }
      if (s.text !== el.textContent) {
        s.text = el.textContent;
        s.sheet.replaceSync(s.text);
      }
    }
  };
  const mo = new MutationObserver(sync);
  mo.observe(root, { subtree: true, childList: true, characterData: true });
  return () => {
    mo.disconnect();
    const ours = new Set([...sheets.values()].map(s => s.sheet));
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter(s => !ours.has(s));
  };
}
