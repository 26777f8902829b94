"""A recording's frames into an MP4 (H.264, FFmpeg's libx264 through PyAV), in a process of
its own: the frames are JPEGs a sandbox's agent made, and decoding them is parsing hostile
data. recording_media.py runs ``python -m deskbox_server.sessions.video_encode``, which
limits its own memory and CPU time first, and gives it the job as JSON on stdin:

    {"frames": [[seconds, "/path/000000.jpg"], ...], "out": "/path/video.mp4",
     "width": 1280, "height": 800}

Each frame is shown from its time on; the last one is given twice, its second time being
when the recording's last entry happened. Exit status 0, else a message on stderr.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from fractions import Fraction

_TIME_BASE = Fraction(1, 1000)
_MEMORY = 2 << 30  # address space: PyAV's libraries and a few frames
_CPU_S = 600


def encode(frames: list[tuple[float, str]], out: str, width: int, height: int) -> None:
    """``width`` × ``height``: the screen's, which every frame must be."""
    import av
    import numpy as np
    from PIL import Image

    screen = (width, height)
    even = (max(2, width // 2 * 2), max(2, height // 2 * 2))  # 4:2:0 needs even sides
    with av.open(out, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = *even, "yuv420p"
        stream.time_base = stream.codec_context.time_base = _TIME_BASE
        stream.codec_context.options = {"preset": "veryfast", "crf": "28", "threads": "1"}
        last_pts = -1
        for seconds, path in frames:
            with Image.open(path) as image:  # the header only: checked before decoding
                if image.format != "JPEG" or image.size != screen:
                    raise ValueError(f"{path} is not a JPEG of the screen's size")
                rgb = np.asarray(image.convert("RGB"))
            picture = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            picture = picture.reformat(width=even[0], height=even[1], format="yuv420p")
            # Frames come at most ``fps`` a second: never two in one millisecond.
            last_pts = picture.pts = max(int(seconds * 1000), last_pts + 1)
            picture.time_base = _TIME_BASE
            container.mux(stream.encode(picture))
        container.mux(stream.encode(None))


def confine() -> None:
    """Before any frame is read: bounded memory and CPU time, and a low priority."""
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY, _MEMORY))
    resource.setrlimit(resource.RLIMIT_CPU, (_CPU_S, _CPU_S))
    os.nice(10)


def main() -> int:
    confine()
    job = json.load(sys.stdin)
    try:
        encode([(float(t), str(p)) for t, p in job["frames"]], str(job["out"]),
               int(job["width"]), int(job["height"]))
    except Exception as error:  # noqa: BLE001 (one line for the server, whatever broke)
        print(f"{type(error).__name__}: {error}"[:500], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
