"""The client commands of ``deskbox`` (``create``, ``ls``, ``show``, ``act``, ...).

They use the sync SDK; the server is found by ``--url`` / ``DESKBOX_URL`` and the key by
``--api-key`` / ``DESKBOX_API_KEY``. Plain output is for people (``create`` and ``fork``
print bare ids, so ``ID=$(deskbox create)`` works); ``--json`` prints JSON for scripts.

Exit codes (``EXIT_CODES``): 0 success; 1 an unexpected error; 2 bad usage (bad options or
arguments, a malformed JSON action); 3 the server could not be reached or did not answer in
time; 4 unauthorized or forbidden (401/403); 5 not found (404, or 405: a route this server
lacks); 6 conflict (409: the session is starting, paused, ...); 7 invalid request
(400/413/422); 8 out of capacity (429/503: retry later); 9 any other server error (5xx).
``deskbox exec`` exits with the command's own exit code (124 if it timed out), like
``docker exec``; errors of the call itself keep the codes above (use ``--json`` to tell
them apart).
"""

from __future__ import annotations

import json
import os
import sys
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from ._base import BACKEND_HELP
from ._errors import (
    APIConnectionError,
    APIError,
    Conflict,
    DeskboxError,
    Forbidden,
    MethodNotAllowed,
    NotFound,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    Unauthorized,
)
from ._models import ActionsResult, Screenshot
from ._sync import Deskbox, Session
from ._table import render_table, terminal_width

__all__ = ["EXIT_CODES", "exit_code_for", "register"]

EXIT_CODES = {
    "ok": 0, "error": 1, "usage": 2, "connection": 3, "auth": 4, "not_found": 5,
    "conflict": 6, "invalid": 7, "capacity": 8, "server": 9,
}

Url = Annotated[str | None, typer.Option(
    "--url", envvar="DESKBOX_URL", show_envvar=True,
    help="Server URL (default http://127.0.0.1:8765).")]
ApiKey = Annotated[str | None, typer.Option(
    "--api-key", envvar="DESKBOX_API_KEY", show_envvar=True, show_default=False,
    help="API key.")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]
SessionId = Annotated[str, typer.Argument(help="Session id.", show_default=False)]

err = Console(stderr=True)
out = Console(highlight=False, soft_wrap=True)


def exit_code_for(error: BaseException) -> int:
    """The documented exit code of an SDK error."""
    if isinstance(error, APIConnectionError):
        return EXIT_CODES["connection"]
    if isinstance(error, Unauthorized | Forbidden):
        return EXIT_CODES["auth"]
    if isinstance(error, NotFound | MethodNotAllowed):
        return EXIT_CODES["not_found"]
    if isinstance(error, Conflict):
        return EXIT_CODES["conflict"]
    if isinstance(error, RateLimited | ServiceUnavailable):
        return EXIT_CODES["capacity"]
    if isinstance(error, ServerError):
        return EXIT_CODES["server"]
    if isinstance(error, APIError) and error.status in (400, 413, 422):
        return EXIT_CODES["invalid"]
    return EXIT_CODES["error"]


def _fail(error: DeskboxError, as_json: bool) -> NoReturn:
    if as_json:
        body: dict[str, Any] = {"type": "connection_error", "message": str(error)}
        if isinstance(error, APIError):
            body = {"type": error.type, "message": error.message, "status": error.status,
                    "request_id": error.request_id}
        print(json.dumps({"error": body}), file=sys.stderr)
    else:
        err.print(f"[red]error:[/red] {error}", markup=True, highlight=False)
    raise typer.Exit(exit_code_for(error))


def _usage(message: str) -> NoReturn:
    err.print(f"[red]usage error:[/red] {message}", highlight=False)
    raise typer.Exit(EXIT_CODES["usage"])


def _check_writable(path: Path) -> None:
    """A usage error, before any call, for a file that cannot be written: found only after
    the call, the actions had run (or the recording been packed) for nothing. The write
    itself may still fail (a full disk): callers catch OSError too."""
    if path.is_dir():
        _usage(f"{path} is a directory; give a file name")
    if not path.parent.is_dir():
        _usage(f"cannot write {path}: no directory {path.parent}")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        _usage(f"cannot write {path}: permission denied")


def _write(path: Path, data: bytes, done: str = "") -> None:
    """``data`` to ``path``; a usage error of one line, not a traceback, if it fails."""
    try:
        path.write_bytes(data)
    except OSError as error:
        _usage(f"cannot write {path}: {error.strerror or error}{done}")


@contextmanager
def _client(url: str | None, api_key: str | None, as_json: bool) -> Iterator[Deskbox]:
    try:
        with Deskbox(url, api_key) as box:
            yield box
    except DeskboxError as error:
        _fail(error, as_json)
    except ValueError as error:  # an id the SDK refuses as a path segment ("a/b")
        _usage(str(error))


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _session_json(session: Session) -> dict[str, Any]:
    return session.data.raw


def _labels(items: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _usage(f"label {item!r} is not KEY=VALUE")
        labels[key] = value
    return labels


def _show(session: Session) -> None:
    data = session.data
    rows = [
        ("id", data.id), ("state", data.state), ("backend", data.backend),
        ("display", f"{data.display.width}x{data.display.height}"),
        ("created", data.created_at), ("expires", data.expires_at or "-"),
        ("labels", ", ".join(f"{k}={v}" for k, v in data.labels.items()) or "-"),
    ]
    if data.failure:
        rows.append(("failure", str(data.failure.get("reason"))))
    rows += [(f"urls.{k}", v) for k, v in asdict(data.urls).items()]
    # Plain lines, not a table: a table cuts (or folds) ids and URLs to the terminal's width;
    # a long line is wrapped by the terminal instead, and copies whole.
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        out.print(Text.assemble((key.ljust(width), "bold"), "  ", value))


def _state_change(action: Callable[[Session], Session], verb: str) -> Callable[..., None]:
    def command(session_id: SessionId, url: Url = None, api_key: ApiKey = None,
                as_json: Json = False) -> None:
        with _client(url, api_key, as_json) as box:
            session = action(box.sessions.get(session_id))
            session.refresh()
            if as_json:
                _print_json(_session_json(session))
            else:
                out.print(f"{session.id} {session.state}")

    command.__doc__ = f"{verb} a session; prints its new state."
    return command


def register(app: typer.Typer) -> None:
    """Add the client commands to the ``deskbox`` app."""

    @app.command()
    def create(
        width: Annotated[int | None, typer.Option(help="Display width.")] = None,
        height: Annotated[int | None, typer.Option(help="Display height.")] = None,
        start_url: Annotated[str | None, typer.Option(help="Page the browser opens.")] = None,
        backend: Annotated[str | None, typer.Option(help=BACKEND_HELP)] = None,
        label: Annotated[list[str] | None, typer.Option(
            help="KEY=VALUE; repeat for several.")] = None,
        timeout_s: Annotated[int | None, typer.Option(help="Idle timeout (seconds).")] = None,
        from_snapshot: Annotated[str | None, typer.Option(help="Snapshot id.")] = None,
        wait: Annotated[bool, typer.Option(help="Wait until it runs.")] = True,
        record: Annotated[bool, typer.Option(
            "--record", help="Record it (deskbox export saves the recording).")] = False,
        idempotency_key: Annotated[str | None, typer.Option(
            help="A key of yours: run again with it (after a timeout), it prints the session "
                 "the first run made instead of making another.")] = None,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Create a session; prints its id."""
        display = {k: v for k, v in (("width", width), ("height", height)) if v is not None}
        with _client(url, api_key, as_json) as box:
            with err.status("starting a desktop…", spinner="dots"):
                session = box.sessions.create(
                    display=display or None, start_url=start_url, backend=backend,
                    labels=_labels(label or []), timeout_s=timeout_s,
                    from_snapshot=from_snapshot, wait=wait, record=record or None,
                    idempotency_key=idempotency_key,
                )
            if as_json:
                _print_json(_session_json(session))
            else:
                out.print(session.id)

    @app.command("ls")
    def list_sessions(
        state: Annotated[str | None, typer.Option(help="Only sessions in this state.")] = None,
        label: Annotated[list[str] | None, typer.Option(
            help="KEY=VALUE; repeat to require several.")] = None,
        wide: Annotated[bool, typer.Option(
            "--wide", help="Every column, whatever the terminal's width.")] = False,
        limit: Annotated[int | None, typer.Option(
            min=1, help="Only the newest N (default: all).")] = None,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """List sessions, newest first (ids are never cut; narrow terminals leave columns
        out)."""
        with _client(url, api_key, as_json) as box:
            sessions = box.sessions.list(state=state, labels=_labels(label or []), limit=limit)
            if as_json:
                _print_json([_session_json(s) for s in sessions])
                return
            rows = [
                (s.id, s.state, s.data.backend, f"{s.display.width}x{s.display.height}",
                 s.data.created_at, ", ".join(f"{k}={v}" for k, v in s.labels.items()))
                for s in sessions
            ]
            render_table(sys.stdout, rows, None if wide else terminal_width())

    @app.command()
    def show(session_id: SessionId, url: Url = None, api_key: ApiKey = None,
             as_json: Json = False) -> None:
        """Show one session."""
        with _client(url, api_key, as_json) as box:
            session = box.sessions.get(session_id)
            if as_json:
                _print_json(_session_json(session))
            else:
                _show(session)

    @app.command()
    def screenshot(
        session_id: SessionId,
        output: Annotated[str, typer.Option(
            "--output", "-o", help="File to write; '-' for stdout.")] = "screenshot.png",
        format: Annotated[str | None, typer.Option(  # noqa: A002
            help="png, jpeg or webp (default: from the file name, else png).")] = None,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Save a screenshot."""
        suffix = Path(output).suffix.lower().lstrip(".")
        chosen = format or {"jpg": "jpeg", "jpeg": "jpeg", "webp": "webp"}.get(suffix, "png")
        if chosen not in ("png", "jpeg", "webp"):
            _usage(f"unknown format {chosen!r}")
        with _client(url, api_key, as_json) as box:
            data = box.sessions.get(session_id).screenshot(format=chosen)
        if output == "-":
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            return
        _write(Path(output), data)
        if as_json:
            _print_json({"path": output, "format": chosen, "size": len(data)})
        else:
            err.print(f"saved {output} ({len(data)} bytes)", highlight=False)

    @app.command()
    def act(
        session_id: SessionId,
        actions: Annotated[str, typer.Argument(
            help='One action, a list, or {"actions": [...]}; e.g. '
                 '\'{"type": "click", "x": 10, "y": 20}\'.', show_default=False)],
        screenshot_out: Annotated[str | None, typer.Option(
            "--screenshot", help="Also save a settled screenshot to this file.")] = None,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Run actions (API.md "Actions"); prints their results as JSON."""
        try:
            parsed = json.loads(actions)
        except ValueError as error:
            _usage(f"the actions are not JSON: {error}")
        if isinstance(parsed, dict) and "actions" in parsed:
            parsed = parsed["actions"]
        if not isinstance(parsed, dict | list) or not parsed:
            _usage("give an action object or a list of them")
        if screenshot_out:
            _check_writable(Path(screenshot_out))
        with _client(url, api_key, as_json) as box:
            shot = {"format": "png"} if screenshot_out else None
            result = box.sessions.get(session_id).act(parsed, screenshot=shot)
        if screenshot_out and result.screenshot is not None:
            _write(Path(screenshot_out), result.screenshot.data, " (the actions ran)")
        _print_json(_results_json(result))

    @app.command("exec", context_settings={"ignore_unknown_options": True})
    def exec_command(
        session_id: SessionId,
        cmd: Annotated[list[str], typer.Argument(help="The command: deskbox exec ID -- ls -l",
                                                 show_default=False)],
        timeout_s: Annotated[float, typer.Option(help="Kill the command after this.")] = 30,
        env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE; repeatable.")] = None,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Run a command in the sandbox; exits with its exit code (124 on timeout)."""
        with _client(url, api_key, as_json) as box:
            done = box.sessions.get(session_id).exec(
                cmd, timeout_s=timeout_s, env=_labels(env or []))
        if as_json:
            _print_json(asdict(done))
        else:
            sys.stdout.write(done.stdout)
            sys.stdout.flush()
            sys.stderr.write(done.stderr)
            if done.stdout_truncated or done.stderr_truncated:
                err.print("[yellow]output truncated[/yellow]")
        if done.timed_out:
            raise typer.Exit(124)
        raise typer.Exit(done.exit_code or 0)

    @app.command()
    def view(
        session_id: SessionId,
        control: Annotated[bool, typer.Option(help="A link that may send input.")] = False,
        ttl_s: Annotated[int, typer.Option(help="Lifetime of the link's token.")] = 600,
        open_browser: Annotated[bool, typer.Option("--open", help="Open it here.")] = False,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Print a link to the live view (read-only unless --control)."""
        with _client(url, api_key, as_json) as box:
            link = box.sessions.get(session_id).view_url(
                "control" if control else "view", ttl_s=ttl_s)
        if as_json:
            _print_json({"url": link})
        else:
            out.print(link)
        if open_browser:
            webbrowser.open(link)

    app.command("pause")(_state_change(lambda s: s.pause(), "Freeze"))
    app.command("resume")(_state_change(lambda s: s.resume(), "Resume"))
    app.command("hibernate")(_state_change(lambda s: s.hibernate(), "Hibernate"))

    @app.command()
    def fork(
        session_id: SessionId,
        count: Annotated[int, typer.Option("-n", "--count", help="How many copies.")] = 1,
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Fork a session into N new running sessions; prints their ids."""
        with _client(url, api_key, as_json) as box:
            forks = box.sessions.get(session_id).fork(count)
        if as_json:
            _print_json([_session_json(s) for s in forks])
        else:
            for s in forks:
                out.print(s.id)

    @app.command("rm")
    def remove(
        session_ids: Annotated[list[str], typer.Argument(help="Session ids.",
                                                         show_default=False)],
        url: Url = None, api_key: ApiKey = None, as_json: Json = False,
    ) -> None:
        """Destroy sessions (idempotent)."""
        with _client(url, api_key, as_json) as box:
            for session_id in session_ids:
                box.sessions.delete(session_id)
                if not as_json:
                    out.print(session_id)
        if as_json:
            _print_json({"deleted": session_ids})


def _results_json(result: ActionsResult) -> dict[str, Any]:
    def one(item: dict[str, Any] | Screenshot) -> dict[str, Any]:
        if isinstance(item, Screenshot):
            return {"media_type": item.media_type, "width": item.width,
                    "height": item.height, "size": len(item.data)}
        return item

    body: dict[str, Any] = {"results": [one(r) for r in result.results]}
    if result.screenshot is not None:
        body["screenshot"] = one(result.screenshot)
    return body
