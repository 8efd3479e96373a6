#!/usr/bin/env bash
# The chunk-size trial (issue 40) against the build before it, side by side in one run,
# ROUNDS rounds, alternating (the order swapped each round), on one device, verified and
# --no-verify: each run's wall time, the medians and their ratio, and what the trial
# measured and kept. The device is flushed and rests a second before each run.
#   sudo BEFORE=/path/to/old/reseq bench/chunk-trial.sh [ROUNDS] [SIZE_MIB] [disk|mem]
#     SIZE_MIB: 16384 by default (the trial's floor: smaller runs have none)
#     disk: image on /var/tmp (disk-backed), mem: on /dev/shm, sim: the emulated SSD
#     (consumer-nvme at time scale 10; 16 GiB takes minutes a pass)
source "$(dirname "$0")/common.sh"
need_root
ROUNDS=${1:-2}
SIZE=${2:-16384}
KIND=${3:-disk}
RESEQ=$(reseq_bin)
: "${BEFORE:?set BEFORE to the build to compare with}"
kind_device "$KIND" "$SIZE" trial
echo "$KIND: $DEV, $SIZE MiB, $ROUNDS rounds, this build: $RESEQ, before: $BEFORE"
one() {
  local name=$1 bin=$2; shift 2
  python3 -c 'import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDONLY))' "$DEV"; sleep 1
  rm -rf "$WORK/state"
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" -q rewrite "$DEV" --state-dir "$WORK/state" --json "$@" >"$WORK/last.json" 2>"$WORK/last.err" || { cat "$WORK/last.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l >>"$WORK/t_$name"
  printf '  %-8s %6.2f s, %s\n' "$name" "$(tail -1 "$WORK/t_$name")" "$(chose "$WORK/last.json")"
}
for i in $(seq 1 "$ROUNDS"); do
  echo "round $i:"
  if (( i % 2 )); then order="before this"; else order="this before"; fi
  for who in $order; do
    bin=$RESEQ; [ "$who" = before ] && bin=$BEFORE
    one "v-$who" "$bin"
    one "n-$who" "$bin" --no-verify
  done
done
m() { median <"$WORK/t_$1"; }
for v in v n; do
  printf '%s: this build %.2f s, before %.2f s: before / this = %.2f\n' \
    "$([ $v = v ] && echo verified || echo --no-verify)" "$(m "$v-this")" "$(m "$v-before")" \
    "$(echo "$(m "$v-before") / $(m "$v-this")" | bc -l)"
done
