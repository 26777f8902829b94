"""From inside a session: no host processes, a read-only root, no network, no privileges."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from deskbox_server.engines.runc.layout import SANDBOX_USER_IDS
from deskbox_server.engines.runc.sandbox import RuncSandbox

from .conftest import exec_in


def test_host_processes_are_invisible(sandbox: RuncSandbox) -> None:
    done = exec_in(sandbox, "sh", "-c", "for p in /proc/[0-9]*; do cat $p/comm; done")
    assert done.returncode == 0, done.stderr
    names = done.stdout.split()
    assert "deskbox-session" in names and "Xvfb" in names
    assert "pytest" not in names and "python" not in [n for n in names if n != "python3"]
    inside = exec_in(sandbox, "cat", "/proc/1/cmdline").stdout
    assert "deskbox-session" in inside
    assert len(names) < 40


def test_pid_namespace_is_its_own(sandbox: RuncSandbox) -> None:
    assert sandbox.init_pid is not None
    ns = os.readlink(f"/proc/{sandbox.init_pid}/ns/pid")
    assert ns != os.readlink("/proc/self/ns/pid")
    for kind in ("ipc", "mnt", "uts", "net"):
        inside = os.readlink(f"/proc/{sandbox.init_pid}/ns/{kind}")
        assert inside != os.readlink(f"/proc/self/ns/{kind}")
    assert os.readlink(f"/proc/{sandbox.init_pid}/ns/user") != os.readlink("/proc/self/ns/user")


def host_ids(pid: int) -> tuple[list[str], list[str]]:
    """A process's real, effective, saved and fs uids and gids as the host sees them."""
    status = dict(line.split(":\t", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    return status["Uid"].split(), status["Gid"].split()


def login_defs() -> dict[str, int]:
    """The numeric settings of /etc/login.defs (shadow's useradd reads its ranges there)."""
    found: dict[str, int] = {}
    for line in Path("/etc/login.defs").read_text().splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            found[fields[0]] = int(fields[1])
    return found


def overlaps(ids: tuple[int, int], first: int, last: int) -> bool:
    return ids[0] <= last and first < ids[0] + ids[1]


def test_no_tool_of_the_host_hands_out_the_sandboxes_ids() -> None:
    """useradd gave the first user of a Debian host the sandboxes' ids in /etc/subuid: that
    user could become them (newuidmap) and reach every session's agent socket."""
    ids = SANDBOX_USER_IDS
    assert ids[1] == 65536 and ids[0] + ids[1] <= 2**31  # signed 32-bit everywhere
    defs = login_defs()
    for kind in ("UID", "GID"):
        first = defs.get(f"SUB_{kind}_MIN", 100_000)
        last = defs.get(f"SUB_{kind}_MAX", 600_100_000) + defs.get(f"SUB_{kind}_COUNT", 65536)
        assert not overlaps(ids, first, last), (kind, first, last)
        assert not overlaps(ids, 0, defs.get(f"{kind}_MAX", 60_000))  # users and groups
    assert not overlaps(ids, 0x0008_0000, 0x6FFF_FFFF)  # systemd-nspawn's container ranges
    assert not overlaps(ids, 0x7FFE_0000, 0x7FFE_FFFF)  # systemd's foreign ids


def test_root_inside_is_an_unprivileged_user_of_the_host(sandbox: RuncSandbox) -> None:
    first, count = SANDBOX_USER_IDS
    inside = exec_in(sandbox, "sh", "-c", "id -u; id -g; cat /proc/self/uid_map /proc/1/gid_map")
    assert inside.stdout.split() == ["0", "0", "0", str(first), str(count),
                                     "0", str(first), str(count)], inside.stdout
    # Every process of the sandbox (Xvfb, the browser, ...), seen from the host.
    assert sandbox.init_pid is not None
    children = Path(f"/proc/{sandbox.init_pid}/task/{sandbox.init_pid}/children").read_text()
    pids = [sandbox.init_pid, *map(int, children.split())]
    assert len(pids) >= 3
    for pid in pids:
        assert host_ids(pid) == ([str(first)] * 4, [str(first)] * 4), pid
    # The image belongs to the host's root, which is nobody inside: even a writable mount
    # of it would not let the sandbox change a file (issue 13, 1b).
    owner = exec_in(sandbox, "stat", "-c", "%u", "/usr/bin/python3").stdout.strip()
    assert owner == "65534"


def cgroup_paths(sandbox: RuncSandbox, pid: str = "self") -> list[str]:
    """The cgroup paths of a process of the sandbox as it sees them (/proc/PID/cgroup)."""
    done = exec_in(sandbox, "cat", f"/proc/{pid}/cgroup")
    assert done.returncode == 0, done.stderr
    return [line.split(":", 2)[2] for line in done.stdout.splitlines()]


def test_cgroup_namespace_is_its_own(sandbox: RuncSandbox) -> None:
    assert sandbox.init_pid is not None
    assert os.readlink(f"/proc/{sandbox.init_pid}/ns/cgroup") != os.readlink(
        "/proc/self/ns/cgroup"
    )
    # The host sees the sandbox in its own cgroup...
    host_view = Path(f"/proc/{sandbox.init_pid}/cgroup").read_text()
    assert f"/{sandbox.container_id}" in host_view
    # ...the sandbox sees only its root: not the host's cgroup layout nor its own id.
    for pid in ("self", "1"):
        paths = cgroup_paths(sandbox, pid)
        assert paths and set(paths) == {"/"}, paths
    mountinfo = exec_in(sandbox, "cat", "/proc/self/mountinfo").stdout
    assert sandbox.container_id not in mountinfo


def test_root_filesystem_is_read_only(sandbox: RuncSandbox) -> None:
    for path in ("/usr/bin/evil", "/etc/evil", "/evil"):
        done = exec_in(sandbox, "touch", path)
        assert done.returncode != 0
        assert "Read-only file system" in done.stderr
    assert exec_in(sandbox, "touch", "/tmp/ok", "/root/ok", "/run/ok").returncode == 0


def test_only_loopback_network(sandbox: RuncSandbox) -> None:
    done = exec_in(sandbox, "ls", "/sys/class/net")
    assert done.stdout.split() == ["lo"]
    code = (
        "import socket\n"
        "s = socket.socket(); s.settimeout(2)\n"
        "try:\n s.connect(('1.1.1.1', 80)); print('connected')\n"
        "except OSError as e: print('refused', e.errno)\n"
    )
    assert exec_in(sandbox, "python3", "-c", code).stdout.startswith("refused")


def test_no_capabilities_no_new_privileges_seccomp(sandbox: RuncSandbox) -> None:
    status = exec_in(sandbox, "cat", "/proc/1/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == 0, (cap, fields[cap])
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"


def test_denied_syscalls(sandbox: RuncSandbox) -> None:
    userns = exec_in(sandbox, "unshare", "--user", "--map-root-user", "true")
    assert userns.returncode != 0 and "Operation not permitted" in userns.stderr
    mount = exec_in(sandbox, "mount", "-t", "tmpfs", "none", "/mnt")
    assert mount.returncode != 0
    add_key = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.syscall(248, b'user', b'k', b'v', 1, -2); print(r, ctypes.get_errno())"
    )
    keys = exec_in(sandbox, "python3", "-c", add_key)
    assert keys.stdout.split() == ["-1", "1"]  # add_key: EPERM


def test_host_files_outside_the_image_are_absent(sandbox: RuncSandbox) -> None:
    # The state directory (and thus any API key in it) is not mounted.
    state = str(sandbox.options.state_dir)
    assert exec_in(sandbox, "ls", state).returncode != 0
    mounts = exec_in(sandbox, "cat", "/proc/self/mountinfo").stdout
    binds = [line for line in mounts.splitlines() if " /tmp/.X11-unix " in line]
    assert len(binds) == 1


def test_socket_directory_cannot_fill_the_host_disk(sandbox: RuncSandbox) -> None:
    fill = exec_in(sandbox, "sh", "-c", "head -c 8M /dev/zero > /tmp/.X11-unix/fill")
    assert fill.returncode != 0 and "No space left on device" in fill.stderr
    assert exec_in(sandbox, "rm", "/tmp/.X11-unix/fill").returncode == 0


def test_host_loopback_is_unreachable(sandbox: RuncSandbox) -> None:
    """A service on the host's 127.0.0.1 (the control plane's port) cannot be reached."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"try:\n socket.create_connection(('127.0.0.1', {port}), timeout=2); print('reached')\n"
            "except OSError as e: print('refused', e.errno)\n"
        )
        assert exec_in(sandbox, "python3", "-c", code).stdout.startswith("refused")


def test_proc_paths_are_masked_and_read_only(sandbox: RuncSandbox) -> None:
    assert exec_in(sandbox, "cat", "/proc/keys", "/proc/timer_list").stdout == ""
    write = exec_in(sandbox, "sh", "-c", "echo core > /proc/sys/kernel/core_pattern")
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    assert exec_in(sandbox, "ls", "/sys/firmware").stdout == ""


def test_the_browser_yields_to_the_agent_and_the_x_server(sandbox: RuncSandbox) -> None:
    """Chromium runs at nice 5 (every process of it): inside the session's CPU quota, a
    click or screenshot for the agent and the X server comes before the browser's work."""
    done = exec_in(sandbox, "sh", "-c",
                   "for p in /proc/[0-9]*; do echo $(cat $p/comm) $(cut -d' ' -f19 $p/stat); "
                   "done")
    assert done.returncode == 0, done.stderr
    nice: dict[str, set[int]] = {}
    for line in done.stdout.splitlines():
        if line.strip():
            name, value = line.rsplit(" ", 1)
            nice.setdefault(name, set()).add(int(value))
    assert nice["chromium"] == {5}, nice
    assert nice["Xvfb"] == nice["deskbox-agent"] == nice["deskbox-session"] == {0}, nice
