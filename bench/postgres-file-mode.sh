#!/usr/bin/env bash
# A real PostgreSQL cluster (ext4 on a loop device, data checksums), `pgbench -i -s SCALE`,
# then `pgbench -c 4` for a baseline period and again while `reseq rewrite base/` runs in
# file mode. Prints reseq's windows and frozen time, and pgbench's tps and latency
# (average, p99, max) before and during, failed transactions, and amcheck's verdict.
# Goals at scale 30: at most 20 windows and 5 s frozen; p99 during <= 3x p99 before;
# no failed transaction; amcheck clean.
#   sudo bench/postgres-file-mode.sh [SCALE] [SECONDS] [BUDGET]
source "$(dirname "$0")/common.sh"
need_root
SCALE=${1:-30}
SECS=${2:-20}
BUDGET=${3:-500ms}
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -x "$BIN/initdb" ] || { echo "needs PostgreSQL (apt-get install postgresql)" >&2; exit 2; }
RESEQ=$(reseq_bin)
# The cluster, its WAL (max_wal_size 1 GB) and amcheck's work need room.
make_device $(( 3072 + SCALE * 40 ))
mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 "$DEV"
mkdir -p "$WORK/mnt" "$WORK/sock" "$WORK/log"; mount "$DEV" "$WORK/mnt"
PG() { runuser -u postgres -- "$BIN/$@"; }
trap 'fsfreeze -u "$WORK/mnt" 2>/dev/null || true; PG pg_ctl -D "$WORK/mnt/data" -m immediate stop >/dev/null 2>&1 || true; umount "$WORK/mnt" 2>/dev/null || true; losetup -d "$DEV" 2>/dev/null || true; rm -rf "$WORK"' EXIT
chown -R postgres:postgres "$WORK/mnt" "$WORK/sock" "$WORK/log"; chmod 755 "$WORK"
PG initdb --no-instructions --data-checksums -A trust -U postgres -D "$WORK/mnt/data" >/dev/null
PG pg_ctl -w -D "$WORK/mnt/data" -o "-c listen_addresses='' -k $WORK/sock -p 5492" -l "$WORK/mnt/server.log" start >/dev/null
CONN=(-h "$WORK/sock" -p 5492 -U postgres)
PG pgbench "${CONN[@]}" -i -q -s "$SCALE" postgres >/dev/null 2>&1
files=$(find "$WORK/mnt/data/base" -type f | wc -l); mib=$(du -sm "$WORK/mnt/data/base" | cut -f1)
echo "PostgreSQL $("$BIN/postgres" --version | awk '{print $3}'), pgbench -s $SCALE: $files files, $mib MiB in base/; budget $BUDGET"
bench() { # label
  rm -f "$WORK/log/$1".*
  (cd "$WORK/log" && PG pgbench "${CONN[@]}" -c 4 -j 2 -T "$SECS" --log --log-prefix="$1" postgres > "$WORK/log/$1.out" 2>&1)
}
summary() { # label
  python3 - "$WORK/log" "$1" <<'PY'
import glob, re, statistics, sys
d, label = sys.argv[1], sys.argv[2]
lat = sorted(int(l.split()[2]) / 1000 for f in glob.glob(f"{d}/{label}.*") if not f.endswith(".out") for l in open(f) if l.strip())
out = open(f"{d}/{label}.out").read()
tps = re.search(r"tps = ([\d.]+)", out).group(1)
failed = re.search(r"number of failed transactions: (\d+)", out).group(1)
p99 = lat[int(len(lat) * 0.99) - 1]
print(f"{label:7} tps {float(tps):8.0f}  latency avg {statistics.mean(lat):6.2f} ms  p99 {p99:7.2f} ms  max {lat[-1]:8.1f} ms  failed {failed}")
print(p99, file=open(f"{d}/{label}.p99", "w"))
PY
}
bench before; summary before
bench during & bp=$!
sleep 2
"$RESEQ" -q rewrite "$WORK/mnt/data/base" --json --max-freeze "$BUDGET" --state-dir "$WORK/state" > "$WORK/reseq.json"
wait $bp; summary during
python3 - "$WORK/reseq.json" "$WORK/log" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
d = sys.argv[2]
before, during = (float(open(f"{d}/{x}.p99").read()) for x in ("before", "during"))
print(f"reseq:  {r['windows']} windows, {r['total_frozen_seconds']:.2f} s frozen, longest {r['longest_freeze_seconds']:.3f} s, {r['bytes_written'] / 2**20:.0f} MiB rewritten")
print(f"p99 during / before = {during / before:.2f}  (goal <= 3)")
PY
runuser -u postgres -- psql -q "${CONN[@]}" -c "CREATE EXTENSION IF NOT EXISTS amcheck" postgres
if PG pg_amcheck "${CONN[@]}" --all --heapallindexed > "$WORK/amcheck.log" 2>&1; then echo "amcheck: clean"; else echo "amcheck: FAILED"; head -20 "$WORK/amcheck.log"; fi
