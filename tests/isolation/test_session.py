"""A sandboxed desktop starts, shows its browser, and the host's driver can use it."""

from __future__ import annotations

import io

from PIL import Image
from Xlib import display as xdisplay

from deskbox_server.backends.container import ContainerSandbox
from deskbox_server.driver.desktop import Desktop
from deskbox_server.driver.xwait import top_level_clients
from deskbox_server.schemas import actions as a


def test_display_is_reachable_by_name(sandbox: ContainerSandbox) -> None:
    assert sandbox.display_name == f":{sandbox.display.number}"  # type: ignore[union-attr]
    assert sandbox.failure() is None
    assert {"runc", "socket", "xserver", "wm", "browser"} <= set(sandbox.timings)


def test_screenshot_shows_the_browser_window(sandbox: ContainerSandbox) -> None:
    x = xdisplay.Display(sandbox.display_name)
    try:
        classes = [w.get_wm_class() or ("", "") for w in top_level_clients(x)]
        windows = [
            w for w, (_, cls) in zip(top_level_clients(x), classes, strict=True)
            if cls.lower().startswith("chromium")
        ]
        assert windows, classes
        geometry = windows[0].get_geometry()
        assert geometry.width >= 1000 and geometry.height >= 600  # maximized
    finally:
        x.close()
    desktop = Desktop(sandbox.display_name, sandbox.failure, shared_memory=False)
    try:
        shot = desktop.perform(a.Screenshot(format="png"))
    finally:
        desktop.close()
    image = Image.open(io.BytesIO(shot.data)).convert("RGB")  # type: ignore[union-attr]
    assert image.size == (1280, 800)
    # The browser's toolbar is drawn: many colours at the top, not an empty X root.
    toolbar = image.crop((0, 0, 1280, 90))
    colours = toolbar.getcolors(maxcolors=1 << 16) or []
    assert len(colours) > 8


def test_input_reaches_the_sandboxed_display(sandbox: ContainerSandbox) -> None:
    desktop = Desktop(sandbox.display_name, sandbox.failure, shared_memory=False)
    try:
        desktop.perform(a.Move(x=321, y=123))
        position = desktop.perform(a.CursorPosition())
    finally:
        desktop.close()
    assert (position.x, position.y) == (321, 123)  # type: ignore[union-attr]
