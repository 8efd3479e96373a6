#!/usr/bin/env bash
# reseq's rewrite against the device's own best, as fio measures it, side by side in one
# run, ROUNDS rounds, the order rotated each round (issue 48, "the device's best as the
# bar"). Each round times, on one device:
#   fio read   the whole device at each best shape (libaio, iodepth 8, 4 and 16 MiB I/Os;
#              on huge-page buffers too where the host has huge pages reserved): the fastest
#   fio write  the same, writing
#   fio r+w    a reader and a writer of the whole device at once, at the best shape: what a
#              pipeline that overlaps reads and writes could reach here
#   reseq      `reseq rewrite DEV` (verified) and `--no-verify`, wall clock (its start, plan
#              and probes included; fio's time is its own job runtime, without its start)
# and prints the medians and the ratios (above 1: reseq faster than the bound):
#   verified    (2 x read + write) / reseq         goal >= 1.0
#   --no-verify (read + write) / reseq --no-verify goal >= 1.0
#   rewrite     the two above against reseq's report's rewrite_seconds: the run without its
#               start (checks, the writers' scan, the hole map, the depth probe, buffers)
#   ceiling     (read + write) / r+w               what overlap could buy on this device
# and, for reseq's two parts, the CPU-seconds the whole machine was busy during a run and
# that work packed on every CPU, none idle: a floor beside the bound, where the CPU limits.
#   sudo bench/fio-bar.sh [ROUNDS] [SIZE_MIB] [disk|mem|sim]
#     disk: image on /var/tmp (disk-backed; the goal is stated at 8 GiB and more),
#     mem: on /dev/shm, sim: the emulated SSD (consumer-nvme, time scale 10)
source "$(dirname "$0")/common.sh"
need_root
command -v fio >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null \
  || { echo "needs fio (apt-get install fio)" >&2; exit 2; }
ROUNDS=${1:-3}
SIZE=${2:-8192}
KIND=${3:-disk}
RESEQ=$(reseq_bin)
kind_device "$KIND" "$SIZE" fiobar
# Buffers fio may use: the heap (transparent huge pages where the kernel gives them), and
# reserved huge pages when there are enough for a job's 8 x 16 MiB.
mems=(malloc)
free_huge=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
huge_kib=$(awk '/Hugepagesize/ {print $2}' /proc/meminfo)
(( free_huge * huge_kib >= 2 * 8 * 16 * 1024 )) && mems+=(shmhuge)
echo "$KIND: $DEV, $SIZE MiB, $ROUNDS rounds, $(fio --version), fio buffers: ${mems[*]}, $("$RESEQ" --version)"

settle() { python3 -c 'import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDONLY))' "$DEV"; sleep 1; }
# fio_time RW BS MEM [RW2]: seconds of one fio run over the whole device (two jobs at once
# when RW2 is given).
fio_time() {
  local args=(--filename="$DEV" --direct=1 --ioengine=libaio --iodepth=8 --bs="$2" --mem="$3"
    --size="${SIZE}M" --output-format=json)
  settle
  if [ -n "${4:-}" ]; then
    fio "${args[@]}" --name=r --rw="$1" --name=w --rw="$4" >"$WORK/fio.json"
  else
    fio "${args[@]}" --name=j --rw="$1" >"$WORK/fio.json"
  fi
  # fio's own time for its I/O (the longest job's), without its start: the strictest bar.
  python3 -c 'import json, sys; print(max(j["job_runtime"] for j in json.load(open(sys.argv[1]))["jobs"]) / 1000)' \
    "$WORK/fio.json"
}
# best RW: the fastest of the shapes, and which it was (into $WORK/shape_RW)
best() {
  local b="" s bs mem t
  for bs in 4M 16M; do
    for mem in "${mems[@]}"; do
      t=$(fio_time "$1" "$bs" "$mem")
      if [ -z "$b" ] || fp "$t < $b"; then b=$t; s="$bs $mem"; fi
    done
  done
  echo "$s" >"$WORK/shape_$1"
  echo "$b"
}
fp() { awk "BEGIN{exit !($1)}"; }
# CPU-seconds the whole machine has spent busy so far (/proc/stat: all but idle and iowait).
busy() { awk '/^cpu / {print ($2 + $3 + $4 + $7 + $8 + $9) / 100}' /proc/stat; }
reseq_time() { # PART ARGS...: the wall time; the machine's busy CPU-seconds into c_PART
  local part=$1 t0 t1 b0; shift
  settle
  rm -rf "$WORK/state"
  b0=$(busy); t0=$(date +%s.%N)
  "$RESEQ" -q rewrite "$DEV" --state-dir "$WORK/state" --json "$@" >"$WORK/last.json" 2>"$WORK/last.err" \
    || { cat "$WORK/last.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$(busy) - $b0" | bc -l >>"$WORK/c_$part"
  # The rewrite's own time, as its report gives it: the run without its start (device
  # checks, the writers' scan, the hole map, the depth probe, the buffers).
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["results"]["rewrite_seconds"])' \
    "$WORK/last.json" >>"$WORK/p_$part"
  echo "$t1 - $t0" | bc -l
}

parts=(read write rw verified noverify)
for i in $(seq 1 "$ROUNDS"); do
  # Rotate the order, so that no part always follows the same other.
  order=("${parts[@]:$(( (i - 1) % 5 ))}" "${parts[@]:0:$(( (i - 1) % 5 ))}")
  line="round $i:"
  for p in "${order[@]}"; do
    case $p in
      read) t=$(best read) ;;
      write) t=$(best write) ;;
      rw) read -r bs mem <"$WORK/shape_read" 2>/dev/null || { bs=16M; mem=malloc; }
          t=$(fio_time read "$bs" "$mem" write) ;;
      verified) t=$(reseq_time verified) ;;
      noverify) t=$(reseq_time noverify --no-verify) ;;
    esac
    echo "$t" >>"$WORK/t_$p"
    line+=$(printf ' %s %.2f s' "$p" "$t")
    [ "$p" = verified ] && line+=" ($(chose "$WORK/last.json"))"
  done
  echo "$line"
done
m() { median <"$WORK/t_$1"; }
r=$(m read) w=$(m write) rw=$(m rw) v=$(m verified) n=$(m noverify)
printf 'medians: fio read %.2f s (%s), write %.2f s (%s), read+write at once %.2f s; reseq %.2f s, --no-verify %.2f s\n' \
  "$r" "$(cat "$WORK/shape_read")" "$w" "$(cat "$WORK/shape_write")" "$rw" "$v" "$n"
printf 'verified:    (2 x read + write) / reseq = %.2f (goal >= 1.0)\n' "$(echo "(2 * $r + $w) / $v" | bc -l)"
printf -- '--no-verify: (read + write) / reseq     = %.2f (goal >= 1.0)\n' "$(echo "($r + $w) / $n" | bc -l)"
printf 'rewrite:     both, its start left out   = %.2f, %.2f (as fio'"'"'s time leaves out its own)\n' \
  "$(echo "(2 * $r + $w) / $(median <"$WORK/p_verified")" | bc -l)" "$(echo "($r + $w) / $(median <"$WORK/p_noverify")" | bc -l)"
printf 'ceiling:     (read + write) / r+w       = %.2f (what overlapping reads and writes can buy here)\n' \
  "$(echo "($r + $w) / $rw" | bc -l)"
# Where the CPU is the limit (the memory-backed device: the loop worker copies every byte
# on one thread, and reseq hashes it and compares its read-back), the work of a run packed on every CPU with none idle is a
# floor no pipeline goes below: against the bound it says whether the goal is in reach.
cpus=$(nproc)
for p in verified noverify; do
  c=$(median <"$WORK/c_$p")
  bound=$([ "$p" = verified ] && echo "2 * $r + $w" || echo "$r + $w")
  printf 'cpu %-9s %.1f CPU-s busy (median), %.2f of %d CPUs; packed on all: %.2f s, bound %.2f s\n' \
    "$p:" "$c" "$(echo "$c / $(m "$p")" | bc -l)" "$cpus" "$(echo "$c / $cpus" | bc -l)" "$(echo "$bound" | bc -l)"
done
