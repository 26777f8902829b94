// What the console shows of the sessions, apart from the DOM (vnc/test/console.test.js):
// their order, which buttons each state offers, when a thumbnail is fetched again, and the
// human forms of ages and sizes.

export const LIVE_STATES = new Set(['starting', 'running', 'paused', 'hibernated', 'stopping']);
export const isLive = (state) => LIVE_STATES.has(state);

// The thumbnail's size: 320 wide, the display's aspect kept.
export function thumbnailScale(display) {
  const width = 320;
  const height = display && display.width > 0 && display.height > 0
    ? Math.max(1, Math.round((width * display.height) / display.width)) : 200;
  return `${width}x${height}`;
}

// Live sessions, those whose agent asked for help first (the longest waiting first), then
// the newest first; ended ones apart, newest first. helpById: id → the handoff resource.
export function arrange(sessions, helpById = new Map()) {
  const needsHelp = (s) => Boolean(helpById.get(s.id) && helpById.get(s.id).needs_help);
  const time = (iso) => Date.parse(iso) || 0;
  const newestFirst = (a, b) => time(b.created_at) - time(a.created_at);
  const asked = (s) => time(helpById.get(s.id).requested_at);
  const live = sessions.filter((s) => isLive(s.state));
  const helped = live.filter(needsHelp).sort((a, b) => asked(a) - asked(b));
  const others = live.filter((s) => !needsHelp(s)).sort(newestFirst);
  const ended = sessions.filter((s) => !isLive(s.state)).sort(newestFirst);
  return { live: [...helped, ...others], ended };
}

// The buttons of a card in each state (the server refuses the others anyway, with a 409).
export function actionsFor(state) {
  switch (state) {
    case 'running': return ['view', 'control', 'pause', 'hibernate', 'delete'];
    case 'paused': return ['view', 'resume', 'delete'];
    case 'hibernated': return ['resume', 'delete'];
    case 'starting': return ['delete'];
    default: return [];
  }
}

// A running screen changes: fetched on every poll. A paused or hibernated session answers
// its frozen frame: fetched once per pause. Starting and stopping ones have no screen.
export function thumbnailDue(state, shownState) {
  if (state === 'running') return true;
  if (state === 'paused' || state === 'hibernated') return shownState !== state;
  return false;
}

export function duration(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d`;
}

export const age = (iso, now) => duration((now - Date.parse(iso)) / 1000);

export function bytes(n) {
  if (!Number.isFinite(n) || n < 1024) return `${n || 0} B`;
  const units = ['KB', 'MB', 'GB', 'TB'];
  let value = n / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value >= 10 ? Math.round(value) : value.toFixed(1)} ${units[unit]}`;
}

// A recording's length: to its stop, or so far.
export function recordingLength(recording, now) {
  const end = recording.stopped_at ? Date.parse(recording.stopped_at) : now;
  return duration((end - Date.parse(recording.started_at)) / 1000);
}
