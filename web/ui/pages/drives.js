// Drives: every drive with its state, place, capacity, wear and errors; one drive's history.

import { get } from '../api.js';
import { chartHolders, renderIoCharts } from '../chart.js';
import { badge, bar, facts, h, section, table } from '../dom.js';
import * as f from '../format.js';
import { DRIVE_STATES, stateCounts } from './overview.js';

const HISTORY_S = 900;

function place(d) {
  return d.slot === null || d.slot === undefined ? `target ${d.target} · spare` : `target ${d.target} · slot ${d.slot}`;
}

function wear(d) {
  if (d.wear_percent === null || d.wear_percent === undefined) {
    return h('span', { class: 'muted', 'data-testid': 'drive-wear', 'data-rated': 'false' }, 'not rated');
  }
  const pct = d.wear_percent;
  return h('span', { 'data-testid': 'drive-wear', 'data-rated': 'true', 'data-wear-percent': pct },
    bar(pct / 100, { class: 'mini' }), pct > 0 && pct < 0.01 ? ' < 0.01 %' : ` ${pct.toFixed(2)} %`);
}

function remainingLife(d) {
  if (!d.rated_endurance_bytes) return h('span', { class: 'muted' }, 'not rated');
  const days = d.remaining_life_days;
  if (days === null || days === undefined) return h('span', { class: 'muted' }, 'unknown: no writes yet');
  return days >= 730 ? `${(days / 365).toFixed(1)} years` : `${days.toFixed(0)} days`;
}

function serial(d) {
  // Drive files have no serial number or model: the API gives the path for both.
  return d.device.startsWith('/dev/') ? d.device : h('span', { class: 'muted' }, 'none (file)');
}

function row(d, selected) {
  const link = `#page=drives&drive=${encodeURIComponent(d.id)}`;
  return h('tr', {
    class: ['clickable', selected ? 'selected' : null], 'data-testid': 'drive-row', 'data-drive-id': d.id,
    'data-state': d.state, 'data-target': d.target, 'data-slot': d.slot ?? 'spare',
    onclick: () => { location.hash = link; },
  },
  h('td', { class: 'path' }, h('a', { href: link, class: 'mono' }, d.device), h('div', { class: 'muted small mono', title: d.id }, `id ${d.id.slice(0, 8)}…`)),
  h('td', {}, badge(d.state, 'drive-state')),
  h('td', { class: 'nowrap' }, serial(d)),
  h('td', { class: 'num' }, f.bytes(d.capacity_bytes)),
  h('td', { class: 'nowrap', 'data-testid': 'drive-place' }, place(d)),
  h('td', { class: 'nowrap' }, wear(d)),
  h('td', { class: 'nowrap' }, remainingLife(d)),
  h('td', { class: ['num', d.errors ? 'bad' : null], 'data-testid': 'drive-errors' }, f.count(d.errors)),
  h('td', { class: 'num' }, `${f.bytes(d.read_bytes)} / ${f.bytes(d.written_bytes)}`,
    h('div', { class: 'muted small' }, `${f.count(d.read_ops)} / ${f.count(d.write_ops)} ops`)),
  h('td', { class: 'num' }, f.latency(d.read_latency_p99_us), h('div', {}, f.latency(d.write_latency_p99_us))));
}

export default {
  id: 'drives',
  title: 'Drives',
  mount(root, ctx) {
    const chosen = ctx.params.get('drive');
    const summary = h('div', { class: 'summary' });
    const list = h('div', { class: 'table-wrap' });
    const detail = h('div');
    const charts = chosen ? chartHolders(false) : null;
    const detailFacts = h('div');
    const history = h('div');
    root.append(section('All drives', {}, summary, list,
      h('p', { class: 'muted small' }, 'Click a drive for its history. Read and written are since the node started; wear and remaining life need a rated endurance (stria up --rated-tbw N, in TB written).')), detail);
    if (chosen) {
      detail.append(section('Drive', { 'data-testid': 'drive-detail', 'data-drive-id': chosen },
        h('p', {}, h('a', { href: '#page=drives' }, '← all drives')), detailFacts,
        h('h3', {}, `Traffic over the last ${HISTORY_S / 60} minutes (RAID parity, mirror and rebuild traffic included)`),
        history, charts.element,
        h('p', { class: 'muted small' }, 'No per-drive latency series: the drive layer keeps a since-start p99, shown above.')));
    }

    return {
      intervalMs: 2000,
      async refresh() {
        const [drives, perf] = await Promise.all([get('/drives'), chosen ? get(`/performance?seconds=${HISTORY_S}`) : null]);
        summary.replaceChildren(h('p', {}, `${drives.length} drive${drives.length === 1 ? '' : 's'}`), stateCounts(drives, DRIVE_STATES, 'drive-state-counts'));
        list.replaceChildren(table(
          ['Drive (path)', 'State', 'Serial', 'Capacity', 'Target and slot', 'Wear', 'Remaining life', 'Errors', 'Read / written', 'p99 read / write'],
          drives.map((d) => row(d, d.id === chosen)), { 'data-testid': 'drives-table' }, 'This node has no drives.'));
        if (!chosen) return;
        const d = drives.find((x) => x.id === chosen);
        if (!d) {
          detailFacts.replaceChildren(h('p', { class: 'form-error' }, `No drive ${chosen} on this node.`));
          return;
        }
        detailFacts.replaceChildren(h('div', { class: 'split' },
          facts([
            ['Path', h('span', { class: 'mono' }, d.device)], ['Id', h('span', { class: 'mono' }, d.id)],
            ['Backend', d.backend], ['Place', place(d)], ['State', badge(d.state, 'detail-state')],
            ['Capacity', f.bytes(d.capacity_bytes)],
          ]),
          facts([
            ['Errors (lifetime)', f.count(d.errors)], ['Written (lifetime)', f.bytes(d.lifetime_written_bytes)],
            ['Rated endurance', d.rated_endurance_bytes ? f.bytes(d.rated_endurance_bytes) : 'not rated'],
            ['Wear', wear(d)], ['Remaining life', remainingLife(d)],
            ['p99 latency read / write', `${f.latency(d.read_latency_p99_us)} / ${f.latency(d.write_latency_p99_us)}`],
          ])));
        const series = perf.drives.find((x) => x.drive === chosen);
        if (!series) {
          history.replaceChildren(h('p', { class: 'muted', 'data-testid': 'drive-no-history' }, 'No series for this drive yet: series start when the node starts or the drive joins.'));
          charts.element.hidden = true;
          return;
        }
        history.replaceChildren();
        charts.element.hidden = false;
        renderIoCharts(charts, series, perf.timestamps_unix_s, HISTORY_S, 'chart-drive');
      },
    };
  },
};
