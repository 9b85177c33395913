#!/usr/bin/env bash
# Install `provision` into .venv on a fresh Debian 12 / Ubuntu 22.04+ machine.
#   scripts/install.sh          the tool (ansible-core, the pinned `ansible` collections, ...)
#   scripts/install.sh --dev    plus the test tools (pytest, molecule, ansible-lint, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
[[ "${1:-}" == "--dev" ]] && dev=1

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
# shellcheck source=lib/apt.sh
. scripts/lib/apt.sh
export DEBIAN_FRONTEND=noninteractive

# The newest Python that runs a supported ansible-core: 3.12+ gets ansible-core 2.20/2.21,
# 3.11 (Debian 12's) gets 2.19; see docs/versions.md. PROVISION_PYTHON overrides the choice.
pick_python() {
  local c
  for c in ${PROVISION_PYTHON:-} python3.14 python3.13 python3.12 python3.11 python3; do
    # a pyenv shim exists for versions that are not active: run it to be sure
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

need=()
command -v python3 >/dev/null || need+=(python3)
command -v ssh >/dev/null || need+=(openssh-client)
command -v git >/dev/null || need+=(git)
if ((${#need[@]})); then
  echo "install: apt packages: ${need[*]}"
  apt_get update -qq
  apt_get install -y -qq "${need[@]}" >/dev/null
fi

if [[ ! -x .venv/bin/python ]]; then
  py=$(pick_python) || { echo "install: needs Python 3.11 or newer (Ubuntu 22.04: apt install python3.11-venv; then PROVISION_PYTHON=python3.11)" >&2; exit 1; }
  if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
    pkg="python$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')-venv"
    echo "install: apt package $pkg"
    apt_get update -qq
    apt_get install -y -qq "$pkg" >/dev/null
  fi
  echo "install: creating .venv with $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ((dev)); then
  .venv/bin/python -m pip install -q -e '.[dev]'
else
  .venv/bin/python -m pip install -q -e .
fi
echo "install: done: $(.venv/bin/provision --version)"
