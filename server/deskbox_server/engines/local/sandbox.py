"""A desktop made of processes on this host, without isolation: Xvfb, openbox, Chromium and
the desktop's agent (``python -m deskbox_agent``), which alone speaks X11 to it.

The "local" development engine uses it (engine.py), and the tests and benchmarks that drive
a desktop through an agent without a sandbox; the runc engine starts the same command lines
inside a sandbox instead. Everything of the desktop lives in a private temporary directory
(mode 0700): the agent's socket, HOME, TMPDIR, Chromium's profile.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path

from ...errors import DesktopFailed, Timeout
from ..base import Sandbox
from ..desktop_commands import (
    DesktopSpec,
    browser_argv,
    gtk_settings_path,
    wm_argv,
    xserver_argv,
)
from ..fd_wait import readable
from ..processes import ProcessSet, become_subreaper, kill_owned

__all__ = ["AGENT_SOCKET", "LocalSandbox", "agent_package_dir", "remove_owned"]

AGENT_SOCKET = "agent.sock"  # in the desktop's private directory
_WORKDIR_PREFIX = "deskbox-desktop-"
_POLL_S = 0.01


def agent_package_dir() -> Path:
    """The directory that holds the ``deskbox_agent`` package (for the agent's PYTHONPATH):
    where it is installed (deskbox-server ships it), else this checkout's desktop_image/agent.

    Found, not imported: the server reaches the agent only over its protocol.
    """
    spec = importlib.util.find_spec("deskbox_agent")
    if spec is not None and spec.origin is not None:
        return Path(spec.origin).parent.parent
    checkout = Path(__file__).resolve().parents[3] / "desktop_image" / "agent"
    if (checkout / "deskbox_agent" / "__main__.py").is_file():
        return checkout
    raise DesktopFailed("the desktop agent's package (deskbox_agent) is not installed")


class LocalSandbox(Sandbox):
    """Starts the desktop's processes; it does not wait for them to be ready (the agent's
    ``ready`` call does, by X events). With ``agent``, the agent listens on
    :attr:`agent_socket` once the constructor returns. ``owner``: whose desktop it is (a
    server's), for :func:`remove_owned` once that owner is gone."""

    def __init__(
        self,
        spec: DesktopSpec | None = None,
        start_timeout_s: float = 30.0,
        browser: bool = True,
        agent: bool = True,
        owner: str | None = None,
    ) -> None:
        self.spec = spec or DesktopSpec()
        become_subreaper()
        self.processes = ProcessSet(owner=owner)
        # mkdtemp makes it 0700: no other user reaches the agent's socket or the profile.
        self.workdir = Path(tempfile.mkdtemp(prefix=_workdir_prefix(owner)))
        self.agent_socket = self.workdir / AGENT_SOCKET
        self.profile = self.workdir / "chromium-profile"
        self.timings: dict[str, float] = {}
        self.port = 0  # the browser's DevTools port, once it wrote it (engine.py)
        started = time.monotonic()
        deadline = started + start_timeout_s
        try:
            self.display_name = f":{self._start_xserver(deadline)}"
            self.timings["xserver"] = time.monotonic() - started
            env = self._env()
            self.processes.spawn("openbox", wm_argv(), env)
            if browser:
                self.profile.mkdir()
                self.processes.spawn("chromium", browser_argv(self.spec, str(self.profile)), env)
            if agent:
                self._start_agent(env, deadline)
                self.timings["agent"] = time.monotonic() - started
        except BaseException:
            self.stop()
            raise

    def _env(self) -> dict[str, str]:
        home = self.workdir / "home"
        gtk_config = home / ".config" / "gtk-3.0"
        gtk_config.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(gtk_settings_path(), gtk_config / "settings.ini")
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        return {
            # Chromium leaves its singleton and shared-memory dirs in TMPDIR when killed:
            # keep them inside what stop() removes.
            "TMPDIR": str(tmp),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "DISPLAY": self.display_name,
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "XDG_RUNTIME_DIR": str(self.workdir),
        }

    def _start_xserver(self, deadline: float) -> int:
        read_fd, write_fd = os.pipe()
        try:
            self.processes.spawn(
                "Xvfb", xserver_argv(self.spec, write_fd), {"PATH": os.environ["PATH"]},
                pass_fds=[write_fd],
            )
            os.close(write_fd)
            write_fd = -1
            number = b""
            while not number.endswith(b"\n"):
                remaining = deadline - time.monotonic()
                if not readable([read_fd], remaining):
                    raise Timeout("the X server did not report a display in time")
                chunk = os.read(read_fd, 16)
                if not chunk:
                    raise DesktopFailed(
                        f"the X server did not start: {self.processes.failure() or 'no display'}"
                    )
                number += chunk
            return int(number)
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)

    def _start_agent(self, env: dict[str, str], deadline: float) -> None:
        argv = [sys.executable, "-m", "deskbox_agent", "--listen", f"unix:{self.agent_socket}",
                "--display", self.display_name]
        self.processes.spawn("deskbox-agent", argv,
                             {**env, "PYTHONPATH": str(agent_package_dir())})
        self._wait(self._agent_listens, deadline, "the desktop's agent")

    def _agent_listens(self) -> bool:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(self.agent_socket))
            except OSError:  # not bound yet, or bound and not listening yet
                return False
        return True

    def _wait(self, condition: Callable[[], bool], deadline: float, what: str) -> None:
        while not condition():
            failure = self.processes.failure()
            if failure is not None:
                raise DesktopFailed(f"{what} did not start: {failure}")
            if time.monotonic() > deadline:
                raise Timeout(f"{what} did not start in time")
            time.sleep(_POLL_S)

    def wait_devtools_port(self, timeout_s: float = 10.0) -> int:
        """The browser's DevTools port, once it wrote it (blocking)."""
        port_file = self.profile / "DevToolsActivePort"

        def written() -> bool:
            # Chromium writes the file in place: wait for its first line to be whole.
            return port_file.exists() and "\n" in port_file.read_text()

        self._wait(written, time.monotonic() + timeout_s, "the browser's DevTools port")
        return int(port_file.read_text().split()[0])

    # -- what the session layer knows of it (engines/base.py) ---------------------------

    @property
    def label(self) -> str:
        return f"the desktop {self.display_name}"

    def failure(self) -> str | None:
        return self.processes.failure()

    @property
    def agent_display(self) -> str:
        return self.display_name

    @property
    def vnc_socket_dir(self) -> str:
        return str(self.workdir)

    @property
    def devtools_port(self) -> int:
        return self.port

    @property
    def devtools_url(self) -> str:
        """The browser's DevTools endpoint on the host's loopback (tests read pages with it)."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.processes.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _workdir_prefix(owner: str | None) -> str:
    return f"{_WORKDIR_PREFIX}{owner}-" if owner is not None else _WORKDIR_PREFIX


def remove_owned(owner: str, spare: Collection[LocalSandbox] = ()) -> int:
    """Kill the processes and remove the private directories of ``owner``'s desktops but
    ``spare``: what a server killed outright left running, unowned. How many processes."""
    killed = kill_owned(owner, [sandbox.processes.marker for sandbox in spare])
    kept = {sandbox.workdir for sandbox in spare}
    for workdir in Path(tempfile.gettempdir()).glob(_workdir_prefix(owner) + "*"):
        if workdir not in kept and workdir.is_dir() and not workdir.is_symlink():
            shutil.rmtree(workdir, ignore_errors=True)
    return killed
