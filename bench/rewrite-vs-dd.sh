#!/usr/bin/env bash
# The verified rewrite against the device's bound, side by side in one run on one loop
# device (--direct-io=on), ROUNDS rounds, the order rotated each round. Per round: a
# sequential read (dd of=/dev/null), dd in place (dd if=D of=D), reseq rewrite
# (verified), reseq rewrite --no-verify, and the by-hand verified equivalent (b3sum the
# device, dd in place, b3sum again). Prints medians, the ratios the goals name, and
# reseq's own stage timers (where the time goes):
#   verified time <= (dd-in-place time + read time) / 0.9
#   --no-verify   >= 1.0x dd in place (throughput)
#   verified      >= 1.3x faster than b3sum + dd + b3sum
#   sudo bench/rewrite-vs-dd.sh [ROUNDS] [SIZE_MIB]      (BENCH_DIR=/dev/shm: image in memory)
source "$(dirname "$0")/common.sh"
need_root
ROUNDS=${1:-3}
SIZE=${2:-1024}
RESEQ=$(reseq_bin)
command -v b3sum >/dev/null || cargo install --locked --quiet b3sum
make_device "$SIZE"
STATE="$WORK/state"
echo "device $DEV over $SIZE MiB image, $ROUNDS rounds, $("$RESEQ" --version), $(b3sum --version)"
run() { # name command...
  local name=$1; shift
  seconds "$@" >> "$WORK/$name"
}
by_hand() { b3sum "$DEV" >/dev/null && dd if="$DEV" of="$DEV" bs=64M iflag=direct oflag=direct conv=notrunc status=none && b3sum "$DEV" >/dev/null; }
verified() { "$RESEQ" -q rewrite "$DEV" --state-dir "$STATE" --json > "$WORK/last.json"; }
names=(read dd verified noverify byhand)
for i in $(seq 1 "$ROUNDS"); do
  for k in 0 1 2 3 4; do
    n=${names[$(( (k + i) % 5 ))]}
    case $n in
      read) run read dd if="$DEV" of=/dev/null bs=64M iflag=direct ;;
      dd) run dd dd if="$DEV" of="$DEV" bs=64M iflag=direct oflag=direct conv=notrunc ;;
      verified) run verified verified ;;
      noverify) run noverify "$RESEQ" -q rewrite "$DEV" --state-dir "$STATE" --no-verify ;;
      byhand) run byhand by_hand ;;
    esac
  done
  printf 'round %d: read %.2f s, dd %.2f s, reseq %.2f s, --no-verify %.2f s, by hand %.2f s\n' "$i" \
    "$(tail -1 "$WORK/read")" "$(tail -1 "$WORK/dd")" "$(tail -1 "$WORK/verified")" "$(tail -1 "$WORK/noverify")" "$(tail -1 "$WORK/byhand")"
done
r=$(median < "$WORK/read"); d=$(median < "$WORK/dd"); v=$(median < "$WORK/verified"); n=$(median < "$WORK/noverify"); b=$(median < "$WORK/byhand")
printf 'medians: read %.2f s, dd in place %.2f s, reseq verified %.2f s, --no-verify %.2f s, by hand %.2f s\n' "$r" "$d" "$v" "$n" "$b"
printf 'verified / ((dd + read) / 0.9) = %.2f   (goal <= 1.0)\n' "$(echo "$v / (($d + $r) / 0.9)" | bc -l)"
printf 'no-verify throughput / dd       = %.2fx  (goal >= 1.0)\n' "$(echo "$d / $n" | bc -l)"
printf 'by hand / verified              = %.2fx  (goal >= 1.3)\n' "$(echo "$b / $v" | bc -l)"
echo "stage seconds of the last verified run (they overlap):"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"]; print("  ", {k: round(v, 2) for k, v in r["stages"].items()})' "$WORK/last.json"
