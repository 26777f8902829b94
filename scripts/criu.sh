#!/usr/bin/env bash
# CRIU 4.1 for hibernate/snapshots (issue 6), installed where missing; safe to run again.
#
# Debian 12's CRIU 3.17 fails on this kernel ("vdso: Unexpected rt vDSO area bounds").
# CRIU 4.1 from Debian 13 (trixie) works; it is installed with mmdebstrap into a private
# root (its own libc and libraries, nothing of the host's changed) and run through that
# root's own loader by a wrapper, which is what the server gives runc as `--criu`:
#   $DESKBOX_CRIU_ROOT      default /opt/deskbox/criu-root
#   $DESKBOX_CRIU_WRAPPER   default /opt/deskbox/bin/criu
#
# Linux 6.16 and later refuse SO_PASSCRED/SO_PASSSEC on non-unix sockets, and CRIU 4.1.1
# fails on every TCP socket there (a browser's DevTools listener). Debian 13's own CRIU
# source is therefore rebuilt with scripts/criu-sockopt.patch (treat EOPNOTSUPP as "not
# set") in a throw-away build root (~1 GB, 2-3 minutes), and that binary replaces the
# packaged one in the private root. DESKBOX_CRIU_PATCH=0 keeps the packaged binary.
# scripts/criu-freeze-poll.patch comes with it: CRIU looks at a freezing cgroup again
# only after 100 ms, where a freeze takes about a millisecond (a quarter of the dumps of
# an idle desktop waited so); it looks every 0.2 ms for the first 50 ms.
# scripts/criu-cgroup-sets.patch: a dump gave each thread outside the sandbox's init a new
# cgroup set (it compared them before giving them the init's cgroup-namespace prefix) and
# collected every controller again for each, a mount and a walk: 770 for a desktop's 77
# threads and 10 controllers, ~55 ms of its dump. They now share the set they are in.
set -euo pipefail
cd "$(dirname "$0")"
PATCHES=("$PWD/criu-sockopt.patch" "$PWD/criu-freeze-poll.patch" "$PWD/criu-cgroup-sets.patch")
PATCHED=${DESKBOX_CRIU_PATCH:-1}
want_stamp=packaged
[ "$PATCHED" = 1 ] && want_stamp="patched $(cat "${PATCHES[@]}" | sha256sum | cut -d' ' -f1)"

ROOT=${DESKBOX_CRIU_ROOT:-/opt/deskbox/criu-root}
WRAPPER=${DESKBOX_CRIU_WRAPPER:-/opt/deskbox/bin/criu}
SUITE=${DESKBOX_CRIU_SUITE:-trixie}
MIRROR=${DESKBOX_CRIU_MIRROR:-http://deb.debian.org/debian}

# CRIU locks a sandbox's network namespace with iptables-restore, which the host lacks:
# the root's own (iptables-nft) is run the same way, through helpers in $HELPERS.
HELPERS="$(dirname "$WRAPPER")/criu-helpers"
if [ -x "$ROOT/usr/sbin/criu" ] && [ -x "$ROOT/usr/sbin/xtables-nft-multi" ] \
    && [ -x "$HELPERS/iptables-restore" ] && [ -x "$WRAPPER" ] \
    && grep -q -e '--network-lock skip' "$WRAPPER" \
    && grep -q "tmpfs images as plain tar" "$HELPERS/tar" 2>/dev/null \
    && [ "$(cat "$ROOT/.deskbox-criu" 2>/dev/null)" = "$want_stamp" ] \
    && "$WRAPPER" --version >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: CRIU is missing and installing it needs root (run scripts/criu.sh as root)" >&2
  exit 1
fi
if [ ! -x "$ROOT/usr/sbin/criu" ] || [ ! -x "$ROOT/usr/sbin/xtables-nft-multi" ] \
    || { [ "$PATCHED" != 1 ] && grep -q '^patched' "$ROOT/.deskbox-criu" 2>/dev/null; }; then
  echo "setup: installing CRIU from Debian $SUITE into $ROOT (mmdebstrap, ~1 minute)"
  tmp="$ROOT.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$(dirname "$ROOT")"
  trap 'rm -rf "$tmp"' EXIT
  # extract: criu and its dependencies unpacked, no maintainer scripts run.
  mmdebstrap --variant=extract --include=criu,iptables --skip=check/empty \
    --aptopt='Acquire::Retries "3"' "$SUITE" "$tmp" "$MIRROR" 2>&1 \
    | sed -u 's/^/setup:   /'
  [ -x "$tmp/usr/sbin/criu" ] || { echo "setup: mmdebstrap did not install criu" >&2; exit 1; }
  rm -rf "$ROOT"
  mkdir -p "$(dirname "$ROOT")"
  mv "$tmp" "$ROOT"
  trap - EXIT
fi
if [ "$(cat "$ROOT/.deskbox-criu" 2>/dev/null)" != "$want_stamp" ]; then
  if [ "$PATCHED" = 1 ]; then
    build="$(dirname "$ROOT")/criu-build.$$"
    trap 'rm -rf "$build"' EXIT
    echo "setup: building Debian $SUITE's CRIU with scripts/criu-*.patch (2-3 minutes)"
    mmdebstrap --variant=buildd --include=pkgconf,libprotobuf-c-dev,protobuf-c-compiler,\
libprotobuf-dev,protobuf-compiler,python3-protobuf,libnl-3-dev,libnet1-dev,libcap-dev,\
libaio-dev,libbsd-dev,libgnutls28-dev,libnftables-dev,uuid-dev,python3,dpkg-dev \
      --aptopt='Acquire::Retries "3"' \
      --setup-hook="echo 'deb-src $MIRROR $SUITE main' >> \"\$1/etc/apt/sources.list\"" \
      "$SUITE" "$build" "$MIRROR" 2>&1 | sed -u 's/^/setup:   /'
    cp "${PATCHES[@]}" "$build/root/"
    # The patches' names follow the script, as its arguments.
    chroot "$build" sh -ec '
      cd /root
      apt-get update -qq
      # The upstream tarball is what is built; a mirror may lack the .dsc (then apt fails).
      apt-get source -qq --download-only criu || ls criu_*.orig.tar.* >/dev/null
      mkdir src
      tar -C src --strip-components=1 -xf criu_*.orig.tar.*
      cd src
      for fix in "$@"; do
        patch -p1 < "/root/$fix"
      done
      make -j"$(nproc)" criu >/dev/null
    ' sh "${PATCHES[@]##*/}" 2>&1 | sed -u 's/^/setup:   /'
    [ -x "$build/root/src/criu/criu" ] || { echo "setup: the CRIU build failed" >&2; exit 1; }
    install -m 0755 "$build/root/src/criu/criu" "$ROOT/usr/sbin/criu"
    rm -rf "$build"
    trap - EXIT
  fi
  echo "$want_stamp" > "$ROOT/.deskbox-criu"
fi

# Debian 13 is merged-/usr; the extract variant makes no /lib64 symlink: find the loader.
loader=
for candidate in lib64 usr/lib64 usr/lib/x86_64-linux-gnu; do
  if [ -e "$ROOT/$candidate/ld-linux-x86-64.so.2" ]; then
    loader="$ROOT/$candidate/ld-linux-x86-64.so.2"
    break
  fi
done
[ -n "$loader" ] || { echo "setup: no ld-linux-x86-64.so.2 in $ROOT" >&2; exit 1; }
libs="$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib/x86_64-linux-gnu"
mkdir -p "$HELPERS"
for tool in iptables-restore ip6tables-restore iptables-save ip6tables-save; do
  cat > "$HELPERS/$tool" <<TOOL
#!/bin/sh
exec env XTABLES_LIBDIR="$ROOT/usr/lib/x86_64-linux-gnu/xtables" "$loader" --argv0 $tool \\
  --library-path "$libs" "$ROOT/usr/sbin/xtables-nft-multi" "\$@"
TOOL
  chmod 0755 "$HELPERS/$tool"
done
# CRIU keeps each tmpfs of a sandbox as `tar --gzip` of it. The browser profile's tmpfs holds
# ~6 MB, mostly zeros: gzip costs a dump ~40 ms and each restore ~30 ms, for images that live
# on local disk (a fork's for a second; a snapshot's are packed with zstd anyway). Plain tar
# takes ~1 ms. Older checkpoints were gzipped: tar recognises that by itself when it reads a
# named file rather than a pipe, and CRIU's stdin is the image file.
host_tar=$(command -v tar)
cat > "$HELPERS/tar.tmp" <<TAR
#!/bin/sh
# CRIU's tmpfs images as plain tar (scripts/criu.sh)
for arg; do shift; [ "\$arg" = --gzip ] || set -- "\$@" "\$arg"; done
case " \$* " in *" --extract "*) set -- --file=/proc/self/fd/0 "\$@" ;; esac
exec $host_tar "\$@"
TAR
chmod 0755 "$HELPERS/tar.tmp"
mv "$HELPERS/tar.tmp" "$HELPERS/tar"
# runc runs CRIU as "criu swrk <fd>" and has no option for its network lock, which would
# cost each dump and restore four iptables runs (60-70 ms): it guards established TCP
# connections, and runc (without --tcp-established) makes CRIU refuse to dump those anyway.
# A restore uses the lock its dump used (CRIU's inventory), so older checkpoints still
# restore. (It cannot go into criu.conf: CRIU 4.1.1 crashes parsing it in RPC mode.)
cat > "$WRAPPER.tmp" <<WRAP
#!/bin/sh
# CRIU from $ROOT, run through that root's own loader and libraries (scripts/criu.sh).
PATH="$HELPERS:\$PATH"
export PATH
[ "\$1" = swrk ] && set -- --network-lock skip "\$@"
exec "$loader" \\
  --library-path "$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib/x86_64-linux-gnu" \\
  "$ROOT/usr/sbin/criu" "\$@"
WRAP
chmod 0755 "$WRAPPER.tmp"
if ! version=$("$WRAPPER.tmp" --version 2>&1); then
  rm -f "$WRAPPER.tmp"
  echo "setup: the CRIU of $ROOT does not run: $version" >&2
  exit 1
fi
mv "$WRAPPER.tmp" "$WRAPPER"
echo "setup: CRIU ready: $(echo "$version" | head -1) ($WRAPPER)"
