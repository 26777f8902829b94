"""The sandbox's init starts deskbox-agent once the X server is ready and starts it again
when it exits; the host links its socket like the X socket and checks the listener."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from deskbox_server.agent import PROTOCOL
from deskbox_server.engines.runc.displays import listener_pid, namespace_pid, same_pid_namespace
from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox
from deskbox_server.engines.runc.stream import (
    AGENT_SOCKET,
    agent_link,
    ensure_agent_link,
)
from deskbox_server.errors import DesktopFailed, Timeout

from ..sandbox_agent import agent_desktop, connect_agent, until_ready, wait_ready
from .conftest import exec_in


def agent_listener(sandbox: RuncSandbox) -> int:
    return listener_pid(sandbox.socket_dir / AGENT_SOCKET)


def test_the_agent_runs_in_the_sandbox_and_its_socket_is_linked(
    sandbox: RuncSandbox,
) -> None:
    assert sandbox.init_pid is not None
    pid = agent_listener(sandbox)
    assert same_pid_namespace(pid, sandbox.init_pid)
    assert listener_pid(agent_link(sandbox)) == pid
    assert os.stat(agent_link(sandbox)).st_ino == os.stat(sandbox.socket_dir / AGENT_SOCKET).st_ino

    async def hello() -> int:
        client = await connect_agent(sandbox)
        try:
            await client.health()
            return client.hello_info.protocol
        finally:
            await client.close()

    assert asyncio.run(hello()) == PROTOCOL
    assert "agent" in sandbox.timings


def test_a_killed_agent_is_started_again_and_relinked(sandbox: RuncSandbox) -> None:
    first = agent_listener(sandbox)
    inner = namespace_pid(first)
    assert exec_in(sandbox, "kill", "-9", str(inner)).returncode == 0
    deadline = time.monotonic() + 15
    while True:
        try:
            again = agent_listener(sandbox)
            if again != first:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the init did not start the agent again"
        time.sleep(0.05)
    log = exec_in(sandbox, "cat", "/run/deskbox/session.log").stdout
    assert log.count("started agent") == 2, log
    # The host's old link leads to the dead socket; taking it again finds the new agent.
    with pytest.raises(OSError):
        listener_pid(agent_link(sandbox))
    ensure_agent_link(sandbox)
    assert listener_pid(agent_link(sandbox)) == again


def test_a_symlink_at_the_agents_path_is_refused(sandbox: RuncSandbox) -> None:
    """A sandbox process that puts a symlink (to the host's or another session's socket) at
    the agent's path gets no link of it."""
    real = sandbox.socket_dir / AGENT_SOCKET
    assert exec_in(sandbox, "sh", "-c", "cd /tmp/.X11-unix && mv deskbox-agent agent-real "
                   "&& ln -s /run/anything deskbox-agent").returncode == 0
    try:
        agent_link(sandbox).unlink()
        with pytest.raises(DesktopFailed, match="not a socket"):
            ensure_agent_link(sandbox, timeout_s=2)
        assert not agent_link(sandbox).exists()
    finally:
        assert exec_in(sandbox, "sh", "-c", "cd /tmp/.X11-unix && rm deskbox-agent "
                       "&& mv agent-real deskbox-agent").returncode == 0
    ensure_agent_link(sandbox)
    assert listener_pid(agent_link(sandbox)) == listener_pid(real)


def test_the_inits_children_get_stdio_and_a_session_each_and_nothing_else(
    sandbox: RuncSandbox,
) -> None:
    """The init starts its children with posix_spawn: stdin /dev/null, output to their
    log under /run/deskbox, each the leader of its own session (killpg ends a browser's
    whole tree)."""
    status = json.loads(exec_in(sandbox, "cat", "/run/deskbox/status.json").stdout)
    for name, pid in status["pids"].items():
        script = f"ps -o sid= -p {pid}; ls -l /proc/{pid}/fd | awk 'NR>1 {{print $9, $11}}'"
        lines = exec_in(sandbox, "sh", "-c", script).stdout.strip().split("\n")
        assert int(lines[0]) == int(pid), (name, lines)
        fds = dict(line.split(" ", 1) for line in lines[1:])
        assert fds["0"] == "/dev/null", (name, fds)
        if name != "browser":  # Chromium points its stdio elsewhere itself
            assert fds["1"] == fds["2"] == f"/run/deskbox/{name}.log", (name, fds)


@contextlib.contextmanager
def own_sandbox(options: RuncOptions, name: str) -> Iterator[RuncSandbox]:
    """A ready sandbox of the test's own, for tests that break its browser."""
    box = RuncSandbox.start(options, f"t-{name}-{os.getpid()}")
    try:
        until_ready(box)
        yield box
    finally:
        box.destroy()


def kill_browser_after(box: RuncSandbox, script: str) -> subprocess.CompletedProcess[str]:
    """Runs the shell ``script`` in the sandbox, kills its browser, and waits until the
    init started a new one (a chromium with a higher pid than the script's shell); the
    sandbox must stay alive all the while."""
    status = json.loads(exec_in(box, "cat", "/run/deskbox/status.json").stdout)
    done = exec_in(box, "sh", "-c", f"{script}; kill -9 {status['pids']['browser']}; echo $$")
    last_pid = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 15
    while not any(int(pid) > last_pid and comm == "chromium" for pid, comm in (
            line.split() for line in exec_in(box, "ps", "-e", "-o", "pid=,comm=")
            .stdout.splitlines())):
        assert box.failure() is None, box.failure()
        assert time.monotonic() < deadline, "the init did not start the browser again"
        time.sleep(0.1)
    return done


def test_a_profile_that_is_no_directory_does_not_end_the_session(options: RuncOptions) -> None:
    """The init clears the profile's lock files before it starts the browser again; a
    profile path that a user's command turned into a file used to kill PID 1 (and the
    session) there. Now the browser is started again and says what it makes of it."""
    with own_sandbox(options, "profile-file") as box:
        kill_browser_after(box, "rm -rf /root/chromium && echo > /root/chromium")
        assert box.failure() is None
        assert exec_in(box, "true").returncode == 0


def test_an_init_that_ends_says_why_to_the_host(options: RuncOptions) -> None:
    """Its X server killed, the init ends the sandbox: the reason was only in the init's
    log, gone with the sandbox, and the host said "the sandbox ... exited"."""
    with own_sandbox(options, "xserver-killed") as box:
        assert exec_in(box, "sh", "-c", "kill -9 $(pidof Xvfb)").returncode == 0
        deadline = time.monotonic() + 15
        while (failure := box.failure()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert failure == (f"the sandbox {box.container_id} exited "
                           "(its init: xserver exited with -9)"), failure


def test_a_full_run_directory_does_not_end_the_session(options: RuncOptions) -> None:
    """The init's log and status.json live in the sandbox's small /run, which its user can
    fill; PID 1 then goes on without them and still starts the browser again."""
    with own_sandbox(options, "full-run") as box:
        filled = kill_browser_after(box, "dd if=/dev/zero of=/run/fill bs=64k")
        assert "No space left on device" in filled.stderr, filled.stderr
        # Room again: the desktop comes up as before.
        assert exec_in(box, "rm", "/run/fill").returncode == 0
        asyncio.run(wait_ready(box))


# A loop inside the sandbox that kills every Chromium process it finds for 5 s: a browser
# that keeps crashing as it starts. It ends by itself: a `runc exec` killed from the host
# leaves its process to a reaper outside the sandbox, and the sandbox's init can then not
# finish dying.
_KILL_BROWSERS = (
    "import os, signal, time\n"
    "end = time.monotonic() + 5\n"
    "while time.monotonic() < end:\n"
    "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "        try:\n"
    "            if open(f'/proc/{pid}/comm').read().strip() == 'chromium':\n"
    "                os.kill(int(pid), signal.SIGKILL)\n"
    "        except OSError:\n"
    "            pass\n"
    "    time.sleep(0.02)\n"
)


def test_a_browser_that_keeps_dying_is_named_in_the_ready_timeout(options: RuncOptions) -> None:
    """``ready`` that found no browser window in time quotes the init's log, so the session's
    start error says why (here: the browser killed as it starts, again and again)."""
    with own_sandbox(options, "crashing-browser") as box:
        killer = subprocess.Popen(
            [*box.options.runc.command(), "exec", box.container_id, "python3", "-c",
             _KILL_BROWSERS], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 5
            while "exited with -9" not in exec_in(box, "cat", "/run/deskbox/session.log").stdout:
                assert time.monotonic() < deadline, "the browser was not killed"
                time.sleep(0.05)

            async def ready() -> None:
                async with agent_desktop(box) as desktop:
                    await desktop.ready(True, 3.0)

            with pytest.raises(Timeout) as timed_out:
                asyncio.run(ready())
        finally:
            killer.wait(timeout=30)
        message = str(timed_out.value)
        assert "waiting for the browser window; the session's init: " in message, message
        assert re.search(r'"\d+\.\d+ deskbox-session: (browser \(pid \d+\) exited with -9|'
                         r"restarting the browser in [\d.]+ s|started browser \(pid \d+\))",
                         message), message


# Inside the sandbox: kill the browser, then stop the one the init starts next (its pid
# is in status.json at once, Chromium's window comes 0.2 s or more later): a browser that
# hangs before it shows a window.
_HANG_NEXT_BROWSER = (
    "import json, os, signal, time\n"
    "def browser():\n"
    "    try:\n"
    "        return json.load(open('/run/deskbox/status.json'))['pids'].get('browser')\n"
    "    except (OSError, ValueError):\n"
    "        return None\n"
    "old = browser()\n"
    "os.kill(old, signal.SIGKILL)\n"
    "end = time.monotonic() + 10\n"
    "while time.monotonic() < end:\n"
    "    new = browser()\n"
    "    if new not in (None, old):\n"
    "        os.kill(new, signal.SIGSTOP)\n"
    "        print(new)\n"
    "        raise SystemExit(0)\n"
    "    time.sleep(0.002)\n"
    "raise SystemExit('no new browser')\n"
)


def test_a_browser_stuck_without_a_window_is_started_again(options: RuncOptions) -> None:
    """A browser that shows no window and uses no CPU (here: stopped as it starts) is
    killed while ``ready`` waits, 10 s after it was first seen; the init starts it again
    and the desktop comes up."""
    with own_sandbox(options, "stuck-browser") as box:
        hung = exec_in(box, "python3", "-c", _HANG_NEXT_BROWSER)
        assert hung.returncode == 0, hung.stderr
        stopped = int(hung.stdout)
        started = time.monotonic()
        stages = asyncio.run(wait_ready(box))
        assert 10 <= time.monotonic() - started < 25, stages
        log = exec_in(box, "cat", "/run/deskbox/session.log").stdout
        assert f"browser (pid {stopped}) exited with -9" in log, log
        assert log.count("started browser") == 3, log
