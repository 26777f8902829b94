"""The runc engine behind the Engine interface, driven as the session layer drives it."""

from __future__ import annotations

import os

from deskbox_server.engines.base import SessionSpec
from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.engines.runc.engine import RuncEngine
from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox
from deskbox_server.media import EncodedImage
from deskbox_server.schemas.actions import Screenshot
from deskbox_server.sessions.desktop import Desktop


async def test_create_capture_destroy(options: RuncOptions) -> None:
    backend = RuncEngine(options)
    spec = SessionSpec(id=f"t-backend-{os.getpid()}", desktop=DesktopSpec())
    handle = await Desktop.start(backend, spec, 30)
    try:
        assert isinstance(handle.sandbox, RuncSandbox)
        assert handle.failure() is None
        image = (await handle.run([Screenshot(format="jpeg", quality=75)])).results[0]
        assert isinstance(image, EncodedImage) and (image.width, image.height) == (1280, 800)
        # The agent captures next to its X server, in the sandbox's ipc namespace: MIT-SHM.
        assert (await handle.desktop.info()).capture == "xshm"
        assert handle.agent is not None and handle.agent.failed_reason is None
    finally:
        await handle.destroy()
    assert handle.sandbox.container_id not in options.runc.list_ids()
    assert not handle.sandbox.session_dir.exists()
