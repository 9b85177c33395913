#!/usr/bin/env bash
# Builds (or finds cached) the VM image of the lab: Debian 12 with the Debian kernel, its
# headers, zfs-dkms built for that kernel inside the chroot, openssh, and every package the
# storage/fabric/PXE roles install, so the slow emulated guests never wait for apt.
#
#   tests/lab/build-image.sh            prints the image directory on its last line
#
# Output (LAB_CACHE, default /var/cache/provision-lab/image-<stamp>/):
#   root.raw  ext4 root filesystem image (label root), vmlinuz, initrd.img,
#   id_ed25519(.pub)  the key root accepts, kver  the guest kernel version.
# The stamp hashes this script, so any change to the recipe builds a new image; older
# images are removed. Needs root (mmdebstrap, chroot) and the test bed's apt-cacher-ng
# (tests/testbed/setup.sh) on 127.0.0.1:3142.
set -euo pipefail
SELF=$(readlink -f "$0")
# shellcheck source=../../scripts/lib/apt.sh
. "$(dirname "$SELF")/../../scripts/lib/apt.sh"

SUITE=bookworm
MIRROR=${TESTBED_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${TESTBED_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
ACNG=http://127.0.0.1:3142
CACHE_ROOT=${LAB_CACHE:-/var/cache/provision-lab}
ROOT_SIZE=${LAB_ROOT_SIZE:-6G}

HOST_PACKAGES=(qemu-system-x86 qemu-utils ipxe-qemu e2fsprogs iproute2 openssh-client mmdebstrap)
BASE_PACKAGES=(
  linux-image-amd64 linux-headers-amd64 systemd-sysv dbus openssh-server
  python3 python3-apt sudo ifupdown isc-dhcp-client iproute2 udev kmod procps
)
# What the roles install on Debian 12 (roles/*/vars/Debian.yml and common_packages).
ROLE_PACKAGES=(
  # common
  chrony tzdata ca-certificates acl bash-completion ethtool htop iputils-ping jq lsof
  numactl pciutils psmisc rsync tmux vim-tiny
  # zfs (zfs-dkms is built for the guest kernel below)
  zfs-dkms zfsutils-linux zfs-zed
  # nfs_server, nfs_client, mergerfs
  nfs-kernel-server nfs-common mergerfs fuse3
  # ofed (inbox)
  rdma-core ibverbs-providers ibverbs-utils infiniband-diags perftest
  # scratch (store2's local disk: one ext4 volume)
  parted
  # pxe_server (head)
  dnsmasq dnsmasq-base nginx ipxe libarchive-tools curl debian-installer-12-netboot-amd64
  # munge, slurm (head: the controller; the deployed compute node installs its own)
  munge slurmctld slurm-client libpmix2
  # monitoring: the server on head1; the agent on every node (the deployed node's image
  # carries it: provision image build adds it for a manifest with a monitoring: section)
  prometheus prometheus-alertmanager
  prometheus-node-exporter prometheus-node-exporter-collectors smartmontools nvme-cli
)
# Services the roles enable where they belong; off in the image so every VM starts clean.
DISABLED_SERVICES=(nfs-server zfs-zed munge slurmctld
  prometheus prometheus-alertmanager systemd-networkd-wait-online)
# Debian's own jobs that no role configures and no lab check reads, off in the guests: each
# cost emulated CPU beside the applies (systemd-analyze blame on a booted guest):
# node_exporter's apt collector loads the apt cache at boot and every 15 minutes (47 s each
# time, on every guest), e2scrub_reap looks for LVM snapshots at boot (48 s).
QUIET_UNITS=(prometheus-node-exporter-apt.timer e2scrub_reap.service e2scrub_all.timer)
# Services enabled as on a node deployed from our image (which enables systemd-networkd) and
# by their package's postinst when a role installs them (node_exporter on every node; nginx
# and dnsmasq, head1's PXE server, idle with Debian's default configuration elsewhere): the
# applies find them enabled. Enabling a unit under emulation costs 25-55 s (a daemon
# reload, and Debian's SysV compatibility script for those with an init script), on the
# critical path for the PXE server; the roles' enable logic is proven in molecule, the lab
# proves what they configure on a real kernel.
ENABLED_SERVICES=(systemd-networkd prometheus-node-exporter nginx dnsmasq)

log() { printf '[lab-image] %s\n' "$*" >&2; }

STAMP=$(sha256sum <"$SELF" | cut -c1-16)
OUT=$CACHE_ROOT/image-$STAMP
if [[ -f $OUT/complete ]]; then
  log "cached: $OUT"
  echo "$OUT"
  exit 0
fi

missing=()
for p in "${HOST_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "installing host packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt_get install -y -q --no-install-recommends "${missing[@]}" >&2 \
    || { apt_get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt_get install -y -q --no-install-recommends "${missing[@]}" >&2; }
fi
curl -fsS -o /dev/null --max-time 5 "$ACNG/acng-report.html" \
  || { log "apt-cacher-ng is not answering on $ACNG: run tests/testbed/setup.sh first"; exit 1; }

mkdir -p "$CACHE_ROOT"
ROOTFS=$(mktemp -d "$CACHE_ROOT/rootfs.XXXXXX")
chmod 0755 "$ROOTFS"  # the guests' / (mktemp makes it 0700: no user but root could reach anything)
cleanup() {
  for m in dev/pts dev proc sys; do umount -l "$ROOTFS/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$ROOTFS"
}
trap cleanup EXIT

t0=$SECONDS
include=$(IFS=,; echo "${BASE_PACKAGES[*]}")
# mmdebstrap, not debootstrap: one apt run for the base (36 s less of a 341 s build on a warm
# cache, 2 cores), dpkg without fsyncs from the start (the throwaway root, below), and no
# documentation, manual pages or translations in the guests (as in our node image).
mmdebstrap --mode=root --variant=important --components=main,contrib --include="$include" \
  --setup-hook='mkdir -p "$1/etc/dpkg/dpkg.cfg.d" && echo force-unsafe-io >"$1/etc/dpkg/dpkg.cfg.d/zz-lab-build"' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  "$SUITE" "$ROOTFS" "$ACNG/${MIRROR#http://}" >&2
log "mmdebstrap: $((SECONDS - t0)) s"

cat >"$ROOTFS/etc/apt/sources.list" <<SRC
deb $MIRROR $SUITE main contrib non-free non-free-firmware
deb $MIRROR $SUITE-updates main contrib non-free non-free-firmware
deb $SECURITY_MIRROR $SUITE-security main contrib non-free non-free-firmware
SRC
# Guests reach the host's apt cache through qemu's user network (10.0.2.2).
# Retries at once: a delayed retry can leave bookworm's apt stuck for good (LP: #2003851,
# tests/testbed/README.md); the common role writes the same on every node it configures.
printf '%s\n' 'Acquire::http::Proxy "http://10.0.2.2:3142";' 'Acquire::Retries::Delay "false";' \
  >"$ROOTFS/etc/apt/apt.conf.d/01proxy"
printf '#!/bin/sh\nexit 101\n' >"$ROOTFS/usr/sbin/policy-rc.d"
chmod 0755 "$ROOTFS/usr/sbin/policy-rc.d"
for m in proc sys dev dev/pts; do mount --bind "/$m" "$ROOTFS/$m"; done

# A throwaway root: dpkg skips its fsyncs there (a crash means a new build anyway; the
# setup hook above wrote that), and the initramfs is made once, below, instead of at each
# trigger (zfs-dkms, then again).
INITRAMFS_CONF=$ROOTFS/etc/initramfs-tools/update-initramfs.conf
sed -i 's/^update_initramfs=.*/update_initramfs=no/' "$INITRAMFS_CONF"

t=$SECONDS
chroot "$ROOTFS" env DEBIAN_FRONTEND=noninteractive http_proxy=$ACNG \
  sh -ec 'apt-get update -q && apt-get install -y -q --no-install-recommends "$@"' sh "${ROLE_PACKAGES[@]}" >&2
KVER=$(basename "$(find "$ROOTFS/lib/modules" -mindepth 1 -maxdepth 1 -type d | sort | tail -1)")
log "packages: $((SECONDS - t)) s; guest kernel $KVER"
if ! find "$ROOTFS/lib/modules/$KVER" -name 'zfs.ko*' | grep -q .; then
  t=$SECONDS
  chroot "$ROOTFS" dkms autoinstall -k "$KVER" >&2
  log "zfs-dkms for $KVER: $((SECONDS - t)) s"
fi
find "$ROOTFS/lib/modules/$KVER" -name 'zfs.ko*' | grep -q . || { log "no zfs module for $KVER"; exit 1; }
rm -f "$ROOTFS/etc/dpkg/dpkg.cfg.d/zz-lab-build"
sed -i 's/^update_initramfs=.*/update_initramfs=yes/' "$INITRAMFS_CONF"
t=$SECONDS
chroot "$ROOTFS" update-initramfs -u -k "$KVER" >&2
log "initramfs: $((SECONDS - t)) s"
for s in "${ENABLED_SERVICES[@]}"; do chroot "$ROOTFS" systemctl enable "$s" >&2; done
for s in "${DISABLED_SERVICES[@]}"; do chroot "$ROOTFS" systemctl disable "$s" >&2 || true; done
for s in "${QUIET_UNITS[@]}"; do chroot "$ROOTFS" systemctl disable "$s" >&2; done
chroot "$ROOTFS" apt-get clean
rm -f "$ROOTFS/usr/sbin/policy-rc.d"
for m in dev/pts dev proc sys; do umount -l "$ROOTFS/$m"; done

# System configuration of every lab VM (addresses come from the kernel command line).
echo "/dev/vda / ext4 rw,errors=remount-ro 0 1" >"$ROOTFS/etc/fstab"
echo labvm >"$ROOTFS/etc/hostname"
cat >"$ROOTFS/etc/network/interfaces" <<'NET'
auto lo
iface lo inet loopback
# qemu user network: SSH port forward and the host's apt cache
auto eth0
iface eth0 inet dhcp
NET
cat >"$ROOTFS/usr/local/sbin/lab-net" <<'SH'
#!/bin/sh
# Lab VMs: "lab.addr=eth1:10.77.0.11/24" on the kernel command line gives eth1 its
# management address, as an installer would have written it.
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    lab.addr=*) v=${arg#lab.addr=}; dev=${v%%:*}; ip link set "$dev" up; ip addr replace "${v#*:}" dev "$dev" ;;
    lab.up=*) ip link set "${arg#lab.up=}" up ;;
  esac
done
SH
chmod 0755 "$ROOTFS/usr/local/sbin/lab-net"
cat >"$ROOTFS/etc/systemd/system/lab-net.service" <<'UNIT'
[Unit]
Description=Lab VM addresses from the kernel command line
After=systemd-udev-settle.service
Before=network-pre.target
Wants=network-pre.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/lab-net
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
UNIT
chroot "$ROOTFS" systemctl enable lab-net.service >&2
# Serial console login for debugging; no password logins over SSH.
chroot "$ROOTFS" passwd -d root >/dev/null
ssh-keygen -q -t ed25519 -N '' -C provision-lab -f "$ROOTFS/root/lab_key"
install -d -m 0700 "$ROOTFS/root/.ssh"
mv "$ROOTFS/root/lab_key.pub" "$ROOTFS/root/.ssh/authorized_keys"
chmod 0600 "$ROOTFS/root/.ssh/authorized_keys"

TMP_OUT=$(mktemp -d "$CACHE_ROOT/out.XXXXXX")
mv "$ROOTFS/root/lab_key" "$TMP_OUT/id_ed25519"
cp "$ROOTFS/root/.ssh/authorized_keys" "$TMP_OUT/id_ed25519.pub"
cp "$ROOTFS/boot/vmlinuz-$KVER" "$TMP_OUT/vmlinuz"
cp "$ROOTFS/boot/initrd.img-$KVER" "$TMP_OUT/initrd.img"
echo "$KVER" >"$TMP_OUT/kver"
t=$SECONDS
truncate -s "$ROOT_SIZE" "$TMP_OUT/root.raw"
mkfs.ext4 -q -F -L root -d "$ROOTFS" "$TMP_OUT/root.raw"
log "mkfs.ext4 -d: $((SECONDS - t)) s"
touch "$TMP_OUT/complete"
find "$CACHE_ROOT" -mindepth 1 -maxdepth 1 -name 'image-*' -exec rm -rf {} +
mv "$TMP_OUT" "$OUT"
log "built $OUT in $((SECONDS - t0)) s"
echo "$OUT"
