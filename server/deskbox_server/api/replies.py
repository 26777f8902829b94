"""JSON replies that carry screenshots as base64: a large one is made on a thread.

base64 and the JSON around it cost ~5 ms per MB of image on the event loop, where every
other session's requests wait meanwhile: a busy 4K screen's PNG is megabytes, one at the
7680×4320 cap can be a hundred. Small replies (a 1280×800 screenshot is ~30-300 KB) stay on
the loop, where a thread's hop would cost more than it saves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

import pydantic_core
from fastapi import Response

from ..media import EncodedImage

__all__ = ["ENCODE_ON_LOOP_BYTES", "encodes_on_loop", "json_on_thread"]

ENCODE_ON_LOOP_BYTES = 256 * 1024


def encodes_on_loop(images: Iterable[EncodedImage | None]) -> bool:
    """Whether a reply with these images is small enough to make on the event loop."""
    return sum(len(image.data) for image in images if image is not None) <= ENCODE_ON_LOOP_BYTES


async def json_on_thread(build: Callable[[], object], *, exclude_none: bool,
                         headers: Mapping[str, str] | None = None) -> Response:
    """The reply ``build`` makes (pydantic models), as FastAPI would write it for the
    route's ``response_model``, built and serialized on a worker thread."""

    def dump() -> bytes:
        return pydantic_core.to_json(build(), exclude_none=exclude_none, by_alias=True)

    return Response(await asyncio.to_thread(dump), media_type="application/json",
                    headers=headers)
