"""The README's examples, as a newcomer would paste them, work against a real server.

Only what cannot be pasted is changed: the server's URL and key, and the start page
(example.org would send traffic off this machine), which becomes a local page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from .conftest import KEY_A, Server

README = Path(__file__).parents[2] / "README.md"
PAGE = "data:text/html,README"  # no character a shell or JSON would read
BIN = Path(sys.executable).parent  # the venv's bin: deskbox and this python


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(encoding="utf-8"),
                      re.MULTILINE | re.DOTALL)


def block_starting(language: str, start: str) -> str:
    found = [block for block in blocks(language) if block.startswith(start)]
    assert found, f"the README has no {language} block starting with {start!r}"
    return found[0].replace("https://example.org", PAGE)


def run(script: list[str], server: Server, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKBOX_")}
    env |= {"DESKBOX_URL": server.url, "DESKBOX_API_KEY": KEY_A,
            "PATH": f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"}
    done = subprocess.run(script, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=90, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def state_of(server: Server, session_id: str) -> str:
    answer = httpx.get(f"{server.url}/v1/sessions/{session_id}",
                       headers={"Authorization": f"Bearer {KEY_A}"}, timeout=10)
    answer.raise_for_status()
    state: str = answer.json()["state"]
    return state


def test_the_python_example(local_server: Server, tmp_path: Path) -> None:
    code = block_starting("python", "from deskbox import Deskbox")
    done = run([sys.executable, "-c", code], local_server, tmp_path)
    assert (tmp_path / "screen.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "/view?token=dbt_" in done.stdout  # the live-view link it prints


def test_the_cli_example(local_server: Server, tmp_path: Path) -> None:
    script = block_starting("sh", "export DESKBOX_URL=")
    script = re.sub(r"^export DESKBOX_URL=.*$", "", script, count=1, flags=re.MULTILINE)
    run(["bash", "-euc", script], local_server, tmp_path)
    assert (tmp_path / "screen.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_curl_example(local_server: Server, tmp_path: Path) -> None:
    script = block_starting("sh", "KEY=")
    script = script.replace("$(cat ~/.local/state/deskbox/api_key)", KEY_A)
    script = script.replace("U=http://127.0.0.1:8765", f"U={local_server.url}")
    done = run(["bash", "-euc", script + '\necho "session=$ID"'], local_server, tmp_path)
    assert '"results"' in done.stdout and '"data_b64"' in done.stdout  # the batch's answer
    assert (tmp_path / "shot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    made = re.search(r"session=(ses_\w+)", done.stdout)
    assert made is not None, done.stdout
    assert state_of(local_server, made.group(1)) == "stopped"  # its DELETE worked


def test_the_live_view_example_mints_a_view_token(local_server: Server, tmp_path: Path) -> None:
    mint = [line for line in block_starting("sh", "curl -s").splitlines()
            if "/tokens" in line and "--json" in line]
    assert mint, "the live view example mints no token"
    setup = (f'H="Authorization: Bearer {KEY_A}"; U={local_server.url}\n'
             f"ID=$({BIN}/deskbox create)\n")
    done = run(["bash", "-euc", setup + mint[0] + f'\n{BIN}/deskbox rm "$ID"'],
               local_server, tmp_path)
    assert '"scope":"view"' in done.stdout.replace(" ", ""), done.stdout
    assert '"token":"dbt_' in done.stdout.replace(" ", ""), done.stdout
