#!/bin/sh
# QEMU's jail, after Firecracker's jailer: run by engines/vm/jail.py as root inside new
# mount, pid and network namespaces (unshare), it
#   1. puts itself (and so QEMU) into the VM's cgroups,
#   2. builds a root that holds only /usr (read-only: QEMU and its libraries), a few device
#      nodes, the guest's image files (read-only) and the VM's runtime directory,
#   3. pivots into it, drops every capability, becomes the VM's own unprivileged user with
#      no_new_privs, and execs QEMU.
# Arguments: JAIL_DIR RUNTIME_DIR UID KVM(0|1) [ro PATH]... [cgroup PROCS_FILE]... -- QEMU ARGV
set -eu
jail=$1 runtime=$2 uid=$3 kvm=$4
shift 4
readonly_paths=""
while [ "$1" != "--" ]; do
  case "$1" in
    ro) readonly_paths="$readonly_paths $2" ;;
    cgroup) echo $$ > "$2" ;;
    *) echo "jail.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
shift

mount --make-rprivate /
mount -t tmpfs -o size=1m,mode=755,nosuid jail "$jail"
cd "$jail"
for link in bin sbin lib lib64 lib32 libx32; do
  if [ -L "/$link" ]; then ln -s "$(readlink "/$link")" "$link"; fi
done
mkdir -p usr etc dev tmp proc old "./$runtime"
mount --rbind /usr usr
mount -o remount,bind,ro,nosuid,nodev usr
[ -f /etc/ld.so.cache ] && touch etc/ld.so.cache && mount --bind -o ro /etc/ld.so.cache etc/ld.so.cache
for node in null zero random urandom; do
  touch "dev/$node"
  mount --bind "/dev/$node" "dev/$node"
done
if [ "$kvm" = 1 ]; then
  touch dev/kvm
  mount --bind /dev/kvm dev/kvm
fi
for path in $readonly_paths; do  # the guest's files: paths without blanks (jail.py)
  mkdir -p "./$(dirname "$path")"
  if [ -d "$path" ]; then mkdir -p "./$path"; else touch "./$path"; fi
  mount --bind "$path" "./$path"
  mount -o remount,bind,ro,nosuid,nodev "./$path"
done
mount --bind "$runtime" "./$runtime"
mount -o remount,bind,nosuid,nodev,noexec "./$runtime"
mount -t proc -o nosuid,nodev,noexec proc proc
chmod 1777 tmp
pivot_root . old
cd /
umount -l /old
rmdir /old
exec setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs \
  --inh-caps=-all --bounding-set=-all -- "$@"
