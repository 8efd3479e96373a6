#!/usr/bin/env bash
# The whole chain on an emulated SSD (`reseq sim serve`: the FTL model served through
# FUSE, a loop device on it, ext4): device mode, file mode, --only-slow, scan, and
# used-space mode with FITRIM, each measured by the wall clock. As root. Leaves nothing
# behind (trap). Sizes: a 2 GiB drive, a 512 MiB database-like file, 256 MiB of random
# 4 KiB overwrites through the filesystem; about 4 minutes at the default time scale.
#
#   bash bench/sim-serve.sh [PRESET] [TIME_SCALE]      # consumer-nvme 10
set -euo pipefail
preset=${1:-consumer-nvme}
scale=${2:-10}
source "$(dirname "$0")/common.sh"
serve_drive sim-serve "$preset" 2G "$scale"
echo "== $preset drive at time scale $scale: $dev on $dir/fuse/disk, ext4 at $dir/mnt"

write_file() { dd if=/dev/urandom of="$1" bs=1M count="$2" conv=fsync status=none; }
degrade() {  # random 4 KiB overwrites in place, fsync every 256
  python3 - "$1" "$2" <<'PY'
import os, random, sys
fd = os.open(sys.argv[1], os.O_WRONLY); pages = os.fstat(fd).st_size // 4096
r = random.Random(int(sys.argv[2])); buf = os.urandom(4096)
for i in range(int(sys.argv[2]) * 256):
    os.pwrite(fd, buf, r.randrange(pages) * 4096)
    if i % 256 == 255: os.fsync(fd)
os.fsync(fd)
PY
}
bench() { "$reseq" bench "$@" 2>/dev/null | grep -E 'read:' | sed 's/ (.*//'; }

write_file "$dir/mnt/table.db" 512
write_file "$dir/mnt/cold.bin" 256
echo "-- fresh";                  bench "$dir/mnt/table.db"
degrade "$dir/mnt/table.db" 256   # MiB
echo "-- after 256 MiB of random 4 KiB writes"; bench "$dir/mnt/table.db"
echo "-- scan of the device (slow regions flagged)"
"$reseq" scan "$dev" --regions 16 2>/dev/null | grep -E 'slow|region' | head -20 || true

echo "== file mode: reseq rewrite FILE --bench"
"$reseq" rewrite "$dir/mnt/table.db" --bench --state-dir "$dir/state" 2>/dev/null | grep -E 'verdict|rewrote'

degrade "$dir/mnt/table.db" 256
echo "== device mode, --only-slow: reseq rewrite DEV --only-slow --bench"
"$reseq" rewrite "$dev" --only-slow --bench --state-dir "$dir/state" 2>/dev/null | grep -E 'verdict|chose|selection|rewrote'
echo "-- the file after"; bench "$dir/mnt/table.db"

degrade "$dir/mnt/table.db" 256
rm "$dir/mnt/cold.bin"
echo "== used-space mode with FITRIM (the free space trimmed: discards reach the model as trims)"
"$reseq" rewrite "$dev" --bench --state-dir "$dir/state" 2>/dev/null | grep -E 'verdict|rewrote|trim'
echo "-- the file after"; bench "$dir/mnt/table.db"

umount "$dir/mnt"
e2fsck -fn "$dev" >/dev/null && echo "e2fsck -fn clean"
losetup -d "$dev"; dev=
kill -TERM "$server"; wait "$server"; server=
echo "== the served drive's session:"; cat "$dir/serve.json"
