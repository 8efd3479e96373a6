//! Shared test environment: requirement checks, scratch devices, running the binary.
//!
//! Requirements (root, loop devices, mkfs.xfs...) are checked up front. Under CI
//! (`CI=true`) a missing one is a failure; elsewhere the test says it is skipped (see
//! `skip`) and returns, so a developer without root still gets the unit tests.
#![allow(dead_code)]

use std::cell::RefCell;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub mod leftovers;
pub mod recording;

pub use reseq::testing::scratch::{LoopDevice, Mount, XorShift, hash_path, mkfs_ext4, mkfs_xfs, run_cmd};

/// The machine, shared by the tests that run side by side, or held by one alone.
static MACHINE: RwLock<()> = RwLock::new(());

enum Held {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive,
}

thread_local! {
    // libtest runs each test on its own thread: what the test holds is released when the
    // thread ends, pass or fail.
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Marks this test as one that shares the machine with others (taken by `require`,
/// `TestEnv::new`, `TestEnv::reseq` and `reseq_command`, so a test rarely calls it): it
/// then never runs beside an `exclusive()` one.
pub fn shared() {
    HELD.with(|h| {
        if h.borrow().is_none() {
            let g = MACHINE.read().unwrap_or_else(|p| p.into_inner());
            *h.borrow_mut() = Some(Held::Shared(g));
        }
    })
}

/// Swap is the whole host's: a test's pages pushed out under pressure go to whichever
/// swap area is on, another test's included (its device then counts writes reseq did not
/// make), and a `swapoff` of it pulls them back into a memory cage too small for them.
/// Every test that turns swap on holds this while it is on.
pub fn swap_lock() -> std::sync::MutexGuard<'static, ()> {
    static SWAP: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SWAP.lock().unwrap_or_else(|p| p.into_inner())
}

/// The machine to this test alone until the guard drops: for a test that times an
/// emulated drive's clock, or leaves something behind that breaks the others' tools.
/// How long each holds it goes to `RESEQ_EXCLUSIVE_LOG` (tests/run-all.sh sums it up: the
/// time the suite runs one test at a time).
/// The VM tests' guests, run beside this suite by tests/run-all.sh, are paused for as long
/// (`RESEQ_VM_QMP`: the directory of their QMP sockets), so that they take no CPU from
/// what is measured.
pub struct Exclusive(#[allow(dead_code)] Option<RwLockWriteGuard<'static, ()>>, Instant, Vec<PausedVm>);

pub fn exclusive() -> Exclusive {
    alone(true)
}

/// The same, for a test that only disturbs or is disturbed by the other Rust tests (it
/// breaks a tool on this host, or refuses any run on it): the VM's guests go on, with a
/// kernel of their own.
pub fn exclusive_of_tests() -> Exclusive {
    alone(false)
}

fn alone(pause_vms: bool) -> Exclusive {
    // A shared hold of this thread's own would deadlock the write lock: give it up first.
    HELD.with(|h| h.borrow_mut().take());
    let g = MACHINE.write().unwrap_or_else(|p| p.into_inner());
    HELD.with(|h| *h.borrow_mut() = Some(Held::Exclusive));
    let vms = if pause_vms { PausedVm::pause_all() } else { Vec::new() };
    Exclusive(Some(g), Instant::now(), vms)
}

/// A VM guest stopped through QMP (its virtual clock stops with it: the guest sees no
/// gap), continued when dropped.
pub struct PausedVm(std::os::unix::net::UnixStream);

impl PausedVm {
    /// Every guest with a socket in `RESEQ_VM_QMP` (none where no guest runs).
    fn pause_all() -> Vec<PausedVm> {
        let Some(dir) = std::env::var_os("RESEQ_VM_QMP") else { return Vec::new() };
        let socks = std::fs::read_dir(dir).into_iter().flatten().flatten().map(|e| e.path());
        socks.filter(|p| p.extension().is_some_and(|x| x == "sock")).filter_map(|p| PausedVm::pause(&p)).collect()
    }

    fn pause(path: &Path) -> Option<PausedVm> {
        let stream = std::os::unix::net::UnixStream::connect(path).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let mut vm = PausedVm(stream);
        // The greeting, then capabilities, then the command.
        vm.reply()?;
        vm.execute("qmp_capabilities")?;
        vm.execute("stop")?;
        Some(vm)
    }

    fn execute(&mut self, command: &str) -> Option<()> {
        use std::io::Write;
        writeln!(self.0, "{{\"execute\": \"{command}\"}}").ok()?;
        self.reply()
    }

    /// Lines until one that answers (events such as STOP come in between).
    fn reply(&mut self) -> Option<()> {
        use std::io::BufRead;
        let mut r = std::io::BufReader::new(&self.0);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if line.contains("\"QMP\"") || line.contains("\"return\"") {
                return Some(());
            }
            if line.contains("\"error\"") {
                eprintln!("QMP: {line}");
                return None;
            }
        }
    }
}

impl Drop for PausedVm {
    fn drop(&mut self) {
        let _ = self.execute("cont");
    }
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        self.2.clear();
        HELD.with(|h| h.borrow_mut().take());
        if let Some(log) = std::env::var_os("RESEQ_EXCLUSIVE_LOG") {
            let name = std::thread::current().name().unwrap_or("?").to_string();
            let line = format!("{:.1} {name}\n", self.1.elapsed().as_secs_f64());
            // One write with O_APPEND, as the skip log.
            let f = std::fs::OpenOptions::new().create(true).append(true).open(&log);
            let _ = f.and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        }
    }
}

/// The lines of `text` over 100 columns (issue 51: what a person reads fits a terminal).
pub fn too_wide(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.chars().count() > 100).collect()
}

/// The reseq binary, for tests that need no `TestEnv`.
pub fn reseq_command() -> Command {
    shared();
    Command::new(env!("CARGO_BIN_EXE_reseq"))
}

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Checks what a test needs. Returns false (skip) outside CI, panics in CI.
pub fn require(tools: &[&str]) -> bool {
    shared();
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root".to_string());
    }
    if !Path::new("/dev/loop-control").exists() {
        missing.push("/dev/loop-control".to_string());
    }
    for t in tools {
        let found =
            std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file())).unwrap_or(false);
        if !found {
            missing.push(t.to_string());
        }
    }
    missing.is_empty()
        || skip(&format!("missing test requirements: {} (the README's test command installs them)", missing.join(", ")))
}

/// Checks that FUSE is there (`/dev/fuse`), as `require` does for the other requirements:
/// false (skip) outside CI, a panic in CI.
pub fn require_fuse() -> bool {
    shared();
    Path::new("/dev/fuse").exists() || skip("missing test requirements: /dev/fuse (modprobe fuse)")
}

/// Skips the running test (returns false, for `if !require(..) { return }`), or fails
/// it under CI, where nothing may be skipped. libtest counts a test that returns early
/// as passed, so the skip is said where a reader sees it: a line on the process's own
/// stderr (libtest hides what a passing test prints with `eprintln!`), and one in the
/// file `RESEQ_SKIP_LOG` names, which tests/run-all.sh counts in its last line.
pub fn skip(why: &str) -> bool {
    if in_ci() {
        panic!("{why}");
    }
    // libtest runs each test on a thread named after it.
    let line = format!("{}: {why}\n", std::thread::current().name().unwrap_or("?"));
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("SKIPPED {line}").as_bytes());
    if let Some(log) = std::env::var_os("RESEQ_SKIP_LOG") {
        // One write with O_APPEND: lines from tests running side by side do not mix.
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&log);
        let _ = f.and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    }
    false
}

/// A scratch directory with helpers; everything in it is removed on drop, after the
/// guards made inside it (drop them first, or hold them in this order).
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    run: tempfile::TempDir,
    /// Loop devices' images on tmpfs (see [`TestEnv::in_memory`]).
    memory: bool,
}

impl TestEnv {
    pub fn new() -> TestEnv {
        shared();
        let dir = tempfile::Builder::new().prefix("reseq-test-").tempdir().expect("tempdir");
        let shm = Path::new("/dev/shm");
        let run = if shm.is_dir() {
            tempfile::Builder::new().prefix("reseq-test-run-").tempdir_in(shm)
        } else {
            tempfile::Builder::new().prefix("run").tempdir_in(dir.path())
        }
        .expect("run dir");
        leftovers::sweep_once();
        leftovers::mark(dir.path(), std::process::id(), &[run.path()]);
        TestEnv { dir, run, memory: false }
    }

    /// As [`TestEnv::new`], with every loop device's image in memory (tmpfs, beside the run
    /// directory), for tests that act at a point inside a window (a kill, a signal, a panic)
    /// and time their windows with their own delays: a host disk busy with another
    /// program's writes stretched a 1 MiB write past a 200 ms window's grace (the guardian
    /// killed reseq before the test's SIGINT) and a thaw to 545 ms. The bound on a busy
    /// disk is freeze_bound.rs's subject, on disk. Also for a test that times a run
    /// against a plan: a device whose speed no host disk sets (a virtual disk's writes
    /// stalled as its host flushed: 12-21 windows against 3).
    pub fn in_memory() -> TestEnv {
        TestEnv { memory: true, ..TestEnv::new() }
    }

    /// Where a loop device's image named `name` goes.
    fn image(&self, name: &str) -> PathBuf {
        if self.memory { self.run_dir().join(name) } else { self.path(name) }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    /// The guardians' freeze records of this test only (`reseq thaw` must never see
    /// another test's), on tmpfs as /run is on a host, when there is one.
    pub fn run_dir(&self) -> PathBuf {
        self.run.path().to_path_buf()
    }

    /// A loop device over a new sparse image.
    pub fn loop_device(&self, name: &str, size: u64) -> LoopDevice {
        LoopDevice::create(&self.image(name), size).expect("loop device")
    }

    /// A loop device filled with deterministic random bytes.
    pub fn random_loop_device(&self, name: &str, size: u64, seed: u64) -> LoopDevice {
        let lo = self.loop_device(name, size);
        let mut rng = XorShift::new(seed);
        let mut buf = vec![0u8; 1 << 20];
        let mut f = std::fs::OpenOptions::new().write(true).open(&lo.path).unwrap();
        let mut left = size;
        while left > 0 {
            rng.fill(&mut buf);
            let n = left.min(buf.len() as u64) as usize;
            std::io::Write::write_all(&mut f, &buf[..n]).unwrap();
            left -= n as u64;
        }
        f.sync_all().unwrap();
        lo
    }

    /// A loop device with a filesystem (`ext4` or `xfs`), mounted.
    pub fn mounted(&self, name: &str, size: u64, fs: &str) -> (LoopDevice, Mount) {
        let lo = self.loop_device(name, size);
        mkfs(&lo, fs);
        let m = Mount::new(&lo.path, &self.path(&format!("{name}-mnt")), &[]).unwrap();
        (lo, m)
    }

    /// As [`TestEnv::mounted`], with every byte of the image holding data, as on a used
    /// drive: mkfs leaves holes (its discard, its zeroed journal and inode tables), which a
    /// run leaves out (tests/it/sparse.rs). For tests that count chunks of the whole device.
    pub fn mounted_dense(&self, name: &str, size: u64, fs: &str) -> (LoopDevice, Mount) {
        let lo = self.loop_device(name, size);
        mkfs(&lo, fs);
        fill_holes(&lo.image);
        let m = Mount::new(&lo.path, &self.path(&format!("{name}-mnt")), &[]).unwrap();
        (lo, m)
    }

    /// The reseq binary with the state directory set.
    pub fn reseq(&self) -> Command {
        let mut c = reseq_command();
        c.env("RESEQ_STATE_DIR", self.state_dir())
            .env("RESEQ_RUN_DIR", self.run_dir())
            .env_remove("RESEQ_FAULTS")
            .env("RUST_LOG", "info");
        c
    }
}

/// `fs` (`ext4` or `xfs`) made on `lo`.
fn mkfs(lo: &LoopDevice, fs: &str) {
    match fs {
        "ext4" => mkfs_ext4(&lo.path).unwrap(),
        "xfs" => mkfs_xfs(&lo.path).unwrap(),
        other => panic!("no mkfs for {other}"),
    }
}

/// Writes `count` files of `size` random bytes; returns (path, blake3) pairs.
/// Writes every byte of an image file back onto itself, so that its holes (and unwritten
/// extents) become data: nothing may have it mounted.
pub fn fill_holes(image: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(image).unwrap();
    let (len, mut buf) = (f.metadata().unwrap().len(), vec![0u8; 1 << 20]);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        f.read_exact_at(&mut buf[..n], at).unwrap();
        f.write_all_at(&buf[..n], at).unwrap();
        at += n as u64;
    }
    f.sync_all().unwrap();
}

pub fn fill_files(dir: &Path, count: usize, size: usize, seed: u64) -> Vec<(PathBuf, blake3::Hash)> {
    let mut rng = XorShift::new(seed);
    let mut out = Vec::new();
    for i in 0..count {
        let p = dir.join(format!("file{i}.bin"));
        let mut data = vec![0u8; size];
        rng.fill(&mut data);
        std::fs::write(&p, &data).unwrap();
        out.push((p, blake3::hash(&data)));
    }
    run_cmd(&mut Command::new("sync")).unwrap();
    out
}

pub fn assert_files_intact(files: &[(PathBuf, blake3::Hash)]) {
    for (p, h) in files {
        assert_eq!(hash_path(p).unwrap(), *h, "{} changed", p.display());
    }
}

/// Runs a command and returns its output; prints it for failing tests.
pub fn output(cmd: &mut Command) -> Output {
    let out = cmd.stdin(Stdio::null()).output().expect("run reseq");
    eprintln!(
        "--- {:?} exited {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
        cmd,
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `reseq rewrite --resume --json TARGET` until it ends, as a user told "run again with
/// --resume" would: a resume keeps a struck run's `--max-overruns 1`, so a window that
/// overruns on a busy host stops it again (exit 7: under the standard load, window 1
/// overran three times in a row in 6 of 8 runs). Its message says to run again at a
/// quieter time or with a longer `--max-freeze`; a test's host gets no quieter, so the
/// next resumes allow the overruns (`--max-overruns 1000`, a pace option a resume may
/// change; each window is still thawed by its guardian). Resumed at most twice more;
/// whatever the last one said is returned, for the test to judge.
pub fn resume_to_the_end(env: &TestEnv, target: &Path) -> Output {
    let resume = |more: &[&str]| output(env.reseq().args(["rewrite", "--resume", "--json"]).args(more).arg(target));
    let mut out = resume(&[]);
    for _ in 0..2 {
        if out.status.code() != Some(7) {
            break;
        }
        eprintln!("--resume met overruns (exit 7): resumed again with --max-overruns 1000");
        out = resume(&["--max-overruns", "1000"]);
    }
    out
}

/// Starts a command with stdout and stderr captured, for tests that act while it runs.
pub fn spawn_captured(cmd: &mut Command) -> std::process::Child {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn reseq")
}

/// Waits for a captured child and prints its stderr (for failing tests).
pub fn wait_captured(child: std::process::Child) -> Output {
    let out = child.wait_with_output().unwrap();
    eprintln!("--- stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A child that is killed and reaped when this drops, pass or fail (a process a failed
/// test leaves running holds its loop device). Until it is reaped its PID cannot be
/// reused, so `signal` reaches this process and no other.
pub struct Running(Option<std::process::Child>);

impl Running {
    /// `spawn_captured`, held.
    pub fn captured(cmd: &mut Command) -> Running {
        Running(Some(spawn_captured(cmd)))
    }

    pub fn pid(&self) -> i32 {
        self.0.as_ref().map_or(0, |c| c.id() as i32)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) -> nix::Result<()> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig)
    }

    pub fn child(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("not reaped")
    }

    /// Waits for it (`wait_captured`): reaped, it is no longer this guard's to kill.
    pub fn wait(mut self) -> Output {
        wait_captured(self.0.take().expect("not reaped"))
    }
}

impl From<std::process::Child> for Running {
    fn from(child: std::process::Child) -> Running {
        Running(Some(child))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs reseq, asserts that it exited 0 (showing its stderr if not), and returns its JSON
/// report: the preamble of most report tests.
pub fn json_ok(cmd: &mut Command) -> serde_json::Value {
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    json_report(&out)
}

/// The filesystem's own checker, read-only (`e2fsck -fn`, `xfs_repair -n`): fails the
/// test with its output unless the filesystem is clean.
pub fn fsck_clean(dev: &Path, fs: &str) {
    let mut c = match fs {
        "ext4" => Command::new("e2fsck"),
        "xfs" => Command::new("xfs_repair"),
        other => panic!("no checker for {other}"),
    };
    if fs == "ext4" {
        c.args(["-f", "-n"]);
    } else {
        c.arg("-n");
    }
    let out = c.arg(dev).output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert!(
        out.status.success(),
        "{c:?} found problems:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn json_report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("report is not JSON ({e})"))
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether the filesystem at `mnt` is frozen, asked without blocking: FIFREEZE on a
/// frozen filesystem fails with EBUSY; if ours succeeds, it was not, and we thaw it.
pub fn is_frozen(mnt: &Path) -> bool {
    let out = Command::new("fsfreeze").arg("-f").arg(mnt).output().unwrap();
    if out.status.success() {
        run_cmd(Command::new("fsfreeze").arg("-u").arg(mnt)).unwrap();
        false
    } else {
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("busy"), "unexpected fsfreeze error: {e}");
        true
    }
}

/// Waits up to `limit` for the filesystem to be thawed. Thaws it (and fails) if not.
pub fn assert_thawed_within(mnt: &Path, limit: Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !is_frozen(mnt) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("fsfreeze").arg("-u").arg(mnt).output();
    panic!("{} still frozen {:?} after reseq stopped", mnt.display(), limit);
}

/// Sectors written to a block device so far (`/sys/block/<dev>/stat` field 7), in bytes.
pub fn bytes_written_to(dev: &Path) -> u64 {
    let name = dev.file_name().unwrap().to_string_lossy();
    let stat = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).unwrap();
    let sectors: u64 = stat.split_whitespace().nth(6).unwrap().parse().unwrap();
    sectors * 512
}

pub fn is_block_device(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

/// Finished chunks in the journal of `dev`.
pub fn journal_done(state_dir: &Path, dev: &LoopDevice) -> u64 {
    let p = state_dir.join(format!("device-{}.journal", dev.name()));
    reseq::testing::journal::read(&p).unwrap().map(|r| r.done).unwrap_or(0)
}

/// Bytes of `dev` the journal says are done (chunk sizes may adapt, so count bytes).
pub fn journal_done_bytes(state_dir: &Path, dev: &LoopDevice) -> u64 {
    let p = state_dir.join(format!("device-{}.journal", dev.name()));
    reseq::testing::journal::read(&p).unwrap().map(|r| r.done_offset).unwrap_or(0)
}

/// A process appending numbered records to `log` until `stop` exists, at most about
/// 2,000 a second (a pause of 10 ms every 20): a writer between every two windows, of a
/// bounded volume. Unbounded, it wrote 230 MB in a run slowed by a busy host, filled the
/// filesystem it wrote to, and made the run it raced as long as it liked.
pub struct Appender {
    child: std::process::Child,
    stop: PathBuf,
    mount: PathBuf,
    pub log: PathBuf,
}

impl Appender {
    /// `log` is a file inside the mount `mount`; `stop` must be outside it.
    pub fn start(mount: &Path, log: &Path, stop: &Path) -> Appender {
        Appender::start_from(mount, log, stop, 1)
    }

    /// As `start`, numbering from `first` (the log already holds the records before it).
    pub fn start_from(mount: &Path, log: &Path, stop: &Path, first: u64) -> Appender {
        Appender::spawn(mount, log, stop, first, "")
    }

    /// The writer loop; `after` runs after each record is appended (and stops the loop
    /// if it fails).
    fn spawn(mount: &Path, log: &Path, stop: &Path, first: u64, after: &str) -> Appender {
        let script = format!(
            "i={}; while [ ! -e '{}' ]; do i=$((i+1)); echo \"record $i\" >> '{}' {after}; \
             [ $((i % 20)) -ne 0 ] || sleep 0.01; done",
            first - 1,
            stop.display(),
            log.display()
        );
        let child = Command::new("sh").arg("-c").arg(script).spawn().unwrap();
        Appender { child, stop: stop.to_path_buf(), mount: mount.to_path_buf(), log: log.to_path_buf() }
    }

    /// Stops the writer and checks every record 1..=N is there once, in order.
    pub fn finish(mut self) -> usize {
        std::fs::write(&self.stop, b"").unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(&self.log).unwrap();
        let mut n = 0;
        for (i, line) in text.lines().enumerate() {
            assert_eq!(line, format!("record {}", i + 1), "record {} is wrong", i + 1);
            n = i + 1;
        }
        n
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.stop, b"");
        // A failed test may have left the filesystem frozen, and a writer blocked on a
        // frozen filesystem cannot die until it is thawed.
        let _ = Command::new("fsfreeze").arg("-u").arg(&self.mount).output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Measures how long writes to a filesystem stall: a thread writes and fsyncs a small
/// file every 20 ms and keeps the longest time one took. A freeze shows as a stall.
pub struct StallProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    worst_us: std::sync::Arc<std::sync::atomic::AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
    mount: PathBuf,
}

impl StallProbe {
    pub fn start(mount: &Path) -> StallProbe {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let worst_us = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s, w, file) = (stop.clone(), worst_us.clone(), mount.join("stall-probe"));
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let t = Instant::now();
                if let Ok(mut f) = std::fs::File::create(&file) {
                    let _ = std::io::Write::write_all(&mut f, b"probe");
                    let _ = f.sync_all();
                }
                w.fetch_max(t.elapsed().as_micros() as u64, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        StallProbe { stop, worst_us, handle: Some(handle), mount: mount.to_path_buf() }
    }

    /// The longest stall so far.
    pub fn worst(&self) -> Duration {
        Duration::from_micros(self.worst_us.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Stops the probe and returns the longest stall. A probe still blocked 5 s later
    /// means the filesystem stayed frozen: thaw it (cleanup) and fail.
    pub fn finish(mut self) -> Duration {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let h = self.handle.take().unwrap();
        let start = Instant::now();
        while !h.is_finished() {
            if start.elapsed() > Duration::from_secs(5) {
                let _ = Command::new("fsfreeze").arg("-u").arg(&self.mount).output();
                panic!("the stall probe on {} is still blocked 5 s after the run: left frozen", self.mount.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = h.join();
        self.worst()
    }
}

impl Drop for StallProbe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(h) = self.handle.take()
            && !h.is_finished()
        {
            let _ = Command::new("fsfreeze").arg("-u").arg(&self.mount).output();
        }
    }
}

/// A writer that appends numbered records with an fsync each, and notes outside the
/// filesystem the last record whose fsync returned: every one up to it must survive.
pub struct FsyncWriter {
    appender: Appender,
    ack: PathBuf,
}

impl FsyncWriter {
    /// `log` inside `mount`; `ack` and `stop` outside it.
    pub fn start(mount: &Path, log: &Path, ack: &Path, stop: &Path) -> FsyncWriter {
        let first = std::fs::read_to_string(log).map_or(0, |t| t.lines().count() as u64) + 1;
        let after = format!(
            "&& sync '{log}' && echo $i > '{ack}.tmp' && mv '{ack}.tmp' '{ack}' || break",
            log = log.display(),
            ack = ack.display()
        );
        FsyncWriter { appender: Appender::spawn(mount, log, stop, first, &after), ack: ack.to_path_buf() }
    }

    /// Stops the writer; checks that every acknowledged record is there, once, in order.
    /// Returns how many were acknowledged.
    pub fn finish(self) -> u64 {
        let ack = self.ack.clone();
        let in_log = self.appender.finish() as u64;
        let acked: u64 = std::fs::read_to_string(&ack).map_or(0, |t| t.trim().parse().unwrap_or(0));
        assert!(in_log >= acked, "{acked} records fsync'd but only {in_log} in the log");
        acked
    }
}

/// The PID of the freeze guardian that reseq process `reseq_pid` forked.
pub fn guardian_of(reseq_pid: u32) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(close) = stat.rfind(')') else { continue };
        let comm = &stat[stat.find('(').unwrap_or(0) + 1..close];
        let ppid: u32 = stat[close + 2..].split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if comm == "freeze-guardian" && ppid == reseq_pid {
            return Some(pid);
        }
    }
    None
}

/// A run of `--only-slow` or `--from-scan`, taken again (three times at most) while its
/// scan is too noisy to tell which regions or files read slowly (exit 3, nothing written:
/// "run it again when the host is quieter", as documented, and a busy host does that).
/// The last run is returned: the test asserts that it decided.
pub fn until_decided(mut run: impl FnMut() -> std::process::Output) -> std::process::Output {
    let mut out = run();
    for _ in 0..2 {
        let noisy = out.status.code() == Some(3) && stderr(&out).contains("--only-slow cannot tell which");
        if !noisy {
            break;
        }
        out = run();
    }
    out
}

/// Waits up to `limit` for `path` to exist (a `mark@POINT#N=PATH` hook's file: reseq got
/// there); whether it does. A test that acts "mid-run" waits for the first write so:
/// a fixed sleep after the start lands before the first window on a busy host.
pub fn wait_for_mark(path: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while !path.exists() && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(5));
    }
    path.exists()
}

/// Waits until a guardian of this test has frozen (its record, rewritten after the
/// freeze, carries the sentinel). False if none did within `limit`.
pub fn wait_frozen_record(run_dir: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(rd) = std::fs::read_dir(run_dir) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "freeze")
                    && std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("\"sentinel\":{"))
                {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Runs a closure on drop: cleanup that must happen when a test fails half-way. For a
/// child of the test's own, hold it in `Running` instead; a closure that kills PIDs
/// must be `mem::forget`ten once they may have been reaped (and reused).
pub struct Defer<F: FnMut()>(pub F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// SIGKILL, also to a stopped process; errors (already gone) ignored.
pub fn sigkill(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// `sh` holding `path` (a device or a file) open read-write on fd 3 until killed.
pub fn hold_open(path: &Path) -> std::process::Child {
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("exec 3<>'{}'; exec sleep 60", path.display()))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the fd is there.
    for _ in 0..200 {
        if std::fs::read_link(format!("/proc/{}/fd/3", child.id())).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// Every file under `dir` (recursively) with its bytes: what a run must leave as it was.
pub fn snapshot_dir(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// A freeze that is not reseq's (`fsfreeze -f`), thawed on drop whatever happens.
pub struct ForeignFreeze(PathBuf);

impl ForeignFreeze {
    pub fn new(mnt: &Path) -> ForeignFreeze {
        run_cmd(Command::new("fsfreeze").arg("-f").arg(mnt)).expect("fsfreeze -f");
        ForeignFreeze(mnt.to_path_buf())
    }
}

impl Drop for ForeignFreeze {
    fn drop(&mut self) {
        let _ = run_cmd(Command::new("fsfreeze").arg("-u").arg(&self.0));
    }
}

/// `reseq status --json`'s unfinished runs.
pub fn unfinished_runs(env: &TestEnv) -> serde_json::Value {
    let out = output(env.reseq().args(["status", "--json"]));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status --json");
    st["unfinished"].clone()
}

/// Waits (up to 30 s) until a journal in `state_dir` records a chunk done.
pub fn wait_journal_done(state_dir: &Path) {
    let start = Instant::now();
    let done = || {
        std::fs::read_dir(state_dir).into_iter().flatten().flatten().any(|e| {
            e.path().extension().is_some_and(|x| x == "journal")
                && std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(r#""type":"done""#))
        })
    };
    while !done() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An unfinished run over `target` is one decision in both modes: a dry run over it
/// warns and exits 0, a run refuses (exit 3) before it benchmarks or writes anything.
pub fn unfinished_run_refused_alike(env: &TestEnv, target: &Path) {
    let before = snapshot_dir(&env.state_dir());
    let out = output(env.reseq().args(["rewrite", "--dry-run"]).arg(target));
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &stderr(&out);
    assert_eq!(out.status.code(), Some(0), "a dry run refuses nothing: {text}");
    assert!(text.contains("the real run is refused without --resume"), "{text}");
    let out = output(env.reseq().args(["rewrite", "--bench"]).arg(target));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("unfinished") && !stderr(&out).contains("benchmarking"), "{}", stderr(&out));
    assert!(snapshot_dir(&env.state_dir()) == before, "the dry run or the refusal changed the state directory");
}
