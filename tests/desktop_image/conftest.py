"""desktop_image/build.py as a module, for the tests of its parts."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from ..images import REPO

RECIPE = REPO / "desktop_image"


@pytest.fixture(scope="module")
def build() -> Iterator[ModuleType]:
    """desktop_image/build.py as a module (it imports its siblings as top-level modules)."""
    sys.path.insert(0, str(RECIPE))
    try:
        spec = importlib.util.spec_from_file_location("deskbox_image_build", RECIPE / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        yield module
    finally:
        for name in ("deskbox_image_build", "agent_install", "image_store"):
            sys.modules.pop(name, None)
        sys.path.remove(str(RECIPE))
