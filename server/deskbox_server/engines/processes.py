"""Child processes of one desktop, started in their own process groups and always reaped."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ProcessSet", "become_subreaper", "kill_owned"]


@dataclass
class _Child:
    name: str
    popen: subprocess.Popen[bytes]


@dataclass
class ProcessSet:
    """The processes one desktop started; ``stop`` ends them all, whichever died first."""

    children: list[_Child] = field(default_factory=list)
    # Inherited by every descendant, even those that leave our process groups (Chromium's
    # crash handler calls setsid), so stop() can find them all in /proc.
    marker: str = field(default_factory=lambda: f"DESKBOX_PROCESS_SET={uuid.uuid4().hex}")
    # Whose desktops these are (a server's state dir, hashed), inherited alike: a server
    # killed outright leaves them running, and the next one finds them by it (kill_owned).
    owner: str | None = None

    def spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        pass_fds: Sequence[int] = (),
        cwd: str | None = None,
    ) -> subprocess.Popen[bytes]:
        popen = subprocess.Popen(
            list(argv),
            env={**env, _MARKER_NAME: self.marker.split("=", 1)[1],
                 **({_OWNER_NAME: self.owner} if self.owner is not None else {})},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=tuple(pass_fds),
            # Its own group, so that stop() also reaches what it forks (Chromium's zygote,
            # renderers) without touching ours.
            start_new_session=True,
        )
        self.children.append(_Child(name, popen))
        return popen

    def failure(self) -> str | None:
        """Why the desktop is broken (a process has exited), or None while all run."""
        for child in self.children:
            code = child.popen.poll()
            if code is not None:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
                return f"{child.name} (pid {child.popen.pid}) {how}"
        return None

    def pids(self) -> list[int]:
        return [child.popen.pid for child in self.children]

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM every group (last started first), SIGKILL what is left after ``grace_s``."""
        for child in reversed(self.children):
            _signal_group(child.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            try:
                child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for child in self.children:
            # The group leader may be gone while its children live on: kill the group anyway.
            _signal_group(child.popen.pid, signal.SIGKILL)
            if child.popen.poll() is None:
                child.popen.wait()
        self.children.clear()
        self._kill_marked(grace_s)

    def _kill_marked(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (pids := _pids_with_environ(self.marker.encode())) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)  # the kernel needs a moment to tear the killed processes down
        _reap_orphans()


_MARKER_NAME = "DESKBOX_PROCESS_SET"
_OWNER_NAME = "DESKBOX_PROCESS_OWNER"
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Have orphans of our desktops (Chromium's helpers) reparent to us, so we can reap them.

    Without it they become zombies of PID 1, which in a container may never reap them.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def kill_owned(owner: str, spare: Collection[str] = (), timeout_s: float = 2.0) -> int:
    """SIGKILL every process of desktops of ``owner`` (ProcessSet.owner) but those of the
    sets whose markers are in ``spare``; how many there were. What a server killed
    outright left: its processes were reparented away from it, and nobody ends them."""
    entry = f"{_OWNER_NAME}={owner}".encode()
    spared = {marker.encode() for marker in spare}
    deadline = time.monotonic() + timeout_s
    killed: set[int] = set()
    while time.monotonic() < deadline:
        pids = [pid for pid, environ in _environs() if entry in environ
                and spared.isdisjoint(environ)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(pids)
        time.sleep(0.01)  # the kernel needs a moment to tear the killed processes down
    _reap_orphans()
    return len(killed)


def _reap_orphans() -> None:
    """Reap zombie children that are not ours by Popen: those we got as a subreaper.

    Every process ProcessSet spawns leads its own session (pid == sid); an orphan never does.
    """
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat_file:
                fields = stat_file.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        state, ppid, sid = fields[0], int(fields[1]), int(fields[4])
        if state == b"Z" and ppid == me and sid != int(name):
            try:
                os.waitpid(int(name), os.WNOHANG)
            except ChildProcessError:
                pass


def _pids_with_environ(entry: bytes) -> list[int]:
    """Live processes whose environment holds ``entry`` (zombies have an empty environ)."""
    return [pid for pid, environ in _environs() if entry in environ]


def _environs() -> Iterator[tuple[int, list[bytes]]]:
    """Every process's pid and environment entries (a zombie's are empty)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                entries = environ.read().split(b"\0")
        except OSError:
            continue
        yield int(name), entries


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
