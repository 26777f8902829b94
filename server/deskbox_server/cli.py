"""The server's commands: ``deskbox-server`` (the same as ``deskbox serve``) and ``deskbox
image verify``.

The ``deskbox`` command of the client distribution (``deskbox/cli.py``) mounts :func:`serve`
and :data:`image_app` when this package is importable, so ``deskbox serve`` works wherever
deskbox-server is installed. Everything heavy (uvicorn, the app, the settings) is imported
inside the commands: mounting them costs ``deskbox --help`` nothing.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["LogFormat", "image_app", "main", "serve"]


class LogFormat(StrEnum):
    auto = "auto"
    json = "json"
    text = "text"


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8765,
    state_dir: Annotated[
        Path | None, typer.Option(help="Registry, API key and caches (default: XDG state dir).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: Annotated[LogFormat, typer.Option(
        help="text (readable lines), json (one object per line), or auto: text on a "
             "terminal, else json.")] = LogFormat.auto,
) -> None:
    """Run the Deskbox server; prints its URL, where the API key is and a curl to try."""
    from .serve import run
    from .settings import Settings

    overrides: dict[str, object] = {"host": host, "port": port}
    if state_dir is not None:
        overrides["state_dir"] = state_dir
    run(Settings(**overrides), log_level, log_format.value)  # type: ignore[arg-type]


image_app = typer.Typer(
    help="The session image every sandbox runs (built by the server on first start).",
    no_args_is_help=True,
)


@image_app.command("verify")
def image_verify(
    state_dir: Annotated[
        Path | None,
        typer.Option(help="The server's state dir, or DESKBOX_IMAGE_STATE_DIR (image cache)."),
    ] = None,
) -> None:
    """Compare every file of the session image with the manifest written when it was built.

    Exits 0 when the image is intact, 1 listing each difference otherwise.
    """
    from .engines.image import verify_image
    from .errors import DeskboxError
    from .settings import Settings

    overrides: dict[str, object] = {} if state_dir is None else {"image_state_dir": state_dir}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    try:
        problems = verify_image(
            settings.image_cache_dir, settings.recipe_dir, lambda line: typer.echo(line, err=True)
        )
    except DeskboxError as error:
        typer.echo(f"error: {error.message}", err=True)
        raise typer.Exit(2) from None
    for problem in problems:
        typer.echo(problem)
    raise typer.Exit(1 if problems else 0)


def main() -> None:
    """``deskbox-server [OPTIONS]``: :func:`serve` as a command of its own."""
    app = typer.Typer(name="deskbox-server", add_completion=False)
    app.command()(serve)
    app()
