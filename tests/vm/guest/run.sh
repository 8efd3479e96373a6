#!/usr/bin/env bash
# Runs in the guest (from reseq-vm.service, as PID 1's child): every scenario in turn,
# each on wiped scratch disks (or on the setup the one before left, where they share it:
# scenarios.sh fixture_of), under its own timeout; results go back on the share.
# The unit powers the guest off when this returns, whatever happened.
share=$1
# shellcheck disable=SC1091
. "$share/params"
res=$share/results
export RESEQ_SHARE=$share
# How long the guest took to get here (kernel, initrd, systemd), for run.sh's timing line.
cut -d' ' -f1 /proc/uptime >"$res/boot.seconds"
# The binary as packaged: /usr/bin/reseq, where the shipped unit expects it.
install -m 755 "$share/reseq" /usr/bin/reseq
t0=$(date +%s.%N)
echo "reseq-vm: kernel $(uname -r), systemd $(systemctl --version | sed -n '1s/systemd \([0-9]*\).*/\1/p'), scenarios: $SCENARIOS" >&2
secs() { awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $1}"; }
# Wiped disks for the first scenario (the harness made them: only a check); each one's
# teardown wipes them for the next.
bash "$share/guest/scenarios.sh" teardown >/dev/null 2>&1
read -ra list <<<"$SCENARIOS"
for i in "${!list[@]}"; do
  s=${list[$i]} next=${list[$((i + 1))]:-}
  t=$(date +%s.%N)
  # The fleet scenario has a timeout of its own (run.sh: Ansible in the emulated guest).
  to=$SCENARIO_TIMEOUT
  [ "$s" != fleet ] || to=${FLEET_TIMEOUT:-$SCENARIO_TIMEOUT}
  # timeout signals its whole process group: the scenario and what it started.
  timeout --kill-after=5 "$to" bash "$share/guest/scenarios.sh" "$s" >"$res/$s.log" 2>&1
  rc=$?
  took=$(secs "$t")
  # Only a scenario that passed leaves its setup to the next (a failed one may have
  # left it broken).
  [ $rc = 0 ] || next=
  t=$(date +%s.%N)
  bash "$share/guest/scenarios.sh" teardown "$next" >>"$res/$s.log" 2>&1
  td=$(secs "$t")
  echo "teardown: $td s" >>"$res/$s.log"
  case $rc in
    0) echo "pass ${took} s, teardown ${td} s" >"$res/$s.result" ;;
    124|137) echo "fail: timed out after ${to} s" >"$res/$s.result" ;;
    *) echo "fail: exit $rc after ${took} s: $(grep '^FAIL' "$res/$s.log" | head -1)" >"$res/$s.result" ;;
  esac
  echo "reseq-vm: $s: $(cat "$res/$s.result")" >&2
done
# A filesystem left frozen would hang the sync (and the power-off): say so.
timeout 30 sync || echo "sync did not return within 30 s: a filesystem left frozen?" >"$res/guest.error"
echo "reseq-vm: all done in $(awk "BEGIN{printf \"%.0f\", $(date +%s.%N) - $t0}") s" >&2
secs "$t0" >"$res/scenarios.seconds"
