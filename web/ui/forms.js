// Forms that call the API: the submit button is disabled while the request runs; a refusal
// shows the API's own message with the field it names, and marks that input.

import { ApiError } from './api.js';
import { h } from './dom.js';

/** A labelled input; `field` is the API's name for it, so an error naming it marks this input. */
export function field(label, attrs, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label),
    h('input', { 'data-field': attrs.name, ...attrs }),
    hint ? h('small', { class: 'hint' }, hint) : null);
}

export function select(label, attrs, options) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label),
    h('select', { 'data-field': attrs.name, ...attrs }, options.map(([value, text]) => h('option', { value }, text))));
}

/** Replaces a select's options and keeps the chosen value if it is still offered. */
export function setOptions(selectEl, options) {
  const chosen = selectEl.value;
  selectEl.replaceChildren(...options.map(([value, text]) => h('option', { value }, text)));
  if (options.some(([value]) => value === chosen)) selectEl.value = chosen;
}

/** A client-side refusal shaped like the API's, so both show the same way. */
export function refuse(fieldName, message) {
  return new ApiError(400, 'invalid', message, fieldName);
}

/**
 * Runs `action` for `form`: shows `done(result)` as a toast on success and refreshes the page,
 * or shows the error in the form's `.form-error` and marks the input whose `data-field` the
 * API named.
 */
export async function submit(form, ctx, action, done) {
  const error = form.querySelector('.form-error');
  const buttons = [...form.querySelectorAll('button')];
  for (const input of form.querySelectorAll('[aria-invalid]')) input.removeAttribute('aria-invalid');
  error.textContent = '';
  buttons.forEach((b) => { b.disabled = true; });
  try {
    const result = await action();
    ctx.toast(done(result), 'ok');
    ctx.refreshNow();
    return result;
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    if (e.status === 401 || e.status === 429) return null; // the login form takes over
    error.textContent = `${e.describe()} (${e.status ? `${e.status} ` : ''}${e.code})`;
    error.dataset.field = e.field || '';
    error.dataset.code = e.code;
    const input = e.field && form.querySelector(`[data-field="${CSS.escape(e.field)}"]`);
    if (input) {
      input.setAttribute('aria-invalid', 'true');
      input.focus();
    }
    ctx.toast(`Refused: ${e.describe()}`, 'error');
    return null;
  } finally {
    buttons.forEach((b) => { b.disabled = false; });
  }
}

/** The error line every action form carries. */
export function errorLine(testid) {
  return h('p', { class: 'form-error', role: 'alert', 'data-testid': testid });
}

/** Runs a one-click action (delete, deny) that has no form: errors go to a toast. */
export async function act(ctx, action, done) {
  try {
    const result = await action();
    ctx.toast(done(result), 'ok');
    ctx.refreshNow();
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    if (e.status === 401 || e.status === 429) return;
    ctx.toast(`Refused: ${e.describe()} (${e.status} ${e.code})`, 'error');
  }
}
