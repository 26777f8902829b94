// The live view's logic, kept apart from the page and from noVNC so that node's test runner
// can drive it (vnc/test/live.test.js): where the page connects, what the status poll shows,
// when it (re)connects, and the clipboard panel. view.js wires it to the page.

// The session token comes from the page's own URL (?token=) and goes only to this server:
// the status poll and the websocket, on the page's own origin and path.
export function endpoints(location) {
  const token = new URLSearchParams(location.search).get('token') || '';
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

// ui: the page's elements (screen, state, scope, clip, clipToggle, clipText, clipSend,
// clipType, clipStatus, help, take, handBack);
// RFB: noVNC's client class; fetch and setTimeout: the window's.
export class LiveView {
  constructor({ ui, RFB, urls, fetch, setTimeout }) {
    Object.assign(this, { ui, RFB, urls, fetch, setTimeout });
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
    // The handoff: a human in control (the agent's actions wait), the agent's call for help.
    this.human = false;
    this.needsHelp = false;
    ui.clipToggle.addEventListener('click', () => { ui.clip.hidden = !ui.clip.hidden; });
    ui.clipSend.addEventListener('click', () => this.paste());
    ui.clipType.addEventListener('click', () => this.typeText());
    ui.take.addEventListener('click', () => this.control('POST'));
    ui.handBack.addEventListener('click', () => this.control('DELETE'));
  }

  // Take control (POST) or hand back (DELETE); the answer is the session's handoff.
  async control(method) {
    let response;
    try {
      response = await this.fetch(this.urls.control, { method, cache: 'no-store' });
    } catch {
      return;
    }
    if (!response.ok) return;
    try {
      this.showHandoff(await response.json());
    } catch {
      // the next status poll shows it
    }
  }

  showHandoff({ human_in_control: human, needs_help: needsHelp, reason }) {
    this.human = human === true;
    this.needsHelp = needsHelp === true;
    const control = this.scope === 'control';
    this.ui.take.hidden = !control || this.human;
    this.ui.handBack.hidden = !control || !this.human;
    this.ui.help.hidden = !this.needsHelp && !this.human;
    this.ui.help.textContent = this.human ? 'you are in control: the agent waits'
      : this.needsHelp ? `the agent asks for help: ${reason || ''}` : '';
  }

  show(text, cls) {
    this.ui.state.textContent = text;
    this.ui.state.className = cls;
  }

  connect() {
    if (this.connecting || this.connected) return;
    this.connecting = true;
    const rfb = new this.RFB(this.ui.screen, this.urls.vnc, { wsProtocols: ['binary'], shared: true });
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
      this.show('connected', 'connected');
      this.copied(null); // what the session holds now: x11vnc may say nothing for seconds
    });
    rfb.addEventListener('disconnect', () => {
      this.connecting = false;
      this.connected = false;
      this.disconnects += 1;
      if (this.rfb !== rfb) return; // the page let it go (the session is not running)
      this.rfb = null;
      // A live picture the server ended (a checkpoint, a pause) is looked at again at once;
      // a connection that never opened waits for the next poll, so a failing server is not
      // hammered.
      if (opened) this.refresh();
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
    let response;
    try {
      response = await this.fetch(this.urls.status, { cache: 'no-store' });
    } catch {
      this.show('server unreachable', 'ended');
      return true;
    }
    if (response.status === 401 || response.status === 403 || response.status === 404) {
      this.state = 'ended';
      this.disconnect();
      this.show(response.status === 404 ? 'ended' : 'access refused', 'ended');
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
    this.showHandoff(status.state === 'running' ? status : {});
    if (status.state === 'running') {
      if (!this.connected) {
        this.show('connecting', 'connecting');
        this.connect();
      }
      return true;
    }
    this.disconnect();
    const ended = status.state === 'stopped' || status.state === 'failed';
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
