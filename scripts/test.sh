#!/usr/bin/env bash
# The project's test command (README): installs what the tests need on a fresh Debian
# machine, then runs every stage, each under a time budget, and ends with a table of
# stages, budgets and times.
#   scripts/test.sh                 all stages
#   scripts/test.sh lint unit       only these stages
# Stages: install testbed lint unit wheel e2e molecule lab-image lab
#
# Two lanes run side by side once the test bed is up (TEST_LANES=0 runs everything in one
# lane, in the order above):
#   main: lint unit wheel e2e molecule     (streamed to this terminal)
#   lab:  lab-image lab                    (VM image build, then the VM lab; log in
#                                           .cache/ci/lab*.log, shown when the lane ends)
# Each stage has a budget (seconds, STAGE_BUDGET_<stage> overrides it); a stage that runs
# past it is stopped, what it was doing is printed (its processes and the end of its log),
# and the run fails at once. The whole run has a budget too (TEST_BUDGET, default 85 min:
# CI's hard limit is 90).
set -uo pipefail
cd "$(dirname "$0")/.."
ALL=(install testbed lint unit wheel e2e molecule lab-image lab)
MAIN_LANE=(lint unit wheel e2e molecule)
LAB_LANE=(lab-image lab)
declare -A BUDGET=(
  [install]=420 [testbed]=600 [lint]=420 [unit]=900 [wheel]=600 [e2e]=2100
  [molecule]=2400 [lab-image]=1500 [lab]=2700
)
TOTAL_BUDGET=${TEST_BUDGET:-5100}
LOGS=.cache/ci
mkdir -p "$LOGS"

stages=("$@")
((${#stages[@]})) || stages=("${ALL[@]}")
for s in "${stages[@]}"; do
  [[ -n ${BUDGET[$s]:-} ]] || { echo "unknown stage $s (stages: ${ALL[*]})"; exit 2; }
done
wanted() { local s; for s in "${stages[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }
# the lab needs its image: asking for the lab builds it
if wanted lab && ! wanted lab-image; then stages+=(lab-image); fi

export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 PYTHONUNBUFFERED=1
RUN_START=$SECONDS
RESULTS="$LOGS/results"
: >"$RESULTS"
rm -f "$LOGS"/*.pid "$LOGS"/*.watchdog

# The lab's guests run under software emulation, so its times follow the CPU: every run
# says which machine it ran on (docs/testing.md keeps the times per machine kind).
MACHINE="$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null), $(nproc) cores"
TCG_SPEED="TCG probe: not run (no qemu yet)"
# The stage budgets of the emulated stages were set on a machine whose probe said about
# TCG_REFERENCE M loops/s; on a slower one the same emulated work takes longer, so their
# budgets grow by the ratio (never shrink). The run's total budget still bounds everything.
TCG_REFERENCE=170
TCG_STAGES=(lab)
probe_tcg() {
  command -v qemu-system-x86_64 >/dev/null || return 0
  TCG_SPEED=$(timeout 150 python3 tests/testbed/tcg_probe.py 2>&1 | tail -n 1)
  echo "=== $TCG_SPEED"
  local speed s
  speed=$(sed -n 's/^TCG probe: \([0-9][0-9]*\) M loops\/s.*/\1/p' <<<"$TCG_SPEED")
  [[ -n $speed ]] && ((speed > 0 && speed < TCG_REFERENCE)) || return 0
  for s in "${TCG_STAGES[@]}"; do
    BUDGET[$s]=$((BUDGET[$s] * TCG_REFERENCE / speed))
    echo "=== budget of stage $s: ${BUDGET[$s]}s on this machine (TCG ${speed} M loops/s, budgets set at ${TCG_REFERENCE})"
  done
}
echo "=== machine: $MACHINE"

stage_install() { scripts/install.sh --dev; }
stage_testbed() { tests/testbed/setup.sh; }
# two halves side by side (one per core), their outputs shown one after the other
stage_lint() {
  local rc=0 out a b
  out=$(mktemp -d)
  { ruff check provisioner tests bench; r=$?; mypy || r=1; exit $r; } >"$out/python" 2>&1 &
  a=$!
  { yamllint -s .; r=$?; ansible-lint --profile production -q || r=1; exit $r; } >"$out/yaml" 2>&1 &
  b=$!
  wait "$a" || rc=1
  wait "$b" || rc=1
  cat "$out/python" "$out/yaml"
  rm -rf "$out"
  return $rc
}
# the testbed stage installed promtool/amtool: the monitoring rule tests must not skip here.
# Two workers: many cases wait on a subprocess (the CLI, promtool, a stand-in ssh), and
# with the lab's guests on the same cores a second worker keeps the lane's share.
stage_unit() {
  PROVISION_REQUIRE_PROMTOOL=1 pytest -q -n 2 -m "not container and not lab and not wheel" -p no:cacheprovider \
    --durations=15
}
stage_wheel() { pytest -q -s -m wheel -p no:cacheprovider tests/test_wheel.py; }
# the e2e modules (own podman networks and containers each) run side by side
stage_e2e() { pytest -q -s -m "container and not molecule" -p no:cacheprovider -n 2 --dist loadfile tests/e2e; }
# two scenarios at a time (each has its own containers, network and names)
stage_molecule() {
  pytest -q -n "${MOLECULE_JOBS:-2}" --dist worksteal --durations=0 -m molecule -p no:cacheprovider tests/molecule
}
stage_lab-image() { bash tests/lab/build-image.sh; }
# The VM lab prints its own timing per step (-s); see tests/lab/test_lab.py.
stage_lab() { pytest -q -s -m lab -p no:cacheprovider tests/lab; }

# run_stage NAME [LOGFILE]: runs stage_NAME in its own process group under its budget.
# Output goes to the terminal and LOGFILE (or only LOGFILE when QUIET=1).
run_stage() {
  local name=$1 log=$LOGS/$1.log budget=${BUDGET[$1]}
  local override="STAGE_BUDGET_${name//-/_}"
  budget=${!override:-$budget}
  local left=$((TOTAL_BUDGET - (SECONDS - RUN_START)))
  ((left < budget)) && budget=$((left > 0 ? left : 1))
  local start=$SECONDS rc
  echo "=== stage $name: start $(date -u +%H:%M:%S), budget ${budget}s"
  if [[ ${QUIET:-0} == 1 ]]; then
    setsid bash -c "$(declare -f "stage_$name"); stage_$name" >"$log" 2>&1 &
  else
    setsid bash -c "$(declare -f "stage_$name"); stage_$name" > >(tee "$log") 2>&1 &
  fi
  local pid=$!
  echo "$pid" >"$LOGS/$name.pid"  # its process group, for stop_lab_lane
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS - start > budget)); then
      {
        echo "=== stage $name: OVER BUDGET (${budget}s): stopping it. It was doing:"
        ps -o pid,etime,args --forest -g "$pid" 2>/dev/null | cut -c1-220 | tail -n 25
        echo "--- last lines of its log ($log):"
        tail -n 30 "$log"
      } | tee -a "$log.watchdog"
      kill -TERM -- "-$pid" 2>/dev/null
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      echo "$name ${budget} $((SECONDS - start)) OVER-BUDGET" >>"$RESULTS"
      return 124
    fi
    sleep 1
  done
  wait "$pid"
  rc=$?
  local result=ok
  ((rc == 0)) || result=FAILED
  echo "$name ${budget} $((SECONDS - start)) $result" >>"$RESULTS"
  echo "=== stage $name: $((SECONDS - start))s $result"
  return $rc
}

# run_lane STAGE...: the wanted ones in order; stops at the first failure (0/1 exit).
run_lane() {
  local s
  for s in "$@"; do
    wanted "$s" || continue
    run_stage "$s" || return 1
  done
}

table() {
  echo "=== timings (total $((SECONDS - RUN_START))s, budget ${TOTAL_BUDGET}s) on $MACHINE; $TCG_SPEED"
  printf '  %-10s %7s %7s  %s\n' stage budget time result
  local name budget took result
  while read -r name budget took result; do
    printf '  %-10s %6ss %6ss  %s\n' "$name" "$budget" "$took" "$result"
  done <"$RESULTS"
}

stop_lab_lane() {
  [[ -n ${LAB_PID:-} ]] && kill -0 "$LAB_PID" 2>/dev/null || return 0
  echo "=== stopping the lab lane"
  kill -TERM "$LAB_PID" 2>/dev/null
  local s pg
  for s in "${LAB_LANE[@]}"; do
    pg=$(cat "$LOGS/$s.pid" 2>/dev/null) || continue
    kill -TERM -- "-$pg" 2>/dev/null
    sleep 2
    kill -KILL -- "-$pg" 2>/dev/null
  done
  wait "$LAB_PID" 2>/dev/null
}

failed=0
# install and testbed first: nothing else runs without the tools
for s in install testbed; do
  wanted "$s" || continue
  run_stage "$s" || { failed=1; break; }
done
# before the lanes share the cores: the speed of this machine alone (the test bed
# installed qemu)
((failed)) || probe_tcg

LAB_PID=""
if ((!failed)); then
  lab_stages=()
  for s in "${LAB_LANE[@]}"; do wanted "$s" && lab_stages+=("$s"); done
  main_stages=()
  for s in "${MAIN_LANE[@]}"; do wanted "$s" && main_stages+=("$s"); done
  if [[ ${TEST_LANES:-1} == 1 && ${#lab_stages[@]} -gt 0 && ${#main_stages[@]} -gt 0 ]]; then
    echo "=== lanes: main (${main_stages[*]}) and lab (${lab_stages[*]}, log in $LOGS/)"
    QUIET=1 run_lane "${lab_stages[@]}" &
    LAB_PID=$!
    trap 'stop_lab_lane' EXIT
    run_lane "${main_stages[@]}" || failed=1
    if ((failed)); then
      stop_lab_lane  # the run fails at once
    else
      echo "=== main lane done at $((SECONDS - RUN_START))s; waiting for the lab lane"
      wait "$LAB_PID" || failed=1
    fi
    trap - EXIT
    for s in "${lab_stages[@]}"; do
      [[ -f $LOGS/$s.log ]] || continue
      echo "=== log of stage $s ($LOGS/$s.log)"
      if grep -q "^$s .* ok$" "$RESULTS"; then tail -n 60 "$LOGS/$s.log"; else tail -n 400 "$LOGS/$s.log"; fi
      cat "$LOGS/$s.log.watchdog" 2>/dev/null
    done
  else
    run_lane "${main_stages[@]}" "${lab_stages[@]}" || failed=1
  fi
fi

table
if ((failed)); then
  echo "FAILED: $(awk '$4 != "ok" {printf "%s ", $1}' "$RESULTS")"
  exit 1
fi
echo "all stages passed"
