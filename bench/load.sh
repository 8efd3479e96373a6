#!/usr/bin/env bash
# The standard load the test suite must pass under (issue 50): one CPU busy loop at
# nice 10, and a `dd oflag=direct` of 512 MiB written again and again to a file on the
# disk the tests use ($TMPDIR, /tmp by default, where their loop devices' images go).
#
#   bash bench/load.sh [COMMAND ARGS...]    COMMAND under the load (default: the test
#                                           command, bash tests/run-all.sh); the load
#                                           stops when it ends, however it ends
#
# Prints the load average and the host's CPU and I/O pressure (/proc/pressure, avg60)
# once a minute, and at the end COMMAND's exit code (which it exits with).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- bash tests/run-all.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/reseq-load.XXXXXX")
pids=()
stop() {
  [ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

nice -n 10 sh -c 'while :; do :; done' &
pids+=($!)
sh -c 'while :; do dd if=/dev/zero of="$1/dd.img" bs=1M count=512 oflag=direct conv=notrunc status=none || exit; done' \
  sh "$work" &
pids+=($!)
avg60() { sed -n 's/^some avg10=[0-9.]* avg60=\([0-9.]*\).*/\1/p' "/proc/pressure/$1" 2>/dev/null || echo "?"; }
(
  while sleep 60; do
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg), pressure avg60 CPU $(avg60 cpu) % I/O $(avg60 io) %" >&2
  done
) &
pids+=($!)

echo "load: a busy loop at nice 10 and dd oflag=direct of 512 MiB in $work, looping" >&2
rc=0
"$@" || rc=$?
echo "load: $* exited $rc" >&2
exit "$rc"
