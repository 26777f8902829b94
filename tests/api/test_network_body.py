"""The create body's ``network``: what is refused (422) before any sandbox starts.

No name here is ever looked up on a network: resolvers are plain functions of the test.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from deskbox_server.engines.network import (
    Egress,
    HostAddresses,
    hosts_file,
    resolv_conf,
    resolve_egress,
    ruleset,
)
from deskbox_server.errors import InvalidRequest
from deskbox_server.schemas.sessions import Network, is_host_name_or_ip

from .helpers import assert_error

BAD_ENTRIES = [
    "*.example.org", "http://example.org", "example.org/path", "exa mple.org", "-a.org",
    "a..org", "1.2.3", "300.1.1.1", "10.0.0.0/8", "host:80", "a" * 64 + ".org", "ü.org",
]


@pytest.mark.parametrize("entry", ["example.org", "a-b.c.example.", "localhost", "10.1.2.3",
                                   "fd00::1", "::ffff:10.0.0.1"])
def test_host_names_and_ips_are_accepted(entry: str) -> None:
    assert is_host_name_or_ip(entry)
    assert Network(egress="allowlist", allow=[entry]).allow == [entry]


@pytest.mark.parametrize("entry", BAD_ENTRIES)
def test_other_entries_are_refused(entry: str) -> None:
    assert not is_host_name_or_ip(entry)
    with pytest.raises(ValidationError):
        Network(egress="allowlist", allow=[entry])
    with pytest.raises(InvalidRequest):
        resolve_egress("allowlist", [entry], resolver=lambda name: [])


@pytest.mark.parametrize("egress", ["none", "all"])
def test_allow_needs_the_allowlist_mode(egress: str) -> None:
    with pytest.raises(ValidationError, match="allowlist"):
        Network.model_validate({"egress": egress, "allow": ["example.org"]})


def test_the_count_is_bounded() -> None:
    with pytest.raises(ValidationError):
        Network(egress="allowlist", allow=[f"h{i}.test" for i in range(257)])


@pytest.mark.parametrize(
    ("network", "words"),
    [
        ({"egress": "all", "allow": ["example.org"]}, "allowlist"),
        ({"egress": "allowlist", "allow": ["*.example.org"]}, "not a host name"),
        ({"egress": "allowlist", "allow": [f"h{i}.test" for i in range(300)]}, "allow"),
        ({"egress": "sometimes"}, "egress"),
    ],
)
def test_create_refuses_bad_network(
    client: httpx.Client, network: dict[str, Any], words: str
) -> None:
    response = client.post("/v1/sessions", json={"network": network})
    error = assert_error(response, 422, "invalid_request")
    assert words in error["message"]


def test_allowlist_resolution_and_what_the_sandbox_sees() -> None:
    names = {"a.test": ["10.9.0.1", "fd00:9::1"], "b.test": ["10.9.0.2"]}
    egress = resolve_egress(
        "allowlist", ["b.test", "a.test", "10.9.0.3"], resolver=lambda name: names[name]
    )
    assert egress.allowed == (("10.9.0.3", ("10.9.0.3",)),
                              ("a.test", ("10.9.0.1", "fd00:9::1")),
                              ("b.test", ("10.9.0.2",)))
    hosts = hosts_file(egress).splitlines()
    assert "10.9.0.1\ta.test" in hosts and "fd00:9::1\ta.test" in hosts
    assert not any("10.9.0.3" in line for line in hosts)
    assert "nameserver" not in resolv_conf(egress)
    with pytest.raises(InvalidRequest, match="no address"):
        resolve_egress("allowlist", ["c.test"], resolver=lambda name: [])

    def unknown(name: str) -> list[str]:
        raise OSError(f"{name}: no such host")

    with pytest.raises(InvalidRequest, match="cannot resolve"):
        resolve_egress("allowlist", ["c.test"], resolver=unknown)


def test_the_ruleset_blocks_the_host_before_anything_is_allowed() -> None:
    host = HostAddresses(local=("127.0.0.1", "10.9.0.1", "fd00:9::2", "fe80::1"),
                         gateways=("10.9.0.254", "fd00:9::fe"))
    # The host's own address is allowed by name: the block wins (it is checked first).
    egress = Egress("allowlist", (("a.test", ("10.9.0.1", "10.9.0.7")),))
    rules = ruleset(egress, host)
    blocked4 = next(line for line in rules.splitlines() if "set blocked4" in line)
    assert "10.9.0.1/32," in blocked4 and "10.9.0.254/32" in blocked4
    assert "127.0.0.0/8" in blocked4
    assert "127.0.0.1/32" not in blocked4  # merged into 127.0.0.0/8: nft refuses overlaps
    order = [line.strip() for line in rules.splitlines() if "goto" in line or "accept" in line]
    assert order.index("ip daddr @blocked4 goto refuse") < order.index("ip daddr @allowed4 accept")
    assert "policy drop" in rules and "reject with tcp reset" in rules
    assert "169.254.1.1" not in rules  # no DNS for an allowlist
    everything = ruleset(Egress("all"), host)
    assert "ip daddr 169.254.1.1 meta l4proto { tcp, udp } th dport 53 accept" in everything
