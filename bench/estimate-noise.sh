#!/usr/bin/env bash
# How often `reseq estimate` calls noise "worth it", and how often it finds real slowness.
#
#   bench/estimate-noise.sh [RUNS] [BUSY]
#
# 1. False alarms: a disk-backed loop device (direct I/O, no FTL: nothing on it can get
#    faster) with ext4 and files, under BUSY CPU busy loops (default 2). RUNS times each
#    (default 20): `estimate DEV`, `estimate DIR`, `estimate FILE`; then one
#    `rewrite DEV --only-slow` whose bytes written are read off the device's counters.
# 2. Hits: an emulated consumer NVMe (`reseq sim serve`), a file degraded all over by
#    random 4 KiB fsync'd overwrites and one degraded in its first half; RUNS/4 times
#    (at least 3) `estimate FILE` of each, on a quiet host.
# Prints each call's first word and the counts: a false alarm is "worth it" in part 1, a
# hit is "worth it" in part 2.
source "$(dirname "$0")/common.sh"
need_root
RUNS=${1:-20}
BUSY=${2:-2}
reseq=$(reseq_bin)

call() { "$reseq" estimate "$1" --json 2>/dev/null | python3 -c '
import json, sys
r = json.load(sys.stdin)
e = r.get("estimate") or r.get("estimate_files")
print(e["advice"].split(":")[0], round(e["predicted_speedup"], 2), round(e.get("sureness", {}).get("spread", 0), 2))'; }

tally() { sort | uniq -c | sed 's/^/    /'; }

false_alarms() {
  make_device 512
  mkfs.ext4 -q -F "$DEV"
  mkdir "$WORK/mnt"
  mount "$DEV" "$WORK/mnt"
  # Each step may fail (no busy loop left, already unmounted): none may skip the rest.
  trap 'kill $(jobs -p) 2>/dev/null || true; umount "$WORK/mnt" 2>/dev/null || true; losetup -d "$DEV" 2>/dev/null || true; rm -rf "$WORK"' EXIT
  for i in $(seq 8); do head -c 32M /dev/urandom >"$WORK/mnt/f$i"; done
  sync
  for _ in $(seq "$BUSY"); do (while :; do :; done) & done
  echo "part 1: plain loop device (no FTL), $BUSY busy loops, $RUNS runs each"
  for what in "$DEV" "$WORK/mnt" "$WORK/mnt/f3"; do
    echo "  estimate $what:"
    for _ in $(seq "$RUNS"); do call "$what"; done | tee "$WORK/calls" | awk '{print "      " $0}'
    awk '{print $1}' "$WORK/calls" | tally
    echo "    false alarms: $(grep -c '^worth' "$WORK/calls" || true) of $RUNS"
  done
  local used written0 written1
  used=$(df -B1 --output=used "$WORK/mnt" | tail -1)
  written0=$(awk '{print $7}' "/sys/block/$(basename "$DEV")/stat")
  "$reseq" rewrite "$DEV" --only-slow --quiet --json >"$WORK/only-slow.json" 2>/dev/null || true
  written1=$(awk '{print $7}' "/sys/block/$(basename "$DEV")/stat")
  echo "  rewrite --only-slow: $(( (written1 - written0) * 512 )) bytes written of $used in use ($(echo "scale=1; ($written1 - $written0) * 51200 / $used" | bc) %)"
  kill $(jobs -p) 2>/dev/null || true
  umount "$WORK/mnt"
}

hits() {
  local runs=$(( RUNS / 4 < 3 ? 3 : RUNS / 4 ))
  serve_drive estimate-hits consumer-nvme 2G 6
  head -c 512M /dev/urandom >"$dir/mnt/all.db"
  head -c 256M /dev/urandom >"$dir/mnt/part.db"
  head -c 256M /dev/urandom >"$dir/mnt/fresh.bin"
  sync
  python3 - "$dir/mnt/all.db" "$dir/mnt/part.db" <<'EOF'
import os, random, sys
def degrade(path, pages_from, pages_to, count):
    fd = os.open(path, os.O_WRONLY)
    rng = random.Random(3)
    for i in range(count):
        os.pwrite(fd, os.urandom(4096), rng.randrange(pages_from, pages_to) * 4096)
        if i % 256 == 255:
            os.fdatasync(fd)
    os.fsync(fd)
    os.close(fd)
degrade(sys.argv[1], 0, 512 * 256, 64 * 1024)   # 256 MiB of 4 KiB writes all over
degrade(sys.argv[2], 0, 128 * 256, 32 * 1024)   # 128 MiB into the first half
EOF
  echo "part 2: emulated consumer NVMe, $runs runs each"
  for what in "$dir/mnt/all.db" "$dir/mnt/part.db" "$dir/mnt/fresh.bin"; do
    echo "  estimate $what:"
    for _ in $(seq "$runs"); do call "$what"; done | tee "$dir/calls" | awk '{print "      " $0}'
    echo "    worth it: $(grep -c '^worth' "$dir/calls" || true) of $runs"
  done
}

[ "${PART:-all}" != hits ] && (false_alarms)
[ "${PART:-all}" != noise ] && (hits)
exit 0
