#!/usr/bin/env bash
# The pipeline's depth (issue 40), side by side in one run, ROUNDS rounds, the order
# rotated each round, on one device:
#   read       dd if=D of=/dev/null bs=64M iflag=direct (the direct read)
#   dd4, dd64  dd in place (if=D of=D, direct) at 4 MiB and 64 MiB
#   dd64f      dd64 and a flush at its end (conv=fsync), as reseq flushes at its end
#   byhand     b3sum D; dd in place bs=64M; b3sum D (the by-hand verified recipe)
#   v, n       reseq rewrite, verified and --no-verify, as it chooses (its depth probed
#              and, on an unmounted device of 16 GiB or more, its chunk-size trial)
#   vN, nN     the same at --read-ahead N for each N in DEPTHS (0: serial)
#   vS.N, nS.N the same at --chunk-size S --read-ahead N for each S/N in SIZES
#   vB, nB     the same with the binary $BEFORE (e.g. main's build), if set
# Prints each one's median and spread, the goals' ratios, and the depth reseq chose.
# Before each step, untimed: the device flushed and a second's rest. Without it a step
# paid for the one before: on a loop device over a virtual disk, 1 GiB rewrites back to
# back took 1.0 and 1.5 s by turns, reseq's and dd's alike (the host writing back the
# last pass's data).
#   sudo bench/depth.sh [ROUNDS] [SIZE_MIB] [disk|mem|sim]
#     disk: image on /var/tmp (disk-backed), mem: on /dev/shm, sim: the emulated SSD
#     (`reseq sim serve`, consumer-nvme at time scale 10, a loop device on its FUSE file)
#   DEPTHS="0 2 8 16" SIZES="16M/2 64M/1" BEFORE=/path/to/old/reseq RESEQ=/path/to/reseq
source "$(dirname "$0")/common.sh"
need_root
ROUNDS=${1:-3}
SIZE=${2:-1024}
KIND=${3:-disk}
DEPTHS=${DEPTHS-0 2 8 16}
SIZES=${SIZES:-}
RESEQ=$(reseq_bin)
command -v b3sum >/dev/null || cargo install --locked --quiet b3sum
case $KIND in
  disk) BENCH_DIR=/var/tmp make_device "$SIZE"; STATE="$WORK/state" ;;
  mem) BENCH_DIR=/dev/shm make_device "$SIZE"; STATE="$WORK/state" ;;
  sim)
    export RESEQ
    serve_drive depth consumer-nvme "${SIZE}M" 10
    # A quarter of it written through ext4, then the raw device, as the other kinds.
    dd if=/dev/urandom of="$dir/mnt/fill" bs=1M count=$(( SIZE / 4 )) conv=fsync status=none
    umount "$dir/mnt"
    DEV=$dev WORK=$dir STATE="$dir/state" ;;
  *) echo "kind: disk, mem or sim" >&2; exit 2 ;;
esac
echo "$KIND: $DEV, $SIZE MiB, $ROUNDS rounds, depths '$DEPTHS', $("$RESEQ" --version)${BEFORE:+, before: $BEFORE}"
names=(read dd4 dd64 dd64f byhand v n)
for d in $DEPTHS; do names+=("v$d" "n$d"); done
for sd in $SIZES; do names+=("v${sd/\//.}" "n${sd/\//.}"); done
[ -n "${BEFORE:-}" ] && names+=(vB nB)
by_hand() { b3sum "$DEV" >/dev/null && dd if="$DEV" of="$DEV" bs=64M iflag=direct oflag=direct conv=notrunc status=none && b3sum "$DEV" >/dev/null; }
rw() { local bin=$1; shift; "$bin" -q rewrite "$DEV" --state-dir "$STATE" --json "$@" >"$WORK/last.json" 2>"$WORK/last.err"; }
one() {
  case $1 in
    read) dd if="$DEV" of=/dev/null bs=64M iflag=direct status=none ;;
    dd4) dd if="$DEV" of="$DEV" bs=4M iflag=direct oflag=direct conv=notrunc status=none ;;
    dd64) dd if="$DEV" of="$DEV" bs=64M iflag=direct oflag=direct conv=notrunc status=none ;;
    dd64f) dd if="$DEV" of="$DEV" bs=64M iflag=direct oflag=direct conv=notrunc,fsync status=none ;;
    byhand) by_hand ;;
    v) rw "$RESEQ" && chosen v ;;
    n) rw "$RESEQ" --no-verify && chosen n ;;
    vB) rw "$BEFORE" ;;
    nB) rw "$BEFORE" --no-verify ;;
    v*.*) local s=${1#v}; rw "$RESEQ" --chunk-size "${s%.*}" --read-ahead "${s#*.}" ;;
    n*.*) local s=${1#n}; rw "$RESEQ" --chunk-size "${s%.*}" --read-ahead "${s#*.}" --no-verify ;;
    v*) rw "$RESEQ" --read-ahead "${1#v}" ;;
    n*) rw "$RESEQ" --read-ahead "${1#n}" --no-verify ;;
  esac
}
# What the default run chose: its depth, and the chunk-size trial's rates and pick.
chosen() { echo "$1: $(chose "$WORK/last.json")" >>"$WORK/chosen"; }
settle() { python3 -c 'import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDONLY))' "$DEV"; sleep 1; }
k=${#names[@]}
for i in $(seq 1 "$ROUNDS"); do
  line="round $i:"
  for j in $(seq 0 $(( k - 1 ))); do
    n=${names[$(( (j + i) % k ))]}
    settle
    t0=$(date +%s.%N); one "$n"; t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc -l >>"$WORK/t_$n"
    line+=" $n $(printf %.2f "$(tail -1 "$WORK/t_$n")")"
  done
  echo "$line"
done
m() { median <"$WORK/t_$1"; }
printf '%-8s %8s  %s\n' what median "all (s)"
for n in "${names[@]}"; do printf '%-8s %8.2f  %s\n' "$n" "$(m "$n")" "$(sort -g "$WORK/t_$n" | xargs printf '%.2f ')"; done
bound=$(echo "$(m dd64) + $(m read)" | bc -l)
echo "three-pass bound (dd64 + read): $(printf %.2f "$bound") s; what reseq chose, run by run:"
cat "$WORK/chosen"
printf '%-8s %14s %14s %16s %17s\n' reseq "bound/verified" "byhand/verified" "dd64/no-verify" "dd64f/no-verify"
rows="'' $DEPTHS"; for sd in $SIZES; do rows+=" ${sd/\//.}"; done; [ -n "${BEFORE:-}" ] && rows+=" B"
for d in $rows; do
  d=${d//\'/}
  printf '%-8s %14.2f %14.2f %16.2f %17.2f\n' "${d:-chosen}" "$(echo "$bound / $(m "v$d")" | bc -l)" \
    "$(echo "$(m byhand) / $(m "v$d")" | bc -l)" "$(echo "$(m dd64) / $(m "n$d")" | bc -l)" \
    "$(echo "$(m dd64f) / $(m "n$d")" | bc -l)"
done
echo "goals (disk): bound/verified >= 0.95, byhand/verified >= 1.3, dd64/no-verify >= 1.0"
