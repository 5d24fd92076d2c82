// Rendering of execution output (streams, rich results, tracebacks) and of
// diffs. HTML from the sandbox is rebuilt through an allowlist, so a
// DataFrame's table displays while its scripts, styles, event handlers and
// links do not reach the page (the Content-Security-Policy is a second line).

import { h } from './dom.js';

// Output is where one execution's events land, in order.
export class Output {
  constructor(el) {
    this.el = el;
    this.last = null; // the stream <pre> being appended to
    this.images = [];
  }
  reset() { this.el.replaceChildren(); this.last = null; this.images = []; }

  // stream appends live output. A box stays at its end as text arrives,
  // unless the reader scrolled up in it; it scrolls once per frame at most.
  stream(name, text) {
    if (!text) return;
    if (!this.last || this.last.dataset.stream !== name) {
      const pre = this.last = streamBox(name);
      pre.pinned = true;
      pre.autoTop = 0; // where the last scroll to the end left it
      pre.addEventListener('scroll', () => {
        // (Scroll events come a frame late: text may have arrived since.)
        if (pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8) pre.pinned = true;
        else if (pre.scrollTop < pre.autoTop - 2) pre.pinned = false;
      }, { passive: true });
      this.el.append(pre);
    }
    const pre = this.last;
    pre.append(text);
    if (pre.pinned && !pre.queued) {
      pre.queued = true;
      requestAnimationFrame(() => {
        pre.queued = false;
        if (pre.pinned) { toEnd(pre); pre.autoTop = pre.scrollTop; }
      });
    }
  }

  event(e) {
    switch (e.type) {
      case 'stdout': case 'stderr': this.stream(e.type, e.text); return;
      case 'result': this.result(e.data || {}); return;
      case 'error': this.error(e); return;
      case 'fatal': this.last = null; this.el.append(h('div', { class: 'callout callout-error' }, e.message || 'the execution failed')); return;
    }
  }

  result(data) {
    this.last = null;
    const el = richResult(data);
    if (!el) return;
    if (el.tagName === 'IMG') this.images.push(el.src);
    this.el.append(el);
    if (el.tagName === 'PRE') toEnd(el);
  }

  error(err) {
    this.last = null;
    const tb = traceback(err);
    this.el.append(tb);
    for (const pre of tb.querySelectorAll('pre')) toEnd(pre);
  }

  // whole renders an aggregated execution result (stdout, stderr, results,
  // error), long text as its head and its end, every box scrolled to its end.
  whole(r) {
    this.reset();
    for (const name of ['stdout', 'stderr']) {
      if (r[name]) this.el.append(clipped(streamBox(name), r[name]));
    }
    for (const o of r.results || []) this.result(o.data || {});
    if (r.error) this.error(r.error);
    if (r.truncated) this.el.append(h('p', { class: 'muted small' }, 'Output was truncated: the middle was dropped.'));
    this.toEnd();
  }

  // toEnd scrolls each of the output's boxes to its end, where a failing
  // program's error is.
  toEnd() { for (const el of this.el.querySelectorAll('pre')) toEnd(el); }
}

const streamBox = name => h('pre', { class: 'stream stream-' + name, dataset: { stream: name } });

export function toEnd(el) { el.scrollTop = el.scrollHeight; }

// Long text is shown as its first HEAD and last TAIL lines, so that its end
// (the ValueError under a traceback) is in sight without scrolling; the
// middle comes back with "show all".
const HEAD = 4, TAIL = 14;

// clipped fills pre with text, clipped if long, and returns it.
export function clipped(pre, text) {
  const lines = text.replace(/\n$/, '').split('\n');
  const hidden = lines.length - HEAD - TAIL;
  if (hidden < 3) {
    pre.append(text);
    return pre;
  }
  const more = h('button', { type: 'button', class: 'clip-more', 'aria-label': `Show all ${lines.length} lines` },
    `⋯ ${hidden} more lines · show all`);
  more.addEventListener('click', () => {
    pre.replaceChildren(text);
    toEnd(pre);
  });
  pre.append(lines.slice(0, HEAD).join('\n'), more, lines.slice(-TAIL).join('\n'));
  return pre;
}

const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];

// richResult renders the richest MIME type of a result we can show safely.
export function richResult(data) {
  for (const t of IMAGE_TYPES) {
    if (data[t]) return h('img', { class: 'figure', src: `data:${t};base64,${data[t].replace(/\s/g, '')}`, alt: altText(data) });
  }
  if (data['image/svg+xml']) {
    // As an <img>, an SVG cannot run scripts or load anything.
    const svg = data['image/svg+xml'];
    const b64 = btoa(unescape(encodeURIComponent(svg)));
    return h('img', { class: 'figure', src: 'data:image/svg+xml;base64,' + b64, alt: altText(data) });
  }
  if (data['text/html']) {
    return h('div', { class: 'html-output' }, sanitizeHTML(data['text/html']));
  }
  if (data['application/json']) {
    let text = data['application/json'];
    try { text = JSON.stringify(typeof text === 'string' ? JSON.parse(text) : text, null, 2); } catch { /* as is */ }
    return clipped(h('pre', { class: 'result' }), String(text));
  }
  const text = data['text/markdown'] || data['text/plain'] || data['text/latex'];
  if (text != null) return clipped(h('pre', { class: 'result' }), String(text));
  return null;
}

function altText(data) {
  const t = data['text/plain'];
  return t && t.length < 200 ? t : 'figure';
}

// traceback sets an error off clearly: its name and message in a heading,
// the traceback below.
export function traceback(err) {
  const head = h('div', { class: 'tb-head' },
    h('span', { class: 'tb-name' }, err.name || 'Error'),
    err.value ? h('span', { class: 'tb-value' }, ': ' + err.value) : null);
  return h('div', { class: 'traceback', role: 'group', 'aria-label': 'Traceback' },
    head, err.traceback ? clipped(h('pre'), err.traceback.replace(/\n$/, '')) : null);
}

// Elements kept (their attributes filtered); DROP elements go with their
// content; any other element is replaced by its children.
const KEEP = new Set(('table thead tbody tfoot tr th td caption colgroup col div span p br hr b i strong em u s ' +
  'small sub sup code pre kbd samp var blockquote q ul ol li dl dt dd h1 h2 h3 h4 h5 h6 img figure figcaption abbr mark').split(' '));
const DROP = new Set(('script style noscript template iframe frame frameset object embed applet link meta base ' +
  'form input button select textarea option svg math audio video source track canvas title head').split(' '));
const ATTRS = new Set(['colspan', 'rowspan', 'scope', 'title', 'alt', 'align', 'valign', 'span', 'start', 'reversed']);
const SAFE_IMG = /^data:image\/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]+$/;

// sanitizeHTML parses html in an inert document (nothing runs or loads) and
// copies across only allowlisted elements and attributes.
export function sanitizeHTML(html) {
  const doc = new DOMParser().parseFromString(String(html), 'text/html');
  const out = document.createDocumentFragment();
  copyChildren(doc.body, out, 0);
  return out;
}

function copyChildren(from, to, depth) {
  if (depth > 64) return;
  for (const n of from.childNodes) {
    if (n.nodeType === Node.TEXT_NODE) { to.append(n.data); continue; }
    if (n.nodeType !== Node.ELEMENT_NODE) continue;
    const tag = n.localName;
    if (DROP.has(tag)) continue;
    if (!KEEP.has(tag)) { copyChildren(n, to, depth + 1); continue; }
    const el = document.createElement(tag);
    for (const a of n.attributes) {
      const name = a.name.toLowerCase();
      if (ATTRS.has(name) && /^[\w\s.,%-]*$/.test(a.value)) el.setAttribute(name, a.value);
      else if (tag === 'img' && name === 'src' && SAFE_IMG.test(a.value)) el.setAttribute('src', a.value);
    }
    if (tag === 'img' && !el.hasAttribute('src')) continue;
    copyChildren(n, el, depth + 1);
    to.append(el);
  }
}

// diffView colours a unified diff line by line.
export function diffView(diff) {
  const pre = h('pre', { class: 'diff' });
  for (const line of diff.replace(/\n$/, '').split('\n')) {
    let cls = 'ctx';
    if (line.startsWith('+++') || line.startsWith('---')) cls = 'file';
    else if (line.startsWith('@@')) cls = 'hunk';
    else if (line.startsWith('+')) cls = 'add';
    else if (line.startsWith('-')) cls = 'del';
    else if (line.startsWith('\\')) cls = 'meta';
    pre.append(h('span', { class: 'd-' + cls }, line + '\n'));
  }
  return pre;
}

// diffStats counts added and removed lines.
export function diffStats(diff) {
  let add = 0, del = 0, files = 0;
  for (const line of diff.split('\n')) {
    if (line.startsWith('+++')) files++;
    else if (line.startsWith('+')) add++;
    else if (line.startsWith('-') && !line.startsWith('---')) del++;
  }
  return { add, del, files };
}

// statusBadge is a small coloured label for run and execution statuses.
export function statusBadge(status, attrs = {}) {
  return h('span', { ...attrs, class: 'badge badge-' + statusClass(status) + (attrs.class ? ' ' + attrs.class : '') }, status === 'ok' ? 'OK' : (status || 'unknown').replace(/_/g, ' '));
}

export function statusClass(s) {
  switch (s) {
    case 'running': return 'run';
    case 'done': case 'ok': case 'ready': return 'ok';
    case 'failed': case 'error': case 'killed': return 'err';
    case 'cancelled': case 'interrupted': case 'closed': return 'muted';
    default: return 'warn';
  }
}
