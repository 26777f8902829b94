"""The host's first connection to a new QEMU's QMP socket.

QEMU binds its QMP socket before it listens on it, and the host connects as soon as the
socket's file exists: a connection in that window is refused. Under load it was hit
(a VM's create failed with "Connection refused" and its QEMU was killed). A stand-in for
QEMU's side of QMP (a seam of ours: the greeting and qmp_capabilities) binds, waits, then
listens; the host must wait for it, and still fail at once when QEMU has exited.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from deskbox_server.engines.vm.guest import _connect_qmp
from deskbox_server.engines.vm.qemu import VmPaths
from deskbox_server.errors import SessionFailed

GREETING = {"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0}},
                    "capabilities": []}}


def late_listener(path: Path, listens_after_s: float) -> threading.Thread:
    """Binds ``path`` now, listens ``listens_after_s`` later, then speaks QMP's opening."""
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(path))

    def serve() -> None:
        with bound:
            time.sleep(listens_after_s)
            bound.listen(1)
            connection, _ = bound.accept()
            with connection, connection.makefile("rwb") as stream:
                stream.write(json.dumps(GREETING).encode() + b"\n")
                stream.flush()
                asked = json.loads(stream.readline())
                assert asked["execute"] == "qmp_capabilities"
                stream.write(json.dumps({"return": {}, "id": asked["id"]}).encode() + b"\n")
                stream.flush()
                stream.readline()  # until the host closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_socket_bound_before_it_listens_is_waited_for(tmp_path: Path) -> None:
    paths = VmPaths(runtime=tmp_path)
    listener = late_listener(paths.qmp, 0.3)
    qemu = subprocess.Popen(["sleep", "30"])  # stands for the running QEMU

    async def connect() -> None:
        client = await _connect_qmp(paths, qemu, 10)
        await client.close()

    try:
        asyncio.run(connect())
    finally:
        qemu.kill()
        qemu.wait()
    listener.join(timeout=5)


def test_a_refusing_socket_of_an_exited_qemu_fails_at_once(tmp_path: Path) -> None:
    paths = VmPaths(runtime=tmp_path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(paths.qmp))  # never listens
        qemu = subprocess.Popen(["true"])
        qemu.wait()
        started = time.monotonic()
        with pytest.raises(SessionFailed, match="Connection refused"):
            asyncio.run(_connect_qmp(paths, qemu, 10))
    assert time.monotonic() - started < 2
