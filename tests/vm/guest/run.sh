#!/usr/bin/env bash
# Runs in the guest (from reseq-vm.service, as PID 1's child): every scenario in turn,
# each on wiped scratch disks, under its own timeout; results go back on the share.
# The unit powers the guest off when this returns, whatever happened.
share=$1
# shellcheck disable=SC1091
. "$share/params"
res=$share/results
export RESEQ_SHARE=$share
# The binary as packaged: /usr/bin/reseq, where the shipped unit expects it.
install -m 755 "$share/reseq" /usr/bin/reseq
t0=$(date +%s.%N)
echo "reseq-vm: kernel $(uname -r), systemd $(systemctl --version | sed -n '1s/systemd \([0-9]*\).*/\1/p'), scenarios: $SCENARIOS" >&2
# Wiped disks for the first scenario; each one's teardown wipes them for the next.
bash "$share/guest/scenarios.sh" teardown >/dev/null 2>&1
for s in $SCENARIOS; do
  t=$(date +%s.%N)
  # timeout signals its whole process group: the scenario and what it started.
  timeout --kill-after=5 "$SCENARIO_TIMEOUT" bash "$share/guest/scenarios.sh" "$s" >"$res/$s.log" 2>&1
  rc=$?
  secs=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t}")
  case $rc in
    0) echo "pass ${secs} s" >"$res/$s.result" ;;
    124|137) echo "fail: timed out after ${SCENARIO_TIMEOUT} s" >"$res/$s.result" ;;
    *) echo "fail: exit $rc after ${secs} s: $(grep '^FAIL' "$res/$s.log" | head -1)" >"$res/$s.result" ;;
  esac
  echo "reseq-vm: $s: $(cat "$res/$s.result")" >&2
  t=$(date +%s.%N)
  bash "$share/guest/scenarios.sh" teardown >>"$res/$s.log" 2>&1
  echo "teardown: $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t}") s" >>"$res/$s.log"
done
# A filesystem left frozen would hang the sync (and the power-off): say so.
timeout 30 sync || echo "sync did not return within 30 s: a filesystem left frozen?" >"$res/guest.error"
echo "reseq-vm: all done in $(awk "BEGIN{printf \"%.0f\", $(date +%s.%N) - $t0}") s" >&2
