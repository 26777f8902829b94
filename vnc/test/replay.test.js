// The replay page's logic (static/replay-model.js) without a browser: the trajectory read,
// which frame a step shows, where the marker goes, and how steps read.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  clock, describe, frameAt, frameFor, markerPosition, parseTrajectory, playDelay, sourceLabel,
  timeline,
} from '../static/replay-model.js';

const TRAJECTORY = [
  { seq: 0, kind: 'frame', frame: 0, t: 0.0 },
  { seq: 1, kind: 'frame', frame: 1, t: 0.5 },
  { seq: 2, kind: 'action', t: 0.8, end_t: 0.85, source: { type: 'api_key', id: 'key_1' },
    action: { type: 'click', x: 640, y: 400 }, screen_point: { x: 640, y: 400 },
    frame_before: 1, frame_after: 2, screenshot: null, error: null },
  { seq: 4, kind: 'frame', frame: 2, t: 0.9 },
  { seq: 3, kind: 'event', t: 0.9, event: { type: 'paused' } },
  { seq: 5, kind: 'action', t: 1.2, end_t: 1.2, source: { type: 'token', id: 'tok_1' },
    action: { type: 'key', keys: 'ctrl+t' }, screen_point: null, frame_before: 2,
    frame_after: null, screenshot: null, error: { type: 'conflict', message: 'paused' } },
  { seq: 6, kind: 'annotation', t: 1.3, note: 'a kind from a newer server' },
].map((entry) => JSON.stringify(entry)).join('\n');

test('the NDJSON is read line by line; a broken line is counted, not fatal', () => {
  const { entries, unreadable } = parseTrajectory(`${TRAJECTORY}\n{"kind": tru\n\n[1]\n`);
  assert.equal(entries.length, 7);
  assert.equal(unreadable, 2);
});

test('frames and steps in time order; unknown kinds left out', () => {
  const { frames, steps } = timeline(parseTrajectory(TRAJECTORY).entries);
  assert.deepEqual(frames.map((f) => f.frame), [0, 1, 2]);
  assert.deepEqual(steps.map((s) => s.seq), [2, 3, 5]);
});

test("a step shows frame_after, else the frame at or before its time", () => {
  const { frames, steps } = timeline(parseTrajectory(TRAJECTORY).entries);
  assert.equal(frameFor(steps[0], frames), 2);
  assert.equal(frameFor(steps[1], frames), 2); // the event at 0.9: frame 2 was taken at 0.9
  assert.equal(frameFor(steps[2], frames), 2); // no frame_after
  assert.equal(frameAt(frames, 0.49), 0);
  assert.equal(frameAt(frames, -1), 0);
  assert.equal(frameAt([], 1), null);
  assert.equal(frameFor({ kind: 'event', t: 3 }, []), null);
});

test('the marker is the screen point scaled to the displayed image', () => {
  const screen = { width: 1280, height: 800 };
  assert.deepEqual(markerPosition({ x: 640, y: 400 }, screen, { width: 640, height: 400 }),
    { left: 320, top: 200 });
  assert.deepEqual(markerPosition({ x: 1280, y: 0 }, screen, { width: 960, height: 600 }),
    { left: 960, top: 0 });
  assert.equal(markerPosition(null, screen, { width: 1, height: 1 }), null);
  assert.equal(markerPosition({ x: 1, y: 1 }, { width: 0, height: 0 }, { width: 1, height: 1 }), null);
});

test('steps read as a person says them', () => {
  const action = (a) => describe({ kind: 'action', action: a });
  assert.equal(action({ type: 'click', x: 640, y: 400 }), 'click (640, 400)');
  assert.equal(action({ type: 'click', x: 1, y: 2, button: 'right', count: 2, modifiers: ['ctrl'] }),
    'ctrl+double right click (1, 2)');
  assert.equal(action({ type: 'click' }), 'click');
  // A left click is kept without its button (a default, human or agent); older
  // recordings named it: both read alike, and another button is said.
  assert.equal(action({ type: 'click', x: 1, y: 2, button: 'left' }), 'click (1, 2)');
  assert.equal(action({ type: 'click', x: 1, y: 2, button: 'right' }), 'right click (1, 2)');
  assert.equal(action({ type: 'type', text: 'hello' }), 'type “hello”');
  assert.equal(action({ type: 'type', text: 'x'.repeat(60) }).length, 47);
  assert.equal(action({ type: 'key', keys: 'ctrl+t' }), 'key ctrl+t');
  assert.equal(action({ type: 'scroll', x: 5, y: 6, dx: 0, dy: 3 }), 'scroll down 3 (5, 6)');
  assert.equal(action({ type: 'drag', path: [[1, 2], [3, 4], [5, 6]] }), 'drag (1, 2) → (5, 6)');
  // A drag, a press or a release of another button said it as left's; modifiers held
  // through a drag or a move were not said.
  assert.equal(action({ type: 'drag', path: [[1, 2], [5, 6]], button: 'right', modifiers: ['shift'] }),
    'shift+right drag (1, 2) → (5, 6)');
  assert.equal(action({ type: 'mouse_down', x: 1, y: 2, button: 'middle' }), 'middle mouse down (1, 2)');
  assert.equal(action({ type: 'mouse_up', button: 'right' }), 'right mouse up');
  assert.equal(action({ type: 'mouse_down', x: 1, y: 2 }), 'mouse down (1, 2)');
  assert.equal(action({ type: 'move', x: 1, y: 2, modifiers: ['alt'] }), 'alt+move (1, 2)');
  assert.equal(action({ type: 'zoom' }), 'zoom');
  assert.equal(action('not an action'), 'action');
  assert.equal(describe({ kind: 'action', action: { type: 'key', keys: 'a' }, skipped: true }),
    'key a (not done)');
  const refused = (dialect, sent) => describe({ kind: 'refused', dialect, sent });
  assert.equal(refused('anthropic', { action: 'left_click', coordinate: [1, 2] }),
    'anthropic left click (refused)');
  assert.equal(refused('openai', { call_id: 'c', action: { type: 'double_click' } }),
    'openai double click (refused)');
  assert.equal(refused('openai', { call_id: 'c', actions: [{}, {}] }), 'openai 2 actions (refused)');
  assert.equal(refused(undefined, [1]), 'call (refused)');
  assert.deepEqual(timeline([{ kind: 'refused', t: 1, seq: 0 }, { kind: 'later', t: 0 }]).steps,
    [{ kind: 'refused', t: 1, seq: 0 }]);
  assert.equal(describe({ kind: 'event', event: { type: 'help_requested', reason: 'a captcha' } }),
    'help requested: a captcha');
  assert.equal(describe({ kind: 'event', event: { type: 'state', state: 'paused' } }), 'state paused');
  assert.equal(sourceLabel({ type: 'api_key', id: 'k' }), 'agent');
  assert.equal(sourceLabel({ type: 'token', id: 't' }), 'human');
});

test('times and the pace of playing', () => {
  assert.equal(clock(0), '0:00.0');
  assert.equal(clock(75.25), '1:15.3');
  assert.equal(playDelay({ t: 1 }, { t: 1.01 }), 300);
  assert.equal(playDelay({ t: 1 }, { t: 2 }), 1000);
  assert.equal(playDelay({ t: 1 }, { t: 60 }), 2000);
});
