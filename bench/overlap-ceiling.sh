#!/usr/bin/env bash
# What overlapping the three passes can buy on this device, beside what reseq gets, on one
# loop device (--direct-io=on), ROUNDS rounds, the order rotated each round:
#   bound     a read, then dd in place (64 MiB I/Os): the three-pass bound of rewrite-vs-dd.sh
#   streams   the same three passes (read, write, read) as free-running dd streams side by
#             side, in CHUNK-sized I/Os: the most a pipeline of CHUNK-sized I/Os could get
#   streams64 the same with 64 MiB I/Os
#   reseq     reseq rewrite (verified, --chunk-size CHUNK), and with --chunk-size 64M
# A ratio bound/streams near 1 means the device serves reads and writes side by side no
# faster than one after another: overlap cannot beat the bound there, only I/O size can.
#   sudo bench/overlap-ceiling.sh [ROUNDS] [SIZE_MIB] [CHUNK]   (RESEQ=binary to measure)
source "$(dirname "$0")/common.sh"
need_root
ROUNDS=${1:-5}
SIZE=${2:-1024}
CHUNK=${3:-4M}
RESEQ=$(reseq_bin)
make_device "$SIZE"
head -c 64M /dev/urandom > "$WORK/data"
echo "device $DEV over $SIZE MiB image, $ROUNDS rounds, chunk $CHUNK, $("$RESEQ" --version)"
reads() { dd if="$DEV" of=/dev/null bs="$1" iflag=direct status=none; }
writes() { # bs: SIZE MiB written from a 64 MiB buffer of random bytes
  local per=$(( (64 << 20) / $(numfmt --from=iec "$1") ))
  for i in $(seq 0 $(( SIZE / 64 - 1 ))); do
    dd if="$WORK/data" of="$DEV" bs="$1" count="$per" seek=$(( i * per )) oflag=direct conv=notrunc status=none
  done
}
streams() { reads "$1" & writes "$1" & reads "$1"; wait; }
bound() { reads 64M && dd if="$DEV" of="$DEV" bs=64M iflag=direct oflag=direct conv=notrunc status=none; }
reseq() { "$RESEQ" -q rewrite "$DEV" --state-dir "$WORK/state" --chunk-size "$1"; }
names=(bound streams streams64 reseq reseq64)
for i in $(seq 1 "$ROUNDS"); do
  for k in 0 1 2 3 4; do
    n=${names[$(( (k + i) % 5 ))]}
    case $n in
      bound) seconds bound >> "$WORK/bound" ;;
      streams) seconds streams "$CHUNK" >> "$WORK/streams" ;;
      streams64) seconds streams 64M >> "$WORK/streams64" ;;
      reseq) seconds reseq "$CHUNK" >> "$WORK/reseq" ;;
      reseq64) seconds reseq 64M >> "$WORK/reseq64" ;;
    esac
  done
done
b=$(median < "$WORK/bound")
for n in "${names[@]}"; do
  m=$(median < "$WORK/$n")
  printf '%-10s median %.2f s   bound / it = %.2f   (all: %s)\n' "$n" "$m" "$(echo "$b / $m" | bc -l)" \
    "$(sort -g "$WORK/$n" | xargs printf '%.2f ')"
done
