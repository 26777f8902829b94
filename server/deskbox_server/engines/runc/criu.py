"""Checkpoints of a sandbox with CRIU, through ``runc checkpoint``/``restore`` (pause mode
"hibernate").

CRIU comes from Debian 13 and runs from a private root through a wrapper that
scripts/criu.sh installs (Debian 12's CRIU 3.17 fails on this kernel). On Linux 6.16 and
later the packaged 4.1.1 fails on every TCP socket (the kernel refuses ``SO_PASSCRED`` on
non-unix sockets and CRIU reads it), so scripts/criu.sh rebuilds Debian's source with
scripts/criu-sockopt.patch. runc is given the wrapper as ``--criu``; CRIU reads its further
options from the bundle's ``criu.conf`` (the ``org.criu.config`` annotation oci.py writes).
``network-lock`` must not appear there (CRIU 4.1.1 crashes parsing it in RPC mode): the
wrapper gives runc's CRIU runs ``--network-lock skip`` itself (scripts/criu.sh says why),
and puts an ``iptables-restore`` of the private root on CRIU's PATH for the restores of
checkpoints made with the lock. kerndat.py keeps CRIU's kernel probe cached.

Images are packed into one file of zstd tars (archive.py, mode 0600) in the session
directory (mode 0700).
Where CRIU cannot work, :func:`hibernate_sandbox` raises an error that names the cause, read
from CRIU's own log; the sandbox then runs on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from ...errors import (
    CheckpointUnavailable,
    DeskboxError,
    InsufficientStorage,
    SessionFailed,
    says_no_room,
)
from ..base import StartTogether
from ..network import bring_up_loopback
from . import freezer, restored
from .archive import pack, unpack
from .layout import CRIU_CONFIG, Hook, RuntimeConfig, host_root_gid, memory_limit
from .stream import link_agent

if TYPE_CHECKING:
    from .sandbox import RuncSandbox

__all__ = [
    "CRIU_WRAPPER",
    "Criu",
    "DumpStats",
    "dump",
    "hibernate_sandbox",
    "restore",
    "restore_from",
    "restore_sandbox",
    "scratch_dirs",
    "share_images",
]

log = logging.getLogger("deskbox.runc")

CRIU_WRAPPER = Path(os.environ.get("DESKBOX_CRIU_WRAPPER", "/opt/deskbox/bin/criu"))
# Options for every dump and restore (ARCHITECTURE.md: a desktop needs a large ghost limit).
# CRIU's default log level (4, debug) writes ~70,000 lines per desktop and costs a restore
# ~0.5 s; level 1 keeps the errors, which is what _explain reads.
CRIU_OPTIONS = "ghost-limit 128M\nverbosity=1\n"
# A restore leaves every task stopped: restored.py repairs and checks the sandbox, and the
# host links its X socket, before anything of the sandbox runs.
CRIU_RESTORE_OPTIONS = CRIU_OPTIONS + "leave-stopped\n"
# More pids than the sandbox's limit while CRIU restores it (its helpers count against it).
RESTORE_PIDS_HEADROOM = 64
# A sandbox with a network of its own (egress none) has only loopback: its open TCP
# connections (the browser's to a server running inside it) have both ends in the dump
# and come back with it. Not with egress all/allowlist, whose peers are outside: those
# stay refused rather than dumped and unrestorable.
_OPEN_CONNECTIONS = "tcp-established\n"
# runc restores that network empty (network.py: bring_up_loopback), and a restored
# connection needs 127.0.0.1 before its sockets come back: runc runs the bundle's prestart
# hooks when CRIU has made the namespaces (its "setup-namespaces"), with the init's pid in
# the state on stdin.
_LOOPBACK_HOOK: Hook = {"path": "/bin/sh", "args": [
    "sh", "-c", 'pid=$(sed -n \'s/.*"pid": *\\([0-9][0-9]*\\).*/\\1/p\'); '
    'exec nsenter --target "$pid" --net ip link set lo up']}
_LOG_LIMIT = 1 << 20
# A file system with less free than this took a dump's images to its end.
_FULL_BELOW = 1 << 20
_NOISE = ("rlimit:", "Dumping FAILED", "failed with -1", "exited, status")
_FOREIGN_UNIX = re.compile(r"Unix socket \S+ not found")
_SOCKOPT = re.compile(r"Can't get (\d+):(\d+) opt: Operation not supported")


@dataclass(frozen=True)
class Criu:
    wrapper: Path = CRIU_WRAPPER

    def missing(self) -> str | None:
        """Why CRIU cannot be run at all, or None."""
        if not os.access(self.wrapper, os.X_OK):
            return (f"CRIU 4.1 is not installed ({self.wrapper} is missing): run "
                    "scripts/criu.sh (make setup) as root")
        return None


def _explain(log: Path, stderr: bytes) -> str:
    try:
        text = log.read_bytes()[-_LOG_LIMIT:].decode(errors="replace")
    except OSError:
        text = ""
    # The first specific error: not the rlimit warning CRIU logs as one, nor its summaries.
    errors = [
        line for line in text.splitlines()
        if "Error (" in line and not any(noise in line for noise in _NOISE)
    ]
    for line in errors:
        if _FOREIGN_UNIX.search(line):
            return (
                "CRIU cannot checkpoint the sandbox while a process outside it holds a "
                "connection to it (an X client of the host such as a live viewer): "
                + line.split("): ", 1)[-1]
            )
        if "Connected TCP socket" in line:
            # Only where the sandbox joins a network (egress all/allowlist): its own
            # (egress none) dumps them (_OPEN_CONNECTIONS). CRIU's hint names a flag of
            # its own, which says nothing to a user of the API.
            return (
                "CRIU cannot checkpoint a sandbox with egress all or allowlist while a process "
                "in it holds an open TCP connection (its peer may be outside the sandbox, "
                "where a restore cannot reach it); close it (leave that page, stop that "
                "download) and try again"
            )
        match = _SOCKOPT.search(line)
        if match:
            kernel = os.uname().release
            return (
                "CRIU cannot checkpoint this sandbox on this kernel: this CRIU reads "
                f"socket option {match.group(1)}:{match.group(2)} (SO_PASSCRED) of every "
                "socket, and Linux 6.16 and later (here "
                f"{kernel}) refuse it on non-unix sockets, such as the browser's DevTools "
                "TCP listener; scripts/criu.sh installs a CRIU patched for this "
                "(scripts/criu-sockopt.patch)"
            )
    if errors:
        return "CRIU could not checkpoint the sandbox: " + errors[0].split("): ", 1)[-1]
    message = stderr[-2000:].decode(errors="replace").strip() or "no log"
    return f"CRIU could not checkpoint the sandbox: {message}"


# -- the steps: dump, restore (archive.py packs and unpacks) -------------------------------


@dataclass(frozen=True)
class DumpStats:
    seconds: float
    raw_bytes: int
    compressed_bytes: int


def _runc_criu(
    sandbox: RuncSandbox, criu: Criu, command: str, *args: str
) -> subprocess.CompletedProcess[bytes]:
    """``runc --criu … command args``, ended with the sandbox and bounded (criu_runs.py)."""
    argv = [*sandbox.options.runc.command(), "--criu", str(criu.wrapper), command, *args]
    return sandbox.criu_runs.run(argv, command)


def scratch_dirs(sandbox: RuncSandbox, parent: Path, prefix: str) -> tuple[Path, Path, Path]:
    """A private directory for images that live for moments, with ``images/`` and ``work/``
    in it: in the engine's scratch directory (a tmpfs, scratch.py) if that has room for the
    sandbox's memory limit, which bounds its images; else under ``parent``."""
    base = None
    if sandbox.options.scratch is not None:
        base = sandbox.options.scratch.room(memory_limit(sandbox.bundle))
    if base is None:
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        base = parent
    scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    images, logs = scratch / "images", scratch / "work"
    images.mkdir(mode=0o700)
    logs.mkdir(mode=0o700)
    return scratch, images, logs


def dump(
    sandbox: RuncSandbox, criu: Criu, images: Path, logs: Path, leave_running: bool
) -> int:
    """``runc checkpoint`` the sandbox into ``images``; the raw size in bytes.

    Without ``leave_running`` its processes end. Nothing outside the sandbox may hold a
    connection into it (close the driver first). On failure the sandbox runs on and
    CheckpointUnavailable says why.
    """
    reason = criu.missing()
    if reason is not None:
        raise CheckpointUnavailable(reason)
    stopped = freezer.stopped_tasks(sandbox.container_id)
    if stopped:
        raise CheckpointUnavailable(
            f"a process of the sandbox is stopped (host pid {stopped[0]}, e.g. by SIGSTOP): "
            "it cannot be checkpointed until it runs again"
        )
    config: RuntimeConfig = json.loads((sandbox.bundle / "config.json").read_text())
    own_network = _has_own_network(config)
    (sandbox.bundle / CRIU_CONFIG).write_text(
        CRIU_OPTIONS + (_OPEN_CONNECTIONS if own_network else ""))
    extra = ("--leave-running",) if leave_running else ()
    done = _runc_criu(sandbox, criu, "checkpoint", *extra, "--file-locks",
                      "--image-path", str(images), "--work-path", str(logs),
                      sandbox.container_id)
    if done.returncode != 0:
        reason = _explain(logs / "dump.log", done.stderr)
        if _out_of_room(images, logs / "dump.log", done.stderr):
            # Not something the sandbox cannot do: the server's room, which may come back
            # (several checkpoints at once chose one tmpfs, each seeing it free enough).
            raise InsufficientStorage(f"no room for the checkpoint in {images.parent}: "
                                      f"{reason}")
        raise CheckpointUnavailable(reason)
    return sum(f.stat().st_size for f in images.rglob("*") if f.is_file())


def _out_of_room(images: Path, log: Path, stderr: bytes) -> bool:
    """Whether a dump failed for want of room where its images go: CRIU says so, or the
    file system is full (then its log may not have been written either)."""
    try:
        room = os.statvfs(images)
        if room.f_bavail * room.f_frsize < _FULL_BELOW:
            return True
    except OSError:
        pass
    try:
        said = log.read_bytes()[-_LOG_LIMIT:] + stderr[-2000:]
    except OSError:
        said = stderr[-2000:]
    return says_no_room(said.decode(errors="replace"))


def _has_own_network(config: RuntimeConfig) -> bool:
    """Whether the sandbox has a network namespace of its own (egress none), not one it
    joins (egress all/allowlist: engines/network.py)."""
    namespaces = config.get("linux", {}).get("namespaces", [])
    return any(ns.get("type") == "network" and not ns.get("path") for ns in namespaces)


def share_images(images: Path, gid: int) -> None:
    """Let the sandbox's own gid read ``images``: in a user namespace, CRIU reads most of
    them from inside it, as the restored processes' user (the host's root can still).
    Nothing else of the host runs as that gid, and the images are that sandbox's own.

    The top directory is done last, so that it says the whole tree is done: the copies of
    a fork, restored at once from one tree, then find it shared instead of each doing it
    again (a fork shares it once, right after its dump)."""
    done = images.stat()
    if done.st_gid == gid and done.st_mode & 0o777 == 0o750:
        return
    for directory, subdirectories, files in os.walk(images):
        for name in files:
            path = os.path.join(directory, name)
            os.chown(path, 0, gid, follow_symlinks=False)
            os.chmod(path, 0o640, follow_symlinks=False)
        for name in subdirectories:
            path = os.path.join(directory, name)
            os.chown(path, 0, gid)
            os.chmod(path, 0o750)
    os.chown(images, 0, gid)
    os.chmod(images, 0o750)


def restore(
    sandbox: RuncSandbox, criu: Criu, images: Path, logs: Path,
    together: StartTogether | None = None,
) -> float:
    """``runc restore`` the sandbox's bundle from ``images``, stopped; seal it
    (restored.py), publish its X socket and link its agent's, then let it run (once the
    other copies of its fork are restored too: ``together``).

    The sandbox may be another one than the dumped one (a fork): its bundle names its own
    socket directory, cgroup and limits; the X server inside keeps its display number
    (``sandbox.inner_display``). SessionFailed, naming CRIU's error or the mount that
    differs from the config, if it cannot; the caller then destroys what was restored.
    """
    reason = criu.missing()
    if reason is not None:
        raise SessionFailed(reason)
    started = time.monotonic()
    config: RuntimeConfig = json.loads((sandbox.bundle / "config.json").read_text())
    if _has_own_network(config):
        (sandbox.bundle / CRIU_CONFIG).write_text(CRIU_RESTORE_OPTIONS + _OPEN_CONNECTIONS)
        if config.get("hooks") != {"prestart": [_LOOPBACK_HOOK]}:
            config["hooks"] = {"prestart": [_LOOPBACK_HOOK]}  # for restores only: see above
            (sandbox.bundle / "config.json").write_text(json.dumps(config, indent=2))
    else:
        (sandbox.bundle / CRIU_CONFIG).write_text(CRIU_RESTORE_OPTIONS)
    gid = host_root_gid(config)
    if gid is not None:
        share_images(images, gid)
    pid_file = sandbox.bundle / "init.pid"
    with _pids_headroom(sandbox.bundle, config) as pids_limit:
        _restore_processes(sandbox, criu, images, logs, pid_file)
    pid = int(pid_file.read_text())
    sandbox.adopt_init(pid)
    try:
        if pids_limit is not None:
            sandbox.options.runc.set_pids(sandbox.container_id, pids_limit)
        config = json.loads((sandbox.bundle / "config.json").read_text())
        restored.seal(sandbox.container_id, pid, config)
        bring_up_loopback(pid)
        assert sandbox.display is not None
        sandbox.display.publish(sandbox.socket_dir / f"X{sandbox.inner_display}")
        sandbox.check_xserver_socket()
        # Likewise the agent's socket, if it had one when dumped (else the backend waits
        # for the agent once the sandbox runs: agent_link.ensure_agent_link).
        link_agent(sandbox)
    except BaseException:
        # Stopped, never resumed: nothing of it ran. Kill it; its checkpoint stays.
        with contextlib.suppress(SessionFailed):  # the restore's own error is the one told
            sandbox.options.runc.kill(sandbox.container_id)
            sandbox.options.runc.delete(sandbox.container_id)
        sandbox.release_init()
        raise
    if together is not None:
        together.wait()
    restored.resume(sandbox.container_id)
    return time.monotonic() - started


def _restore_processes(
    sandbox: RuncSandbox, criu: Criu, images: Path, logs: Path, pid_file: Path
) -> None:
    """``runc restore`` of the sandbox's processes from ``images``, left stopped.

    A restore that CRIU fails is tried once more from the same images (a restore only reads
    them): one failed once in a full test run, "Cannot apply seals on memfd: Operation not
    permitted", and not again in 170 hibernate/resume cycles; a session lost to a failure
    that does not repeat costs its user more than a second try. SessionFailed with CRIU's
    reason if the second fails too (a deadline or a destroy is not tried again, nor a
    restore whose images are gone or changed under it: its snapshot deleted meanwhile)."""
    first: str | None = None
    images_before = _image_files(images)
    while True:
        pid_file.unlink(missing_ok=True)
        (logs / "restore.log").unlink(missing_ok=True)
        done = _runc_criu(sandbox, criu, "restore", "--detach", "--file-locks",
                          "--image-path", str(images), "--work-path", str(logs),
                          "--bundle", str(sandbox.bundle), "--pid-file", str(pid_file),
                          sandbox.container_id)
        if done.returncode == 0:
            if first is not None:
                log.warning("%s restored at the second try", sandbox.container_id)
            return
        reason = _explain(logs / "restore.log", done.stderr).replace("checkpoint", "restore")
        if first is not None:
            if reason != first:
                reason += f" (the first try: {first})"
            raise SessionFailed(f"{reason} (tried twice)")
        images_now = _image_files(images)
        if not images_now or images_now != images_before:
            raise SessionFailed(reason)  # the same try again could only fail again
        first = reason
        log.warning("restoring %s failed, trying once more: %s", sandbox.container_id, reason)
        # What runc may have left of the failed restore would refuse the second.
        try:
            sandbox.options.runc.delete(sandbox.container_id)
        except SessionFailed as error:
            raise SessionFailed(f"{reason} (not tried again: {error})") from error


def _image_files(images: Path) -> dict[str, int]:
    """The checkpoint's files and their sizes ({} if the directory is gone)."""
    try:
        with os.scandir(images) as entries:
            return {entry.name: entry.stat().st_size for entry in entries if entry.is_file()}
    except OSError:
        return {}


@contextlib.contextmanager
def _pids_headroom(bundle: Path, config: RuntimeConfig) -> Iterator[int | None]:
    """The bundle's config with :data:`RESTORE_PIDS_HEADROOM` more pids while CRIU restores
    (its own helpers count in the sandbox's cgroup: a sandbox checkpointed at its limit
    could not be restored, "Unable to create a thread"); the limit to set again after."""
    pids = config.get("linux", {}).get("resources", {}).get("pids", {})
    limit = pids.get("limit")
    if not isinstance(limit, int) or limit <= 0:
        yield None
        return
    path = bundle / "config.json"
    kept = path.read_text()
    pids["limit"] = limit + RESTORE_PIDS_HEADROOM
    path.write_text(json.dumps(config, indent=2))
    try:
        yield limit
    finally:
        pids["limit"] = limit
        path.write_text(kept)


def restore_from(
    sandbox: RuncSandbox, criu: Criu, archive: Path, raw: Path | None = None,
    together: StartTogether | None = None,
) -> float:
    """:func:`restore` the sandbox from the ``raw`` images if given, else from ``archive``
    unpacked into a scratch directory (:func:`scratch_dirs`); the seconds it took."""
    scratch, images, logs = scratch_dirs(sandbox, sandbox.session_dir, "restore-")
    try:
        started = time.monotonic()
        if raw is None:
            unpack(archive, images)
        restore(sandbox, criu, raw or images, logs, together)
        return time.monotonic() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- hibernate: dump + pack; resume: unpack + restore --------------------------------------


def hibernate_sandbox(sandbox: RuncSandbox, criu: Criu) -> DumpStats:
    """Checkpoint the sandbox (its processes end) into its archive (``sandbox.hibernate_archive``).

    On failure the sandbox runs on (CRIU resumes it) and CheckpointUnavailable says why;
    if the archive cannot be written, it runs on from its images (:func:`_run_on`).
    """
    archive = sandbox.hibernate_archive
    archive.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    scratch, images, logs = scratch_dirs(sandbox, archive.parent, "dump-")
    try:
        started = time.monotonic()
        raw = dump(sandbox, criu, images, logs, leave_running=False)
        try:
            compressed = pack(images, archive)
        except DeskboxError as error:
            _run_on(sandbox, criu, images, logs, error)
        return DumpStats(time.monotonic() - started, raw, compressed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_on(
    sandbox: RuncSandbox, criu: Criu, images: Path, logs: Path, error: DeskboxError
) -> NoReturn:
    """The hibernation's processes have ended but its archive could not be written (a full
    disk): restore them from their images rather than lose the session, then raise why it
    did not hibernate (not a failure of the session: it runs on)."""
    sandbox.release_init()
    try:
        restore(sandbox, criu, images, logs)
    except SessionFailed as failed:
        raise SessionFailed(f"{error.message}; and the session did not run on from its "
                            f"images: {failed.message}") from None
    if isinstance(error, InsufficientStorage):
        raise error
    raise CheckpointUnavailable(f"the session runs on, not hibernated: {error.message}")


def restore_sandbox(sandbox: RuncSandbox, criu: Criu) -> float:
    """Restore a hibernated sandbox from its archive, which is removed once it runs.

    SessionFailed (naming the cause) if it cannot; the archive then stays.
    """
    archive = sandbox.hibernate_archive
    if not archive.is_file():
        raise SessionFailed(f"the checkpoint of {sandbox.container_id} is missing ({archive})")
    seconds = restore_from(sandbox, criu, archive)
    archive.unlink()
    return seconds
