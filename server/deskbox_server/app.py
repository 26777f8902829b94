"""``create_app(settings)``: wires the server together. Nothing is built at import."""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI

from . import __version__
from .api import actions, cdp, dialects, events, health, sessions, snapshots
from .api import console as console_api
from .api import exec as exec_api
from .api import handoff as handoff_api
from .api import recordings as recordings_api
from .api import secrets as secrets_api
from .api import tokens as tokens_api
from .api import vnc as vnc_api
from .api import volumes as volumes_api
from .api.abort import ConnectionAbort
from .api.auth import load_keyring
from .api.deps import Services
from .api.errors import RequestContext, install_error_handlers, install_websocket_fallback
from .api.hosts import HostCheck, HostPolicy
from .api.openapi import install_openapi
from .engines import AnyEngine
from .engines.image import build_image
from .engines.local.engine import LocalEngine
from .engines.runc.engine import RuncEngine
from .engines.runc.sandbox import RuncOptions
from .engines.vm.engine import VmEngine
from .errors import InvalidSetting
from .metrics import Metrics
from .scratch import Scratch
from .sessions.manager import SessionManager
from .sessions.registry import Registry
from .sessions.shared_registry import SharedRegistry
from .settings import Settings

if TYPE_CHECKING:
    from .engines.docker.engine import DockerEngine
    from .engines.kubernetes.engine import KubernetesEngine

__all__ = ["create_app", "default_engines", "docker_engine", "kubernetes_engine", "runc_engine",
           "session_registry", "vm_engine"]

log = logging.getLogger("deskbox.server")
image_log = logging.getLogger("deskbox.image")


def default_engines(settings: Settings) -> dict[str, AnyEngine]:
    """The engines of ``settings.backends`` (by their names on the wire); nothing starts
    before ``prepare()``."""
    known: dict[str, Callable[[Settings], AnyEngine]] = {
        RuncEngine.name: runc_engine,
        VmEngine.name: vm_engine,
        "docker": docker_engine,
        "kubernetes": kubernetes_engine,
        LocalEngine.name: lambda s: LocalEngine(s.state_dir),
    }
    unknown = sorted(set(settings.backends) - set(known))
    if unknown:
        raise InvalidSetting(f"DESKBOX_BACKENDS: unknown backends {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
    if settings.default_backend not in settings.backends:
        raise InvalidSetting(
            f"DESKBOX_DEFAULT_BACKEND: the default backend {settings.default_backend!r} is "
            f"not among the backends offered (DESKBOX_BACKENDS={','.join(settings.backends)})"
        )
    return {name: known[name](settings) for name in settings.backends}


def runc_engine(settings: Settings) -> RuncEngine:
    """Sandboxes under ``state_dir``, from the image built (or found cached) by prepare()."""
    state_dir = settings.state_dir.resolve()
    # Container ids are global on the host (runc, cgroups): this state dir's are its own,
    # so a server's orphan removal never touches another server's (or a test's) sandboxes.
    prefix = "deskbox-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:8] + "-"
    options = RuncOptions(
        state_dir=state_dir,
        rootfs=settings.image_cache_dir / "images" / "unprepared",
        displays=(settings.display_first, settings.display_last),
        id_prefix=prefix,
        max_execs=settings.exec_max_concurrent,
        scratch=Scratch(Path(settings.scratch_dir) if settings.scratch_dir else None,
                        state_dir, "images"),
    )

    return RuncEngine(options, image=_image_builder(settings, "session image", "build.py"))


def vm_engine(settings: Settings) -> VmEngine:
    """VMs under ``state_dir``, from the guest built (or found cached) by prepare(): the
    session image of runc_engine's, with a kernel and an initramfs beside it."""
    guest = _image_builder(settings, "VM guest", "vm_guest.py")
    return VmEngine(settings.state_dir, guest, settings.vm_accelerator,
                    settings.exec_max_concurrent)


def docker_engine(settings: Settings) -> DockerEngine:
    """Containers through the Engine API at ``docker_host``, of the OCI image built (or
    found cached) and loaded into that daemon by prepare()."""
    # Imported here: its HTTP client takes a tenth of a second to import, and a server
    # without this engine should not start slower for it.
    from .engines.docker.engine import DockerEngine, DockerOptions

    options = DockerOptions(url=settings.docker_url, state_dir=settings.state_dir.resolve(),
                            max_execs=settings.exec_max_concurrent)
    return DockerEngine(options, image=_image_builder(settings, "OCI image", "oci_image.py"))


def kubernetes_engine(settings: Settings) -> KubernetesEngine:
    """Pods through the Kubernetes API, of the image the nodes pull (built and pushed by
    the operator: ``deskbox image export``, then a registry)."""
    # Imported here: the Kubernetes client's models take a third of a second to import.
    from .engines.kubernetes.engine import KubernetesEngine, KubernetesOptions

    return KubernetesEngine(KubernetesOptions(
        api=settings.kubernetes_api, namespace=settings.kubernetes_namespace,
        image=settings.kubernetes_image, fleet=settings.kubernetes_fleet,
        server_namespace=settings.kubernetes_server_namespace,
        runtime_class=settings.kubernetes_runtime_class,
        image_pull_policy=settings.kubernetes_image_pull_policy,
        storage_class=settings.kubernetes_storage_class,
        max_execs=settings.exec_max_concurrent,
        replica=settings.kubernetes_replica or (
            "deskbox-" + secrets.token_hex(4) if settings.registry == "cluster" else ""),
        replica_uid=settings.kubernetes_replica_uid, lease_s=settings.kubernetes_lease_s))


def session_registry(settings: Settings, engines: Mapping[str, AnyEngine]) -> Registry:
    """The state dir's registry, or with ``registry=cluster`` the one a fleet of servers
    shares through its one engine's cluster."""
    if settings.registry == "local":
        return Registry(settings.database_path)
    shared = [engine.shared_records for engine in engines.values()]
    if len(shared) != 1 or shared[0] is None:
        raise InvalidSetting(
            "DESKBOX_REGISTRY=cluster needs the kubernetes backend as the server's only one "
            f"(backends: {', '.join(engines) or 'none'}): the cluster holds the records")
    return SharedRegistry(settings.database_path, shared[0])


def _image_builder(settings: Settings, what: str, script_name: str
                   ) -> Callable[[threading.Event], Path]:
    """What an engine's prepare() runs to find or build its image, progress to the log."""

    def build(cancel: threading.Event) -> Path:
        image_log.info("%s: checking %s (builds take minutes the first time)", what,
                       settings.image_cache_dir / "images")
        return build_image(settings.image_cache_dir, settings.recipe_dir,
                           lambda line: image_log.info("%s", line), cancel=cancel,
                           script_name=script_name)

    return build


def create_app(
    settings: Settings | None = None, engines: Mapping[str, AnyEngine] | None = None
) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    engines = engines if engines is not None else default_engines(settings)
    registry = session_registry(settings, engines)
    manager = SessionManager(settings, registry, engines, metrics)
    services = Services(settings, load_keyring(settings), manager, metrics,
                        tokens=manager.tokens)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        log.info("deskbox serving; state in %s", settings.state_dir)
        try:
            yield
        finally:
            await services.vnc.close()
            await manager.shutdown()
            log.info("deskbox stopped every session")

    app = FastAPI(
        title="Deskbox",
        version=__version__,
        summary="Disposable desktops for computer-use agents",
        lifespan=lifespan,
        # FastAPI's own pages load unpinned scripts from a CDN onto the console's origin,
        # where the console keeps the API key: /openapi.json says it all.
        docs_url=None,
        redoc_url=None,
    )
    app.state.services = services
    count = metrics.errors.inc
    install_error_handlers(app, count)
    install_openapi(app)
    # Inside RequestContext: its refusals carry a request id and reach the access log. The
    # name the server was told to listen on (--host) is the operator's own.
    app.add_middleware(HostCheck, policy=HostPolicy(settings.allowed_hosts, settings.host),
                       count=count)
    app.add_middleware(
        RequestContext, max_body_bytes=settings.max_request_bytes, count=count,
        body_limit=exec_api.body_limit(settings),
        body_idle_timeout_s=settings.body_idle_timeout_s,
    )
    app.add_middleware(ConnectionAbort)  # outermost: it needs the server's own send
    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(snapshots.router)
    app.include_router(volumes_api.router)
    app.include_router(secrets_api.router)
    app.include_router(actions.router)
    app.include_router(exec_api.router)
    app.include_router(dialects.router)
    app.include_router(cdp.router)
    app.include_router(events.router)
    app.include_router(tokens_api.router)
    app.include_router(vnc_api.router)
    app.include_router(handoff_api.router)
    app.include_router(recordings_api.router)
    app.include_router(console_api.router())
    vnc_api.mount_assets(app)
    install_websocket_fallback(app, count)
    return app
