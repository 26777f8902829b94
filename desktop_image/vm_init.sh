#!/bin/busybox sh
# /init of the Deskbox microVM (busybox sh), in the initramfs desktop_image/vm_guest.py
# builds; its module doc describes what the host gives QEMU and the configuration format.
#
# Mounts the session image (erofs, on the virtio-blk disk with serial deskbox-root)
# read-only as the new root, tmpfs where the session writes, proc, sysfs, /dev, then
# hands PID 1 to /usr/local/bin/deskbox-session with the host's environment: the session
# as the runc engine runs it. Any failure prints one line on the console
# ("deskbox-init: error: ...") and powers the VM off, so the host sees QEMU exit rather
# than a hang.

/bin/busybox --install -s /bin
export PATH=/bin

fail() {
    echo "deskbox-init: error: $*" >&2
    # Power off through ACPI; without ACPI poweroff would halt the CPU (QEMU would run on),
    # so reset instead (QEMU runs with -no-reboot: it exits).
    for sys in /sys /newroot/sys; do
        [ -e "$sys/firmware/acpi/tables/DSDT" ] && poweroff -f
    done
    reboot -f
    exit 1  # not reached; it would panic the kernel (panic=-1 -no-reboot: QEMU exits)
}

mount -t proc -o nosuid,nodev,noexec proc /proc || fail "cannot mount /proc"
# deskbox.debug on the kernel command line: one line per step, with the time since boot.
debug=
case " $(cat /proc/cmdline) " in *" deskbox.debug "*) debug=1 ;; esac
step() {
    [ -z "$debug" ] || echo "deskbox-init: $(cut -d' ' -f1 /proc/uptime) s: $*"
}
step "/init started"
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys || fail "cannot mount /sys"
mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev || fail "cannot mount devtmpfs on /dev"

step "loading modules"
while read -r module; do
    [ -n "$module" ] || continue
    insmod "/lib/modules/$module.ko" || fail "cannot load the kernel module $module"
done < /lib/modules/load.order

# The configuration: two fw_cfg files (ACPI finds fw_cfg: microvm needs acpi=on).
config=/sys/firmware/qemu_fw_cfg/by_name/opt/deskbox
for file in init env; do
    [ -r "$config/$file/raw" ] || fail "no fw_cfg file opt/deskbox/$file (QEMU needs" \
        "-fw_cfg name=opt/deskbox/$file,file=PATH and -M microvm,acpi=on)"
done

is_number() {
    case "$2" in
        '' | *[!0-9]*) fail "opt/deskbox/init: $1=$2 is not a number" ;;
    esac
}

hostname=deskbox pids=0 tmp_mb=512 run_mb=64 home_mb=512 shm_mb=256 ports= net=none
volumes=
while IFS='=' read -r key value || [ -n "$key" ]; do
    case "$key" in
        '') ;;
        hostname)
            case "$value" in
                '' | *[!A-Za-z0-9.-]*)
                    fail "opt/deskbox/init: hostname=$value is not a host name" ;;
            esac
            hostname=$value ;;
        pids) is_number "$key" "$value"; pids=$value ;;
        tmp_mb) is_number "$key" "$value"; tmp_mb=$value ;;
        run_mb) is_number "$key" "$value"; run_mb=$value ;;
        home_mb) is_number "$key" "$value"; home_mb=$value ;;
        shm_mb) is_number "$key" "$value"; shm_mb=$value ;;
        ports) ports=$value ;;
        net)
            case "$value" in
                none | user) net=$value ;;
                *) fail "opt/deskbox/init: net=$value is neither none nor user" ;;
            esac ;;
        volume)  # INDEX:ro|rw:PATH, PATH under /root/ or /tmp/ of plain names (the host's)
            case "$value" in
                [0-7]:r[ow]:/root/?* | [0-7]:r[ow]:/tmp/?*) ;;
                *) fail "opt/deskbox/init: volume=$value is not INDEX:ro|rw:PATH" ;;
            esac
            case "$value" in
                *[!A-Za-z0-9._/:-]* | */../* | */./* | */.. | */.)
                    fail "opt/deskbox/init: volume=$value has a path of other than plain names" ;;
            esac
            volumes="$volumes $value" ;;
        *) fail "opt/deskbox/init: unknown key '$key'" ;;
    esac
done < "$config/init/raw"

# The session's environment: NUL-terminated KEY=VALUE entries, kept as the arguments of
# `env -i` below (a shell variable cannot hold what a value may contain).
home=/root
set --
while IFS= read -r -d '' entry || [ -n "$entry" ]; do
    key=${entry%%=*}
    case "$key" in
        "$entry" | '' | [0-9]* | *[!A-Za-z0-9_]*)
            fail "opt/deskbox/env: an entry is not KEY=VALUE (it starts" \
                "'$(echo "$entry" | head -c 40)')" ;;
    esac
    [ "$key" = HOME ] && home=${entry#HOME=}
    set -- "$@" "$entry"
done < "$config/env/raw"
case "$home" in
    /*) ;;
    *) fail "opt/deskbox/env: HOME=$home is not an absolute path" ;;
esac

step "configuration read"
# The root disk: the virtio-blk disk whose serial is deskbox-root (probed as the module
# loaded; the loop only covers a slow probe).
root=
tries=0
while [ -z "$root" ]; do
    for disk in /sys/block/vd*; do
        [ "$(cat "$disk/serial" 2>/dev/null)" = deskbox-root ] && root=/dev/${disk##*/}
    done
    [ -n "$root" ] && break
    tries=$((tries + 1))
    [ "$tries" -le 100 ] || fail "no virtio-blk disk with serial deskbox-root (QEMU:" \
        "-device virtio-blk-device,drive=...,serial=deskbox-root)"
    sleep 0.02
done
mount -t erofs -o ro "$root" /newroot || fail "cannot mount $root (erofs) read-only"
[ -x /newroot/usr/local/bin/deskbox-session ] ||
    fail "$root holds no /usr/local/bin/deskbox-session: not a session image"

step "root $root mounted"
mount_tmpfs() {  # mountpoint size_mb mode
    [ -d "/newroot$1" ] || fail "the session image has no directory $1"
    mount -t tmpfs -o "nosuid,nodev,mode=$3,size=${2}m" tmpfs "/newroot$1" ||
        fail "cannot mount a tmpfs of $2 MiB on $1"
}
mount_tmpfs /tmp "$tmp_mb" 1777
mount_tmpfs /run "$run_mb" 755
mount_tmpfs "$home" "$home_mb" 700

# The session's volumes: ext4 disks found by their serial (deskbox-vol<index>), mounted
# where the session asked, read-only or not; above the tmpfs of /root and /tmp.
for volume in $volumes; do
    index=${volume%%:*} rest=${volume#*:}
    mode=${rest%%:*} path=${rest#*:}
    disk=
    for candidate in /sys/block/vd*; do
        [ "$(cat "$candidate/serial" 2>/dev/null)" = "deskbox-vol$index" ] &&
            disk=/dev/${candidate##*/}
    done
    [ -n "$disk" ] || fail "no virtio-blk disk with serial deskbox-vol$index (volume $path)"
    mkdir -p "/newroot$path" || fail "cannot make the mount point $path"
    mount -t ext4 -o "$mode,nosuid,nodev" "$disk" "/newroot$path" ||
        fail "cannot mount the volume $disk (ext4) on $path"
    step "volume $disk on $path ($mode)"
done

# /dev/virtio-ports/<name> for each virtio-serial port (there is no udev): a port names
# itself once the host has announced it, so wait for the names (and for `ports`).
virtio_console=
for device in /sys/bus/virtio/devices/*; do
    [ "$(cat "$device/device" 2>/dev/null)" = 0x0003 ] && virtio_console=1
done
tries=0
while [ -n "$virtio_console" ]; do
    missing=
    named=
    for port in /sys/class/virtio-ports/vport*; do
        name=$(cat "$port/name" 2>/dev/null)
        if [ -n "$name" ]; then named="$named $name "; else missing=1; fi
    done
    [ -n "$named" ] || missing=1
    for name in $ports; do
        case "$named" in *" $name "*) ;; *) missing=1 ;; esac
    done
    [ -z "$missing" ] && break
    tries=$((tries + 1))
    [ "$tries" -le 250 ] || fail "virtio-serial ports not ready (named:${named:- none};" \
        "expected: ${ports:-any})"
    sleep 0.02
done
step "virtio-serial ports named:${named:- none}"
mkdir -p /dev/virtio-ports
for port in /sys/class/virtio-ports/vport*; do
    name=$(cat "$port/name" 2>/dev/null)
    [ -n "$name" ] && ln -sf "../${port##*/}" "/dev/virtio-ports/$name"
done

if [ "$pids" -gt 0 ]; then
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup &&
        echo +pids > /sys/fs/cgroup/cgroup.subtree_control &&
        mkdir /sys/fs/cgroup/session &&
        echo "$pids" > /sys/fs/cgroup/session/pids.max &&
        echo $$ > /sys/fs/cgroup/session/cgroup.procs ||
        fail "cannot limit the session to $pids processes (cgroup2 /session)"
    mount -o remount,bind,ro /sys/fs/cgroup ||
        fail "cannot make /sys/fs/cgroup read-only"
fi

hostname "$hostname" || fail "cannot set the host name $hostname"
ip link set lo up || fail "cannot bring lo up"
if [ "$net" = user ]; then
    # QEMU's user-mode network (slirp), inside the host-made network namespace whose
    # nftables rules decide what the session reaches: the guest's addresses are fixed.
    ip link set eth0 up && ip address add 10.0.2.15/24 dev eth0 &&
        ip route add default via 10.0.2.2 || fail "cannot configure eth0 (net=user)"
    mkdir -p /newroot/run/deskbox-net
    for file in hosts resolv.conf; do
        [ -r "$config/$file/raw" ] || continue
        cp "$config/$file/raw" "/newroot/run/deskbox-net/$file" &&
            mount --bind "/newroot/run/deskbox-net/$file" "/newroot/etc/$file" &&
            mount -o remount,bind,ro "/newroot/etc/$file" ||
            fail "cannot put opt/deskbox/$file on /etc/$file"
    done
    step "eth0 configured"
fi
uptime=$(cut -d' ' -f1 /proc/uptime)

mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o nosuid,noexec,newinstance,ptmxmode=0666,mode=0620,gid=5 devpts /dev/pts ||
    fail "cannot mount devpts"
# What runc adds to a container's /dev, which devtmpfs lacks.
ln -sf pts/ptmx /dev/ptmx
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t tmpfs -o nosuid,nodev,noexec,mode=1777,size="${shm_mb}m" tmpfs /dev/shm ||
    fail "cannot mount a tmpfs of $shm_mb MiB on /dev/shm"
mount -t mqueue -o nosuid,nodev,noexec mqueue /dev/mqueue || fail "cannot mount mqueue"
mount -o remount,bind,ro /sys || fail "cannot make /sys read-only"
# Last: mount(8) reads /proc/mounts. Each moves with what is mounted below it.
for fs in dev proc sys; do
    mount --move "/$fs" "/newroot/$fs" || fail "cannot move /$fs into the session root"
done

echo "deskbox-init: starting the session ${uptime} s after boot"
exec env -i "$@" /bin/switch_root /newroot /usr/local/bin/deskbox-session
