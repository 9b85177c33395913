#!/usr/bin/env bash
# Make this machine look fresh for a timing run of .ci/run (README: "measured on a fresh
# machine"): removes what the test command installs or caches, so that the next run pays
# for all of it again. Destructive for this machine's test bed only; needs root.
#
#   tests/testbed/wipe.sh --yes
#
# Removes: every podman container, image, volume and network (podman system reset), the
# apt-cacher-ng package cache, the VM lab's image cache, the host packages that
# tests/testbed/setup.sh and tests/lab/build-image.sh install (purged), apt's downloaded
# .debs, pip's and molecule's caches, promtool, prometheus and amtool, and ./.venv. The Python
# interpreter and the base system stay: they come with a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ ${1:-} == --yes ]] || { echo "usage: $0 --yes   (wipes the test bed and caches of this machine)"; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "must run as root"; exit 1; }
# shellcheck source=../../scripts/lib/apt.sh
. scripts/lib/apt.sh

ip netns del provlab 2>/dev/null || true
pkill -f qemu-system-x86_64 2>/dev/null || true
if command -v podman >/dev/null; then
  podman rm -a -f -t 0 >/dev/null 2>&1 || true
  podman system reset -f >/dev/null 2>&1 || true
fi
/etc/init.d/apt-cacher-ng stop >/dev/null 2>&1 || true
pkill -x apt-cacher-ng 2>/dev/null || true
rm -rf /var/cache/apt-cacher-ng /var/cache/provision-lab
purge=(podman runc debootstrap apt-cacher-ng slirp4netns uidmap ipmitool tftp-hpa
  golang-github-containernetworking-plugin-dnsname python3-venv
  qemu-system-x86 qemu-utils ipxe-qemu libnetplan0)
installed=()
for p in "${purge[@]}"; do dpkg -s "$p" >/dev/null 2>&1 && installed+=("$p"); done
if ((${#installed[@]})); then
  DEBIAN_FRONTEND=noninteractive apt_get purge -y -q "${installed[@]}" >/dev/null
  DEBIAN_FRONTEND=noninteractive apt_get autoremove -y -q --purge >/dev/null
fi
apt-get clean
rm -rf /etc/containers/containers.conf /var/lib/containers /root/.cache/pip /root/.cache/molecule \
  /root/.ansible .venv .cache /usr/local/bin/promtool /usr/local/bin/prometheus /usr/local/bin/amtool /usr/local/bin/netplan-generate \
  /usr/local/lib/provision-testbed
echo "wiped: podman storage, apt-cacher-ng cache, VM image cache, test bed host packages, pip/molecule caches, .venv"
