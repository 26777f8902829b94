"""The container backend behind the Backend interface the session layer uses."""

from __future__ import annotations

import os

from deskbox_server.backends.base import SessionSpec
from deskbox_server.backends.container import ContainerOptions
from deskbox_server.backends.container_backend import ContainerBackend, ContainerHandle
from deskbox_server.backends.desktop_commands import DesktopSpec
from deskbox_server.media import EncodedImage
from deskbox_server.schemas.actions import Screenshot


async def test_create_capture_destroy(options: ContainerOptions) -> None:
    backend = ContainerBackend(options)
    spec = SessionSpec(id=f"t-backend-{os.getpid()}", desktop=DesktopSpec())
    handle = await backend.create(spec, timeout_s=30)
    try:
        assert isinstance(handle, ContainerHandle)
        assert handle.failure() is None
        image = (await handle.run([Screenshot(format="jpeg", quality=75)])).results[0]
        assert isinstance(image, EncodedImage) and (image.width, image.height) == (1280, 800)
        # The agent captures next to its X server, in the sandbox's ipc namespace: MIT-SHM.
        assert (await handle.desktop.info()).capture == "xshm"
        assert handle.agent is not None and handle.agent.failed_reason is None
    finally:
        await backend.destroy(handle)
    assert handle.sandbox.container_id not in options.runc.list_ids()
    assert not handle.sandbox.session_dir.exists()
