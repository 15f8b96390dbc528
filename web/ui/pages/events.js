// Events: what happened to the node, newest first, polled with `?since=` so each refresh moves
// only what is new. The node keeps its last 1000 events in memory; a restart starts over.

import { get } from '../api.js';
import { badge, h, section, table } from '../dom.js';
import * as f from '../format.js';
import { select } from '../forms.js';

const KEPT = 1000;
const SEVERITY_RANK = { info: 0, warning: 1, error: 2 };

export default {
  id: 'events',
  title: 'Events',
  mount(root) {
    let events = []; // newest first
    let cursor = null;
    let shown = '';
    const severity = select('Severity', { name: 'severity', 'data-testid': 'severity-select' },
      [['info', 'All'], ['warning', 'Warnings and errors'], ['error', 'Errors']]);
    const text = h('input', { type: 'search', placeholder: 'filter: kind, subject or text', 'data-testid': 'event-filter' });
    const count = h('span', { class: 'muted', 'data-testid': 'event-count' });
    const list = h('div', { class: 'table-wrap' });
    root.append(h('div', { class: 'toolbar' }, severity, h('label', { class: 'field' }, h('span', { class: 'field-label' }, 'Filter'), text), count),
      section('Events, newest first', {}, list));

    const render = () => {
      const min = SEVERITY_RANK[severity.querySelector('select').value];
      const needle = text.value.trim().toLowerCase();
      const visible = events.filter((e) => SEVERITY_RANK[e.severity] >= min
        && (!needle || `${e.kind} ${e.subject} ${e.message}`.toLowerCase().includes(needle)));
      const key = `${cursor}|${min}|${needle}|${events.length}`;
      if (key === shown) return;
      shown = key;
      count.textContent = `${visible.length} of ${events.length} events (the node keeps its last ${KEPT})`;
      list.replaceChildren(table(['#', 'Time', 'Severity', 'Kind', 'Subject', 'What happened'],
        visible.map((e) => h('tr', { 'data-testid': 'event-row', 'data-seq': e.seq, 'data-kind': e.kind, 'data-severity': e.severity, class: `sev-${e.severity}` },
          h('td', { class: 'num muted' }, e.seq), h('td', { class: 'mono nowrap' }, f.when(e.time_unix_ms)),
          h('td', {}, badge(e.severity)), h('td', { class: 'mono' }, e.kind), h('td', { class: 'mono' }, e.subject),
          h('td', {}, e.message))),
        { 'data-testid': 'events-table' }, 'No events match.'));
    };
    severity.addEventListener('change', render);
    text.addEventListener('input', render);

    return {
      intervalMs: 2000,
      async refresh() {
        if (cursor !== null) {
          const page = await get(`/events?since=${cursor}&limit=${KEPT}`);
          if (page.last_seq >= cursor) {
            events = [...page.events].reverse().concat(events).slice(0, KEPT);
            cursor = page.last_seq;
            render();
            return;
          }
          // The node restarted: its numbering began again, so start over.
        }
        const page = await get(`/events?limit=${KEPT}`);
        events = [...page.events].reverse();
        cursor = page.last_seq;
        render();
      },
    };
  },
};
