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

need=()
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
command -v python3 >/dev/null || need+=(python3)
command -v ssh >/dev/null || need+=(openssh-client)
command -v git >/dev/null || need+=(git)
if ((${#need[@]})); then
  echo "install: apt packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "install: creating .venv"
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ((dev)); then
  .venv/bin/python -m pip install -q -e '.[dev]'
else
  .venv/bin/python -m pip install -q -e .
fi
echo "install: done: $(.venv/bin/provision --help | head -n 1)"
echo "install: ansible $(.venv/bin/ansible --version | head -n 1)"
