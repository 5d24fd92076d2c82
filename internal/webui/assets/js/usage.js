// UsagePanel shows what the session uses, from a sample of its cgroup
// every second (GET /v1/sessions/{id}/metrics): CPU, memory and disk as
// numbers, each with a sparkline of the last minutes. It polls while the
// page is visible; watching does not count as using the session.

import { h, fmtBytes } from './dom.js';
import { getJSON } from './api.js';

const SVG = 'http://www.w3.org/2000/svg';
const POLL_MS = 2000;

// sparkline draws values (0..max) as a polyline in a small SVG.
function sparkline(values, max, id) {
  const w = 120, ht = 24;
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${w} ${ht}`);
  svg.setAttribute('class', 'spark');
  svg.setAttribute('id', id);
  svg.setAttribute('aria-hidden', 'true');
  if (values.length > 1 && max > 0) {
    const line = document.createElementNS(SVG, 'polyline');
    const step = w / (values.length - 1);
    line.setAttribute('points', values.map((v, i) =>
      `${(i * step).toFixed(1)},${(ht - 1 - Math.min(v / max, 1) * (ht - 2)).toFixed(1)}`).join(' '));
    svg.append(line);
  }
  return svg;
}

export class UsagePanel {
  constructor(base) {
    this.base = base;
    this.samples = [];
    this.summary = h('p', { class: 'small muted', id: 'usage-summary' }, 'Loading…');
    this.rows = h('dl', { class: 'usage-rows', id: 'usage-rows' });
    this.el = h('section', { class: 'nb-usage card', id: 'usage-panel', 'aria-labelledby': 'usage-title' },
      h('div', { class: 'card-head' }, h('h2', { id: 'usage-title' }, 'Resources')), this.summary, this.rows);
  }

  start() {
    this.stop();
    const tick = async () => {
      if (document.visibilityState === 'visible') await this.load();
      this.timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  stop() { clearTimeout(this.timer); }

  async load() {
    let m;
    const last = this.samples.at(-1);
    const since = last ? '?since=' + (Date.parse(last.time) / 1000).toFixed(3) : '';
    try {
      m = await getJSON(this.base + '/metrics' + since);
    } catch (e) {
      if (e.status === 404) { this.stop(); return; }
      this.summary.textContent = e.status === 501 ? 'Not measured on this server (no cgroup).' : 'Resources cannot be read: ' + e.message;
      if (e.status === 501) this.stop();
      return;
    }
    this.samples = this.samples.concat(m.samples).slice(-Math.round(m.window_s / m.interval_s));
    const s = this.samples.at(-1);
    if (!s) return;
    this.summary.textContent = `A sample a second, the last ${Math.round(this.samples.length * m.interval_s)} s.`;
    const row = (label, id, text, values, max) => [h('dt', {}, label),
      h('dd', {}, h('span', { class: 'mono', id: id + '-now' }, text), sparkline(values, max, id + '-spark'))];
    this.rows.replaceChildren(...[
      row('CPU', 'usage-cpu', `${s.cpu_percent.toFixed(0)}% of ${m.cpus} CPU`, this.samples.map(x => x.cpu_percent), 100),
      row('Memory', 'usage-mem', `${fmtBytes(s.memory_bytes)} of ${fmtBytes(m.memory_limit_bytes)}`,
        this.samples.map(x => x.memory_bytes), m.memory_limit_bytes),
      row('Disk', 'usage-disk', `${fmtBytes(s.disk_bytes)} of ${fmtBytes(m.disk_limit_bytes)}`,
        this.samples.map(x => x.disk_bytes), m.disk_limit_bytes),
    ].flat());
  }
}
