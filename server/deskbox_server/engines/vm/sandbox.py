"""One VM session as the session layer sees it (engines/base.py's Sandbox).

Two directories per session. Its runtime directory, ``/run/deskbox-vm/<server>/<id>/``
(short: unix socket paths have 108 bytes), holds what QEMU touches: the QMP and agent
sockets, the fw_cfg files, its log and the guest's console; a small tmpfs of its own
(runtime_files.py), which the guest's console cannot grow past. Its state directory,
``<state_dir>/vm/<id>/``, holds what outlives QEMU: the hibernation file and the VM's
shape, for a later server to restore it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..network import Egress, SessionNetwork
from ..own_desktop import OwnDesktopSandbox
from .cgroup import VmCgroup
from .guest import VmGuest
from .qemu import VmConfig, VmPaths

__all__ = ["VmSandbox", "runtime_root"]

HIBERNATION_FILE = "hibernation.vmstate"
CONFIG_FILE = "vm.json"


def runtime_root(state_dir: Path) -> Path:
    """The runtime directories of one state directory's VMs (one server's)."""
    tag = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return Path("/run/deskbox-vm") / tag


class VmSandbox(OwnDesktopSandbox):
    def __init__(self, state_dir: Path, max_execs: int, session_id: str, config: VmConfig
                 ) -> None:
        super().__init__(max_execs, session_id, "a VM")
        self.config = config
        runtime = runtime_root(state_dir)
        self.paths = VmPaths(runtime / session_id)
        self.cgroup = VmCgroup(f"deskbox-vm-{runtime.name}-{session_id}")
        self.uid: int | None = None  # QEMU's user (jail.py) while it runs
        # Egress all/allowlist: the host-made namespace QEMU runs in; it outlives a
        # hibernation (QEMU joins it again) and ends with the session.
        self.network: SessionNetwork | None = None
        self.egress = Egress()  # what a new boot's network is made from
        self.state_dir = state_dir.resolve() / "vm" / session_id
        self.guest: VmGuest | None = None
        self.env: dict[str, str] = {}
        # QMP's event count when the host's last agent stream was opened: the port's next
        # close after it is that stream's end (engine.py); None: no stream to this QEMU yet.
        self.stream_mark: int | None = None
        self.timings: dict[str, float] = {}
        self.ending = False  # its destroy began: what a checkpoint meanwhile meets is no fault
        # QEMU's cgroup has no CPU quota yet: a guest boots (or is restored) at the host's
        # full CPU and gets config.cpu_quota once its desktop is ready (VmEngine.started).
        self.boosted = False

    @property
    def hibernation_file(self) -> Path:
        return self.state_dir / HIBERNATION_FILE

    @property
    def label(self) -> str:
        return f"the VM of session {self.session_id}"

    @property
    def network_name(self) -> str:
        return self.cgroup.name  # deskbox-vm-<server>-<id>, under /run/netns

    def failure(self) -> str | None:
        if self.network is not None and (problem := self.network.failure()) is not None:
            return problem
        return self.guest.failure() if self.guest is not None else None

    @property
    def running(self) -> bool:
        return self.guest is not None
