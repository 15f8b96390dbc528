// Storage: targets (RAID arrays) with geometry, state, rebuild and scrub; pools; volumes and
// their exports with access lists. Forms create and delete volumes and exports, edit access
// lists, set the rebuild rate, start or stop scrubs, replace a failed drive and add hot spares,
// all through the API.

import { api, get } from '../api.js';
import { badge, bar, facts, h, section, table } from '../dom.js';
import * as f from '../format.js';
import { act, errorLine, field, refuse, select, setOptions, submit } from '../forms.js';
import { slotMap } from './overview.js';

const MIB = 1024 * 1024;
const GIB = 1024 * MIB;
const DRIVE_PATH_HINT = 'An absolute path, or a bare file name for DATA/drives/NAME on the node';

/** The body of a new drive: its path, and the size to create it with (GiB; empty: it exists). */
function newDrive(form) {
  const e = form.elements;
  const path = e.path.value.trim();
  if (!path) throw refuse('path', 'enter the drive\'s path or a file name');
  const raw = e.create_bytes.value;
  if (raw !== '' && !(Number(raw) > 0)) throw refuse('create_bytes', 'enter a size in GiB, or leave it empty for an existing drive');
  return { path, create_bytes: raw === '' ? null : Math.round(Number(raw) * GIB) };
}

function driveFields() {
  return [
    field('Drive', { name: 'path', placeholder: 'new.img or /dev/nvme2n1', spellcheck: 'false' }, DRIVE_PATH_HINT),
    field('Create (GiB, empty: it exists)', { name: 'create_bytes', type: 'number', min: '0', step: 'any' }),
  ];
}
const SIZE_UNITS = [['1048576', 'MiB'], ['1073741824', 'GiB'], ['1099511627776', 'TiB']];

const redundancy = { raid0: 'none', raid1: 'mirror', raid10: 'mirror', raid5: 'parity', raid6: 'parity' };

function geometry(t) {
  const g = t.geometry;
  const extra = g.drives - g.data_drives;
  return facts([
    ['RAID level', h('strong', { 'data-testid': 'target-level' }, g.level.toUpperCase())],
    ['Geometry', `${g.drives} drives: ${g.data_drives} data + ${extra} ${redundancy[g.level] || 'redundancy'}`],
    ['Stripe unit', f.bytes(g.stripe_unit_bytes)],
    ['Survives', `${g.tolerated_failures} failed drive${g.tolerated_failures === 1 ? '' : 's'}`],
    ['Array capacity', f.bytes(g.array_capacity_bytes)],
    ['Pool', t.pool],
  ]);
}

function rebuild(t) {
  const limit = `rate limit ${f.rate(t.rebuild_rate_limit_bytes_per_s)}`;
  if (!t.rebuild) return h('div', { 'data-testid': 'rebuild' }, h('p', { class: 'muted' }, `No rebuild under way · ${limit}`));
  const r = t.rebuild;
  return h('div', { 'data-testid': 'rebuild' },
    bar(r.progress_ratio, { class: 'rebuild', 'data-testid': 'rebuild-progress', 'data-progress': r.progress_ratio },
      `slot ${r.slot}: ${f.percent(r.progress_ratio)}`),
    h('p', { class: r.error ? 'form-error' : 'muted' },
      r.running ? `rebuilding at ${f.rate(r.rate_bytes_per_s)} · ${limit}` : `stopped${r.error ? `: ${r.error}` : ''} · ${limit}`));
}

function scrub(t) {
  const sc = t.scrub;
  const found = sc.findings;
  const clean = found && !found.checksum_errors && !found.parity_mismatches && !found.unrecoverable_blocks;
  return h('div', { 'data-testid': 'scrub', 'data-scrub-state': sc.state },
    h('p', {}, badge(sc.state, 'scrub-state'), ' ',
      sc.state === 'idle' ? 'no scrub since the node started' : `${sc.runs} scrub${sc.runs === 1 ? '' : 's'} ended since start`,
      sc.started_unix_s ? ` · started ${f.when(sc.started_unix_s * 1000)}` : '',
      sc.finished_unix_s ? ` · ended ${f.when(sc.finished_unix_s * 1000)}` : '',
      sc.rate_limit_bytes_per_s ? ` · limit ${f.rate(sc.rate_limit_bytes_per_s)}` : ''),
    sc.state === 'running' || sc.state === 'stopped' ? bar(sc.progress_ratio, { class: 'scrub', 'data-testid': 'scrub-progress' }, f.percent(sc.progress_ratio)) : null,
    found ? h('p', { class: clean ? 'good' : 'bad', 'data-testid': 'scrub-findings' },
      clean ? 'Clean: ' : 'Found errors: ',
      `${f.bytes(found.bytes_checked)} in ${f.count(found.stripes_checked)} stripes checked · ${f.count(found.checksum_errors)} checksum errors · `,
      `${f.count(found.repaired_blocks)} repaired · ${f.count(found.parity_mismatches)} parity mismatches · ${f.count(found.unrecoverable_blocks)} unrecoverable`) : null,
    sc.error ? h('p', { class: 'form-error' }, sc.error) : null);
}

/** A target's card: the figures are redrawn at each refresh, the forms are kept (and what is typed in them). */
function targetCard(ctx) {
  const title = h('h3', {});
  const state = h('span');
  const figures = h('div', { class: 'target-figures' });
  const rateError = errorLine('rebuild-rate-error');
  const rateForm = h('form', { class: 'inline-form', 'data-testid': 'rebuild-rate-form' },
    field('Rebuild rate limit (MiB/s)', { name: 'rate_bytes_per_s', type: 'number', min: '1', step: 'any' }),
    h('button', { type: 'submit' }, 'Set'), rateError);
  const scrubError = errorLine('scrub-error');
  const repair = h('input', { type: 'checkbox', name: 'repair', checked: true });
  const stop = h('button', { type: 'button', 'data-testid': 'scrub-stop' }, 'Stop scrub');
  const scrubForm = h('form', { class: 'inline-form', 'data-testid': 'scrub-form' },
    h('label', { class: 'check' }, repair, ' repair what it finds'),
    field('Rate (MiB/s, empty: unlimited)', { name: 'rate_bytes_per_s', type: 'number', min: '1', step: 'any' }),
    h('button', { type: 'submit', 'data-testid': 'scrub-start' }, 'Start scrub'), stop, scrubError);
  const replaceSlot = select('Failed slot', { name: 'slot' }, []);
  const replaceForm = h('form', { class: 'inline-form', 'data-testid': 'replace-drive-form' },
    replaceSlot, ...driveFields(),
    h('button', { type: 'submit', 'data-testid': 'replace-drive' }, 'Replace'), errorLine('replace-drive-error'));
  const spareForm = h('form', { class: 'inline-form', 'data-testid': 'add-spare-form' },
    ...driveFields(),
    h('button', { type: 'submit', 'data-testid': 'add-spare' }, 'Add spare'), errorLine('add-spare-error'));
  const el = h('section', { class: 'card target-card', 'data-testid': 'target-card' },
    h('header', {}, title, state), figures,
    h('details', { class: 'controls' }, h('summary', {}, 'Rebuild rate and scrub'), rateForm, scrubForm),
    h('details', { class: 'controls', 'data-testid': 'drive-controls' },
      h('summary', {}, 'Replace a drive, add a spare'),
      h('p', { class: 'muted small' }, 'A replacement fills a failed slot and rebuilds in the background; a spare takes the place of the next drive that fails. The node records both in DATA/node.json.'),
      replaceForm, spareForm));
  let current = null;

  replaceForm.addEventListener('submit', (event) => {
    event.preventDefault();
    submit(replaceForm, ctx, () => {
      const slot = replaceSlot.querySelector('select').value;
      if (slot === '') throw refuse('slot', 'no slot is out: fail a drive first');
      return api('POST', `/targets/${current.id}/drives/${slot}/replace`, newDrive(replaceForm));
    }, (t) => {
      replaceForm.reset();
      return `Target ${t.id}: the new drive is in and rebuilds`;
    });
  });
  spareForm.addEventListener('submit', (event) => {
    event.preventDefault();
    submit(spareForm, ctx, () => api('POST', `/targets/${current.id}/spares`, newDrive(spareForm)), (t) => {
      spareForm.reset();
      return `Target ${t.id}: spare added`;
    });
  });

  rateForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const mib = Number(rateForm.elements.rate_bytes_per_s.value);
    submit(rateForm, ctx, () => {
      if (!(mib > 0)) throw refuse('rate_bytes_per_s', 'enter a rate in MiB/s');
      return api('POST', `/targets/${current.id}/rebuild-rate`, { rate_bytes_per_s: Math.round(mib * MIB) });
    }, (t) => `Target ${t.id}: rebuild rate limit ${f.rate(t.rebuild_rate_limit_bytes_per_s)}`);
  });
  scrubForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const raw = scrubForm.elements.rate_bytes_per_s.value;
    const body = { repair: repair.checked, rate_bytes_per_s: raw === '' ? null : Math.round(Number(raw) * MIB) };
    submit(scrubForm, ctx, () => api('POST', `/targets/${current.id}/scrub`, body),
      (t) => `Target ${t.id}: ${body.repair ? 'scrub' : 'check'} started`);
  });
  stop.addEventListener('click', () => {
    submit(scrubForm, ctx, () => api('DELETE', `/targets/${current.id}/scrub`), (t) => `Target ${t.id}: scrub stopped`);
  });

  return {
    el,
    update(t) {
      current = t;
      el.dataset.target = t.id;
      el.dataset.state = t.state;
      title.textContent = `Target ${t.id}`;
      state.replaceChildren(badge(t.state, 'target-state'));
      stop.disabled = t.scrub.state !== 'running';
      const out = t.drives.filter((d) => d.slot !== null && d.slot !== undefined && !['active', 'rebuilding'].includes(d.state));
      setOptions(replaceSlot.querySelector('select'), out.map((d) => [String(d.slot), `slot ${d.slot} (${d.state})`]));
      const space = t.space;
      figures.replaceChildren(...[
        h('div', { class: 'split' },
          geometry(t),
          h('div', {},
            h('h4', {}, 'Drives'), slotMap(t),
            h('h4', {}, 'Space'),
            bar(space.total_bytes ? space.used_bytes / space.total_bytes : 0, { 'data-testid': 'target-space' },
              `${f.bytes(space.used_bytes)} of ${f.bytes(space.total_bytes)}`),
            h('p', { class: 'muted small' }, `${f.count(space.chunks)} chunks · ${f.bytes(space.free_bytes)} free${space.reclaimable_bytes ? ` · ${f.bytes(space.reclaimable_bytes)} reclaimable after the next sync` : ''}`))),
        h('h4', {}, 'Rebuild'), rebuild(t),
        h('h4', {}, 'Scrub'), scrub(t),
        h('p', { class: 'muted small' },
          `Since start: ${f.count(t.checksum_errors)} checksum errors · ${f.count(t.repaired_blocks)} blocks repaired · ${f.count(t.unrecoverable_blocks)} unrecoverable · `,
          `chunk I/O ${f.bytes(t.io.read_bytes)} read in ${f.count(t.io.read_ops)} requests, ${f.bytes(t.io.written_bytes)} written in ${f.count(t.io.write_ops)} requests`),
        t.warnings.length ? h('ul', { class: 'warnings', 'data-testid': 'target-warnings' }, t.warnings.map((w) => h('li', {}, w))) : null,
      ].filter(Boolean));
    },
  };
}

function volumeRow(v, ctx, volumes) {
  const ratio = v.allocated_bytes === null ? 0 : v.allocated_bytes / v.size_bytes;
  return h('tr', { 'data-testid': 'volume-row', 'data-volume': v.name, 'data-state': v.state },
    h('td', {}, h('strong', {}, v.name),
      v.origin ? h('div', { class: 'muted small', 'data-testid': 'volume-origin' },
        `${v.snapshot ? 'read-only snapshot' : 'clone'} of ${v.origin}`) : null),
    h('td', { class: 'num', 'data-testid': 'volume-size' }, f.bytes(v.size_bytes)),
    h('td', {}, v.allocated_bytes === null ? h('span', { class: 'muted' }, 'unknown (a target did not answer)')
      : [bar(ratio, { class: 'mini' }), ` ${f.bytes(v.allocated_bytes)}`]),
    h('td', {}, v.pool), h('td', {}, v.targets.map((t) => `t${t}`).join(', ')),
    h('td', { class: 'num' }, f.bytes(v.chunk_bytes)),
    h('td', {}, v.exports.length ? v.exports.join(', ') : h('span', { class: 'muted' }, 'not exported')),
    h('td', {}, badge(v.state)),
    h('td', { class: 'muted small' }, f.when(v.created_unix_s * 1000)),
    h('td', { class: 'actions' },
      copyButton(v, ctx, 'snapshot'), copyButton(v, ctx, 'clone'),
      v.snapshot ? rollbackButton(v, ctx, volumes.find((o) => o.name === v.origin)) : null,
      h('button', { type: 'button', class: 'danger small', 'data-testid': 'volume-delete',
        onclick: () => {
          if (!window.confirm(`Delete volume ${v.name} and all its data?`)) return;
          act(ctx, () => api('DELETE', `/volumes/${encodeURIComponent(v.name)}`), () => `Volume ${v.name} deleted`);
        } }, 'Delete')));
}

// A snapshot (read-only) or clone (writable) of a volume: asks for the new volume's name, with
// a dated one offered. Neither copies data; the volume's writes pause for about a millisecond.
function copyButton(v, ctx, kind) {
  const title = kind === 'snapshot'
    ? `A read-only copy of ${v.name} as it is now (copy-on-write: no data copied)`
    : `A writable copy of ${v.name} as it is now (copy-on-write: no data copied)`;
  return h('button', { type: 'button', class: 'small', 'data-testid': `volume-${kind}`, title,
    disabled: v.state !== 'online',
    onclick: () => {
      const stamp = new Date().toISOString().slice(0, 16).replace(/[-:]/g, '').replace('T', '-');
      const name = window.prompt(`Name of the ${kind} of ${v.name}`, `${v.name}-${kind === 'snapshot' ? 'snap' : 'copy'}-${stamp}`);
      if (name === null || name.trim() === '') return;
      act(ctx, () => api('POST', `/volumes/${encodeURIComponent(v.name)}/${kind}`, { name: name.trim() }),
        (copy) => `${kind === 'snapshot' ? 'Snapshot' : 'Clone'} ${copy.name} of ${v.name} made`);
    } }, kind === 'snapshot' ? 'Snapshot' : 'Clone');
}

// On a snapshot's row: gives the volume it was taken of (`origin`, absent once deleted) this
// snapshot's data and size. The server refuses while an NBD client is connected to that
// volume, and says so.
function rollbackButton(v, ctx, origin) {
  if (!origin) return null;
  return h('button', { type: 'button', class: 'danger small', 'data-testid': 'volume-rollback',
    title: `Give ${v.origin} the data and size of this snapshot (what was written since is dropped)`,
    disabled: v.state !== 'online' || origin.state !== 'online',
    onclick: () => {
      if (!window.confirm(`Roll ${v.origin} back to ${v.name}? Everything written to ${v.origin} since the snapshot is lost.`)) return;
      act(ctx, () => api('POST', `/volumes/${encodeURIComponent(v.origin)}/rollback`, { snapshot: v.name }),
        () => `${v.origin} rolled back to ${v.name}`);
    } }, 'Roll back');
}

function exportRow(x, ctx) {
  const path = `/exports/${encodeURIComponent(x.name)}`;
  const rules = x.acl.length
    ? x.acl.map((r) => h('span', { class: 'chip', 'data-testid': 'acl-rule', 'data-net': r.net },
      r.net, r.tls_identity ? ` · TLS ${r.tls_identity}` : '',
      h('button', { type: 'button', class: 'chip-x', title: `Deny ${r.net}`, 'aria-label': `Deny ${r.net}`,
        onclick: () => act(ctx, () => api('DELETE', `${path}/initiators`, { net: r.net, tls_identity: r.tls_identity }),
          () => `${x.name}: ${r.net} removed from the access list`) }, '×')))
    : h('span', { class: 'bad small' }, 'nobody may connect');
  return h('tr', { 'data-testid': 'export-row', 'data-export': x.name },
    h('td', {}, h('strong', {}, x.name), x.description ? h('div', { class: 'muted small' }, x.description) : null),
    h('td', {}, x.volume), h('td', {}, x.read_only ? 'read-only' : 'read-write'),
    h('td', { class: 'acl' }, rules),
    h('td', { class: 'num', 'data-testid': 'export-connections' }, f.count(x.connections)),
    h('td', { class: ['num', x.refused ? 'bad' : null], 'data-testid': 'export-refused' }, f.count(x.refused)),
    h('td', {}, h('button', { type: 'button', class: 'danger small', 'data-testid': 'export-remove',
      onclick: () => {
        if (!window.confirm(`Stop serving export ${x.name}? Connected clients are cut off.`)) return;
        act(ctx, () => api('DELETE', path), () => `Export ${x.name} removed`);
      } }, 'Remove')));
}

export default {
  id: 'storage',
  title: 'Storage',
  mount(root, ctx) {
    const targetsEl = h('div', { class: 'target-cards' });
    const cards = new Map();
    const poolsEl = h('div', { class: 'table-wrap' });
    const volumesEl = h('div', { class: 'table-wrap' });
    const exportsEl = h('div', { class: 'table-wrap' });

    const volumeForm = h('form', { class: 'inline-form', 'data-testid': 'volume-create-form' },
      field('Name', { name: 'name', placeholder: 'vm1', spellcheck: 'false' }),
      field('Size', { name: 'size_bytes', type: 'number', min: '0', step: 'any', placeholder: '20' }),
      select('Unit', { name: 'unit' }, SIZE_UNITS),
      field('Pool', { name: 'pool', placeholder: 'default' }),
      h('button', { type: 'submit', class: 'primary' }, 'Create volume'), errorLine('volume-create-error'));
    volumeForm.elements.unit.value = SIZE_UNITS[1][0];
    volumeForm.addEventListener('submit', (event) => {
      event.preventDefault();
      const e = volumeForm.elements;
      submit(volumeForm, ctx, () => {
        if (e.size_bytes.value === '' || !(Number(e.size_bytes.value) > 0)) throw refuse('size_bytes', 'enter a size');
        const body = { name: e.name.value.trim(), size_bytes: Math.round(Number(e.size_bytes.value) * Number(e.unit.value)) };
        if (e.pool.value.trim()) body.pool = e.pool.value.trim();
        return api('POST', '/volumes', body);
      }, (v) => {
        volumeForm.reset();
        e.unit.value = SIZE_UNITS[1][0];
        return `Volume ${v.name} created: ${f.bytes(v.size_bytes)} in pool ${v.pool}`;
      });
    });

    const exportVolume = select('Volume', { name: 'volume' }, []);
    const exportForm = h('form', { class: 'inline-form', 'data-testid': 'export-add-form' },
      exportVolume, field('Export name', { name: 'name', placeholder: 'the volume\'s name' }),
      h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'read_only' }), ' read-only'),
      field('Description', { name: 'description', placeholder: 'optional' }),
      h('button', { type: 'submit', class: 'primary' }, 'Add export'), errorLine('export-add-error'));
    exportForm.addEventListener('submit', (event) => {
      event.preventDefault();
      const e = exportForm.elements;
      const body = { volume: e.volume.value, read_only: e.read_only.checked, description: e.description.value };
      if (e.name.value.trim()) body.name = e.name.value.trim();
      submit(exportForm, ctx, () => {
        if (!body.volume) throw refuse('volume', 'create a volume first');
        return api('POST', '/exports', body);
      }, (x) => {
        exportForm.reset();
        return `Export ${x.name} added; nobody may connect until an initiator is allowed`;
      });
    });

    const aclExport = select('Export', { name: 'export' }, []);
    const aclForm = h('form', { class: 'inline-form', 'data-testid': 'acl-form' },
      aclExport, field('Address or CIDR', { name: 'net', placeholder: '10.0.0.0/24', spellcheck: 'false' }),
      field('TLS identity', { name: 'tls_identity', placeholder: 'optional' }),
      h('button', { type: 'submit', class: 'primary', value: 'allow', 'data-testid': 'acl-allow' }, 'Allow'),
      h('button', { type: 'submit', value: 'deny', 'data-testid': 'acl-deny' }, 'Deny'), errorLine('acl-error'));
    aclForm.addEventListener('submit', (event) => {
      event.preventDefault();
      const deny = event.submitter && event.submitter.value === 'deny';
      const e = aclForm.elements;
      const name = e.export.value;
      const body = { net: e.net.value.trim() };
      if (e.tls_identity.value.trim()) body.tls_identity = e.tls_identity.value.trim();
      submit(aclForm, ctx, () => {
        if (!name) throw refuse('export', 'add an export first');
        return api(deny ? 'DELETE' : 'POST', `/exports/${encodeURIComponent(name)}/initiators`, body);
      }, (x) => `${x.name}: ${body.net} ${deny ? 'removed from' : 'allowed on'} the access list (${x.acl.length} rule${x.acl.length === 1 ? '' : 's'})`);
    });

    root.append(
      section('Targets', { 'data-testid': 'targets' }, targetsEl),
      section('Pools', {}, poolsEl),
      section('Volumes', { 'data-testid': 'volumes' }, volumesEl, h('h3', {}, 'Create a volume (thin: space is taken on first write)'), volumeForm),
      section('Exports and access lists', { 'data-testid': 'exports' }, exportsEl,
        h('div', { class: 'split' },
          h('div', {}, h('h3', {}, 'Serve a volume over NBD'), exportForm),
          h('div', {}, h('h3', {}, 'Allow or deny an initiator'), aclForm))));

    return {
      intervalMs: 3000,
      async refresh() {
        const [targets, pools, volumes, exports] = await Promise.all([get('/targets'), get('/pools'), get('/volumes'), get('/exports')]);
        const seen = new Set();
        for (const t of targets) {
          seen.add(t.id);
          if (!cards.has(t.id)) cards.set(t.id, targetCard(ctx));
          cards.get(t.id).update(t);
        }
        for (const id of [...cards.keys()]) if (!seen.has(id)) cards.delete(id);
        targetsEl.replaceChildren(...targets.map((t) => cards.get(t.id).el));
        if (!targets.length) targetsEl.append(h('p', { class: 'muted' }, 'This node has no targets.'));

        poolsEl.replaceChildren(table(['Pool', 'Targets', 'State', 'Used', 'Capacity', 'Volumes', 'Provisioned'],
          pools.map((p) => [h('strong', {}, p.name), p.targets.map((t) => `t${t}`).join(', '), badge(p.state),
            [bar(p.capacity_bytes ? p.used_bytes / p.capacity_bytes : 0, { class: 'mini' }), ` ${f.bytes(p.used_bytes)}`],
            f.bytes(p.capacity_bytes), f.count(p.volumes),
            [f.bytes(p.provisioned_bytes), p.provisioned_bytes > p.capacity_bytes ? h('span', { class: 'warning-text' }, ' (thin: over capacity)') : '']]),
          { 'data-testid': 'pools-table' }));

        volumesEl.replaceChildren(table(['Name', 'Size', 'Allocated', 'Pool', 'Targets', 'Chunk', 'Exports', 'State', 'Created', ''],
          volumes.map((v) => volumeRow(v, ctx, volumes)), { 'data-testid': 'volumes-table' }, 'No volumes yet: create one below or with stria volume create.'));
        exportsEl.replaceChildren(table(['Export', 'Volume', 'Access', 'Initiators allowed', 'Connections', 'Refused', ''],
          exports.map((x) => exportRow(x, ctx)), { 'data-testid': 'exports-table' }, 'No exports: serve a volume below or with stria export add.'));

        setOptions(exportVolume.querySelector('select'), volumes.map((v) => [v.name, v.name]));
        setOptions(aclExport.querySelector('select'), exports.map((x) => [x.name, x.name]));
      },
    };
  },
};
