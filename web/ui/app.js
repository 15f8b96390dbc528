// The dashboard's shell: the token (from the URL fragment `#token=...`, the form, or this
// browser's local storage), the page tabs (hash routes `#page=drives&drive=...`), and the refresh
// loop of the page on screen. Pages live in ./pages/; each one mounts into <main> and returns
// `{ intervalMs, refresh }`; this file calls `refresh` at once and then every `intervalMs`.

import { get, getToken, setToken, clearToken } from './api.js';
import { h, badge } from './dom.js';
import { duration } from './format.js';
import overview from './pages/overview.js';
import drives from './pages/drives.js';
import storage from './pages/storage.js';
import performance from './pages/performance.js';
import analytics from './pages/analytics.js';
import events from './pages/events.js';

const PAGES = [overview, drives, storage, performance, analytics, events];
const HEADER_INTERVAL_MS = 5000;

const body = document.body;
const main = document.getElementById('page');
let generation = 0; // bumped to cancel the loops of a page that is no longer shown
let headerTimer = null;

function hashParams() {
  return new URLSearchParams(location.hash.replace(/^#/, ''));
}

/** Moves a token from the fragment into storage and out of the address bar and history. */
function takeTokenFromHash() {
  const params = hashParams();
  if (!params.has('token')) return;
  const token = params.get('token').trim();
  params.delete('token');
  if (token) setToken(token);
  history.replaceState(null, '', `${location.pathname}${location.search}#${params.toString()}`);
}

function navigate(updates, replace = false) {
  const params = hashParams();
  for (const [key, value] of Object.entries(updates)) {
    if (value === null || value === undefined || value === '') params.delete(key);
    else params.set(key, value);
  }
  const hash = `#${params.toString()}`;
  if (replace) {
    history.replaceState(null, '', hash);
    route();
  } else {
    location.hash = hash;
  }
}

export function toast(message, kind = 'info') {
  const el = h('div', { class: `toast ${kind}`, 'data-testid': `toast-${kind}`, role: kind === 'error' ? 'alert' : 'status' }, message);
  el.addEventListener('click', () => el.remove());
  document.getElementById('toasts').append(el);
  setTimeout(() => el.remove(), kind === 'error' ? 12000 : 5000);
}

function buildNav(active) {
  const nav = document.getElementById('nav');
  nav.replaceChildren(...PAGES.map((p) => h('a', {
    href: `#page=${p.id}`, 'data-testid': `nav-${p.id}`, class: p.id === active ? 'active' : null,
    'aria-current': p.id === active ? 'page' : null,
  }, p.title)));
}

function showLogin(message) {
  generation += 1;
  clearTimeout(headerTimer);
  body.dataset.view = 'login';
  body.dataset.state = 'login';
  document.getElementById('login').hidden = false;
  document.getElementById('login-message').textContent = message || '';
  main.replaceChildren();
  document.getElementById('node-summary').replaceChildren();
  document.getElementById('token-input').focus();
}

async function refreshHeader() {
  const mine = generation;
  try {
    const cluster = await get('/cluster');
    if (mine !== generation) return;
    const node = cluster.nodes[0] || {};
    document.getElementById('node-summary').replaceChildren(
      h('span', { class: 'host', title: `node ${node.id || ''}` }, node.hostname || 'node'),
      h('span', { class: 'muted' }, ` v${cluster.version} · up ${duration(node.uptime_s || 0)} `),
      badge(cluster.state, 'header-state'));
  } catch (e) {
    if (mine !== generation) return;
    document.getElementById('node-summary').replaceChildren(h('span', { class: 'form-error' }, e.message));
  }
  if (mine === generation) headerTimer = setTimeout(refreshHeader, HEADER_INTERVAL_MS);
}

function route() {
  takeTokenFromHash();
  if (!getToken()) {
    showLogin('');
    return;
  }
  generation += 1;
  const mine = generation;
  clearTimeout(headerTimer);
  document.getElementById('login').hidden = true;
  body.dataset.view = 'app';
  body.dataset.state = 'loading';
  const params = hashParams();
  const page = PAGES.find((p) => p.id === params.get('page')) || PAGES[0];
  body.dataset.page = page.id;
  document.title = `${page.title} · Stria`;
  buildNav(page.id);
  refreshHeader();

  const status = h('span', { class: 'page-status', 'data-testid': 'page-status' }, 'loading…');
  const content = h('div', { class: 'page-content', 'data-testid': `page-${page.id}` });
  main.replaceChildren(h('div', { class: 'page-head' }, h('h1', {}, page.title), status), content);
  let timer = null;
  let latest = 0; // only the newest tick schedules the next, so refreshNow never doubles the loop
  const ctx = {
    params,
    navigate,
    toast,
    /** Refreshes the page now (after an action), then on its usual rhythm. */
    refreshNow: () => {
      clearTimeout(timer);
      tick();
    },
  };
  const handle = page.mount(content, ctx);

  async function tick() {
    if (mine !== generation) return;
    latest += 1;
    const me = latest;
    try {
      await handle.refresh();
      if (mine !== generation || me !== latest) return;
      body.dataset.state = 'ready';
      status.classList.remove('failed');
      status.textContent = `updated ${new Date().toLocaleTimeString('en-GB')} · every ${handle.intervalMs / 1000} s`;
    } catch (e) {
      if (mine !== generation || me !== latest) return;
      if (e.status === 401 || e.status === 429) return; // the login form is showing
      console.error(e);
      body.dataset.state = 'error';
      status.classList.add('failed');
      status.textContent = `update failed: ${e.describe ? e.describe() : e.message}`;
    }
    if (mine === generation && me === latest) {
      clearTimeout(timer);
      timer = setTimeout(tick, handle.intervalMs);
    }
  }
  tick();
}

window.addEventListener('stria:unauthorized', (event) => {
  const error = event.detail;
  if (error.status === 401) {
    clearToken();
    showLogin(`The node refused the token (401 ${error.code}): ${error.message}. Paste the token from DATA/mgmt/api-token.`);
  } else {
    showLogin(`Too many failed attempts from this address (429): ${error.message}`);
  }
});

document.getElementById('login-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const input = document.getElementById('token-input');
  const token = input.value.trim();
  if (!token) return;
  setToken(token);
  try {
    await get('/cluster');
    input.value = '';
    route();
  } catch (e) {
    if (e.status !== 401 && e.status !== 429) {
      document.getElementById('login-message').textContent = e.describe();
    }
  }
});

document.getElementById('sign-out').addEventListener('click', () => {
  clearToken();
  showLogin('Signed out: the token was removed from this browser.');
});

window.addEventListener('hashchange', route);
route();
