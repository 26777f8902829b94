"""The host's QMP connection to a new QEMU: its first connect, and handing QEMU a descriptor.

QEMU binds its QMP socket before it listens on it, and the host connects as soon as the
socket's file exists: a connection in that window is refused. Under load it was hit
(a VM's create failed with "Connection refused" and its QEMU was killed). A stand-in for
QEMU's side of QMP (a seam of ours: the greeting and qmp_capabilities) binds, waits, then
listens; the host must wait for it, and still fail at once when QEMU has exited.
"""

from __future__ import annotations

import asyncio
import json
import os
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


def fd_receiver(path: Path, received: list[tuple[dict[str, object], bytes]]) -> threading.Thread:
    """QEMU's side of ``getfd``: the greeting, then one command read with the descriptor
    that rides on it (SCM_RIGHTS), whose first bytes it notes, and the answer."""
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listening.bind(str(path))
    listening.listen(1)

    def serve() -> None:
        with listening:
            connection, _ = listening.accept()
        with connection:
            connection.sendall(json.dumps(GREETING).encode() + b"\n")
            for expected in ("qmp_capabilities", "getfd"):
                data, fds = b"", []
                while not data.endswith(b"\n"):
                    chunk, ancillary, _, _ = connection.recvmsg(4096, socket.CMSG_SPACE(4))
                    data += chunk
                    fds += [int.from_bytes(c[2][:4], "little") for c in ancillary]
                asked = json.loads(data)
                assert asked["execute"] == expected
                if fds:
                    received.append((asked, os.pread(fds[0], 5, 0)))
                    os.close(fds[0])
                connection.sendall(json.dumps({"return": {}, "id": asked["id"]}).encode()
                                   + b"\n")
            connection.recv(1)  # until the host closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_handing_qemu_a_descriptor_leaves_the_connection_non_blocking(tmp_path: Path) -> None:
    """The descriptor goes through a duplicate of the QMP socket, which shares its open
    file: made blocking there, the event loop's own socket turned blocking too."""
    paths = VmPaths(runtime=tmp_path)
    received: list[tuple[dict[str, object], bytes]] = []
    peer = fd_receiver(paths.qmp, received)
    handed = tmp_path / "handed"
    handed.write_bytes(b"state of the guest")
    qemu = subprocess.Popen(["sleep", "30"])

    async def hand_over() -> bool:
        client = await _connect_qmp(paths, qemu, 10)
        try:
            with handed.open("rb") as file:
                await client.send_fd("deskbox-save", file.fileno(), timeout_s=10)
            return os.get_blocking(client._writer.get_extra_info("socket").fileno())
        finally:
            await client.close()

    try:
        blocking = asyncio.run(hand_over())
    finally:
        qemu.kill()
        qemu.wait()
    peer.join(timeout=5)
    assert [(asked["arguments"], head) for asked, head in received] == [
        ({"fdname": "deskbox-save"}, b"state")]
    assert blocking is False
