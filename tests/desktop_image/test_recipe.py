"""The image recipe's hash (desktop_image/build.py): what changes it, and so rebuilds.

An image is cached by this hash, so a change to the agent's pinned wheels or to its
package that left the hash alone would leave every session on the old agent.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import pytest

from ..images import REPO
from .conftest import RECIPE


@pytest.fixture
def recipe_dir(build: ModuleType, tmp_path: Path) -> Path:
    """A copy of the recipe (and the server files it shares), to edit."""
    copy = tmp_path / "repo" / "desktop_image"
    shutil.copytree(RECIPE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for shared, _ in build.SHARED_FILES:
        (copy.parent / shared).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / shared, copy.parent / shared)
    return copy


def test_a_new_pin_changes_the_hash_and_not_the_base(build: ModuleType, recipe_dir: Path) -> None:
    before = build.load_recipe(recipe_dir)
    assert before.hash == build.load_recipe(RECIPE).hash  # the copy is the recipe
    requirements = recipe_dir / "agent" / "requirements.txt"
    original = requirements.read_text()
    assert "h2==4.4.1" in original
    requirements.write_text(original.replace("h2==4.4.1", "h2==4.4.2"))
    changed = build.load_recipe(recipe_dir)
    assert changed.hash != before.hash
    assert changed.base_hash == before.base_hash  # no mmdebstrap run for a new wheel
    requirements.write_text(original)
    assert build.load_recipe(recipe_dir).hash == before.hash


def test_the_agent_package_is_part_of_the_recipe(build: ModuleType, recipe_dir: Path) -> None:
    package = recipe_dir / "agent" / "deskbox_agent"
    shutil.rmtree(package, ignore_errors=True)
    without = build.load_recipe(recipe_dir)
    assert without.agent == ()
    package.mkdir()
    (package / "__init__.py").write_text('__version__ = "1"\n')
    (package / "__main__.py").write_text("print('deskbox-agent 1 protocol 1')\n")
    added = build.load_recipe(recipe_dir)
    assert [path for path, _ in added.agent] == ["__init__.py", "__main__.py"]
    assert added.hash != without.hash
    (package / "__init__.py").write_text('__version__ = "2"\n')
    edited = build.load_recipe(recipe_dir)
    assert edited.hash not in (added.hash, without.hash)
    # Bytecode a test run leaves in the source is not the recipe: the build compiles its own.
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"stale")
    (package / "stray.pyc").write_bytes(b"stale")
    assert build.load_recipe(recipe_dir).hash == edited.hash


def test_the_target_is_read_from_the_images_files(build: ModuleType, tmp_path: Path) -> None:
    """The wheels' Python, glibc and bytecode come from the tree, which is never run."""
    pycache = tmp_path / "usr/lib/python3.11/__pycache__"
    pycache.mkdir(parents=True)
    (pycache / "os.cpython-311.pyc").write_bytes(b"\xa7\r\r\n" + bytes(12))
    target = build.agent_install.image_target(
        tmp_path, {"python3": "3.11.2-1+b1", "libc6": "2.36-9+deb12u13"}
    )
    assert (target.python, target.glibc, target.magic) == ((3, 11), (2, 36), b"\xa7\r\r\n")
    args = target.pip_args()
    assert args[:5] == ["--only-binary=:all:", "--implementation", "cp",
                        "--python-version", "3.11"]
    platforms = args[6::2]
    # numpy 2.4's wheel is manylinux_2_27/2_28 only; simplejpeg's carries the 2014 alias.
    assert {"manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux2014_x86_64"} <= set(
        platforms
    )
    assert "manylinux_2_37_x86_64" not in platforms  # newer than the image's glibc
    with pytest.raises(RuntimeError, match="python3"):
        build.agent_install.image_target(tmp_path, {"libc6": "2.36-9"})
