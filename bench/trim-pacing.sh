#!/usr/bin/env bash
# The FITRIM after a used-space rewrite, in slices, under each pace: for the default pace
# (idle 4x each slice), --trim-rate and --pause, fill an ext4 on a loop device, delete
# most of it, remount (ext4 forgets what it trimmed), and run `reseq rewrite --bench`.
# Prints the slices' pacing (count, wall and busy time, slowest slice, mean gap between
# slice starts, rate) and the read probe's latency during the trim against just before it
# (p50/p99, 4 KiB O_DIRECT reads of data in use), all from one run each; then
# `reseq bench --trim-impact` on the same filesystem.
#   sudo bench/trim-pacing.sh [DEVICE_MIB] [TRIM_RATE]
source "$(dirname "$0")/common.sh"
need_root
MIB=${1:-2048}
RATE=${2:-512M}
RESEQ=$(reseq_bin)
make_device "$MIB"
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$DEV"
mkdir -p "$WORK/mnt"
# (set -e applies inside traps too: every step must be allowed to fail.)
trap 'umount "$WORK/mnt" 2>/dev/null || true; losetup -d "$DEV" 2>/dev/null || true; rm -rf "$WORK"' EXIT
printf '%-22s %6s %8s %7s %9s %8s %11s  %-21s %-21s %s\n' pace slices trimmed wall_s busy_s slowest mean_gap_s "before p50/p99 ms" "during p50/p99 ms" "p99 x"
for pace in "" "--trim-rate $RATE" "--pause 0.2s"; do
  mount "$DEV" "$WORK/mnt"
  # 60 % in files, then all but the first deleted: free space to trim, still allocated
  # in the image (no -o discard).
  n=$(( MIB * 6 / 10 / 64 ))
  for i in $(seq 1 "$n"); do dd if=/dev/urandom of="$WORK/mnt/f$i" bs=1M count=64 status=none; done
  sync; rm -f "$WORK/mnt"/f[2-9]* ; sync
  umount "$WORK/mnt"; mount "$DEV" "$WORK/mnt"
  # shellcheck disable=SC2086
  "$RESEQ" -q rewrite "$DEV" --json --bench --bench-passes 1 --state-dir "$WORK/state" $pace > "$WORK/r.json" || true
  python3 - "$WORK/r.json" "${pace:-default (idle 4x)}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = (r.get("space") or {}).get("trim")
if not t:
    print(f"{sys.argv[2]:<22} no trim ran: {r['outcome']}"); sys.exit()
s = [x for f in t["filesystems"] for x in f["slices"]]
gaps = [b["at_seconds"] - a["at_seconds"] for a, b in zip(s, s[1:])]
p = t.get("probe") or {}
ms = lambda v: "-" if v is None else f"{v * 1e3:.2f}"
side = lambda k: f"{ms((p.get(k) or {}).get('p50_seconds'))}/{ms((p.get(k) or {}).get('p99_seconds'))} ({(p.get(k) or {}).get('reads', 0)})"
print(f"{sys.argv[2]:<22} {t['slices']:6d} {t['bytes_trimmed'] / 2**20:7.0f}M {t['seconds']:7.2f} {t['busy_seconds']:9.3f} {t['slowest_slice_seconds']:8.3f} "
      f"{(sum(gaps) / len(gaps) if gaps else 0):11.3f}  {side('before'):<21} {side('during'):<21} {p.get('p99_ratio') or 0:.1f}"
      f"   ({t['bytes_per_second'] / 2**20:.0f} MiB/s)")
PY
  umount "$WORK/mnt"
done
mount "$DEV" "$WORK/mnt"
echo
echo "reseq bench --trim-impact (unpaced 16 MiB slices, the drive's worst case):"
"$RESEQ" bench --trim-impact "$WORK/mnt" --trim-size $(( MIB / 4 ))M 2>/dev/null || true
