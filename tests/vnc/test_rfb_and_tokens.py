"""The RFB client-message filter and the token store, without I/O."""

from __future__ import annotations

import struct

import pytest

from deskbox_server.errors import Forbidden, NotFound, Unauthorized
from deskbox_server.sessions import tokens as tokens_module
from deskbox_server.sessions.tokens import TokenStore
from deskbox_server.vnc.rfb import MAX_HELD_KEYS, ClientMessages, RfbError, client_version

from ..fleet_table import FleetTable

PIXEL_FORMAT = b"\x00\x00\x00\x00" + bytes(16)
ENCODINGS = struct.pack(">BxHii", 2, 2, 0, 7)
UPDATE = struct.pack(">BBHHHH", 3, 1, 0, 0, 100, 100)
KEY = struct.pack(">BBxxI", 4, 1, 0x61)
POINTER = struct.pack(">BBHH", 5, 1, 10, 20)
CUT = struct.pack(">BxxxI", 6, 5) + b"hello"
EXTENDED_CUT = struct.pack(">Bxxxi", 6, -8) + bytes(8)


def test_control_passes_everything_in_order() -> None:
    stream = PIXEL_FORMAT + ENCODINGS + UPDATE + KEY + POINTER + CUT + EXTENDED_CUT
    assert ClientMessages(allow_input=True).feed(stream) == stream


def test_cut_text_reaches_the_server_in_utf8() -> None:
    """RFB's cut text is Latin-1; the session's x11vnc reads UTF-8 ("été" came out as
    "\ufffdt\ufffd"). The extended clipboard's passes as it is."""
    latin1 = "thé, 100 €?".encode("latin-1", errors="replace")
    sent = struct.pack(">BxxxI", 6, len(latin1)) + latin1 + UPDATE + EXTENDED_CUT
    wanted = "thé, 100 ??".encode()
    assert ClientMessages(allow_input=True).feed(sent) == (
        struct.pack(">BxxxI", 6, len(wanted)) + wanted + UPDATE + EXTENDED_CUT)


def test_cut_text_past_the_bound_once_in_utf8_is_refused() -> None:
    """600 kB of "é" are 1.2 MB in UTF-8: passed on, the session's VNC server (1 MiB at
    most) dropped the viewer without a reason."""
    latin1 = "é".encode("latin-1") * 600_000
    with pytest.raises(RfbError, match="ClientCutText of 1200000 bytes in UTF-8"):
        ClientMessages(allow_input=True).feed(struct.pack(">BxxxI", 6, len(latin1)) + latin1)


def key(keysym: int, down: bool = True) -> bytes:
    return struct.pack(">BBxxI", 4, int(down), keysym)


def test_a_key_off_the_layout_is_held_until_passed_on_or_typed_elsewhere() -> None:
    """The press of a key that types a character a US layout lacks (ü 0xFC, 中 as Unicode)
    stops the feed, and what follows it waits; passed on, it goes to the server; typed
    elsewhere (the agent), it and its release are dropped and still reach ``on_input``
    (a recording keeps them). Releases, ASCII and function keys pass at once."""
    seen: list[bytes] = []
    messages = ClientMessages(allow_input=True, hold_off_layout_keys=True,
                              on_input=seen.append)
    after = key(0x62) + POINTER
    sent = key(0x61) + key(0xFF0D) + key(0xFC) + key(0xFC, False) + after
    assert messages.feed(sent) == key(0x61) + key(0xFF0D)
    assert messages.held_key == 0xFC
    assert messages.feed(b"") == b""  # undecided: still held
    messages.typed_elsewhere()
    assert messages.held_key is None
    assert messages.feed(key(0x01004E2D)) == after  # ü's release dropped too
    assert messages.held_key == 0x01004E2D
    messages.let_through()
    assert messages.feed(key(0x01004E2D, False)) == key(0x01004E2D) + key(0x01004E2D, False)
    assert seen == [key(0x61), key(0xFF0D), key(0xFC), key(0xFC, False), key(0x62), POINTER,
                    key(0x01004E2D), key(0x01004E2D, False)]
    # What a leaving viewer's releases let go of: what went to the server and stayed down.
    assert messages.releases() == (key(0x61, False) + key(0x62, False) + key(0xFF0D, False)
                                   + b"\x05\x00" + POINTER[2:])
    # Without the hold, and for a view-only viewer, nothing is held back.
    assert ClientMessages(allow_input=True).feed(key(0xFC)) == key(0xFC)
    view = ClientMessages(allow_input=False, hold_off_layout_keys=True)
    assert view.feed(key(0xFC) + UPDATE) == UPDATE and view.held_key is None


def test_view_drops_input_and_keeps_the_rest() -> None:
    messages = ClientMessages(allow_input=False)
    out = messages.feed(KEY + UPDATE + POINTER + CUT + ENCODINGS + EXTENDED_CUT)
    assert out == UPDATE + ENCODINGS
    assert messages.dropped == {4: 1, 5: 1, 6: 2}


def test_messages_split_anywhere_are_framed() -> None:
    stream = ENCODINGS + POINTER + CUT + UPDATE
    messages = ClientMessages(allow_input=False)
    out = b"".join(messages.feed(stream[i : i + 1]) for i in range(len(stream)))
    assert out == ENCODINGS + UPDATE and messages.pending == 0


def test_set_desktop_size_is_dropped_for_everyone() -> None:
    resize = struct.pack(">BxHHBx", 251, 800, 600, 1) + bytes(16)
    assert ClientMessages(allow_input=True).feed(resize + UPDATE) == UPDATE


@pytest.mark.parametrize("bad", [
    b"\xff\x00\x00\x00",  # QEMU: never announced
    b"\x07",  # unknown type
    struct.pack(">BxxxI", 6, 10_000_000),  # cut text over the cap
    struct.pack(">BxH", 2, 5000),  # too many encodings
])
def test_unknown_or_oversized_messages_raise(bad: bytes) -> None:
    with pytest.raises(RfbError):
        ClientMessages(allow_input=True).feed(bad)


def test_client_versions() -> None:
    assert client_version(b"RFB 003.008\n") == 8
    assert client_version(b"RFB 003.007\n") == 7
    assert client_version(b"RFB 003.003\n") == 3
    assert client_version(b"RFB 003.889\n") == 8
    with pytest.raises(RfbError):
        client_version(b"GET / HTTP/1.1\r\n")


async def test_tokens_are_scoped_expire_and_revoke() -> None:
    now = [1000.0]
    store = TokenStore(clock=lambda: now[0])
    token, record = await store.issue("key_a", "ses_1", "view", ttl_s=60)
    assert token not in repr(record) and await store.verify(token, "ses_1", "view") == record
    assert (await store.verify(token, "ses_1", ("view", "control"))).scope == "view"
    with pytest.raises(Forbidden):
        await store.verify(token, "ses_1", "control")
    with pytest.raises(Forbidden):
        await store.verify(token, "ses_2", "view")
    with pytest.raises(Unauthorized):
        await store.verify(token + "x", "ses_1", "view")
    with pytest.raises(NotFound):
        await store.revoke("key_b", "ses_1", record.id)
    await store.revoke("key_a", "ses_1", record.id)
    with pytest.raises(Unauthorized):
        await store.verify(token, "ses_1", "view")
    short, _ = await store.issue("key_a", "ses_1", "control", ttl_s=5)
    now[0] += 5
    with pytest.raises(Unauthorized):
        await store.verify(short, "ses_1", "control")
    assert len(store) == 0


async def test_an_ended_sessions_tokens_say_so_for_a_while_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forgotten at once, an ended session's token was a 401 "invalid session token": the
    live view, polling its status when its picture closed, said "access refused" of a
    session that had simply ended. For a while they answer 404, naming the end."""
    now = [1000.0]
    store = TokenStore(clock=lambda: now[0])
    view, _ = await store.issue("key_a", "ses_1", "view", ttl_s=3600)
    short, _ = await store.issue("key_a", "ses_1", "control", ttl_s=60)
    cdp, _ = await store.issue("key_a", "ses_1", "cdp", ttl_s=3600)
    other, _ = await store.issue("key_a", "ses_2", "view", ttl_s=3600)
    store.forget_session("ses_1", "stopped")
    assert len(store) == 1  # only the live session's token counts against the bound
    with pytest.raises(NotFound, match=r"^session ses_1 ended \(stopped\)$"):
        await store.verify(view, "ses_1", ("view", "control"))
    with pytest.raises(Forbidden):  # its scope or session still decide first
        await store.verify(cdp, "ses_1", "view")
    with pytest.raises(Forbidden):
        await store.verify(view, "ses_2", "view")
    assert (await store.verify(other, "ses_2", "view")).session_id == "ses_2"
    now[0] += 60  # the control token expired: a 401, as any expired token
    with pytest.raises(Unauthorized):
        await store.verify(short, "ses_1", "control")
    with pytest.raises(NotFound):
        await store.verify(view, "ses_1", "view")
    now[0] += 600  # kept ten minutes at most
    with pytest.raises(Unauthorized):
        await store.verify(view, "ses_1", "view")

    # Bounded: the oldest go first.
    monkeypatch.setattr(tokens_module, "_MAX_ENDED", 3)
    ended = []
    for index in range(5):
        token, _ = await store.issue("key_a", f"ses_e{index}", "view", ttl_s=3600)
        store.forget_session(f"ses_e{index}", "failed")
        ended.append(token)
    for index, token in enumerate(ended):
        with pytest.raises(Unauthorized if index < 2 else NotFound):
            await store.verify(token, f"ses_e{index}", "view")
    assert len(store._ended) == 3


async def test_a_fleets_tokens_open_and_close_through_every_server() -> None:
    now = [1000.0]
    table = FleetTable()
    await table.put("ses_1", "key_a", True, "{}")
    one = TokenStore(clock=lambda: now[0], shared=table)
    two = TokenStore(clock=lambda: now[0], shared=table)
    token, record = await one.issue("key_a", "ses_1", "control", ttl_s=60)
    assert (await two.verify(token, "ses_1", "control")).id == record.id
    with pytest.raises(Forbidden):
        await two.verify(token, "ses_1", "view")
    with pytest.raises(Unauthorized):  # the other server knows it only with its session
        await two.verify(token, "ses_2", "control")
    with pytest.raises(NotFound):  # a session the fleet has no record of
        await one.issue("key_a", "ses_9", "view", ttl_s=60)
    with pytest.raises(NotFound):
        await two.revoke("key_b", "ses_1", record.id)
    await two.revoke("key_a", "ses_1", record.id)
    for store in (one, two):
        with pytest.raises(Unauthorized):
            await store.verify(token, "ses_1", "control")
    short, _ = await two.issue("key_a", "ses_1", "view", ttl_s=5)
    now[0] += 5
    with pytest.raises(Unauthorized):
        await one.verify(short, "ses_1", "view")


def test_what_a_viewer_holds_is_released_and_bounded() -> None:
    messages = ClientMessages(allow_input=True)
    downs = b"".join(struct.pack(">BBxxI", 4, 1, 0x10000 + k) for k in range(100))
    messages.feed(downs + struct.pack(">BBxxI", 4, 0, 0x10000) + bytes([5, 1, 0, 10, 0, 20]))
    releases = messages.releases()
    keys = [struct.unpack_from(">BBxxI", releases, i) for i in range(0, len(releases) - 6, 8)]
    assert len(keys) == MAX_HELD_KEYS - 1 and all(down == 0 for _, down, _ in keys)
    assert 0x10000 not in {keysym for _, _, keysym in keys}  # it was let go already
    assert releases[-6:] == bytes([5, 0, 0, 10, 0, 20])  # the button, where it was pressed
    assert messages.releases() == b""
