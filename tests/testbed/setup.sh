#!/usr/bin/env bash
# Test bed for molecule scenarios and end-to-end tests (see docs/design.md, "Test bed").
#
# Runs as root on a fresh Debian 12 machine; idempotent (a second run only checks).
#   1. installs podman + runc + debootstrap + apt-cacher-ng and test tools, and takes
#      promtool, amtool and prometheus out of Debian's prometheus packages (not installing them)
#   2. writes /etc/containers/containers.conf (runc, ulimits that work here)
#   3. runs apt-cacher-ng on the host (port 3142): shared apt cache for every container/VM
#   4. builds localhost/provision-base:bookworm (only if missing or its stamp changed)
#   5. smoke-tests the image (systemd boots, apt goes through the cache)
#
# Environment knobs:
#   TESTBED_REBUILD=1          rebuild the base image even if its stamp matches
#   TESTBED_SKIP_SMOKE=1       skip the smoke test
#   TESTBED_EXTRA_PACKAGES=".." extra host packages (space separated)
#   TESTBED_MIRROR=URL         Debian mirror (default http://deb.debian.org/debian)
set -euo pipefail
# shellcheck source=../../scripts/lib/apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/apt.sh"

# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------
# Bump IMAGE_VERSION when the image recipe changes in a way the stamp below cannot see.
IMAGE_VERSION=1
IMAGE=localhost/provision-base:bookworm
TESTBED_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SUITE=bookworm
MIRROR=${TESTBED_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${TESTBED_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
ACNG_PORT=3142
# How containers reach the host's apt-cacher-ng. podman (4.3, rootful, netavark) puts
# this name into every container's /etc/hosts, on the default network and on
# user-created networks alike (it resolves to the host's primary address).
CONTAINER_PROXY_HOST=host.containers.internal

HOST_PACKAGES=(
  podman runc debootstrap apt-cacher-ng
  # provision image build (node OS images, the deploy ramdisk; tests/lab/test_image_build.py)
  mmdebstrap zstd
  # provision slurm build signs its apt repository (tests/commands/test_slurm.py)
  gnupg
  slirp4netns uidmap iptables
  openssh-client curl ca-certificates
  # used by later tests: BMC (IPMI) client, TFTP client for PXE tests
  ipmitool tftp-hpa
  # name resolution on podman networks (CNI backend; a Recommends of podman's, so not
  # pulled in by --no-install-recommends): Slurm and the end-to-end nodes find each
  # other by name
  golang-github-containernetworking-plugin-dnsname
  # the wheel test installs the built package into a fresh venv of the system's python3
  python3-venv
  # the VM lab (tests/lab) and the TCG speed probe scripts/test.sh prints (tcg_probe.py)
  qemu-system-x86 qemu-utils ipxe-qemu
  # netplan's library, for netplan-generate below (a library: nothing runs)
  libnetplan0
)
# shellcheck disable=SC2206
HOST_PACKAGES+=(${TESTBED_EXTRA_PACKAGES:-})

# Everything every scenario needs, baked in once (Ansible: python3 + python3-apt;
# systemd as PID 1; dbus for hostnamectl/logind; sshd for ssh-based tests).
IMAGE_PACKAGES=(
  python3 python3-apt
  systemd systemd-sysv dbus libpam-systemd
  sudo openssh-server
  iproute2 procps kmod
  ca-certificates gnupg curl
  less
)
IMAGE_COMPONENTS="main contrib non-free non-free-firmware"

# Everything done to the debootstrapped tree. Its text (declare -f, comments dropped)
# is part of the image stamp, so editing it triggers a rebuild.
customize_rootfs() {
  local ROOTFS=$1
  # apt sources: the real mirror (the proxy is configured separately below).
  cat >"$ROOTFS/etc/apt/sources.list" <<EOF
deb ${MIRROR} ${SUITE} ${IMAGE_COMPONENTS}
deb ${MIRROR} ${SUITE}-updates ${IMAGE_COMPONENTS}
deb ${SECURITY_MIRROR} ${SUITE}-security ${IMAGE_COMPONENTS}
EOF
  # apt proxy: use the host's apt-cacher-ng when it answers, go direct otherwise
  # (so the image still works on a machine without the cache).
  cat >"$ROOTFS/usr/local/sbin/testbed-apt-proxy" <<EOF
#!/bin/bash
# apt Proxy-Auto-Detect helper (test bed image, tests/testbed/setup.sh): prints the
# host's apt-cacher-ng if it answers, else DIRECT. Candidates: ${CONTAINER_PROXY_HOST}
# (podman writes it into /etc/hosts) and the default gateway (the host on podman bridge
# networks; covers --no-hosts containers).
gw=\$(ip -4 route show default 2>/dev/null | awk '{print \$3; exit}')
for h in ${CONTAINER_PROXY_HOST} \$gw; do
  if timeout 2 bash -c "exec 3<>/dev/tcp/\$h/${ACNG_PORT}" 2>/dev/null; then
    echo "http://\$h:${ACNG_PORT}"
    exit 0
  fi
done
echo DIRECT
EOF
  chmod 0755 "$ROOTFS/usr/local/sbin/testbed-apt-proxy"
  cat >"$ROOTFS/etc/apt/apt.conf.d/01testbed-proxy" <<'EOF'
// Test bed: apt traffic goes through the host's apt-cacher-ng (tests/testbed/setup.sh).
Acquire::http::Proxy-Auto-Detect "/usr/local/sbin/testbed-apt-proxy";
// Bounded: a connection that stays silent this long is dropped and the fetch retried.
Acquire::http::Timeout "30";
Acquire::Retries "3";
// Retry at once: a delayed retry can stop bookworm's apt (2.6.1) for good, its queue
// stuck behind the delayed item (LP: #2003851; tests/testbed/README.md).
Acquire::Retries::Delay "false";
EOF

  # Clean identity so every container boots as a new machine.
  rm -f "$ROOTFS/etc/hostname" "$ROOTFS/etc/resolv.conf" "$ROOTFS/var/lib/dbus/machine-id"
  : >"$ROOTFS/etc/machine-id"
  rm -f "$ROOTFS"/etc/ssh/ssh_host_*
  # Regenerate sshd host keys on first boot (Debian's ssh.service does not).
  cat >"$ROOTFS/etc/systemd/system/ssh-hostkeys.service" <<'EOF'
[Unit]
Description=Generate SSH host keys (test bed image)
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
Before=ssh.service

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
EOF
  chroot "$ROOTFS" systemctl enable ssh-hostkeys.service ssh.service
  # Ansible and testinfra reach the molecule containers over SSH: each connection is one
  # `podman exec -i NAME testbed-sshd-stdio` (an sshd on stdin/stdout, the ProxyCommand in
  # .config/molecule/config.yml), multiplexed by ControlMaster and pipelined. That is a
  # third of the time and CPU of the podman connection plugin, which runs several
  # `podman exec` per module. Its own config, host key and authorized key (the test bed's
  # client key), so roles that rewrite sshd_config or root's authorized_keys do not cut
  # the tests off; no PAM session (the podman connection had none either).
  ssh-keygen -q -t ed25519 -N '' -C testbed-host -f "$ROOTFS/etc/ssh/testbed_host_ed25519_key"
  printf '%s\n' "$TESTBED_SSH_PUBKEY" >"$ROOTFS/etc/ssh/testbed_authorized_keys"
  cat >"$ROOTFS/etc/ssh/testbed_sshd_config" <<'EOF'
# Test bed (tests/testbed/setup.sh): the sshd of /usr/local/sbin/testbed-sshd-stdio only.
HostKey /etc/ssh/testbed_host_ed25519_key
AuthorizedKeysFile /etc/ssh/testbed_authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
MaxSessions 64
Subsystem sftp internal-sftp
LogLevel ERROR
EOF
  cat >"$ROOTFS/usr/local/sbin/testbed-sshd-stdio" <<'EOF'
#!/bin/sh
# Test bed: one SSH connection on stdin/stdout (`podman exec -i NAME testbed-sshd-stdio`
# as an ssh ProxyCommand; .config/molecule/config.yml). sshd needs its privilege
# separation directory, which ssh.service's stop would remove.
mkdir -p /run/sshd
exec /usr/sbin/sshd -i -f /etc/ssh/testbed_sshd_config
EOF
  chmod 0755 "$ROOTFS/usr/local/sbin/testbed-sshd-stdio"
  # Units that cannot work in a container and only mark the system degraded.
  chroot "$ROOTFS" systemctl mask systemd-remount-fs.service
  # root's systemd user manager lingers: started at boot, never stopped. In these
  # containers its stop (10 s after root's last session ends) hangs until systemd gives
  # up ("Processes still around after final SIGKILL", 2 min), and an SSH login meanwhile
  # waits in pam_systemd for it: a login 20 s after a logout took 110 s, and a new node's
  # first Ansible task stalled 36-108 s in bench_apply (docs/benchmarks.md).
  mkdir -p "$ROOTFS/var/lib/systemd/linger"
  touch "$ROOTFS/var/lib/systemd/linger/root"
  chroot "$ROOTFS" apt-get clean
  rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin \
    "$ROOTFS"/var/log/*.log "$ROOTFS"/var/log/apt/* "$ROOTFS"/tmp/*
  # No package lists: make the (empty) cache look stale, as on a machine installed long
  # ago, so apt's cache_valid_time refreshes it instead of trusting a fresh mtime.
  touch -d '2000-01-01 00:00:00' "$ROOTFS"/var/lib/apt/lists
}

# The test bed's SSH client key (root's; the molecule containers authorize it, see
# customize_rootfs). Made once per machine, before the stamp: a new key rebuilds the image.
TESTBED_SSH_KEY=/usr/local/lib/provision-testbed/ssh/id_ed25519
if [[ ! -s $TESTBED_SSH_KEY ]]; then
  install -d -m 0700 "$(dirname "$TESTBED_SSH_KEY")"
  rm -f "$TESTBED_SSH_KEY" "$TESTBED_SSH_KEY.pub"
  ssh-keygen -q -t ed25519 -N '' -C provision-testbed -f "$TESTBED_SSH_KEY"
fi
TESTBED_SSH_PUBKEY=$(cat "$TESTBED_SSH_KEY.pub")

# Stamp: changes whenever the recipe above changes -> image is rebuilt.
IMAGE_STAMP=$(printf '%s\n' "$IMAGE_VERSION" "$SUITE" "$MIRROR" "$SECURITY_MIRROR" \
  "$IMAGE_COMPONENTS" "$CONTAINER_PROXY_HOST" "$ACNG_PORT" "${IMAGE_PACKAGES[@]}" "$TESTBED_SSH_PUBKEY" \
  "$(declare -f customize_rootfs)" | sha256sum | cut -c1-16)
STAMP_LABEL=io.provisioner.testbed.stamp

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
T0=$(date +%s)
STAGE_NAME=""
STAGE_T0=0
log() { printf '[testbed] %s\n' "$*"; }
stage() {
  stage_end
  STAGE_NAME=$1
  STAGE_T0=$(date +%s)
  log "==> $STAGE_NAME"
}
stage_end() {
  if [[ -n $STAGE_NAME ]]; then
    log "<== $STAGE_NAME: $(($(date +%s) - STAGE_T0)) s"
    STAGE_NAME=""
  fi
}
die() { log "ERROR: $*"; exit 1; }

# write_if_changed PATH MODE  (content on stdin) -> returns 0 if written, 1 if unchanged
write_if_changed() {
  local path=$1 mode=$2 tmp
  tmp=$(mktemp)
  cat >"$tmp"
  if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
    rm -f "$tmp"
    log "unchanged: $path"
    return 1
  fi
  mkdir -p "$(dirname "$path")"
  if [[ -f $path ]] && ! grep -q '^# Managed by tests/testbed/setup.sh' "$path"; then
    cp -a "$path" "$path.orig"
    log "backed up previous $path"
  fi
  install -m "$mode" "$tmp" "$path"
  rm -f "$tmp"
  log "wrote: $path"
  return 0
}

[[ $(id -u) -eq 0 ]] || die "must run as root"
# shellcheck source=/dev/null
[[ -r /etc/os-release ]] && . /etc/os-release
[[ ${ID:-} == debian ]] || log "WARNING: written for Debian 12, this is ${PRETTY_NAME:-unknown}"

# ---------------------------------------------------------------------------
# 1. Host packages
# ---------------------------------------------------------------------------
stage "host packages"
export DEBIAN_FRONTEND=noninteractive
missing=()
for p in "${HOST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing: ${missing[*]}"
  # apt-cacher-ng asks whether to allow HTTPS tunnels; keep the default (no).
  echo 'apt-cacher-ng apt-cacher-ng/tunnelenable boolean false' | debconf-set-selections
  apt_get update
  apt_get install -y --no-install-recommends "${missing[@]}"
else
  log "all host packages present"
fi

# ---------------------------------------------------------------------------
# 1b. promtool and amtool (rule and config checks of the monitoring unit tests), netplan's
#     generator (the netplan files of the network unit tests)
# ---------------------------------------------------------------------------
stage "promtool, amtool and netplan-generate"
# Only the two check tools, taken out of Debian's prometheus and prometheus-alertmanager
# packages (~30 MB download, ~67 MB on disk): installing the packages would start a
# Prometheus and an Alertmanager on this machine. /usr/local/bin/{promtool,amtool}.
install_check_tool() {  # tool package path-in-package
  local tool=$1 pkg=$2 member=$3 want have tmp
  want=$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')
  [[ -n $want && $want != "(none)" ]] || die "$pkg has no candidate (apt-get update?)"
  have=$(cat "/usr/local/lib/provision-testbed/$tool.version" 2>/dev/null || true)
  if [[ -x /usr/local/bin/$tool && $have == "$want" ]]; then
    log "$tool from $pkg $want present"
    return 0
  fi
  tmp=$(mktemp -d) && chmod 0755 "$tmp"  # apt downloads as _apt
  (cd "$tmp" && timeout 300 apt-get download -q "$pkg=$want" >/dev/null) || { rm -rf "$tmp"; die "could not download $pkg"; }
  dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp" "./$member"
  install -m 0755 "$tmp/$member" "/usr/local/bin/$tool"
  mkdir -p /usr/local/lib/provision-testbed
  echo "$want" >"/usr/local/lib/provision-testbed/$tool.version"
  rm -rf "$tmp"
  log "installed /usr/local/bin/$tool from $pkg $want"
}
install_check_tool promtool prometheus usr/bin/promtool
# Prometheus itself, never started as a service: the usage report's unit test runs one on a
# loopback port over a TSDB that promtool made (tests/areas/monitoring/test_usage.py).
install_check_tool prometheus prometheus usr/bin/prometheus
install_check_tool amtool prometheus-alertmanager usr/bin/amtool
# netplan's generator alone (netplan.io would also bring its systemd generator, which writes
# networkd units from /etc/netplan at boot): the unit tests render the Ubuntu netplan files
# with it under a temporary root (tests/conftest.py, netplan).
install_check_tool netplan-generate netplan.io usr/libexec/netplan/generate

# ---------------------------------------------------------------------------
# 2. containers.conf
# ---------------------------------------------------------------------------
stage "containers.conf"
# crun fails on this host (cgroups hybrid mode) and podman's default ulimits fail
# with "setrlimit RLIMIT_NOFILE: Operation not permitted".
write_if_changed /etc/containers/containers.conf 0644 <<'EOF' || true
# Managed by tests/testbed/setup.sh
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
EOF

# The kernel shifts the clock by the time zone offset on the very first settimeofday()
# that passes a time zone ("time warp" for an RTC kept in local time). systemd as PID 1
# makes a harmless first call at boot; where PID 1 is not systemd (as on these machines)
# the first call could come from a test container with CAP_SYS_TIME (a privileged one)
# setting a time zone, and the host's clock would jump by hours. Make that first call
# here, with UTC, so no container can warp the host's clock.
python3 - <<'PY' || log "could not seal the kernel's time warp (not root?)"
import ctypes
import struct

tz = ctypes.create_string_buffer(struct.pack("ii", 0, 0))  # minutes west, dst: UTC
libc = ctypes.CDLL(None, use_errno=True)
if libc.settimeofday(None, tz) != 0:
    raise SystemExit(ctypes.get_errno())
PY

# ---------------------------------------------------------------------------
# 3. apt-cacher-ng
# ---------------------------------------------------------------------------
stage "apt-cacher-ng"
acng_up() { curl -fsS -o /dev/null --max-time 5 "http://127.0.0.1:${ACNG_PORT}/acng-report.html"; }
pid1=$(ps -p 1 -o comm= | tr -d ' ')
# The package's default Debian backend is ftp.debian.org, which is not reachable from
# every CI machine: send Debian requests to the mirror we use. (No "#09f369..." marker
# line, so package upgrades leave this file alone.)
acng_changed=0
write_if_changed /etc/apt-cacher-ng/backends_debian 0644 <<EOF && acng_changed=1
# Managed by tests/testbed/setup.sh: upstream for http://<cache>/debian/... requests
${MIRROR%/}/
EOF
if acng_up && ((acng_changed)); then
  log "backend changed: restarting apt-cacher-ng"
  if [[ $pid1 == systemd ]]; then systemctl restart apt-cacher-ng; else /etc/init.d/apt-cacher-ng restart; fi
  sleep 1
fi
if acng_up; then
  log "apt-cacher-ng is running"
elif [[ $pid1 == systemd ]]; then
  log "PID 1 is systemd: systemctl enable --now apt-cacher-ng"
  systemctl enable --now apt-cacher-ng
else
  log "PID 1 is '$pid1' (not systemd): starting apt-cacher-ng via its init script"
  /etc/init.d/apt-cacher-ng start || true
  sleep 1
  if ! acng_up; then
    log "init script did not bring it up; starting the daemon directly"
    install -d -o apt-cacher-ng -g apt-cacher-ng /run/apt-cacher-ng /var/cache/apt-cacher-ng /var/log/apt-cacher-ng
    start-stop-daemon --start --background --chuid apt-cacher-ng --exec /usr/sbin/apt-cacher-ng -- \
      -c /etc/apt-cacher-ng ForeGround=1 pidfile=/run/apt-cacher-ng/pid \
      SocketPath=/run/apt-cacher-ng/socket
  fi
fi
for _ in $(seq 1 20); do acng_up && break; sleep 0.5; done
acng_up || die "apt-cacher-ng does not answer on 127.0.0.1:${ACNG_PORT}"
log "apt-cacher-ng answers on :${ACNG_PORT}"

# ---------------------------------------------------------------------------
# 4. Base image
# ---------------------------------------------------------------------------
stage "base image ${IMAGE}"
current_stamp=""
if podman image exists "$IMAGE"; then
  current_stamp=$(podman image inspect --format "{{ index .Labels \"${STAMP_LABEL}\" }}" "$IMAGE" 2>/dev/null || true)
fi
if [[ ${TESTBED_REBUILD:-0} != 1 && $current_stamp == "$IMAGE_STAMP" ]]; then
  log "image present with stamp ${IMAGE_STAMP}: nothing to build"
else
  log "building (present stamp: '${current_stamp:-none}', wanted: ${IMAGE_STAMP})"
  ROOTFS=$(mktemp -d /var/tmp/provision-base.XXXXXX)
  trap 'rm -rf --one-file-system "$ROOTFS"' EXIT
  # Fetch through the local cache: rebuilds come from disk, not the network.
  proxied_mirror="http://127.0.0.1:${ACNG_PORT}/${MIRROR#http://}"
  include=$(IFS=,; echo "${IMAGE_PACKAGES[*]}")
  t=$(date +%s)
  debootstrap --variant=minbase --components="${IMAGE_COMPONENTS// /,}" \
    --include="$include" "$SUITE" "$ROOTFS" "$proxied_mirror"
  log "debootstrap: $(($(date +%s) - t)) s"

  customize_rootfs "$ROOTFS"
  du -sh "$ROOTFS" | sed 's/^/[testbed] rootfs size: /'

  t=$(date +%s)
  old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
  tar --numeric-owner -C "$ROOTFS" -c . | podman import \
    --change 'CMD ["/sbin/init"]' \
    --change "LABEL ${STAMP_LABEL}=${IMAGE_STAMP}" \
    --message "provision test bed base image (stamp ${IMAGE_STAMP})" \
    - "$IMAGE" >/dev/null
  log "podman import: $(($(date +%s) - t)) s"
  # Drop the previous image if nothing uses it any more (dangling after re-tag).
  if [[ -n $old_id ]]; then podman rmi "$old_id" >/dev/null 2>&1 || true; fi
  rm -rf --one-file-system "$ROOTFS"
  trap - EXIT
fi

# ---------------------------------------------------------------------------
# 5. Smoke test
# ---------------------------------------------------------------------------
if [[ ${TESTBED_SKIP_SMOKE:-0} != 1 ]]; then
  stage "smoke test"
  name=testbed-smoke-$$
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman run -d --name "$name" --systemd=always "$IMAGE" >/dev/null
  trap 'podman rm -f "$name" >/dev/null 2>&1 || true' EXIT
  # systemd may not even accept connections right after `run -d`: ask again until it
  # answers with a final state, for up to 90 s.
  state=""
  for _ in $(seq 1 45); do
    state=$(podman exec "$name" timeout 60 systemctl is-system-running --wait 2>/dev/null || true)
    [[ $state == running || $state == degraded ]] && break
    sleep 2
  done
  log "systemd in container: ${state}"
  if [[ $state != running && $state != degraded ]]; then
    podman exec "$name" systemctl --failed --no-pager || true
    die "systemd did not boot in the base image"
  fi
  [[ $state == running ]] || podman exec "$name" systemctl --failed --no-pager --plain || true
  # root's user manager runs from boot (lingers), so no login waits for its hanging stop
  linger=$(podman exec "$name" loginctl show-user root -p Linger --value 2>&1 || true)
  [[ $linger == yes ]] || die "root's user manager does not linger in the base image (loginctl: ${linger})"
  log "root's user manager lingers (no login waits for its stop): ok"
  # the molecule scenarios' connection (.config/molecule/config.yml)
  who=$(timeout 30 ssh -i "$TESTBED_SSH_KEY" -o BatchMode=yes -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
    -o ProxyCommand="podman exec -i %h /usr/local/sbin/testbed-sshd-stdio" "root@$name" id -un 2>&1 || true)
  [[ $who == root ]] || die "ssh through testbed-sshd-stdio into the base image failed: ${who}"
  log "ssh into a container through podman exec (the molecule connection): ok"
  proxy=$(podman exec "$name" /usr/local/sbin/testbed-apt-proxy)
  log "apt proxy in container: ${proxy}"
  [[ $proxy == DIRECT ]] && die "container cannot reach apt-cacher-ng at ${CONTAINER_PROXY_HOST}:${ACNG_PORT}"
  podman exec "$name" apt-get -qq update
  log "apt-get update in container through the cache: ok"
  # The image's apt config retries a transient failure without stopping for good
  # (tests/testbed/README.md): apt against a fake mirror on the container's loopback.
  if ! out=$(podman exec -i "$name" timeout 90 python3 - --conf /etc/apt/apt.conf.d/01testbed-proxy \
    --bound 60 <"$TESTBED_DIR/apt_stuck_queue.py" 2>&1); then
    printf '%s\n' "$out"
    die "apt in the base image stalls or fails after a transient failure (tests/testbed/apt_stuck_queue.py)"
  fi
  log "apt in container survives a transient failure (no stuck queue): ok"
  net=testbed-dns-$$
  trap 'podman rm -f -t 0 "$name" "$name-peer" >/dev/null 2>&1 || true; podman network rm -f "$net" >/dev/null 2>&1 || true' EXIT
  podman network create "$net" >/dev/null
  podman run -d --name "$name-peer" --network "$net" --network-alias smoke-peer "$IMAGE" sleep 120 >/dev/null
  podman run --rm --network "$net" "$IMAGE" getent hosts smoke-peer >/dev/null \
    || die "containers on a podman network cannot resolve each other's names (no DNS plugin)"
  log "name resolution between containers on a podman network: ok"
  podman rm -f -t 0 "$name" "$name-peer" >/dev/null
  podman network rm -f "$net" >/dev/null
  trap - EXIT
fi

stage_end
log "done in $(($(date +%s) - T0)) s; image: ${IMAGE} (stamp ${IMAGE_STAMP})"
