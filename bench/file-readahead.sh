#!/usr/bin/env bash
# File mode with short windows: how much is read for what is written (issue 37, item 4).
# N files of SIZE_MIB on ext4, `reseq rewrite DIR --max-freeze BUDGET --pause 0s`, ROUNDS
# times; the loop device's own counters (/sys/block/loopN/stat, sectors read and written)
# taken around each run, next to the report's figures. Prints per run: the device's reads
# less the read-backs (the report's bytes_verified) over its writes, the report's
# bytes_read / bytes_written, the bytes read ahead and dropped, windows, longest freeze.
# Goal: reads (read-backs apart) <= 1.15 x writes.
#   sudo bench/file-readahead.sh [N] [SIZE_MIB] [BUDGET] [ROUNDS]
source "$(dirname "$0")/common.sh"
need_root
N=${1:-60}
SIZE_MIB=${2:-5}
BUDGET=${3:-100ms}
ROUNDS=${4:-3}
RESEQ=$(reseq_bin)
make_device $(( N * SIZE_MIB * 2 + 128 ))
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$DEV"
mkdir -p "$WORK/mnt"; mount "$DEV" "$WORK/mnt"
trap 'fsfreeze -u "$WORK/mnt" 2>/dev/null || true; umount "$WORK/mnt" 2>/dev/null || true; losetup -d "$DEV" 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/mnt/tree"
for i in $(seq 1 "$N"); do
  dd if=/dev/urandom of="$WORK/mnt/tree/f$i" bs=1M count="$SIZE_MIB" status=none
done
sync
STAT=/sys/block/$(basename "$DEV")/stat
echo "$N files of $SIZE_MIB MiB on ext4 ($DEV), --max-freeze $BUDGET, $ROUNDS rounds"
printf '%-5s %22s %22s %14s %8s %12s\n' round "device (read-verify)/w" "report read/written" "dropped MiB" windows "longest ms"
for r in $(seq 1 "$ROUNDS"); do
  echo 3 > /proc/sys/vm/drop_caches
  read -r -a before < "$STAT"
  "$RESEQ" -q rewrite "$WORK/mnt/tree" --json --max-freeze "$BUDGET" --max-overruns 1000 --pause 0s \
    --state-dir "$WORK/state" > "$WORK/r.json"
  read -r -a after < "$STAT"
  python3 - "$WORK/r.json" "$r" $(( (after[2] - before[2]) * 512 )) $(( (after[6] - before[6]) * 512 )) <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
rnd, rd, wr = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dev = (rd - r["bytes_verified"]) / wr
rep = r["bytes_read"] / r["bytes_written"]
print(f"{rnd:<5} {dev:22.3f} {rep:22.3f} {r['bytes_read_ahead_dropped'] / 2**20:14.1f} {r['windows']:8d} {r['longest_freeze_seconds'] * 1000:12.1f}")
PY
done
