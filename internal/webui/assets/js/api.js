// The HTTP API, with the token kept in this browser's localStorage.

const KEY = 'sandloop.token';

// takeTokenFromURL moves ?token= from the address bar into storage, so the
// token does not stay in the history, in bookmarks or on screen.
export function takeTokenFromURL() {
  const u = new URL(location.href);
  const t = u.searchParams.get('token');
  if (t == null) return;
  if (t) localStorage.setItem(KEY, t);
  u.searchParams.delete('token');
  history.replaceState(history.state, '', u.pathname + u.search + u.hash);
}

export const getToken = () => localStorage.getItem(KEY) || '';
export function setToken(t) {
  if (t) localStorage.setItem(KEY, t);
  else localStorage.removeItem(KEY);
}

export class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let unauthorized = () => {};
// onUnauthorized sets what happens when a request is refused for its token.
export function onUnauthorized(fn) { unauthorized = fn; }

let restored = () => {};
// onSessionRestored sets what happens when a request for a session was
// redirected to the session it was restored as: a gateway whose host of
// the session was lost restored it from its latest snapshot under a new
// id and answered 307 (fetch follows it, body and token included).
export function onSessionRestored(fn) { restored = fn; }
const sessionIn = p => /^\/v1\/sessions\/([^/?#]+)/.exec(p)?.[1];

let woken = () => {};
// onSessionWoken sets what happens when a request woke a session that was
// asleep (hibernated, or put to sleep when its keeper was lost): its answer
// carries the Sandloop-Restored header, whichever request it was (a
// cell's, or a panel's poll that came first).
export function onSessionWoken(fn) { woken = fn; }

// api sends a request and returns the response, or throws an APIError
// carrying the server's error code and message.
export async function api(method, path, { json, body, headers, signal } = {}) {
  const hdr = new Headers(headers);
  const t = getToken();
  if (t) hdr.set('Authorization', 'Bearer ' + t);
  if (json !== undefined) {
    hdr.set('Content-Type', 'application/json');
    body = JSON.stringify(json);
  }
  let resp;
  try {
    resp = await fetch(path, { method, headers: hdr, body, signal, cache: 'no-store' });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new APIError(0, 'network', 'cannot reach the server: ' + e.message);
  }
  if (resp.redirected) {
    const from = sessionIn(path), to = sessionIn(new URL(resp.url).pathname);
    if (from && to && from !== to) restored(decodeURIComponent(from), decodeURIComponent(to));
  }
  const id = sessionIn(new URL(resp.url, location.href).pathname);
  if (id && resp.headers.get('Sandloop-Restored')) woken(decodeURIComponent(id));
  if (!resp.ok) {
    let code = 'http_' + resp.status, message = resp.statusText || ('HTTP ' + resp.status);
    try {
      const j = await resp.json();
      if (j && j.error) { code = j.error.code || code; message = j.error.message || message; }
    } catch { /* not JSON */ }
    if (resp.status === 401) unauthorized();
    throw new APIError(resp.status, code, message);
  }
  return resp;
}

export async function getJSON(path, opts) { return (await api('GET', path, opts)).json(); }
export async function postJSON(path, json, opts) {
  const resp = await api('POST', path, { ...opts, json });
  const text = await resp.text();
  return text ? JSON.parse(text) : null;
}

// ndjson yields the JSON values of a response's lines as they arrive.
export async function* ndjson(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (value) buf += value;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (line) yield JSON.parse(line);
    }
    if (done) break;
  }
  if (buf.trim()) yield JSON.parse(buf);
}

// events opens a server-sent event stream. EventSource cannot send headers,
// so the token goes in the query (the server accepts ?token= for this).
export function events(path) {
  const u = new URL(path, location.origin);
  const t = getToken();
  if (t) u.searchParams.set('token', t);
  return new EventSource(u);
}

// download fetches path with the token and saves it under its name from
// Content-Disposition (or fallback), keeping the token out of any URL.
export async function download(path, fallback) {
  const resp = await api('GET', path);
  let name = fallback;
  const cd = resp.headers.get('Content-Disposition') || '';
  const m = /filename\*?=(?:UTF-8'')?"?([^";]+)"?/i.exec(cd);
  if (m) name = decodeURIComponent(m[1]);
  const blob = await resp.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name || 'download';
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
  return { name: a.download, size: blob.size };
}

// filePath encodes a workspace path for a URL, one segment at a time.
export const filePath = p => p.split('/').filter(Boolean).map(encodeURIComponent).join('/');

let info = null;
// serverInfo resolves to the server's GET /v1/info (whether it wants a
// token, the model of runs), asked once per token.
export function serverInfo() {
  const t = getToken();
  if (!info || info.token !== t) info = { token: t, p: getJSON('/v1/info') };
  return info.p;
}
