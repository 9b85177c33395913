#!/usr/bin/env bash
# The project's test command (README): installs what the tests need on a fresh Debian
# machine, then runs every stage and prints a timing per stage.
#   scripts/test.sh                 all stages
#   scripts/test.sh lint unit       only these stages
# Stages: install testbed lint unit wheel e2e molecule lab
set -uo pipefail
cd "$(dirname "$0")/.."
ALL=(install testbed lint unit wheel e2e molecule lab)
stages=("$@")
((${#stages[@]})) || stages=("${ALL[@]}")

export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_FORCE_COLOR=0 PY_COLORS=0
failed=()
timings=()

run_stage() {
  local name=$1
  shift
  local start=$SECONDS
  echo "=== stage $name: start $(date -u +%H:%M:%S)"
  if "$@"; then
    timings+=("$name: $((SECONDS - start))s ok")
  else
    timings+=("$name: $((SECONDS - start))s FAILED")
    failed+=("$name")
  fi
  echo "=== stage $name: $((SECONDS - start))s"
}

stage_install() { scripts/install.sh --dev; }
stage_testbed() { tests/testbed/setup.sh; }
stage_lint() {
  local rc=0
  ruff check provisioner tests bench || rc=1
  mypy || rc=1
  yamllint -s . || rc=1
  ansible-lint --profile production -q || rc=1
  return $rc
}
stage_unit() { pytest -q -m "not container and not lab and not wheel" -p no:cacheprovider; }
# The built wheel in fresh venvs (system python3 and a Python >= 3.12); prints its timings.
stage_wheel() { pytest -q -s -m wheel -p no:cacheprovider tests/test_wheel.py; }
stage_e2e() { pytest -q -m "container and not molecule" -p no:cacheprovider tests/e2e; }
stage_molecule() { pytest -q -m molecule -p no:cacheprovider tests/molecule; }
# The VM lab prints its own timing per step (-s); see tests/lab/test_lab.py.
stage_lab() { pytest -q -s -m lab -p no:cacheprovider tests/lab; }

for s in "${stages[@]}"; do
  case "$s" in
    install|testbed|lint|unit|wheel|e2e|molecule|lab) run_stage "$s" "stage_$s" ;;
    *) echo "unknown stage $s (stages: ${ALL[*]})"; exit 2 ;;
  esac
  # nothing else can run without the tools
  if [[ "$s" == install && ${#failed[@]} -gt 0 ]]; then break; fi
done

echo "=== timings"
printf '  %s\n' "${timings[@]}"
if ((${#failed[@]})); then
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
