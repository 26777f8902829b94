"""The container backend behind the Backend interface the session layer uses."""

from __future__ import annotations

import os

import pytest

from deskbox_server.backends.base import SessionSpec
from deskbox_server.backends.container import ContainerOptions
from deskbox_server.backends.container_backend import ContainerBackend, ContainerHandle
from deskbox_server.driver.commands import DesktopSpec
from deskbox_server.media import EncodedImage
from deskbox_server.schemas.actions import Screenshot


@pytest.mark.parametrize("shared_memory", [False, True], ids=["getimage", "xshm"])
async def test_create_capture_destroy(options: ContainerOptions, shared_memory: bool) -> None:
    backend = ContainerBackend(options, shared_memory=shared_memory)
    spec = SessionSpec(id=f"t-backend-{int(shared_memory)}-{os.getpid()}", desktop=DesktopSpec())
    handle = await backend.create(spec, timeout_s=30)
    try:
        assert isinstance(handle, ContainerHandle)
        assert handle.failure() is None
        image = (await handle.run([Screenshot(format="jpeg", quality=75)])).results[0]
        assert isinstance(image, EncodedImage) and (image.width, image.height) == (1280, 800)
        # MIT-SHM passes a memfd to the X server, so it works across the ipc namespace.
        method = await handle.worker.call(lambda: handle.desktop.capture_method)
        assert method == ("xshm" if shared_memory else "getimage")
    finally:
        await backend.destroy(handle)
    assert handle.sandbox.container_id not in options.runc.list_ids()
    assert not handle.sandbox.session_dir.exists()
