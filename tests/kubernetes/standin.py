"""A stand-in for a Kubernetes API server: just the calls the kubernetes engine makes, in
Kubernetes' JSON shapes, with each Pod backed by a real container.

No Kubernetes API server can run on these machines, so the engine's tests run against
this. It keeps Pods, Secrets, NetworkPolicies, PersistentVolumeClaims and Leases of any
namespace in memory (names, uids, resourceVersions, labels, owner references and their
garbage collection, label selectors, JSON merge patches of labels, annotations, owner
references, a Secret's data and a Lease's spec, watches with resourceVersion and
timeoutSeconds, Status bodies for errors), and acts as the kubelet and the network: a
Pod gets a network namespace of its own with one veth to this host (its "pod IP",
10.251.N.2; no route beyond this host, so no egress at all), its Secret volumes as
read-only files, its emptyDir volumes as tmpfs, its PersistentVolumeClaims as host
directories (one per claim, made when the claim is and removed with it: "Bound" at once,
no size limit), and its container runs in Podman (the Engine API at ``--engine``) from
the image of that name. Leases are kept and served, nothing more (no leader election).

A test may have it hold the next create of a kind (``POST /standin/hold``): the request
waits that long before the object is made, and is made then whether its client still
waits or not, as a busy API server goes on with a request its client gave up.
``GET /standin/hold`` says which kinds are armed, and which creates are being held. Or
answer the next requests of a method and kind (or of one object) with an error status and
nothing done (``POST /standin/fail``), as a throttled or failing API server does, or only
later (``"delay"``), as a slow one does; ``GET /standin/fail`` says which of those are
still to come, ``DELETE`` drops them; ``GET /standin/faulted`` says when each request so
answered came and was answered.

What it does not do: authentication, admission, scheduling, quotas, image pulls (an image
Podman lacks gives ErrImagePull), restarts (restartPolicy is Never), NetworkPolicy
enforcement (its objects are kept and served; a pod here reaches only this host anyway).

Run: ``python -m tests.kubernetes.standin --listen 127.0.0.1:PORT --engine unix:///…``;
it prints ``standin listening on http://…`` once it serves. :func:`standin_process` does
that for the tests and bench/engines.py.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from deskbox_server.engines.docker.daemon import Daemon
from deskbox_server.errors import DeskboxError

__all__ = ["StandIn", "main", "selects", "standin_process"]

Obj = dict[str, Any]

KINDS = {
    # plural → (kind, apiVersion)
    "pods": ("Pod", "v1"),
    "secrets": ("Secret", "v1"),
    "networkpolicies": ("NetworkPolicy", "networking.k8s.io/v1"),
    "persistentvolumeclaims": ("PersistentVolumeClaim", "v1"),
    "leases": ("Lease", "coordination.k8s.io/v1"),
}
_STANDIN_LABEL = "io.deskbox.standin"
_POLL_S = 0.5


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Failure", "message": message, "reason": reason,
                              "code": code}, status=code)


def merged(target: Obj, patch: Obj) -> Obj:
    """A JSON merge patch (RFC 7386) of an object: null removes a key, an object merges."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def selects(selector: str, labels: dict[str, str]) -> bool:
    """A label selector's equality and existence terms (what the engine sends)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@dataclass
class Watcher:
    plural: str
    namespace: str
    selector: str
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)


@dataclass
class PodNetwork:
    netns: str
    host_veth: str
    ip: str


class Store:
    """The objects, their versions and the watches on them."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}  # (plural, namespace, name)
        self.versions = itertools.count(1)
        self.version = 0
        self.watchers: list[Watcher] = []
        self.events: list[tuple[int, str, str, str, Obj]] = []  # rv, type, plural, ns, obj

    def bump(self) -> str:
        self.version = next(self.versions)
        return str(self.version)

    def publish(self, kind: str, plural: str, namespace: str, obj: Obj) -> None:
        copy = json.loads(json.dumps(obj))
        self.events.append((self.version, kind, plural, namespace, copy))
        del self.events[:-1000]
        for watcher in self.watchers:
            if (watcher.plural == plural and watcher.namespace == namespace
                    and selects(watcher.selector, obj["metadata"].get("labels") or {})):
                watcher.queue.put_nowait({"type": kind, "object": copy})

    def put(self, plural: str, namespace: str, obj: Obj, event: str) -> Obj:
        obj["metadata"]["resourceVersion"] = self.bump()
        self.objects[(plural, namespace, obj["metadata"]["name"])] = obj
        self.publish(event, plural, namespace, obj)
        return obj

    def remove(self, plural: str, namespace: str, name: str) -> Obj | None:
        obj = self.objects.pop((plural, namespace, name), None)
        if obj is not None:
            obj["metadata"]["resourceVersion"] = self.bump()
            self.publish("DELETED", plural, namespace, obj)
        return obj

    def listed(self, plural: str, namespace: str, selector: str) -> list[Obj]:
        return [obj for (p, ns, _), obj in sorted(self.objects.items())
                if p == plural and ns == namespace
                and selects(selector, obj["metadata"].get("labels") or {})]


class Kubelet:
    """Runs each Pod as a Podman container in a network namespace of its own."""

    def __init__(self, store: Store, engine_url: str) -> None:
        self.store = store
        self.daemon = Daemon(engine_url)
        self.files = Path(tempfile.mkdtemp(prefix="dbx-standin-"))
        self.tasks: dict[str, asyncio.Task[None]] = {}  # pod uid
        self.networks: dict[str, PodNetwork] = {}
        # Each pod's network as it is made: a thread that runs on when the pod is deleted
        # meanwhile (a cancelled to_thread does not stop it), which stop() waits for.
        self.making: dict[str, asyncio.Future[PodNetwork]] = {}
        self.containers: dict[str, str] = {}
        self.slots = iter(range(1, 250))

    async def close(self) -> None:
        for uid in list(self.tasks):
            await self.stop(uid)
        await self.daemon.close()
        shutil.rmtree(self.files, ignore_errors=True)

    def start(self, namespace: str, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        self.tasks[uid] = asyncio.create_task(self._kubelet(namespace, pod["metadata"]["name"],
                                                            uid))

    async def _kubelet(self, namespace: str, name: str, uid: str) -> None:
        """Runs the pod; what breaks here fails the pod, with the error as its message."""
        try:
            await self._run(namespace, name, uid)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the stand-in's own failure, shown
            traceback.print_exc()
            self._set_status(namespace, name, uid, {"phase": "Failed", "reason": "StandIn",
                                                    "message": repr(error)})

    async def stop(self, uid: str) -> None:
        task = self.tasks.pop(uid, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        making = self.making.pop(uid, None)
        if making is not None and uid not in self.networks:
            # Deleted while its network was being made: the namespace came all the same.
            with contextlib.suppress(Exception):
                self.networks[uid] = await making
        container = self.containers.pop(uid, None)
        if container is not None:
            with contextlib.suppress(DeskboxError):
                await self.daemon.remove(container)
        network = self.networks.pop(uid, None)
        if network is not None:
            await asyncio.to_thread(_delete_network, network)
        shutil.rmtree(self.files / uid, ignore_errors=True)

    def _set_status(self, namespace: str, name: str, uid: str, status: Obj) -> None:
        pod = self.store.objects.get(("pods", namespace, name))
        if pod is None or pod["metadata"]["uid"] != uid:
            return
        pod["status"] = status
        self.store.put("pods", namespace, pod, "MODIFIED")

    async def _secret(self, namespace: str, name: str) -> Obj:
        """A Secret a volume names, waited for as the kubelet waits (the pod stays
        ContainerCreating until it exists)."""
        while True:
            secret = self.store.objects.get(("secrets", namespace, name))
            if secret is not None:
                return secret
            await asyncio.sleep(_POLL_S)

    def claim_directory(self, claim: Obj) -> Path:
        """The host directory that stands in for a claim's volume."""
        return self.files / f"claim-{claim['metadata']['uid']}"

    async def _claim(self, namespace: str, name: str) -> Obj:
        """A claim a volume names, waited for as the kubelet waits for a Secret."""
        while True:
            claim = self.store.objects.get(("persistentvolumeclaims", namespace, name))
            if claim is not None:
                return claim
            await asyncio.sleep(_POLL_S)

    async def _run(self, namespace: str, name: str, uid: str) -> None:
        pod = self.store.objects[("pods", namespace, name)]
        spec = pod["spec"]
        container = spec["containers"][0]
        waiting: Obj = {"phase": "Pending", "containerStatuses": [
            {"name": container["name"], "ready": False, "restartCount": 0,
             "image": container["image"], "state": {"waiting": {"reason": "ContainerCreating"}}}]}
        if not await self.daemon.has_image(container["image"]):
            waiting["containerStatuses"][0]["state"]["waiting"] = {
                "reason": "ErrImagePull",
                "message": f"rpc error: image {container['image']!r} not found"}
            self._set_status(namespace, name, uid, waiting)
            return
        binds = []
        own = self.files / uid
        own.mkdir(mode=0o700)
        mounts = {m["name"]: m for m in container.get("volumeMounts") or []}
        tmpfs: dict[str, str] = {}
        for volume in spec.get("volumes") or []:
            mount = mounts.get(volume["name"])
            if mount is None:
                continue
            if "secret" in volume:
                secret_name = volume["secret"]["secretName"]
                secret = await self._secret(namespace, secret_name)
                directory = own / volume["name"]
                directory.mkdir()
                for key, value in (secret.get("data") or {}).items():
                    path = directory / key
                    path.write_bytes(base64.b64decode(value))
                    path.chmod(volume["secret"].get("defaultMode", 0o644))
                binds.append(f"{directory}:{mount['mountPath']}:ro")
            elif "persistentVolumeClaim" in volume:
                source = volume["persistentVolumeClaim"]
                claim = await self._claim(namespace, source["claimName"])
                read_only = source.get("readOnly") or mount.get("readOnly")
                binds.append(f"{self.claim_directory(claim)}:{mount['mountPath']}"
                             f"{':ro' if read_only else ''}")
            elif "emptyDir" in volume:
                size = str(volume["emptyDir"].get("sizeLimit", "64Mi")).replace("Mi", "m")
                tmpfs[mount["mountPath"]] = f"rw,nosuid,nodev,size={size}"
        slot = next(self.slots)
        making = self.making[uid] = asyncio.ensure_future(
            asyncio.to_thread(_make_network, slot))
        network = self.networks[uid] = await asyncio.shield(making)
        context = container.get("securityContext") or {}
        limits = (container.get("resources") or {}).get("limits") or {}
        memory = _bytes(limits.get("memory", "2Gi"))
        nofile = 4096
        body: Obj = {
            "Image": container["image"],
            "Hostname": spec.get("hostname") or name,
            "Env": [f"{e['name']}={e['value']}" for e in container.get("env") or []],
            "Labels": {_STANDIN_LABEL: uid},
            "HostConfig": {
                "NetworkMode": f"ns:/run/netns/{network.netns}",
                "CapDrop": list((context.get("capabilities") or {}).get("drop") or []),
                "SecurityOpt": (["no-new-privileges"]
                                if context.get("allowPrivilegeEscalation") is False else []),
                "ReadonlyRootfs": bool(context.get("readOnlyRootFilesystem")),
                "Tmpfs": tmpfs,
                "Binds": binds,
                "Memory": memory,
                "MemorySwap": memory,
                "NanoCpus": int(_cpus(limits.get("cpu", "1")) * 1e9),
                # Podman 4.3's defaults are above what its runtime may set here.
                "Ulimits": [{"Name": "nofile", "Soft": nofile, "Hard": nofile},
                            {"Name": "nproc", "Soft": 4096, "Hard": 4096}],
                "LogConfig": {"Type": "none", "Config": {}},
            },
        }
        if container.get("command"):
            body["Entrypoint"] = container["command"]
        if container.get("args"):
            body["Cmd"] = container["args"]
        container_id = await self.daemon.create(f"standin-{uid}", body)
        self.containers[uid] = container_id
        await self.daemon.start(container_id)
        running: Obj = {"phase": "Running", "podIP": network.ip, "podIPs": [{"ip": network.ip}],
                   "hostIP": "127.0.0.1", "startTime": now(), "containerStatuses": [
                       {"name": container["name"], "ready": True, "restartCount": 0,
                        "image": container["image"], "imageID": container["image"],
                        "containerID": f"podman://{container_id}",
                        "state": {"running": {"startedAt": now()}}}]}
        self._set_status(namespace, name, uid, running)
        while True:
            await asyncio.sleep(_POLL_S)
            inspected = await self.daemon.inspect(container_id)
            state = (inspected or {}).get("State") or {}
            if inspected is not None and (state.get("Running") or state.get("Paused")):
                continue
            code = int(state.get("ExitCode", 137))
            reason = ("OOMKilled" if state.get("OOMKilled")
                      else "Completed" if code == 0 else "Error")
            ended = dict(running, phase="Succeeded" if code == 0 else "Failed")
            ended["containerStatuses"] = [dict(running["containerStatuses"][0], ready=False,
                                               state={"terminated": {"exitCode": code,
                                                                     "reason": reason}})]
            self._set_status(namespace, name, uid, ended)
            return


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def _make_network(slot: int) -> PodNetwork:
    # deskbox-…: the suite's leak check looks for what is left of these too.
    netns, host = f"deskbox-k8s-{os.getpid()}-{slot}", f"dbxk{os.getpid() % 100000}h{slot}"
    _run("ip", "netns", "add", netns)
    _run("ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", netns)
    _run("ip", "addr", "add", f"10.251.{slot}.1/30", "dev", host)
    _run("ip", "link", "set", host, "up")
    _run("ip", "-n", netns, "addr", "add", f"10.251.{slot}.2/30", "dev", "eth0")
    _run("ip", "-n", netns, "link", "set", "eth0", "up")
    _run("ip", "-n", netns, "link", "set", "lo", "up")
    return PodNetwork(netns, host, f"10.251.{slot}.2")


def _delete_network(network: PodNetwork) -> None:
    subprocess.run(["ip", "link", "del", network.host_veth], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", network.netns], capture_output=True, check=False)


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 1000, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def _cpus(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


class StandIn:
    def __init__(self, engine_url: str) -> None:
        self.store = Store()
        self.kubelet = Kubelet(self.store, engine_url)
        self.requests: list[tuple[str, str]] = []  # method, path: what the engine called
        self.armed: dict[str, float] = {}  # plural: how long its next create is held
        self.holding: list[str] = []  # the plurals whose create is being held now
        self.failing: list[Obj] = []  # POST /standin/fail's, each until its count is used
        # The requests a fault answered: method, path, and when (time.monotonic()) each
        # came and was answered.
        self.faulted: list[tuple[str, str, float, float]] = []

    def app(self) -> web.Application:
        app = web.Application()
        for prefix in ("/api/v1", "/apis/networking.k8s.io/v1", "/apis/coordination.k8s.io/v1"):
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}", self.collection)
            app.router.add_route("*", prefix + "/namespaces/{ns}/{plural}/{name}", self.item)
        app.router.add_get("/standin/requests", self.recorded)
        app.router.add_post("/standin/hold", self.arm)
        app.router.add_get("/standin/hold", self.held)
        app.router.add_post("/standin/fail", self.fail)
        app.router.add_get("/standin/fail", self.faults)
        app.router.add_delete("/standin/fail", self.faults)
        app.router.add_get("/standin/faulted", self.answered_faults)
        return app

    async def fail(self, request: web.Request) -> web.Response:
        """``{"method": "POST", "plural": "pods", "status": 429, "times": 1,
        "retry_after": 1}``: the next ``times`` such requests answer ``status`` (with that
        Retry-After, if given), and make, change or read nothing. With ``"name"``: only the
        requests of that one object. With ``"delay": 1.5`` instead of a status: each is
        answered as it would be, that many seconds after it came."""
        self.failing.append(dict(await request.json()))
        return web.json_response(self.failing)

    async def faults(self, request: web.Request) -> web.Response:
        """The faults still to come; a DELETE drops them (and answers them)."""
        answer = web.json_response(self.failing)
        if request.method == "DELETE":
            self.failing = []
        return answer

    async def answered_faults(self, request: web.Request) -> web.Response:
        return web.json_response([list(f) for f in self.faulted])

    async def _failed(self, request: web.Request) -> web.Response | None:
        """The answer of the first fault that matches the request, if any; None to go on
        (no fault, or one that only delayed it)."""
        for fault in self.failing:
            if (fault["method"] == request.method
                    and fault["plural"] == request.match_info["plural"]
                    and fault.get("name", request.match_info.get("name"))
                    == request.match_info.get("name")):
                fault["times"] -= 1
                if fault["times"] <= 0:
                    self.failing.remove(fault)
                came = time.monotonic()
                if "delay" in fault:
                    await asyncio.sleep(float(fault["delay"]))
                    self.faulted.append((request.method, request.path, came, time.monotonic()))
                    return None
                self.faulted.append((request.method, request.path, came, came))
                response = status_body(int(fault["status"]), "StandInFault",
                                       "the stand-in was told to refuse this")
                if "retry_after" in fault:
                    response.headers["Retry-After"] = str(fault["retry_after"])
                return response
        return None

    async def arm(self, request: web.Request) -> web.Response:
        """``{"plural": "pods", "seconds": 1.5}``: hold the next create of that kind."""
        body = await request.json()
        self.armed[str(body["plural"])] = float(body["seconds"])
        return await self.held(request)

    async def held(self, request: web.Request) -> web.Response:
        return web.json_response({"armed": sorted(self.armed), "holding": self.holding})

    async def _hold(self, plural: str) -> None:
        seconds = self.armed.pop(plural, None)
        if seconds is None:
            return
        self.holding.append(plural)
        try:
            # aiohttp leaves a handler running when its client goes (handler_cancellation
            # is off), so the object is made after this all the same.
            await asyncio.sleep(seconds)
        finally:
            self.holding.remove(plural)

    async def recorded(self, request: web.Request) -> web.Response:
        return web.json_response([list(r) for r in self.requests])

    def _plural(self, request: web.Request) -> str | None:
        plural = request.match_info["plural"]
        if plural not in KINDS:
            return None
        api = KINDS[plural][1]  # served under its own group only
        prefix = f"/apis/{api}/" if "/" in api else f"/api/{api}/"
        return plural if request.path.startswith(prefix) else None

    async def collection(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        if (refused := await self._failed(request)) is not None:
            return refused
        plural, ns = self._plural(request), request.match_info["ns"]
        if plural is None:
            return status_body(404, "NotFound", f"the server could not find {request.path}")
        if request.method == "GET":
            selector = request.query.get("labelSelector", "")
            # As the API server parses it (Go's ParseBool): the client sends "True".
            if request.query.get("watch", "").lower() in ("true", "1", "t"):
                return await self.watch(request, plural, ns, selector)
            kind, api = KINDS[plural]
            return web.json_response({"kind": kind + "List", "apiVersion": api,
                                      "metadata": {"resourceVersion": str(self.store.version)},
                                      "items": self.store.listed(plural, ns, selector)})
        if request.method == "POST":
            try:
                obj = await request.json()
                name = obj["metadata"]["name"]
            except (ValueError, KeyError, TypeError):
                return status_body(400, "BadRequest", "the body is not an object with a name")
            await self._hold(plural)
            if (plural, ns, name) in self.store.objects:
                return status_body(409, "AlreadyExists",
                                   f'{plural} "{name}" already exists')
            kind, api = KINDS[plural]
            obj.update(kind=kind, apiVersion=api)
            obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()),
                                   creationTimestamp=now())
            if plural == "secrets":
                for key, value in (obj.pop("stringData", None) or {}).items():
                    obj.setdefault("data", {})[key] = base64.b64encode(value.encode()).decode()
            if plural == "pods":
                obj["status"] = {"phase": "Pending"}
            if plural == "persistentvolumeclaims":  # bound at once to a directory
                self.kubelet.claim_directory(obj).mkdir(mode=0o755)
                obj["status"] = {"phase": "Bound"}
            self.store.put(plural, ns, obj, "ADDED")
            if plural == "pods":
                self.kubelet.start(ns, obj)
            return web.json_response(obj, status=201)
        return status_body(405, "MethodNotAllowed", f"{request.method} is not served here")

    async def item(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path_qs))
        if (refused := await self._failed(request)) is not None:
            return refused
        plural, ns = self._plural(request), request.match_info["ns"]
        name = request.match_info["name"]
        if plural is None:
            return status_body(404, "NotFound", f"the server could not find {request.path}")
        obj = self.store.objects.get((plural, ns, name))
        if obj is None:
            return status_body(404, "NotFound", f'{plural} "{name}" not found')
        if request.method == "GET":
            return web.json_response(obj)
        if request.method == "DELETE":
            await self.delete(plural, ns, obj)
            return web.json_response(obj)
        if request.method == "PATCH":
            patch = await request.json()
            expected = (patch.get("metadata") or {}).get("resourceVersion")
            if expected is not None and expected != obj["metadata"]["resourceVersion"]:
                return status_body(409, "Conflict", f'Operation cannot be fulfilled on {plural} '
                                   f'"{name}": the object has been modified')
            for key in ("labels", "annotations"):
                for label, value in ((patch.get("metadata") or {}).get(key) or {}).items():
                    if value is None:
                        obj["metadata"].setdefault(key, {}).pop(label, None)
                    else:
                        obj["metadata"].setdefault(key, {})[label] = value
            meta = patch.get("metadata") or {}
            if "ownerReferences" in meta:  # a merge patch replaces a list, null removes it
                if meta["ownerReferences"] is None:
                    obj["metadata"].pop("ownerReferences", None)
                else:
                    obj["metadata"]["ownerReferences"] = meta["ownerReferences"]
            if plural == "leases" and isinstance(patch.get("spec"), dict):
                obj["spec"] = merged(obj.get("spec") or {}, patch["spec"])
            if plural == "secrets":
                for key, value in (patch.get("data") or {}).items():
                    if value is None:
                        obj.setdefault("data", {}).pop(key, None)
                    else:
                        obj.setdefault("data", {})[key] = value
            return web.json_response(self.store.put(plural, ns, obj, "MODIFIED"))
        return status_body(405, "MethodNotAllowed", f"{request.method} is not served here")

    async def delete(self, plural: str, ns: str, obj: Obj) -> None:
        uid = obj["metadata"]["uid"]
        if plural == "pods":
            # As the API server does: marked first (watchers see it going), then the kubelet
            # stops it, then it is gone.
            obj["metadata"]["deletionTimestamp"] = now()
            self.store.put(plural, ns, obj, "MODIFIED")
            await self.kubelet.stop(uid)
        self.store.remove(plural, ns, obj["metadata"]["name"])
        if plural == "persistentvolumeclaims":
            shutil.rmtree(self.kubelet.claim_directory(obj), ignore_errors=True)
        # The garbage collector: what this object owned goes with it.
        for (other_plural, other_ns, _), other in list(self.store.objects.items()):
            owners = other["metadata"].get("ownerReferences") or []
            if other_ns == ns and any(o.get("uid") == uid for o in owners):
                await self.delete(other_plural, other_ns, other)

    async def watch(self, request: web.Request, plural: str, ns: str, selector: str
                    ) -> web.StreamResponse:
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        since = request.query.get("resourceVersion", "")
        watcher = Watcher(plural, ns, selector)
        if since and since != "0":
            oldest = self.store.events[0][0] if self.store.events else self.store.version + 1
            if int(since) < oldest - 1 and int(since) < self.store.version:
                return status_body(410, "Expired", f"too old resource version: {since}")
            backlog = [{"type": t, "object": o} for rv, t, p, n, o in self.store.events
                       if rv > int(since) and p == plural and n == ns
                       and selects(selector, o["metadata"].get("labels") or {})]
        else:
            backlog = [{"type": "ADDED", "object": o}
                       for o in self.store.listed(plural, ns, selector)]
        self.store.watchers.append(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            for event in backlog:
                await response.write(json.dumps(event).encode() + b"\n")
            async with asyncio.timeout(timeout):
                while (change := await watcher.queue.get()) is not None:
                    await response.write(json.dumps(change).encode() + b"\n")
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self.store.watchers.remove(watcher)
        return response

    async def run(self, host: str, port: int) -> None:
        await self.kubelet.daemon.open()
        runner = web.AppRunner(self.app(), handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        print(f"standin listening on http://{host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            for watcher in self.store.watchers:
                watcher.queue.put_nowait(None)
            await self.kubelet.close()
            await runner.cleanup()


async def _serve(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    await StandIn(args.engine).run(host, int(port))


@contextlib.contextmanager
def standin_process(engine_url: str, log: Path) -> Iterator[str]:
    """The stand-in as a process of its own on a free loopback port; its URL. Its pods and
    their network namespaces go when it ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    with open(log, "ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.kubernetes.standin", "--listen",
             f"127.0.0.1:{port}", "--engine", engine_url],
            cwd=repo, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=output)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        if not line.startswith("standin listening on"):
            raise RuntimeError(f"the stand-in did not start: {log.read_text()[-3000:]}")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="standin")
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--engine", required=True, metavar="URL",
                        help="the Engine API the pods run in (Podman's service)")
    asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()

