// Building DOM nodes without innerHTML: every string becomes a text node, so names that come
// from the API (volumes, exports, descriptions) can never inject markup.

const SVG_NS = 'http://www.w3.org/2000/svg';

function apply(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.setAttribute('class', Array.isArray(value) ? value.filter(Boolean).join(' ') : value);
    else if (key === 'style') Object.assign(el.style, value); // CSSOM, allowed by the CSP
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'value' && 'value' in el) el.value = value;
    else if (key === 'checked' || key === 'selected' || key === 'disabled') el[key] = Boolean(value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** `h('td', {class: 'num', 'data-testid': 'x'}, 'text', child)` */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

/** The same for SVG elements. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, attrs);
  append(el, children);
  return el;
}

/** A state word as a coloured badge; `data-state` carries the raw value for tests and CSS. */
export function badge(state, testid) {
  return h('span', { class: `badge state-${state}`, 'data-state': state, 'data-testid': testid }, state);
}

/** A horizontal bar: `ratio` 0..1 filled. */
export function bar(ratio, attrs = {}, label) {
  const pct = Math.max(0, Math.min(1, Number.isFinite(ratio) ? ratio : 0)) * 100;
  return h('div', { ...attrs, class: ['bar', attrs.class], role: 'progressbar',
    'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': pct.toFixed(1) },
  h('div', { class: 'bar-fill', style: { width: `${pct}%` } }),
  label ? h('span', { class: 'bar-label' }, label) : null);
}

/** A `<dl>` of label/value pairs. */
export function facts(pairs, attrs = {}) {
  return h('dl', { class: 'facts', ...attrs },
    pairs.filter(Boolean).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
}

/** A section with a heading. */
export function section(title, attrs, ...children) {
  return h('section', { ...attrs, class: ['panel', attrs && attrs.class] }, h('h2', {}, title), ...children);
}

/** A table; `rows` are arrays of cells (nodes or text) or ready `<tr>`s. */
export function table(headers, rows, attrs = {}, empty = 'nothing yet') {
  const body = rows.length
    ? rows
    : [h('tr', { class: 'empty' }, h('td', { colspan: headers.length }, empty))];
  return h('table', { class: 'grid', ...attrs },
    h('thead', {}, h('tr', {}, headers.map((x) => h('th', {}, x)))),
    h('tbody', {}, body.map((r) => (r instanceof Node ? r : h('tr', {}, r.map((c) => h('td', {}, c)))))));
}
