"""The kubernetes engine's tests run against the stand-in API server (standin.py): no
Kubernetes API server can run on these machines. Its pods are real containers of the OCI
image in the suite's Podman service, each in a network namespace of its own, so that the
engine reaches every agent over TCP on a pod IP as it would in a cluster.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.docker.daemon import Daemon
from deskbox_server.engines.image import OCI_ARCHIVE

from ..docker.podman import Podman
from ..images import oci_image
from .standin import standin_process

NAMESPACE = "deskbox-test"


def pytest_collection_finish(session: pytest.Session) -> None:
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).parent == here for item in session.items):
        oci_image()


@dataclass
class StandIn:
    url: str
    image: str
    podman: Podman
    log: Path

    def get(self, path: str) -> Any:
        response = httpx.get(self.url + path, timeout=10)
        response.raise_for_status()
        return response.json()

    def objects(self, plural: str) -> list[dict[str, Any]]:
        prefix = {"networkpolicies": "/apis/networking.k8s.io/v1",
                  "leases": "/apis/coordination.k8s.io/v1"}.get(plural, "/api/v1")
        items: list[dict[str, Any]] = self.get(
            f"{prefix}/namespaces/{NAMESPACE}/{plural}")["items"]
        return items

    def names(self, plural: str) -> list[str]:
        return [o["metadata"]["name"] for o in self.objects(plural)]

    def pod(self, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        return pod


def load_image(podman: Podman) -> str:
    """The OCI image in Podman's storage, as a node would have pulled it; its name."""
    built = oci_image()
    name = str(json.loads((built / "manifest.json").read_text())["name"])

    async def load() -> None:
        daemon = Daemon(podman.url)
        await daemon.open()
        try:
            if not await daemon.has_image(name):
                await daemon.load_image(built / OCI_ARCHIVE, lambda line: None)
        finally:
            await daemon.close()

    asyncio.run(load())
    return name


@pytest.fixture(scope="package")
def standin(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    image = load_image(podman)
    log = tmp_path_factory.mktemp("standin") / "standin.log"
    with standin_process(podman.url, log) as url:
        yield StandIn(url, image, podman, log)
