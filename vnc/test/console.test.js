// The console's logic without a browser: the API client (static/console-api.js) against a
// stand-in fetch, and the rules of static/console-model.js. The browser test
// (tests/api/test_console.py) runs the real pages against a real server.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Api, ApiError, describeError, errorFrom, keyStore } from '../static/console-api.js';
import {
  actionsFor, age, arrange, bytes, duration, thumbnailDue, thumbnailScale,
} from '../static/console-model.js';

function respond(status, body, { statusText = '', json = true } = {}) {
  return {
    ok: status >= 200 && status < 300, status, statusText,
    json: async () => {
      if (!json) throw new SyntaxError('not JSON');
      return body;
    },
    text: async () => JSON.stringify(body),
    blob: async () => body,
  };
}

test('every call carries the key as a bearer header, and JSON bodies', async () => {
  const calls = [];
  const api = new Api({ key: 'k1', fetch: async (path, init) => { calls.push([path, init]); return respond(201, { id: 'ses_1' }); } });
  assert.deepEqual(await api.json('POST', '/v1/sessions', { record: true }), { id: 'ses_1' });
  const [path, init] = calls[0];
  assert.equal(path, '/v1/sessions');
  assert.equal(init.method, 'POST');
  assert.equal(init.headers.Authorization, 'Bearer k1');
  assert.equal(init.headers['Content-Type'], 'application/json');
  assert.equal(init.body, '{"record":true}');
  await api.json('GET', '/v1/sessions');
  assert.equal(calls[1][1].body, undefined);
  assert.equal(calls[1][1].headers['Content-Type'], undefined);
});

test('a 204 answers null', async () => {
  const api = new Api({ key: 'k', fetch: async () => respond(204, null, { json: false }) });
  assert.equal(await api.json('DELETE', '/v1/sessions/ses_1'), null);
});

test("the server's error body becomes the error's message", async () => {
  const body = { error: { type: 'unauthorized', message: 'unknown API key', request_id: 'req_1' } };
  const api = new Api({ key: 'bad', fetch: async () => respond(401, body) });
  await assert.rejects(api.json('GET', '/v1/sessions'), (error) => {
    assert.ok(error instanceof ApiError);
    assert.equal(error.status, 401);
    assert.equal(error.type, 'unauthorized');
    assert.equal(error.message, 'unknown API key');
    assert.equal(describeError(error), 'unknown API key (req_1)');
    return true;
  });
});

test('an answer without the error body, and no answer at all', async () => {
  const error = await errorFrom(respond(502, null, { statusText: 'Bad Gateway', json: false }));
  assert.equal(error.message, 'the server answered 502 Bad Gateway');
  const down = new Api({ key: 'k', fetch: async () => { throw new TypeError('Failed to fetch'); } });
  await assert.rejects(down.blob('/x'), { status: 0, message: 'the server did not answer' });
});

test('the key store keeps one item', () => {
  const items = new Map();
  const storage = {
    getItem: (k) => (items.has(k) ? items.get(k) : null), setItem: (k, v) => items.set(k, v),
    removeItem: (k) => items.delete(k),
  };
  const keys = keyStore(storage);
  assert.equal(keys.get(), '');
  keys.set('abc');
  assert.equal(keys.get(), 'abc');
  keys.clear();
  assert.equal(items.size, 0);
});

test('sessions that need help come first, then the newest; ended ones apart', () => {
  const sessions = [
    { id: 'old', state: 'running', created_at: '2026-12-01T10:00:00Z' },
    { id: 'new', state: 'paused', created_at: '2026-12-01T12:00:00Z' },
    { id: 'help-late', state: 'running', created_at: '2026-12-01T09:00:00Z' },
    { id: 'help-early', state: 'running', created_at: '2026-12-01T11:00:00Z' },
    { id: 'gone', state: 'stopped', created_at: '2026-12-01T13:00:00Z' },
    { id: 'broken', state: 'failed', created_at: '2026-12-01T08:00:00Z' },
  ];
  const help = new Map([
    ['help-late', { needs_help: true, requested_at: '2026-12-01T12:30:00Z' }],
    ['help-early', { needs_help: true, requested_at: '2026-12-01T12:10:00Z' }],
    ['old', { needs_help: false }],
  ]);
  const { live, ended } = arrange(sessions, help);
  assert.deepEqual(live.map((s) => s.id), ['help-early', 'help-late', 'new', 'old']);
  assert.deepEqual(ended.map((s) => s.id), ['gone', 'broken']);
  assert.deepEqual(arrange(sessions).live.map((s) => s.id), ['new', 'help-early', 'old', 'help-late']);
});

test('buttons by state', () => {
  assert.deepEqual(actionsFor('running'), ['view', 'control', 'pause', 'hibernate', 'delete']);
  assert.deepEqual(actionsFor('paused'), ['view', 'resume', 'delete']);
  assert.deepEqual(actionsFor('hibernated'), ['resume', 'delete']);
  assert.deepEqual(actionsFor('stopped'), []);
});

test('thumbnails: every poll while running, once per pause', () => {
  assert.equal(thumbnailDue('running', 'running'), true);
  assert.equal(thumbnailDue('paused', 'running'), true);
  assert.equal(thumbnailDue('paused', 'paused'), false);
  assert.equal(thumbnailDue('hibernated', 'paused'), true);
  assert.equal(thumbnailDue('starting', null), false);
  assert.equal(thumbnailScale({ width: 1280, height: 800 }), '320x200');
  assert.equal(thumbnailScale({ width: 1920, height: 1080 }), '320x180');
  assert.equal(thumbnailScale(undefined), '320x200');
});

test('ages and sizes read as a person says them', () => {
  assert.equal(duration(42.9), '42 s');
  assert.equal(duration(125), '2 min');
  assert.equal(duration(3 * 3600 + 5 * 60), '3 h 5 min');
  assert.equal(duration(3 * 86400), '3 d');
  assert.equal(age('2026-12-01T10:00:00Z', Date.parse('2026-12-01T10:01:30Z')), '1 min');
  assert.equal(bytes(512), '512 B');
  assert.equal(bytes(1536), '1.5 KB');
  assert.equal(bytes(25 * 1024 * 1024), '25 MB');
});
