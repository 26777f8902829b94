"""A desktop made of processes on this host, without isolation.

The driver's own tests, the benchmarks and the "local" development backend use it; the
container backend starts the same command lines inside a sandbox instead.
"""

from __future__ import annotations

import os
import select
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from Xlib import X
from Xlib.display import Display
from Xlib.ext import xfixes

from ..errors import DesktopFailed, Timeout
from ..settle import SettleOptions
from .browser import CdpPage
from .commands import DesktopSpec, browser_argv, wm_argv, xserver_argv
from .desktop import Desktop
from .processes import ProcessSet, become_subreaper
from .xwait import top_level_clients, wait_for, window_viewable, wm_running

__all__ = ["LocalDesktop"]


class LocalDesktop:
    """Xvfb + openbox + Chromium, started and observed until each is ready.

    Create it on the desktop's worker thread: the ``Desktop`` it holds belongs to that thread.
    """

    def __init__(
        self,
        spec: DesktopSpec | None = None,
        settle: SettleOptions | None = None,
        start_timeout_s: float = 30.0,
        browser: bool = True,
    ) -> None:
        self.spec = spec or DesktopSpec()
        become_subreaper()
        self.processes = ProcessSet()
        self._workdir = Path(tempfile.mkdtemp(prefix="deskbox-desktop-"))
        self.devtools_port: int | None = None
        self.timings: dict[str, float] = {}
        self.desktop: Desktop | None = None
        started = time.monotonic()
        deadline = started + start_timeout_s
        try:
            display = self._start_xserver(deadline)
            self.timings["xserver"] = time.monotonic() - started
            self.display_name = f":{display}"
            env = self._env()
            self.desktop = Desktop(self.display_name, self.processes.failure, settle=settle)
            root = self.x.screen().root
            # Told when the window manager takes the WM_S0 selection, rather than polling.
            self.x.xfixes_select_selection_input(
                root, self.x.intern_atom("WM_S0"), xfixes.XFixesSetSelectionOwnerNotifyMask
            )
            self.processes.spawn("openbox", wm_argv(), env)
            self._wait(lambda: wm_running(self.x), deadline, "the window manager")
            self.timings["wm"] = time.monotonic() - started
            if browser:
                self._start_browser(env, deadline)
                self.timings["browser"] = time.monotonic() - started
                self._wait_painted(deadline)
                self.timings["painted"] = time.monotonic() - started
        except BaseException:
            self.stop()
            raise

    @property
    def x(self) -> Display:
        assert self.desktop is not None
        return self.desktop.x_connection

    @property
    def devtools_url(self) -> str:
        return f"http://127.0.0.1:{self.devtools_port}"

    def _env(self) -> dict[str, str]:
        home = self._workdir / "home"
        home.mkdir(exist_ok=True)
        tmp = self._workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        return {
            # Chromium leaves its singleton and shared-memory dirs in TMPDIR when killed:
            # keep them inside what stop() removes.
            "TMPDIR": str(tmp),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "DISPLAY": self.display_name,
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "XDG_RUNTIME_DIR": str(self._workdir),
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
                ready, _, _ = select.select([read_fd], [], [], max(0.0, remaining))
                if not ready:
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

    def _wait(self, condition: Callable[[], object], deadline: float, what: str) -> None:
        def ready() -> bool:
            failure = self.processes.failure()
            if failure is not None:
                raise DesktopFailed(f"{what} did not start: {failure}")
            return bool(condition())

        wait_for(self.x, ready, max(0.0, deadline - time.monotonic()), what)

    def _start_browser(self, env: dict[str, str], deadline: float) -> None:
        profile = self._workdir / "chromium-profile"
        profile.mkdir()
        root = self.x.screen().root
        # Property changes on the root announce new clients in _NET_CLIENT_LIST.
        root.change_attributes(event_mask=X.PropertyChangeMask | X.SubstructureNotifyMask)
        self.processes.spawn("chromium", browser_argv(self.spec, str(profile)), env)

        def browser_window_viewable() -> bool:
            return any(
                window_viewable(w)
                and (w.get_wm_class() or ("", ""))[1].lower().startswith("chromium")
                for w in top_level_clients(self.x)
            )

        self._wait(browser_window_viewable, deadline, "the browser window")
        port_file = profile / "DevToolsActivePort"
        self._wait(port_file.exists, deadline, "the browser's DevTools port")
        self.devtools_port = int(port_file.read_text().split()[0])

    def _wait_painted(self, deadline: float) -> None:
        remaining = max(1.0, deadline - time.monotonic())
        with CdpPage.first(self.devtools_url, remaining) as page:
            # Chromium may still show about:blank before it switches to the start URL.
            start = "" if self.spec.start_url == "about:blank" else self.spec.start_url[:8]
            page.wait_painted(url_prefix=start, timeout_s=remaining)

    def stop(self) -> None:
        if self.desktop is not None:
            self.desktop.close()
        self.processes.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> LocalDesktop:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
