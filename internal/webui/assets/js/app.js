// sandloop's web UI: routes between the Runs and Notebook pages and keeps
// the access token.

import { takeTokenFromURL, getToken, setToken, onUnauthorized, serverInfo } from './api.js';
import { mountRuns } from './runs.js';
import { mountNotebook } from './notebook.js';
import { mountLessons } from './lessons.js';
import { toast } from './dom.js';

takeTokenFromURL();

const view = document.getElementById('view');
const dialog = document.getElementById('token-dialog');
const tokenInput = document.getElementById('token-input');
const tokenButton = document.getElementById('token-button');
let page = null;
let shown = location.hash;

function route() {
  // A page with input that would be lost asks first (the notebook, when
  // the server could not save it).
  if (page?.unsaved?.() && !confirm('This notebook has input the server has not saved. Leave and lose it?')) {
    history.replaceState(history.state, '', shown || '#/runs');
    return;
  }
  shown = location.hash;
  const [, name = 'runs', id] = (location.hash || '#/runs').split('/').map(decodeURIComponent);
  page?.dispose?.();
  view.replaceChildren();
  for (const n of ['runs', 'notebook', 'lessons']) {
    const a = document.getElementById('nav-' + n);
    if (n === name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  page = name === 'notebook' ? mountNotebook(view, id) : name === 'lessons' ? mountLessons(view) : mountRuns(view, id);
  document.title = { notebook: 'Notebook', lessons: 'Lessons' }[name] || 'Runs';
  document.title += ' · sandloop';
}

// showTokenButton offers the token only where the server wants one: a
// server without tokens says so in /v1/info; one with tokens answers 401
// until the right one is set.
function showTokenButton() {
  tokenButton.textContent = getToken() ? 'Token ✓' : 'Set token';
  tokenButton.setAttribute('aria-label', getToken() ? 'Access token (set)' : 'Set access token');
  serverInfo().then(info => {
    tokenButton.hidden = !info.token_required;
    tokenButton.dataset.required = info.token_required;
  }, () => { tokenButton.hidden = false; });
}

let asked = false;
function askToken(reason) {
  if (dialog.open) return;
  document.getElementById('token-why').hidden = !reason;
  tokenInput.value = '';
  dialog.showModal();
  tokenInput.focus();
}

onUnauthorized(() => {
  tokenButton.hidden = false;
  if (dialog.open) return; // several requests were refused at once
  // Ask once per page load on its own; the button is always there after.
  if (!asked) { asked = true; askToken(true); }
  else toast('The server refused the token.', 'error');
});

document.getElementById('token-form').addEventListener('submit', e => {
  e.preventDefault();
  setToken(tokenInput.value.trim());
  dialog.close();
  asked = false;
  showTokenButton();
  route();
});
document.getElementById('token-cancel').addEventListener('click', () => dialog.close());
document.getElementById('token-forget').addEventListener('click', () => {
  setToken('');
  dialog.close();
  showTokenButton();
  toast('Token removed from this browser');
  route();
});
tokenButton.addEventListener('click', () => askToken(false));

window.addEventListener('hashchange', route);
showTokenButton();
route();
