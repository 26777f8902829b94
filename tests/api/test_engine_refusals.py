"""A refusal of the Engine API (docker engine) or of the Kubernetes API reaches our API as
what it means to the caller, a ``session_failed`` (502) with the other API's status and
message in its text: that status is no answer of ours (a daemon's 404 or 500 had been the
response's status, under the kind ``session_failed``)."""

from __future__ import annotations

import json

import pytest

from deskbox_server.api.errors import deskbox_error_response
from deskbox_server.engines.docker.daemon import DaemonRefused
from deskbox_server.engines.kubernetes.cluster import ClusterRefused


@pytest.mark.parametrize("daemon_status", [404, 409, 500])
def test_a_daemon_refusal_is_a_502_whatever_the_daemon_answered(daemon_status: int) -> None:
    refused = DaemonRefused("resume a container", daemon_status, "container state improper")
    response = deskbox_error_response(refused)
    assert response.status_code == 502
    error = json.loads(bytes(response.body))["error"]
    assert error["type"] == "session_failed"
    assert error["message"] == (f"the container engine refused to resume a container "
                                f"({daemon_status}: container state improper)")
    assert refused.upstream_status == daemon_status


@pytest.mark.parametrize("api_status", [404, 409, 500])
def test_a_kubernetes_refusal_is_a_502_whatever_the_api_server_answered(
    api_status: int,
) -> None:
    refused = ClusterRefused("create a pod", api_status, "forbidden")
    response = deskbox_error_response(refused)
    assert response.status_code == 502
    error = json.loads(bytes(response.body))["error"]
    assert error["type"] == "session_failed"
    assert error["message"] == (
        f"the Kubernetes API refused to create a pod ({api_status}: forbidden)")
    assert refused.upstream_status == api_status
