// A recording's trajectory as the replay page shows it, apart from the DOM
// (vnc/test/replay.test.js): the NDJSON read into frames and steps, which frame a step
// shows, where its click marker goes on the displayed image, and its one-line description.
//
// Entries (docs/API.md): {"kind": "frame", "frame": n, "t"}; {"kind": "action", "t",
// "end_t", "source", "action", "screen_point", "frame_before", "frame_after", "screenshot",
// "error", "skipped"}; {"kind": "refused", "t", "end_t", "source", "sent", "dialect", "error"} (a call
// refused before it became actions); {"kind": "event", "t", "event"}; each with "seq".
// Kinds this page does not know are left out, so that a newer server's trajectory still
// plays.

export function parseTrajectory(text) {
  const entries = [];
  let unreadable = 0;
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    try {
      const entry = JSON.parse(line);
      if (entry && typeof entry === 'object' && typeof entry.kind === 'string') entries.push(entry);
      else unreadable += 1;
    } catch {
      unreadable += 1;
    }
  }
  return { entries, unreadable };
}

const number = (value) => (typeof value === 'number' && Number.isFinite(value) ? value : 0);
const bySeq = (a, b) => number(a.t) - number(b.t) || number(a.seq) - number(b.seq);

// frames: [{frame, t}] in time order; steps: the actions and events in time order.
export function timeline(entries) {
  const frames = entries
    .filter((e) => e.kind === 'frame' && Number.isInteger(e.frame))
    .map((e) => ({ frame: e.frame, t: number(e.t), seq: number(e.seq) }))
    .sort(bySeq);
  const steps = entries.filter((e) => ['action', 'refused', 'event'].includes(e.kind)).sort(bySeq);
  return { frames, steps };
}

// The last frame captured at or before t; the first one if none was yet (a step at the
// very start still shows the screen).
export function frameAt(frames, t) {
  if (frames.length === 0) return null;
  let low = 0;
  let high = frames.length - 1;
  let found = -1;
  while (low <= high) {
    const mid = (low + high) >> 1;
    if (frames[mid].t <= t) {
      found = mid;
      low = mid + 1;
    } else {
      high = mid - 1;
    }
  }
  return frames[found === -1 ? 0 : found].frame;
}

// What a step shows: the screen after an action when the recording has it, else the screen
// as it was at the step's time.
export function frameFor(step, frames) {
  if (step.kind === 'action' && Number.isInteger(step.frame_after)) return step.frame_after;
  return frameAt(frames, number(step.t));
}

// The marker's offset in the displayed image (box: its rendered size) of a point in screen
// pixels (screen: the recording's size).
export function markerPosition(point, screen, box) {
  if (!point || !screen || !(screen.width > 0) || !(screen.height > 0)) return null;
  return {
    left: (number(point.x) * box.width) / screen.width,
    top: (number(point.y) * box.height) / screen.height,
  };
}

export function sourceLabel(source) {
  if (!source) return '';
  if (source.type === 'api_key') return 'agent';
  if (source.type === 'token') return 'human';
  return String(source.type || '');
}

const at = (a) => (a.x !== undefined && a.y !== undefined && a.x !== null ? ` (${a.x}, ${a.y})` : '');
const cut = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}…` : text);

function describeAction(a) {
  const modifiers = Array.isArray(a.modifiers) && a.modifiers.length ? `${a.modifiers.join('+')}+` : '';
  // Left is the default, kept unsaid (a recording leaves it out); another button is said.
  const button = a.button && a.button !== 'left' ? `${a.button} ` : '';
  switch (a.type) {
    case 'click': {
      const times = { 2: 'double ', 3: 'triple ' }[a.count] || '';
      return `${modifiers}${times}${button}click${at(a)}`;
    }
    case 'move': return `${modifiers}move${at(a)}`;
    case 'mouse_down': return `${button}mouse down${at(a)}`;
    case 'mouse_up': return `${button}mouse up${at(a)}`;
    case 'drag': {
      const path = Array.isArray(a.path) ? a.path : [];
      if (path.length < 2) return `${modifiers}${button}drag`;
      const [x0, y0] = path[0];
      const [x1, y1] = path[path.length - 1];
      return `${modifiers}${button}drag (${x0}, ${y0}) → (${x1}, ${y1})`;
    }
    case 'scroll': {
      const parts = [];
      if (a.dy) parts.push(`${a.dy > 0 ? 'down' : 'up'} ${Math.abs(a.dy)}`);
      if (a.dx) parts.push(`${a.dx > 0 ? 'right' : 'left'} ${Math.abs(a.dx)}`);
      return `${modifiers}scroll ${parts.join(', ') || '0'}${at(a)}`;
    }
    case 'type':
      if (typeof a.text === 'string') return `type “${cut(a.text, 40)}”`;
      return a.secret ? `type the secret ${a.secret}` : 'type';
    case 'key': return `key ${a.keys}`;
    case 'hold_key': return `hold ${a.keys} for ${a.duration_s} s`;
    case 'wait': return `wait ${a.ms} ms`;
    case 'clipboard_set': return 'set the clipboard';
    case 'clipboard_get': return 'read the clipboard';
    case 'cursor_position': return 'cursor position';
    case 'screen_size': return 'screen size';
    default: return String(a.type || 'action').replace(/_/g, ' ');
  }
}

// A call refused before it became actions: a vendor's tool input as sent (Anthropic's
// {action: "left_click"}, OpenAI's {type: "click"}, {call_id, action} or {call_id,
// actions}), or a body whose actions were unreadable.
function describeRefused(step) {
  const body = step.sent && typeof step.sent === 'object' ? step.sent : {};
  const inner = body.action && typeof body.action === 'object' ? body.action : body;
  let what = typeof body.action === 'string' ? body.action : inner.type;
  if (typeof what !== 'string' && Array.isArray(body.actions)) what = `${body.actions.length} actions`;
  const call = typeof what === 'string' ? what.replace(/_/g, ' ') : 'call';
  return `${step.dialect ? `${step.dialect} ` : ''}${call} (refused)`;
}

export function describe(step) {
  if (step.kind === 'refused') return describeRefused(step);
  // An action after the one that failed in its batch: recorded as asked, never done.
  if (step.kind === 'action') {
    return describeAction(step.action || {}) + (step.skipped ? ' (not done)' : '');
  }
  const event = step.event || {};
  const what = String(event.type || 'event').replace(/_/g, ' ');
  const state = event.state && event.state !== event.type ? ` ${event.state}` : '';
  return `${what}${state}${event.reason ? `: ${event.reason}` : ''}`;
}

export function clock(t) {
  const s = Math.max(0, number(t));
  const minutes = Math.floor(s / 60);
  const seconds = (s - minutes * 60).toFixed(1).padStart(4, '0');
  return `${minutes}:${seconds}`;
}

// How long playing waits between two steps: their real gap, kept watchable.
export function playDelay(from, to) {
  const gap = (number(to.t) - number(from.t)) * 1000;
  return Math.min(2000, Math.max(300, gap));
}
