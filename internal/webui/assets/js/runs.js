// The Runs page: start an agent run, watch it live, read its report.

import { h, clear, toast, fmtTokens, fmtCost, fmtDuration, fmtAgo } from './dom.js';
import { getJSON, postJSON, events, download, serverInfo, APIError } from './api.js';
import { codeBlock } from './highlight.js';
import { Output, clipped, toEnd, diffView, diffStats, statusBadge } from './render.js';

export function mountRuns(root, runID) {
  const listEl = h('ul', { class: 'run-list', id: 'run-list', 'aria-label': 'Past runs' });
  const main = h('section', { class: 'run-main', id: 'run-main', 'aria-live': 'off' });
  const side = h('aside', { class: 'run-side' }, newRunForm(), h('section', { class: 'card' },
    h('div', { class: 'card-head' }, h('h2', {}, 'Runs'),
      h('button', { type: 'button', class: 'btn btn-ghost btn-sm', id: 'runs-refresh', onclick: () => loadList() }, 'Refresh')),
    listEl));
  root.append(h('div', { class: 'runs-layout' }, side, main));

  let view = null;
  let live = null; // the open run's counts (steps, tokens, cost) as its events stream in
  async function loadList() {
    try {
      const { runs } = await getJSON('/v1/runs?limit=50');
      clear(listEl);
      if (!runs.length) listEl.append(h('li', { class: 'empty' }, 'No runs yet.'));
      for (const r of runs) listEl.append(runItem(r, r.id === runID));
      showLive();
    } catch (e) {
      clear(listEl).append(h('li', { class: 'empty' }, errText(e)));
    }
  }
  // showLive keeps the open run's entry in the list as current as its
  // header: steps, tokens and cost follow the events, not a reload.
  function showLive() {
    const meta = live && listEl.querySelector('.run-item.active .run-meta');
    if (meta) meta.replaceChildren(...runMeta({ ...meta.run, ...live }));
  }
  loadList();
  if (runID) view = new RunView(main, runID, loadList, stats => { live = stats; showLive(); });
  else main.append(h('div', { class: 'placeholder' },
    h('h2', {}, 'Watch an agent work'),
    h('p', { class: 'muted' }, 'Start a run on the left, or open one from the list. Each step shows what the model said, the code it ran, the output, and any plots.')));
  return { dispose() { view?.close(); } };
}

function errText(e) { return e instanceof APIError && e.status === 401 ? 'A token is needed to see runs.' : e.message; }

function runItem(r, active) {
  const meta = h('div', { class: 'run-meta' }, runMeta(r));
  meta.run = r;
  return h('li', {}, h('a', { href: '#/runs/' + encodeURIComponent(r.id), class: 'run-item' + (active ? ' active' : ''), 'aria-current': active ? 'page' : null },
    h('div', { class: 'run-item-top' }, statusBadge(r.status), h('span', { class: 'run-when' }, fmtAgo(r.created_at))),
    h('div', { class: 'run-task' }, r.task || '(debug run)'),
    meta));
}

function runMeta(r) {
  return [h('span', {}, r.mode), h('span', { class: 'run-steps' }, plural(r.steps, 'step')),
    h('span', { class: 'run-tokens' }, fmtTokens(r.tokens_in + r.tokens_out) + ' tok'), h('span', { class: 'run-cost' }, fmtCost(r.cost_usd, r.cost_unknown))];
}

const plural = (n, w) => `${n} ${w}${n === 1 ? '' : 's'}`;

function field(label, id, control, hint) {
  return h('div', { class: 'field' }, h('label', { for: id }, label), control, hint ? h('p', { class: 'hint', id: id + '-hint' }, hint) : null);
}

function newRunForm() {
  const task = h('textarea', { id: 'run-task', rows: 4, placeholder: 'e.g. Plot y = x² for x in 0..10 and save it as plot.png', 'aria-describedby': 'run-task-hint' });
  const mode = h('select', { id: 'run-mode' }, ['generate', 'debug', 'refactor', 'app'].map(m => h('option', { value: m }, m)));
  const model = h('input', { id: 'run-model', type: 'text', placeholder: 'server default', autocomplete: 'off', spellcheck: 'false' });
  const files = h('input', { id: 'run-files', type: 'file', multiple: true });
  const entry = h('input', { id: 'run-entry', type: 'text', placeholder: 'main.py', autocomplete: 'off', spellcheck: 'false' });
  const steps = h('input', { id: 'run-steps', type: 'number', min: 1, max: 200, placeholder: 'default', inputmode: 'numeric' });
  const entryField = field('Program to debug', 'run-entry', entry, 'The uploaded file the harness runs to reproduce the crash.');
  entryField.hidden = true;
  mode.addEventListener('change', () => { entryField.hidden = mode.value !== 'debug'; });
  const submit = h('button', { type: 'submit', class: 'btn btn-primary', id: 'run-start' }, 'Start run');
  const modelNote = h('p', { class: 'model-note muted small', id: 'run-model-note', role: 'status' });
  const form = h('form', { class: 'card stack', id: 'new-run', 'aria-labelledby': 'new-run-title' },
    h('h2', { id: 'new-run-title' }, 'New run'),
    modelNote,
    field('Task', 'run-task', task, 'What the agent should do. It writes code, runs it in a sandbox and fixes it until it works.'),
    h('div', { class: 'grid2' }, field('Mode', 'run-mode', mode), field('Max steps', 'run-steps', steps)),
    field('Model', 'run-model', model),
    field('Files', 'run-files', files),
    entryField,
    h('div', { class: 'row end' }, submit));
  // Which model a run will use, said before the user types the task.
  serverInfo().then(({ runs }) => {
    if (!runs.enabled) {
      modelNote.replaceChildren('This server runs no agent.');
      modelNote.className = 'model-note callout callout-error';
    } else if (runs.model) {
      modelNote.replaceChildren('Runs use ', h('strong', { class: 'mono' }, runs.model), ' unless you name another model below.');
      model.placeholder = runs.model;
    } else {
      modelNote.replaceChildren(h('strong', {}, runs.model_error || 'no model configured'), h('br'), 'Runs fail until the server has one, unless you name a model below.');
      modelNote.className = 'model-note callout callout-error';
    }
  }, () => { modelNote.hidden = true; });
  task.addEventListener('keydown', e => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); form.requestSubmit(); }
  });
  // An empty task is refused here, next to the box, as the server would
  // refuse it (debug and refactor runs may go without: the program's crash,
  // or refactoring without changing behaviour, is the task).
  const taskError = h('p', { class: 'field-error', id: 'run-task-error', role: 'alert', hidden: true }, 'Say what the agent should do.');
  task.after(taskError);
  const taskValid = () => {
    const ok = !!task.value.trim() || mode.value === 'debug' || mode.value === 'refactor';
    taskError.hidden = ok;
    if (ok) task.removeAttribute('aria-invalid'); else task.setAttribute('aria-invalid', 'true');
    return ok;
  };
  task.addEventListener('input', () => { if (!taskError.hidden) taskValid(); });
  // A debug run needs its program, as the server requires: the named entry
  // among the files, or the only .py file uploaded.
  const entryError = h('p', { class: 'field-error', id: 'run-entry-error', role: 'alert', hidden: true });
  entry.after(entryError);
  const entryValid = () => {
    let msg = '';
    if (mode.value === 'debug') {
      const names = [...files.files].map(f => f.name);
      const name = entry.value.trim();
      if (name && !names.includes(name)) msg = `Upload ${name} under Files: it is the program to debug.`;
      else if (!name && names.filter(n => n.endsWith('.py')).length !== 1) msg = 'Upload the program to debug (one .py file), or name it here among the files.';
    }
    entryError.textContent = msg;
    entryError.hidden = !msg;
    if (msg) entry.setAttribute('aria-invalid', 'true'); else entry.removeAttribute('aria-invalid');
    return !msg;
  };
  for (const el of [entry, files, mode]) el.addEventListener(el === entry ? 'input' : 'change', () => { if (!entryError.hidden) entryValid(); });
  form.addEventListener('submit', async e => {
    e.preventDefault();
    if (!taskValid()) { task.focus(); return; }
    if (!entryValid()) { entry.focus(); return; }
    submit.disabled = true;
    try {
      const body = { task: task.value, mode: mode.value };
      if (model.value.trim()) body.model = model.value.trim();
      if (steps.value) body.max_steps = Number(steps.value);
      if (mode.value === 'debug' && entry.value.trim()) body.entry = entry.value.trim();
      for (const f of files.files) {
        const buf = new Uint8Array(await f.arrayBuffer());
        try {
          (body.files ||= {})[f.name] = new TextDecoder('utf-8', { fatal: true }).decode(buf);
        } catch {
          (body.files_b64 ||= {})[f.name] = toBase64(buf);
        }
      }
      const run = await postJSON('/v1/runs', body);
      task.value = '';
      files.value = '';
      location.hash = '#/runs/' + encodeURIComponent(run.id);
    } catch (err) {
      toast('Could not start the run: ' + err.message, 'error');
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function toBase64(bytes) {
  let s = '';
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

// RunView shows one run: its header, a timeline of steps built from the
// run's events (recorded ones first, then live), and the final report.
class RunView {
  constructor(root, id, onFinished, onStats) {
    this.id = id;
    this.onFinished = onFinished;
    this.onStats = onStats;
    this.steps = new Map();
    this.tools = new Map();
    this.figures = [];
    this.usage = { in: 0, out: 0, cost: 0, unknown: false };
    this.status = h('span', { id: 'run-status' });
    this.stats = h('dl', { class: 'stats' });
    this.cancelBtn = h('button', { type: 'button', class: 'btn btn-danger', id: 'run-cancel', hidden: true, onclick: () => this.cancel() }, 'Cancel run');
    this.dlBtn = h('button', { type: 'button', class: 'btn', id: 'run-download', hidden: true, onclick: () => this.download() }, 'Download files');
    this.files = []; // the run's final files, from its report
    this.title = h('h2', { class: 'run-title', id: 'run-title' }, 'Loading…');
    this.subtitle = h('div', { class: 'run-sub' });
    this.timeline = h('ol', { class: 'timeline', id: 'timeline', 'aria-label': 'Steps' });
    this.reportEl = h('section', { class: 'report', id: 'report', hidden: true, 'aria-labelledby': 'report-title' });
    this.liveWait = h('span', { class: 'live-wait', id: 'run-live-wait' });
    this.live = h('p', { class: 'live-note', id: 'run-live', hidden: true }, h('span', { class: 'pulse', 'aria-hidden': 'true' }), 'Live', this.liveWait);
    // The outcome (summary, root cause, files) heads a finished run, above
    // a timeline that may be long.
    this.outcome = h('div', { class: 'run-outcome', id: 'run-outcome', hidden: true });
    // While the model is thinking, the end of the timeline says for how long.
    // (Not a live region: it changes every second.)
    this.wait = h('div', { class: 'model-wait', id: 'run-wait', hidden: true });
    root.append(h('article', { class: 'run', 'aria-labelledby': 'run-title' },
      h('header', { class: 'run-head card' },
        h('div', { class: 'run-head-top' }, h('div', { class: 'run-head-text' }, this.title, this.subtitle),
          h('div', { class: 'actions' }, this.cancelBtn, this.dlBtn)),
        this.outcome,
        h('div', { class: 'run-head-bottom' }, this.status, this.live, this.stats)),
      this.timeline, this.wait, this.reportEl));
    this.load();
  }

  async load() {
    let run;
    try {
      run = await getJSON('/v1/runs/' + encodeURIComponent(this.id));
    } catch (e) {
      this.title.textContent = e.status === 404 ? 'No such run' : 'Cannot load this run';
      this.subtitle.textContent = errText(e);
      return;
    }
    this.run = run;
    this.title.textContent = run.task || '(debug run)';
    this.subtitle.replaceChildren(
      h('span', { class: 'chip' }, run.mode), h('span', { class: 'chip' }, run.model || 'default model'),
      h('span', { class: 'muted' }, 'started ' + new Date(run.created_at).toLocaleString()), h('span', { class: 'muted mono' }, run.id));
    this.files = run.report?.files || [];
    this.setStatus(run.status);
    if (run.report && run.status !== 'running') this.renderOutcome(run.report);
    this.renderStats();
    this.es = events('/v1/runs/' + encodeURIComponent(this.id) + '/events');
    const types = ['run_started', 'model_wait', 'model_retry', 'text', 'assistant', 'tool_call', 'output', 'tool_result', 'network', 'usage', 'notice', 'reproduced', 'lessons', 'run_finished'];
    for (const t of types) this.es.addEventListener(t, ev => this.onEvent(t, JSON.parse(ev.data)));
    this.es.addEventListener('end', () => { this.es.close(); this.ended = true; this.live.hidden = true; });
    // The browser reconnects by itself after a dropped connection (resuming
    // with Last-Event-ID); it gives up only when the server refuses.
    this.es.addEventListener('error', () => {
      if (this.es.readyState !== EventSource.CLOSED || this.ended) return;
      this.live.hidden = true;
      this.timeline.after(h('div', { class: 'callout callout-error', role: 'alert' }, 'Live updates stopped: the server refused the event stream. ',
        h('button', { type: 'button', class: 'link', onclick: () => location.reload() }, 'Reload')));
    });
  }

  close() { this.es?.close(); this.waitEnd(); }

  // waitStart shows that the harness waits for the model (since the
  // event's time), ticking each second, until its answer begins.
  waitStart(e) {
    if (this.state !== 'running') return; // replaying a run that has ended
    this.waitSince = Date.parse(e.time) || Date.now();
    this.wait.hidden = false;
    clearInterval(this.waitTimer);
    this.waitTimer = setInterval(() => this.renderWait(), 1000);
    this.renderWait();
  }

  // waitRetry says that a model call failed and will be tried again; the
  // sentence stays under the wait for the next attempt.
  waitRetry(e) {
    if (this.state !== 'running') return;
    clearInterval(this.waitTimer);
    this.waitSince = 0;
    this.retry = e.text || 'the model call failed; retrying';
    this.wait.hidden = false;
    this.renderWait();
  }

  waitEnd() {
    clearInterval(this.waitTimer);
    this.waitTimer = 0;
    this.retry = '';
    this.wait.hidden = true;
    this.liveWait.replaceChildren();
  }

  renderWait() {
    const line = this.waitSince ? `waiting for the model · ${fmtSeconds(Date.now() - this.waitSince)}` : 'retrying';
    this.wait.replaceChildren(h('span', { class: 'pulse', 'aria-hidden': 'true' }),
      h('span', { class: 'model-wait-line' }, line), this.retry ? h('span', { class: 'model-retry' }, this.retry) : null);
    this.liveWait.replaceChildren(' · ' + (this.waitSince ? line : this.retry));
  }

  setStatus(s) {
    this.state = s;
    this.status.replaceChildren(statusBadge(s, { class: 'badge-lg' }));
    this.status.dataset.status = s;
    this.cancelBtn.hidden = s !== 'running';
    this.dlBtn.hidden = s === 'running' || !this.files.length;
    this.live.hidden = s !== 'running';
  }

  renderStats() {
    const u = this.usage, r = this.run || {};
    const tin = Math.max(u.in, r.tokens_in || 0), tout = Math.max(u.out, r.tokens_out || 0);
    // Lessons recalled before the first step are filed under step 0: not a step.
    const steps = Math.max([...this.steps.keys()].filter(n => n >= 1).length, r.steps || 0);
    const items = [
      ['Steps', String(steps)],
      ['Tokens', `${fmtTokens(tin)} in · ${fmtTokens(tout)} out`],
      ['Cost', fmtCost(Math.max(u.cost, r.cost_usd || 0), u.unknown)],
    ];
    if (this.duration) items.push(['Duration', fmtDuration(this.duration)]);
    this.stats.replaceChildren(...items.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
    this.onStats?.({ steps, tokens_in: tin, tokens_out: tout, cost_usd: Math.max(u.cost, r.cost_usd || 0), cost_unknown: u.unknown });
  }

  step(n) {
    let s = this.steps.get(n);
    if (!s) {
      const body = h('div', { class: 'step-body' });
      const li = h('li', { class: 'step', dataset: { step: n } }, h('div', { class: 'step-label' }, n >= 1 ? 'Step ' + n : 'Before the first step'), body);
      this.timeline.append(li);
      s = { li, body, text: null };
      this.steps.set(n, s);
      this.renderStats();
    }
    return s;
  }

  onEvent(type, e) {
    if (['text', 'assistant', 'tool_call', 'run_finished'].includes(type)) this.waitEnd();
    switch (type) {
      case 'model_wait': this.waitStart(e); break;
      case 'model_retry': this.waitRetry(e); break;
      case 'text': {
        const s = this.step(e.step);
        if (!s.text) { s.text = h('div', { class: 'say' }); s.body.append(s.text); }
        s.text.append(e.text || '');
        break;
      }
      case 'assistant': {
        if (!e.text) break;
        const s = this.step(e.step);
        if (!s.text) { s.text = h('div', { class: 'say' }); s.body.append(s.text); }
        s.text.textContent = e.text;
        break;
      }
      case 'tool_call': this.toolCall(e); break;
      case 'output': {
        const t = this.tools.get(e.tool_call_id);
        if (!t || !e.exec) break;
        if (e.exec.type === 'end') t.head.append(execStatus(e.exec));
        else t.out.event(e.exec);
        break;
      }
      case 'tool_result': this.toolResult(e); break;
      case 'usage': {
        const u = e.usage || {};
        this.usage.in += u.input_tokens || 0;
        this.usage.out += u.output_tokens || 0;
        this.usage.cost += u.cost_usd || 0;
        this.usage.unknown ||= !!u.cost_unknown;
        this.renderStats();
        break;
      }
      case 'network': this.step(e.step).body.append(networkTable(e.network || [])); break;
      case 'notice': this.step(e.step).body.append(h('div', { class: 'callout callout-note' }, h('strong', {}, 'Harness: '), e.text || '')); break;
      case 'reproduced': this.reproduced(e); break;
      case 'lessons': for (const l of e.lessons || []) this.step(e.step).body.append(h('div', { class: 'callout callout-lesson' }, h('strong', {}, e.text === 'seen_before' ? 'Seen before: ' : 'Lesson recalled: '), l.text)); break;
      case 'run_finished': this.finished(e.report || {}); break;
    }
  }

  // reproduced shows how the program ended when debug mode ran it before
  // the model's first step: the crash the run is about.
  reproduced(e) {
    const c = e.check || {};
    const crashed = c.status && c.status !== 'ok';
    this.step(e.step).body.append(h('div', { class: 'callout ' + (crashed ? 'callout-error' : 'callout-note'), dataset: { reproduced: c.status || '' } },
      h('strong', {}, crashed ? 'Reproduced the crash: ' : 'Ran the program (it did not crash): '), h('span', { class: 'mono' }, '$ ' + (c.command || '')),
      c.output ? h('pre', { class: 'code' }, c.output) : null));
  }

  toolCall(e) {
    let args = {};
    try { args = JSON.parse(e.arguments || '{}'); } catch { args = null; }
    const head = h('div', { class: 'tool-head' }, h('span', { class: 'tool-name' }, e.tool));
    const body = h('div', { class: 'tool-body' });
    const outEl = h('div', { class: 'output' });
    const box = h('div', { class: 'tool tool-' + e.tool, dataset: { tool: e.tool, call: e.tool_call_id } }, head, body, outEl);
    if (!args) {
      body.append(h('pre', { class: 'code' }, e.arguments));
    } else switch (e.tool) {
      case 'execute_python': body.append(codeBlock(args.code || '')); break;
      case 'run_shell': body.append(codeBlock('$ ' + (args.command || ''), 'shell')); break;
      case 'write_file': {
        head.append(h('span', { class: 'tool-arg mono' }, args.path));
        const content = args.content || '';
        const lines = content.split('\n').length;
        body.append(h('details', { open: lines <= 25 },
          h('summary', {}, plural(lines, 'line')), codeBlock(content, /\.py$/.test(args.path || '') ? 'python' : 'text')));
        break;
      }
      case 'edit_file': {
        head.append(h('span', { class: 'tool-arg mono' }, args.path));
        const d = (args.old_text || '').split('\n').map(l => '-' + l).concat((args.new_text || '').split('\n').map(l => '+' + l)).join('\n');
        body.append(diffView(d));
        break;
      }
      case 'read_file': case 'list_files':
        head.append(h('span', { class: 'tool-arg mono' }, args.path || '.'));
        break;
      case 'finish':
        if (args.summary) body.append(h('p', { class: 'say' }, args.summary));
        if (args.root_cause) body.append(h('p', { class: 'say' }, h('strong', {}, 'Root cause: '), args.root_cause));
        break;
      default: {
        const keys = Object.keys(args);
        if (keys.length) body.append(h('pre', { class: 'code' }, JSON.stringify(args, null, 2)));
      }
    }
    this.step(e.step).body.append(box);
    this.tools.set(e.tool_call_id, { box, head, out: new Output(outEl), outEl });
  }

  toolResult(e) {
    const t = this.tools.get(e.tool_call_id);
    if (!t) return;
    if (e.is_error) t.box.classList.add('is-error');
    if (e.result) {
      // The whole result is authoritative: it replaces the live output.
      t.out.whole(e.result);
      if (!t.head.querySelector('.exec-status')) t.head.append(execStatus(e.result));
      for (const src of t.out.images) this.figures.push({ src, step: e.step });
    } else if (e.text && (e.is_error || !['write_file', 'finish'].includes(e.tool))) {
      const pre = clipped(h('pre', { class: 'tool-text' }), e.text);
      t.outEl.append(e.is_error ? h('div', { class: 'callout callout-error' }, pre)
        : h('details', {}, h('summary', {}, 'Result'), pre));
      toEnd(pre);
    }
    if (e.changed?.length) {
      t.outEl.append(h('div', { class: 'changed' }, h('span', { class: 'muted' }, 'Files changed:'),
        e.changed.map(p => h('span', { class: 'chip mono' }, p))));
    }
  }

  finished(rep) {
    this.files = rep.files || [];
    this.setStatus(rep.status);
    if (rep.duration_ns) this.duration = rep.duration_ns / 1e6;
    if (rep.usage) this.usage = { in: rep.usage.input_tokens || 0, out: rep.usage.output_tokens || 0, cost: rep.usage.cost_usd || 0, unknown: !!rep.usage.cost_unknown };
    if (this.run) this.run.steps = rep.steps;
    this.renderStats();
    this.renderOutcome(rep);
    this.renderReport(rep);
    this.onFinished?.();
  }

  // renderOutcome fills the header of a finished run: what came of it and
  // the files it left (its figures are in the header's stats).
  renderOutcome(rep) {
    const o = this.outcome;
    o.hidden = false;
    o.replaceChildren();
    if (rep.summary) o.append(h('p', { class: 'summary' }, rep.summary));
    if (rep.root_cause) o.append(h('div', { class: 'callout callout-note' }, h('strong', {}, 'Root cause: '), rep.root_cause));
    if (rep.error) o.append(h('div', { class: 'callout callout-error' }, h('strong', {}, 'Error: '), rep.error));
    const files = rep.files || [];
    o.append(h('div', { class: 'outcome-files' }, h('span', { class: 'muted small' }, files.length ? plural(files.length, 'file') + ':' : 'No files.'),
      files.slice(0, 12).map(f => h('span', { class: 'chip mono' }, f)),
      files.length > 12 ? h('span', { class: 'muted small' }, `and ${files.length - 12} more`) : null));
    if (!rep.summary && !rep.error && !rep.root_cause && !files.length) o.hidden = true;
  }

  renderReport(rep) {
    const r = this.reportEl;
    r.hidden = false;
    r.replaceChildren(h('div', { class: 'report-head' }, h('h3', { id: 'report-title' }, 'Report'), statusBadge(rep.status)));
    if (rep.reproduction || rep.verification) {
      r.append(h('h4', {}, 'Before and after'), h('div', { class: 'compare' },
        checkCard('Before: reproduction', rep.reproduction), checkCard('After: verification', rep.verification)));
    }
    if (this.figures.length) {
      const figs = this.figures.length > 1
        ? [[`First figure (step ${this.figures[0].step})`, this.figures[0]], [`Last figure (step ${this.figures.at(-1).step})`, this.figures.at(-1)]]
        : [[`Figure (step ${this.figures[0].step})`, this.figures[0]]];
      r.append(h('h4', {}, 'Figures'), h('div', { class: 'compare' },
        figs.map(([cap, f]) => h('figure', {}, h('img', { src: f.src, alt: cap, class: 'figure' }), h('figcaption', {}, cap)))));
    }
    if (rep.diff) {
      const st = diffStats(rep.diff);
      r.append(h('h4', {}, 'Changes ', h('span', { class: 'muted small' }, `${plural(st.files, 'file')}, `),
        h('span', { class: 'add small' }, `+${st.add}`), ' ', h('span', { class: 'del small' }, `−${st.del}`)), diffView(rep.diff));
    }
    if (rep.previews?.length) {
      // The servers the agent left running: open until the run's session closes.
      r.append(h('h4', {}, 'Preview'), h('ul', { class: 'previews', id: 'report-previews' }, rep.previews.map(p => h('li', {},
        h('a', { href: p.url, target: '_blank', rel: 'noopener noreferrer', class: 'btn btn-primary' }, `Open port ${p.port}`), ' ',
        h('span', { class: 'muted small' }, `until ${new Date(p.expires_at).toLocaleTimeString()}`)))));
    }
    if (rep.files?.length) {
      r.append(h('h4', {}, 'Files'), h('ul', { class: 'file-chips' }, rep.files.map(f => h('li', { class: 'chip mono' }, f))),
        h('div', { class: 'row' }, h('button', { type: 'button', class: 'btn btn-primary', id: 'report-download', onclick: () => this.download() }, 'Download all files (.zip)')));
    }
    if (r.children.length === 1) r.hidden = true; // nothing beyond the header's outcome
  }

  async cancel() {
    this.cancelBtn.disabled = true;
    try {
      await postJSON('/v1/runs/' + encodeURIComponent(this.id) + '/cancel');
      toast('Cancelling…');
    } catch (e) {
      toast('Cancel failed: ' + e.message, 'error');
    } finally {
      this.cancelBtn.disabled = false;
    }
  }

  async download() {
    try {
      await download('/v1/runs/' + encodeURIComponent(this.id) + '/artifacts', 'run-' + this.id + '.zip');
    } catch (e) {
      toast('Download failed: ' + e.message, 'error');
    }
  }
}

function checkCard(title, c) {
  if (!c) return h('div', { class: 'check' }, h('h5', {}, title), h('p', { class: 'muted' }, 'Not run.'));
  return h('div', { class: 'check' }, h('h5', {}, title, ' ', statusBadge(c.status === 'ok' ? 'ok' : c.status)),
    h('pre', { class: 'code' }, '$ ' + c.command),
    c.output ? clipped(h('pre', { class: 'stream' }), c.output) : null,
    c.error ? h('p', { class: 'small muted' }, 'Error: ' + c.error) : null);
}

// fmtSeconds is a wait as it ticks: "12 s", "2 min 5 s".
function fmtSeconds(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  return s < 60 ? s + ' s' : Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
}

function execStatus(end) {
  const bits = [end.status];
  if (end.duration_ms != null) bits.push(fmtDuration(end.duration_ms));
  return h('span', { class: 'exec-status' }, statusBadge(bits[0]), bits[1] ? h('span', { class: 'muted small' }, bits[1]) : null);
}

// networkTable lists connections the sandbox made through its egress
// proxy: allowed or refused (and why), host, port, bytes.
function networkTable(entries) {
  const rows = entries.map(e => h('tr', { class: e.allowed ? 'net-allowed' : 'net-refused' },
    h('td', {}, e.allowed ? (e.open ? 'open' : 'allowed') : 'refused'), h('td', { class: 'mono' }, `${e.method} ${e.host}:${e.port}`),
    h('td', {}, `${e.bytes_out || 0} B out · ${e.bytes_in || 0} B in`), h('td', { class: 'muted' }, e.reason || '')));
  return h('details', { class: 'network', open: entries.some(e => !e.allowed) },
    h('summary', {}, `Network: ${entries.length} connection${entries.length === 1 ? '' : 's'} through the proxy`),
    h('table', { class: 'network-log' }, h('tbody', {}, rows)));
}
