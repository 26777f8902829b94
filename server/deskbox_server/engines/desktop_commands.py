"""Command lines of a desktop's processes, shared by every engine that starts them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

__all__ = [
    "BROWSER_FLAGS",
    "DEVTOOLS_PORT",
    "IMAGE_PROFILE_DIR",
    "IMAGE_WM_CONFIG",
    "DesktopSpec",
    "browser_argv",
    "gtk_settings_path",
    "session_env",
    "wm_argv",
    "wm_config_path",
    "xserver_argv",
]

DEVTOOLS_PORT = 9222  # the browser's, on a sandbox's own loopback
# Inside the session image: openbox's configuration (copied there by desktop_image/build.py)
# and the browser's profile, in the home every engine makes writable.
IMAGE_WM_CONFIG = "/etc/deskbox/openbox-rc.xml"
IMAGE_PROFILE_DIR = "/root/chromium"
_DISPLAYFD = 3  # the X server's -displayfd, a pipe the session's init makes

# Measured on this project's hosts (see ARCHITECTURE.md): these start Chromium as root in a
# headless X session with no network chatter and no first-run UI.
BROWSER_FLAGS: tuple[str, ...] = (
    "--no-sandbox",
    "--test-type",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--password-store=basic",
    "--use-mock-keychain",
    # WebUIOmniboxPopup, WebUIOmniboxAimPopup: Chromium 156 keeps a renderer with the WebUI
    # address-bar popup loaded all the time; without them the popup is drawn natively and
    # works the same. Measured with 3 idle sessions: -38 MiB private memory and -44 MiB PSS
    # per session on the host, -43 MiB PSS per session in sandboxes (bench/density.py).
    # SpareRendererForSitePerProcess: Chromium keeps an idle renderer ready for the next
    # site. Without it a session has ~20 MiB of anonymous memory and 11 threads less for a
    # checkpoint to dump and a restore to rebuild: CRIU's restore 0.46 -> 0.39 s (issue 18).
    # Cross-site navigations on 2 cores were no slower (p50 0.24-0.26 s either way); a new
    # tab may pay for its renderer once (0.68 s, in 1 of 2 runs). bench/README.md.
    "--disable-features=Translate,MediaRouter,OptimizationHints,WebUIOmniboxPopup,"
    "WebUIOmniboxAimPopup,SpareRendererForSitePerProcess",
    # The network service on a thread of the browser process instead of a process of its
    # own (as Puppeteer runs Chromium): in a VM guest under TCG that process was killed and
    # restarted during start-up ("Network service crashed or was terminated, restarting
    # service") and the start page's navigation never committed.
    "--enable-features=NetworkServiceInProcess2",
    # Chromium keeps a second zygote, for unsandboxed helper processes; without it those
    # few (the GPU process, the storage and audio services) are started from the browser
    # itself, once each. Renderers still fork from the zygote, so navigations are as fast
    # (cross-site p50 0.105 s either way); a session has one process and ~15 MiB of
    # anonymous memory less for a checkpoint to dump and a restore to rebuild: a fork ×4
    # 1.07 -> 1.01 s (issue 18; bench/README.md).
    "--no-unsandboxed-zygote",
    # The GPU process (software compositing: --disable-gpu) as a thread of the browser
    # process: 16 MiB of anonymous memory and a process less for a checkpoint to dump and a
    # restore to rebuild; forks ×4 of an animated page ~5 % faster, clicks, screenshots and
    # the sandbox's CPU per action the same (bench/README.md). CRIU once refused such a
    # browser ("Control messages in queue"); 40 forks, a third of them during a reload, and
    # the suite's checkpoints now pass.
    "--in-process-gpu",
    "--disable-session-crashed-bubble",
    "--hide-crash-restore-bubble",
    "--start-maximized",
    "--window-position=0,0",
)


@dataclass(frozen=True)
class DesktopSpec:
    width: int = 1280
    height: int = 800
    dpi: int = 96
    start_url: str = "about:blank"


def xserver_argv(spec: DesktopSpec, displayfd: int, display: int | None = None) -> list[str]:
    """Xvfb on a unix socket only; ``-displayfd`` tells us when it is ready and which number."""
    argv = ["Xvfb"]
    if display is not None:
        argv.append(f":{display}")
    argv += [
        "-displayfd", str(displayfd),
        "-screen", "0", f"{spec.width}x{spec.height}x24",
        "-dpi", str(spec.dpi),
        "-nolisten", "tcp",
        "-noreset",
        # GLX costs ~50 MiB per server and Chromium runs with --disable-gpu anyway.
        "-extension", "GLX",
    ]
    return argv


def wm_config_path() -> str:
    """Our openbox rc.xml, shipped inside the package (and copied into the session image)."""
    return str(resources.files("deskbox_server.engines") / "data" / "openbox-rc.xml")


def gtk_settings_path() -> str:
    """The GTK settings the browser reads (a steady caret), shipped inside the package;
    the session image has them as /etc/gtk-3.0/settings.ini, a host desktop in its home."""
    return str(resources.files("deskbox_server.engines") / "data" / "gtk-settings.ini")


def wm_argv(config_path: str | None = None) -> list[str]:
    return ["openbox", "--sm-disable", "--config-file", config_path or wm_config_path()]


def browser_argv(spec: DesktopSpec, profile_dir: str, debug_port: int = 0) -> list[str]:
    return [
        "chromium",
        *BROWSER_FLAGS,
        f"--window-size={spec.width},{spec.height}",
        f"--user-data-dir={profile_dir}",
        f"--remote-debugging-port={debug_port}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-allow-origins=*",
        spec.start_url,
    ]


def session_env(spec: DesktopSpec, display: int, agent_argv: Sequence[str], browser: bool = True
                ) -> dict[str, str]:
    """The command lines the session image's init (``deskbox-session``) starts, in the
    variables it reads them from: the same desktop on every engine that runs the image."""
    return {
        "DESKBOX_XSERVER": json.dumps(xserver_argv(spec, _DISPLAYFD, display)),
        "DESKBOX_WM": json.dumps(wm_argv(IMAGE_WM_CONFIG)),
        "DESKBOX_BROWSER": json.dumps(
            browser_argv(spec, IMAGE_PROFILE_DIR, DEVTOOLS_PORT) if browser else []),
        "DESKBOX_AGENT": json.dumps(list(agent_argv)),
    }
