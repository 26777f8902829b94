"""The kubernetes engine's tests run against the stand-in API server (standin.py): no
Kubernetes API server can run on these machines. Its pods are real containers of the OCI
image in the suite's Podman service, each in a network namespace of its own, so that the
engine reaches every agent over TCP on a pod IP as it would in a cluster.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.docker.daemon import Daemon
from deskbox_server.engines.image import OCI_ARCHIVE

from ..api.served import free_port
from ..docker.podman import Podman
from ..images import REPO, oci_image

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
        prefix = "/apis/networking.k8s.io/v1" if plural == "networkpolicies" else "/api/v1"
        items: list[dict[str, Any]] = self.get(
            f"{prefix}/namespaces/{NAMESPACE}/{plural}")["items"]
        return items

    def names(self, plural: str) -> list[str]:
        return [o["metadata"]["name"] for o in self.objects(plural)]

    def pod(self, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        return pod


def _load_image(podman: Podman) -> str:
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
    image = _load_image(podman)
    log = tmp_path_factory.mktemp("standin") / "standin.log"
    port = free_port()
    with open(log, "ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.kubernetes.standin", "--listen",
             f"127.0.0.1:{port}", "--engine", podman.url],
            cwd=REPO, env=os.environ.copy(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=output)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("standin listening on"), log.read_text()[-3000:]
        yield StandIn(f"http://127.0.0.1:{port}", image, podman, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
