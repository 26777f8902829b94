#!/usr/bin/env bash
# Everything Deskbox needs on a Debian 12 host, installed only where missing:
# the desktop's Debian packages, then .venv/ with both distributions (deskbox and
# deskbox-server, editable) and the dev tools.
# Quiet when there is nothing to do; safe to run again and again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  xvfb xauth openbox chromium x11vnc x11-utils x11-xkb-utils xkb-data
  tigervnc-standalone-server  # only for bench/vnc.py: Xvnc, measured against x11vnc
  fonts-dejavu-core fonts-noto-cjk fonts-noto-color-emoji
  runc mmdebstrap passt slirp4netns nftables iproute2 uidmap
  erofs-utils              # the session image: a read-only erofs file (desktop_image/image_store.py)
  qemu-system-x86          # the vm engine: each session in a QEMU microVM (desktop_image/vm_guest.py)
  golang-github-containers-common  # /usr/share/containers/seccomp.json: sandboxes' syscall allowlist
  podman                   # the docker engine's tests (its Docker-compatible service) and podman load of the OCI image
  xdotool scrot            # only for bench/: the peers' way of doing things
  x11-xserver-utils        # only for bench/peers.py: cua-computer-server needs xrandr
  python3 python3-venv python3-dev gcc
  libdeflate0              # the server inflates a paused session's frame with it (server/deskbox_server/agent/inflate.py)
  nodejs                   # only for make test: node --test runs vnc/test/ (the viewer's JS)
)

missing=()
for package in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# CRIU 4.1 from Debian 13 in a private root, for hibernate (scripts/criu.sh).
scripts/criu.sh || echo "setup: without CRIU, pause mode hibernate will be refused" >&2
# nginx's binary alone, for the test of the TLS proxy set-up of docs/GUIDE.md.
scripts/nginx.sh || echo "setup: without nginx, tests/api/test_tls_proxy.py will fail" >&2

PYTHON=${PYTHON:-python3}
stamp=.venv/.deskbox-installed
# Two distributions, both editable: deskbox (clients/python/pyproject.toml: SDK, CLI, MCP)
# and deskbox-server (pyproject.toml: the server, and the dev tools in its [dev] extra).
# A change to either file reinstalls.
PYPROJECTS=(clients/python/pyproject.toml pyproject.toml)
wanted=$(cat "${PYPROJECTS[@]}" | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "setup: installing the project into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  # In one command, so deskbox-server's `deskbox` requirement is the editable checkout.
  .venv/bin/python -m pip install -q -e ./clients/python -e '.[dev]'
  echo "$wanted" > "$stamp"
fi
