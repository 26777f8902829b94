"""A fake agent that breaks the protocol on purpose: ``python hostile_agent.py MODE SOCKET``.

It speaks raw bytes (frames made with hyperframe and hpack, the libraries under h2), so it
can send what no HTTP/2 library would. Modes answer the first request (hello, stream 1)
correctly unless they attack the handshake, then attack the host's next request
(stream 3); ``slow_hang_up`` attacks nothing, it only closes its end late. It serves one
connection, then exits.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    SettingsFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
encoder = Encoder()


def headers(stream_id: int, fields: list[tuple[str, str]], flags: set[str]) -> bytes:
    frame = HeadersFrame(stream_id)
    frame.data = encoder.encode(fields)
    frame.flags = set(flags)
    return frame.serialize()


def data(stream_id: int, payload: bytes, end: bool = False) -> bytes:
    frame = DataFrame(stream_id)
    frame.data = payload
    if end:
        frame.flags.add("END_STREAM")
    return frame.serialize()


def settings(ack: bool = False) -> bytes:
    frame = SettingsFrame(0)
    if ack:
        frame.flags.add("ACK")
    return frame.serialize()


class Peer:
    """Reads the host's frames in a thread and notes which request streams it opened."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.opened: list[int] = []
        self.goaway = False
        self.lock = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        try:
            while len(buf) < len(PREFACE):
                chunk = self.conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
            buf = buf[len(PREFACE):]
            while True:
                while len(buf) >= 9:
                    frame, length = Frame.parse_frame_header(memoryview(buf[:9]))
                    if len(buf) < 9 + length:
                        break
                    if isinstance(frame, HeadersFrame):
                        with self.lock:
                            self.opened.append(frame.stream_id)
                            self.lock.notify_all()
                    elif isinstance(frame, GoAwayFrame):
                        with self.lock:
                            self.goaway = True
                            self.lock.notify_all()
                    buf = buf[9 + length:]
                chunk = self.conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
        except OSError:
            return

    def wait_for(self, stream_id: int) -> None:
        with self.lock:
            self.lock.wait_for(lambda: stream_id in self.opened, timeout=30)

    def wait_for_goaway(self) -> None:
        with self.lock:
            self.lock.wait_for(lambda: self.goaway, timeout=30)

    def send(self, raw: bytes) -> None:
        self.conn.sendall(raw)


def hello(peer: Peer, protocol: int = 1) -> None:
    peer.wait_for(1)
    body = json.dumps({"protocol": protocol, "agent": "hostile", "calls": []}).encode()
    peer.send(headers(1, [(":status", "200"), ("content-type", "application/json")],
                      {"END_HEADERS"}) + data(1, body, end=True))


def forever(peer: Peer, raw: bytes) -> None:
    block = raw * max(1, 65536 // len(raw))
    while True:
        peer.send(block)


def attack(mode: str, peer: Peer) -> None:
    ok_head = [(":status", "200"), ("content-type", "application/octet-stream")]
    if mode == "garbage":
        peer.send(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" + os.urandom(4096))
        time.sleep(30)
    elif mode == "silent":
        time.sleep(60)
    peer.send(settings() + settings(ack=True))
    if mode == "huge_frame":
        # A DATA frame announcing 16 MiB - 1, then its payload trickling in.
        peer.send(b"\xff\xff\xff\x00\x00\x00\x00\x00\x01")
        while True:
            peer.send(b"x" * 1024)
            time.sleep(0.001)
    elif mode == "settings_flood":
        forever(peer, settings())
    elif mode == "ping_flood":
        ping = PingFrame(0)
        ping.opaque_data = b"12345678"
        forever(peer, ping.serialize())
    elif mode == "no_answer":
        time.sleep(60)
    elif mode == "wrong_version":
        hello(peer, protocol=2)
        time.sleep(30)
    elif mode == "hello_refused":
        peer.wait_for(1)
        peer.send(headers(1, [(":status", "404")], {"END_HEADERS", "END_STREAM"}))
        time.sleep(30)
    hello(peer)
    if mode == "slow_hang_up":
        # A well-behaved agent, only slow to close its end once the host says goodbye.
        peer.wait_for_goaway()
        time.sleep(0.3)
        peer.conn.close()
        return
    peer.wait_for(3)
    if mode == "continuation_flood":
        peer.send(headers(3, ok_head, set()))
        frame = ContinuationFrame(3)
        frame.data = b"\x00" * 16384
        forever(peer, frame.serialize())
    elif mode == "header_bomb":
        # Small on the wire, huge once decoded: one large header, then indexed copies.
        peer.send(headers(3, ok_head + [("x-big", "a" * 4000)] * 2000, {"END_HEADERS"}))
        time.sleep(30)
    elif mode == "unknown_stream":
        peer.send(headers(7, ok_head, {"END_HEADERS"}) + data(7, b"hello", end=True))
        time.sleep(30)
    elif mode == "data_before_headers":
        peer.send(data(3, b"out of order"))
        time.sleep(30)
    elif mode == "data_flood":
        peer.send(headers(3, ok_head, {"END_HEADERS"}))
        forever(peer, data(3, b"z" * 16384))
    elif mode == "output_flood":
        # Well-formed exec records, far more of them than the host asked for.
        record = b"o" + (65536).to_bytes(4, "big") + b"o" * 65536
        peer.send(headers(3, [(":status", "200")], {"END_HEADERS"}))
        forever(peer, b"".join(data(3, record[i : i + 16384])
                               for i in range(0, len(record), 16384)))
    elif mode == "never_answers_call":
        time.sleep(60)
    elif mode == "status_no_end":
        # A well-formed status record, then neither END_STREAM nor anything else.
        status = json.dumps({"exit_code": 0, "signal": None, "timed_out": False,
                             "stdout_truncated": False, "stderr_truncated": False}).encode()
        peer.send(headers(3, [(":status", "200")], {"END_HEADERS"})
                  + data(3, b"x" + len(status).to_bytes(4, "big") + status))
        time.sleep(30)
    elif mode.startswith("calls_"):
        # Answers on the call stream (POST /v1/calls) whose framing lies.
        calls_head = [(":status", "200"), ("content-type", "application/vnd.deskbox.calls")]
        if mode == "calls_wrong_type":
            peer.send(headers(3, ok_head, {"END_HEADERS"}) + data(3, b"\x00" * 64))
        elif mode == "calls_huge_head":
            peer.send(headers(3, calls_head, {"END_HEADERS"})
                      + data(3, (1 << 30).to_bytes(4, "big") + b"{" * 4096))
        else:
            head = b"{not json" if mode == "calls_bad_head" else json.dumps(
                {"status": 200, "content_type": "application/json", "size": 300 << 20}).encode()
            peer.send(headers(3, calls_head, {"END_HEADERS"})
                      + data(3, len(head).to_bytes(4, "big") + head + b"x" * 16000))
        time.sleep(30)
    elif mode == "bad_records":
        peer.send(headers(3, [(":status", "200")], {"END_HEADERS"})
                  + data(3, b"q\xff\xff\xff\xff"))
        time.sleep(30)
    else:
        raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    print("ready", flush=True)
    conn, _ = server.accept()
    try:
        attack(mode, Peer(conn))
    except OSError:
        pass  # the host hung up on us: that is what it should do


if __name__ == "__main__":
    main()
