"""An impostor agent, run INSIDE a sandbox by its own python3: ``impostor_agent.py MODE PROTOCOL``.

It unlinks the agent's socket and listens at its path; after the session's next restore the
host connects to it (tests/impostors.py). It answers the handshake (``hello`` of the
protocol it is given) and ``info`` (a 64x48 screen) as an agent would, so the session
resumes (modes ``mute`` and ``no_hello`` do not: they say nothing at all, or nothing to
``hello``; ``huge_screen`` tells a 16384x16384 screen); then it misbehaves on the first
``act`` (or ``exec`` in the ``EXEC_MODES``) the host sends it; in the ``bad_frame`` mode
it offers ``grab_deflated`` and answers it with pixels one byte short of its screen. The
desktop's calls come as messages of the call stream (``POST /v1/calls``), answered there.
HTTP/2 through the image's own h2 (/usr/lib/deskbox-agent); what no h2 would send is
written as raw frames. Only the standard library and those wheels: this runs in the
image's Python 3.11.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import threading
import time
import zlib
from collections.abc import Iterator, Sequence

sys.path.append("/usr/lib/deskbox-agent")

from h2.config import H2Configuration  # noqa: E402
from h2.connection import H2Connection  # noqa: E402
from h2.events import DataReceived, RequestReceived, StreamEnded  # noqa: E402
from hpack import Encoder  # noqa: E402
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame  # noqa: E402

PATH = "/tmp/.X11-unix/deskbox-agent"
READY = "/tmp/impostor-ready"
SCREEN = (64, 48)
MIB = 1 << 20
PARTS = "application/vnd.deskbox.parts"
MEDIA = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}
MAGIC = {"image/jpeg": b"\xff\xd8\xff", "image/png": b"\x89PNG\r\n\x1a\n",
         "image/webp": b"RIFF\0\0\0\0WEBP"}
IMAGE_LIMIT = SCREEN[0] * SCREEN[1] * 4 + 64 * 1024  # what the host accepts (desktop.py)


def raw_headers(stream_id: int, fields: Sequence[tuple[str | bytes, str | bytes]],
                flags: set[str]) -> bytes:
    frame = HeadersFrame(stream_id)
    frame.data = Encoder().encode(fields)
    for flag in flags:
        frame.flags.add(flag)
    return bytes(frame.serialize())


def raw_data(stream_id: int, payload: bytes) -> bytes:
    frame = DataFrame(stream_id)
    frame.data = payload
    return bytes(frame.serialize())


class Peer:
    """The server side of one host connection."""

    def __init__(self, conn: socket.socket) -> None:
        self.sock = conn
        self.h2 = H2Connection(H2Configuration(client_side=False))
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def pump(self) -> list[object]:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError
        events = self.h2.receive_data(chunk)
        for event in events:
            if isinstance(event, DataReceived):
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        self.flush()
        return list(events)

    def requests(self) -> Iterator[tuple[int, str, bytes]]:
        """(stream, path, body) of each whole request, in order."""
        paths: dict[int, str] = {}
        bodies: dict[int, bytearray] = {}
        while True:
            for event in self.pump():
                if isinstance(event, RequestReceived):
                    paths[event.stream_id] = dict(event.headers)[b":path"].decode()
                    bodies[event.stream_id] = bytearray()
                elif isinstance(event, DataReceived):
                    bodies[event.stream_id] += event.data
                elif isinstance(event, StreamEnded):
                    yield event.stream_id, paths.pop(event.stream_id), bytes(
                        bodies.pop(event.stream_id))

    def send(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """Within the host's flow-control windows, as a well-behaved agent would."""
        view = memoryview(data)
        while view:
            room = min(self.h2.local_flow_control_window(stream_id),
                       self.h2.max_outbound_frame_size, len(view))
            if room <= 0:
                self.pump()
                continue
            self.h2.send_data(stream_id, bytes(view[:room]))
            self.flush()
            view = view[room:]
        if end:
            self.h2.end_stream(stream_id)
            self.flush()

    def answer(self, stream_id: int, content_type: str, body: bytes) -> None:
        self.h2.send_headers(stream_id, [(":status", "200"), ("content-type", content_type)])
        self.send(stream_id, body, end=True)

    def drain(self) -> None:
        """Reads (and so acks the host's pings) but answers nothing more."""
        while True:
            self.pump()


def forever(peer: Peer, raw: bytes) -> None:
    while True:
        peer.sock.sendall(raw)


def parts_reply(request: bytes, length: int, sent: int) -> bytes:
    """An ``act`` answer: each screenshot of the request an image part claiming ``length``
    bytes, with ``sent`` bytes of it in the body."""
    results: list[object] = []
    data = b""
    for action in json.loads(request)["actions"]:
        if action.get("type") != "screenshot":
            results.append(None)
            continue
        media = MEDIA[action.get("format") or "jpeg"]
        results.append({"type": "image", "media_type": media, "width": SCREEN[0],
                        "height": SCREEN[1], "offset": 0, "length": length})
        data = (MAGIC[media] + b"\0" * sent)[:sent]
    header = json.dumps({"results": results, "settled": True, "screenshot": None}).encode()
    return len(header).to_bytes(4, "big") + header + data


def short_frame() -> bytes:
    """A ``grab_deflated`` answer whose pixels inflate to one byte short of the screen."""
    pixels = zlib.compress(b"\0" * (SCREEN[0] * SCREEN[1] * 4 - 1), 1)
    header = json.dumps({"width": SCREEN[0], "height": SCREEN[1], "pixel_format": "bgrx",
                         "encoding": "deflate",
                         "pixels": {"offset": 0, "length": len(pixels)}}).encode()
    return len(header).to_bytes(4, "big") + header + pixels


def misbehave(mode: str, peer: Peer, stream_id: int, request: bytes) -> None:
    ok_head = [(":status", "200"), ("content-type", PARTS)]
    if mode == "garbage":
        while True:  # random bytes where frames belong, the same every run
            peer.sock.sendall(random.Random(14).randbytes(64 * 1024))
            time.sleep(0.01)
    elif mode == "huge_frame":
        # A DATA frame announcing 16 MiB - 1, its payload trickling in.
        peer.sock.sendall(b"\xff\xff\xff\x00\x00" + stream_id.to_bytes(4, "big"))
        forever(peer, b"x" * 1024)
    elif mode == "header_block":
        # A header block that never ends: HEADERS without END_HEADERS, CONTINUATIONs after.
        peer.sock.sendall(raw_headers(stream_id, ok_head, set()))
        frame = ContinuationFrame(stream_id)
        frame.data = b"\0" * 16384
        forever(peer, bytes(frame.serialize()))
    elif mode == "claims_300mib":
        peer.send(stream_id, calls_reply(PARTS, parts_reply(request, 300 * MIB, 1024)))
    elif mode == "image_too_big":
        peer.send(stream_id, calls_reply(
            PARTS, parts_reply(request, IMAGE_LIMIT + 1, IMAGE_LIMIT + 1)))
    elif mode == "silent":
        pass
    elif mode == "wrong_stream":
        # The answer on a stream the host never opened; its own stream gets nothing.
        peer.sock.sendall(raw_headers(stream_id + 100, ok_head, {"END_HEADERS"})
                          + raw_data(stream_id + 100, b"hello"))
    elif mode == "out_of_order":
        # The answer of another call (an ``info``) where the ``act`` answer belongs.
        peer.send(stream_id, calls_reply("application/json", json.dumps(
            {"display": ":1", "width": SCREEN[0], "height": SCREEN[1]}).encode()))
    elif mode == "act_flood":
        # A reply announcing a body far over what the call may answer, then that body.
        head = json.dumps({"status": 200, "content_type": PARTS, "size": 1 << 31}).encode()
        peer.send(stream_id, len(head).to_bytes(4, "big") + head)
        forever(peer, raw_data(stream_id, b"z" * 16384))
    elif mode == "deep_json":
        # A reply head of brackets nested past what json.loads can recurse into.
        head = b"[" * 2000 + b"]" * 2000  # within the 4096 bytes a head may have
        peer.send(stream_id, len(head).to_bytes(4, "big") + head)
    elif mode == "huge_screen":
        # Never reached by a host that checks the screen ``info`` gave: an image of it.
        peer.send(stream_id, calls_reply(PARTS, parts_reply(request, 600 * MIB, 1024)))
    elif mode == "bad_status":
        # A status of three digits by str.isdigit(), the middle one a superscript two.
        peer.sock.sendall(raw_headers(stream_id, [(b":status", b"2\xb20")], {"END_HEADERS"}))
    elif mode == "bad_record":
        # A whole exec record, in one frame, of a kind the protocol does not have.
        peer.h2.send_headers(stream_id, [(":status", "200")])
        peer.flush()
        peer.send(stream_id, b"z" + (0).to_bytes(4, "big"))
    elif mode == "exec_flood":
        # Well-formed stdout records within the windows, endlessly: only the output cap
        # the host asked for stops it.
        peer.h2.send_headers(stream_id, [(":status", "200")])
        peer.flush()
        record = b"o" + (65536).to_bytes(4, "big") + b"o" * 65536
        while True:
            peer.send(stream_id, record)
    else:
        raise SystemExit(f"unknown mode {mode}")
    peer.drain()


CALLS = "application/vnd.deskbox.calls"
EXEC_MODES = {"exec_flood", "bad_status", "bad_record"}  # misbehave on /v1/exec, not on act


def calls_reply(content_type: str, body: bytes) -> bytes:
    """One reply message of the call stream (PROTOCOL.md, POST /v1/calls)."""
    head = json.dumps({"status": 200, "content_type": content_type, "size": len(body)}).encode()
    return len(head).to_bytes(4, "big") + head + body


class Calls:
    """The call messages of one call stream, as their bytes arrive."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[dict[str, object]]:
        self.buffer += data
        while len(self.buffer) >= 4:
            size = int.from_bytes(self.buffer[:4], "big")
            if len(self.buffer) < 4 + size:
                return
            message = json.loads(bytes(self.buffer[4:4 + size]))
            del self.buffer[:4 + size]
            yield message


def serve(mode: str, protocol: int, conn: socket.socket) -> None:
    try:
        if mode == "mute":  # reads all, says nothing, not even its SETTINGS
            while conn.recv(65536):
                pass
            return
        peer = Peer(conn)
        screen = (16384, 16384) if mode == "huge_screen" else SCREEN
        paths: dict[int, str] = {}
        calls: dict[int, Calls] = {}
        while True:
            for event in peer.pump():
                if isinstance(event, RequestReceived):
                    path = dict(event.headers)[b":path"].decode()
                    paths[event.stream_id] = path
                    if path == "/v1/hello" and mode == "no_hello":
                        peer.drain()
                    elif path == "/v1/hello":
                        offered = ["grab_deflated"] if mode == "bad_frame" else []
                        peer.answer(event.stream_id, "application/json", json.dumps(
                            {"protocol": protocol, "agent": "impostor",
                             "calls": offered}).encode())
                    elif path == "/v1/calls":
                        calls[event.stream_id] = Calls()
                        peer.h2.send_headers(event.stream_id,
                                             [(":status", "200"), ("content-type", CALLS)])
                        peer.flush()
                    elif path == "/v1/exec" and mode in EXEC_MODES:
                        misbehave(mode, peer, event.stream_id, b"")
                elif isinstance(event, DataReceived) and event.stream_id in calls:
                    for message in calls[event.stream_id].feed(event.data):
                        if message["call"] == "info":
                            peer.send(event.stream_id, calls_reply("application/json", json.dumps(
                                {"display": ":1", "width": screen[0], "height": screen[1],
                                 "capture": "impostor"}).encode()))
                        elif message["call"] == "grab_deflated" and mode == "bad_frame":
                            peer.send(event.stream_id, calls_reply(PARTS, short_frame()))
                            peer.drain()
                        elif message["call"] == "act":
                            misbehave(mode, peer, event.stream_id,
                                      json.dumps(message["args"]).encode())
    except (OSError, EOFError):
        pass  # the host hung up: what it should do
    finally:
        conn.close()


def main() -> None:
    mode, protocol = sys.argv[1], int(sys.argv[2])
    os.unlink(PATH)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(PATH)
    listener.listen(16)
    open(READY, "w").close()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(mode, protocol, conn), daemon=True).start()


if __name__ == "__main__":
    main()
