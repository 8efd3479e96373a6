#!/usr/bin/env bash
# The full simulated experiment (4 GiB file, 8 GiB device, 5050 MiB of random 4 KiB
# writes, six full reads, one rewrite), on one core, side by side with the Python
# reference when REFERENCE names its directory (ftlsim.py). Prints wall time and peak memory.
#   bench/sim-experiment.sh [PRESET]
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-consumer-nvme}
cargo build --release --quiet --example ftl_experiment
cargo build --release --quiet
one_core() { taskset -c 0 /usr/bin/time -f "  wall %e s, peak RSS %M KiB" "$@"; }

echo "== Rust model alone (the reference's experiment; goal: < 2 s on one core, <= 16 B per 4 KiB)"
one_core target/release/examples/ftl_experiment "$PRESET" 2>&1
echo "== reseq simulate (the same, but the rewrite runs through reseq's engine: read, blake3, write, read back, blake3)"
one_core target/release/reseq -q simulate --preset "$PRESET" 2>&1 | tail -4
REF=${REFERENCE:-}
if [ -f "$REF/ftlsim.py" ]; then
  echo "== Python reference (same experiment)"
  (cd "$REF" && one_core python3 -c "
from degrade_and_rewrite import degrade, rewrite
import presets
from ftlsim import GiB, SLOT
f, res = degrade(presets.P['$PRESET'])
r = rewrite(f, 4 * GiB // SLOT)
print('$PRESET: reads', ' '.join('%.2f' % x for x in res), '| after rewrite %.2f s' % r[0])
" 2>&1)
fi
