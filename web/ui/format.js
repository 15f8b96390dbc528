// Numbers for people: binary byte units (what `stria df` prints), rates, latencies, times.

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

function trim(value, digits) {
  if (value === 0) return '0';
  if (value >= 100 || digits === 0) return value.toFixed(0);
  if (value >= 10) return value.toFixed(Math.min(digits, 1));
  return value.toFixed(digits);
}

export function bytes(n) {
  if (n === null || n === undefined) return '—';
  let i = 0;
  let v = Number(n);
  while (Math.abs(v) >= 1024 && i < BYTE_UNITS.length - 1) { v /= 1024; i += 1; }
  return `${trim(v, i === 0 ? 0 : 2)} ${BYTE_UNITS[i]}`;
}

export function rate(n) {
  return n === null || n === undefined ? '—' : `${bytes(n)}/s`;
}

export function ops(n) {
  if (n === null || n === undefined) return '—';
  if (n >= 1e6) return `${trim(n / 1e6, 2)} M/s`;
  if (n >= 1e3) return `${trim(n / 1e3, 2)} k/s`;
  return `${trim(n, 1)} /s`;
}

export function latency(us) {
  if (us === null || us === undefined) return '—';
  if (us >= 1e6) return `${trim(us / 1e6, 2)} s`;
  if (us >= 1e3) return `${trim(us / 1e3, 2)} ms`;
  return `${trim(us, 1)} µs`;
}

export function count(n) {
  return n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US');
}

export function percent(ratio, digits = 1) {
  return `${(ratio * 100).toFixed(digits)} %`;
}

export function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  if (d > 0) return `${d} d ${hh} h`;
  if (hh > 0) return `${hh} h ${mm} min`;
  if (mm > 0) return `${mm} min ${s % 60} s`;
  return `${s} s`;
}

function pad(n) {
  return String(n).padStart(2, '0');
}

export function clock(unixMs) {
  const d = new Date(unixMs);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Local date and time, the date left out for today. */
export function when(unixMs) {
  if (!unixMs) return '—';
  const d = new Date(unixMs);
  const today = new Date();
  const date = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  return d.toDateString() === today.toDateString() ? clock(unixMs) : `${date} ${clock(unixMs)}`;
}

/**
 * How to label an axis whose largest value is `max`: the divisor and suffix of the unit that
 * keeps tick labels short. `kind` is 'bytes' (per second), 'ops' or 'us'.
 */
export function axisUnit(kind, max) {
  if (kind === 'bytes') {
    let i = 0;
    let div = 1;
    while (max / div >= 1024 && i < BYTE_UNITS.length - 1) { div *= 1024; i += 1; }
    return { div, suffix: `${BYTE_UNITS[i]}/s` };
  }
  if (kind === 'ops') {
    if (max >= 1e6) return { div: 1e6, suffix: 'M ops/s' };
    if (max >= 1e3) return { div: 1e3, suffix: 'k ops/s' };
    return { div: 1, suffix: 'ops/s' };
  }
  if (max >= 1e6) return { div: 1e6, suffix: 's' };
  if (max >= 1e3) return { div: 1e3, suffix: 'ms' };
  return { div: 1, suffix: 'µs' };
}

export const formatters = { bytes: rate, ops, us: latency };
