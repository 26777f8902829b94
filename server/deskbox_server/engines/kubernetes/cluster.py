"""The kubernetes engine's one kept connection to the Kubernetes API, through
kubernetes_asyncio.

Only the calls the engine makes, on plain dicts in Kubernetes' JSON shapes (the manifests of
spec.py go out as they are, and what comes back is read as JSON), each mapped onto our
errors: a refusal names what the API server said (:class:`ClusterRefused`), and an API
server that does not answer is named with its address.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException

from ...errors import Internal, SessionFailed, UpstreamRefused

__all__ = ["Cluster", "ClusterRefused", "Obj"]

Obj = dict[str, Any]
T = TypeVar("T")
# An API server that accepts connections and never answers would hold a create's cleanup,
# a delete and the shutdown that wait for it, for ever: the client has no timeout of its
# own. Every call is bounded (a watch by its own timeout_seconds, and the same again).
_CALL_TIMEOUT_S = 30.0
# The longest a call waits before it asks again, whatever Retry-After says.
_THROTTLED_WAIT_S = 5.0
# A read is asked again, for this long in all, when the API server failed it (5xx) or did
# not answer it: it changes nothing, and an API server restarting behind its load balancer
# (a refused or reset connection, a 503) or etcd electing a leader (a 504 timeout) answers
# a later try. Not a write: one the API server may have done before it failed is not sent
# twice.
_READ_RETRY_S = 60.0
_FIRST_BACKOFF_S = 0.25
_FAILING = frozenset({500, 502, 503, 504})
_IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ClusterRefused(UpstreamRefused):
    """The API server answered with an error status."""

    def __init__(self, what: str, status: int, message: str, note: str = "") -> None:
        super().__init__("the Kubernetes API", what, status, message)
        if note:  # how it was asked
            self.message += note
            self.args = (self.message,)


class Cluster:
    """``api``: the API server's URL (no credentials: a stand-in, or ``kubectl proxy``);
    empty: in-cluster (the pod's service account) when run in a pod, else the kubeconfig
    (``$KUBECONFIG``, ~/.kube/config) and its current context."""

    def __init__(self, api: str, namespace: str, read_retry_s: float = _READ_RETRY_S) -> None:
        self.api = api
        self.namespace = namespace
        self.read_retry_s = read_retry_s
        self._client: client.ApiClient | None = None
        self.where = api

    async def open(self) -> None:
        configuration = client.Configuration()
        try:
            if self.api:
                configuration.host = self.api
            elif os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration)
            else:
                await config.load_kube_config(client_configuration=configuration)
        except (ConfigException, OSError) as error:
            raise Internal(f"no Kubernetes API to use: {error} (set DESKBOX_KUBERNETES_API, "
                           "or run in a pod, or give a kubeconfig)") from None
        self.where = str(configuration.host)
        if not self.namespace:
            self.namespace = await asyncio.to_thread(_in_cluster_namespace)
        self._client = client.ApiClient(configuration)
        try:
            # The first contact is not asked again: a wrong address or an API server that
            # is down is said at once (a pod's restarts back off on their own), where a
            # started server's reads ride out an API server's restart.
            await self._json("list pods", lambda: self._core.list_namespaced_pod(
                self.namespace, limit=1, _preload_content=False))
        except SessionFailed as error:
            await self.close()
            raise Internal(f"the kubernetes engine cannot start: {error}") from None

    async def close(self) -> None:
        if self._client is not None:
            api, self._client = self._client, None
            await api.close()

    @property
    def _api(self) -> client.ApiClient:
        if self._client is None:
            raise Internal("the kubernetes engine is not prepared")
        return self._client

    @property
    def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self._api)

    @property
    def _networking(self) -> client.NetworkingV1Api:
        return client.NetworkingV1Api(self._api)

    @property
    def _coordination(self) -> client.CoordinationV1Api:
        return client.CoordinationV1Api(self._api)

    async def _call(self, what: str, call: Awaitable[T], timeout_s: float = _CALL_TIMEOUT_S
                    ) -> T:
        try:
            async with asyncio.timeout(timeout_s):
                return await call
        except ApiException as error:
            raise ClusterRefused(what, int(error.status or 0), _exception_message(error)
                                 ) from None
        except TimeoutError:
            raise SessionFailed(f"the Kubernetes API at {self.where} did not answer '{what}' "
                                f"within {timeout_s:.3g} s") from None
        except (aiohttp.ClientError, OSError) as error:
            raise SessionFailed(f"the Kubernetes API at {self.where} does not answer "
                                f"({error or type(error).__name__})") from None

    async def _json(self, what: str, call: Callable[[], Awaitable[Any]], read: bool = False
                    ) -> Obj:
        """The JSON object a call answered (called with ``_preload_content=False``, which
        leaves the status to us). A 429 is asked again after its Retry-After, as client-go
        does: the API server did nothing (its priority and fairness turned the request
        away under load), and the next try may pass; only within the call's bound. A
        ``read`` is also asked again, backing off, when it failed or got no answer
        (_READ_RETRY_S); then the last error says for how long it was asked."""
        started = time.monotonic()
        bound_s = self.read_retry_s if read else _CALL_TIMEOUT_S
        backoff_s, tries = _FIRST_BACKOFF_S, 0
        while True:
            tries += 1
            left_s = bound_s - (time.monotonic() - started)
            try:
                status, reason, retry_after, body = await self._answer(
                    what, call, min(_CALL_TIMEOUT_S, left_s) if read else _CALL_TIMEOUT_S)
            except ClusterRefused:
                raise
            except SessionFailed as error:  # no answer at all
                if not read:
                    raise
                if not await self._again(started, bound_s, backoff_s):
                    raise SessionFailed(error.message + _asked_for(started, tries)) from None
                backoff_s = min(2 * backoff_s, _THROTTLED_WAIT_S)
                continue
            if status == 429 or (read and status in _FAILING):
                wait_s = retry_after or (1.0 if status == 429 else backoff_s)
                if await self._again(started, bound_s, wait_s):
                    backoff_s = min(2 * backoff_s, _THROTTLED_WAIT_S)
                    continue
            if not 200 <= status <= 299:
                raise ClusterRefused(what, status, _message(body, reason),
                                     _asked_for(started, tries))
            if not isinstance(body, dict):
                raise SessionFailed(f"the Kubernetes API answered {what} with no object")
            return body

    @staticmethod
    async def _again(started: float, bound_s: float, wait_s: float) -> bool:
        """Wait ``wait_s`` (at most _THROTTLED_WAIT_S) and say so, if the next try still
        starts within ``bound_s`` of ``started``; else say no at once."""
        wait_s = min(wait_s, _THROTTLED_WAIT_S)
        if time.monotonic() - started + wait_s >= bound_s:
            return False
        await asyncio.sleep(wait_s)
        return True

    async def _answer(self, what: str, call: Callable[[], Awaitable[Any]], timeout_s: float
                      ) -> tuple[int, str | None, float | None, Any]:
        """One call's status, reason, Retry-After (seconds, if it says) and JSON body."""
        response = await self._call(what, call(), timeout_s)
        try:
            raw = await self._call(what, response.read(), timeout_s)
        finally:
            response.release()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        return response.status, response.reason, _seconds(
            response.headers.get("Retry-After")), body

    # -- pods ------------------------------------------------------------------------------

    async def create_pod(self, manifest: Obj) -> Obj:
        return await self._json("create a pod", lambda: self._core.create_namespaced_pod(
            self.namespace, _as_body(manifest), _preload_content=False))

    async def read_pod(self, name: str) -> Obj | None:
        """The pod, or None if there is none of that name."""
        return await self._read("read a pod", self._core.read_namespaced_pod, name)

    async def delete_pod(self, name: str) -> bool:
        """Whether there was one to delete; its Secret and NetworkPolicy go with it (they
        name it as their owner)."""
        return await self._delete("delete a pod", self._core.delete_namespaced_pod, name)

    async def patch_pod(self, name: str, patch: Obj) -> Obj:
        """A JSON merge patch (RFC 7386: null removes) of the pod's metadata."""
        # The client's signature leaves out _content_type, which its body reads.
        merge: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
        return await self._json("patch a pod", lambda: self._core.patch_namespaced_pod(
            name, self.namespace, _as_body(patch), _preload_content=False, **merge))

    async def list_pods(self, selector: str) -> tuple[list[Obj], str]:
        """The pods a label selector picks, and the resourceVersion to watch from."""
        body = await self._json("list pods", lambda: self._core.list_namespaced_pod(
            self.namespace, label_selector=selector, _preload_content=False), read=True)
        return list(body.get("items") or []), str(
            (body.get("metadata") or {}).get("resourceVersion", ""))

    async def watch_pods(self, selector: str, since: str, timeout_s: int
                         ) -> AsyncIterator[tuple[str, Obj]]:
        """(type, pod) events after ``since`` until the API server ends the watch."""
        # "object": the events' objects as the JSON they came in, never checked against
        # the client's models (which refuse what a newer or older API server leaves out).
        stream = watch.Watch(return_type="object")
        try:
            async for event in stream.stream(
                    self._core.list_namespaced_pod, self.namespace, label_selector=selector,
                    resource_version=since, timeout_seconds=timeout_s,
                    allow_watch_bookmarks=False,
                    # A connection gone half-open would otherwise end pod-death news for good.
                    _request_timeout=timeout_s + _CALL_TIMEOUT_S):
                raw = event.get("raw_object")
                if isinstance(raw, dict):
                    yield str(event.get("type", "")), raw
        except ApiException as error:
            raise ClusterRefused("watch pods", int(error.status or 0),
                                 _exception_message(error)) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            raise SessionFailed(f"the Kubernetes API at {self.where} does not answer "
                                f"({error or type(error).__name__})") from None
        finally:
            stream.stop()
            await stream.close()

    # -- secrets and network policies ------------------------------------------------------

    async def create_secret(self, manifest: Obj) -> Obj:
        return await self._json("create a secret", lambda: self._core.create_namespaced_secret(
            self.namespace, _as_body(manifest), _preload_content=False))

    async def read_secret(self, name: str) -> Obj | None:
        return await self._read("read a secret", self._core.read_namespaced_secret, name)

    async def delete_secret(self, name: str) -> bool:
        return await self._delete("delete a secret", self._core.delete_namespaced_secret, name)

    async def patch_secret(self, name: str, patch: Obj) -> Obj | None:
        """A JSON merge patch of the secret (null removes a key); None if there is none."""
        merge: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
        try:
            return await self._json("patch a secret", lambda: self._core.patch_namespaced_secret(
                name, self.namespace, _as_body(patch), _preload_content=False, **merge))
        except ClusterRefused as error:
            if error.upstream_status == 404:
                return None
            raise

    async def list_secrets(self, selector: str) -> list[Obj]:
        body = await self._json("list secrets", lambda: self._core.list_namespaced_secret(
            self.namespace, label_selector=selector, _preload_content=False), read=True)
        return list(body.get("items") or [])

    async def create_network_policy(self, manifest: Obj) -> Obj:
        return await self._json(
            "create a network policy", lambda: self._networking.create_namespaced_network_policy(
                self.namespace, _as_body(manifest), _preload_content=False))

    async def list_network_policies(self, selector: str) -> list[Obj]:
        body = await self._json(
            "list network policies", lambda: self._networking.list_namespaced_network_policy(
                self.namespace, label_selector=selector, _preload_content=False), read=True)
        return list(body.get("items") or [])

    async def delete_network_policy(self, name: str) -> bool:
        return await self._delete("delete a network policy",
                                  self._networking.delete_namespaced_network_policy, name)

    # -- persistent volume claims ---------------------------------------------------------

    async def create_claim(self, manifest: Obj) -> Obj | None:
        """The claim, or None if one of that name exists already."""
        try:
            return await self._json(
                "create a persistent volume claim",
                lambda: self._core.create_namespaced_persistent_volume_claim(
                    self.namespace, _as_body(manifest), _preload_content=False))
        except ClusterRefused as error:
            if error.upstream_status == 409:
                return None
            raise

    async def delete_claim(self, name: str) -> bool:
        return await self._delete("delete a persistent volume claim",
                                  self._core.delete_namespaced_persistent_volume_claim, name)

    # -- leases (the replicas' heartbeats, replicas.py) -------------------------------------

    async def create_lease(self, manifest: Obj) -> Obj:
        return await self._json(
            "create a lease", lambda: self._coordination.create_namespaced_lease(
                self.namespace, _as_body(manifest), _preload_content=False))

    async def patch_lease(self, name: str, patch: Obj) -> Obj | None:
        """A JSON merge patch of the lease; None if there is none."""
        merge: dict[str, Any] = {"_content_type": "application/merge-patch+json"}
        try:
            return await self._json(
                "patch a lease", lambda: self._coordination.patch_namespaced_lease(
                    name, self.namespace, _as_body(patch), _preload_content=False, **merge))
        except ClusterRefused as error:
            if error.upstream_status == 404:
                return None
            raise

    async def list_leases(self, selector: str) -> list[Obj]:
        body = await self._json("list leases", lambda: self._coordination.list_namespaced_lease(
            self.namespace, label_selector=selector, _preload_content=False), read=True)
        return list(body.get("items") or [])

    async def delete_lease(self, name: str) -> bool:
        return await self._delete("delete a lease", self._coordination.delete_namespaced_lease,
                                  name)

    # -- shared ----------------------------------------------------------------------------

    async def _read(self, what: str, method: Callable[..., Awaitable[Any]], name: str
                    ) -> Obj | None:
        try:
            return await self._json(what, lambda: method(name, self.namespace,
                                                         _preload_content=False), read=True)
        except ClusterRefused as error:
            if error.upstream_status == 404:
                return None
            raise

    async def _delete(self, what: str, method: Callable[..., Awaitable[Any]], name: str
                      ) -> bool:
        try:
            await self._json(what, lambda: method(name, self.namespace, grace_period_seconds=0,
                                          propagation_policy="Background",
                                          _preload_content=False))
        except ClusterRefused as error:
            if error.upstream_status == 404:
                return False
            raise
        return True


def _message(body: Any, reason: str | None) -> str:
    """The message of the Status body the API server sent, else its reason phrase."""
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])[:500]
    return str(reason or "no reason given")


def _asked_for(started: float, tries: int) -> str:
    """How long a call that failed was asked, if more than once."""
    if tries < 2:
        return ""
    return f" (asked {tries} times in {time.monotonic() - started:.0f} s)"


def _seconds(header: str | None) -> float | None:
    """A Retry-After of seconds (what the API server sends); None for anything else."""
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:
        return None


def _exception_message(error: ApiException) -> str:
    try:
        body = json.loads(error.body or "")
    except (ValueError, TypeError):
        body = None
    return _message(body, error.reason)


def _as_body(manifest: Obj) -> Any:
    """The client's typed methods take its models, and send a dict as it is: our manifests
    are Kubernetes JSON already (spec.py)."""
    return manifest


def _in_cluster_namespace() -> str:
    try:
        return _IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"
