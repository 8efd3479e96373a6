//! The guardian: a forked process that owns every freeze reseq makes, so that no way
//! of dying or stalling leaves a filesystem frozen past a stated bound.
//!
//! Why a process and not a thread or a signal handler: SIGKILL runs no handler and kills
//! every thread, and SIGSTOP stops them all, while a freeze outlives its maker (see
//! docs/SAFETY.md). Only another process can thaw after that. Why the guardian freezes
//! (not reseq): then it knows exactly which freezes are its own. If reseq froze and died
//! before telling it, the guardian could not tell our freeze from an admin's, and must
//! never thaw the latter.
//!
//! Out of reach of what is aimed at reseq: the guardian runs in its own session and
//! process group (a terminal's Ctrl-Z, `timeout`, `kill -- -PGID` miss it), ignores
//! job-control and termination signals, and renames itself `freeze-guardian` (name and
//! command line), so `pkill reseq`, `pkill -f reseq` and `killall reseq` miss it too.
//!
//! Protocol (a Unix socket pair, fixed 16-byte messages, strictly request/reply):
//! - `JOURNAL len` + `len` bytes: the journal to note a kill in (see below).
//! - `FREEZE ms`: record the freeze (see [`crate::host::freeze_record`]), freeze every
//!   filesystem in order; undo and report the first failure. The window's clock starts
//!   *before* the first FIFREEZE: the stall applications see starts there.
//! - `PERMIT`: reseq asks before each device write. Granted only while every freeze is
//!   still ours and the deadline has not passed. A refusal after the deadline makes the
//!   guardian thaw at once. Because reseq reads a chunk before asking and writes it only
//!   after a grant, a chunk's read and write always lie inside one freeze.
//! - `WRITTEN`: one granted write finished, and its read-back too. While any is
//!   outstanding the guardian does not thaw: thawing under an in-flight write of stale
//!   bytes could let the filesystem's newer write lose. It waits for them until the
//!   deadline plus the grace; then it kills reseq (SIGKILL through a pidfd, which also
//!   ends a stopped process), waits for the socket's end of file, and thaws.
//! - `THAW`: end the window; the reply says whether it overran `--max-freeze`, how long
//!   the filesystems were frozen, and whether a freeze was lost to another program.
//! - `EXIT`: leave.
//!
//! End of file on the socket means reseq is gone. The socket closes only when the last
//! thread of reseq has exited, and a process cannot exit while its O_DIRECT I/O is in
//! flight, so at EOF nothing of reseq's can still reach the device: the guardian thaws
//! and exits. The one wait the guardian cannot bound is I/O the kernel itself cannot
//! finish (a task in D state on a failing device).
//!
//! Someone else's freeze: FIFREEZE's EBUSY means "frozen by anyone", so a program that
//! thaws our freeze and freezes again would pass that probe. The guardian also keeps a
//! sentinel: the device block holding the superblock, read with O_DIRECT after
//! freezing. ext4 and xfs write their superblock on every freeze, so a changed sentinel
//! means the freeze in place is not ours: stop granting, and never thaw it.
//!
//! The guardian never execs and writes nothing while a filesystem is frozen (its stderr
//! could be a file on that filesystem): it speaks only after thawing.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::host::freeze_record::{FreezeRecord, RecordedFs, SentinelRecord};
use crate::host::procs;
use crate::sys;

/// stderr without panicking: it may be a closed pipe or a hung-up terminal, and the
/// guardian must go on to thaw and exit whatever happens to it.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

const OP_FREEZE: u8 = 1;
const OP_PERMIT: u8 = 2;
const OP_WRITTEN: u8 = 3;
const OP_THAW: u8 = 4;
const OP_EXIT: u8 = 5;
const OP_JOURNAL: u8 = 6;
/// The device whose writes PERMIT names (a path follows); the guardian opens it to
/// check, after a kill, what the writes it had granted left there.
const OP_TARGET: u8 = 7;

const ST_OK: u8 = 0;
const ST_ERR: u8 = 1;
const ST_DENIED: u8 = 2;

const DENY_DEADLINE: u32 = 1;
const DENY_FREEZE_LOST: u32 = 2;

/// THAW reply flags (low byte of the reply's `a`; the lost filesystem's index above).
const THAW_OVERRAN: u32 = 1;
const THAW_LOST: u32 = 2;
const THAW_FOREIGN: u32 = 4;

/// A FREEZE failure index meaning "could not write the freeze record".
const RECORD_FAILED: u32 = u32::MAX;

/// The longest journal path the guardian accepts.
const MAX_PATH: u32 = 4096;

/// The answer to a request to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Write now, then report `WRITTEN`.
    Granted,
    /// The window's deadline passed; the guardian has thawed. Do not write.
    DeadlinePassed,
    /// Our freeze of filesystem `index` was lost to another program during the window.
    /// `foreign`: a freeze that is not ours is in place now (thaw and re-freeze), left
    /// alone. Do not write.
    FreezeLost { index: usize, foreign: bool },
}

type Msg = [u8; 16];

fn msg(op: u8, a: u32, b: u64) -> Msg {
    let mut m = [0u8; 16];
    m[0] = op;
    m[4..8].copy_from_slice(&a.to_le_bytes());
    m[8..16].copy_from_slice(&b.to_le_bytes());
    m
}

fn fields(m: &Msg) -> (u8, u32, u64) {
    (m[0], u32::from_le_bytes(m[4..8].try_into().unwrap()), u64::from_le_bytes(m[8..16].try_into().unwrap()))
}

/// Why a freeze request failed.
#[derive(Debug)]
pub enum FreezeFailure {
    /// FIFREEZE failed on filesystem `index`.
    Fifreeze { index: usize, errno: Errno },
    /// The freeze record could not be written, so nothing was frozen.
    Record { errno: Errno },
}

/// What the end of a window reports.
#[derive(Debug, Clone, Copy)]
pub struct ThawReport {
    /// The filesystems were frozen longer than the window allowed (`--max-freeze`).
    pub overran: bool,
    /// How long the filesystems were frozen (from the first FIFREEZE call to the thaw).
    pub frozen: Duration,
    /// Our freeze of filesystem `.0` was lost to another program; `.1`: a freeze that
    /// is not ours is in place and was left alone.
    pub lost: Option<(usize, bool)>,
}

/// One filesystem the guardian freezes.
pub struct Watched {
    /// Any descriptor on the filesystem (its mount point), for FIFREEZE/FITHAW.
    pub mount: OwnedFd,
    /// The mount point, for messages and the freeze record.
    pub name: String,
    /// "major:minor".
    pub dev: String,
    /// The block device (path, opened with O_DIRECT) and the offset of the 4 KiB holding
    /// the superblock; None where a freeze leaves no trace there (see module docs).
    pub sentinel: Option<(PathBuf, OwnedFd, u64)>,
}

/// Timing rules of the windows.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// `--max-freeze`.
    pub window: Duration,
    /// How long past `window` an outstanding write may hold the freeze before the
    /// guardian kills reseq.
    pub grace: Duration,
}

impl Bounds {
    /// When, after the deadline, the guardian kills reseq: early enough in the grace that
    /// the kill, the wait for reseq's exit and the thaw still end inside it.
    pub fn kill_after(&self) -> Duration {
        self.grace.saturating_sub((self.grace / 4).min(Duration::from_millis(100)))
    }
}

/// Sends `WRITTEN` from another thread. `WRITTEN` has no reply, so it cannot take the
/// writer's reply to `PERMIT`; and each message is one 16-byte `write` on a Unix stream
/// socket, queued whole (one skb), so messages from two threads never interleave.
pub struct WrittenReporter {
    stream: UnixStream,
}

impl WrittenReporter {
    pub fn written(&mut self) -> std::io::Result<()> {
        self.stream.write_all(&msg(OP_WRITTEN, 0, 0))
    }
}

/// reseq's handle on its guardian.
pub struct Guardian {
    stream: UnixStream,
    pid: nix::unistd::Pid,
    /// How long reseq waits for a reply to PERMIT or THAW before it decides the
    /// guardian is stuck (stopped by hand) and thaws itself.
    reply_timeout: Duration,
}

impl Guardian {
    /// Forks the guardian. Must be called while the process has a single thread.
    pub fn spawn(fs: Vec<Watched>, bounds: Bounds, run_dir: PathBuf) -> std::io::Result<Guardian> {
        let (ours, theirs) = UnixStream::pair()?;
        let reseq = nix::unistd::getpid();
        match sys::fork_single_threaded()? {
            sys::Forked::Parent { child } => {
                drop(theirs);
                let reply_timeout = bounds.window + bounds.grace + Duration::from_secs(2);
                Ok(Guardian { stream: ours, pid: child, reply_timeout })
            }
            sys::Forked::Child => {
                drop(ours);
                let code = match detach(reseq) {
                    Some(reseq_fd) => {
                        let mut g = GuardianState::new(fs, bounds, run_dir, reseq, reseq_fd);
                        // A panic must not unwind into reseq's copied stack (its destructors
                        // would run here: unmounts, device detaches): thaw and leave.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.serve(theirs)));
                        r.unwrap_or_else(|_| {
                            g.thaw_all();
                            73
                        })
                    }
                    None => 70,
                };
                sys::exit_immediately(code)
            }
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    fn call(&mut self, m: Msg, timeout: Option<Duration>) -> std::io::Result<(u8, u32, u64)> {
        self.stream.write_all(&m)?;
        self.reply(timeout)
    }

    fn reply(&mut self, timeout: Option<Duration>) -> std::io::Result<(u8, u32, u64)> {
        self.stream.set_read_timeout(timeout)?;
        let mut reply = [0u8; 16];
        self.stream.read_exact(&mut reply)?;
        Ok(fields(&reply))
    }

    /// Tells the guardian which journal notes a kill.
    pub fn set_journal(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        self.send_path(OP_JOURNAL, path)
    }

    /// A message carrying a path (it follows the message), and its reply.
    fn send_path(&mut self, op: u8, path: &std::path::Path) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() > MAX_PATH as usize {
            return Err(std::io::Error::other(format!("{} is too long a path for the guardian", path.display())));
        }
        self.stream.write_all(&msg(op, bytes.len() as u32, 0))?;
        self.stream.write_all(bytes)?;
        self.reply(Some(self.reply_timeout)).map(drop)
    }

    /// Freezes every filesystem for a window of `window`. FIFREEZE syncs dirty data
    /// first, which can take long on a busy host, so the wait is generous; a guardian that
    /// does not answer within it was stopped by hand, and is treated as lost.
    pub fn freeze(&mut self, window: Duration) -> std::io::Result<Result<(), FreezeFailure>> {
        let timeout = Some(Duration::from_secs(60).max(self.reply_timeout * 4));
        let (st, idx, errno) = self.call(msg(OP_FREEZE, 0, window.as_millis() as u64), timeout)?;
        let errno = Errno::from_raw(errno as i32);
        Ok(match (st, idx) {
            (ST_OK, _) => Ok(()),
            (_, RECORD_FAILED) => Err(FreezeFailure::Record { errno }),
            (_, i) => Err(FreezeFailure::Fifreeze { index: i as usize, errno }),
        })
    }

    /// Names the device the writes go to (see [`Guardian::permit`]).
    pub fn set_target(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        self.send_path(OP_TARGET, path)
    }

    /// Asks to write; `chunk` (device offset, length, blake3 of the bytes) is what the
    /// write will be, so that a guardian that must kill reseq mid-write can tell whether
    /// it left those bytes or tore them.
    pub fn permit(&mut self, chunk: Option<(u64, u64, blake3::Hash)>) -> std::io::Result<Permit> {
        let (st, why, lost) = match chunk {
            Some((offset, len, hash)) if len > 0 && len <= u64::from(u32::MAX) => {
                // One write: the verifier's WRITTEN, sent from another thread, must not
                // land between the message and its hash.
                let mut m = msg(OP_PERMIT, len as u32, offset).to_vec();
                m.extend_from_slice(hash.as_bytes());
                self.stream.write_all(&m)?;
                self.reply(Some(self.reply_timeout))?
            }
            _ => self.call(msg(OP_PERMIT, 0, 0), Some(self.reply_timeout))?,
        };
        Ok(match (st, why) {
            (ST_OK, _) => Permit::Granted,
            (_, DENY_FREEZE_LOST) => Permit::FreezeLost { index: (lost >> 1) as usize, foreign: lost & 1 != 0 },
            _ => Permit::DeadlinePassed,
        })
    }

    /// The granted write has completed.
    pub fn written(&mut self) -> std::io::Result<()> {
        self.stream.write_all(&msg(OP_WRITTEN, 0, 0))
    }

    /// A handle another thread (the verifier) uses to report finished writes, so that a
    /// stalled writer thread cannot hold back the thaw.
    pub fn reporter(&self) -> std::io::Result<WrittenReporter> {
        Ok(WrittenReporter { stream: self.stream.try_clone()? })
    }

    pub fn thaw(&mut self) -> std::io::Result<ThawReport> {
        let (_st, a, micros) = self.call(msg(OP_THAW, 0, 0), Some(self.reply_timeout))?;
        let flags = a & 0xff;
        Ok(ThawReport {
            overran: flags & THAW_OVERRAN != 0,
            lost: (flags & THAW_LOST != 0).then_some(((a >> 8) as usize, flags & THAW_FOREIGN != 0)),
            frozen: Duration::from_micros(micros),
        })
    }

    /// The guardian stopped answering (stopped by hand, or dead): make sure it is gone,
    /// so that it cannot thaw later what is no longer ours.
    /// The wait is bounded: a guardian in D state (a FIFREEZE stuck syncing) dies only
    /// when that returns, and reseq must not hang on it.
    pub fn kill(self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
        self.reaped_within(Duration::from_secs(1));
    }

    /// Tells the guardian to leave and reaps it; one that does not leave in time (stopped
    /// by hand) is killed, so reseq never hangs on it.
    pub fn shutdown(mut self) {
        let _ = self.stream.write_all(&msg(OP_EXIT, 0, 0));
        if !self.reaped_within(self.reply_timeout) {
            self.kill();
        }
    }

    /// Waits up to `limit` for the guardian to exit; whether it did (or is gone).
    fn reaped_within(&self, limit: Duration) -> bool {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        let give_up = Instant::now() + limit;
        while Instant::now() < give_up {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(5)),
                _ => return true,
            }
        }
        false
    }
}

/// In the child, before anything else: leave reseq's session, ignore what is aimed at
/// reseq's group, take a pidfd on reseq, and change name. None if reseq is already gone.
fn detach(reseq: nix::unistd::Pid) -> Option<Option<OwnedFd>> {
    let _ = sys::new_session();
    sys::ignore_group_signals().ok()?;
    // Without pidfds (Linux < 5.3) the guardian falls back to kill(2) while reseq is
    // still its parent (a parent's PID cannot be reused while its child lives).
    let pidfd = sys::pidfd_open(reseq.as_raw()).ok();
    if nix::unistd::getppid() != reseq {
        return None;
    }
    let _ = sys::set_process_title("freeze-guardian");
    Some(pidfd)
}

/// Per-filesystem state.
struct Fs {
    w: Watched,
    /// Frozen by this guardian and not yet thawed.
    ours: bool,
    /// The sentinel block as it read right after our freeze.
    snapshot: Option<Vec<u8>>,
}

struct GuardianState {
    fs: Vec<Fs>,
    bounds: Bounds,
    run_dir: PathBuf,
    reseq: nix::unistd::Pid,
    reseq_fd: Option<OwnedFd>,
    journal: Option<PathBuf>,
    /// The device written (OP_TARGET), and its descriptor (O_DIRECT, read-only).
    target: Option<(PathBuf, OwnedFd)>,
    /// Granted writes not yet reported, oldest first: (device offset, length, blake3).
    granted: std::collections::VecDeque<(u64, u64, [u8; 32])>,
    /// Start times of the guardian and of reseq, for the freeze record.
    own_start_ticks: u64,
    reseq_start_ticks: u64,
    freeze_started: Option<Instant>,
    /// The window's end (`--max-freeze` after the freeze began).
    deadline: Option<Instant>,
    /// Granted writes not yet reported finished.
    writing: u32,
    /// The deadline passed: no more grants in this window; thaw when `writing` is 0.
    revoked: bool,
    frozen_for: Duration,
    /// (index, foreign) of a freeze lost in this window.
    lost: Option<(usize, bool)>,
    windows: u64,
}

enum Next {
    Continue,
    Exit(i32),
}

impl GuardianState {
    fn new(
        fs: Vec<Watched>,
        bounds: Bounds,
        run_dir: PathBuf,
        reseq: nix::unistd::Pid,
        reseq_fd: Option<OwnedFd>,
    ) -> GuardianState {
        GuardianState {
            fs: fs.into_iter().map(|w| Fs { w, ours: false, snapshot: None }).collect(),
            bounds,
            run_dir,
            reseq,
            reseq_fd,
            journal: None,
            target: None,
            granted: std::collections::VecDeque::new(),
            own_start_ticks: procs::stat(std::process::id() as i32).map_or(0, |s| s.start_ticks),
            reseq_start_ticks: procs::stat(reseq.as_raw()).map_or(0, |s| s.start_ticks),
            freeze_started: None,
            deadline: None,
            writing: 0,
            revoked: false,
            frozen_for: Duration::ZERO,
            lost: None,
            windows: 0,
        }
    }

    fn any_ours(&self) -> bool {
        self.fs.iter().any(|f| f.ours)
    }

    fn names(&self) -> String {
        self.fs.iter().map(|f| f.w.name.as_str()).collect::<Vec<_>>().join(", ")
    }

    fn record(&self) -> FreezeRecord {
        FreezeRecord {
            guardian_pid: std::process::id() as i32,
            guardian_start_ticks: self.own_start_ticks,
            reseq_pid: self.reseq.as_raw(),
            reseq_start_ticks: self.reseq_start_ticks,
            filesystems: self
                .fs
                .iter()
                .map(|f| RecordedFs {
                    mount_point: f.w.name.clone().into(),
                    dev: f.w.dev.clone(),
                    sentinel: f.w.sentinel.as_ref().zip(f.snapshot.as_ref()).map(|((path, _, offset), snap)| {
                        SentinelRecord {
                            device: path.clone(),
                            offset: *offset,
                            blake3: blake3::hash(snap).to_hex().to_string(),
                        }
                    }),
                })
                .collect(),
        }
    }

    fn read_sentinel(f: &Fs) -> Option<Vec<u8>> {
        let (_, fd, offset) = f.w.sentinel.as_ref()?;
        read_block(fd.as_fd(), *offset)
    }

    /// Thaws every freeze that is ours, never one that is not: the sentinels are read
    /// first on every path (deadline, end of window, reseq gone, kill, exit).
    fn thaw_all(&mut self) {
        if self.any_ours() {
            self.check_freezes();
        }
        // Reverse order: the mirror of freezing.
        for f in self.fs.iter_mut().rev().filter(|f| f.ours) {
            let _ = sys::fithaw(f.w.mount.as_fd());
            f.ours = false;
            f.snapshot = None;
        }
        if let Some(start) = self.freeze_started.take() {
            self.frozen_for = start.elapsed();
        }
        self.deadline = None;
        FreezeRecord::remove(&self.run_dir, std::process::id() as i32);
    }

    fn freeze(&mut self, window: Duration) -> Result<(), (u32, Errno)> {
        // The record first: if we die frozen, `reseq thaw` must know these are ours.
        if let Err(e) = self.record().write(&self.run_dir) {
            return Err((RECORD_FAILED, Errno::from_raw(e.raw_os_error().unwrap_or(Errno::EIO as i32))));
        }
        let start = Instant::now();
        self.freeze_started = Some(start);
        self.deadline = Some(start + window);
        self.revoked = false;
        self.lost = None;
        self.writing = 0;
        self.granted.clear();
        self.windows += 1;
        for i in 0..self.fs.len() {
            if let Err(errno) = sys::fifreeze(self.fs[i].w.mount.as_fd()) {
                self.thaw_all();
                return Err((i as u32, errno));
            }
            self.fs[i].ours = true;
            self.fs[i].snapshot = GuardianState::read_sentinel(&self.fs[i]);
        }
        Ok(())
    }

    /// Checks that our freezes still hold. There is no status to ask, but FIFREEZE on a
    /// frozen filesystem gives EBUSY. If it succeeds, someone thawed ours: we now hold a
    /// fresh freeze, ours to thaw. If it gives EBUSY but the sentinel changed, someone
    /// thawed ours and froze again: that freeze is theirs, and stays (a sentinel that
    /// cannot be read proves nothing: the freeze stays ours).
    fn check_freezes(&mut self) {
        for i in 0..self.fs.len() {
            if !self.fs[i].ours {
                continue;
            }
            match sys::fifreeze(self.fs[i].w.mount.as_fd()) {
                Err(Errno::EBUSY) => {
                    // A sentinel that cannot be read now (the device failing: EIO, a FUSE
                    // server gone) says nothing about who froze: the freeze stays ours
                    // and is thawed. Taking it for a foreign one left a filesystem
                    // frozen when an emulated drive's server was killed mid-run.
                    let now = GuardianState::read_sentinel(&self.fs[i]);
                    if self.fs[i].snapshot.is_some() && now.is_some() && now != self.fs[i].snapshot {
                        self.fs[i].ours = false;
                        self.lost.get_or_insert((i, true));
                    }
                }
                Ok(()) => {
                    self.fs[i].snapshot = GuardianState::read_sentinel(&self.fs[i]);
                    self.lost.get_or_insert((i, false));
                }
                Err(_) => {
                    self.lost.get_or_insert((i, false));
                }
            }
        }
    }

    fn past(&self, extra: Duration) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d + extra)
    }

    /// The deadline has passed: stop granting, and thaw once no write is outstanding.
    fn revoke(&mut self) {
        self.revoked = true;
        if self.writing == 0 && self.any_ours() {
            let n = self.fs.iter().filter(|f| f.ours).count();
            self.thaw_all();
            // Safe to speak: nothing of ours is frozen any more.
            say!("reseq guardian: freeze window overran its deadline; thawed {n} filesystem(s) ({})", self.names());
        }
    }

    /// How long to wait for the next message.
    fn timeout(&self) -> Option<Duration> {
        let d = self.deadline.filter(|_| self.any_ours())?;
        // Never None while a freeze is ours: a revoked window with nothing outstanding
        // is thawed at once, and this wakes the loop to do it if it was not.
        let until = if !self.revoked || self.writing == 0 { d } else { d + self.bounds.kill_after() };
        Some(until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
    }

    fn serve(&mut self, mut stream: UnixStream) -> i32 {
        loop {
            if stream.set_read_timeout(self.timeout()).is_err() {
                self.thaw_all();
                return 71;
            }
            let mut m = [0u8; 16];
            match stream.read_exact(&mut m) {
                Ok(()) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if self.any_ours() && self.past(self.bounds.kill_after()) && self.writing > 0 {
                        return self.kill_reseq(&mut stream);
                    }
                    if self.any_ours() && (self.revoked || self.past(Duration::ZERO)) {
                        self.revoke();
                    }
                    continue;
                }
                Err(_) => return self.reseq_gone(),
            }
            match self.handle(&mut stream, m) {
                Next::Continue => {}
                Next::Exit(code) => return code,
            }
        }
    }

    fn handle(&mut self, stream: &mut UnixStream, m: Msg) -> Next {
        let (op, a, b) = fields(&m);
        let reply = match op {
            OP_JOURNAL => {
                let Some(path) = read_path(stream, a) else { return Next::Exit(self.reseq_gone()) };
                self.journal = Some(path);
                Some(msg(ST_OK, 0, 0))
            }
            OP_FREEZE => match self.freeze(Duration::from_millis(b)) {
                Ok(()) => Some(msg(ST_OK, 0, 0)),
                Err((index, errno)) => Some(msg(ST_ERR, index, errno as i32 as u64)),
            },
            OP_TARGET => {
                let Some(path) = read_path(stream, a) else { return Next::Exit(self.reseq_gone()) };
                self.target = crate::host::freeze::open_direct(&path).ok().map(|fd| (path, fd));
                Some(msg(ST_OK, 0, 0))
            }
            OP_PERMIT => {
                let mut hash = [0u8; 32];
                if a > 0 && stream.read_exact(&mut hash).is_err() {
                    return Next::Exit(self.reseq_gone());
                }
                let reply = self.permit();
                if a > 0 && fields(&reply).0 == ST_OK {
                    self.granted.push_back((b, u64::from(a), hash));
                }
                Some(reply)
            }
            OP_WRITTEN => {
                self.writing = self.writing.saturating_sub(1);
                self.granted.pop_front();
                // The deadline passed (or the freeze was lost) during the write: thaw now,
                // not at the next request.
                if self.any_ours() && (self.revoked || self.past(Duration::ZERO)) {
                    self.revoke();
                }
                None
            }
            OP_THAW => {
                self.writing = 0;
                self.granted.clear();
                let window = self.bounds.window;
                // Also when nothing is ours any more (lost to another freezer): that ends
                // the window's clock and removes its record.
                self.thaw_all();
                // Any window frozen longer than --max-freeze overran, whoever thawed it.
                let overran = self.frozen_for > window;
                let mut flags = u32::from(overran) * THAW_OVERRAN;
                if let Some((i, foreign)) = self.lost {
                    flags |= THAW_LOST | (u32::from(foreign) * THAW_FOREIGN) | ((i as u32) << 8);
                }
                Some(msg(ST_OK, flags, self.frozen_for.as_micros() as u64))
            }
            OP_EXIT => {
                self.thaw_all();
                return Next::Exit(0);
            }
            _ => {
                self.thaw_all();
                return Next::Exit(72);
            }
        };
        if let Some(r) = reply
            && stream.write_all(&r).is_err()
        {
            return Next::Exit(self.reseq_gone());
        }
        if op == OP_FREEZE && self.any_ours() {
            // Again, with the sentinels, so that `reseq thaw` can tell our freeze from a
            // later one; after the reply, so that reseq reads its first chunks meanwhile.
            // A failure costs only that check: the first record stands.
            let _ = self.record().write(&self.run_dir);
        }
        Next::Continue
    }

    fn permit(&mut self) -> Msg {
        if !self.any_ours() || self.revoked {
            if let Some((i, foreign)) = self.lost {
                return msg(ST_DENIED, DENY_FREEZE_LOST, ((i as u64) << 1) | u64::from(foreign));
            }
            return msg(ST_DENIED, DENY_DEADLINE, 0);
        }
        if self.past(Duration::ZERO) {
            self.revoke();
            return msg(ST_DENIED, DENY_DEADLINE, 0);
        }
        self.check_freezes();
        if let Some((i, foreign)) = self.lost {
            // Stop the window here: thaw what is still ours, leave what is not.
            self.revoked = true;
            if self.writing == 0 {
                self.thaw_all();
            }
            return msg(ST_DENIED, DENY_FREEZE_LOST, ((i as u64) << 1) | u64::from(foreign));
        }
        self.writing += 1;
        msg(ST_OK, 0, 0)
    }

    /// End of file: reseq has exited; none of its I/O is in flight.
    fn reseq_gone(&mut self) -> i32 {
        let n = self.fs.iter().filter(|f| f.ours).count();
        self.thaw_all();
        if n > 0 {
            say!("reseq guardian: reseq exited while {n} filesystem(s) were frozen; thawed them ({})", self.names());
        }
        0
    }

    /// A write or read-back is still outstanding at the deadline plus the grace: reseq is
    /// stopped or stalled. Kill it, wait until none of its threads is left (the socket's
    /// end of file), then thaw.
    fn kill_reseq(&mut self, stream: &mut UnixStream) -> i32 {
        let killed = match &self.reseq_fd {
            Some(fd) => sys::pidfd_kill(fd.as_fd()).is_ok(),
            None => {
                nix::unistd::getppid() == self.reseq
                    && nix::sys::signal::kill(self.reseq, nix::sys::signal::Signal::SIGKILL).is_ok()
            }
        };
        let _ = stream.set_read_timeout(None);
        let mut sink = [0u8; 256];
        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        let frozen_since = self.freeze_started.map(|s| s.elapsed()).unwrap_or_default();
        let names = self.names();
        // Still frozen, and none of reseq's I/O in flight: what the granted writes left
        // is theirs alone. After the thaw the filesystem may write there too.
        let in_flight = self.check_granted();
        self.thaw_all();
        let window = self.windows;
        say!(
            "reseq guardian: a write was still outstanding {} ms after freeze window {window} began (--max-freeze {} ms + {} ms grace): reseq is stopped or stalled, so the guardian {} it and thawed {names} after {} ms frozen. A chunk is only ever rewritten with the bytes read in the same freeze, and the guardian read back the write it was waiting for before thawing; run the same command again with --resume (device and file mode alike): it checks what that write left first.",
            frozen_since.as_millis(),
            self.bounds.window.as_millis(),
            self.bounds.grace.as_millis(),
            if killed { "killed" } else { "lost" },
            self.frozen_for.as_millis(),
        );
        // Not while another program's freeze is in place: the journal may be on that
        // filesystem, and the write would block until it thaws.
        let foreign = self.lost.is_some_and(|(_, foreign)| foreign);
        if let Some(j) = self.journal.as_ref().filter(|_| !foreign) {
            let note = crate::engine::journal::GuardianKill {
                window,
                frozen_ms: self.frozen_for.as_millis() as u64,
                max_freeze_ms: self.bounds.window.as_millis() as u64,
                grace_ms: self.bounds.grace.as_millis() as u64,
                in_flight,
            };
            if let Err(e) = crate::engine::journal::note_guardian_kill(j, &note) {
                say!("reseq guardian: could not note this in the journal {}: {e}", j.display());
            }
        }
        0
    }
}

impl GuardianState {
    /// Reads back each granted, unreported write (reseq is gone, its I/O finished) and
    /// compares it with the bytes it was to write. One that is not intact is also noted
    /// in the run directory, which every later run on the device reads, whatever mode it
    /// runs in and whether or not its journal reached the disk.
    fn check_granted(&self) -> Vec<crate::engine::journal::InFlightCheck> {
        self.granted
            .iter()
            .map(|&(offset, len, hash)| {
                let intact = self.target.as_ref().and_then(|(_, fd)| {
                    let mut buf = sys::AlignedBuf::new(len as usize, 4096);
                    sys::pread_exact(fd.as_fd(), &mut buf[..len as usize], offset).ok()?;
                    Some(blake3::hash(&buf[..len as usize]) == blake3::Hash::from(hash))
                });
                if intact != Some(true)
                    && let Some((path, _)) = &self.target
                {
                    let note = crate::engine::rescue::TornNote::new(path, offset, len, &blake3::Hash::from(hash), intact);
                    match note.save(&self.run_dir) {
                        Ok(p) => say!("reseq guardian: device bytes {offset}..{} were not the bytes being written when reseq was killed; noted in {}", offset + len, p.display()),
                        Err(e) => say!("reseq guardian: could not note torn device bytes {offset}..{}: {e}", offset + len),
                    }
                }
                crate::engine::journal::InFlightCheck { offset, len, intact }
            })
            .collect()
    }
}

/// The path of `len` bytes that follows a message.
fn read_path(stream: &mut UnixStream, len: u32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let mut path = vec![0u8; len.min(MAX_PATH) as usize];
    stream.read_exact(&mut path).ok()?;
    Some(PathBuf::from(std::ffi::OsString::from_vec(path)))
}

/// The 4 KiB at `offset` of an O_DIRECT descriptor.
pub fn read_block(fd: std::os::fd::BorrowedFd<'_>, offset: u64) -> Option<Vec<u8>> {
    let mut buf = sys::AlignedBuf::new(4096, 4096);
    sys::pread_exact(fd, &mut buf, offset).ok()?;
    Some(buf.to_vec())
}
