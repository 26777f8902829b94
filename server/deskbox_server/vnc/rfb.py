"""The RFB protocol (RFC 6143) as the proxy needs it: handshakes and client messages.

Sans I/O: :class:`ClientMessages` is fed the bytes a viewer sends after its ClientInit
and returns the bytes to pass on to the VNC server. It frames every message by its type
and length, drops input (KeyEvent, PointerEvent, ClientCutText) from read-only viewers,
re-encodes cut text for the VNC server (:func:`utf8_cut_text`),
drops SetDesktopSize from everyone (viewers do not resize the session's screen) and
the lock keys (:data:`LOCK_KEYSYMS`) from everyone, and
raises :class:`RfbError` for anything it does not know, so that the proxy closes. With
``hold_off_layout_keys`` it stops before each press of a key that types a character off
the layout (``held_key``) until the caller passes it on (:meth:`let_through`) or has had
it typed another way (:meth:`typed_elsewhere`: that press and its release are dropped).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from ..keys import off_layout_char

__all__ = [
    "INPUT_TYPES",
    "LOCK_KEYSYMS",
    "SECURITY_NONE",
    "ClientMessages",
    "RfbError",
    "client_version",
    "parse_server_version",
]

SECURITY_NONE = 1
SET_PIXEL_FORMAT = 0
SET_ENCODINGS = 2
FRAMEBUFFER_UPDATE_REQUEST = 3
KEY_EVENT = 4
POINTER_EVENT = 5
CLIENT_CUT_TEXT = 6
ENABLE_CONTINUOUS_UPDATES = 150
CLIENT_FENCE = 248
SET_DESKTOP_SIZE = 251
INPUT_TYPES = frozenset({KEY_EVENT, POINTER_EVENT, CLIENT_CUT_TEXT})
# Caps_Lock, Shift_Lock, Num_Lock. A viewer's keysyms already carry what its locks mean
# ("A" with Caps Lock on, KP_Home with Num Lock off); x11vnc applied the lock a second
# time in the session's X server, where it stayed: capitals came out small (the agent's
# typing too, until someone pressed it again) and the keypad's Home typed 7.
LOCK_KEYSYMS = frozenset({0xFFE5, 0xFFE6, 0xFF7F})
MAX_HELD_KEYS = 64  # released when a viewer leaves; a keyboard holds far fewer
MAX_ENCODINGS = 1024
MAX_FENCE_PAYLOAD = 64
MAX_SCREENS = 64
_VERSION = re.compile(rb"^RFB ([0-9]{3})\.([0-9]{3})\n$")


class RfbError(Exception):
    """The peer broke the protocol (or asked for what we refuse): close the connection."""


def _version(data: bytes) -> tuple[int, int]:
    match = _VERSION.match(data)
    if match is None:
        raise RfbError("not an RFB ProtocolVersion message")
    return int(match[1]), int(match[2])


def parse_server_version(data: bytes) -> tuple[int, int]:
    major, minor = _version(data)
    if (major, minor) < (3, 8):
        raise RfbError(f"the VNC server speaks RFB {major}.{minor}; 3.8 is needed")
    return major, minor


def client_version(data: bytes) -> int:
    """The minor version (3, 7 or 8) a viewer chose; others map as RFC 6143 says."""
    major, minor = _version(data)
    if major != 3:
        raise RfbError(f"unsupported RFB version {major}.{minor}")
    if minor >= 8:
        return 8  # 3.889 (Apple) and later minors behave as 3.8
    if minor == 7:
        return 7
    return 3  # 3.3, and what RFC 6143 says to treat as 3.3


def _keysym(key_event: bytes) -> int:
    return int.from_bytes(key_event[4:8], "big")


def utf8_cut_text(message: bytes) -> bytes:
    """A plain ClientCutText (Latin-1, RFC 6143) with its text in UTF-8, as the session's
    x11vnc reads it: "été" pasted in a viewer reached the session as "\ufffdt\ufffd".
    The extended clipboard's (a negative length) passes as it is."""
    (length,) = struct.unpack_from(">i", message, 4)
    if length <= 0:
        return message
    text = message[8:].decode("latin-1").encode()
    return message[:4] + struct.pack(">I", len(text)) + text


@dataclass
class ClientMessages:
    """Frames and filters the viewer's messages (after ClientInit)."""

    allow_input: bool
    max_cut_text: int = 1 << 20
    # Called with each key and pointer message let through (a recording keeps them).
    on_input: Callable[[bytes], None] | None = None
    # Stop before the press of a key that types a character off the layout, its keysym in
    # ``held_key``, until :meth:`let_through` or :meth:`typed_elsewhere` (the proxy has the
    # agent type it: x11vnc's own mapping of such a key races its press).
    hold_off_layout_keys: bool = False
    held_key: int | None = None
    # What becomes of the held press at the next feed: passed on, or dropped.
    _decision: Literal["pass", "drop"] | None = None
    _typed_elsewhere: set[int] = field(default_factory=set)  # their releases are dropped
    dropped: dict[int, int] = field(default_factory=dict)
    forwarded: int = 0
    _buffer: bytearray = field(default_factory=bytearray)
    # What the viewer holds down now (keysyms; the button mask where the pointer is).
    _keys_down: set[int] = field(default_factory=set)
    _buttons: int = 0
    _pointer: bytes = b"\0\0\0\0"

    def feed(self, data: bytes) -> bytes:
        """Bytes to pass to the server (whole messages only); RfbError on a bad message."""
        self._buffer += data
        out = bytearray()
        while self._buffer:
            size = self._message_size()
            if size is None or len(self._buffer) < size:
                break
            kind = self._buffer[0]
            if kind == KEY_EVENT and self.allow_input and self._held_back():
                break
            message = bytes(self._buffer[:size])
            del self._buffer[:size]
            if kind == SET_DESKTOP_SIZE or (kind in INPUT_TYPES and not self.allow_input) or (
                    kind == KEY_EVENT and _keysym(message) in LOCK_KEYSYMS):
                self.dropped[kind] = self.dropped.get(kind, 0) + 1
                continue
            if kind == KEY_EVENT and self._typed_there(message):
                if self.on_input is not None:
                    self.on_input(message)
                continue
            if kind == CLIENT_CUT_TEXT:
                message = utf8_cut_text(message)
                # Latin-1 grows in UTF-8 (up to twice): past the bound, the session's VNC
                # server would drop the viewer without a word.
                if len(message) - 8 > self.max_cut_text:
                    raise RfbError(f"ClientCutText of {len(message) - 8} bytes in UTF-8")
            out += message
            self.forwarded += 1
            if kind == KEY_EVENT:
                keysym = int(struct.unpack_from(">I", message, 4)[0])
                if message[1]:
                    # Bounded: a hostile viewer presses any number of distinct keysyms.
                    if len(self._keys_down) < MAX_HELD_KEYS:
                        self._keys_down.add(keysym)
                else:
                    self._keys_down.discard(keysym)
            elif kind == POINTER_EVENT:
                self._buttons, self._pointer = message[1], message[2:6]
            if self.on_input is not None and kind in (KEY_EVENT, POINTER_EVENT):
                self.on_input(message)
        return bytes(out)

    def _held_back(self) -> bool:
        """Whether the key message at the head waits for the caller's decision."""
        if self._decision is not None:
            return False
        keysym = int.from_bytes(self._buffer[4:8], "big")
        if self.hold_off_layout_keys and self._buffer[1] and off_layout_char(keysym):
            self.held_key = keysym
            return True
        return False

    def _typed_there(self, message: bytes) -> bool:
        """Whether this key message is dropped: the held press typed elsewhere, or the
        release of a key that was."""
        keysym = int.from_bytes(message[4:8], "big")
        if message[1]:
            dropped, self._decision = self._decision == "drop", None
            if dropped and len(self._typed_elsewhere) < MAX_HELD_KEYS:
                self._typed_elsewhere.add(keysym)
            return dropped
        if keysym in self._typed_elsewhere:
            self._typed_elsewhere.discard(keysym)
            return True
        return False

    def let_through(self) -> None:
        """The held press (``held_key``) goes on to the server at the next :meth:`feed`."""
        self.held_key, self._decision = None, "pass"

    def typed_elsewhere(self) -> None:
        """The held press was typed another way: the next :meth:`feed` drops it, and its
        release when it comes."""
        self.held_key, self._decision = None, "drop"

    def releases(self) -> bytes:
        """The messages that let go of what the viewer still holds down: a viewer that
        went away with Shift or a button pressed left them pressed for the agent (its
        typing came out in capitals, its clicks as releases only)."""
        out = bytearray()
        for keysym in sorted(self._keys_down):
            out += struct.pack(">BBxxI", KEY_EVENT, 0, keysym)
        if self._buttons:
            out += bytes([POINTER_EVENT, 0]) + self._pointer
        self._keys_down.clear()
        self._buttons = 0
        return bytes(out)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message held back."""
        return len(self._buffer)

    def _message_size(self) -> int | None:
        """The whole size of the message at the head of the buffer; None: need more."""
        buf = self._buffer
        kind = buf[0]
        if kind == SET_PIXEL_FORMAT:
            return 20
        if kind == FRAMEBUFFER_UPDATE_REQUEST:
            return 10
        if kind == KEY_EVENT:
            return 8
        if kind == POINTER_EVENT:
            return 6
        if kind == ENABLE_CONTINUOUS_UPDATES:
            return 10
        if kind == SET_ENCODINGS:
            if len(buf) < 4:
                return None
            count = int(struct.unpack_from(">H", buf, 2)[0])
            if count > MAX_ENCODINGS:
                raise RfbError(f"SetEncodings with {count} encodings")
            return 4 + 4 * count
        if kind == CLIENT_CUT_TEXT:
            if len(buf) < 8:
                return None
            length = int(struct.unpack_from(">i", buf, 4)[0])
            # A negative length is the extended clipboard's (its payload is -length bytes):
            # noVNC answers the capabilities libvncserver announces.
            size = abs(length)
            if size > self.max_cut_text:
                raise RfbError(f"ClientCutText of {size} bytes")
            return 8 + size
        if kind == CLIENT_FENCE:
            if len(buf) < 9:
                return None
            length = int(buf[8])
            if length > MAX_FENCE_PAYLOAD:
                raise RfbError(f"ClientFence with a {length}-byte payload")
            return 9 + length
        if kind == SET_DESKTOP_SIZE:
            if len(buf) < 8:
                return None
            screens = int(buf[6])
            if screens > MAX_SCREENS:
                raise RfbError(f"SetDesktopSize with {screens} screens")
            return 8 + 16 * screens
        raise RfbError(f"unknown client message type {kind}")
