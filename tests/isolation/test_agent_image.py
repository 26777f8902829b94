"""deskbox-agent in the session image (issue 14): its pinned wheels work in a real sandbox.

The image build installs the agent and its wheels into /usr/lib/deskbox-agent, compiled,
with the launcher /usr/local/bin/deskbox-agent. Here, inside a sandbox as its processes
run: every pinned distribution imports with its pinned version and its compiled code runs
(the wheels match the image's Python and glibc), its bytecode is the image Python's, it
is all on the read-only root, and a module planted where a sandbox process can write
(PYTHONPATH, the working directory, the user's site-packages) never reaches the agent.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from deskbox_server.engines.runc.sandbox import RuncSandbox

from ..images import REPO
from .conftest import exec_in

LAUNCHER = "/usr/local/bin/deskbox-agent"
AGENT_DIR = "/usr/lib/deskbox-agent"
AGENT_PACKAGE = REPO / "desktop_image" / "agent" / "deskbox_agent"
# The launcher's own flags and path setup (its main block runs only as __main__).
WITH_LAUNCHER_PATH = f"import runpy; runpy.run_path({LAUNCHER!r})\n"

USE_EVERY_DEPENDENCY = WITH_LAUNCHER_PATH + """
import json, sys
from importlib.metadata import version
import h2.config, h2.connection, hpack, hyperframe, six, mss, simplejpeg, numpy
import Xlib.display, Xlib.ext.xtest
import isal.isal_zlib
import PIL.Image

# The compiled parts run: numpy, libjpeg-turbo, ISA-L, Pillow's codecs, and h2's preface.
pixels = numpy.zeros((32, 48, 4), dtype=numpy.uint8)
pixels[..., 1] = 200
jpeg = simplejpeg.encode_jpeg(pixels, quality=75, colorspace="BGRX")
decoded = simplejpeg.decode_jpeg(jpeg)
deflated = isal.isal_zlib.compress(pixels.tobytes(), 1)
image = PIL.Image.frombuffer("RGB", (48, 32), pixels.tobytes(), "raw", "BGRX", 0, 1)
connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
connection.initiate_connection()
names = sys.argv[1:]
print(json.dumps({
    "versions": {name: version(name) for name in names},
    "files": {module: sys.modules[module].__file__ for module in (
        "h2", "hpack", "hyperframe", "six", "mss", "simplejpeg", "numpy", "Xlib", "isal",
        "PIL")},
    "path": sys.path,
    "flags": [sys.flags.isolated, sys.flags.no_site],
    "jpeg": [jpeg[:2].hex(), list(decoded.shape), int(decoded[5, 5, 1])],
    "inflated": len(isal.isal_zlib.decompress(deflated)),
    "resized": len(image.resize((24, 16)).tobytes()),
    "preface": connection.data_to_send()[:24].decode(),
}))
"""

CHECK_BYTECODE = """
import importlib.util, json, os, sys
problems, count = [], 0
for directory, _, files in os.walk(sys.argv[1]):
    for name in files:
        if not name.endswith(".py"):
            continue
        source = os.path.join(directory, name)
        count += 1
        try:
            with open(importlib.util.cache_from_source(source), "rb") as pyc:
                header = pyc.read(16)
        except OSError as error:
            problems.append(f"{source}: {error}")
            continue
        with open(source, "rb") as file:
            digest = importlib.util.source_hash(file.read())
        flags = int.from_bytes(header[4:8], "little")
        if header[:4] != importlib.util.MAGIC_NUMBER or flags != 1 or header[8:] != digest:
            problems.append(f"{source}: magic {header[:4].hex()}, flags {flags}")
print(json.dumps({"sources": count, "problems": problems[:20]}))
"""

# Writes where the agent's files are; each line says what happened.
WRITE_ATTACK = f"""
import errno, os
def attempt(label, action):
    try:
        action()
        print(label, "WROTE")
    except OSError as error:
        print(label, errno.errorcode.get(error.errno, error.errno))
attempt("append", lambda: open({AGENT_DIR + "/h2/__init__.py"!r}, "ab").close())
attempt("plant", lambda: open({AGENT_DIR + "/planted.py"!r}, "w").close())
attempt("launcher", lambda: open({LAUNCHER!r}, "ab").close())
attempt("remove", lambda: os.unlink({AGENT_DIR + "/six.py"!r}))
attempt("rename", lambda: os.rename({AGENT_DIR + "/h2"!r}, {AGENT_DIR + "/h2-old"!r}))
print("readonly", bool(os.statvfs({AGENT_DIR!r}).f_flag & os.ST_RDONLY))
"""

# A fake agent everywhere a sandbox process can write and Python might look.
PLANT = """
for dir in /tmp/plant /root/.local/lib/python3.11/site-packages; do
    mkdir -p "$dir/deskbox_agent" && : > "$dir/deskbox_agent/__init__.py" &&
    echo 'print("PLANTED")' > "$dir/deskbox_agent/__main__.py"
done
cd /tmp/plant
PYTHONPATH=/tmp/plant PYTHONSTARTUP=/tmp/plant/deskbox_agent/__main__.py \
    PYTHONUSERBASE=/root/.local /usr/local/bin/deskbox-agent --version
"""


def pins() -> dict[str, str]:
    text = (REPO / "desktop_image" / "agent" / "requirements.txt").read_text()
    return dict(re.findall(r"(?m)^([A-Za-z0-9_.-]+)==(\S+)", text))


def run_python(sandbox: RuncSandbox, script: str, *args: str) -> str:
    done = exec_in(sandbox, "/usr/bin/python3", "-IS", "-c", script, *args, timeout_s=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_pinned_wheel_imports_and_runs_through_the_launchers_path(
    sandbox: RuncSandbox,
) -> None:
    pinned = pins()
    assert {"h2", "hpack", "hyperframe", "python-xlib", "mss", "simplejpeg", "numpy",
            "isal"} <= set(pinned)
    report = json.loads(run_python(sandbox, USE_EVERY_DEPENDENCY, *pinned))
    assert report["versions"] == pinned
    assert all(path.startswith(AGENT_DIR + "/") for path in report["files"].values()), (
        report["files"]
    )
    assert report["flags"] == [1, 1]
    # Only the standard library and the agent's directory: no dist-packages, no home.
    assert report["path"][-1] == AGENT_DIR
    assert all(entry.startswith("/usr/lib/") for entry in report["path"]), report["path"]
    magic, shape, green = report["jpeg"]
    assert (magic, shape) == ("ffd8", [32, 48, 3]) and abs(green - 200) <= 3
    assert report["inflated"] == 32 * 48 * 4
    assert report["resized"] == 24 * 16 * 3
    assert report["preface"] == "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def test_every_module_has_the_image_pythons_bytecode(sandbox: RuncSandbox) -> None:
    """Compiled on the host, checked by the image's own Python: its magic number, and the
    hash of the very source beside it (a read-only root cannot take a cache later)."""
    report = json.loads(run_python(sandbox, CHECK_BYTECODE, AGENT_DIR))
    assert report["sources"] > 100
    assert report["problems"] == []


def test_a_sandbox_process_cannot_change_the_agent(sandbox: RuncSandbox) -> None:
    lines = run_python(sandbox, WRITE_ATTACK).split("\n")
    assert lines[:6] == [
        "append EROFS", "plant EROFS", "launcher EROFS", "remove EROFS", "rename EROFS",
        "readonly True",
    ]


def test_the_launcher_ignores_a_planted_agent(sandbox: RuncSandbox) -> None:
    """The attack: a fake deskbox_agent on PYTHONPATH, in the working directory and in the
    user's site-packages (all writable in a sandbox). The launcher runs the image's."""
    done = exec_in(sandbox, "sh", "-c", PLANT)
    assert "PLANTED" not in done.stdout + done.stderr
    if (AGENT_PACKAGE / "__main__.py").is_file():  # the agent was in the image's recipe
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(r"deskbox-agent \S+ protocol 1\n", done.stdout), done.stdout
    else:  # its dependencies only: the launcher looks for the agent in its one place
        assert done.returncode == 1
        assert "No module named deskbox_agent" in done.stderr, done.stderr


def test_the_launcher_is_the_one_in_the_repository(sandbox: RuncSandbox) -> None:
    launcher = REPO / "desktop_image" / "rootfs" / LAUNCHER.lstrip("/")
    inside = exec_in(sandbox, "cat", LAUNCHER)
    assert inside.stdout == launcher.read_text()
    assert exec_in(sandbox, "sh", "-c", f"test -x {LAUNCHER}").returncode == 0


def test_the_content_manifest_covers_the_agent(image_rootfs: Path) -> None:
    """Every file of the agent is in contents.jsonl with its hash, so `deskbox image verify`
    and the restore checks of issue 13 cover it like the rest of the image."""
    recorded: dict[str, str] = {}
    with open(image_rootfs.parent / "contents.jsonl") as contents:
        for line in contents:
            path, _, digest = json.loads(line)
            recorded[path] = digest
    files = [LAUNCHER.lstrip("/")]
    for directory, _, names in os.walk(image_rootfs / AGENT_DIR.lstrip("/")):
        files += [str(Path(directory, name).relative_to(image_rootfs)) for name in names]
    assert len(files) > 500
    for relative in files:
        digest = hashlib.sha256((image_rootfs / relative).read_bytes()).hexdigest()
        assert recorded.get(relative) == digest, relative
