// The replay page (vnc/replay.html, served at GET /replay?session=ID): pick one of the
// key's recordings; its actions and events as a list and a slider; a step shows its frame
// with a marker where it acted; play and step through. The rules are in replay-model.js.
import { sessionPath } from './console-api.js';
import { age, bytes, recordingLength } from './console-model.js';
import { Page, saveAs } from './console-page.js';
import {
  clock, describe, frameFor, markerPosition, parseTrajectory, playDelay, sourceLabel, timeline,
} from './replay-model.js';

const FRAMES_KEPT = 64;
const $ = (id) => document.getElementById(id);
const ui = {
  picker: $('picker'), downloads: $('downloads'), select: $('recording'), reload: $('reload'), video: $('video'), exportZip: $('export'),
  summary: $('summary'), none: $('none'), player: $('player'), stage: $('stage'),
  frame: $('frame'), marker: $('marker'), noFrame: $('no-frame'), first: $('first'),
  prev: $('prev'), play: $('play'), next: $('next'), slider: $('slider'),
  position: $('position'), detail: $('detail'), steps: $('steps'),
};

// What the browser tests read (window.__replay).
const replay = {
  recordings: [], recording: null, steps: [], frames: [], index: -1, frame: null,
  playing: false, unreadable: 0,
};
window.__replay = replay;

let api = null;
let timer = null;
let loading = 0; // the newest load; an older one's answer is dropped
const frameUrls = new Map(); // frame number → Promise of a blob URL

const page = new Page({
  onSignIn: (accepted) => {
    api = accepted;
    loadRecordings(new URLSearchParams(location.search).get('session'));
  },
  onSignOut: () => {
    api = null;
    stop();
    forgetFrames();
    Object.assign(replay, { recordings: [], recording: null, steps: [], frames: [], index: -1 });
    ui.select.replaceChildren();
    ui.steps.replaceChildren();
    ui.player.hidden = true;
  },
});

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function forgetFrames() {
  for (const pending of frameUrls.values()) {
    pending.then((url) => URL.revokeObjectURL(url), () => {});
  }
  frameUrls.clear();
  ui.frame.removeAttribute('src');
}

// A frame's blob URL, fetched once; the oldest are let go past FRAMES_KEPT (not the one
// on screen).
function frameUrl(n) {
  let pending = frameUrls.get(n);
  if (!pending) {
    const id = replay.recording.session_id;
    pending = api.blob(`${sessionPath(id)}/recording/frames/${n}`).then((blob) => URL.createObjectURL(blob));
    pending.catch(() => frameUrls.delete(n));
    frameUrls.set(n, pending);
    for (const [old, oldUrl] of frameUrls) {
      if (frameUrls.size <= FRAMES_KEPT) break;
      if (old === replay.frame || old === n) continue;
      frameUrls.delete(old);
      oldUrl.then((url) => URL.revokeObjectURL(url), () => {});
    }
  }
  return pending;
}

async function loadRecordings(preferred) {
  const mine = ++loading;
  let recordings;
  try {
    ({ recordings } = await api.json('GET', '/v1/recordings'));
  } catch (error) {
    page.fail('Could not list the recordings', error);
    return;
  }
  if (mine !== loading) return;
  const now = Date.now();
  replay.recordings = recordings;
  ui.select.replaceChildren(...recordings.map((r) => {
    const option = element('option', '', `${r.session_id} · ${r.state} · ${r.actions} actions · ${age(r.started_at, now)} ago`);
    option.value = r.session_id;
    return option;
  }));
  ui.none.hidden = recordings.length > 0;
  ui.picker.hidden = recordings.length === 0;
  ui.downloads.hidden = recordings.length === 0;
  if (recordings.length === 0) {
    ui.player.hidden = true;
    ui.summary.textContent = '';
    return;
  }
  const chosen = recordings.find((r) => r.session_id === preferred) || recordings[0];
  ui.select.value = chosen.session_id;
  await openRecording(chosen.session_id);
}

async function openRecording(id) {
  const mine = ++loading;
  stop();
  const recording = replay.recordings.find((r) => r.session_id === id);
  if (!recording) return;
  history.replaceState(null, '', `/replay?session=${encodeURIComponent(id)}`);
  let text;
  try {
    text = await api.text(`${sessionPath(id)}/trajectory`);
  } catch (error) {
    page.fail(`Could not read the trajectory of ${id}`, error);
    return;
  }
  if (mine !== loading) return;
  forgetFrames();
  const { entries, unreadable } = parseTrajectory(text);
  const { frames, steps } = timeline(entries);
  Object.assign(replay, { recording, frames, steps, unreadable, index: -1, frame: null });
  const { width, height } = recording;
  ui.summary.textContent = [
    recording.state === 'stopped' && recording.stop_reason ? `stopped (${recording.stop_reason})` : recording.state,
    width && height ? `${width}×${height}` : '',
    recordingLength(recording, Date.now()),
    `${steps.length} steps`, `${frames.length} frames`, bytes(recording.bytes),
    unreadable ? `${unreadable} unreadable lines left out` : '',
  ].filter(Boolean).join(' · ');
  ui.steps.replaceChildren(...steps.map((step, i) => {
    const item = element('li', `step ${step.kind}`);
    item.dataset.index = String(i);
    const who = step.kind === 'event' ? 'event' : sourceLabel(step.source);
    item.classList.toggle('human', who === 'human');
    item.classList.toggle('failed', Boolean(step.error));
    const button = element('button', '');
    button.type = 'button';
    button.append(element('span', 't', clock(step.t)), element('span', 'who', who),
      element('span', 'what', describe(step)));
    if (step.error) button.append(element('span', 'error', step.error.message || step.error.type));
    button.addEventListener('click', () => {
      stop();
      select(i);
    });
    item.append(button);
    return item;
  }));
  ui.slider.max = String(Math.max(0, steps.length - 1));
  ui.player.hidden = false;
  if (steps.length === 0) {
    ui.position.textContent = 'no steps recorded';
    ui.detail.textContent = '';
    showFrame(frames.length ? frames[frames.length - 1].frame : null, null);
    return;
  }
  await select(0);
}

async function select(i) {
  const step = replay.steps[i];
  if (!step) return;
  replay.index = i;
  for (const item of ui.steps.children) {
    item.classList.toggle('current', item.dataset.index === String(i));
  }
  const current = ui.steps.children[i];
  if (current) current.scrollIntoView({ block: 'nearest' });
  ui.slider.value = String(i);
  ui.position.textContent = `step ${i + 1} of ${replay.steps.length} · ${clock(step.t)}`;
  const body = { action: step.action, refused: step.sent, event: step.event }[step.kind];
  const error = step.error ? `\nerror: ${step.error.type}: ${step.error.message}` : '';
  ui.detail.textContent = JSON.stringify(body, null, 1) + error;
  await showFrame(frameFor(step, replay.frames), step);
  const following = replay.steps[i + 1];
  if (following) {
    const n = frameFor(following, replay.frames);
    if (n !== null) frameUrl(n).catch(() => {}); // ready before it is wanted
  }
}

async function showFrame(n, step) {
  replay.frame = n;
  ui.noFrame.hidden = n !== null;
  ui.stage.hidden = n === null;
  if (n === null) return;
  let url;
  try {
    url = await frameUrl(n);
  } catch (error) {
    if (replay.frame === n) page.fail(`Could not load frame ${n}`, error);
    return;
  }
  if (replay.frame !== n || replay.steps[replay.index] !== step) return;
  if (ui.frame.getAttribute('src') !== url) {
    ui.frame.src = url;
    try {
      await ui.frame.decode();
    } catch {
      // a broken image: the marker stays hidden
    }
  }
  placeMarker();
}

// The marker sits on the displayed image: screen pixels scaled to its rendered size.
function placeMarker() {
  const step = replay.steps[replay.index];
  const image = ui.frame;
  const point = step && step.kind === 'action' ? step.screen_point : null;
  const recording = replay.recording || {};
  const screen = {
    width: recording.width || image.naturalWidth, height: recording.height || image.naturalHeight,
  };
  const at = image.naturalWidth && point
    ? markerPosition(point, screen, { width: image.clientWidth, height: image.clientHeight })
    : null;
  ui.marker.hidden = !at;
  if (at) {
    ui.marker.style.left = `${at.left}px`;
    ui.marker.style.top = `${at.top}px`;
  }
}

function stop() {
  clearTimeout(timer);
  replay.playing = false;
  ui.play.textContent = 'Play';
}

function schedule() {
  if (!replay.playing) return;
  const { index, steps } = replay;
  if (index >= steps.length - 1) {
    stop();
    return;
  }
  timer = setTimeout(async () => {
    await select(replay.index + 1);
    schedule();
  }, playDelay(steps[index], steps[index + 1]));
}

async function togglePlay() {
  if (replay.playing) {
    stop();
    return;
  }
  if (replay.steps.length === 0) return;
  if (replay.index >= replay.steps.length - 1) await select(0);
  replay.playing = true;
  ui.play.textContent = 'Pause';
  schedule();
}

function step(delta) {
  stop();
  const last = replay.steps.length - 1;
  select(Math.min(last, Math.max(0, replay.index + delta)));
}

ui.select.addEventListener('change', () => openRecording(ui.select.value));
ui.reload.addEventListener('click', () => loadRecordings(ui.select.value));
ui.first.addEventListener('click', () => step(-replay.steps.length));
ui.prev.addEventListener('click', () => step(-1));
ui.next.addEventListener('click', () => step(1));
ui.play.addEventListener('click', togglePlay);
ui.slider.addEventListener('input', () => {
  stop();
  select(Number(ui.slider.value));
});
for (const [button, suffix, extension] of [[ui.video, 'recording.mp4', 'mp4'], [ui.exportZip, 'trajectory.zip', 'zip']]) {
  button.addEventListener('click', async () => {
    const id = replay.recording && replay.recording.session_id;
    if (!id) return;
    try {
      await saveAs(api, `${sessionPath(id)}/${suffix}`, `${id}.${extension}`);
    } catch (error) {
      page.fail(`Download ${id}.${extension}`, error);
    }
  });
}
document.addEventListener('keydown', (event) => {
  if (!api || ui.player.hidden || ['INPUT', 'SELECT', 'TEXTAREA', 'BUTTON'].includes(event.target.tagName)) return;
  const keys = {
    ArrowLeft: () => step(-1), ArrowRight: () => step(1), Home: () => step(-replay.steps.length),
    End: () => step(replay.steps.length), ' ': togglePlay,
  };
  if (keys[event.key]) {
    event.preventDefault();
    keys[event.key]();
  }
});
new ResizeObserver(placeMarker).observe(ui.frame);

page.start();
