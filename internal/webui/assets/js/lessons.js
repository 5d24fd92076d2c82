// The Lessons page: what the agent learned from earlier runs (and is shown
// again in later ones). List, full-text search, add and delete.

import { h, clear, toast, fmtAgo } from './dom.js';
import { api, getJSON, postJSON, APIError } from './api.js';

const demoted = l => l.recurred >= 2 && l.recurred > l.helped;

export function mountLessons(root) {
  const q = h('input', { id: 'lessons-q', type: 'search', placeholder: 'e.g. pandas, seaborn, sales.csv, KeyError', autocomplete: 'off', spellcheck: 'false', 'aria-label': 'Search lessons' });
  const list = h('ul', { class: 'lesson-list', id: 'lesson-list', 'aria-label': 'Lessons' });
  const count = h('span', { class: 'muted', id: 'lessons-count', role: 'status' });
  const search = h('form', { class: 'row', id: 'lessons-search', role: 'search' }, q, h('button', { type: 'submit', class: 'btn btn-sm' }, 'Search'));
  const text = h('input', { id: 'lesson-text', type: 'text', required: true, maxlength: 500, placeholder: 'e.g. seaborn is not installed: plot with matplotlib', autocomplete: 'off' });
  const scope = h('select', { id: 'lesson-scope' }, ['global', 'task', 'files'].map(s => h('option', { value: s }, s)));
  const files = h('input', { id: 'lesson-files', type: 'text', placeholder: 'sales.csv (scope files)', autocomplete: 'off', spellcheck: 'false' });
  const add = h('form', { class: 'card stack', id: 'lesson-add', 'aria-labelledby': 'lesson-add-title' },
    h('h2', { id: 'lesson-add-title' }, 'Teach a lesson'),
    h('div', { class: 'field' }, h('label', { for: 'lesson-text' }, 'Lesson'), text),
    h('div', { class: 'grid2' },
      h('div', { class: 'field' }, h('label', { for: 'lesson-scope' }, 'Scope'), scope),
      h('div', { class: 'field' }, h('label', { for: 'lesson-files' }, 'Files'), files)),
    h('div', { class: 'row end' }, h('button', { type: 'submit', class: 'btn btn-primary', id: 'lesson-add-button' }, 'Add')));
  root.append(h('div', { class: 'lessons-page stack' },
    h('section', { class: 'card stack' },
      h('div', { class: 'card-head' }, h('h2', {}, 'Lessons'), count),
      h('p', { class: 'muted' }, 'When a run hits an error and fixes it, the agent keeps a short lesson. Later runs on similar tasks or the same files are shown it at the start, and again when the same error comes back. Lessons whose error keeps recurring are demoted; unhelpful ones unused for 90 days are pruned.'),
      search, list),
    add));

  let seq = 0;
  async function load() {
    const my = ++seq;
    try {
      const qs = q.value.trim() ? '?q=' + encodeURIComponent(q.value.trim()) : '';
      const { lessons } = await getJSON('/v1/lessons' + qs);
      if (my !== seq) return;
      clear(list);
      count.textContent = lessons.length === 1 ? '1 lesson' : lessons.length + ' lessons';
      if (!lessons.length) list.append(h('li', { class: 'empty' }, q.value.trim() ? 'No lesson matches.' : 'No lessons yet: runs learn them when they fix an error.'));
      for (const l of lessons) list.append(item(l));
    } catch (e) {
      clear(list).append(h('li', { class: 'empty' }, e instanceof APIError && e.status === 401 ? 'A token is needed to see lessons.' : e.message));
    }
  }

  function item(l) {
    const del = h('button', { type: 'button', class: 'btn btn-ghost btn-sm lesson-delete', 'aria-label': 'Delete lesson: ' + l.text }, 'Delete');
    del.addEventListener('click', async () => {
      del.disabled = true;
      try {
        await api('DELETE', '/v1/lessons/' + encodeURIComponent(l.id));
        toast('Lesson deleted');
        load();
      } catch (e) {
        del.disabled = false;
        toast('Could not delete the lesson: ' + e.message, 'error');
      }
    });
    return h('li', { class: 'lesson card', dataset: { id: l.id } },
      h('div', { class: 'lesson-top' },
        h('span', { class: 'chip' }, l.scope), demoted(l) ? h('span', { class: 'chip chip-warn' }, 'demoted') : null,
        h('span', { class: 'lesson-text' }, l.text), del),
      h('div', { class: 'run-meta' },
        h('span', {}, `shown ${l.shown} · helped ${l.helped} · recurred ${l.recurred}`),
        l.signature ? h('span', { class: 'mono' }, l.signature) : null,
        l.files ? h('span', { class: 'mono' }, l.files.split(' ').map(f => f.split('#')[0]).join(', ')) : null,
        l.run_id ? h('a', { href: '#/runs/' + encodeURIComponent(l.run_id) }, 'learned in run ' + l.run_id.slice(0, 8)) : h('span', {}, 'from ' + (l.source || 'user')),
        h('span', {}, fmtAgo(l.updated_at))));
  }

  search.addEventListener('submit', e => { e.preventDefault(); load(); });
  add.addEventListener('submit', async e => {
    e.preventDefault();
    try {
      await postJSON('/v1/lessons', { text: text.value, scope: scope.value, files: files.value.trim() });
      text.value = '';
      files.value = '';
      toast('Lesson added');
      load();
    } catch (err) {
      toast('Could not add the lesson: ' + err.message, 'error');
    }
  });
  load();
  return { dispose() { seq++; } };
}
