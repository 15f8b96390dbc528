// Analytics: usage by user, file type and top-level directory, file counts and a size
// histogram, from the metadata service's counters. The API has no such route yet, so this page
// says so instead of drawing numbers it does not have; it shows what statfs does report.

import { get } from '../api.js';
import { bar, facts, h, section } from '../dom.js';
import * as f from '../format.js';

const PLANNED = [
  'Used capacity by user (top 10)',
  'Used capacity by file type (extension)',
  'Used capacity by top-level directory (fileset)',
  'File counts by user, type and directory',
  'A histogram of file sizes in 5 classes',
];

export default {
  id: 'analytics',
  title: 'Analytics',
  mount(root) {
    const status = h('div');
    const fs = h('div');
    root.append(status, section('File system (statfs)', { 'data-testid': 'filesystem' }, fs));
    return {
      intervalMs: 10000,
      async refresh() {
        // The document lists every route the node serves; it needs no token.
        const [doc, filesystems] = await Promise.all([
          get('/openapi.json'),
          get('/filesystems').catch((e) => ({ error: e })),
        ]);
        const routes = Object.keys(doc.paths || {}).filter((p) => p.includes('/analytics'));
        status.replaceChildren(routes.length
          ? section('Analytics', { 'data-testid': 'analytics-available' },
            h('p', {}, `The node serves ${routes.join(', ')}, but this version of the dashboard does not draw it yet.`))
          : section('Analytics', { class: 'unavailable', 'data-testid': 'analytics-unavailable' },
            h('p', { class: 'big-note' }, 'Not available yet: needs the metadata counters route.'),
            h('p', {}, 'These views will be computed from counters the metadata service keeps as files change, not by walking the tree on every page load. The node\'s API has no such route yet (checked in /api/v1/openapi.json), so this page shows no numbers rather than made-up ones:'),
            h('ul', {}, PLANNED.map((p) => h('li', {}, p)))));

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
