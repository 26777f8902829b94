#!/usr/bin/env bash
# nginx for the test of docs/nginx-deskbox.conf (tests/api/test_tls_proxy.py), installed where
# missing; safe to run again.
#
# Debian's nginx package would also start a daemon on port 80 (and, with systemd, at every
# boot), so only its binary is taken: the package is downloaded and unpacked into a private
# root, no maintainer script runs, and nothing listens until a test starts it with a
# configuration of its own. The binary links only libraries every Debian 12 host has
# (libssl3, libpcre2-8, zlib, libcrypt).
#   $DESKBOX_NGINX_ROOT   default /opt/deskbox/nginx-root (the binary: usr/sbin/nginx)
set -euo pipefail
ROOT=${DESKBOX_NGINX_ROOT:-/opt/deskbox/nginx-root}
if "$ROOT/usr/sbin/nginx" -v >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: nginx is missing and installing it needs root (run scripts/nginx.sh as root)" >&2
  exit 1
fi
echo "setup: unpacking Debian's nginx into $ROOT (for the TLS proxy test)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# As root into a directory apt's own user may not write: no sandbox for the download.
if ! (cd "$work" && apt-get -qq -o APT::Sandbox::User=root -o Acquire::Retries=3 download nginx 2>/dev/null); then
  apt-get update -qq
  (cd "$work" && apt-get -qq -o APT::Sandbox::User=root -o Acquire::Retries=3 download nginx)
fi
dpkg-deb -x "$work"/nginx_*.deb "$work/root"
"$work/root/usr/sbin/nginx" -v 2>/dev/null || { echo "setup: the unpacked nginx does not run" >&2; exit 1; }
rm -rf "$ROOT"
mkdir -p "$(dirname "$ROOT")"
mv "$work/root" "$ROOT"
