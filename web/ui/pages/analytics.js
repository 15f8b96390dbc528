// Analytics: used capacity and file counts by user, file type (extension) and top-level
// directory (fileset), and a histogram of file sizes in 5 classes. The numbers come from
// GET /api/v1/analytics, which reads counters the metadata service keeps current as files
// change: loading this page never walks the tree.

import { get } from '../api.js';
import { bar, facts, h, s, section, table } from '../dom.js';
import * as f from '../format.js';

const TOP = 10;
const HIST = { left: 64, right: 14, top: 22, bottom: 40, height: 230 };

function niceStep(raw) {
  const power = 10 ** Math.floor(Math.log10(raw));
  const x = raw / power;
  return (x <= 1 ? 1 : x <= 2 ? 2 : x <= 5 ? 5 : 10) * power;
}

/** One ranking: name, files, bytes with a bar against the file system's total. */
function ranking(title, testid, rows, total, nameOf, attrsOf, empty) {
  const body = rows.map((r) => h('tr', { 'data-testid': testid, 'data-files': r.files, 'data-bytes': r.bytes, ...attrsOf(r) },
    h('td', { class: 'mono', 'data-testid': `${testid}-name` }, nameOf(r)),
    h('td', { class: 'num', 'data-testid': `${testid}-files` }, f.count(r.files)),
    h('td', { class: 'num nowrap', 'data-testid': `${testid}-bytes` }, f.bytes(r.bytes)),
    h('td', {}, bar(total.bytes ? r.bytes / total.bytes : 0, { class: 'mini' }),
      h('span', { class: 'muted small' }, f.percent(total.bytes ? r.bytes / total.bytes : 0)))));
  return section(title, { 'data-testid': `${testid}s` },
    table(['Name', 'Files', 'Used', 'Share of used'], body, {}, empty));
}

/** The size histogram as SVG bars: file counts per class, bytes in the label under each. */
function histogram(holder, classes) {
  const width = Math.max(320, Math.floor(holder.clientWidth || 560));
  const plotW = width - HIST.left - HIST.right;
  const plotH = HIST.height - HIST.top - HIST.bottom;
  const peak = Math.max(0, ...classes.map((c) => c.files));
  const step = peak > 0 ? niceStep(Math.max(1, peak / 4)) : 1;
  const top = peak > 0 ? Math.ceil(peak / step) * step : 1;
  const y = (v) => HIST.top + plotH - (v / top) * plotH;
  const grid = [];
  for (let v = 0; v <= top; v += step) {
    grid.push(s('line', { class: 'grid-line', x1: HIST.left, x2: width - HIST.right, y1: y(v), y2: y(v) }));
    grid.push(s('text', { class: 'tick', x: HIST.left - 6, y: y(v) + 4, 'text-anchor': 'end' }, f.count(v)));
  }
  const slot = plotW / classes.length;
  const bars = classes.map((c, i) => {
    const x = HIST.left + i * slot + slot * 0.15;
    const w = slot * 0.7;
    return s('g', { 'data-testid': 'size-class', 'data-label': c.label, 'data-files': c.files, 'data-bytes': c.bytes },
      s('rect', { class: 'hist-bar', x, y: y(c.files), width: w, height: Math.max(0, y(0) - y(c.files)) },
        s('title', {}, `${c.label}: ${f.count(c.files)} files, ${f.bytes(c.bytes)}`)),
      s('text', { class: 'tick value', x: x + w / 2, y: y(c.files) - 5, 'text-anchor': 'middle' }, f.count(c.files)),
      s('text', { class: 'tick', x: x + w / 2, y: HIST.height - 22, 'text-anchor': 'middle' }, c.label),
      s('text', { class: 'tick muted', x: x + w / 2, y: HIST.height - 8, 'text-anchor': 'middle' }, f.bytes(c.bytes)));
  });
  const axes = [
    s('line', { class: 'axis', x1: HIST.left, x2: HIST.left, y1: HIST.top, y2: HIST.top + plotH }),
    s('line', { class: 'axis', x1: HIST.left, x2: width - HIST.right, y1: y(0), y2: y(0) }),
  ];
  holder.replaceChildren(h('figure', { class: 'chart', 'data-testid': 'size-histogram', 'data-classes': classes.length },
    h('figcaption', {}, h('span', { class: 'chart-title' }, 'Files by size',
      h('small', { class: 'chart-unit' }, 'files per class; bytes under each bar'))),
    s('svg', { class: 'chart-svg', width, height: HIST.height, viewBox: `0 0 ${width} ${HIST.height}`, role: 'img',
      'aria-label': 'Histogram of file sizes (files per class)' }, grid, axes, bars)));
}

export default {
  id: 'analytics',
  title: 'Analytics',
  mount(root) {
    const summary = h('div');
    const rankings = h('div', { class: 'split' });
    const more = h('div', { class: 'split' });
    const hist = h('div', { class: 'chart-holder' });
    const fs = h('div');
    root.append(summary, rankings, more,
      section('File sizes', { 'data-testid': 'sizes' }, hist),
      section('File system (statfs)', { 'data-testid': 'filesystem' }, fs));
    return {
      intervalMs: 10000,
      async refresh() {
        const [a, filesystems] = await Promise.all([
          get(`/analytics?top=${TOP}`).catch((e) => ({ error: e })),
          get('/filesystems').catch((e) => ({ error: e })),
        ]);
        if (a.error) {
          summary.replaceChildren(section('Analytics', { class: 'unavailable', 'data-testid': 'analytics-unavailable' },
            h('p', { class: 'form-error' }, a.error.describe())));
          rankings.replaceChildren();
          more.replaceChildren();
          hist.replaceChildren();
        } else {
          summary.replaceChildren(section('Used by files', { 'data-testid': 'analytics' },
            facts([
              ['Files', h('span', { 'data-testid': 'analytics-files' }, f.count(a.total.files))],
              ['Used (logical bytes)', h('span', { 'data-testid': 'analytics-bytes' }, f.bytes(a.total.bytes))],
            ]),
            h('p', { class: 'muted small' }, `From the metadata service's counters, kept current as files change; the top ${a.top} of each ranking by bytes. Hard links count once.`)));
          rankings.replaceChildren(
            ranking(`By user (top ${a.top})`, 'user-row', a.users, a.total,
              (u) => (u.name ? `${u.name} (${u.uid})` : `uid ${u.uid}`), (u) => ({ 'data-uid': u.uid }), 'no files'),
            ranking(`By file type (top ${a.top})`, 'ext-row', a.extensions, a.total,
              (e) => (e.extension ? `.${e.extension}` : '(no extension)'), (e) => ({ 'data-extension': e.extension }), 'no files'));
          more.replaceChildren(
            ranking(`By top-level directory (top ${a.top})`, 'fileset-row', a.filesets, a.total,
              (d) => (d.name === '/' ? '/ (files in the root)' : `/${d.name}`), (d) => ({ 'data-fileset': d.name }), 'no files'),
            ranking(`By group (top ${a.top})`, 'group-row', a.groups, a.total,
              (g) => (g.name ? `${g.name} (${g.gid})` : `gid ${g.gid}`), (g) => ({ 'data-gid': g.gid }), 'no files'));
          histogram(hist, a.size_histogram);
        }

        if (filesystems.error) {
          fs.replaceChildren(h('p', { class: 'form-error' }, filesystems.error.describe()));
          return;
        }
        fs.replaceChildren(...filesystems.map((x) => h('div', { class: 'split', 'data-testid': 'fs-card' },
          h('div', {}, h('h3', {}, 'Capacity'),
            bar(x.capacity_bytes ? x.used_bytes / x.capacity_bytes : 0, {}, `${f.bytes(x.used_bytes)} of ${f.bytes(x.capacity_bytes)}`),
            facts([['File system', x.name], ['Pool', x.pool], ['Mounted at', x.mount || 'not mounted'], ['Free', f.bytes(x.free_bytes)]])),
          h('div', {}, h('h3', {}, 'Inodes (files and directories)'),
            bar(x.inodes_total ? x.inodes_used / x.inodes_total : 0, {}, `${f.count(x.inodes_used)} of ${f.count(x.inodes_total)}`),
            facts([['Used', h('span', { 'data-testid': 'inodes-used' }, f.count(x.inodes_used))], ['Free', f.count(x.inodes_free)]])))));
      },
    };
  },
};
