#!/usr/bin/env bash
# File mode under a live writer: for window budgets of 0.25, 0.5, 1 and 2 s, re-sequence
# a 1 GiB file on ext4 while a writer overwrites random 4 KiB records of it, timing each
# write. Prints the run's wall time, the writer's stall histogram, and the longest stall
# against the budget (goal: within budget + 10 %).
#   sudo bench/file-windows.sh [FILE_MIB]     (RESEQ=binary, RESEQ_ARGS="--read-ahead 16")
source "$(dirname "$0")/common.sh"
need_root
FILE_MIB=${1:-1024}
RESEQ=$(reseq_bin)
make_device $(( FILE_MIB * 2 ))
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$DEV"
mkdir -p "$WORK/mnt"; mount "$DEV" "$WORK/mnt"
# (set -e applies inside traps too: every step must be allowed to fail.)
trap 'fsfreeze -u "$WORK/mnt" 2>/dev/null || true; umount "$WORK/mnt" 2>/dev/null || true; losetup -d "$DEV" 2>/dev/null || true; rm -rf "$WORK"' EXIT
F="$WORK/mnt/table.db"
dd if=/dev/urandom of="$F" bs=1M count="$FILE_MIB" status=none; sync
cat > "$WORK/writer.py" <<'PY'
import os, random, sys, time
path, stop, out = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(path, os.O_WRONLY)
size = os.fstat(fd).st_size // 4096
rec, lat = os.urandom(4096), []
while not os.path.exists(stop):
    t = time.perf_counter()
    os.pwrite(fd, rec, random.randrange(size) * 4096)
    lat.append(time.perf_counter() - t)
    time.sleep(0.001)
open(out, "w").write("\n".join(f"{x:.6f}" for x in lat))
PY
printf '%-8s %8s %8s %10s %10s  %s\n' budget wall_s writes longest_s "vs budget" "histogram (<1ms <10ms <100ms <budget >=budget)"
for b in 0.25 0.5 1 2; do
  rm -f "$WORK/stop"
  python3 "$WORK/writer.py" "$F" "$WORK/stop" "$WORK/lat" & wp=$!
  sleep 0.5
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086 # RESEQ_ARGS: more options, word-split on purpose
  "$RESEQ" -q rewrite "$F" --max-freeze "${b}s" --pause 0.2s --state-dir "$WORK/state" ${RESEQ_ARGS:-} >/dev/null
  t1=$(date +%s.%N)
  touch "$WORK/stop"; wait $wp
  python3 - "$WORK/lat" "$b" "$(echo "$t1 - $t0" | bc -l)" <<'PY'
import sys
lat = [float(x) for x in open(sys.argv[1]).read().split()]
b, wall = float(sys.argv[2]), float(sys.argv[3])
edges = [0.001, 0.01, 0.1, b]
hist = [sum(1 for x in lat if (i == 0 or x >= edges[i-1]) and x < e) for i, e in enumerate(edges)] + [sum(1 for x in lat if x >= b)]
m = max(lat)
print(f"{b:<8} {wall:8.1f} {len(lat):8d} {m:10.3f} {m / b * 100:9.0f}%  {hist}")
PY
done
