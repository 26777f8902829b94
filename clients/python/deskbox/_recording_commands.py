"""``deskbox record`` and ``deskbox export``: a session's recording (API.md "Recordings and
trajectories"). Registered beside the other client commands (``_commands``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._commands import (
    ApiKey,
    Json,
    SessionId,
    Url,
    _check_writable,
    _client,
    _print_json,
    _write,
    err,
    out,
)

__all__ = ["register_recordings"]


def register_recordings(app: typer.Typer) -> None:
    @app.command()
    def record(
        session_id: SessionId,
        stop: Annotated[bool, typer.Option("--stop", help="Stop recording instead.")] = False,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Start (or --stop) recording a session: actions, frames, events."""
        with _client(url, api_key, as_json) as box:
            session = box.sessions.get(session_id)
            recording = session.stop_recording() if stop else session.start_recording()
        if as_json:
            _print_json(recording)
        else:
            out.print(f"{session_id} {recording['state']} ({recording['actions']} actions, "
                      f"{recording['frames']} frames)")

    @app.command("export")
    def export(
        session_id: SessionId,
        output: Annotated[str | None, typer.Option(
            "--output", "-o", help="File to write (default: SESSION.zip, or SESSION.mp4 "
            "with --video).")] = None,
        video: Annotated[bool, typer.Option(
            "--video", help="The video (MP4) instead of the trajectory's zip.")] = False,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Save a session's recording: trajectory.jsonl, frames and screenshots in a zip,
        or its video."""
        path = Path(output or f"{session_id}.{'mp4' if video else 'zip'}")
        _check_writable(path)  # before the server spends minutes encoding
        with _client(url, api_key, as_json) as box:
            session = box.sessions.get(session_id)
            with err.status("encoding the video…" if video else "packing the recording…",
                            spinner="dots"):
                data = session.recording() if video else session.export()
        _write(path, data)
        if as_json:
            _print_json({"path": str(path), "size": len(data)})
        else:
            err.print(f"saved {path} ({len(data)} bytes)", highlight=False)
