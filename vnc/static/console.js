// The console (vnc/console.html, served at GET /): the key's sessions as cards with live
// thumbnails, polled every 2 s; create, delete, pause, hibernate, resume; live-view links;
// the key's recordings. The rules (order, buttons, ages) are in console-model.js.
import { describeError, sessionPath } from './console-api.js';
import {
  LIVE_STATES, actionsFor, age, arrange, bytes, recordingLength, thumbnailDue, thumbnailScale,
} from './console-model.js';
import { Page, saveAs } from './console-page.js';
import { tokenItem } from './live.js';

const POLL_MS = 2000;
const ENDED_SHOWN = 30;
const RECORDINGS_SHOWN = 50;
const $ = (id) => document.getElementById(id);
const ui = {
  cards: $('cards'), empty: $('empty'), ended: $('ended'), endedCount: $('ended-count'),
  endedList: $('ended-list'), recordings: $('recordings'), recordingRows: $('recording-rows'),
  recordingsMore: $('recordings-more'),
  createForm: $('create-form'), startUrl: $('start-url'), record: $('record'),
  create: $('create'), pollState: $('poll-state'), template: $('card-template'),
};

// For debugging: how many polls have completed since sign-in, and the cards.
const status = { polls: 0 };
const cards = new Map();
window.__console = { status, cards };

let api = null;
let timer = null;
let busy = false;
let again = false;
let pollError = '';
let recordingsServed = true;
const recordingRows = new Map();

const page = new Page({
  onSignIn: (accepted) => {
    api = accepted;
    status.polls = 0;
    recordingsServed = true;
    refreshNow();
  },
  onSignOut: () => {
    api = null;
    clearTimeout(timer);
    for (const card of cards.values()) card.dispose();
    cards.clear();
    for (const row of recordingRows.values()) row.remove();
    recordingRows.clear();
    ui.endedList.replaceChildren();
    ui.ended.hidden = true;
    ui.recordings.hidden = true;
  },
});

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

class Card {
  constructor(session) {
    this.id = session.id;
    this.session = session;
    this.el = ui.template.content.firstElementChild.cloneNode(true);
    this.el.dataset.id = session.id;
    this.img = this.el.querySelector('.thumb img');
    this.img.alt = `screen of ${session.id}`;
    this.frozen = this.el.querySelector('.frozen');
    this.stateChip = this.el.querySelector('.state');
    this.help = this.el.querySelector('.help');
    this.labels = this.el.querySelector('.labels');
    this.age = this.el.querySelector('.age');
    this.el.querySelector('.id').textContent = session.id;
    this.buttons = new Map();
    for (const button of this.el.querySelectorAll('button[data-act]')) {
      this.buttons.set(button.dataset.act, button);
      button.addEventListener('click', () => this.act(button.dataset.act, button));
    }
    this.url = null;
    this.stale = []; // blob URLs the <img> may still be decoding; let go once it has a new one
    this.shownState = null;
    this.disposed = false;
    this.img.addEventListener('load', () => this.release());
    this.img.addEventListener('error', () => this.release());
  }

  update(session, handoff, now) {
    this.session = session;
    const { state } = session;
    this.stateChip.textContent = state;
    this.stateChip.className = `state ${state}`;
    const help = Boolean(handoff && handoff.needs_help);
    const human = Boolean(handoff && handoff.human_in_control);
    this.el.classList.toggle('needs-help', help);
    this.help.hidden = !help && !human;
    this.help.textContent = help ? `needs help: ${handoff.reason || 'no reason given'}`
      : human ? 'a human is in control' : '';
    this.labels.replaceChildren(...Object.entries(session.labels || {}).map(
      ([k, v]) => element('span', 'label', `${k}: ${v}`)));
    const { width, height } = session.display || {};
    this.age.textContent = `${session.backend} · ${width}×${height} · up ${age(session.created_at, now)}`;
    const offered = new Set(actionsFor(state));
    for (const [name, button] of this.buttons) button.hidden = !offered.has(name);
    this.frozen.hidden = state !== 'paused' && state !== 'hibernated';
    this.el.classList.toggle('no-screen', this.url === null);
  }

  async fetchThumbnail(caller) {
    const { state, display } = this.session;
    if (!thumbnailDue(state, this.shownState)) return;
    let blob;
    try {
      blob = await caller.blob(
        `${sessionPath(this.id)}/screenshot?format=jpeg&quality=50&scale=${thumbnailScale(display)}`);
    } catch (error) {
      // It changed state or ended since the list: the next poll shows it.
      this.img.title = describeError(error);
      return;
    }
    if (this.disposed) return;
    if (this.url) this.stale.push(this.url);
    this.url = URL.createObjectURL(blob);
    this.shownState = state;
    this.img.title = '';
    this.img.src = this.url;
    this.el.classList.remove('no-screen');
  }

  release() {
    for (const url of this.stale) URL.revokeObjectURL(url);
    this.stale = [];
  }

  async act(name, button) {
    if (!api) return;
    if (name === 'view' || name === 'control') {
      openView(this.id, name);
      return;
    }
    if (name === 'delete' && !button.dataset.armed) {
      // Desktops are disposable, but one an agent is using is not to be lost to a stray click.
      button.dataset.armed = 'yes';
      button.textContent = 'Confirm delete';
      setTimeout(() => {
        delete button.dataset.armed;
        button.textContent = 'Delete';
      }, 4000);
      return;
    }
    const calls = {
      pause: ['POST', '/pause', { mode: 'freeze' }, 'Pausing…'],
      hibernate: ['POST', '/pause', { mode: 'hibernate' }, 'Hibernating…'],
      resume: ['POST', '/resume', undefined, 'Resuming…'],
      delete: ['DELETE', '', undefined, 'Deleting…'],
    };
    const [method, suffix, body, doing] = calls[name];
    const label = button.textContent;
    for (const other of this.buttons.values()) other.disabled = true;
    button.textContent = doing;
    try {
      await api.json(method, sessionPath(this.id) + suffix, body);
    } catch (error) {
      page.fail(`${label} ${this.id}`, error);
    } finally {
      for (const other of this.buttons.values()) other.disabled = false;
      button.textContent = name === 'delete' ? 'Delete' : label;
      delete button.dataset.armed;
      refreshNow();
    }
  }

  dispose() {
    this.disposed = true;
    this.el.remove();
    this.release();
    if (this.url) URL.revokeObjectURL(this.url);
    this.url = null;
  }
}

// A tab opened within the click (so that popup blockers let it through), sent to the view
// page once the token is there. Browsers give a tab opened this way a copy of this one's
// session storage, the API key with it: the view page needs none of it, only the token,
// which is handed over there (where the page looks for it on a reload) and never in a URL:
// the browser's history keeps every URL a tab visited, also one the page then took out of
// its address bar, and a history entry with a token opens the session while it lives.
async function openView(id, scope) {
  const tab = window.open('', '_blank');
  if (tab) tab.sessionStorage.clear();
  try {
    const token = await api.json('POST', `${sessionPath(id)}/tokens`, { scope, ttl_s: 3600 });
    const view = `${sessionPath(id)}/view`;
    if (tab) {
      tab.sessionStorage.setItem(tokenItem(view), token.token);
      tab.opener = null;
      tab.location.href = view;
    } else {
      // No tab of ours (a popup blocker): only a URL can carry the token to the one opened.
      window.open(`${view}?token=${encodeURIComponent(token.token)}`, '_blank', 'noopener');
    }
  } catch (error) {
    if (tab) tab.close();
    page.fail(`Open the live view of ${id}`, error);
  }
}

async function download(path, name) {
  try {
    await saveAs(api, path, name);
  } catch (error) {
    page.fail(`Download ${name}`, error);
  }
}

function recordingRow(recording) {
  const id = recording.session_id;
  const row = element('tr');
  row.dataset.id = id;
  const cells = ['id', 'state', 'started', 'length', 'actions', 'frames', 'size'].map((name) => {
    const cell = element('td', `col-${name}`);
    row.append(cell);
    return cell;
  });
  cells[0].append(element('code', '', id));
  const links = element('td', 'col-links');
  const replay = element('a', 'replay', 'Replay');
  replay.href = `/replay?session=${encodeURIComponent(id)}`;
  const video = element('button', 'video', 'Video');
  video.type = 'button';
  video.addEventListener('click', () => download(`${sessionPath(id)}/recording.mp4`, `${id}.mp4`));
  const trajectory = element('button', 'export', 'Trajectory');
  trajectory.type = 'button';
  trajectory.addEventListener('click', () => download(`${sessionPath(id)}/trajectory.zip`, `${id}.zip`));
  links.append(replay, video, trajectory);
  row.append(links);
  return row;
}

function showRecordings(recordings, more, now) {
  ui.recordingsMore.hidden = !more;
  ui.recordingsMore.textContent = `(the newest ${recordings.length})`;
  const seen = new Set();
  for (const recording of recordings) {
    const id = recording.session_id;
    seen.add(id);
    let row = recordingRows.get(id);
    if (!row) {
      row = recordingRow(recording);
      recordingRows.set(id, row);
    }
    const cell = (name) => row.querySelector(`td.col-${name}`);
    cell('state').textContent = recording.state === 'stopped' && recording.stop_reason
      ? `stopped (${recording.stop_reason})` : recording.state;
    cell('started').textContent = `${age(recording.started_at, now)} ago`;
    cell('length').textContent = recordingLength(recording, now);
    cell('actions').textContent = String(recording.actions);
    cell('frames').textContent = String(recording.frames);
    cell('size').textContent = bytes(recording.bytes);
    ui.recordingRows.append(row); // in the server's order: newest first
  }
  for (const [id, row] of recordingRows) {
    if (!seen.has(id)) {
      row.remove();
      recordingRows.delete(id);
    }
  }
  ui.recordings.hidden = recordings.length === 0;
}

function showEnded(ended, more, now) {
  ui.ended.hidden = ended.length === 0;
  ui.endedCount.textContent = more ? `the newest ${ended.length}` : String(ended.length);
  ui.endedList.replaceChildren(...ended.slice(0, ENDED_SHOWN).map((session) => {
    const item = element('li');
    item.append(element('code', '', session.id), ` ${session.state} · created ${age(session.created_at, now)} ago`);
    if (session.failure && session.failure.reason) {
      item.append(element('span', 'error', ` · ${session.failure.reason}`));
    }
    return item;
  }));
}

// A poll's failure stays on the bar until a poll goes through (or another message replaces it).
function pollFailed(what, error) {
  page.fail(what, error);
  pollError = page.ui.errorText.textContent;
}

function pollSucceeded() {
  if (pollError && page.ui.errorText.textContent === pollError) page.clearError();
  pollError = '';
}

// Every live session (as many pages as there are), and only the newest ended ones: a key
// that ran thousands of sessions does not fetch them all every poll.
async function listSessions(caller) {
  const live = [];
  let cursor = null;
  do {
    const query = new URLSearchParams([...LIVE_STATES].map((state) => ['state', state]));
    query.set('limit', '1000');
    if (cursor) query.set('cursor', cursor);
    const page = await caller.json('GET', `/v1/sessions?${query}`);
    live.push(...page.sessions);
    cursor = page.next_cursor;
  } while (cursor);
  const ended = await caller.json(
    'GET', `/v1/sessions?state=stopped&state=failed&limit=${ENDED_SHOWN}`);
  return { sessions: [...live, ...ended.sessions], moreEnded: Boolean(ended.next_cursor) };
}

async function refresh(caller) {
  let sessions;
  let moreEnded;
  try {
    ({ sessions, moreEnded } = await listSessions(caller));
  } catch (error) {
    if (api === caller) pollFailed('Could not list the sessions', error);
    return;
  }
  // Whom each live session waits for; a session that ends meanwhile simply has none.
  const live = sessions.filter((s) => s.state === 'running' || s.state === 'paused');
  const answers = await Promise.allSettled(
    live.map((s) => caller.json('GET', `${sessionPath(s.id)}/handoff`)));
  const help = new Map();
  answers.forEach((answer, i) => {
    if (answer.status === 'fulfilled') help.set(live[i].id, answer.value);
  });
  let recordings = null;
  let moreRecordings = false;
  if (recordingsServed) {
    try {
      const listed = await caller.json('GET', `/v1/recordings?limit=${RECORDINGS_SHOWN}`);
      ({ recordings } = listed);
      moreRecordings = Boolean(listed.next_cursor);
    } catch (error) {
      // A server without recordings: the section stays hidden.
      if (error.status === 404) recordingsServed = false;
      else if (api === caller) pollFailed('Could not list the recordings', error);
    }
  }
  if (api !== caller) return;
  if (recordings !== null || !recordingsServed) pollSucceeded();
  const now = Date.now();
  const arranged = arrange(sessions, help);
  const shown = new Set(arranged.live.map((s) => s.id));
  for (const [id, card] of cards) {
    if (!shown.has(id)) {
      card.dispose();
      cards.delete(id);
    }
  }
  for (const session of arranged.live) {
    let card = cards.get(session.id);
    if (!card) {
      card = new Card(session);
      cards.set(session.id, card);
    }
    card.update(session, help.get(session.id), now);
    ui.cards.append(card.el); // append moves: the cards take the arranged order
  }
  ui.empty.hidden = arranged.live.length > 0;
  showEnded(arranged.ended, moreEnded, now);
  if (recordings) showRecordings(recordings, moreRecordings, now);
  await Promise.allSettled([...cards.values()].map((card) => card.fetchThumbnail(caller)));
  ui.pollState.textContent = `updated ${new Date(now).toLocaleTimeString()}`;
}

// One poll at a time: a refresh asked for during one runs right after it (also when the
// tab signed in again meanwhile: the old key's poll is dropped, the new one's runs).
async function tick() {
  if (!api) return;
  if (busy) {
    again = true;
    return;
  }
  busy = true;
  const caller = api;
  try {
    await refresh(caller);
  } finally {
    busy = false;
  }
  clearTimeout(timer);
  if (!api) return;
  if (api === caller) status.polls += 1;
  if (again || api !== caller) {
    again = false;
    tick();
    return;
  }
  timer = setTimeout(tick, POLL_MS);
}

function refreshNow() {
  clearTimeout(timer);
  tick();
}

ui.createForm.addEventListener('submit', async (event) => {
  event.preventDefault();
  if (!api) return;
  const body = {};
  const url = ui.startUrl.value.trim();
  if (url) body.browser = { start_url: url };
  if (ui.record.checked) body.record = true;
  ui.create.disabled = true;
  ui.create.textContent = 'Starting…';
  try {
    await api.json('POST', '/v1/sessions', body);
    ui.startUrl.value = '';
  } catch (error) {
    page.fail('New desktop', error);
  } finally {
    ui.create.disabled = false;
    ui.create.textContent = 'New desktop';
    refreshNow();
  }
});

page.start();
