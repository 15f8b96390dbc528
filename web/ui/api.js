// The one way the dashboard talks to the node: `/api/v1` with the bearer token. Errors carry
// the API's `{"error": {"code", "message", "field"}}` so forms can name the field at fault.

const TOKEN_KEY = 'stria.api-token';
let memoryToken = null; // when localStorage is unavailable (storage disabled)

export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field || null;
  }

  /** "size_bytes: a size must be a multiple of 512" */
  describe() {
    return this.field ? `${this.field}: ${this.message}` : this.message;
  }
}

export function getToken() {
  try {
    return localStorage.getItem(TOKEN_KEY) || memoryToken;
  } catch {
    return memoryToken;
  }
}

export function setToken(token) {
  memoryToken = token;
  try {
    localStorage.setItem(TOKEN_KEY, token);
  } catch {
    // Kept in memory only: the form will ask again after a reload.
  }
}

export function clearToken() {
  memoryToken = null;
  try {
    localStorage.removeItem(TOKEN_KEY);
  } catch {
    // nothing stored
  }
}

/** Fetches `/api/v1{path}`; resolves to the JSON body, or throws an ApiError. */
export async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`/api/v1${path}`, init);
  } catch (e) {
    throw new ApiError(0, 'unreachable', `cannot reach the node (${e.message}); is stria up running?`);
  }
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!response.ok) {
    const detail = (json && json.error) || {};
    const error = new ApiError(response.status, detail.code || `http_${response.status}`,
      detail.message || `${response.status} ${response.statusText}`, detail.field);
    if (response.status === 429) {
      const wait = response.headers.get('Retry-After');
      if (wait) error.message += ` (retry in ${wait} s)`;
    }
    if (response.status === 401 || response.status === 429) {
      window.dispatchEvent(new CustomEvent('stria:unauthorized', { detail: error }));
    }
    throw error;
  }
  return json;
}

export const get = (path) => api('GET', path);
