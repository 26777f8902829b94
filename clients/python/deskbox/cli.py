"""The ``deskbox`` command. ``deskbox serve`` runs the server (imported only then), ``deskbox
mcp`` the MCP server (``mcp_server``); the client commands (``create``, ``ls``, ``act``, ...)
and their exit codes are in ``_commands``."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ._commands import ApiKey, Url, register

__all__ = ["app", "main"]

app = typer.Typer(
    name="deskbox",
    help="Disposable desktops for computer-use agents.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Deskbox command line: the server (serve) and client commands."""


class LogFormat(StrEnum):
    auto = "auto"
    json = "json"
    text = "text"


@app.command()
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
    from deskbox_server.serve import run
    from deskbox_server.settings import Settings

    overrides: dict[str, object] = {"host": host, "port": port}
    if state_dir is not None:
        overrides["state_dir"] = state_dir
    run(Settings(**overrides), log_level, log_format.value)  # type: ignore[arg-type]


@app.command("mcp")
def mcp_command(
    url: Url = None,
    api_key: ApiKey = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each server call.")] = 60,
) -> None:
    """Run an MCP server on stdin/stdout: Deskbox tools for MCP clients (Claude Desktop, ...)."""
    from .mcp_server import serve as serve_mcp  # the MCP SDK is loaded only here

    serve_mcp(url, api_key, timeout)


image_app = typer.Typer(
    help="The session image every sandbox runs (built by the server on first start).",
    no_args_is_help=True,
)
app.add_typer(image_app, name="image")


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
    from deskbox_server.backends.image import verify_image
    from deskbox_server.errors import DeskboxError
    from deskbox_server.settings import Settings

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


register(app)


def main() -> None:
    app()
