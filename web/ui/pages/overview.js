// Overview: the node at a glance: state, capacity, hardware by state, clients, live charts,
// latest events.

import { get } from '../api.js';
import { chartHolders, renderIoCharts } from '../chart.js';
import { badge, bar, h, section, table } from '../dom.js';
import * as f from '../format.js';

const WINDOW_S = 300;
export const TARGET_STATES = ['optimal', 'rebuilding', 'degraded', 'failed'];
export const DRIVE_STATES = ['active', 'rebuilding', 'spare', 'empty', 'missing', 'failed'];

/** Counts per state, every known state listed (zeros dimmed) and any unknown one added. */
export function stateCounts(items, states, testid) {
  const counts = new Map(states.map((s) => [s, 0]));
  for (const item of items) counts.set(item.state, (counts.get(item.state) || 0) + 1);
  return h('ul', { class: 'state-counts', 'data-testid': testid },
    [...counts].map(([state, n]) => h('li', { class: n ? null : 'zero', 'data-state': state, 'data-count': n },
      h('strong', {}, n), ' ', badge(state))));
}

/** One square per drive slot, coloured by state. */
export function slotMap(target) {
  return h('div', { class: 'slots', 'data-testid': 'slot-map' }, target.drives.map((d) => h('a', {
    class: `slot state-${d.state}`, href: `#page=drives&drive=${encodeURIComponent(d.id)}`,
    title: `${d.slot === null || d.slot === undefined ? 'spare' : `slot ${d.slot}`}: ${d.state} · ${d.device}`,
    'data-state': d.state,
  }, d.slot === null || d.slot === undefined ? 'S' : String(d.slot))));
}

function card(title, testid, ...children) {
  return h('section', { class: 'card', 'data-testid': testid }, h('h3', {}, title), ...children);
}

export default {
  id: 'overview',
  title: 'Overview',
  mount(root) {
    const cards = h('div', { class: 'cards' });
    const hardware = h('div', { class: 'hardware' });
    const charts = chartHolders(true);
    const recent = h('div');
    const clients = h('div');
    root.append(cards,
      section('Hardware', { 'data-testid': 'hardware' }, hardware),
      section('Clients', {}, clients),
      section(`Live performance · last ${WINDOW_S / 60} minutes, all targets`, {}, charts.element),
      section('Latest events', {}, recent, h('p', {}, h('a', { href: '#page=events' }, 'All events →'))));

    return {
      intervalMs: 2000,
      async refresh() {
        const [cluster, targets, perf, events, users] = await Promise.all([
          get('/cluster'), get('/targets'), get(`/performance?seconds=${WINDOW_S}`), get('/events?limit=5'),
          get('/clients'),
        ]);
        const node = cluster.nodes[0] || { addresses: {} };
        const usedRatio = cluster.capacity_bytes ? cluster.used_bytes / cluster.capacity_bytes : 0;
        const drives = targets.flatMap((t) => t.drives);
        cards.replaceChildren(
          card('State', 'card-state', h('div', { class: 'big' }, badge(cluster.state, 'cluster-state')),
            h('p', { class: 'muted' }, `${cluster.nodes.length} node · ${targets.length} target${targets.length === 1 ? '' : 's'} · ${drives.length} drives`)),
          card('Capacity', 'card-capacity',
            bar(usedRatio, { 'data-testid': 'capacity-bar', 'data-capacity-bytes': cluster.capacity_bytes,
              'data-used-bytes': cluster.used_bytes, 'data-free-bytes': cluster.free_bytes, class: 'capacity' }, f.percent(usedRatio)),
            h('p', { class: 'capacity-legend' },
              h('span', { class: 'used', 'data-testid': 'capacity-used' }, `${f.bytes(cluster.used_bytes)} used`),
              h('span', { class: 'free', 'data-testid': 'capacity-free' }, `${f.bytes(cluster.free_bytes)} free`),
              h('span', { class: 'muted' }, `of ${f.bytes(cluster.capacity_bytes)}`))),
          card('Block volumes', 'card-volumes', h('div', { class: 'big' }, h('span', { 'data-testid': 'volume-count' }, cluster.volumes),
            h('small', {}, ` volume${cluster.volumes === 1 ? '' : 's'} · `), h('span', { 'data-testid': 'export-count' }, cluster.exports),
            h('small', {}, ` export${cluster.exports === 1 ? '' : 's'}`)), h('p', {}, h('a', { href: '#page=storage' }, 'Storage →'))),
          card('Node', 'card-node', h('p', { class: 'host' }, node.hostname || '—'),
            h('p', { class: 'muted' }, `up ${f.duration(node.uptime_s || 0)} · version ${cluster.version}`),
            h('p', { class: 'muted mono' }, node.addresses.mount ? `mounted at ${node.addresses.mount}` : 'file system not mounted'),
            node.addresses.nbd ? h('p', { class: 'muted mono' }, `NBD on ${node.addresses.nbd}`) : null),
        );

        hardware.replaceChildren(
          h('div', { class: 'split' },
            h('div', {}, h('h3', {}, 'Targets by state'), stateCounts(targets, TARGET_STATES, 'targets-by-state')),
            h('div', {}, h('h3', {}, 'Drives by state'), stateCounts(drives, DRIVE_STATES, 'drives-by-state'))),
          h('div', { class: 'target-lines' }, targets.map((t) => h('div', { class: 'target-line', 'data-testid': 'target-line', 'data-target': t.id, 'data-state': t.state },
            h('a', { href: '#page=storage', class: 'target-name' }, `Target ${t.id}`),
            h('span', { class: 'muted' }, `${t.geometry.level.toUpperCase()} · pool ${t.pool}`),
            badge(t.state), slotMap(t),
            t.rebuild ? bar(t.rebuild.progress_ratio, { class: 'rebuild', 'data-testid': 'overview-rebuild' },
              `rebuilding slot ${t.rebuild.slot}: ${f.percent(t.rebuild.progress_ratio, 0)}`) : null,
            t.scrub.state === 'running' ? bar(t.scrub.progress_ratio, { class: 'scrub' }, `scrub ${f.percent(t.scrub.progress_ratio, 0)}`) : null,
            t.warnings.length ? h('span', { class: 'warning-text' }, t.warnings.join('; ')) : null))));

        // FUSE mounts (the node's own, and `stria mount`s here or elsewhere) and NBD connections.
        clients.replaceChildren(table(['Kind', 'Where', 'Export', 'Since'], users.map((c) => h('tr', {
          'data-testid': 'client-row', 'data-kind': c.kind, 'data-mount': c.mount || '',
        },
        h('td', {}, c.kind === 'fuse' ? 'FUSE mount' : 'NBD'),
        h('td', { class: 'mono' }, c.kind === 'fuse'
          ? `${c.host ? `${c.host}:` : ''}${c.mount}${c.host ? '' : ' (this node)'}`
          : `${c.peer}${c.tls ? ' · TLS' : ''}`),
        h('td', {}, c.export || '—'),
        h('td', { class: 'muted' }, c.since_unix_s ? f.when(c.since_unix_s * 1000) : '—'))),
        { 'data-testid': 'clients' }, 'No clients.'));

        renderIoCharts(charts, perf.total, perf.timestamps_unix_s, WINDOW_S, 'chart');

        const latest = [...events.events].reverse();
        recent.replaceChildren(latest.length
          ? h('ul', { class: 'event-list', 'data-testid': 'recent-events' }, latest.map((e) => h('li', { 'data-kind': e.kind },
            h('span', { class: 'muted mono' }, f.when(e.time_unix_ms)), ' ', badge(e.severity), ' ', e.message)))
          : h('p', { class: 'muted' }, 'No events yet.'));
      },
    };
  },
};
