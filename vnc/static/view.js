// The Deskbox live view: noVNC's RFB client on /v1/sessions/{id}/vnc, scaled to the
// window, showing the session's state and reconnecting when the session runs again.
// The session token is read from this page's URL (?token=) and sent only to this server.
const body = document.body;
const { default: RFB } = await import(`${body.dataset.novnc}/core/rfb.js`);

const token = new URLSearchParams(location.search).get('token') || '';
const base = location.pathname.replace(/\/view\/?$/, '');
const query = `?token=${encodeURIComponent(token)}`;
const wsUrl = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}${base}/vnc${query}`;
const $ = (id) => document.getElementById(id);

// What tests and the benchmark read.
const view = window.__deskbox = {
  state: 'connecting', scope: null, connected: false, connects: 0, disconnects: 0,
  clipboard: '', rfb: null, firstFrameAt: null,
};

function show(text, cls) {
  $('state').textContent = text;
  $('state').className = cls;
}

let connecting = false;

function connect() {
  if (connecting || view.connected) return;
  connecting = true;
  const rfb = new RFB($('screen'), wsUrl, { wsProtocols: ['binary'], shared: true });
  view.rfb = rfb;
  rfb.scaleViewport = true;
  rfb.resizeSession = false;
  rfb.viewOnly = view.scope !== 'control';
  rfb.focusOnClick = true;
  rfb.addEventListener('connect', () => {
    connecting = false;
    view.connected = true;
    view.connects += 1;
    show('connected', 'connected');
  });
  rfb.addEventListener('disconnect', () => {
    connecting = false;
    view.connected = false;
    view.disconnects += 1;
    if (view.rfb === rfb) view.rfb = null;
    refresh();
  });
  rfb.addEventListener('clipboard', (event) => {
    view.clipboard = event.detail.text;
    $('clip-text').value = event.detail.text;
  });
}

async function refresh() {
  let status;
  try {
    const response = await fetch(`${base}/view/status${query}`, { cache: 'no-store' });
    if (response.status === 401 || response.status === 403 || response.status === 404) {
      view.state = 'ended';
      show(response.status === 404 ? 'ended' : 'access refused', 'ended');
      return false;
    }
    status = await response.json();
  } catch (error) {
    show('server unreachable', 'ended');
    return true;
  }
  view.state = status.state;
  view.scope = status.scope;
  $('scope').textContent = status.scope === 'control' ? 'control' : 'view only';
  $('clip-send').hidden = status.scope !== 'control';
  if (status.state === 'running') {
    if (!view.connected) {
      show('connecting', 'connecting');
      connect();
    }
    return true;
  }
  if (view.rfb) view.rfb.disconnect();
  const ended = status.state === 'stopped' || status.state === 'failed';
  show(ended ? `ended (${status.state})` : status.state, ended ? 'ended' : status.state);
  return !ended;
}

$('clip-toggle').addEventListener('click', () => { $('clip').hidden = !$('clip').hidden; });
$('clip-send').addEventListener('click', () => {
  if (view.rfb && view.scope === 'control') view.rfb.clipboardPasteFrom($('clip-text').value);
});

async function poll() {
  const keepGoing = await refresh();
  if (keepGoing) setTimeout(poll, view.connected ? 3000 : 1000);
}
poll();
