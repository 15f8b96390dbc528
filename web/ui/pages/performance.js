// Performance: throughput, IOPS and latency over a chosen window, for all targets, a pool, a
// target or a volume.

import { get } from '../api.js';
import { COLORS, renderChart } from '../chart.js';
import { h, section, table } from '../dom.js';
import * as f from '../format.js';
import { select } from '../forms.js';

export const RANGES = [['300', '5 min'], ['900', '15 min'], ['3600', '1 h']];

function stats(values) {
  const known = values.filter((v) => v !== null && v !== undefined);
  if (!known.length) return { latest: null, mean: null, peak: null };
  let latest = null;
  for (let i = values.length - 1; i >= 0 && latest === null; i -= 1) latest = values[i] ?? null;
  return { latest, mean: known.reduce((a, b) => a + b, 0) / known.length, peak: Math.max(...known) };
}

const METRICS = [
  { title: 'Throughput', kind: 'bytes', read: 'read_bytes_per_s', write: 'write_bytes_per_s', testid: 'perf-throughput' },
  { title: 'IOPS', kind: 'ops', read: 'read_ops_per_s', write: 'write_ops_per_s', testid: 'perf-iops' },
  { title: 'Mean latency', kind: 'us', read: 'read_latency_us_mean', write: 'write_latency_us_mean', testid: 'perf-latency' },
];

export default {
  id: 'performance',
  title: 'Performance',
  mount(root, ctx) {
    const range = RANGES.some(([v]) => v === ctx.params.get('range')) ? ctx.params.get('range') : RANGES[0][0];
    const scope = ctx.params.get('scope') || 'total';
    const rangeSelect = select('Time range', { name: 'range', 'data-testid': 'range-select' }, RANGES);
    const scopeSelect = select('Scope', { name: 'scope', 'data-testid': 'scope-select' }, [['total', 'All targets']]);
    rangeSelect.querySelector('select').value = range;
    rangeSelect.addEventListener('change', (e) => ctx.navigate({ range: e.target.value }));
    scopeSelect.addEventListener('change', (e) => ctx.navigate({ scope: e.target.value }));
    const holders = METRICS.map(() => h('div', { class: 'chart-holder wide' }));
    const summary = h('div', { class: 'table-wrap' });
    const note = h('p', { class: 'muted small' });
    root.append(
      h('div', { class: 'toolbar', 'data-testid': 'perf-controls', 'data-range-s': range, 'data-scope': scope }, rangeSelect, scopeSelect, note),
      section('Charts', {}, ...holders),
      section('Over the window', {}, summary,
        h('p', { class: 'muted small' }, 'Targets and pools: what clients read and wrote (chunk requests), before RAID adds parity and mirror writes; latency is the time each request spent in the storage service. Volumes: what their NBD clients read and wrote, latency from request to reply in the gateway. Per-drive traffic is on each drive\'s page.')));

    return {
      intervalMs: Number(range) > 900 ? 5000 : 2000,
      async refresh() {
        const perf = await get(`/performance?seconds=${range}`);
        const scopes = [
          ['total', 'All targets'],
          ...(perf.pools || []).map((p) => [`pool-${p.pool}`, `Pool ${p.pool}`]),
          ...perf.targets.map((t) => [`target-${t.target}`, `Target ${t.target}`]),
          ...(perf.volumes || []).map((v) => [`volume-${v.volume}`, `Volume ${v.volume}`]),
        ];
        const sel = scopeSelect.querySelector('select');
        if (sel.options.length !== scopes.length) {
          sel.replaceChildren(...scopes.map(([v, text]) => h('option', { value: v }, text)));
        }
        sel.value = scopes.some(([v]) => v === scope) ? scope : 'total';
        const scoped = [
          ...(perf.pools || []).map((p) => [`pool-${p.pool}`, p.rates]),
          ...perf.targets.map((t) => [`target-${t.target}`, t.rates]),
          ...(perf.volumes || []).map((v) => [`volume-${v.volume}`, v.rates]),
        ];
        const rates = scope === 'total' ? perf.total : (scoped.find(([k]) => k === scope) || [])[1];
        if (!rates) {
          note.textContent = `No series for ${scope}; showing nothing.`;
          return;
        }
        const points = perf.timestamps_unix_s.length;
        note.textContent = points < Number(range)
          ? `${points} s of samples so far (the node samples every ${perf.interval_s} s and keeps an hour)`
          : `one sample every ${perf.interval_s} s`;
        METRICS.forEach((m, i) => renderChart(holders[i], {
          title: m.title, kind: m.kind, timestamps: perf.timestamps_unix_s, windowS: Number(range), testid: m.testid, height: 210,
          series: [{ name: 'read', values: rates[m.read], color: COLORS.read }, { name: 'write', values: rates[m.write], color: COLORS.write }],
          empty: m.kind === 'us' ? 'no requests: latency is measured per request' : 'idle',
        }));
        const rows = [];
        for (const m of METRICS) {
          for (const dir of ['read', 'write']) {
            const st = stats(rates[m[dir]]);
            const fmt = f.formatters[m.kind];
            rows.push([`${m.title} · ${dir}`, fmt(st.latest), fmt(st.mean), fmt(st.peak)]);
          }
        }
        summary.replaceChildren(table(['Series', 'Latest', 'Mean', 'Peak'], rows, { 'data-testid': 'perf-summary' }));
      },
    };
  },
};
