#!/usr/bin/env bash
# `reseq bench` against fio (--rw=read --direct=1 --bs=1M --ioengine=libaio) on one loop
# device (--direct-io=on), alternating, at queue depth 1 and 4. Prints the medians and the
# ratio reseq/fio (goal: within +-5 % at both depths).
#   sudo bench/bench-vs-fio.sh [ROUNDS] [SIZE_MIB]      (BENCH_DIR=/dev/shm: image in memory)
source "$(dirname "$0")/common.sh"
need_root
command -v fio >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null \
  || { echo "needs fio (apt-get install fio)" >&2; exit 2; }
ROUNDS=${1:-5}
SIZE=${2:-1024}
RESEQ=$(reseq_bin)
make_device "$SIZE"
echo "device $DEV over $SIZE MiB, $ROUNDS rounds, $(fio --version)"
rate_reseq() { "$RESEQ" -q bench "$DEV" --passes 1 --block-size 1M --queue-depth "$1" --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["bench"]["median_bytes_per_second"])'; }
rate_fio() { fio --name=seq --filename="$DEV" --rw=read --direct=1 --bs=1M --ioengine=libaio \
  --iodepth="$1" --size="${SIZE}M" --output-format=json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"])'; }
for qd in 1 4; do
  : > "$WORK/r$qd"; : > "$WORK/f$qd"
  for i in $(seq 1 "$ROUNDS"); do
    # Alternate who goes first, so neither profits from caches the other warmed.
    if [ $((i % 2)) = 1 ]; then
      rate_reseq "$qd" >> "$WORK/r$qd"; rate_fio "$qd" >> "$WORK/f$qd"
    else
      rate_fio "$qd" >> "$WORK/f$qd"; rate_reseq "$qd" >> "$WORK/r$qd"
    fi
  done
  r=$(median < "$WORK/r$qd"); f=$(median < "$WORK/f$qd")
  printf 'QD%d: reseq bench %.0f MiB/s, fio %.0f MiB/s, ratio %.3f\n' "$qd" \
    "$(echo "$r / 1048576" | bc -l)" "$(echo "$f / 1048576" | bc -l)" "$(echo "$r / $f" | bc -l)"
done
