# shellcheck shell=bash
# apt-get that waits for another apt instead of failing at once: on a fresh cloud machine
# unattended-upgrades holds the dpkg lock in its first minutes, and a second script's apt
# may hold it too ("Could not get lock /var/lib/dpkg/lock-frontend"). Sourced by the
# project's scripts; APT_LOCK_TIMEOUT (seconds, default 600) bounds the wait.
#
#   apt_get install -y PKG...    apt-get with -o DPkg::Lock::Timeout (apt waits itself)
#   apt_get update               retried every 5 s while the package lists are locked: apt
#                                2.6's DPkg::Lock::Timeout does not cover that lock
# SUDO, when set (scripts/install.sh as a user), runs apt-get through it.
APT_LOCK_TIMEOUT=${APT_LOCK_TIMEOUT:-600}

apt_get() {
  local deadline=$((SECONDS + APT_LOCK_TIMEOUT)) err rc cmd=(apt-get)
  [[ -n ${SUDO:-} ]] && cmd=("$SUDO" env "DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-}" apt-get)
  err=$(mktemp)
  while :; do
    "${cmd[@]}" -o DPkg::Lock::Timeout="$APT_LOCK_TIMEOUT" "$@" 2>"$err"
    rc=$?
    cat "$err" >&2
    if ((rc == 0)) || ! grep -q 'Could not get lock' "$err" || ((SECONDS >= deadline)); then
      rm -f "$err"
      return "$rc"
    fi
    echo "apt: another apt holds its lock; trying again in 5 s (up to ${APT_LOCK_TIMEOUT} s in all)" >&2
    sleep 5
  done
}
