// The live view's logic (static/live.js) under node's test runner: the page's seams (its
// elements, noVNC's RFB class, fetch, setTimeout) are stand-ins; the browser tests
// (tests/api/test_vnc.py, tests/api/test_container_vnc.py) run the real page with noVNC.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { test } from 'node:test';

import {
  LiveView, POLL_CONNECTED_MS, POLL_WAITING_MS, RETRY_MAX_MS, asLatin1, endpoints, retryDelay,
  takeToken,
} from '../static/live.js';

const VNC = new URL('..', import.meta.url);

class Element {
  constructor() {
    Object.assign(this, { textContent: '', className: '', hidden: false, value: '' });
    this.listeners = {};
  }

  addEventListener(type, listener) {
    (this.listeners[type] ??= []).push(listener);
  }

  dispatch(type, detail) {
    for (const listener of this.listeners[type] ?? []) listener({ detail });
  }
}

// The browser's WebSocket as far as the page uses it: the page opens it and hands it to RFB.
class WebSocket extends Element {
  constructor(url, protocols) {
    super();
    Object.assign(this, { url, protocols, closed: false });
  }

  close() { this.closed = true; }

  // The close as the browser delivers it (before noVNC, which listens after the page).
  closeEvent(code, reason) {
    for (const listener of this.listeners.close ?? []) listener({ code, reason });
  }
}

// noVNC's RFB as far as the page uses it; every instance is kept to be driven by the test.
function fakeRFB() {
  const made = [];
  class RFB extends Element {
    constructor(target, socket, options) {
      super();
      Object.assign(this, { target, socket, options, pasted: [], disconnected: false });
      made.push(this);
    }

    clipboardPasteFrom(text) { this.pasted.push(text); }

    disconnect() {
      if (this.disconnected) return;
      this.disconnected = true;
      this.dispatch('disconnect', { clean: true });
    }

    // The server closed the socket (code, reason) or refused it (1006, no reason); noVNC
    // tells only whether the end was clean.
    closedByServer(code, reason = '', clean = false) {
      this.socket.closeEvent(code, reason);
      this.dispatch('disconnect', { clean });
    }
  }
  return { RFB, made };
}

function response(status, body) {
  return { status, ok: status >= 200 && status < 300, json: async () => body };
}

// A view whose status poll and other calls answer from `answers` (a response, or an Error
// to throw), its reads of the session's clipboard from `clipboard` (the session's
// clipboard is empty when it runs out); those reads are kept in `asked`. Its clock is
// `clock.now` (ms), its sessionStorage `storage`.
function harness(answers, clipboard = [], storage = new Map()) {
  const ui = Object.fromEntries(
    ['screen', 'state', 'scope', 'clip', 'clipToggle', 'clipText', 'clipSend', 'clipType',
      'clipStatus',
      'help', 'take', 'handBack']
      .map((name) => [name, new Element()]),
  );
  ui.clip.hidden = true;
  const { RFB, made } = fakeRFB();
  const fetched = [];
  const asked = [];
  const timers = [];
  const fetch = async (url, options) => {
    const read = url.includes('/view/clipboard') && !options.method;
    (read ? asked : fetched).push({ url, options });
    const answer = read ? clipboard.shift() ?? response(200, { text: '' })
      : answers.shift() ?? new Error('a poll the test did not expect');
    if (answer instanceof Error) throw answer;
    return answer;
  };
  const urls = endpoints({
    protocol: 'http:', host: '127.0.0.1:8765', pathname: '/v1/sessions/ses_1/view',
  }, 'tok');
  const clock = { now: 0 };
  const view = new LiveView({
    ui, RFB, WebSocket, urls, fetch, setTimeout: (fn, ms) => timers.push({ fn, ms }),
    now: () => clock.now, storage: mapStorage(storage),
  });
  return { view, ui, made, fetched, asked, timers, clock, storage };
}

function mapStorage(items) {
  return {
    getItem: (key) => (items.has(key) ? items.get(key) : null),
    setItem: (key, value) => items.set(key, String(value)),
    removeItem: (key) => items.delete(key),
  };
}

const running = (scope) => response(200, { session_id: 'ses_1', state: 'running', scope });

test('the token goes from the page URL to the status poll, the control, clipboard and type routes and the websocket only', () => {
  const urls = endpoints({
    protocol: 'https:', host: 'desk.example:8443', pathname: '/v1/sessions/ses_9/view/',
  }, 'a b/c=');
  assert.deepEqual(urls, {
    status: '/v1/sessions/ses_9/view/status?token=a%20b%2Fc%3D',
    clipboard: '/v1/sessions/ses_9/view/clipboard?token=a%20b%2Fc%3D',
    type: '/v1/sessions/ses_9/view/type?token=a%20b%2Fc%3D',
    control: '/v1/sessions/ses_9/control?token=a%20b%2Fc%3D',
    vnc: 'wss://desk.example:8443/v1/sessions/ses_9/vnc?token=a%20b%2Fc%3D',
  });
  const bare = endpoints({ protocol: 'http:', host: 'h', pathname: '/v1/sessions/s/view' }, '');
  assert.equal(bare.vnc, 'ws://h/v1/sessions/s/vnc?token=');
});

function pageAt(search, hash = '') {
  const location = { pathname: '/v1/sessions/ses_9/view', search, hash };
  const history = {
    state: null, replaced: [],
    replaceState(state, title, url) { this.replaced.push(url); },
  };
  return { location, history };
}

test('the token leaves the address bar for the tab\'s storage, and a reload finds it there', () => {
  const items = new Map();
  const { location, history } = pageAt('?token=a+b%2Fc&other=1', '#x');
  assert.equal(takeToken(location, history, mapStorage(items)), 'a b/c');
  assert.deepEqual(history.replaced, ['/v1/sessions/ses_9/view?other=1#x']);
  assert.deepEqual([...items], [['deskbox.token:/v1/sessions/ses_9/view', 'a b/c']]);
  const reloaded = pageAt('');
  assert.equal(takeToken(reloaded.location, reloaded.history, mapStorage(items)), 'a b/c');
  assert.deepEqual(reloaded.history.replaced, []);
  const other = pageAt('?token=t2');  // a new link wins over the kept token
  assert.equal(takeToken(other.location, other.history, mapStorage(items)), 't2');
  assert.deepEqual(other.history.replaced, ['/v1/sessions/ses_9/view']);
});

test('where the token cannot be kept, the URL keeps it', () => {
  const refused = { getItem() { throw new Error('denied'); },
    setItem() { throw new Error('denied'); } };
  for (const storage of [null, refused]) {
    const { location, history } = pageAt('?token=tok');
    assert.equal(takeToken(location, history, storage), 'tok');
    assert.deepEqual(history.replaced, []);
  }
  const { location, history } = pageAt('');
  assert.equal(takeToken(location, history, null), '');
});

test('a running session is connected once, view-only for a view token', async () => {
  const { view, ui, made, fetched, timers } = harness([running('view'), running('view')]);
  await view.poll();
  assert.equal(fetched[0].url, '/v1/sessions/ses_1/view/status?token=tok');
  assert.deepEqual(fetched[0].options, { cache: 'no-store' });
  assert.equal(made.length, 1);
  const [rfb] = made;
  assert.equal(rfb.socket.url, 'ws://127.0.0.1:8765/v1/sessions/ses_1/vnc?token=tok');
  assert.deepEqual(rfb.socket.protocols, ['binary']);
  assert.equal(rfb.target, ui.screen);
  assert.deepEqual(rfb.options, { shared: true });
  assert.equal(rfb.viewOnly, true);
  assert.equal(rfb.scaleViewport, true);
  assert.equal(ui.scope.textContent, 'view only');
  assert.equal(ui.clipSend.hidden, true);
  assert.equal(ui.clipType.hidden, true);
  assert.equal(ui.state.textContent, 'connecting');
  assert.equal(timers.at(-1).ms, POLL_WAITING_MS);

  rfb.dispatch('connect');
  assert.equal(view.connected, true);
  assert.deepEqual([ui.state.textContent, ui.state.className], ['connected', 'connected']);
  await timers.at(-1).fn(); // the next poll: still running, no second connection
  assert.equal(made.length, 1);
  assert.equal(timers.at(-1).ms, POLL_CONNECTED_MS);
});

test('a control token gets input and the paste button', async () => {
  const { view, ui, made } = harness([running('control')]);
  await view.poll();
  assert.equal(made[0].viewOnly, false);
  assert.equal(ui.scope.textContent, 'control');
  assert.equal(ui.clipSend.hidden, false);
  assert.equal(ui.clipType.hidden, false);
});

test('a paused session is let go and shown; running again reconnects', async () => {
  const paused = response(200, { session_id: 'ses_1', state: 'paused', scope: 'view' });
  const { view, ui, made, timers } = harness([running('view'), paused, running('view')]);
  await view.poll();
  made[0].dispatch('connect');
  // The checkpoint closes the stream: the page looks at the state at once (no timer).
  made[0].disconnect();
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(view.connected, false);
  assert.deepEqual([ui.state.textContent, ui.state.className], ['paused', 'paused']);
  assert.equal(view.state, 'paused');
  await timers.at(-1).fn();
  assert.equal(made.length, 2);
  assert.equal(ui.state.textContent, 'connecting');
});

test('a connection that never opened waits for the next poll', async () => {
  const { view, made, fetched } = harness([running('view')]);
  await view.poll();
  made[0].disconnect(); // refused before RFB's handshake finished
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(fetched.length, 1);
  assert.equal(view.rfb, null);
  assert.equal(view.disconnects, 1);
});

for (const [state, shown] of [['stopped', 'ended (stopped)'], ['failed', 'ended (failed)']]) {
  test(`a ${state} session ends the page: no more polls`, async () => {
    const over = response(200, { session_id: 'ses_1', state, scope: 'view' });
    const { view, ui, made, fetched, timers } = harness([running('view'), over]);
    await view.poll();
    made[0].dispatch('connect');
    await timers.at(-1).fn();
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(made[0].disconnected, true);
    assert.equal(view.connected, false);
    assert.equal(fetched.length, 2); // letting go of the picture is not a reason to poll
    assert.deepEqual([ui.state.textContent, ui.state.className], [shown, 'ended']);
    assert.equal(timers.length, 1);
  });
}

for (const [code, shown] of [[401, 'access refused'], [403, 'access refused'], [404, 'ended']]) {
  test(`HTTP ${code} from the status poll ends the page`, async () => {
    const { view, ui, made, fetched, timers } = harness([running('view'), response(code, {})]);
    await view.poll();
    made[0].dispatch('connect');
    await timers.at(-1).fn();
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(made[0].disconnected, true);
    assert.equal(fetched.length, 2);
    assert.deepEqual([ui.state.textContent, view.state], [shown, 'ended']);
    assert.equal(timers.length, 1);
  });
}

test('an unreachable server or a server error keeps the page polling', async () => {
  const unavailable = response(503, { error: { type: 'unavailable' } });
  const { view, ui, made, timers } = harness(
    [new TypeError('fetch failed'), unavailable, running('view')],
  );
  await view.poll();
  assert.equal(ui.state.textContent, 'server unreachable');
  await timers.at(-1).fn();
  assert.equal(ui.state.textContent, 'server error (503)');
  assert.equal(view.state, 'connecting');
  assert.equal(made.length, 0);
  await timers.at(-1).fn();
  assert.equal(made.length, 1);
  assert.equal(timers.length, 3);
});

const settled = () => new Promise((resolve) => setImmediate(resolve));

test('the clipboard panel: shows what the session copied, whole, once the server says', async () => {
  const whole = response(200, { text: 'copied ✓ 中' });
  const { view, ui, made, asked } = harness([running('view')], [whole]);
  await view.poll();
  ui.clipToggle.dispatch('click');
  assert.equal(ui.clip.hidden, false);
  made[0].dispatch('clipboard', { text: 'copied ? ?' }); // RFB's Latin-1: not shown
  assert.equal(ui.clipText.value, '');
  await settled();
  assert.deepEqual(asked, [{
    url: '/v1/sessions/ses_1/view/clipboard?token=tok', options: { cache: 'no-store' },
  }]);
  assert.deepEqual([ui.clipText.value, view.clipboard], ['copied ✓ 中', 'copied ✓ 中']);
  ui.clipToggle.dispatch('click');
  assert.equal(ui.clip.hidden, true);
});

test('the clipboard panel keeps the cut text when the server cannot say, and the newest notice wins', async () => {
  let answerFirst;
  const slow = new Promise((resolve) => { answerFirst = resolve; });
  const { view, ui, made, fetched } = harness([running('view')]);
  await view.poll();
  const answers = [slow, response(200, { text: 'second ✓' }), response(409, {}),
    new TypeError('fetch failed')];
  view.fetch = async (url, options) => { fetched.push({ url, options }); return answers.shift(); };
  made[0].dispatch('clipboard', { text: 'first' });
  made[0].dispatch('clipboard', { text: 'second ?' });
  await settled();
  answerFirst(response(200, { text: 'first, answered late' }));
  await settled();
  assert.equal(ui.clipText.value, 'second ✓');
  made[0].dispatch('clipboard', { text: 'paused meanwhile' }); // a 409: the cut text stays
  await settled();
  assert.equal(ui.clipText.value, 'paused meanwhile');
  made[0].dispatch('clipboard', { text: 'server gone' });
  await settled();
  assert.equal(ui.clipText.value, 'server gone');
});

test('a repeated cut text never overwrites what the person writes in the panel', async () => {
  const { view, ui, made, asked } = harness([running('control')],
    [response(200, { text: 'copied ✓ 中' })]);
  await view.poll();
  made[0].dispatch('connect'); // the page reads what the session holds at once
  await settled();
  assert.equal(asked.length, 1);
  assert.equal(ui.clipText.value, 'copied ✓ 中');
  ui.clipText.value = 'my draft 日本語';
  const answers = [response(200, { text: 'copied ✓ 中' }), response(409, {}),
    new TypeError('fetch failed'), response(200, { text: 'new ✓' })];
  view.fetch = async () => answers.shift();
  for (let repeat = 0; repeat < 3; repeat += 1) {
    made[0].dispatch('clipboard', { text: 'copied ? ?' }); // the server says, or cannot
    await settled();
    assert.equal(ui.clipText.value, 'my draft 日本語');
  }
  made[0].dispatch('clipboard', { text: 'new ?' }); // a new copy in the session
  await settled();
  assert.equal(ui.clipText.value, 'new ✓');
});

test('x11vnc\'s Latin-1 of a text', () => {
  assert.equal(asLatin1('fróm ✓ 中 👍 ÿ'), 'fróm ? ? ? ÿ');
});

test('the clipboard panel pastes through the server, only with control and connected', async () => {
  for (const scope of ['view', 'control']) {
    const { view, ui, made, fetched } = harness([running(scope), response(204, null),
      response(409, {}), new TypeError('fetch failed')]);
    await view.poll();
    ui.clipText.value = 'from the viewer ✓';
    await view.paste(); // not connected yet: nothing to paste into
    made[0].dispatch('connect');
    await view.paste();
    const posted = fetched.slice(1);
    if (scope === 'view') {
      assert.deepEqual(posted, []);
      continue;
    }
    assert.deepEqual(posted, [{
      url: '/v1/sessions/ses_1/view/clipboard?token=tok',
      options: {
        method: 'POST', cache: 'no-store', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ text: 'from the viewer ✓' }),
      },
    }]);
    assert.equal(ui.clipStatus.textContent, 'pasted');
    assert.deepEqual(made[0].pasted, []); // not as RFB's Latin-1 cut text
    await view.paste();
    assert.equal(ui.clipStatus.textContent, 'paste refused (409)');
    await view.paste();
    assert.equal(ui.clipStatus.textContent, 'server unreachable');
  }
});

test('the panel types its text through the server, only with control, connected and text', async () => {
  const paused = { error: { type: 'conflict', message: 'session ses_1 is paused; resume it first' } };
  for (const scope of ['view', 'control']) {
    const { view, ui, made, fetched } = harness([running(scope), response(204, null),
      response(409, paused), new TypeError('fetch failed')]);
    await view.poll();
    ui.clipText.value = 'かな漢字 ✓';
    await view.typeText(); // not connected yet: nothing to type into
    made[0].dispatch('connect');
    ui.clipText.value = '';
    await view.typeText(); // nothing to type
    assert.equal(ui.clipStatus.textContent, '');
    ui.clipText.value = 'かな漢字 ✓';
    const typing = view.typeText();
    if (scope === 'control') assert.equal(ui.clipStatus.textContent, 'typing…');
    await typing;
    const posted = fetched.slice(1);
    if (scope === 'view') {
      assert.deepEqual(posted, []);
      continue;
    }
    assert.deepEqual(posted, [{
      url: '/v1/sessions/ses_1/view/type?token=tok',
      options: {
        method: 'POST', cache: 'no-store', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ text: 'かな漢字 ✓' }),
      },
    }]);
    assert.equal(ui.clipStatus.textContent, 'typed');
    ui.clipType.dispatch('click'); // the button does the same
    await settled();
    assert.equal(ui.clipStatus.textContent,
      'typing refused (409): session ses_1 is paused; resume it first');
    await view.typeText();
    assert.equal(ui.clipStatus.textContent, 'server unreachable');
  }
});

test('the page template has every element view.js wires', () => {
  const page = readFileSync(new URL('view.html', VNC), 'utf8');
  const script = readFileSync(new URL('static/view.js', VNC), 'utf8');
  const ids = [...script.matchAll(/\$\('([\w-]+)'\)/g)].map((match) => match[1]);
  assert.ok(ids.length >= 7, ids);
  for (const id of ids) assert.match(page, new RegExp(`id="${id}"`), id);
});

test('the vendored noVNC is the pinned one, unedited (vnc/update-novnc.sh)', () => {
  const root = new URL('novnc/', VNC);
  const pinned = readFileSync(new URL('PINNED', root), 'utf8').split('\n');
  assert.match(pinned[0], /^@novnc\/novnc \d+\.\d+\.\d+$/);
  assert.match(pinned[1], /^sha512-[A-Za-z0-9+/]{86}==$/);
  const sums = readFileSync(new URL('SHA256SUMS', root), 'utf8').trim().split('\n');
  const files = sums.map((line) => line.split(/ {2}/)[1]);
  assert.ok(files.includes('core/rfb.js') && files.includes('LICENSE.txt'), files);
  assert.ok(files.includes('docs/LICENSE.MPL-2.0') && files.includes('vendor/pako/LICENSE'));
  const present = readdirSync(root, { recursive: true })
    .filter((file) => file !== 'SHA256SUMS' && statSync(new URL(file, root)).isFile());
  assert.deepEqual(present.sort(), [...files].sort());
  for (const line of sums) {
    const [sum, file] = line.split(/ {2}/);
    const data = readFileSync(new URL(file, root));
    assert.equal(createHash('sha256').update(data).digest('hex'), sum, file);
  }
});

test('a control token may take control and hand back', async () => {
  const handoff = (human, help) => response(200, {
    state: 'running', scope: 'control', human_in_control: human, needs_help: help,
    reason: help ? 'a captcha' : null,
  });
  const { view, ui, fetched } = harness([handoff(false, true), handoff(true, false),
    handoff(false, false)]);
  await view.refresh();
  assert.equal(ui.take.hidden, false);
  assert.equal(ui.handBack.hidden, true);
  assert.equal(ui.help.textContent, 'the agent asks for help: a captcha');
  await view.control('POST');
  assert.deepEqual(fetched.at(-1), {
    url: '/v1/sessions/ses_1/control?token=tok', options: { method: 'POST', cache: 'no-store' },
  });
  assert.equal(view.human, true);
  assert.equal(ui.take.hidden, true);
  assert.equal(ui.handBack.hidden, false);
  await view.control('DELETE');
  assert.equal(fetched.at(-1).options.method, 'DELETE');
  assert.equal(view.human, false);
  assert.equal(ui.help.hidden, true);
});

const handoff = (human, { scope = 'control', help = false } = {}) => response(200, {
  session_id: 'ses_1', state: 'running', scope, human_in_control: human, needs_help: help,
  reason: help ? 'a captcha' : null,
});

const shown = (ui) => ({
  help: ui.help.hidden ? null : ui.help.textContent, take: !ui.take.hidden,
  handBack: !ui.handBack.hidden,
});

test('"you are in control" only on the page that took control; the others see a human in control', async () => {
  // The page that takes control...
  const taker = harness([handoff(false), handoff(true), handoff(true), handoff(true)]);
  await taker.view.refresh();
  assert.deepEqual(shown(taker.ui), { help: null, take: true, handBack: false });
  await taker.view.control('POST');
  await taker.view.refresh();
  assert.deepEqual(shown(taker.ui),
    { help: 'you are in control: the agent waits', take: false, handBack: true });
  // ...a view page and another control page, which poll the same handoff...
  for (const scope of ['view', 'control']) {
    const other = harness([handoff(true, { scope })]);
    await other.view.refresh();
    assert.deepEqual(shown(other.ui),
      { help: 'a human is in control: the agent waits', take: false, handBack: false }, scope);
  }
  // ...and the taker's tab reloaded: still its control, to hand back.
  const reloaded = harness([handoff(true)], [], taker.storage);
  await reloaded.view.refresh();
  assert.deepEqual(shown(reloaded.ui),
    { help: 'you are in control: the agent waits', take: false, handBack: true });
});

test('control that ended elsewhere (a hand-back, the lease) is no longer the page\'s', async () => {
  const { view, ui, storage } = harness([handoff(false), handoff(true), handoff(false),
    handoff(true)]);
  await view.refresh();
  await view.control('POST');
  assert.equal(storage.size, 1);
  await view.refresh(); // the lease ran out
  assert.equal(view.tookControl, false);
  assert.equal(storage.size, 0);
  await view.refresh(); // another page took it since
  assert.deepEqual(shown(ui),
    { help: 'a human is in control: the agent waits', take: false, handBack: false });
});

test('a status poll asked before "Take control" was answered does not undo it', async () => {
  let answerPoll;
  const { view, ui, fetched } = harness([handoff(false)]);
  await view.refresh();
  const slow = [new Promise((resolve) => { answerPoll = resolve; }), handoff(true)];
  view.fetch = async (url, options) => { fetched.push({ url, options }); return slow.shift(); };
  const polling = view.refresh(); // asked before the click: the session's older news
  await view.control('POST');
  answerPoll(handoff(false));
  await polling;
  assert.deepEqual(shown(ui),
    { help: 'you are in control: the agent waits', take: false, handBack: true });
});

test('taking control or handing back that fails says why', async () => {
  const paused = { error: { type: 'conflict', message: 'session ses_1 is paused; resume it first' } };
  const { view, ui } = harness([handoff(false, { help: true }), response(409, paused),
    new TypeError('fetch failed'), handoff(true), response(500, {})]);
  await view.refresh();
  await view.control('POST');
  assert.deepEqual(shown(ui), {
    help: 'taking control refused (409): session ses_1 is paused; resume it first',
    take: true, handBack: false,
  });
  await view.control('POST');
  assert.equal(ui.help.textContent, 'taking control refused: server unreachable');
  await view.control('POST');
  assert.equal(ui.help.textContent, 'you are in control: the agent waits');
  await view.control('DELETE');
  assert.deepEqual(shown(ui), { help: 'hand-back refused (500)', take: false, handBack: true });
});

test('a websocket the server refuses says so and is tried again later and later, up to 30 s', async () => {
  const { view, ui, made, timers, clock } = harness(Array.from({ length: 200 },
    () => running('view')));
  await view.poll();
  const waited = [];
  let triedAt = clock.now;
  for (let attempt = 1; attempt <= 8; attempt += 1) {
    assert.equal(made.length, attempt);
    made.at(-1).closedByServer(1006); // a 429, a 502, a 409: the browser shows none of them
    assert.deepEqual([ui.state.textContent, ui.state.className], [
      'cannot connect: the server refused the connection or could not be reached (retrying)',
      'failing']);
    assert.equal(view.failures, attempt);
    while (made.length === attempt) { // the page polls every second meanwhile
      clock.now += timers.at(-1).ms;
      await timers.at(-1).fn();
      assert.equal(ui.state.className, 'failing');
    }
    waited.push(clock.now - triedAt);
    triedAt = clock.now;
  }
  assert.deepEqual(waited, [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
  assert.equal(retryDelay(100), RETRY_MAX_MS);
  // Once it opens, the count starts again; a live picture closed by the server says why
  // and is reconnected at once.
  made.at(-1).dispatch('connect');
  assert.equal(view.failures, 0);
  assert.equal(ui.state.textContent, 'connected');
  made.at(-1).closedByServer(1008, 'the viewer took nothing for 30 s');
  await settled();
  assert.equal(made.length, 10);
  assert.equal(ui.state.textContent, 'reconnecting (the viewer took nothing for 30 s)');
  made.at(-1).closedByServer(1006);
  assert.equal(view.failures, 1);
});

test('a connection closed with a reason before it opened, or a viewer that fails, says why', async () => {
  const { view, ui, made, clock, timers } = harness([running('view'), running('view'),
    running('view')]);
  await view.poll();
  made[0].closedByServer(1011, "the session's VNC server failed: timed out");
  assert.equal(ui.state.textContent,
    "cannot connect: the session's VNC server failed: timed out (retrying)");
  clock.now += 1000;
  view.RFB = class { constructor() { throw new Error('Display exception'); } };
  await timers.at(-1).fn();
  assert.equal(ui.state.textContent, 'cannot connect: Display exception (retrying)');
  assert.equal(view.connecting, false);
  assert.equal(view.failures, 2);
});

test("the session's end closes the picture (1001) and the status poll's 404 says it ended", async () => {
  const ended = { error: { type: 'not_found', message: 'session ses_1 ended (stopped)' } };
  const { view, ui, made, fetched, timers } = harness([running('view'), response(404, ended)]);
  await view.poll();
  made[0].dispatch('connect');
  made[0].closedByServer(1001, "the session's screen ended: it stopped", true);
  await settled();
  assert.equal(fetched.length, 2); // looked at once
  assert.deepEqual([ui.state.textContent, ui.state.className, view.state],
    ['ended', 'ended', 'ended']);
  assert.equal(timers.length, 1); // and no more
});

test('a refused token says why', async () => {
  const revoked = { error: { type: 'unauthorized',
    message: 'invalid session token (unknown, revoked or expired)' } };
  const { view, ui } = harness([response(401, revoked)]);
  await view.poll();
  assert.equal(ui.state.textContent,
    'access refused: invalid session token (unknown, revoked or expired)');
});
