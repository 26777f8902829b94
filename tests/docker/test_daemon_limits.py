"""The limits a container engine's daemon can enforce, read from what it says of itself
(engines/docker/cgroups.py), and what the docker engine makes of them: its capabilities,
its ``/healthz`` details, its warning, and the limits a create asks for.

A rootless daemon on cgroup v2 whose user was delegated only some controllers drops the
limits it cannot enforce (Podman with a warning, Docker likewise for pids and memory),
while the engine declared ``resources`` and said nothing: a session ran without a pids
limit. The daemons here are a small Engine API on a unix socket answering with the info
documents of Docker and Podman (the engine's own aiodocker client talks to it as to a
daemon); the real Podman of this host is read in test_docker_sessions.py and
test_rootless.py.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from deskbox_server.engines.base import EngineLacks, SessionSpec
from deskbox_server.engines.docker.daemon import DaemonRefused
from deskbox_server.engines.docker.engine import DockerEngine, DockerOptions
from deskbox_server.schemas.sessions import Resources

pytestmark = pytest.mark.timeout(30)

_CGROUP_ALL = {"MemoryLimit": True, "SwapLimit": True, "CpuCfsQuota": True,
                  "CpuCfsPeriod": True, "PidsLimit": True}


@dataclass
class Said:
    """One daemon: its product, its ``/info`` and (Podman) its ``/libpod/info``."""

    product: str
    info: dict[str, Any]
    libpod_info: dict[str, Any] | None = None
    created: list[dict[str, Any]] = field(default_factory=list)


async def _engine_api(said: Said, socket: Path) -> web.AppRunner:
    async def version(_: web.Request) -> web.Response:
        return web.json_response({"ApiVersion": "1.41", "Version": "4.3.1",
                                  "Components": [{"Name": said.product}]})

    async def info(_: web.Request) -> web.Response:
        return web.json_response(said.info)

    async def libpod_info(_: web.Request) -> web.Response:
        if said.libpod_info is None:
            return web.json_response({"message": "page not found"}, status=404)
        return web.json_response(said.libpod_info)

    async def create(request: web.Request) -> web.Response:
        said.created.append(await request.json())
        return web.json_response({"message": "the test keeps it from running"}, status=500)

    async def remove(_: web.Request) -> web.Response:
        return web.json_response({"message": "no such container"}, status=404)

    app = web.Application()
    app.add_routes([web.get("/version", version), web.get("/v1.41/version", version),
                    web.get("/v1.41/info", info), web.get("/v1.41/libpod/info", libpod_info),
                    web.post("/v1.41/containers/create", create),
                    web.delete("/v1.41/containers/{name}", remove)])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(socket)).start()
    return runner


@dataclass
class Seen:
    capabilities: list[str]
    details: dict[str, str]
    refusal: str  # what a create with resources is told
    host_config: dict[str, Any]  # what a create without asks the daemon for


def engine_on(said: Said, state_dir: Path) -> Seen:
    async def run() -> Seen:
        with tempfile.TemporaryDirectory(prefix="dbx-api-") as own:
            socket = Path(own) / "api.sock"
            runner = await _engine_api(said, socket)
            engine = DockerEngine(DockerOptions(url=f"unix://{socket}", state_dir=state_dir,
                                                image="localhost/deskbox-session:test"))
            try:
                await engine.prepare()
                try:
                    engine.check(SessionSpec(id="ses_limited", resources=Resources(pids=256)))
                    refusal = ""
                except EngineLacks as lacks:
                    refusal = lacks.message
                with pytest.raises(DaemonRefused, match="keeps it from running"):
                    await engine.create(SessionSpec(id="ses_default"), timeout_s=5.0)
            finally:
                await engine.close()
                await runner.cleanup()
            (body,) = said.created
            return Seen(sorted(engine.capabilities), engine.describe(), refusal,
                        body["HostConfig"])

    return asyncio.run(run())


def test_docker_without_the_pids_limit_drops_resources_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rootless Docker on cgroup v2 whose user has no pids controller (info: PidsLimit
    false): a default create gets memory and its CPU quota but asks for no pids limit the
    daemon would drop."""
    said = Said("Docker Engine", {"CgroupVersion": "2", "CgroupDriver": "systemd",
                                  "SecurityOptions": ["name=seccomp,profile=builtin",
                                                      "name=rootless"],
                                  **_CGROUP_ALL, "PidsLimit": False})
    with caplog.at_level(logging.WARNING, logger="deskbox.docker"):
        seen = engine_on(said, tmp_path)
    assert seen.capabilities == ["adopt", "exec", "freeze"]
    assert seen.details["limits"] == (
        "cpu, memory (no pids limit: the daemon's info says PidsLimit false)")
    assert seen.details["rootless"] == "yes"
    assert seen.refusal.startswith("resources needs the capability 'resources', which the "
                                   "docker engine lacks")
    (warning,) = [r.getMessage() for r in caplog.records if "limit" in r.getMessage()]
    assert "no pids limit" in warning and warning.endswith("; resources refused")
    assert "PidsLimit" not in seen.host_config
    assert seen.host_config["Memory"] == seen.host_config["MemorySwap"] == 2048 * 1024 ** 2


def test_podman_reads_its_delegated_controllers_not_the_hosts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rootless Podman on cgroup v2 delegated memory and pids only (a distribution's
    default): its compatible info's booleans are the host's and say every limit holds;
    its own info's controllers say what does. No CPU quota is asked for (nor applied
    once the desktop is ready)."""
    said = Said("Podman Engine", {"CgroupVersion": "2", "CgroupDriver": "systemd",
                                  "SecurityOptions": ["name=seccomp,profile=default"],
                                  "Rootless": True, **_CGROUP_ALL},
                {"host": {"cgroupVersion": "v2", "cgroupControllers": ["memory", "pids"]}})
    with caplog.at_level(logging.WARNING, logger="deskbox.docker"):
        seen = engine_on(said, tmp_path)
    assert seen.capabilities == ["adopt", "exec", "freeze"]
    assert seen.details["limits"] == (
        "memory, pids (no cpu limit: the daemon's user was not delegated the cpu "
        "controller)")
    assert "docker engine lacks" in seen.refusal
    assert any("no cpu limit" in r.getMessage() for r in caplog.records)
    assert seen.host_config["PidsLimit"] == 1024
    assert seen.host_config["Memory"] == 2048 * 1024 ** 2
    assert "NanoCpus" not in seen.host_config and "CpuQuota" not in seen.host_config


def test_a_daemon_that_does_not_say_keeps_every_limit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither Docker's booleans nor Podman's controllers in the answers (an older daemon,
    a Podman whose own API refuses): every limit, as before the engine read them."""
    said = Said("Podman Engine", {"CgroupVersion": "2"}, None)
    with caplog.at_level(logging.WARNING, logger="deskbox.docker"):
        seen = engine_on(said, tmp_path)
    assert seen.capabilities == ["adopt", "exec", "freeze", "resources"]
    assert seen.details["limits"] == "cpu, memory, pids"
    assert "rootless" not in seen.details and seen.refusal == ""
    assert seen.host_config["PidsLimit"] == 1024
    assert not [r for r in caplog.records if "limit" in r.getMessage()]


def test_rootless_on_cgroup_v1_has_no_limits_whatever_its_info_says(tmp_path: Path) -> None:
    """What rootless Podman 4.3 answers on this host: its compatible info says every limit
    holds (the host's cgroup mounts), its own info lists no controller; rootless on cgroup
    v1 there is no cgroup at all."""
    said = Said("Podman Engine", {"CgroupVersion": "1", "CgroupDriver": "cgroupfs",
                                  "SecurityOptions": ["name=seccomp,profile=default"],
                                  "Rootless": True, **_CGROUP_ALL},
                {"host": {"cgroupVersion": "v1", "cgroupControllers": []}})
    seen = engine_on(said, tmp_path)
    assert seen.capabilities == ["adopt", "exec"]
    assert seen.details["rootless"] == "yes, on cgroup v1: no limits and no pause"
    assert seen.details["limits"] == (
        "none (no cpu, memory, pids limits, no pause: rootless on cgroup v1, no cgroup to "
        "put a container in)")
    assert not {"PidsLimit", "Memory", "NanoCpus"} & set(seen.host_config)
