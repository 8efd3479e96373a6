#!/usr/bin/env bash
# Throughput of `reseq rewrite` against the hand-made `dd if=D of=D`, side by side in one
# run on the same loop device (2 GiB image, --direct-io=on), alternating, ROUNDS times.
# Prints the median MiB/s of each and the ratios reseq/dd.
#   sudo bench/rewrite-vs-dd.sh [ROUNDS] [SIZE_MIB]
source "$(dirname "$0")/common.sh"
need_root
ROUNDS=${1:-5}
SIZE=${2:-2048}
RESEQ=$(reseq_bin)
make_device "$SIZE"
STATE="$WORK/state"
echo "device $DEV over $SIZE MiB image, $ROUNDS rounds, reseq $("$RESEQ" --version)"
: > "$WORK/dd"; : > "$WORK/verify"; : > "$WORK/noverify"
for i in $(seq 1 "$ROUNDS"); do
  t=$(seconds dd if="$DEV" of="$DEV" bs=64M iflag=direct oflag=direct conv=notrunc)
  echo "$SIZE / $t" | bc -l >> "$WORK/dd"
  t=$(seconds "$RESEQ" -q rewrite "$DEV" --state-dir "$STATE")
  echo "$SIZE / $t" | bc -l >> "$WORK/verify"
  t=$(seconds "$RESEQ" -q rewrite "$DEV" --state-dir "$STATE" --no-verify)
  echo "$SIZE / $t" | bc -l >> "$WORK/noverify"
  printf 'round %d: dd %.0f, reseq verify %.0f, reseq no-verify %.0f MiB/s\n' "$i" \
    "$(tail -1 "$WORK/dd")" "$(tail -1 "$WORK/verify")" "$(tail -1 "$WORK/noverify")"
done
# How much reads and writes overlap on this device at all: the ceiling of any pipeline.
# (Run last: it writes zeros over the second half of the scratch image.)
h8=$(( SIZE / 2 / 8 ))
t_r=$(seconds dd if="$DEV" of=/dev/null bs=8M count=$h8 iflag=direct)
t_w=$(seconds dd if=/dev/zero of="$DEV" bs=8M count=$h8 seek=$h8 oflag=direct conv=notrunc)
t_rw=$(seconds bash -c "dd if=$DEV of=/dev/null bs=8M count=$h8 iflag=direct status=none & dd if=/dev/zero of=$DEV bs=8M count=$h8 seek=$h8 oflag=direct conv=notrunc status=none; wait")
printf 'device overlap probe (%d MiB each): read %.2f s, write %.2f s, both at once %.2f s (%.0f%% of their sum; 100%% = no overlap)\n' \
  "$(( SIZE / 2 ))" "$t_r" "$t_w" "$t_rw" "$(echo "100 * $t_rw / ($t_r + $t_w)" | bc -l)"
dd_m=$(median < "$WORK/dd"); v_m=$(median < "$WORK/verify"); n_m=$(median < "$WORK/noverify")
printf 'median MiB/s: dd bs=64M %.0f | reseq (verify) %.0f | reseq --no-verify %.0f\n' "$dd_m" "$v_m" "$n_m"
printf 'ratio reseq/dd: verify %.2fx (goal >= 1.0) | no-verify %.2fx (goal >= 1.3)\n' \
  "$(echo "$v_m / $dd_m" | bc -l)" "$(echo "$n_m / $dd_m" | bc -l)"
