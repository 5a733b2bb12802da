#!/usr/bin/env bash
# Issue #43's multi-host benchmark, on one machine: two "hosts" are network namespaces joined
# by a veth pair (10.77.0.1, 10.77.0.2), each with its own hostname (so no shared memory
# between them), as tests/test_multihost.cpp makes them. Needs root and `ip netns`.
#   1. The demo (configs/kjv-tiny.toml: tp=2 x dp=2 with SP) on one host (4 ranks: loopback and
#      shared memory) and on two hosts (2 ranks each: tp inside a host, dp across the link),
#      ROUNDS rounds alternating; tokens/s = the median of rank 0's logged steps 20..STEPS.
#   2. `meshtrain bench comm --mesh tp=2 --axis each` on both layouts (every group alone).
#   3. The cost of a restart: a run with --max-restarts 1 and comm.timeout = 10 whose link is cut
#      after step 20 and restored 11 s later; seconds from the cut to the first step logged after
#      the resume (the timeout is most of it, by design).
# Writes docs/bench-multihost.md.
# Usage: bench/multihost.sh [BUILD_DIR] [ROUNDS] [STEPS]
set -euo pipefail
source "$(dirname "$0")/header.sh"
BUILD=${1:-build}
ROUNDS=${2:-3}
STEPS=${3:-80}
OUT=docs/bench-multihost.md
BIN=$(realpath "$BUILD/meshtrain")
WORK=$(mktemp -d)
NS=(mtbench0 mtbench1)
DEV=(mtbv0 mtbv1)
ADDR=(10.77.0.1 10.77.0.2)
TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d " \n")  # the job token both hosts share (runtime/job_token.h)
cleanup() { ip netns del "${NS[0]}" 2>/dev/null || true; ip netns del "${NS[1]}" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
cleanup
mkdir -p "$WORK"
ip netns add "${NS[0]}"
ip netns add "${NS[1]}"
ip link add "${DEV[0]}" type veth peer name "${DEV[1]}"
for h in 0 1; do
  ip link set "${DEV[$h]}" netns "${NS[$h]}"
  ip -n "${NS[$h]}" addr add "${ADDR[$h]}/24" dev "${DEV[$h]}"
  ip -n "${NS[$h]}" link set "${DEV[$h]}" up
  ip -n "${NS[$h]}" link set lo up
done
[ -f data/kjv/train.bin ] || make -s data/kjv/train.bin BUILD="$BUILD" >/dev/null
# The demo's config with absolute data paths, no validation, no metrics file and no checkpoints
# (the restart's run sets its own): every argument below is then free of quotes.
sed -e "s|^train = .*|train = \"$(realpath data/kjv/train.bin)\"|" -e '/^val = /d' -e 's|^metrics = .*|metrics = ""|' \
    -e '/^\[checkpoint\]/,$d' configs/kjv-tiny.toml > "$WORK/demo.toml"
CFG="$WORK/demo.toml"

# on_host H PORT ARGS...: `meshtrain launch` of 2 ranks on host H of 2 running `meshtrain ARGS`.
on_host() {
  local h=$1 port=$2
  shift 2
  ip netns exec "${NS[$h]}" unshare -u sh -c "hostname node$h && MESHTRAIN_JOB_TOKEN=$TOKEN GLOO_SOCKET_IFNAME=${DEV[$h]} exec $BIN launch \
    --nnodes 2 --node-rank $h --nproc-per-node 2 --master-addr ${ADDR[0]} --master-port $port --grace 2 $BIN $*"
}
# two_hosts PORT ARGS...: both hosts, rank 0's output on stdout.
two_hosts() {
  local port=$1
  shift
  on_host 1 "$port" "$@" > "$WORK/host1.log" 2>&1 &
  on_host 0 "$port" "$@"
  wait
}
tokens_per_s() {  # median tokens/s of rank 0's steps >= 20 in a log on stdin
  sed -nE 's/^\[rank 0\] step +([0-9]+) \| loss.*\| ([0-9]+) tokens\/s.*/\1 \2/p' | awk '$1 >= 20 {print $2}' |
    sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
train_args="train $CFG --set train.steps=$STEPS --set train.log_every=1"
one=() two=()
for ((r = 0; r < ROUNDS; r++)); do
  for side in $( ((r % 2)) && echo "two one" || echo "one two"); do
    if [ "$side" = one ]; then
      one+=("$("$BIN" $train_args --nproc 4 2>&1 | tokens_per_s)")
    else
      two+=("$(two_hosts $((29700 + r)) "$train_args" 2>&1 | tokens_per_s)")
    fi
  done
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
one_med=$(median "${one[@]}")
two_med=$(median "${two[@]}")

comm_args="bench comm --mesh tp=2 --axis each --ops all_reduce --min 1K --max 16M --iters 5"
"$BIN" $comm_args --nproc 4 > "$WORK/comm_one.txt" 2>&1
two_hosts 29720 "$comm_args" > "$WORK/comm_two.txt" 2>&1

# The restart: cut after step 20, link back 11 s later, --max-restarts 1, resume from step 20's checkpoint.
metrics="$WORK/restart.metrics"
sed -e "s|^metrics = .*|metrics = \"$metrics\"|" "$CFG" > "$WORK/restart.toml"
printf '[checkpoint]\ndir = "%s"\nevery = 20\n' "$WORK/restart_ck" >> "$WORK/restart.toml"
restart_args="train $WORK/restart.toml --set train.steps=$STEPS --set train.log_every=1 --set comm.timeout=10"
on_restart() {
  ip netns exec "${NS[$1]}" unshare -u sh -c "hostname node$1 && MESHTRAIN_JOB_TOKEN=$TOKEN GLOO_SOCKET_IFNAME=${DEV[$1]} exec $BIN launch \
    --nnodes 2 --node-rank $1 --nproc-per-node 2 --master-addr ${ADDR[0]} --master-port 29730 --grace 2 \
    --max-restarts 1 $BIN $restart_args" > "$WORK/restart$1.log" 2>&1
}
on_restart 1 &
on_restart 0 &
while [ "$( (wc -l < "$metrics") 2>/dev/null || echo 0)" -lt 22 ]; do sleep 0.05; done
cut_at=$(date +%s.%N)
ip -n "${NS[0]}" link set "${DEV[0]}" down
sleep 11
ip -n "${NS[0]}" link set "${DEV[0]}" up
# The restart first (a step already on the wire at the cut may still be logged), then its first step.
for ((i = 0; i < 1200; i++)); do grep -q "restarting all local ranks" "$WORK/restart0.log" && break; sleep 0.05; done
grep -q "restarting all local ranks" "$WORK/restart0.log" || { echo "multihost.sh: no restart happened"; exit 1; }
restarted_lines=$(wc -l < "$metrics")
for ((i = 0; i < 1200; i++)); do [ "$(wc -l < "$metrics")" -gt "$restarted_lines" ] && break; sleep 0.05; done
resumed_at=$(date +%s.%N)
wait
restart_s=$(echo "$resumed_at - $cut_at" | bc)
[ "$(wc -l < "$metrics")" -gt "$restarted_lines" ] || { echo "multihost.sh: the job did not resume"; exit 1; }

{
  echo "# Two hosts in network namespaces against one host: the demo, per-axis bandwidth, a restart"
  echo
  echo "Generated by \`bench/multihost.sh $*\` on $(date -u +%Y-%m-%d):"
  machine
  echo
  echo "Two \"hosts\" are network namespaces on this machine joined by a veth pair, each with its own hostname,"
  echo "so their ranks share no memory and every byte between them crosses the link (TCP through the kernel; no"
  echo "real NIC, so this measures meshtrain's and Gloo's behaviour across hosts, not a network)."
  echo
  echo "## The demo: tokens/s"
  echo
  echo "\`configs/kjv-tiny.toml\` (tp=2 x dp=2, SP), $STEPS steps, the median of rank 0's steps 20..$STEPS; $ROUNDS rounds,"
  echo "order alternating."
  echo
  echo "| layout | tokens/s (median over rounds) | rounds |"
  echo "|---|---|---|"
  echo "| one host, 4 ranks (shared memory) | $one_med | ${one[*]} |"
  echo "| two hosts x 2 ranks (dp across the link) | $two_med | ${two[*]} |"
  echo
  echo "Two hosts / one host: $(printf '%.3f' "$(echo "scale=4; $two_med / $one_med" | bc)")."
  echo
  echo "## Every axis alone: \`meshtrain $comm_args\`"
  echo
  echo "One host (\`--nproc 4\`):"
  echo
  echo '```'
  sed -n 's/^\[rank 0\] //p' "$WORK/comm_one.txt" | grep -v '^transport variables'
  echo '```'
  echo
  echo "Two hosts (\`meshtrain launch --nnodes 2\` in each namespace):"
  echo
  echo '```'
  sed -n 's/^\[rank 0\] //p' "$WORK/comm_two.txt" | grep -v '^transport variables' | grep -v 'socket.cpp.*hostname of the client'
  echo '```'
  echo
  echo "## A restart after a link cut"
  echo
  echo "The demo on two hosts with \`--max-restarts 1\`, \`comm.timeout = 10\`, a checkpoint every 20 steps; the link"
  echo "is cut after step 20 and restored 11 s later. From the cut to the first step logged after the resume:"
  echo "$(printf '%.1f' "$restart_s") s (the 10 s timeout, the restart, the rendezvous and the checkpoint load)."
  quotes_heading
  quote two_hosts_vs_one "$(printf '%.2f' "$(echo "scale=4; $two_med / $one_med" | bc)")x" "the demo's tokens/s on two hosts x 2 ranks / one host x 4"
  quote restart_after_cut_s "$(printf '%.1f' "$restart_s")" "seconds from a link cut to the first step after the resume (comm.timeout 10)"
} > "$OUT.tmp"
seal "$OUT"
