"""The server's commands: ``deskbox-server`` (the same as ``deskbox serve``) and ``deskbox
image build|export|inspect|verify|prune``.

The ``deskbox`` command of the client distribution (``deskbox/cli.py``) mounts :func:`serve`
and :data:`image_app` when this package is importable, so ``deskbox serve`` works wherever
deskbox-server is installed. Everything heavy (uvicorn, the app, the settings) is imported
inside the commands: mounting them costs ``deskbox --help`` nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["LogFormat", "LogLevel", "image_app", "main", "serve"]


class LogFormat(StrEnum):
    auto = "auto"
    json = "json"
    text = "text"


class LogLevel(StrEnum):
    # A choice, not any string: logging's "Unknown level: 'FOO'" was a traceback.
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8765,
    state_dir: Annotated[
        Path | None, typer.Option(help="Registry, API key and caches (default: XDG state dir).")
    ] = None,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False)] = LogLevel.info,
    log_format: Annotated[LogFormat, typer.Option(
        help="text (readable lines), json (one object per line), or auto: text on a "
             "terminal, else json.")] = LogFormat.auto,
) -> None:
    """Run the Deskbox server; prints its URL, where the API key is and a curl to try."""
    from .serve import run
    from .settings import load_settings

    overrides: dict[str, object] = {"host": host, "port": port}
    if state_dir is not None:
        overrides["state_dir"] = state_dir
    with _errors_exit_2():
        settings = load_settings(overrides, _SERVE_OPTIONS)
    run(settings, log_level.value, log_format.value)


# The settings serve's options give, by the option's name (in what load_settings says).
_SERVE_OPTIONS = {"host": "--host", "port": "--port", "state_dir": "--state-dir"}


image_app = typer.Typer(
    help="The session image every sandbox runs (built by the server on first start).",
    no_args_is_help=True,
)


StateDirOption = Annotated[
    Path | None,
    typer.Option(help="The server's state dir, or DESKBOX_IMAGE_STATE_DIR (image cache)."),
]


def _image_settings(state_dir: Path | None) -> tuple[Path, Path]:
    """(image cache, recipe dir) as the server would use them."""
    from .settings import load_settings

    overrides: dict[str, object] = {} if state_dir is None else {"image_state_dir": state_dir}
    with _errors_exit_2():
        settings = load_settings(overrides, {"image_state_dir": "--state-dir"})
    return settings.image_cache_dir, settings.recipe_dir


def _progress(line: str) -> None:
    typer.echo(line, err=True)


@contextlib.contextmanager
def _errors_exit_2() -> Iterator[None]:
    """A DeskboxError ends the command with its message and exit status 2."""
    from .errors import DeskboxError

    try:
        yield
    except DeskboxError as error:
        typer.echo(f"error: {error.message}", err=True)
        raise typer.Exit(2) from None


@image_app.command("build")
def image_build(
    state_dir: StateDirOption = None,
    vm: Annotated[bool, typer.Option(help="Also the vm engine's guest (kernel, initramfs).")]
    = False,
    oci: Annotated[bool, typer.Option(help="Also the OCI image (deskbox image export).")]
    = False,
    rebuild: Annotated[bool, typer.Option(
        help="Build the session image even if cached and replace it (one that fails its "
             "integrity check), with the OCI image made from it.")] = False,
) -> None:
    """Build the session image (and with --vm, --oci what is made from it) unless cached.

    Progress goes to stderr; each built directory is printed on stdout.
    """
    from .engines.image import build_image

    cache, recipe = _image_settings(state_dir)
    scripts = ["build.py", *(["vm_guest.py"] if vm else []), *(["oci_image.py"] if oci else [])]
    with _errors_exit_2():
        for script in scripts:
            built = build_image(cache, recipe, _progress, script_name=script,
                                rebuild=rebuild and script == "build.py")
            typer.echo(built.parent if script == "build.py" else built)


@image_app.command("export")
def image_export(
    output: Annotated[Path, typer.Option(
        "--output", "-o",
        help="Where to write the OCI archive ('-': standard output, e.g. | podman load).")]
    = Path("deskbox-session.oci.tar"),
    state_dir: StateDirOption = None,
) -> None:
    """Write the session image as an OCI archive (built first if missing): `podman load`,
    `docker load` and skopeo (`oci-archive:`) read it."""
    import shutil
    import sys

    from .engines.image import OCI_ARCHIVE, build_image

    cache, recipe = _image_settings(state_dir)
    with _errors_exit_2():
        archive = build_image(cache, recipe, _progress, script_name="oci_image.py") / OCI_ARCHIVE
    size = archive.stat().st_size
    with open(archive, "rb") as source:
        if str(output) == "-":
            shutil.copyfileobj(source, sys.stdout.buffer, 1 << 20)
            sys.stdout.buffer.flush()
            return
        partial = output.with_name(f".{output.name}.partial")
        try:
            with open(partial, "wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)
            partial.replace(output)
        except OSError as error:
            partial.unlink(missing_ok=True)
            typer.echo(f"error: cannot write {output}: {error.strerror}", err=True)
            raise typer.Exit(2) from None
    typer.echo(f"{output}: {size / 2**20:.0f} MiB", err=True)


@image_app.command("inspect")
def image_inspect(state_dir: StateDirOption = None) -> None:
    """Print what is built of the current recipe, as JSON, building nothing: the session
    image (hash, package versions, agent, erofs file) and the OCI image (name, digests,
    labels); null for what is not built."""
    import json

    from .engines.image import describe_images

    cache, recipe = _image_settings(state_dir)
    with _errors_exit_2():
        found = describe_images(cache, recipe)
    typer.echo(json.dumps(found, indent=2))


@image_app.command("verify")
def image_verify(state_dir: StateDirOption = None) -> None:
    """Compare every file of the session image with the manifest written when it was built.

    Exits 0 when the image is intact, 1 listing each difference otherwise.
    """
    from .engines.image import verify_image

    cache, recipe = _image_settings(state_dir)
    with _errors_exit_2():
        problems = verify_image(cache, recipe, _progress)
    for problem in problems:
        typer.echo(problem)
    raise typer.Exit(1 if problems else 0)


@image_app.command("prune")
def image_prune(
    state_dir: StateDirOption = None,
    dry_run: Annotated[bool, typer.Option(help="Say what would be removed; remove nothing.")]
    = False,
) -> None:
    """Remove every cached image but the current recipe's: session images of other recipes
    (unmounted), the VM guests and OCI images made from them, other mmdebstrap stages.

    An image that a running sandbox (or any process) uses is kept, with the processes named,
    and the exit status is 1. Prints each directory removed and the space freed.
    """
    from .engines.image import prune_images

    cache, recipe = _image_settings(state_dir)
    with _errors_exit_2():
        pruned = prune_images(cache, recipe, _progress, dry_run)
    for line in pruned.report:
        typer.echo(line)
    raise typer.Exit(0 if pruned.complete else 1)


def main() -> None:
    """``deskbox-server [OPTIONS]``: :func:`serve` as a command of its own."""
    app = typer.Typer(name="deskbox-server", add_completion=False)
    app.command()(serve)
    app()
