#!/usr/bin/env bash
# Runs in the guest (from reseq-vm.service, as PID 1's child): the scenarios it claims, in
# the order given, each on wiped scratch disks (or on the setup the one before left, where
# they share it: scenarios.sh fixture_of), under its own timeout; results go back on the
# share. A second guest (run.sh's, booted when the Rust tests end) shares the list: each
# scenario runs once, in the guest that claims it first (an mkdir on the share, which the
# host makes atomically). The unit powers the guest off when this returns, whatever
# happened.
share=$1
# shellcheck disable=SC1091
. "$share/params"
res=$share/results
export RESEQ_SHARE=$share
# Which guest this is (run.sh's kernel command line): 1 or 2. The second guest's scratch
# disk images on the host are disk-2a.img and so on (for the host's cache dropper).
g=$(sed -n 's/.*reseq\.guest=\([0-9]*\).*/\1/p' /proc/cmdline)
g=${g:-1}
export RESEQ_VM_DISKS=
[ "$g" = 1 ] || RESEQ_VM_DISKS=$g
# How long the guest took to get here (kernel, initrd, systemd), for run.sh's timing line.
cut -d' ' -f1 /proc/uptime >"$res/boot-$g.seconds"
# The binary as packaged: /usr/bin/reseq, where the shipped unit expects it.
install -m 755 "$share/reseq" /usr/bin/reseq
t0=$(date +%s.%N)
echo "reseq-vm: guest $g, kernel $(uname -r), systemd $(systemctl --version | sed -n '1s/systemd \([0-9]*\).*/\1/p'), scenarios: $SCENARIOS" >&2
secs() { awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $1}"; }
read -ra list <<<"$SCENARIOS"
# The scenarios that time reads (a verdict): the host's load moves their figures.
MEASURING="host_cache_verdict"
# The index of the first scenario from $1 on that this guest claims, or nothing. The
# fleet scenario's network (an SSH port forwarded from the host) is the first guest's.
claim_from() {
  local j
  for ((j = $1; j < ${#list[@]}; j++)); do
    [ "$g" = 1 ] || [ "${list[$j]}" != fleet ] || continue
    if mkdir "$res/claim-${list[$j]}" 2>/dev/null; then
      echo "$g" >"$res/claim-${list[$j]}/by"
      echo "$j"
      return
    fi
  done
}
# Wiped disks for the first scenario (the harness made them: only a check); each one's
# teardown wipes them for the next.
bash "$share/guest/scenarios.sh" teardown >/dev/null 2>&1
i=$(claim_from 0)
ran=0
while [ -n "$i" ]; do
  s=${list[$i]}
  t=$(date +%s.%N)
  # The fleet and scale_ scenarios have timeouts of their own (run.sh: Ansible in the
  # emulated guest; a database's count of files).
  to=$SCENARIO_TIMEOUT
  [ "$s" != fleet ] || to=${FLEET_TIMEOUT:-$SCENARIO_TIMEOUT}
  [[ $s != scale_* ]] || to=${SCALE_TIMEOUT:-$SCENARIO_TIMEOUT}
  # A scenario that measures by the clock waits until the host has no Rust tests running
  # (run.sh's RESEQ_VM_QUIET), for as long as the guest's watchdog allows.
  if [ "$WAIT_QUIET" = 1 ] && [[ " $MEASURING " == *" $s "* ]]; then
    w=$(date +%s)
    until [ -e "$res/quiet" ]; do sleep 1; done
    echo "reseq-vm: $s waited $(( $(date +%s) - w )) s for the host's tests to end" >&2
  fi
  # timeout signals its whole process group: the scenario and what it started.
  timeout --kill-after=5 "$to" bash "$share/guest/scenarios.sh" "$s" >"$res/$s.log" 2>&1
  rc=$?
  took=$(secs "$t")
  # The next one claimed before the teardown: only a scenario that passed leaves its
  # setup to it (a failed one may have left it broken).
  n=$(claim_from $((i + 1)))
  next=
  [ $rc != 0 ] || [ -z "$n" ] || next=${list[$n]}
  t=$(date +%s.%N)
  bash "$share/guest/scenarios.sh" teardown "$next" >>"$res/$s.log" 2>&1
  td=$(secs "$t")
  echo "teardown: $td s" >>"$res/$s.log"
  on=
  [ "$g" = 1 ] || on=", guest $g"
  case $rc in
    0) echo "pass ${took} s, teardown ${td} s$on" >"$res/$s.result" ;;
    124|137) echo "fail: timed out after ${to} s$on" >"$res/$s.result" ;;
    *) echo "fail: exit $rc after ${took} s$on: $(grep '^FAIL' "$res/$s.log" | head -1)" >"$res/$s.result" ;;
  esac
  echo "reseq-vm: $s: $(cat "$res/$s.result")" >&2
  ran=$((ran + 1))
  i=$n
done
# A filesystem left frozen would hang the sync (and the power-off): say so.
timeout 30 sync || echo "sync did not return within 30 s: a filesystem left frozen?" >"$res/guest-$g.error"
echo "reseq-vm: guest $g: $ran scenarios, all done in $(awk "BEGIN{printf \"%.0f\", $(date +%s.%N) - $t0}") s" >&2
echo "$(secs "$t0") $ran" >"$res/scenarios-$g.seconds"
