#!/usr/bin/env bash
# How throughput depends on --chunk-size: the measurement behind the default.
# Runs `reseq rewrite` (verify on) on one loop device with each size, ROUNDS times,
# interleaved, and prints the median MiB/s per size.
#   sudo bench/chunk-size.sh [ROUNDS] [SIZE_MIB]
source "$(dirname "$0")/common.sh"
need_root
ROUNDS=${1:-3}
SIZE=${2:-1024}
RESEQ=$(reseq_bin)
make_device "$SIZE"
SIZES="1M 2M 4M 8M 16M 32M 64M"
for i in $(seq 1 "$ROUNDS"); do
  for c in $SIZES; do
    t=$(seconds "$RESEQ" -q rewrite "$DEV" --state-dir "$WORK/state" --chunk-size "$c")
    echo "$SIZE / $t" | bc -l >> "$WORK/$c"
  done
done
echo "device $DEV over $SIZE MiB, $ROUNDS rounds, verify on"
for c in $SIZES; do printf 'chunk %4s: %6.0f MiB/s\n' "$c" "$(median < "$WORK/$c")"; done
