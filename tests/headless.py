"""Helpers for live-view tests and the benchmark: a headless Chromium on the host (loopback
only) driven over DevTools, what the live view's canvas shows, and a TCP→websocket bridge
for VNC clients that speak TCP."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from .cdp_page import CdpPage

__all__ = ["canvas_pixel", "headless_chromium", "websocket_bridge"]

CHROMIUM = "/usr/bin/chromium"


@contextmanager
def headless_chromium(profile: Path, width: int = 1280, height: int = 860,
                      extra_args: Sequence[str] = ()) -> Iterator[str]:
    """A headless Chromium (``extra_args`` added to its command line); yields its DevTools
    base URL (http://127.0.0.1:PORT)."""
    profile.mkdir(parents=True, exist_ok=True)
    # Its temporary files (and singleton socket: a short path) in a directory of ours.
    scratch = tempfile.mkdtemp(prefix="dbx-chromium-")
    process = subprocess.Popen(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0", f"--user-data-dir={profile}",
         f"--window-size={width},{height}", *extra_args, "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "TMPDIR": scratch},
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            assert process.poll() is None, "chromium exited"
            assert time.monotonic() < deadline, "chromium did not open DevTools"
            time.sleep(0.02)
        yield f"http://127.0.0.1:{int(port_file.read_text().split()[0])}"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        shutil.rmtree(scratch, ignore_errors=True)


_PIXEL = """(() => {{
  const view = window.__deskbox, canvas = document.querySelector('#screen canvas');
  if (!view || !view.connected || !canvas || canvas.width < {x}) return null;
  const d = canvas.getContext('2d').getImageData({x}, {y}, 1, 1).data;
  return [d[0], d[1], d[2]];
}})()"""


def canvas_pixel(cdp: CdpPage, x: int, y: int, expected: tuple[int, int, int]) -> Any:
    """The live view page's canvas at desktop pixel (x, y), once it is ``expected`` or after
    20 s (then what it was, for the assertion's message)."""
    deadline = time.monotonic() + 20
    while (pixel := cdp.evaluate(_PIXEL.format(x=x, y=y))) != list(expected):
        if time.monotonic() > deadline:
            return pixel
        time.sleep(0.05)
    return pixel


@contextmanager
def websocket_bridge(ws_url: str) -> Iterator[int]:
    """A port on 127.0.0.1 whose connections are carried over ``ws_url`` (binary)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def pump(conn: socket.socket) -> None:
        with conn, connect(ws_url, subprotocols=["binary"], compression=None,  # type: ignore[list-item]
                           max_size=None, open_timeout=20) as ws:

            def down() -> None:
                with suppress(ConnectionClosed, OSError):
                    for message in ws:
                        conn.sendall(message if isinstance(message, bytes) else b"")
                with suppress(OSError):
                    conn.shutdown(socket.SHUT_WR)

            reader = threading.Thread(target=down, daemon=True)
            reader.start()
            with suppress(ConnectionClosed, OSError):
                while data := conn.recv(65536):
                    ws.send(data)
            ws.close()
            reader.join(timeout=10)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=pump, args=(conn,), daemon=True)
            thread.start()
            threads.append(thread)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        server.join(timeout=5)
        listener.close()
        for thread in threads:
            thread.join(timeout=10)
