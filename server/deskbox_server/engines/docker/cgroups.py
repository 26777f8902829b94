"""What a container engine's cgroups give its containers: which of a session's limits (CPU
quota, memory, pids) it enforces, and whether it can pause one (the freezer), read from
what the daemon says of itself.

A daemon that cannot enforce a limit does not refuse a container that asks for it: Podman
drops it with a warning ("PIDs limit discarded"), Docker drops a pids or memory limit the
same way (and refuses a CPU quota). A session would then run without it while the API
promised it, so the engine reads beforehand what holds and asks for nothing else.

Where each answer comes from, in this order:

- a rootless daemon on cgroup v1: nothing (its user has no cgroup to put a container in);
- Docker's info with ``CgroupDriver: "none"``: nothing (Docker's rootless mode without
  systemd);
- Podman's own info (``GET /libpod/info``): ``host.cgroupControllers``, the controllers of
  the daemon's cgroup; for a rootless daemon on cgroup v2 the ones its user was delegated
  (often only ``memory`` and ``pids``). Podman's compatible ``/info`` has Docker's booleans
  too, but they describe the host's cgroup mounts: ``PidsLimit`` is true on any cgroup v2
  host, and all of them are true for a rootless daemon on cgroup v1;
- Docker's ``/info``: ``MemoryLimit``, ``CpuCfsQuota``, ``CpuCfsPeriod`` and ``PidsLimit``,
  which Docker reads on cgroup v2 from the controllers its containers' cgroups get
  (rootless: its user's slice's, the ones delegated);
- where an answer lacks its field (no ``cgroupControllers``, no ``PidsLimit``): that limit
  holds, as the engine assumed before it read any of this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["EVERY_LIMIT", "Cgroups", "Limit", "read_cgroups", "rootless_on_cgroup_v1"]


class Limit(StrEnum):
    """A limit every session gets (API.md's ``resources``), by its cgroup controller."""

    CPU = "cpu"
    MEMORY = "memory"
    PIDS = "pids"


EVERY_LIMIT = frozenset(Limit)
# Docker's info: the fields that must all be true for a limit to hold.
_DOCKER_FIELDS = {
    Limit.CPU: ("CpuCfsQuota", "CpuCfsPeriod"),
    Limit.MEMORY: ("MemoryLimit",),
    Limit.PIDS: ("PidsLimit",),
}


@dataclass(frozen=True)
class Cgroups:
    """What the daemon's containers get. ``why``: why some of it is missing ("" if none)."""

    limits: frozenset[Limit] = EVERY_LIMIT
    freezer: bool = True
    why: str = ""

    @property
    def missing(self) -> list[Limit]:
        return sorted(EVERY_LIMIT - self.limits)

    def describe(self) -> str:
        """The limits that hold, then what does not and why: ``"memory, pids (no cpu limit:
        …)"``."""
        held = ", ".join(sorted(self.limits)) or "none"
        missing = self.missing
        lacks = [f"no {', '.join(missing)} limit{'s' * (len(missing) > 1)}"] if missing else []
        lacks += [] if self.freezer else ["no pause"]
        return f"{held} ({', '.join(lacks)}: {self.why})" if lacks else held


def rootless_on_cgroup_v1(rootless: bool, cgroup_version: str) -> bool:
    """No cgroup for a container at all: the daemon's user has none to give one."""
    return rootless and cgroup_version == "1"


def read_cgroups(
    info: Mapping[str, Any], rootless: bool, podman_info: Mapping[str, Any] | None = None,
    podman: bool = False,
) -> Cgroups:
    """``info``: the answer to ``GET /info``; ``rootless``: whether the daemon runs as an
    ordinary user; ``podman``: whether it is Podman, and ``podman_info`` its answer to
    ``GET /libpod/info`` (None: none came)."""
    version = str(info.get("CgroupVersion", ""))
    if rootless_on_cgroup_v1(rootless, version):
        return Cgroups(frozenset(), False, "rootless on cgroup v1, no cgroup to put a "
                       "container in")
    if info.get("CgroupDriver") == "none":
        return Cgroups(frozenset(), False, "the daemon runs without cgroups (cgroup driver "
                       "none)")
    if podman:
        host = (podman_info or {}).get("host")
        controllers = host.get("cgroupControllers") if isinstance(host, Mapping) else None
        if isinstance(controllers, list):
            return _from_controllers({str(name) for name in controllers}, version, rootless)
        return Cgroups()
    return _from_docker_fields(info)


def _from_controllers(present: set[str], version: str, rootless: bool) -> Cgroups:
    limits = frozenset(limit for limit in Limit if limit.value in present)
    # cgroup v2 freezes in its core (cgroup.freeze): no controller to delegate.
    freezer = version == "2" or "freezer" in present
    lacking = [limit.value for limit in sorted(EVERY_LIMIT - limits)]
    lacking += [] if freezer else ["freezer"]
    if not lacking:
        return Cgroups(limits, freezer)
    named = f"{', '.join(lacking)} controller{'s' * (len(lacking) > 1)}"
    why = (f"the daemon's user was not delegated the {named}" if rootless else
           f"the daemon's cgroup has no {named}")
    return Cgroups(limits, freezer, why)


def _from_docker_fields(info: Mapping[str, Any]) -> Cgroups:
    """Only a field that says false takes its limit away: one an older daemon lacks does
    not."""
    false = {field for fields in _DOCKER_FIELDS.values() for field in fields
             if info.get(field) is False}
    limits = frozenset(limit for limit, fields in _DOCKER_FIELDS.items()
                       if not false.intersection(fields))
    return Cgroups(limits, True, f"the daemon's info says {', '.join(sorted(false))} false"
                   if false else "")
