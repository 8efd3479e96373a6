#!/usr/bin/env bash
# The host's side of the fleet scenario (tests/vm/guest/scenarios.sh, scenario_fleet),
# run by run.sh when the guest asks (results/fleet-PHASE.request on the share):
#
#   fleet-host.sh PHASE    good, failed: ansible-playbook packaging/ansible/reseq.yml over
#                          SSH into the guest (the forwarded port), with the extra vars
#                          the guest wrote (results/fleet-PHASE.vars.json), the .deb built
#                          on this host, and reseq_run_now: the job runs and its report
#                          and metrics are fetched into results/fleet-PHASE/ (failed:
#                          the playbook from its run-now task)
#                          alerts: `promtool test rules` with the shipped alert rules on
#                          the two metrics files fetched (fleet-alerts.py)
#
# Its exit code goes to results/fleet-PHASE.rc, its output to results/fleet-PHASE.log.
# Environment (from run.sh): FLEET (this run's key, inventory, .deb), SHARE, PORT, REPO.
set -uo pipefail
phase=$1
res=$SHARE/results
here=$(cd "$(dirname "$0")" && pwd)

case $phase in
  good|failed)
    # The guest's host key, as the guest read it: the connection is checked against it.
    key=$(cat "$res/fleet-hostkey.pub") || { echo "no host key from the guest"; exit 1; }
    echo "[127.0.0.1]:$PORT $key" >"$FLEET/known_hosts"
    # Ansible's SSH multiplexing: one connection for the run, closed at its end (no
    # master left behind); pipelining: one SSH round trip a task.
    ctl="$FLEET/ssh-%C"
    cat >"$FLEET/inventory" <<INV
fleetvm ansible_host=127.0.0.1 ansible_port=$PORT ansible_user=root ansible_python_interpreter=/usr/bin/python3 ansible_ssh_private_key_file=$FLEET/key ansible_ssh_common_args='-o UserKnownHostsFile=$FLEET/known_hosts -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes'
INV
    # The first pass (good) runs the whole playbook, the run polled in the background as
    # by default. The second (failed) reruns the job on the installed host, as an admin
    # reruns a job across a fleet: from the run-now task, waiting on the connection
    # (reseq_run_timeout=0; each poll is a module run, seconds in the emulated guest).
    from=(-e reseq_run_poll=3)
    [ "$phase" = good ] || from=(--start-at-task "Run the job now and wait for it to end" -e reseq_run_timeout=0)
    t0=$(date +%s.%N)
    # A connection timeout past the longest pause of the guest (tests/run-all.sh stops it
    # while a Rust test measures: up to 100 s), not Ansible's 10 s.
    ANSIBLE_TIMEOUT=300 ANSIBLE_PIPELINING=True ANSIBLE_NOCOLOR=1 ANSIBLE_RETRY_FILES_ENABLED=False \
      ANSIBLE_LOCAL_TEMP="$FLEET/ansible-tmp" ANSIBLE_SSH_ARGS="-o ControlMaster=auto -o ControlPersist=60s" \
      ANSIBLE_SSH_CONTROL_PATH="${ctl//%/%%}" \
      ansible-playbook -i "$FLEET/inventory" "$REPO/packaging/ansible/reseq.yml" \
        -e "@$res/fleet-$phase.vars.json" -e "reseq_deb=$FLEET/reseq.deb" \
        -e "reseq_reports_dir=$res/fleet-$phase" -e reseq_run_now=true "${from[@]}" 2>&1 |
      while IFS= read -r line; do printf '%6.1f %s\n' "$(awk "BEGIN{print $(date +%s.%N) - $t0}")" "$line"; done
    rc=${PIPESTATUS[0]}
    ssh -o ControlPath="$ctl" -p "$PORT" -O exit root@127.0.0.1 2>/dev/null || true
    exit "$rc"
    ;;
  alerts)
    python3 "$here/fleet-alerts.py" "$REPO/packaging/prometheus/reseq-alerts.yml" \
      "$res/fleet-good/fleetvm-fleet.prom" "$res/fleet-failed/fleetvm-fleet.prom" "$FLEET"
    ;;
  *) echo "fleet-host.sh: no phase $phase"; exit 2 ;;
esac
