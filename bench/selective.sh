#!/usr/bin/env bash
# Full versus selective (--only-slow) re-sequencing on the simulated SSD, with random
# 4 KiB writes confined to 10 %, 20 % and 50 % of a 2 GiB consumer-nvme device.
# Prints the bytes each writes and the sequential read time of the device after.
#   bench/selective.sh [PRESET]
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-consumer-nvme}
cargo build --release --quiet
R=target/release/reseq
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
SIZE_MIB=2048
printf '%-10s %-10s %12s %12s %10s\n' fragmented strategy written_MiB read_s "vs fresh"
$R -q sim create "$W/fresh.sim" --preset "$PRESET" --device-size ${SIZE_MIB}M >/dev/null
$R -q sim write "$W/fresh.sim" >/dev/null
FRESH=$($R -q sim read "$W/fresh.sim" | json 'd["virtual_seconds"]')
for pct in 10 20 50; do
  len=$(( SIZE_MIB * pct / 100 )); off=$(( (SIZE_MIB - len) / 2 ))
  cp "$W/fresh.sim" "$W/frag.sim"
  $R -q sim fragment "$W/frag.sim" --offset ${off}M --length ${len}M --random-writes $(( len * 2 ))M >/dev/null
  T=$($R -q sim read "$W/frag.sim" | json 'd["virtual_seconds"]')
  printf '%-10s %-10s %12s %12.3f %9.2fx\n' "$pct%" degraded - "$T" "$(echo "$T / $FRESH" | bc -l)"
  for mode in full only-slow; do
    cp "$W/frag.sim" "$W/run.sim"
    if [ $mode = full ]; then args=(); else args=(--only-slow --scan-regions 64); fi
    B=$($R -q sim rewrite "$W/run.sim" "${args[@]}" | json 'd["rewrite"]["bytes_written"] >> 20')
    T=$($R -q sim read "$W/run.sim" | json 'd["virtual_seconds"]')
    printf '%-10s %-10s %12s %12.3f %9.2fx\n' "$pct%" "$mode" "$B" "$T" "$(echo "$T / $FRESH" | bc -l)"
  done
done
