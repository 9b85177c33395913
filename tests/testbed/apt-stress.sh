#!/usr/bin/env bash
# Many parallel `apt-get update` runs in test bed containers, through the host's
# apt-cacher-ng, to show whether apt can stall against it (issue: a 6-minute hang of the
# apt module in the end-to-end stage).
#
#   tests/testbed/apt-stress.sh [-n CONTAINERS] [-r ROUNDS] [-t STALL_SECONDS] [-o APT_OPTION]... [-p|-f]
#
# Each container runs ROUNDS updates with empty package lists, each bounded: a run that has
# not finished after STALL_SECONDS is a stall; the state of apt's processes and sockets is
# printed (ps, wchan, ss) before it is killed. -o passes an option to apt-get (e.g.
# -o Acquire::http::Pipeline-Depth=5 to force pipelining on); -p updates through
# python-apt, as Ansible's apt module does. -f runs apt_stuck_queue.py instead: apt-get
# against a fake mirror on the container's loopback that answers one 503 (the stall of
# tests/testbed/README.md; the image's apt config plus the -o options). Exit 1 if any run
# stalled or failed. Needs the test bed (tests/testbed/setup.sh).
set -uo pipefail
N=8 ROUNDS=4 STALL=120 MODE=apt-get
OPTS=()
while getopts "n:r:t:o:pf" opt; do
  case $opt in
    n) N=$OPTARG ;;
    r) ROUNDS=$OPTARG ;;
    t) STALL=$OPTARG ;;
    o) OPTS+=(-o "$OPTARG") ;;
    p) MODE=python ;;
    f) MODE=fake ;;
    *) exit 2 ;;
  esac
done
IMAGE=localhost/provision-base:bookworm
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PREFIX=aptstress-$$
work=$(mktemp -d)
cleanup() {
  for i in $(seq 1 "$N"); do podman rm -f -t 0 "$PREFIX-$i" >/dev/null 2>&1; done
  rm -rf "$work"
}
trap cleanup EXIT

# one round inside a container: prints "ROUND rc seconds"; on a stall, the evidence
round_script='
set -u
r=$1; shift
stall=$1; shift
mode=$1; shift
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
start=$(date +%s.%N)
if [ "$mode" = fake ]; then
  # the -o options as an apt.conf snippet, read after the config of the image
  printf "%s\n" "$@" | grep -v "^-o$" | sed "s/^\([^=]*\)=\(.*\)$/\1 \"\2\";/" >/root/stress.conf
  timeout $((stall + 30)) python3 /root/apt_stuck_queue.py --conf /etc/apt/apt.conf.d/01testbed-proxy \
    --conf /root/stress.conf --bound "$stall" >/root/update.$r.log 2>&1
  rc=$?
  end=$(date +%s.%N)
  if [ $rc -eq 3 ]; then head -n 6 /root/update.$r.log; echo "ROUND $r 124 $stall"; exit 0; fi
  [ $rc -eq 0 ] || tail -n 5 /root/update.$r.log
  echo "ROUND $r $rc $(awk "BEGIN{print $end-$start}")"
  exit 0
elif [ "$mode" = python ]; then
  # what the apt module does: python-apt acquire in the calling process
  python3 -c "import apt, apt_pkg, sys
for a in sys.argv[1:]:
    k, v = a.split(\"=\", 1); apt_pkg.config.set(k, v)
apt.Cache().update(raise_on_error=True)" $(printf "%s\n" "$@" | grep -v "^-o$") >/root/update.$r.log 2>&1 &
else
  apt-get -q "$@" update >/root/update.$r.log 2>&1 &
fi
pid=$!
deadline=$(( $(date +%s) + stall ))
while kill -0 $pid 2>/dev/null && (( $(date +%s) < deadline )); do sleep 0.5; done
if kill -0 $pid 2>/dev/null; then
  echo "STALL round $r after ${stall}s: apt processes and sockets"
  ps -eo pid,ppid,stat,wchan:20,etime,args | grep -E "apt|gpgv|methods" | grep -v grep
  ss -tanp 2>/dev/null | grep -v LISTEN
  tail -n 5 /root/update.$r.log
  pkill -KILL -f /usr/lib/apt/methods/ ; kill -KILL $pid
  wait $pid 2>/dev/null
  echo "ROUND $r 124 $stall"
  exit 0
fi
wait $pid; rc=$?
end=$(date +%s.%N)
[ $rc -eq 0 ] || tail -n 5 /root/update.$r.log
echo "ROUND $r $rc $(echo "$end - $start" | bc 2>/dev/null || awk "BEGIN{print $end-$start}")"
'

for i in $(seq 1 "$N"); do
  podman run -d --name "$PREFIX-$i" --systemd=always \
    -v "$HERE/apt_stuck_queue.py:/root/apt_stuck_queue.py:ro" "$IMAGE" /sbin/init >/dev/null
done
for i in $(seq 1 "$N"); do  # booted: nothing mounts over what a round writes
  podman exec "$PREFIX-$i" timeout 90 systemctl is-system-running --wait >/dev/null 2>&1 || true
done
echo "apt-stress: $N containers x $ROUNDS rounds ($MODE), stall bound ${STALL}s, options: ${OPTS[*]:-none}"
t0=$SECONDS
for i in $(seq 1 "$N"); do
  (
    for r in $(seq 1 "$ROUNDS"); do
      podman exec "$PREFIX-$i" bash -c "$round_script" round "$r" "$STALL" "$MODE" "${OPTS[@]}"
    done >"$work/$i.out" 2>&1
  ) &
done
wait
stalls=0 failures=0 runs=0
for i in $(seq 1 "$N"); do
  while read -r _ r rc secs; do
    runs=$((runs + 1))
    if [[ $rc == 124 ]]; then stalls=$((stalls + 1)); elif [[ $rc != 0 ]]; then failures=$((failures + 1)); fi
    printf 'container %2d round %s: rc %s, %ss\n' "$i" "$r" "$rc" "$secs"
  done < <(grep '^ROUND' "$work/$i.out")
  grep -v '^ROUND' "$work/$i.out" | sed "s/^/  [$i] /"
done
echo "apt-stress: $runs runs, $stalls stalled, $failures failed, $((SECONDS - t0))s"
((stalls == 0 && failures == 0 && runs == N * ROUNDS))
