#!/usr/bin/env bash
# File mode on a tree of many small files: how many freezes, how long frozen, against
# device mode rewriting the same filesystem. A tree of N files of 40 KiB plus one 256 MiB
# file on ext4; alternating file mode (`reseq rewrite DIR`) and device mode (`reseq
# rewrite DEV`, used space only) ROUNDS times. Prints the medians and the ratios the
# performance goals name:
#   windows <= 1.2 x bytes / (budget x device-mode rate) + 1
#   file-mode frozen time <= 1.2 x device-mode rewrite time
#   file-mode wall time   <= 1.5 x device-mode rewrite time
#   sudo bench/file-batching.sh [N_FILES] [ROUNDS] [BUDGET]
source "$(dirname "$0")/common.sh"
need_root
N=${1:-2000}
ROUNDS=${2:-3}
BUDGET=${3:-500ms}
RESEQ=$(reseq_bin)
# Room for the tree (40 KiB files take 44 KiB with their metadata), the big file, slack.
make_device $(( (N * 44 / 1024 + 256) * 3 / 2 + 256 ))
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$DEV"
mkdir -p "$WORK/mnt"; mount "$DEV" "$WORK/mnt"
trap 'fsfreeze -u "$WORK/mnt" 2>/dev/null || true; umount "$WORK/mnt" 2>/dev/null || true; losetup -d "$DEV" 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/mnt/tree"
python3 - "$WORK/mnt/tree" "$N" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    with open(f"{d}/f{i:05d}", "wb") as f:
        f.write(os.urandom(40960))
with open(f"{d}/big", "wb") as f:
    for _ in range(256):
        f.write(os.urandom(1 << 20))
PY
sync
echo "$N files of 40 KiB + 256 MiB on ext4 ($DEV), budget $BUDGET, $ROUNDS rounds, state dir off the filesystem"
field() { python3 -c "import json,sys; r=json.load(sys.stdin); print($1)"; }
: > "$WORK/file"; : > "$WORK/dev"
# --pause 0s: file mode's default 1 s pause between windows is for a live server; here
# both modes run back to back, so the wall times compare the work, not the courtesy.
run_file() {
  "$RESEQ" -q rewrite "$WORK/mnt/tree" --json --max-freeze "$BUDGET" --max-overruns 1000 --pause 0s --state-dir "$WORK/state" \
    | field 'r["results"]["windows"], r["results"]["total_frozen_seconds"], r["duration_seconds"], r["results"]["bytes_written"], r["results"]["longest_freeze_seconds"], r["results"]["windows_overrun"]' >> "$WORK/file"
}
run_dev() {
  "$RESEQ" -q rewrite "$DEV" --json --restart --no-trim --max-freeze "$BUDGET" --max-overruns 1000 --state-dir "$WORK/state" \
    | field 'r["results"]["windows"], r["results"]["total_frozen_seconds"], r["duration_seconds"], r["results"]["bytes_written"], r["results"]["windows_overrun"]' >> "$WORK/dev"
}
for i in $(seq 1 "$ROUNDS"); do
  if [ $((i % 2)) = 1 ]; then run_file; run_dev; else run_dev; run_file; fi
done
python3 - "$WORK/file" "$WORK/dev" "$BUDGET" <<'PY'
import statistics as st, sys, re
rows = lambda p: [tuple(float(x) for x in re.findall(r"[\d.e+-]+", l)) for l in open(p) if l.strip()]
f, d = rows(sys.argv[1]), rows(sys.argv[2])
med = lambda rs, i: st.median(r[i] for r in rs)
b = sys.argv[3]
budget = float(b[:-2]) / 1000 if b.endswith("ms") else float(b.rstrip("s"))
fw, ff, fwall, fbytes, flong = (med(f, i) for i in range(5))
dw, dfrozen, dwall, dbytes = (med(d, i) for i in range(4))
fover, dover = sum(r[5] for r in f), sum(r[4] for r in d)
rate = dbytes / dwall
bound = fbytes / (budget * rate) + 1
print(f"file mode:   {fw:.0f} windows, {ff:.2f} s frozen, {fwall:.2f} s wall, {fbytes/2**20:.0f} MiB, longest freeze {flong:.3f} s")
print(f"device mode: {dw:.0f} windows, {dfrozen:.2f} s frozen, {dwall:.2f} s wall, {dbytes/2**20:.0f} MiB ({rate/2**20:.0f} MiB/s)")
dbound = dbytes / (budget * rate) + 1
print(f"windows / (bytes / (budget x rate) + 1) = {fw:.0f} / {bound:.1f} = {fw / bound:.2f}  (goal <= 1.2)")
# A window keeps a reserve for its last chunk, that chunk's read-back and the thaw (twice
# what they were measured to take, and a tenth of the budget), and its freeze is part of
# it, so no mode reaches the formula's ideal; device mode on the same filesystem is the
# reference for what windows allow.
print(f"  device mode on the same formula: {dw:.0f} / {dbound:.1f} = {dw / dbound:.2f}; file / device windows = {fw / dw:.2f}")
print(f"overruns in all rounds: file mode {fover:.0f}, device mode {dover:.0f}")
print(f"file frozen / device wall = {ff / dwall:.2f}  (goal <= 1.2)")
print(f"file wall / device wall   = {fwall / dwall:.2f}  (goal <= 1.5)")
print(f"longest freeze / budget   = {flong / budget:.2f}  (goal <= 1.1)")
PY
