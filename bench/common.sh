# Shared by the bench scripts: a scratch loop device over a filled image, cleaned up on exit.
set -euo pipefail

need_root() {
  if [ "$(id -u)" != 0 ]; then echo "run as root (loop devices)" >&2; exit 2; fi
}

# make_device SIZE_MIB: sets $DEV and $WORK; a trap detaches and removes everything.
make_device() {
  # BENCH_DIR=/dev/shm puts the image in memory: a device that reads and writes in parallel.
  WORK=$(mktemp -d "${BENCH_DIR:-/var/tmp}/reseq-bench-XXXXXX")
  trap 'losetup -d "$DEV" 2>/dev/null || true; rm -rf "$WORK"' EXIT
  truncate -s "${1}M" "$WORK/disk.img"
  # Fill it, so reads and writes hit allocated blocks rather than holes.
  dd if=/dev/urandom of="$WORK/disk.img" bs=16M count=$(( $1 / 16 )) conv=notrunc status=none
  sync
  DEV=$(losetup --direct-io=on --find --show "$WORK/disk.img")
}

# chose JSON: what a `reseq rewrite --json` report chose: its depth, and the chunk-size
# trial's rates and pick (bench/depth.sh, bench/chunk-trial.sh).
chose() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = (r.get("results") or {}).get("chunk_trial")
line = f"depth {r['pipeline_depth']['depth']}"
if t:
    rates = ", ".join(f"{m['shape']['chunk_size'] >> 20}M/{m['shape']['read_ahead']} {m['bytes_per_second'] / 2**20:.0f} MiB/s" for m in t["measured"])
    line += f", trial {rates}: kept {t['chosen']['chunk_size'] >> 20}M/{t['chosen']['read_ahead']}"
print(line)
PY
}

# median of numbers on stdin
median() { sort -g | awk '{a[NR]=$1} END {m = (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "%.6f\n", m}'; }

# seconds SECS-OF-COMMAND: runs a command, prints its wall time in seconds
seconds() {
  local t0 t1
  t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}

# The binary to measure: $RESEQ if set (e.g. another commit's build), else a release
# build of this tree (in $CARGO_TARGET_DIR when set).
reseq_bin() {
  if [ -n "${RESEQ:-}" ]; then echo "$RESEQ"; return; fi
  cargo build --release --quiet --manifest-path "$(dirname "$0")/../Cargo.toml"
  echo "${CARGO_TARGET_DIR:-$(dirname "$0")/../target}/release/reseq"
}

# serve_drive NAME PRESET SIZE SCALE: an emulated SSD (`reseq sim serve` of PRESET, SIZE)
# at time scale SCALE, a loop device on its file (4 KiB sectors, direct I/O) and ext4 on
# that at $dir/mnt. Sets $reseq, $dir, $dev and $server; a trap unmounts, detaches, stops
# the server and removes everything.
serve_drive() {
  reseq=${RESEQ:-$(dirname "$0")/../target/release/reseq}
  [ -x "$reseq" ] || { echo "build first: cargo build --release (or set RESEQ)" >&2; exit 2; }
  [ -e /dev/fuse ] || { echo "no /dev/fuse (modprobe fuse)" >&2; exit 3; }
  dir=$(mktemp -d "/tmp/reseq-$1.XXXXXX")
  dev= server=
  trap serve_cleanup EXIT
  "$reseq" sim create "$dir/drive.sim" --preset "$2" --device-size "$3" >/dev/null
  mkdir "$dir/fuse" "$dir/mnt"
  "$reseq" sim serve "$dir/drive.sim" "$dir/fuse" --time-scale "$4" >"$dir/serve.json" 2>"$dir/serve.log" &
  server=$!
  for _ in $(seq 100); do [ -e "$dir/fuse/disk" ] && break; sleep 0.1; done
  dev=$(losetup --direct-io=on --sector-size 4096 --find --show "$dir/fuse/disk")
  mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$dev"
  mount "$dev" "$dir/mnt"
}

serve_cleanup() {
  mountpoint -q "$dir/mnt" && umount "$dir/mnt"
  [ -n "$dev" ] && losetup -d "$dev"
  # Only while it is still ours (its command line names $dir): a server that died
  # earlier was reaped, and its PID may be another process's by now.
  [ -n "$server" ] && grep -qF "$dir" "/proc/$server/cmdline" 2>/dev/null && kill -TERM "$server" && wait "$server" || true
  rm -rf "$dir"
}

# kind_device KIND SIZE_MIB NAME: the device the speed scripts measure, as $DEV and $WORK.
#   disk: a filled image on /var/tmp (disk-backed), mem: on /dev/shm, sim: the emulated
#   SSD (consumer-nvme at time scale 10), a quarter written through ext4, then unmounted.
kind_device() {
  case $1 in
    disk) BENCH_DIR=/var/tmp make_device "$2" ;;
    mem) BENCH_DIR=/dev/shm make_device "$2" ;;
    sim)
      export RESEQ
      serve_drive "$3" consumer-nvme "${2}M" 10
      dd if=/dev/urandom of="$dir/mnt/fill" bs=1M count=$(( $2 / 4 )) conv=fsync status=none
      umount "$dir/mnt"
      DEV=$dev WORK=$dir ;;
    *) echo "kind: disk, mem or sim" >&2; exit 2 ;;
  esac
}
