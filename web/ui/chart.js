// Line charts drawn as SVG: a time axis over the chosen window, a value axis in the unit that
// keeps labels short, one line per series with gaps where nothing was measured (null), and a
// legend that shows the latest value, or the value under the pointer.

import { h, s } from './dom.js';
import { axisUnit, clock, formatters } from './format.js';

export const COLORS = { read: '#2563eb', write: '#e8590c', other: '#7048e8' };

const MARGIN = { left: 64, right: 14, top: 12, bottom: 26 };
const TIME_STEPS_S = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800];

function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  const f = raw / power;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * power;
}

function trimTick(v) {
  return Number.isInteger(v) ? String(v) : String(Number(v.toFixed(2)));
}

/**
 * Draws a chart into `holder` (replacing what it held), sized to the holder's width.
 *
 * - `kind`: 'bytes' (per second), 'ops' or 'us': picks the axis unit and the legend format.
 * - `timestamps`: Unix seconds, one per value; `windowS`: the span the x axis covers (the
 *   chart is right-aligned on the newest point, so a young node's line starts mid-way).
 * - `series`: `[{ name, values, color }]`.
 */
export function renderChart(holder, { title, kind, timestamps, windowS, series, testid, height = 190, empty }) {
  const width = Math.max(320, Math.floor(holder.clientWidth || 560));
  const fmt = formatters[kind];
  const plotW = width - MARGIN.left - MARGIN.right;
  const plotH = height - MARGIN.top - MARGIN.bottom;
  const n = timestamps.length;
  const t1 = n ? timestamps[n - 1] : Math.floor(Date.now() / 1000);
  const t0 = t1 - Math.max(1, windowS || (n ? t1 - timestamps[0] : 60));
  const x = (t) => MARGIN.left + ((t - t0) / (t1 - t0)) * plotW;

  let peak = 0;
  let measured = 0;
  for (const line of series) {
    for (const v of line.values) {
      if (v !== null && v !== undefined) {
        measured += 1;
        if (v > peak) peak = v;
      }
    }
  }
  const unit = axisUnit(kind, peak);
  const scaledPeak = peak / unit.div;
  const step = scaledPeak > 0 ? niceStep(scaledPeak / 4) : 0.25;
  const top = scaledPeak > 0 ? Math.ceil(scaledPeak / step) * step : 1;
  const y = (v) => MARGIN.top + plotH - ((v / unit.div) / top) * plotH;

  const grid = [];
  for (let v = 0; v <= top + step / 1000; v += step) {
    const yy = MARGIN.top + plotH - (v / top) * plotH;
    grid.push(s('line', { class: 'grid-line', x1: MARGIN.left, x2: width - MARGIN.right, y1: yy, y2: yy }));
    grid.push(s('text', { class: 'tick', x: MARGIN.left - 6, y: yy + 4, 'text-anchor': 'end' }, trimTick(v)));
  }
  const span = t1 - t0;
  const tStep = TIME_STEPS_S.find((st) => span / st <= 8) || 3600;
  for (let t = Math.ceil(t0 / tStep) * tStep; t <= t1; t += tStep) {
    const xx = x(t);
    grid.push(s('line', { class: 'grid-line vertical', x1: xx, x2: xx, y1: MARGIN.top, y2: MARGIN.top + plotH }));
    const label = tStep >= 60 ? clock(t * 1000).slice(0, 5) : clock(t * 1000);
    grid.push(s('text', { class: 'tick', x: xx, y: height - 8, 'text-anchor': 'middle' }, label));
  }

  const lines = series.map((line) => {
    let d = '';
    const dots = [];
    line.values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      const px = x(timestamps[i]).toFixed(1);
      const py = y(v).toFixed(1);
      const before = i > 0 && line.values[i - 1] !== null && line.values[i - 1] !== undefined;
      const after = i + 1 < line.values.length && line.values[i + 1] !== null && line.values[i + 1] !== undefined;
      d += `${before ? 'L' : 'M'}${px} ${py}`;
      // A lone value (a latency in an otherwise idle window) would be invisible as a path.
      if (!before && !after) dots.push(s('circle', { class: 'dot', cx: px, cy: py, r: 2.5, fill: line.color }));
    });
    return s('g', { 'data-series': line.name },
      s('path', { class: 'series', d: d || 'M0 0', stroke: line.color }), dots);
  });

  const legendValues = series.map(() => h('span', { class: 'legend-value' }));
  const legendTime = h('span', { class: 'legend-time' });
  const showAt = (index) => {
    series.forEach((line, k) => {
      let v = null;
      if (index === null) {
        for (let i = line.values.length - 1; i >= 0 && v === null; i -= 1) v = line.values[i] ?? null;
      } else {
        v = line.values[index] ?? null;
      }
      legendValues[k].textContent = v === null ? '—' : fmt(v);
    });
    legendTime.textContent = index === null ? '' : clock(timestamps[index] * 1000);
  };
  showAt(null);

  const cursor = s('line', { class: 'cursor', x1: 0, x2: 0, y1: MARGIN.top, y2: MARGIN.top + plotH, visibility: 'hidden' });
  const overlay = s('rect', { class: 'overlay', x: MARGIN.left, y: MARGIN.top, width: plotW, height: plotH });
  overlay.addEventListener('mousemove', (event) => {
    if (!n) return;
    const box = overlay.getBoundingClientRect();
    const t = t0 + ((event.clientX - box.left) / box.width) * (t1 - t0);
    let best = 0;
    for (let i = 1; i < n; i += 1) if (Math.abs(timestamps[i] - t) < Math.abs(timestamps[best] - t)) best = i;
    const xx = x(timestamps[best]);
    cursor.setAttribute('x1', xx);
    cursor.setAttribute('x2', xx);
    cursor.setAttribute('visibility', 'visible');
    showAt(best);
  });
  overlay.addEventListener('mouseleave', () => {
    cursor.setAttribute('visibility', 'hidden');
    showAt(null);
  });

  const axes = [
    s('line', { class: 'axis', x1: MARGIN.left, x2: MARGIN.left, y1: MARGIN.top, y2: MARGIN.top + plotH }),
    s('line', { class: 'axis', x1: MARGIN.left, x2: width - MARGIN.right, y1: MARGIN.top + plotH, y2: MARGIN.top + plotH }),
  ];
  const quiet = measured === 0
    ? s('text', { class: 'chart-empty', x: MARGIN.left + plotW / 2, y: MARGIN.top + plotH / 2, 'text-anchor': 'middle' },
      empty || 'nothing measured in this window')
    : null;

  const svg = s('svg', { class: 'chart-svg', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': `${title} (${unit.suffix})` }, grid, axes, lines, quiet, cursor, overlay);
  const figure = h('figure', { class: 'chart', 'data-testid': testid, 'data-points': n,
    'data-measured': measured, 'data-peak': peak, 'data-window-s': windowS },
  h('figcaption', {}, h('span', { class: 'chart-title' }, title, h('small', { class: 'chart-unit' }, unit.suffix)),
    h('span', { class: 'legend' }, series.map((line, k) => h('span', { class: 'legend-item' },
      h('i', { class: 'swatch', style: { background: line.color } }), `${line.name} `, legendValues[k])),
    legendTime)),
  svg);
  holder.replaceChildren(figure);
  return figure;
}

/** Throughput, IOPS and latency charts of one scope's `IoRates` into three holders. */
export function renderIoCharts(holders, rates, timestamps, windowS, prefix) {
  const pair = (a, b) => [
    { name: 'read', values: rates[a] || [], color: COLORS.read },
    { name: 'write', values: rates[b] || [], color: COLORS.write },
  ];
  renderChart(holders.throughput, { title: 'Throughput', kind: 'bytes', timestamps, windowS,
    testid: `${prefix}-throughput`, series: pair('read_bytes_per_s', 'write_bytes_per_s'), empty: 'idle: no reads or writes' });
  renderChart(holders.iops, { title: 'IOPS', kind: 'ops', timestamps, windowS,
    testid: `${prefix}-iops`, series: pair('read_ops_per_s', 'write_ops_per_s'), empty: 'idle: no requests' });
  if (holders.latency) {
    renderChart(holders.latency, { title: 'Mean latency', kind: 'us', timestamps, windowS,
      testid: `${prefix}-latency`, series: pair('read_latency_us_mean', 'write_latency_us_mean'),
      empty: 'no requests: latency is measured per request' });
  }
}

/** Three holders side by side, ready for `renderIoCharts`. */
export function chartHolders(withLatency = true) {
  const holders = { throughput: h('div', { class: 'chart-holder' }), iops: h('div', { class: 'chart-holder' }) };
  if (withLatency) holders.latency = h('div', { class: 'chart-holder' });
  holders.element = h('div', { class: withLatency ? 'charts three' : 'charts two' },
    holders.throughput, holders.iops, holders.latency);
  return holders;
}
