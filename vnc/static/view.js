// The Deskbox live view: noVNC's RFB client on /v1/sessions/{id}/vnc, scaled to the
// window, showing the session's state and reconnecting when the session runs again.
// The logic is in live.js; this wires it to the page (vnc/view.html) and to noVNC.
import { LiveView, endpoints, takeToken } from './live.js';

const $ = (id) => document.getElementById(id);
const ui = {
  screen: $('screen'), state: $('state'), scope: $('scope'), clip: $('clip'),
  clipToggle: $('clip-toggle'), clipText: $('clip-text'), clipSend: $('clip-send'),
  clipType: $('clip-type'), clipStatus: $('clip-status'),
  help: $('help'), take: $('take'), handBack: $('hand-back'),
};

let RFB;
try {
  ({ default: RFB } = await import(`${document.body.dataset.novnc}/core/rfb.js`));
} catch (error) {
  ui.state.textContent = 'viewer failed to load';
  ui.state.className = 'ended';
  throw error;
}

let storage = null;
try {
  storage = window.sessionStorage;
} catch {
  // refused (a sandboxed frame): the page keeps what it took in memory only
}

const token = takeToken(location, history, storage);
// What tests and the benchmark read.
const view = window.__deskbox = new LiveView({
  ui, RFB, WebSocket: window.WebSocket, urls: endpoints(location, token),
  fetch: window.fetch.bind(window), setTimeout: window.setTimeout.bind(window), storage,
});
view.poll();
