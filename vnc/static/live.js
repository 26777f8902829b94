// The live view's logic, kept apart from the page and from noVNC so that node's test runner
// can drive it (vnc/test/live.test.js): where the page connects, what the status poll shows,
// when it (re)connects, and the clipboard panel. view.js wires it to the page.

// The session token comes from the page's own URL (?token=) and leaves the address bar at
// once: a URL holding a live token, in a bookmark or on a shared screen, opens the session
// for as long as the token lives (the browser's history has recorded it already: the
// console hands its tabs the token in their storage, under tokenItem, and no URL). The
// tab keeps it in its session storage instead, so that a reload still works; where it
// cannot be kept, the URL keeps it.
export function tokenItem(pathname) {
  return `deskbox.token:${pathname}`;
}

export function takeToken(location, history, storage) {
  const key = tokenItem(location.pathname);
  const params = new URLSearchParams(location.search);
  const token = params.get('token');
  if (token === null) {
    try {
      return storage?.getItem(key) ?? '';
    } catch {
      return '';
    }
  }
  try {
    if (!storage) return token;
    storage.setItem(key, token);
  } catch {
    return token;
  }
  params.delete('token');
  const rest = params.toString();
  history.replaceState(history.state, '',
    `${location.pathname}${rest ? `?${rest}` : ''}${location.hash}`);
  return token;
}

// The token goes only to this server: the status poll and the websocket, on the page's own
// origin and path.
export function endpoints(location, token) {
  const base = location.pathname.replace(/\/view\/?$/, '');
  const query = `?token=${encodeURIComponent(token)}`;
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  return {
    status: `${base}/view/status${query}`,
    clipboard: `${base}/view/clipboard${query}`,
    type: `${base}/view/type${query}`,
    control: `${base}/control${query}`,
    vnc: `${scheme}://${location.host}${base}/vnc${query}`,
  };
}

// A text as x11vnc's Latin-1 cut text carries it.
export function asLatin1(text) {
  return text.replace(/[^\u0000-\u00ff]/gu, '?');
}

// ": <the error body's message>" of a refused call, or nothing.
async function reason(response) {
  try {
    const { error } = await response.json();
    return typeof error?.message === 'string' ? `: ${error.message}` : '';
  } catch {
    return '';
  }
}

// Poll slowly while the picture is live, faster while waiting for the session to run.
export const POLL_CONNECTED_MS = 3000;
export const POLL_WAITING_MS = 1000;

// A websocket that never opens is tried again after 1 s, then 2, 4, ... up to 30 s: a
// server refusing viewers (too many of them, a VNC server that fails to start) is not
// asked every second for ever.
export const RETRY_FIRST_MS = 1000;
export const RETRY_MAX_MS = 30000;
export function retryDelay(failures) {
  return Math.min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** Math.max(0, failures - 1));
}

// Why the socket closed, for a person. A browser hides a refused upgrade's HTTP answer
// (429 too many viewers, 502 the VNC server failed, 409 a checkpoint) from scripts: such a
// socket closes 1006 with no reason, as one the network dropped.
export function closeReason(close, opened) {
  if (close?.reason) return close.reason;
  if (close && close.code !== 1006 && close.code !== 1005) return `closed (${close.code})`;
  return opened ? 'the connection was lost'
    : 'the server refused the connection or could not be reached';
}

// ui: the page's elements (screen, state, scope, clip, clipToggle, clipText, clipSend,
// clipType, clipStatus, help, take, handBack);
// RFB: noVNC's client class; WebSocket, fetch, setTimeout: the window's; now: the clock
// (ms); storage: the tab's sessionStorage, or null.
export class LiveView {
  constructor({ ui, RFB, WebSocket, urls, fetch, setTimeout, now = () => Date.now(),
    storage = null }) {
    Object.assign(this, { ui, RFB, WebSocket, urls, fetch, setTimeout, now, storage });
    // What the page shows and tests read (window.__deskbox).
    this.state = 'connecting';
    this.scope = null;
    this.connected = false;
    this.connects = 0;
    this.disconnects = 0;
    this.clipboard = '';
    this.clipboardAsks = 0; // a newer notice's answer wins over an older one's
    this.rfb = null;
    this.connecting = false;
    // Consecutive connections that never opened, why the last one failed, and when the
    // next may be tried; why a live picture was lost, while it is reconnected.
    this.failures = 0;
    this.failure = '';
    this.retryAt = 0;
    this.dropped = '';
    // The handoff: a human in control (the agent's actions wait), the agent's call for help.
    this.human = false;
    this.needsHelp = false;
    this.helpReason = '';
    this.controlError = '';
    // Control calls begun or answered: a status poll asked before one is older news.
    this.controlCalls = 0;
    // Whether this page took control. The handoff is the session's, not a person's: every
    // page sees human_in_control, and only the one whose "Take control" won may say "you"
    // and hand back. Kept in the tab's sessionStorage, so a reload still can.
    this.controlKey = `deskbox-took-control:${urls.control.split('?')[0]}`;
    this.tookControl = this.stored() === '1';
    ui.clipToggle.addEventListener('click', () => { ui.clip.hidden = !ui.clip.hidden; });
    ui.clipSend.addEventListener('click', () => this.paste());
    ui.clipType.addEventListener('click', () => this.typeText());
    ui.take.addEventListener('click', () => this.control('POST'));
    ui.handBack.addEventListener('click', () => this.control('DELETE'));
  }

  stored() {
    try {
      return this.storage?.getItem(this.controlKey) ?? null;
    } catch {
      return null; // storage refused (a sandboxed frame): this page's memory only
    }
  }

  setTookControl(took) {
    this.tookControl = took;
    try {
      if (took) this.storage?.setItem(this.controlKey, '1');
      else this.storage?.removeItem(this.controlKey);
    } catch {
      // this page's memory only
    }
  }

  // Take control (POST) or hand back (DELETE); the answer is the session's handoff.
  async control(method) {
    const refused = method === 'POST' ? 'taking control refused' : 'hand-back refused';
    this.controlError = '';
    this.controlCalls += 1;
    let handoff = null;
    try {
      const response = await this.fetch(this.urls.control, { method, cache: 'no-store' });
      if (response.ok) {
        this.setTookControl(method === 'POST');
        handoff = await response.json().catch(() => null);
      } else {
        this.controlError = `${refused} (${response.status})${await reason(response)}`;
      }
    } catch {
      this.controlError = `${refused}: server unreachable`;
    }
    this.controlCalls += 1;
    if (handoff) this.showHandoff(handoff);
    else this.renderHandoff(); // the error, or the next status poll shows the handoff
  }

  showHandoff({ human_in_control: human, needs_help: needsHelp, reason: helpReason }) {
    // Control over (handed back from another page, the lease ran out): not this page's.
    if (human === false && this.tookControl) this.setTookControl(false);
    this.human = human === true;
    this.needsHelp = needsHelp === true;
    this.helpReason = helpReason || '';
    this.renderHandoff();
  }

  renderHandoff() {
    const control = this.scope === 'control';
    const mine = this.human && this.tookControl;
    // Another page's control is not taken over from here: both pages would then say "you".
    this.ui.take.hidden = !control || this.human;
    this.ui.handBack.hidden = !control || !mine;
    this.ui.help.textContent = this.controlError
      || (mine ? 'you are in control: the agent waits'
        : this.human ? 'a human is in control: the agent waits'
          : this.needsHelp ? `the agent asks for help: ${this.helpReason}` : '');
    this.ui.help.hidden = this.ui.help.textContent === '';
  }

  failed(why) {
    this.failures += 1;
    this.failure = why;
    this.retryAt = this.now() + retryDelay(this.failures);
    this.show(`cannot connect: ${why} (retrying)`, 'failing');
  }

  show(text, cls) {
    this.ui.state.textContent = text;
    this.ui.state.className = cls;
  }

  connect() {
    if (this.connecting || this.connected) return;
    this.connecting = true;
    // The page opens the socket itself to read its close's code and reason (the server's
    // "fell behind", a session's end): noVNC's disconnect event says only "clean" or not.
    // Its listener comes before noVNC's, so the close is known when noVNC reports it.
    let closed = null;
    let socket = null;
    let rfb;
    try {
      socket = new this.WebSocket(this.urls.vnc, ['binary']);
      socket.addEventListener('close', ({ code, reason: why }) => { closed = { code, reason: why }; });
      rfb = new this.RFB(this.ui.screen, socket, { shared: true });
    } catch (error) {
      socket?.close();
      this.connecting = false;
      this.failed(error?.message || String(error));
      return;
    }
    this.rfb = rfb;
    rfb.scaleViewport = true;
    rfb.resizeSession = false;
    rfb.viewOnly = this.scope !== 'control'; // the server drops a view token's input anyway
    rfb.focusOnClick = true;
    let opened = false;
    rfb.addEventListener('connect', () => {
      opened = true;
      this.connecting = false;
      this.connected = true;
      this.connects += 1;
      this.failures = 0;
      this.retryAt = 0;
      this.failure = this.dropped = '';
      this.show('connected', 'connected');
      this.copied(null); // what the session holds now: x11vnc may say nothing for seconds
    });
    rfb.addEventListener('disconnect', (event) => {
      this.connecting = false;
      this.connected = false;
      this.disconnects += 1;
      if (this.rfb !== rfb) return; // the page let it go (the session is not running)
      this.rfb = null;
      const why = closed || opened || event?.detail?.clean !== false
        ? closeReason(closed, opened) : 'the viewer failed (see the browser\'s console)';
      // A live picture the server ended (a checkpoint, a pause) is looked at again at once;
      // a connection that never opened is tried again later and later.
      if (opened) {
        this.dropped = why;
        this.refresh();
      } else {
        this.failed(why);
      }
    });
    rfb.addEventListener('clipboard', (event) => this.copied(event.detail.text));
  }

  // RFB's cut text is Latin-1 (x11vnc turns other characters into '?') and comes again
  // without a change (x11vnc repeats it to viewers that came; the agent rewrites a new
  // clipboard for some seconds): it is only the news that the clipboard may have changed.
  // The panel's text is replaced when the whole text the server reads differs from the
  // session's last, so a repeat never overwrites what the person is writing there; when
  // the server cannot say, by the cut text if that says something new. `latin1` null: no
  // notice, a look when the picture connects.
  async copied(latin1) {
    const ask = ++this.clipboardAsks;
    let text = null;
    try {
      const response = await this.fetch(this.urls.clipboard, { cache: 'no-store' });
      if (response.ok) ({ text } = await response.json());
    } catch {
      // the cut text stands in
    }
    if (ask !== this.clipboardAsks) return;
    if (typeof text === 'string') {
      if (text !== this.clipboard) this.showClipboard(text);
    } else if (latin1 !== null && latin1 !== asLatin1(this.clipboard)) {
      this.showClipboard(latin1);
    }
  }

  showClipboard(text) {
    this.clipboard = text;
    this.ui.clipText.value = text;
  }

  // Only a control token may paste; the button is hidden for a view token. Through the
  // server, not RFB's cut text, so that any Unicode arrives whole.
  async paste() {
    await this.send(this.urls.clipboard, 'pasted', 'paste refused');
  }

  // The panel's text typed into the session's focused window: what a person composes with
  // an input method (the canvas takes keys, never composed text) and what a paste does not
  // reach (a terminal, a field that refuses pastes).
  async typeText() {
    if (this.ui.clipText.value === '') return;
    await this.send(this.urls.type, 'typed', 'typing refused', 'typing…');
  }

  async send(url, done, refused, pending = '') {
    if (!this.connected || this.scope !== 'control') return;
    this.ui.clipStatus.textContent = pending;
    let outcome;
    try {
      const response = await this.fetch(url, {
        method: 'POST', cache: 'no-store', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ text: this.ui.clipText.value }),
      });
      outcome = response.ok ? done : `${refused} (${response.status})${await reason(response)}`;
    } catch {
      outcome = 'server unreachable';
    }
    this.ui.clipStatus.textContent = outcome;
  }

  // One look at the session's state; false when there is nothing more to wait for.
  async refresh() {
    const asked = this.controlCalls;
    let response;
    try {
      response = await this.fetch(this.urls.status, { cache: 'no-store' });
    } catch {
      this.show('server unreachable', 'ended');
      return true;
    }
    // 404: the session ended (its tokens say so for a while after; then they are 401).
    if (response.status === 401 || response.status === 403 || response.status === 404) {
      this.state = 'ended';
      this.disconnect();
      this.showHandoff({ human_in_control: false });
      this.show(response.status === 404 ? 'ended' : `access refused${await reason(response)}`,
        'ended');
      return false;
    }
    let status;
    try {
      status = response.ok ? await response.json() : null;
    } catch {
      status = null;
    }
    if (!status || typeof status.state !== 'string') {
      this.show(`server error (${response.status})`, 'ended');
      return true;
    }
    this.state = status.state;
    this.scope = status.scope;
    this.ui.scope.textContent = status.scope === 'control' ? 'control' : 'view only';
    this.ui.clipSend.hidden = status.scope !== 'control';
    this.ui.clipType.hidden = status.scope !== 'control';
    const ended = status.state === 'stopped' || status.state === 'failed';
    // A paused session's handoff is not shown, and stays as it was for when it runs again.
    if (status.state !== 'running') this.showHandoff(ended ? { human_in_control: false } : {});
    else if (asked === this.controlCalls) this.showHandoff(status);
    if (status.state === 'running') {
      if (!this.connected) {
        if (this.failures) this.show(`cannot connect: ${this.failure} (retrying)`, 'failing');
        else this.show(this.dropped ? `reconnecting (${this.dropped})` : 'connecting', 'connecting');
        if (this.now() >= this.retryAt) this.connect();
      }
      return true;
    }
    // Not running: whatever failed or dropped before, it connects at once when it runs.
    this.failures = 0;
    this.retryAt = 0;
    this.failure = this.dropped = '';
    this.disconnect();
    this.show(ended ? `ended (${status.state})` : status.state, ended ? 'ended' : status.state);
    return !ended;
  }

  disconnect() {
    const rfb = this.rfb;
    this.rfb = null;
    if (rfb) rfb.disconnect();
  }

  async poll() {
    if (await this.refresh()) {
      this.setTimeout(() => this.poll(), this.connected ? POLL_CONNECTED_MS : POLL_WAITING_MS);
    }
  }
}
