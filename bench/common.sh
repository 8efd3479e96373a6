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
