#!/usr/bin/env bash
# Cold data on an emulated TLC SSD whose old data reads slowly (`reseq sim serve` of the
# consumer-tlc-aging preset, docs/FTL-MODEL.md "Retention"): files written on ext4, the
# drive aged while served (`reseq sim age`, loop device and mount in place), one file
# rewritten by the application, one by `reseq rewrite` (file mode), then each file read
# with dd iflag=direct. Old files read several times slower; the rewritten ones read
# fresh. As root. Leaves nothing behind (trap). About a minute at the default scale.
#
#   bash bench/cold-data.sh [DAYS] [TIME_SCALE]      # 90 2
set -euo pipefail
days=${1:-90}
scale=${2:-2}
reseq=${RESEQ:-$(dirname "$0")/../target/release/reseq}
[ -x "$reseq" ] || { echo "build first: cargo build --release (or set RESEQ)" >&2; exit 2; }
[ -e /dev/fuse ] || { echo "no /dev/fuse (modprobe fuse)" >&2; exit 3; }

dir=$(mktemp -d /tmp/reseq-cold-data.XXXXXX)
dev= server=
cleanup() {
  mountpoint -q "$dir/mnt" && umount "$dir/mnt"
  [ -n "$dev" ] && losetup -d "$dev"
  # Only while it is still ours (its command line names $dir).
  [ -n "$server" ] && grep -qF "$dir" "/proc/$server/cmdline" 2>/dev/null && kill -TERM "$server" && wait "$server" || true
  rm -rf "$dir"
}
trap cleanup EXIT

"$reseq" sim create "$dir/drive.sim" --preset consumer-tlc-aging --device-size 1G >/dev/null
mkdir "$dir/fuse" "$dir/mnt"
"$reseq" sim serve "$dir/drive.sim" "$dir/fuse" --time-scale "$scale" >"$dir/serve.json" 2>"$dir/serve.log" &
server=$!
for _ in $(seq 100); do [ -e "$dir/fuse/disk" ] && break; sleep 0.1; done
dev=$(losetup --direct-io=on --sector-size 4096 --find --show "$dir/fuse/disk")
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$dev"
mount "$dev" "$dir/mnt"
echo "== consumer-tlc-aging drive at time scale $scale: $dev on $dir/fuse/disk, ext4 at $dir/mnt"

files="untouched.bin app-rewritten.bin reseq-rewritten.bin"
for f in $files; do dd if=/dev/urandom of="$dir/mnt/$f" bs=1M count=64 conv=fsync status=none; done

# Wall MB/s of an O_DIRECT read of the file, and the drive's own (virtual) MB/s.
read_rate() {
  local s
  s=$(dd if="$1" of=/dev/null bs=1M iflag=direct 2>&1 | awk '/copied/ { print $(NF-3) }')
  awk -v b=$((64 << 20)) -v s="$s" -v k="$scale" \
    'BEGIN { printf "%6.1f MB/s wall, %6.1f MB/s drive (%.2f s)", b / s / 1e6, b / s / 1e6 * k, s }'
}
table() {
  echo "-- $1"
  for f in $files; do printf '  %-20s %s\n' "$f" "$(read_rate "$dir/mnt/$f")"; done
}

table "fresh"
"$reseq" sim age "$dir/drive.sim" --days "$days" >/dev/null
echo "== aged $days days while served (reseq sim age)"
table "after $days days"

echo "== the application rewrites app-rewritten.bin (new contents, in place); reseq rewrites reseq-rewritten.bin"
dd if=/dev/urandom of="$dir/mnt/app-rewritten.bin" bs=1M count=64 conv=notrunc,fsync status=none
"$reseq" rewrite "$dir/mnt/reseq-rewritten.bin" --state-dir "$dir/state" 2>/dev/null | grep -E 'rewrote|wrote' || true
table "after the rewrites"

umount "$dir/mnt"
losetup -d "$dev"; dev=
kill -TERM "$server"; wait "$server"; server=
echo "== the drive's age clock and its data by age (days: bytes), after the server stopped:"
"$reseq" sim info "$dir/drive.sim" | python3 -c '
import json, sys
v = json.load(sys.stdin)
ages = ["%d: %d MiB" % (a["age_days"], a["bytes"] >> 20) for a in v["data_by_age"]]
print("  clock", v["age_clock_days"], "days;", ", ".join(ages))'
