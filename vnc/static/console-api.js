// The API as the console's pages call it: the key as a bearer header on every call, and
// every failure turned into an ApiError carrying the server's own message (the error body
// of docs/API.md: {"error": {"type", "message", "request_id"}}). No DOM here, so that
// node's test runner can drive it (vnc/test/console.test.js).

// The key lives in the tab's sessionStorage: gone when the tab closes, never in a URL.
export const KEY_ITEM = 'deskbox.api_key';

export function keyStore(storage) {
  return {
    get: () => storage.getItem(KEY_ITEM) || '',
    set: (key) => storage.setItem(KEY_ITEM, key),
    clear: () => storage.removeItem(KEY_ITEM),
  };
}

export class ApiError extends Error {
  constructor(status, type, message, requestId = null) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.type = type;
    this.requestId = requestId;
  }
}

// The server's message when the body is the API's error body, else the HTTP status (a
// proxy in front of the server, say, answers with its own page).
export async function errorFrom(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON
  }
  const error = body && typeof body === 'object' ? body.error : null;
  if (error && typeof error.message === 'string') {
    return new ApiError(response.status, String(error.type || 'error'), error.message,
      typeof error.request_id === 'string' ? error.request_id : null);
  }
  const text = `${response.status} ${response.statusText || ''}`.trim();
  return new ApiError(response.status, 'http', `the server answered ${text}`);
}

export class Api {
  constructor({ key, fetch }) {
    this.key = key;
    this.fetch = fetch;
  }

  // The response when it is a 2xx; an ApiError otherwise (status 0: no answer at all).
  async call(method, path, body) {
    const headers = { Authorization: `Bearer ${this.key}` };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await this.fetch(path, init);
    } catch {
      throw new ApiError(0, 'network', 'the server did not answer');
    }
    if (!response.ok) throw await errorFrom(response);
    return response;
  }

  async json(method, path, body) {
    const response = await this.call(method, path, body);
    if (response.status === 204) return null;
    return response.json();
  }

  async text(path) {
    return (await this.call('GET', path)).text();
  }

  async blob(path) {
    return (await this.call('GET', path)).blob();
  }
}

// What a person reads of a failure: the server's sentence, and the request id to quote.
export function describeError(error) {
  if (error instanceof ApiError) {
    return error.requestId ? `${error.message} (${error.requestId})` : error.message;
  }
  return String(error && error.message ? error.message : error);
}

export const sessionPath = (id) => `/v1/sessions/${encodeURIComponent(id)}`;
