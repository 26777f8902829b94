"""The kubernetes engine's retries of the deletes the API server failed (deletes.py),
against the stand-in API server with its faults: bounded, once per object, given up and
reported when they cannot pass, and ended at close with nothing left running. That a
session's failed deletes are retried until its objects are gone is
test_kubernetes_sessions.py's (through a server)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from deskbox_server.engines.kubernetes.cluster import Cluster, ClusterRefused
from deskbox_server.engines.kubernetes.deletes import DeleteRetries

from .conftest import NAMESPACE, StandIn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"


@contextlib.asynccontextmanager
async def opened(standin: StandIn) -> AsyncIterator[Cluster]:
    """A cluster client of the test's own loop; the stand-in's faults dropped after."""
    cluster = Cluster(standin.url, NAMESPACE)
    await cluster.open()
    try:
        yield cluster
    finally:
        async with httpx.AsyncClient() as client:
            await client.delete(f"{standin.url}/standin/fail")
        await cluster.close()


async def _policy(standin: StandIn, name: str) -> None:
    async with httpx.AsyncClient(base_url=standin.url) as client:
        made = await client.post(POLICIES, json={"metadata": {"name": name},
                                                 "spec": {"podSelector": {}}})
        assert made.status_code == 201, made.text


async def _fail_deletes(standin: StandIn, name: str, status: int, times: int) -> None:
    async with httpx.AsyncClient() as client:
        armed = await client.post(f"{standin.url}/standin/fail", json={
            "method": "DELETE", "plural": "networkpolicies", "name": name,
            "status": status, "times": times})
        assert armed.status_code == 200, armed.text


async def _refused_delete(cluster: Cluster, name: str) -> ClusterRefused:
    with pytest.raises(ClusterRefused) as refused:
        await cluster.delete_network_policy(name)
    return refused.value


async def test_a_delete_that_keeps_failing_is_given_up_and_reported(
    standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """Asked again for the bound (here 2 s), once however often it is added, then left
    in the cluster: logged with the command that deletes it, and listed as lingering."""
    async with opened(standin) as cluster:
        name = "deskbox-ses-undeletable"
        await _policy(standin, name)
        retries = DeleteRetries({"network policy": cluster.delete_network_policy},
                                lambda: NAMESPACE, retry_for_s=2.0, first_backoff_s=0.25)
        try:
            await _fail_deletes(standin, name, 503, 1000)
            error = await _refused_delete(cluster, name)
            retries.add("network policy", name, error)
            retries.add("network policy", name, error)  # a second failure joins the first's
            assert retries.pending == [("network policy", name)]
            started = time.monotonic()
            while retries.pending:
                assert time.monotonic() - started < 5, "still retried"
                await asyncio.sleep(0.1)
            assert 1.5 < time.monotonic() - started < 3.0
            assert name in standin.names("networkpolicies")
            (reason,) = retries.lingering.values()
            assert list(retries.lingering) == [("network policy", name)] and "503" in reason
            assert (f"kubectl delete networkpolicy {name} -n {NAMESPACE}" in caplog.text
                    and "(4 tries of its delete in 2 s" in caplog.text), caplog.text
            # A refusal no retry changes (the Role lacks the verb) is given up at once.
            retries.add("network policy", "deskbox-ses-forbidden", ClusterRefused(
                "delete a network policy", 403, "forbidden"))
            assert not retries.pending
            assert ("network policy", "deskbox-ses-forbidden") in retries.lingering
        finally:
            await retries.close()
            async with httpx.AsyncClient() as client:
                await client.delete(f"{standin.url}/standin/fail")
                await client.delete(f"{standin.url}{POLICIES}/{name}")


async def test_a_later_try_deletes_it_and_close_ends_the_rest(standin: StandIn) -> None:
    """One that passes at its third try is gone (and no longer lingering); one still being
    retried at close is left, its task ended, and nothing is added after."""
    async with opened(standin) as cluster:
        passes, stays = "deskbox-ses-deletedlater", "deskbox-ses-closedon"
        for name in (passes, stays):
            await _policy(standin, name)
        retries = DeleteRetries({"network policy": cluster.delete_network_policy},
                                lambda: NAMESPACE, first_backoff_s=0.25)
        try:
            await _fail_deletes(standin, passes, 503, 2)
            await _fail_deletes(standin, stays, 503, 1000)
            for name in (passes, stays):
                retries.add("network policy", name, await _refused_delete(cluster, name))
            started = time.monotonic()
            while passes in standin.names("networkpolicies"):
                assert time.monotonic() - started < 5, "not deleted"
                await asyncio.sleep(0.1)
            assert retries.pending == [("network policy", stays)]
            tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith(
                "deskbox-kubernetes-delete-")]
            assert len(tasks) == 1
            await retries.close()
            assert not retries.pending and all(t.done() for t in tasks)
            assert retries.lingering == {}
            retries.add("network policy", stays, ClusterRefused("delete", 503, "down"))
            assert not retries.pending and ("network policy", stays) in retries.lingering
            assert stays in standin.names("networkpolicies")
        finally:
            await retries.close()
            async with httpx.AsyncClient() as client:
                await client.delete(f"{standin.url}/standin/fail")
                for name in (passes, stays):
                    await client.delete(f"{standin.url}{POLICIES}/{name}")
