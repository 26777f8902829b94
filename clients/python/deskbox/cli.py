"""The ``deskbox`` command. ``deskbox mcp`` runs the MCP server (``mcp_server``); the client
commands (``create``, ``ls``, ``act``, ...) and their exit codes are in ``_commands``.
``deskbox serve`` and ``deskbox image`` come from the deskbox-server distribution
(``deskbox_server.cli``) when it is installed; without it they say how to install it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from ._base import max_retries_of_environment
from ._commands import EXIT_CODES, ApiKey, Url, register
from ._recording_commands import register_recordings

__all__ = ["app", "main"]

app = typer.Typer(
    name="deskbox",
    help="Disposable desktops for computer-use agents.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _root(context: typer.Context) -> None:
    """Deskbox command line: the server (serve) and client commands."""
    if context.invoked_subcommand in ("serve", "image"):
        return
    try:  # every client command reads it: a usage error, not a traceback, when malformed
        max_retries_of_environment()
    except ValueError as error:
        typer.echo(f"usage error: {error}", err=True)
        raise typer.Exit(EXIT_CODES["usage"]) from None


# `deskbox serve` and `deskbox image` belong to the server's distribution: mounted from it
# when it is installed here, else they say how to get it. find_spec imports nothing.
_SERVER_INSTALLED = importlib.util.find_spec("deskbox_server") is not None
_INSTALL_SERVER = "pip install deskbox-server"
_ANY_ARGUMENTS = {"allow_extra_args": True, "ignore_unknown_options": True}


def _server_missing(command: str) -> NoReturn:
    typer.echo(
        f"deskbox {command}: the Deskbox server is not installed in this environment "
        f"(this one has the client only). Install it with: {_INSTALL_SERVER}",
        err=True,
    )
    raise typer.Exit(1)


if _SERVER_INSTALLED:
    from deskbox_server.cli import image_app, serve

    app.command("serve")(serve)
    app.add_typer(image_app, name="image")
else:

    @app.command("serve", context_settings=_ANY_ARGUMENTS)
    def serve_missing() -> None:
        """Run the Deskbox server (needs deskbox-server: pip install deskbox-server)."""
        _server_missing("serve")

    @app.command("image", context_settings=_ANY_ARGUMENTS)
    def image_missing() -> None:
        """The session image (needs deskbox-server: pip install deskbox-server)."""
        _server_missing("image")


@app.command("mcp")
def mcp_command(
    url: Url = None,
    api_key: ApiKey = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each server call.")] = 60,
) -> None:
    """Run an MCP server on stdin/stdout: Deskbox tools for MCP clients (Claude Desktop, ...)."""
    try:
        from .mcp_server import serve as serve_mcp  # the MCP SDK is loaded only here
    except ModuleNotFoundError as missing:
        if missing.name is None or missing.name.partition(".")[0] != "mcp":
            raise
        typer.echo("deskbox mcp: the MCP SDK is not installed in this environment. "
                   "Install it with: pip install 'deskbox[mcp]'", err=True)
        raise typer.Exit(1) from None
    serve_mcp(url, api_key, timeout)


@app.command("eval")
def eval_command(
    tasks: Annotated[list[str], typer.Argument(
        help="Task files, or directories of them (docs/TASKS.md).", show_default=False)],
    agent: Annotated[str, typer.Option(
        "--agent", help="The agent: module:callable or path/to/file.py:callable, called as "
        "agent(observation, instruction) -> actions; a class is made once per episode.",
        show_default=False)],
    parallel: Annotated[int, typer.Option(min=1, max=256, help="Episodes at once.")] = 1,
    repeat: Annotated[int, typer.Option(min=1, help="Episodes per task.")] = 1,
    seed: Annotated[int, typer.Option(help="The first episode's seed.")] = 0,
    pool: Annotated[int, typer.Option(
        min=0, max=4, help="Set each task up once, snapshot it, and start its episodes from "
        "copies, this many kept ready (0: a new desktop and the setup per episode; needs an "
        "engine with checkpoints).")] = 0,
    out: Annotated[Path | None, typer.Option(
        help="The JSONL file (default deskbox-eval-DATE-TIME.jsonl).")] = None,
    backend: Annotated[str | None, typer.Option(help="The sessions' backend.")] = None,
    display: Annotated[str, typer.Option(help="The screen, WxH.")] = "1280x800",
    observation_size: Annotated[str | None, typer.Option(
        help="The model's pixels, WxH (default: the screen's).")] = None,
    url: Url = None,
    api_key: ApiKey = None,
) -> None:
    """Run an agent over tasks on many desktops at once; write one JSONL line per episode
    and print each task's success rate (95% interval), mean steps and time."""
    try:
        from .tasks.eval_command import evaluate_agent  # NumPy and Gymnasium: deskbox[gym]
    except ModuleNotFoundError as missing:
        if missing.name is None or missing.name.partition(".")[0] not in _GYM_MODULES:
            raise
        typer.echo("deskbox eval: Gymnasium and NumPy are not installed in this environment. "
                   "Install them with: pip install 'deskbox[gym]'", err=True)
        raise typer.Exit(1) from None
    env_options = {"display": _size(display, "--display"), "backend": backend,
                   "observation_size": _size(observation_size, "--observation-size")
                   if observation_size else None}
    raise typer.Exit(evaluate_agent(tasks, agent, url=url, api_key=api_key,
                                    parallel=parallel, repeat=repeat, seed=seed, out=out,
                                    env_options=env_options, pool=pool))


_GYM_MODULES = {"gymnasium", "numpy", "PIL"}


def _size(text: str, option: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise typer.BadParameter(f"{text!r} is not WxH (e.g. 1280x800)", param_hint=option)
    return int(width), int(height)


register(app)
register_recordings(app)


def main() -> None:
    app()
