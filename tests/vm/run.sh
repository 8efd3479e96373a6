#!/usr/bin/env bash
# The VM tests: real LVM, thin pools, dm-crypt, md RAID and systemd as PID 1, which this
# host's kernel may not have. Boots a Debian 12 guest (built once by build-guest.sh and
# cached outside the checkout) under qemu, hands it the reseq binary and the scenarios
# (tests/vm/guest/) over a 9p share, and reads the results back.
#
#   bash tests/vm/run.sh [SCENARIO...]       all scenarios, or those named
#
# Environment: RESEQ_BIN (the binary to test; default: `cargo build` and target/debug),
# RESEQ_VM_ACCEL (tcg, the default, or kvm), RESEQ_VM_TIMEOUT (seconds for the whole
# boot, default 240 plus 60 per scenario plus the fleet's and any scale_ one's; the
# guest's own watchdog ends its run 3600 s after boot), RESEQ_VM_SCENARIO_TIMEOUT
# (seconds per scenario, default 240), RESEQ_VM_FLEET_TIMEOUT (the fleet scenario's,
# default 480), RESEQ_VM_SCALE_TIMEOUT (a scale_ scenario's, default 900),
# RESEQ_VM_QMP (a directory: each guest's QMP socket there, see below),
# RESEQ_VM_GUESTS (1 or 2, the default: a second guest shares out the scenarios, see below),
# RESEQ_VM_QUIET (a path: the second guest and the scenarios that measure wait until a
# file appears there),
# RESEQ_VM_KEEP=1 keeps the share (logs, reports) for a look afterwards; RESEQ_VM_LOGS=1
# prints the log of every scenario, passed ones too.
# The fleet scenario also needs, on this host: cargo-deb (the .deb it installs),
# ansible-playbook, ssh and ssh-keygen, python3 and promtool (tests/run-all.sh installs
# them); the guest is then reached over SSH on a forwarded port of 127.0.0.1.
# Under CI=true anything missing fails; otherwise each scenario is reported skipped, by
# name. Needs root (it installs qemu and debootstrap when they are missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ci=${CI:-false}

mapfile -t all < <(sed -n 's/^scenario_\([a-z0-9_]*\)() *{.*/\1/p' "$here/guest/scenarios.sh")
if [ $# -gt 0 ]; then
  for s in "$@"; do printf '%s\n' "${all[@]}" | grep -qx "$s" || { echo "vm: no scenario $s (have: ${all[*]})" >&2; exit 2; }; done
  scenarios=("$@")
else
  # The scale_ scenarios run when named, by hand: they are for the figures a database's
  # size gives (minutes of guest time each), not for every run; the suite's own check of
  # the same path is smaller (systemd_many_files) and the host's tests/it/scale.rs.
  mapfile -t scenarios < <(printf '%s\n' "${all[@]}" | grep -v '^scale_')
  for s in "${all[@]}"; do
    [[ $s != scale_* ]] || echo "vm: $s runs when named: bash tests/vm/run.sh $s" >&2
  done
fi
# The fleet scenario first: the longest, and it needs the first guest's network, so a
# second guest (RESEQ_VM_GUESTS, below) shares out the short ones after it.
if printf '%s\n' "${scenarios[@]}" | grep -qx fleet; then
  mapfile -t scenarios < <(echo fleet; printf '%s\n' "${scenarios[@]}" | grep -vx fleet)
fi

skip_all() {
  if [ "$ci" = true ]; then
    echo "vm: FAILED (CI=true, nothing may be skipped): $1" >&2
    exit 1
  fi
  for s in "${scenarios[@]}"; do echo "vm_$s ... skipped ($1)"; done
  echo "vm: 0 passed, 0 failed, ${#scenarios[@]} skipped"
  exit 0
}

[ "$(id -u)" = 0 ] || skip_all "not root"
# The fleet scenario's host tools: missing ones fail it under CI=true, else skip it alone.
fleet=false fleet_skip=
for s in "${scenarios[@]}"; do [ "$s" = fleet ] && fleet=true; done
if $fleet; then
  lacks=()
  for t in cargo-deb ansible-playbook ssh ssh-keygen python3 promtool; do command -v "$t" >/dev/null || lacks+=("$t"); done
  if [ ${#lacks[@]} -gt 0 ]; then
    [ "$ci" != true ] || { echo "vm: FAILED (CI=true, nothing may be skipped): the fleet scenario needs ${lacks[*]} on this host (tests/run-all.sh installs them)" >&2; exit 1; }
    fleet=false fleet_skip="no ${lacks[*]} on this host"
    mapfile -t scenarios < <(printf '%s\n' "${scenarios[@]}" | grep -vx fleet)
    [ ${#scenarios[@]} -gt 0 ] || { echo "vm_fleet ... skipped ($fleet_skip)"; echo "vm: 0 passed, 0 failed, 1 skipped"; exit 0; }
  fi
fi
if ! command -v qemu-system-x86_64 >/dev/null; then
  echo "vm: installing qemu-system-x86" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null; } \
    || skip_all "no emulator: qemu-system-x86 could not be installed"
fi
t_guest=$(date +%s)
guest=$(bash "$here/build-guest.sh") || skip_all "the guest image could not be built (tests/vm/build-guest.sh)"
t_guest=$(( $(date +%s) - t_guest ))

if [ -z "${RESEQ_BIN:-}" ]; then
  (cd "$repo" && cargo build --quiet --bin reseq)
  RESEQ_BIN="${CARGO_TARGET_DIR:-$repo/target}/debug/reseq"
fi
[ -x "$RESEQ_BIN" ] || { echo "vm: no reseq binary at $RESEQ_BIN" >&2; exit 1; }

accel=${RESEQ_VM_ACCEL:-tcg}
# 240 s: thin_snapshot (three rewrites, four hash checks, two fscks) took 40-132 s in
# past runs, and 148 s of checks, then its timeout at 150, under bench/load.sh.
scenario_timeout=${RESEQ_VM_SCENARIO_TIMEOUT:-240}
# The fleet scenario drives Ansible into the emulated guest, where every module is a
# Python start of seconds: a timeout of its own, and as much again for the boot.
fleet_timeout=${RESEQ_VM_FLEET_TIMEOUT:-480}
extra=0
if $fleet; then extra=$fleet_timeout; fi
# A scale_ scenario's own timeout, as much again for the boot.
scale_timeout=${RESEQ_VM_SCALE_TIMEOUT:-900}
for s in "${scenarios[@]}"; do [[ $s != scale_* ]] || extra=$(( extra + scale_timeout )); done
# RESEQ_VM_QMP: a directory where each guest has its QMP socket (guest-G.sock), through
# which the Rust tests that measure stop every guest while they do (tests/run-all.sh runs
# both side by side); its clock stops too, but this host's timeout runs on: it allows as
# long again for the pauses.
# Beside them, the emulator runs at nice 10. That ranks it only against the processes of
# its own session: the kernel shares the CPU between sessions first (autogroups, on where
# /proc/sys/kernel/sched_autogroup_enabled is 1, as here and on CI), and tests/run-all.sh
# runs each step, the Rust tests too, in a session of its own. Two busy loops on one CPU
# in two sessions, one at nice 10, took 50 % each; in one session, 90 and 10 %. So the
# guests and the Rust tests share the CPUs evenly, and the Rust tests pass under that.
qmp() { :; }
pausable=0
nice=()
if [ -n "${RESEQ_VM_QMP:-}" ]; then
  mkdir -p "$RESEQ_VM_QMP"
  qmp() { echo -qmp "unix:$RESEQ_VM_QMP/guest-$1.sock,server=on,wait=off"; }
  pausable=1
  nice=(nice -n 10)
fi
boot_timeout=${RESEQ_VM_TIMEOUT:-$(( (240 + 60 * ${#scenarios[@]} + extra) * (1 + pausable) ))}

work=$(mktemp -d /tmp/reseq-vm.XXXXXX)
qpid=
# Whether PID $1 is still this run's (its command line names $work): a PID read from a
# file or kept from `$!` may have been reaped and reused since.
ours() { [ -n "$1" ] && grep -qF "$work" "/proc/$1/cmdline" 2>/dev/null; }
# A process and all its descendants (listed first, then signalled together).
killtree() {
  local pids=("$1") i=0
  while [ "$i" -lt ${#pids[@]} ]; do mapfile -t -O ${#pids[@]} pids < <(pgrep -P "${pids[$i]}"); i=$((i + 1)); done
  kill "${pids[@]}" 2>/dev/null || true
}
# A guest's `timeout` (TERM, which it passes on to qemu, then KILL), then its qemu.
stop_guest() { # TIMEOUT_PID QEMU_PIDFILE
  local t=$1 q
  if ours "$t"; then
    kill -TERM "$t" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do ours "$t" || break; sleep 0.5; done
    ! ours "$t" || kill -KILL "$t" 2>/dev/null || true
  fi
  q=$(cat "$2" 2>/dev/null) || true
  if ours "$q"; then kill -KILL "$q" 2>/dev/null || true; fi
}
cleanup() {
  local rc=$?
  # Never leave an emulator running: it owns the scratch disks. The second guest's
  # launcher first, so that it starts none after this.
  if [ -n "${second:-}" ]; then kill "$second" 2>/dev/null || true; wait "$second" 2>/dev/null || true; fi
  stop_guest "$qpid" "$work/qemu.pid"
  stop_guest "$(cat "$work/timeout-2.pid" 2>/dev/null)" "$work/qemu-2.pid"
  if [ -n "${dropper:-}" ]; then kill "$dropper" 2>/dev/null || true; fi
  # The fleet's helper, and a playbook it may be running (stopped with the guest gone).
  if [ -n "${fleeter:-}" ]; then killtree "$fleeter"; fi
  if [ "${RESEQ_VM_KEEP:-0}" = 1 ]; then
    echo "vm: kept $work" >&2
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

share=$work/share
mkdir -p "$share/results" "$share/packaging"
cp -r "$here/guest" "$share/guest"
cp "$RESEQ_BIN" "$share/reseq"
cp "$repo"/packaging/systemd/reseq@.service "$repo"/packaging/systemd/reseq@.timer "$share/packaging/"
{
  echo "SCENARIOS='${scenarios[*]}'"
  echo "SCENARIO_TIMEOUT=$scenario_timeout"
  echo "FLEET_TIMEOUT=$fleet_timeout"
  echo "SCALE_TIMEOUT=$scale_timeout"
  echo "WAIT_QUIET=$([ -n "${RESEQ_VM_QUIET:-}" ] && echo 1 || echo 0)"
  echo "export RESEQ_VM_SLACK=$([ "$accel" = tcg ] && echo 1.5 || echo 0.3)"
} >"$share/params"
# The fleet scenario: the .deb the playbook installs (cargo deb, of the binary under
# test), a key for this run only, and a free port of
# the loopback forwarded to the guest's SSH server (user-mode networking: the guest
# reaches nothing else, restrict=on).
net=()
if $fleet; then
  FLEET=$work/fleet
  mkdir -p "$FLEET"
  t_deb=$(date +%s)
  "$RESEQ_BIN" generate "$repo/target/generated" >/dev/null
  # The binary under test, packaged (no release build: the package's files and scripts
  # are what the fleet installs; the binary is the one every scenario runs).
  # cargo deb takes the binary from $CARGO_TARGET_DIR/debug: a copy in the run's own
  # directory, so that no build of the checkout's is touched.
  mkdir -p "$FLEET/target/debug"
  cp "$RESEQ_BIN" "$FLEET/target/debug/reseq"
  (cd "$repo" && CARGO_TARGET_DIR=$FLEET/target cargo deb --quiet --fast --no-build --profile dev \
    --output "$FLEET/reseq.deb" >/dev/null) || { echo "vm: cargo deb failed" >&2; exit 1; }
  echo "vm: built the .deb (reseq $(dpkg-deb -f "$FLEET/reseq.deb" Version)) in $(( $(date +%s) - t_deb )) s" >&2
  ssh-keygen -q -t ed25519 -N '' -C reseq-vm-fleet -f "$FLEET/key"
  cp "$FLEET/key.pub" "$share/fleet-key.pub"
  PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  net=(-netdev "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:$PORT-:22" -device virtio-net-pci,netdev=net0)
  # The guest asks for each phase (results/fleet-PHASE.request); the answer is
  # results/fleet-PHASE.rc and .log, then .done.
  (
    while sleep 0.2; do
      for req in "$share"/results/fleet-*.request; do
        [ -e "$req" ] || continue
        p=${req##*/fleet-}; p=${p%.request}
        rc=0
        FLEET=$FLEET SHARE=$share PORT=$PORT REPO=$repo "${nice[@]}" bash "$here/fleet-host.sh" "$p" >"$share/results/fleet-$p.log" 2>&1 || rc=$?
        echo "$rc" >"$share/results/fleet-$p.rc"
        # Removed only now: a request removed while the guest still creates it (over
        # 9p) fails the guest's write.
        rm -f "$req"
        touch "$share/results/fleet-$p.done"
      done
    done
  ) &
  fleeter=$!
fi

# Scratch disks: sparse files, SCSI disks that report no rotation (an SSD), and a small
# NVMe controller (its SMART log counts data units written), with serials the guest
# picks them by; it never touches any other disk. The second guest's images are
# disk-2a.img and so on (guest/run.sh: RESEQ_VM_DISKS).
disks_of() { # PREFIX: sets disks
  local n
  disks=()
  # The many-files ext4, made on the host (many_fs, below): each guest writes to a
  # temporary copy of its own (snapshot=on), so the image is shared and never written.
  if [ -n "${many:-}" ]; then
    disks+=(-drive "file=$many/many.img,if=none,id=dmany,format=raw,snapshot=on,cache=unsafe,discard=unmap"
            -device "scsi-hd,drive=dmany,bus=scsi0.0,serial=reseq-many,rotation_rate=1")
  fi
  for n in a b c; do
    truncate -s 1G "$work/disk-$1$n.img"
    disks+=(-drive "file=$work/disk-$1$n.img,if=none,id=d$n,format=raw,cache=unsafe,discard=unmap"
            -device "scsi-hd,drive=d$n,bus=scsi0.0,serial=reseq-$n,rotation_rate=1")
  done
  truncate -s 128M "$work/disk-$1nvme.img"
  disks+=(-drive "file=$work/disk-$1nvme.img,if=none,id=dnvme,format=raw,cache=unsafe,discard=unmap"
          -device "nvme,serial=reseq-nvme,drive=dnvme")
}

# The host's side of a scenario that needs a cold host cache: the guest names a scratch
# disk in results/drop-X.request; its image is flushed and dropped from this host's page
# cache (only that file's pages), and results/drop-X.done says so.
(
  while sleep 0.2; do
    for req in "$share"/results/drop-*.request; do
      [ -e "$req" ] || continue
      n=${req##*/drop-}; n=${n%.request}
      img=$work/disk-$n.img
      if [ -f "$img" ]; then sync "$img"; dd if="$img" iflag=nocache count=0 status=none; fi
      rm -f "$req"; touch "$share/results/drop-$n.done"
    done
    # RESEQ_VM_QUIET: tests/run-all.sh's Rust tests have ended (guest/run.sh waits for it
    # before a scenario that measures by the clock: the host's load moved the guest's
    # reads x3 between a benchmark's before and after, two guests and the tests beside).
    if [ -n "${RESEQ_VM_QUIET:-}" ] && [ -e "$RESEQ_VM_QUIET" ] && [ ! -e "$share/results/quiet" ]; then
      touch "$share/results/quiet"
    fi
  done
) &
dropper=$!

# The scale_many_files scenario's filesystem: 100,000 files of 4 KiB in 100
# directories of d/, made once on this host with mkfs.ext4 -d (in the guest, under TCG,
# making them took 142 s) and kept in RESEQ_VM_CACHE-many; their hashes (sha256sum,
# relative to d/) beside it. The bytes come from a fixed seed: the same on every host.
many_fs() {
  local dir=${RESEQ_VM_CACHE:-/var/cache/reseq-vm}-many/v1 t
  if [ ! -f "$dir/ready" ]; then
    t=$(date +%s)
    rm -rf "$dir.tmp"; mkdir -p "$dir.tmp/src/d"
    python3 -c '
import os, random, sys
rnd = random.Random(100000)
for d in range(100):
    sub = os.path.join(sys.argv[1], "%03d" % d)
    os.mkdir(sub)
    for f in range(1000):
        with open(os.path.join(sub, "f%03d" % f), "wb") as out:
            out.write(rnd.randbytes(4096))
' "$dir.tmp/src/d"
    (cd "$dir.tmp/src/d" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$dir.tmp/manifest"
    truncate -s 1G "$dir.tmp/many.img"
    mkfs.ext4 -q -F -N 110000 -E lazy_itable_init=0,lazy_journal_init=0 -d "$dir.tmp/src" "$dir.tmp/many.img" >&2
    rm -rf "$dir.tmp/src"
    rm -rf "$dir"; mv "$dir.tmp" "$dir"; touch "$dir/ready"
    echo "vm: made the many-files ext4 (100,000 files) in $(( $(date +%s) - t )) s" >&2
  fi
  echo "$dir"
}
many=
if printf '%s\n' "${scenarios[@]}" | grep -qx scale_many_files; then
  many=$(many_fs)
  cp "$many/manifest" "$share/many.manifest"
fi

# One guest: G (1 or 2), its timeout, then qemu's own arguments (network, QMP). The root
# image is shared read-only (snapshot=on: each guest writes to a temporary copy).
guest_qemu() { # G TIMEOUT ARGS...
  local g=$1 to=$2 sfx=
  shift 2
  [ "$g" = 1 ] || sfx=-$g
  disks_of "${sfx#-}"
  # exec: the caller's `$!` is this timeout, whose command line names $work (ours).
  exec timeout --kill-after=10 "$to" "${nice[@]}" qemu-system-x86_64 \
    -accel "$accel$([ "$accel" = tcg ] && echo ,thread=multi)" -cpu max -smp 2 -m 2G \
    -nodefaults -no-reboot -display none -monitor none \
    -pidfile "$work/qemu$sfx.pid" \
    -serial "file:$work/console$sfx.log" \
    -kernel "$guest/vmlinuz" -initrd "$guest/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 panic=1 loglevel=4 net.ifnames=0 reseq.guest=$g" \
    -drive "file=$guest/root.img,if=virtio,format=raw,snapshot=on,cache=unsafe" \
    -device virtio-scsi-pci,id=scsi0 "${disks[@]}" \
    -virtfs "local,path=$share,mount_tag=vmshare,security_model=none,id=vmshare" "$@"
}

# RESEQ_VM_GUESTS=2 (the default): a second guest boots and takes the scenarios the
# first has not claimed (guest/run.sh), when 3 or more are left besides the fleet's
# (booting costs half a minute of CPU): at once, or, with RESEQ_VM_QUIET, when the Rust
# tests have ended. Booted beside them, it cut the suite from 1,252 to 1,141 s, but the
# host's CPUs were then all busy (pressure 0.5-0.9) and two of the Rust tests' freeze
# windows overran in one run of two: the CPU the Rust tests leave is not enough for two.
second=
if [ "${RESEQ_VM_GUESTS:-2}" = 2 ]; then
  (
    # The first guest ended (or never booted): nothing to share.
    until [ -z "${RESEQ_VM_QUIET:-}" ] || [ -e "$RESEQ_VM_QUIET" ]; do
      [ ! -e "$work/first.done" ] || exit 0
      sleep 1
    done
    left=0
    for s in "${scenarios[@]}"; do
      [ "$s" = fleet ] || [ -d "$share/results/claim-$s" ] || left=$((left + 1))
    done
    [ "$left" -ge 3 ] || exit 0
    date +%s >"$work/second.start"
    # Each scenario may take its whole timeout, two emulators sharing the CPU, and as
    # long again for the Rust tests' pauses.
    # Signalled (run.sh's cleanup), the launcher stops its own guest: its child, not yet
    # reaped, so the PID is still that timeout's.
    t=
    trap '[ -z "$t" ] || { kill "$t" 2>/dev/null; wait "$t"; }; exit 143' TERM
    # shellcheck disable=SC2046
    guest_qemu 2 "$(( (240 + scenario_timeout * left) * (1 + pausable) ))" $(qmp 2) &
    t=$!
    echo "$t" >"$work/timeout-2.pid"
    rc=0
    wait "$t" || rc=$?
    echo "$rc" >"$work/second.rc"
  ) &
  second=$!
fi

echo "vm: booting the guest ($guest, accel $accel, ${#scenarios[@]} scenarios, ${boot_timeout} s at most)" >&2
t_boot=$(date +%s)
t_boot0=$t_boot
set +e
# shellcheck disable=SC2046
guest_qemu 1 "$boot_timeout" "${net[@]}" $(qmp 1) &
qpid=$!
wait "$qpid"
qrc=$?
qpid=
t_boot=$(( $(date +%s) - t_boot ))
touch "$work/first.done"
if [ -n "$second" ]; then wait "$second"; second=; fi
set -e
guest_ok=true
if [ "$qrc" != 0 ]; then
  guest_ok=false
  if [ "$qrc" = 124 ]; then echo "vm: FAILED: the guest did not power off within ${boot_timeout} s: killed" >&2
  else echo "vm: FAILED: qemu exited $qrc" >&2; fi
fi
second_rc=$(cat "$work/second.rc" 2>/dev/null) || second_rc=
if [ -n "$second_rc" ] && [ "$second_rc" != 0 ]; then
  guest_ok=false
  echo "vm: FAILED: the second guest's qemu exited $second_rc$([ "$second_rc" != 124 ] || echo " (it did not power off in time: killed)")" >&2
fi
for g in 1 2; do
  if [ -f "$share/results/guest-$g.error" ]; then guest_ok=false; echo "vm: FAILED: guest $g: $(cat "$share/results/guest-$g.error")" >&2; fi
done

passed=0 failed=0
for s in "${scenarios[@]}"; do
  by=$(cat "$share/results/claim-$s/by" 2>/dev/null) || by=1
  [ "$by" = 1 ] && brc=$qrc || brc=${second_rc:-none}
  r=$(cat "$share/results/$s.result" 2>/dev/null || echo "fail: no result (guest $by stopped before it; qemu exit $brc)")
  case "$r" in
    pass*) passed=$((passed + 1)); echo "vm_$s ... ok (${r#pass })"
       # RESEQ_VM_LOGS=1: the figures of a passing scenario too (for a closing note).
       if [ "${RESEQ_VM_LOGS:-}" = 1 ] && [ -f "$share/results/$s.log" ]; then sed 's/^/    /' "$share/results/$s.log"; fi ;;
    *) failed=$((failed + 1)); echo "vm_$s ... FAILED: $r"
       if [ -f "$share/results/$s.log" ]; then echo "---- vm_$s log (tail)"; tail -n 60 "$share/results/$s.log"; echo "----"; fi ;;
  esac
done
if [ "$failed" -gt 0 ] || [ "$guest_ok" != true ]; then
  for c in "$work"/console*.log; do echo "---- ${c##*/} (tail)"; tail -n 40 "$c" 2>/dev/null || true; echo "----"; done
fi
# Where the time went: building (or finding) the guest, its boot (kernel, initrd and
# systemd up to the scenarios), the scenarios with their teardowns, and the rest
# (power-off, qemu's start and end).
t_up=$(cut -d. -f1 "$share/results/boot-1.seconds" 2>/dev/null || echo "?")
t_sc=$(cut -d' ' -f1 "$share/results/scenarios-1.seconds" 2>/dev/null | cut -d. -f1 || echo "?")
echo "vm: guest ready in ${t_guest} s, boot to power-off ${t_boot} s (guest boot ${t_up} s, scenarios and teardowns ${t_sc} s; qemu exit $qrc)"
if [ -f "$work/second.start" ]; then
  { read -r t2 n2 <"$share/results/scenarios-2.seconds"; } 2>/dev/null || { t2="?"; n2="?"; }
  echo "vm: a second guest from $(( $(cat "$work/second.start") - t_boot0 )) s on: boot $(cut -d. -f1 "$share/results/boot-2.seconds" 2>/dev/null || echo "?") s, $n2 scenarios in ${t2%.*} s"
fi
if [ -n "$fleet_skip" ]; then echo "vm_fleet ... skipped ($fleet_skip)"; echo "vm: $passed passed, $failed failed, 1 skipped"
else echo "vm: $passed passed, $failed failed"; fi
[ "$failed" = 0 ] && [ "$guest_ok" = true ]
