#!/usr/bin/env bash
# The test command: installs what the tests need (Debian packages), then checks
# formatting and lints and runs every test. Needs root: the tests attach loop devices,
# make and mount ext4/xfs, and freeze them. Under CI=true a missing requirement fails.
set -euo pipefail
cd "$(dirname "$0")/.."

t0=$(date +%s)
if [ "$(id -u)" != 0 ]; then
  echo "tests/run-all.sh: run as root (loop devices, mounts, FIFREEZE)" >&2
  exit 2
fi

# Tool -> Debian package that provides it.
declare -A need=(
  [mkfs.xfs]=xfsprogs [xfs_repair]=xfsprogs
  [mkfs.ext4]=e2fsprogs [e2fsck]=e2fsprogs
  [losetup]=mount [fsfreeze]=util-linux [setpriv]=util-linux [partx]=util-linux
  [mkswap]=util-linux [swapon]=util-linux [unshare]=util-linux
  [sfdisk]=fdisk [mksquashfs]=squashfs-tools
  [chromium]=chromium
  [groff]=groff-base [man]=man-db
  [mkfs.btrfs]=btrfs-progs [btrfs]=btrfs-progs [fallocate]=util-linux
  [systemd-analyze]=systemd
  [script]=bsdutils [pkill]=procps [killall]=psmisc [timeout]=coreutils
  [python3]=python3 [ssh]=openssh-client [ssh-keygen]=openssh-client [dpkg-deb]=dpkg
)
missing=()
for tool in "${!need[@]}"; do
  command -v "$tool" >/dev/null || missing+=("${need[$tool]}")
done
# PostgreSQL (for the file-mode test under pgbench) has no tool on PATH to probe.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
# PyYAML for the manifests' parse test, in the python3 on PATH; and the module that makes
# virtual environments (for the PyPI tools below), which Debian packages apart.
command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
command -v python3 >/dev/null && python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  echo "installing: $pkgs"
  apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs >/dev/null
fi
# promtool, for the test of the shipped alert rules, comes only in Debian's prometheus
# package: installed without its recommends (the node exporter), and where systemd runs,
# the server the package enables and starts is stopped and disabled again (the tests
# need only promtool).
if ! command -v promtool >/dev/null; then
  echo "installing: prometheus (for promtool)"
  [ ${#missing[@]} -gt 0 ] || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if [ -d /run/systemd/system ]; then systemctl disable --now prometheus.service >/dev/null 2>&1 || true; fi
fi

# The no-silent-loss tests put a loop device on a FUSE filesystem (a real kernel fault
# path): the fuse module must be loaded.
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || echo "warning: no /dev/fuse (modprobe fuse failed); the FUSE fault tests will fail under CI=true" >&2

# Time by part, printed at the end (CI must stay under 20 minutes).
times=()
took() { times+=("$1 $(( $(date +%s) - t_part )) s"); t_part=$(date +%s); }
t_part=$t0
took "packages"

# The VM guest (tests/vm/build-guest.sh: debootstrap, mostly downloads and disk) is
# built in the background while the Rust tests run; tests/vm/run.sh waits for it (the
# build holds a lock) or finds it cached.
guest_log=$(mktemp /tmp/reseq-guest-build.XXXXXX)
{
  command -v qemu-system-x86_64 >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null
  bash tests/vm/build-guest.sh
} >"$guest_log" 2>&1 &
guest_build=$!

# The packaging tests build the .deb with cargo-deb (crates.io); the VM's fleet scenario
# installs it with the Ansible playbook (ansible-core, PyPI), and the CronJob is
# validated against the Kubernetes API's schemas offline (kubernetes-validate, PyPI,
# which ships them). The PyPI tools go into a virtual environment of their own,
# $venv, linked into /usr/local/bin: Debian's python3 refuses `pip install`
# ("externally-managed-environment"), and this leaves it alone. Each only where its
# command is missing (a python3 of your own with ansible-core is used as it is).
command -v cargo-deb >/dev/null || cargo install --locked --quiet cargo-deb
venv=/var/cache/reseq-venv
pypi() { # COMMAND PACKAGE
  command -v "$1" >/dev/null && return
  echo "installing: $2 (PyPI, into $venv)"
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$2"
  ln -sf "$venv/bin/$1" "/usr/local/bin/$1"
}
pypi ansible-playbook ansible-core
pypi kubernetes-validate kubernetes-validate==1.37.0

took "cargo-deb, ansible-core, kubernetes-validate"
cargo fmt --all -- --check
took "fmt"

# A clean clone builds everything once: incremental compilation's bookkeeping only costs
# there (the test build took 186 s instead of 228 s with this and the dependencies'
# opt-level in Cargo.toml). A checkout of your own keeps it.
[ "${CI:-}" != true ] || export CARGO_INCREMENTAL=0

# libtest counts a test that skips itself (a requirement missing, outside CI) as passed:
# each skip is also written to RESEQ_SKIP_LOG (tests/it/common `skip`), and the summary
# at the end counts them apart.
logs=$(mktemp -d /tmp/reseq-run-all.XXXXXX)
# The long steps run in a process group of their own and are waited for: on SIGTERM bash
# runs its EXIT trap at once and leaves a foreground command running (a test run outlived
# the script by a minute, one of its loop devices with it); the trap stops the step's
# whole group. Ctrl-C (SIGINT) ends this script the same way.
step_pgid=
step() { setsid "$@" & step_pgid=$!; wait "$step_pgid"; }
stop_step() { [ -z "$step_pgid" ] || kill -TERM -- -"$step_pgid" 2>/dev/null || true; }
trap 'stop_step; rm -rf "$logs" "$guest_log"; kill "$guest_build" 2>/dev/null || true' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
export RESEQ_SKIP_LOG=$logs/skipped
touch "$RESEQ_SKIP_LOG"
# Each test that had the machine to itself, and for how long (tests/it/common `exclusive`).
export RESEQ_EXCLUSIVE_LOG=$logs/exclusive
touch "$RESEQ_EXCLUSIVE_LOG"
status=0
# The tests and the binary the VM runs, built first (same features): the VM tests then
# run beside the Rust tests, which mostly wait on devices and clocks (a third of a CPU).
step bash -o pipefail -c 'cargo test --features fault-injection --no-run 2>&1 | tee "$0"' "$logs/build" || status=$?
took "cargo test (build)"

# The VM tests (tests/vm/run.sh): real LVM, thin pools, dm-crypt, md RAID and systemd as
# PID 1, in two Debian 12 guests under qemu that share out the scenarios, since this
# kernel may have no device-mapper and no md. The guest is built once and cached in
# /var/cache/reseq-vm; the binary handed to it is the one `cargo test` built. They run
# whatever the Rust tests say (one failure there must not hide sixteen here), in the
# background: a Rust test that measures (tests/it/common `exclusive`) stops the guests
# through their QMP sockets while it measures, and continues them after (a guest's clock
# stops with it).
wait "$guest_build" || sed 's/^/guest build (background): /' "$guest_log" >&2
took "waiting for the VM guest"
bin="${CARGO_TARGET_DIR:-target}/debug/reseq"
export RESEQ_VM_QMP=$logs/qmp
# When the Rust tests end: the VM scenarios that measure wait for it.
export RESEQ_VM_QUIET=$logs/rust-done
t_vm=$(date +%s)
if [ "$status" = 0 ] && [ -x "$bin" ]; then
  RESEQ_BIN="$bin" bash tests/vm/run.sh >"$logs/vm" 2>&1 &
  vm=$!
else
  vm=
  echo "vm: not run (the reseq binary did not build)" >"$logs/vm"
fi
trap 'stop_step; rm -rf "$logs" "$guest_log"; kill "$guest_build" 2>/dev/null || true; [ -z "$vm" ] || kill "$vm" 2>/dev/null || true' EXIT
# The lints while the guest boots and runs its first scenarios (the guest is the longer
# part); a lint that fails fails the run, after the tests.
lints=ok
step cargo clippy --all-targets --features fault-injection -- -D warnings || { status=$?; lints=FAILED; }
# Every intra-doc link resolves, private items' too: a renamed item leaves no dead link.
step env RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --document-private-items --features fault-injection \
  || { status=$?; lints=FAILED; }
took "clippy and rustdoc (the VM beside it)"
step bash -o pipefail -c 'cargo test --features fault-injection 2>&1 | tee "$0"' "$logs/cargo" || status=$?
took "cargo test (run, the VM beside it)"
touch "$RESEQ_VM_QUIET"
# A test binary killed while it held the guests stopped would leave them so.
for sock in "$RESEQ_VM_QMP"/*.sock; do
  python3 - "$sock" <<'PY' 2>/dev/null || true
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1]); f = s.makefile('rw')
f.readline()
for c in ('qmp_capabilities', 'cont'):
    f.write(json.dumps({'execute': c}) + '\n'); f.flush(); f.readline()
PY
done
if [ -n "$vm" ]; then wait "$vm" || status=$?; else status=1; fi
cat "$logs/vm"
echo "vm: the guest ran $(( $(date +%s) - t_vm )) s from its start, beside the Rust tests"
took "vm tests (what they took after the Rust tests)"

# The last lines: the time by part, then every test of both runners, the skipped and
# failed ones named just above it.
echo
printf 'time: %s\n' "${times[@]}"
echo "time: all $(( $(date +%s) - t0 )) s"
# The part of the Rust tests that ran one at a time, the longest named.
awk '{ s += $1; n++ } END { printf "time: %d tests had the machine alone for %d s in all; the longest:\n", n, s }' \
  "$RESEQ_EXCLUSIVE_LOG"
sort -rn "$RESEQ_EXCLUSIVE_LOG" | head -5 | awk '{ printf "time:   %6.1f s %s\n", $1, $2 }'
# One line per test, by name (one that gave two reasons counts once).
sort "$RESEQ_SKIP_LOG" | awk -F': ' '!seen[$1]++ { print "skipped: " $0 }'
sed -n 's/^\(vm_[a-z0-9_]*\) \.\.\. skipped (\(.*\))$/skipped: \1: \2/p' "$logs/vm"
# Every failure by name, from both runners (and the lints).
[ "$lints" = ok ] || echo "failed: clippy or rustdoc (their warnings are above the tests' output)"
sed -n -e 's/^test \([^ ]*\) \.\.\. FAILED.*/failed: \1/p' -e 's/^\(vm_[a-z0-9_]*\) \.\.\. FAILED.*/failed: \1/p' \
  "$logs/cargo" "$logs/vm"
self_skipped=$(awk -F': ' '!seen[$1]++' "$RESEQ_SKIP_LOG" | wc -l)
awk -v status="$status" -v self_skipped="$self_skipped" '
  /^test result: / {
    for (i = 1; i < NF; i++) {
      if ($(i + 1) == "passed;") passed += $i
      if ($(i + 1) == "failed;") failed += $i
      if ($(i + 1) == "ignored;") skipped += $i
    }
  }
  /^vm: [0-9]+ passed, [0-9]+ failed/ { passed += $2; failed += $4; skipped += $6 }
  END {
    # A runner that died without its result line (a test binary that crashed, a guest
    # that never came up) failed something all the same.
    if (status != 0 && failed == 0) { print "a runner exited " status " before counting a failure"; failed = 1 }
    printf "tests: %d passed, %d failed, %d skipped\n", passed - self_skipped, failed, skipped + self_skipped
  }' "$logs/cargo" "$logs/vm"
exit "$status"
