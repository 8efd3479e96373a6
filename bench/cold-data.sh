#!/usr/bin/env bash
# Cold data on an emulated TLC SSD whose old data reads slowly (`reseq sim serve` of the
# consumer-tlc-aging preset, docs/FTL-MODEL.md "Retention"), end to end with what a user
# runs: files written on ext4, the drive aged while served (`reseq sim age`, loop device
# and mount in place) and the old files' times set back as far (debugfs), one file then
# rewritten by the application; `reseq scan --by-file` must flag the old files slow and
# not the rewritten one, `reseq rewrite DIR --only-slow` must refresh exactly the old
# ones (the loop device's write counter), and their read time must come back to fresh
# within 10 % by the wall clock (dd iflag=direct, median of 3 reads). Exits 1 when any of
# that fails. As root. Leaves nothing behind (trap). About two minutes at the defaults.
#
#   bash bench/cold-data.sh [DAYS] [TIME_SCALE]      # 90 2
set -euo pipefail
days=${1:-90}
scale=${2:-2}
source "$(dirname "$0")/common.sh"
command -v debugfs >/dev/null || { echo "needs debugfs (e2fsprogs)" >&2; exit 3; }
serve_drive cold-data consumer-tlc-aging 1G "$scale"
mkdir "$dir/mnt/data"
echo "== consumer-tlc-aging drive at time scale $scale: $dev on $dir/fuse/disk, ext4 at $dir/mnt"

old="old1.bin old2.bin old3.bin"
files="$old app.bin"
for f in $files; do dd if=/dev/urandom of="$dir/mnt/data/$f" bs=1M count=64 conv=fsync status=none; done

# Wall seconds of an O_DIRECT read of a file: the median of 3.
read_seconds() {
  for _ in 1 2 3; do
    dd if="$1" of=/dev/null bs=1M iflag=direct 2>&1 | awk '/copied/ { print $(NF-3) }'
  done | sort -g | sed -n 2p
}
declare -A fresh
table() {
  echo "-- $1 (wall MB/s of dd iflag=direct, median of 3; the drive's own rate is x$scale)"
  for f in $files; do
    s=$(read_seconds "$dir/mnt/data/$f")
    [ "$1" = fresh ] && fresh[$f]=$s
    printf '  %-10s %7.1f MB/s  %.3f s  (x%.2f its fresh time)\n' "$f" \
      "$(echo "67.108864 / $s" | bc -l)" "$s" "$(echo "$s / ${fresh[$f]}" | bc -l)"
  done
}
table fresh

"$reseq" sim age "$dir/drive.sim" --days "$days" >/dev/null
# The files' times as old as their data: a real cold file's mtime says so too.
umount "$dir/mnt"
stamp=$(date -u -d "-$days days" +%Y%m%d%H%M%S)
for f in $files; do
  for field in mtime ctime; do debugfs -w -R "set_inode_field /data/$f $field $stamp" "$dev" 2>/dev/null; done
done
mount "$dev" "$dir/mnt"
echo "== aged $days days while served (reseq sim age); the files' mtime and ctime set $days days back"
dd if=/dev/urandom of="$dir/mnt/data/app.bin" bs=1M count=64 conv=notrunc,fsync status=none
echo "== the application rewrote app.bin (new contents, in place)"
table "after $days days"

fail=0
check() { if ! eval "$2"; then echo "FAIL: $1" >&2; fail=1; else echo "ok: $1"; fi; }

echo "== reseq scan --by-file"
"$reseq" scan "$dir/mnt/data" --by-file --sort age 2>/dev/null | sed 's/^/  /'
"$reseq" scan "$dir/mnt/data" --by-file --json 2>/dev/null >"$dir/scan.json"
flagged=$(python3 -c '
import json, os, sys
s = json.load(open(sys.argv[1]))["scan_files"]
print(" ".join(sorted(os.path.basename(f["path"]) for f in s["files"] if f["slow"])))' "$dir/scan.json")
check "scan flags exactly the old files slow (flagged: ${flagged:-none})" '[ "$flagged" = "old1.bin old2.bin old3.bin" ]'

echo "== reseq rewrite DIR --only-slow"
name=$(basename "$dev")
w0=$(awk '{ print $7 }' "/sys/block/$name/stat")
"$reseq" rewrite "$dir/mnt/data" --only-slow --state-dir "$dir/state" --json 2>"$dir/rewrite.log" >"$dir/rewrite.json" \
  || { echo "rewrite failed:" >&2; tail -5 "$dir/rewrite.log" >&2; exit 1; }
w1=$(awk '{ print $7 }' "/sys/block/$name/stat")
chosen=$(python3 -c '
import json, os, sys
r = json.load(open(sys.argv[1]))
sel = r["file_selection"]
print(" ".join(sorted(os.path.basename(f["path"]) for f in r["files"] if f["bytes_rewritten"] > 0)))
print("  " + sel["rule"], file=sys.stderr)' "$dir/rewrite.json" 2>"$dir/share")
cat "$dir/share"
written=$(( (w1 - w0) * 512 ))
echo "  chosen: $chosen; the device wrote $((written >> 20)) MiB (three files are 192 MiB)"
check "--only-slow chose exactly the old files" '[ "$chosen" = "old1.bin old2.bin old3.bin" ]'
# ext4's own journal and metadata add a little; app.bin's 64 MiB would add far more.
check "the device wrote the old files and not app.bin" '[ $written -ge $((192 << 20)) ] && [ $written -lt $((224 << 20)) ]'

table "after reseq rewrite --only-slow"
for f in $old; do
  r=$(echo "$(read_seconds "$dir/mnt/data/$f") / ${fresh[$f]}" | bc -l)
  check "$f reads within 10 % of fresh (x$(printf %.3f "$r") of its fresh time)" "[ \$(echo \"$r <= 1.10\" | bc) = 1 ]"
done
exit $fail
