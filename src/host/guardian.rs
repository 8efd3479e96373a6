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
use crate::host::freezer::Freezers;
pub(crate) use crate::host::hardening::Hardening;
use crate::host::procs;
use crate::host::sentinel::SentinelReader;
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

/// The guardian's first message, unasked: what [`Hardening::get`] could arrange.
const OP_HELLO: u8 = 8;
/// Is the window's freeze still ours, and has it been since the window began? Asked
/// when the written-sectors counters grew by more than reseq wrote: growth only means
/// another writer if the filesystem was frozen all the while (it writes once thawed).
const OP_HELD: u8 = 9;
/// Sent during FREEZE, before its reply, after each filesystem it froze (index in `a`):
/// if the guardian dies while a later freeze waits, reseq knows which to thaw.
const OP_FROZE: u8 = 10;

/// A FREEZE failure index meaning "could not write the freeze record".
const RECORD_FAILED: u32 = u32::MAX;

/// How long the first FIFREEZE of a window may sync before it is abandoned.
const FIRST_FREEZE_LIMIT: Duration = Duration::from_secs(10);

/// How long a probe of a freeze we hold may take. It answers EBUSY at once; only a probe
/// that finds our freeze gone makes a fresh one and syncs. A limit taken from the
/// deadline (1 ms once it has passed) could give up on an EBUSY that a busy host merely
/// delivered late, and the freeze, taken for lost, would then never be thawed.
const PROBE_LIMIT: Duration = Duration::from_secs(10);

/// The longest journal path the guardian accepts.
const MAX_PATH: u32 = 4096;

/// The answer to a request to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Write now, then report `WRITTEN`.
    Granted,
    /// The window's deadline passed; the guardian has thawed. Do not write.
    DeadlinePassed,
    /// Our freeze of filesystem `index` was lost to another program during the window.
    /// `foreign`: a freeze that is not ours is in place now (thaw and re-freeze), left
    /// alone. Do not write.
    FreezeLost { index: usize, foreign: bool },
}

/// The reply to HELD.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// Whether the window's freeze is still ours (false: thawed at its deadline).
    Frozen(bool),
    /// As [`Permit::FreezeLost`].
    Lost { index: usize, foreign: bool },
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

/// The answer to PERMIT, from its reply's fields.
fn permit_of(st: u8, why: u32, lost: u64) -> Permit {
    match (st, why) {
        (ST_OK, _) => Permit::Granted,
        (_, DENY_FREEZE_LOST) => Permit::FreezeLost { index: (lost >> 1) as usize, foreign: lost & 1 != 0 },
        _ => Permit::DeadlinePassed,
    }
}

/// The reply to PERMIT when a freeze was lost: which filesystem, and whether the freeze
/// in place is someone else's.
fn freeze_lost_reply((i, foreign): (usize, bool)) -> Msg {
    msg(ST_DENIED, DENY_FREEZE_LOST, ((i as u64) << 1) | u64::from(foreign))
}

/// The end of a window, from THAW's reply (`a`: flags and lost index; `micros` frozen).
fn thaw_report_of(a: u32, micros: u64) -> ThawReport {
    let flags = a & 0xff;
    ThawReport {
        overran: flags & THAW_OVERRAN != 0,
        lost: (flags & THAW_LOST != 0).then_some(((a >> 8) as usize, flags & THAW_FOREIGN != 0)),
        frozen: Duration::from_micros(micros),
    }
}

/// The guardian's exit statuses besides 0 (read by no one but a person with `ps` or a
/// core file; none is reseq's own exit code).
mod exit {
    /// It could not start serving: its hello or its freeze setup failed.
    pub(super) const NO_START: i32 = 70;
    /// Its socket's read timeout could not be set: it thawed and left.
    pub(super) const NO_TIMEOUT: i32 = 71;
    /// A request it does not know: it thawed and left.
    pub(super) const UNKNOWN_REQUEST: i32 = 72;
    /// It panicked and thawed.
    pub(super) const PANICKED: i32 = 73;
    /// It panicked and its thaw panicked too (`reseq thaw` acts on its record).
    pub(super) const THAW_PANICKED: i32 = 74;
}

/// Why a freeze request failed.
#[derive(Debug)]
pub(crate) enum FreezeFailure {
    /// FIFREEZE failed on filesystem `index`.
    Fifreeze { index: usize, errno: Errno },
    /// The freeze record could not be written, so nothing was frozen.
    Record { errno: Errno },
}

/// What the end of a window reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThawReport {
    /// The filesystems were frozen longer than the window allowed (`--max-freeze`).
    pub(crate) overran: bool,
    /// How long the filesystems were frozen (from the first FIFREEZE call to the thaw).
    pub(crate) frozen: Duration,
    /// Our freeze of filesystem `.0` was lost to another program; `.1`: a freeze that
    /// is not ours is in place and was left alone.
    pub(crate) lost: Option<(usize, bool)>,
}

/// One filesystem the guardian freezes.
pub(crate) struct Watched {
    /// Any descriptor on the filesystem (its mount point), for FIFREEZE/FITHAW.
    pub(crate) mount: OwnedFd,
    /// The mount point, for messages and the freeze record.
    pub(crate) name: String,
    /// "major:minor".
    pub(crate) dev: String,
    /// The block device (path, opened with O_DIRECT) and the offset of the 4 KiB holding
    /// the superblock; None where a freeze leaves no trace there (see module docs).
    pub(crate) sentinel: Option<(PathBuf, OwnedFd, u64)>,
}

/// Timing rules of the windows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// `--max-freeze`.
    pub(crate) window: Duration,
    /// How long past `window` an outstanding write may hold the freeze before the
    /// guardian kills reseq.
    pub(crate) grace: Duration,
}

impl Bounds {
    /// When, after the deadline, the guardian kills reseq: early enough in the grace that
    /// the kill, the wait for reseq's exit, the read-back of the granted writes and the
    /// thaw still end inside it on a busy host. Half the grace: a margin of 100 ms was
    /// not enough (6 busy loops on 2 cores: killed at 1,951 ms, thawed at 2,001 ms of a
    /// 2,000 ms bound; under a load of 12-13, a window of 2,293 ms).
    pub(crate) fn kill_after(&self) -> Duration {
        self.grace / 2
    }
}

/// reseq's handle on its guardian.
pub(crate) struct Guardian {
    stream: UnixStream,
    pid: nix::unistd::Pid,
    /// How long reseq waits for a reply to PERMIT or THAW before it decides the
    /// guardian is stuck (stopped by hand) and thaws itself.
    reply_timeout: Duration,
    /// When, after a FREEZE was sent, a stopped guardian is given up (its own kill point).
    give_up_stopped: Duration,
    /// The filesystems the guardian said it froze in the current FREEZE (`OP_FROZE`).
    froze: Vec<usize>,
    /// What the guardian could arrange for itself (its first message).
    pub(crate) hardening: Hardening,
}

impl Guardian {
    /// Forks the guardian. Must be called while the process has a single thread.
    pub(crate) fn spawn(fs: Vec<Watched>, bounds: Bounds, run_dir: PathBuf) -> std::io::Result<Guardian> {
        let (ours, theirs) = UnixStream::pair()?;
        let reseq = nix::unistd::getpid();
        match sys::process::fork_single_threaded()? {
            nix::unistd::ForkResult::Parent { child } => {
                drop(theirs);
                let reply_timeout = bounds.window + bounds.grace + Duration::from_secs(2);
                let mut g = Guardian {
                    stream: ours,
                    pid: child,
                    reply_timeout,
                    give_up_stopped: bounds.window + bounds.kill_after(),
                    froze: Vec::new(),
                    hardening: Hardening::default(),
                };
                match g.reply(Some(crate::host::hardening::HELLO_TIMEOUT)) {
                    Ok((OP_HELLO, a, b)) => g.hardening = Hardening::decode(a, b),
                    Ok(_) => return Err(std::io::Error::other("the guardian said something else than hello")),
                    Err(e) => {
                        g.kill();
                        return Err(e);
                    }
                }
                Ok(g)
            }
            nix::unistd::ForkResult::Child => {
                drop(ours);
                // reseq's panic hook writes to stderr, which may be on the filesystem this
                // process freezes: a panic message must wait for the thaw here too.
                std::panic::set_hook(Box::new(|info| {
                    crate::engine::rescue::save_panic_note(std::process::id(), &format!("reseq guardian: {info}"));
                }));
                let code = match detach(reseq) {
                    Some(reseq_fd) => {
                        let hello = msg(OP_HELLO, 0, 0);
                        let hello = Hardening::get().encode(hello);
                        if (&theirs).write_all(&hello).is_err() {
                            sys::process::exit_immediately(exit::NO_START);
                        }
                        let Ok(live) = Live::new(fs, &bounds) else { sys::process::exit_immediately(exit::NO_START) };
                        let mut g = GuardianState::new(live, bounds, run_dir, reseq, reseq_fd);
                        // A panic must not unwind into reseq's copied stack (its destructors
                        // would run here: unmounts, device detaches): thaw and leave.
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| g.serve(theirs)));
                        let code = r.unwrap_or_else(|_| g.recover_from_panic());
                        g.linger();
                        code
                    }
                    None => exit::NO_START,
                };
                // After the last thaw: nothing of ours is frozen, so this may touch files.
                crate::host::cgroup::leave_own_group();
                sys::process::exit_immediately(code)
            }
        }
    }

    pub(crate) fn pid(&self) -> i32 {
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
    pub(crate) fn set_journal(&mut self, path: &std::path::Path) -> std::io::Result<()> {
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
    pub(crate) fn freeze(&mut self, window: Duration) -> std::io::Result<Result<(), FreezeFailure>> {
        self.froze.clear();
        self.stream.write_all(&msg(OP_FREEZE, 0, window.as_millis() as u64))?;
        let asked = Instant::now();
        let (st, idx, errno) = loop {
            match self.reply(Some(Duration::from_millis(50))) {
                Ok((OP_FROZE, i, _)) => self.froze.push(i as usize),
                Ok(r) => break r,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    self.still_freezing(asked)?
                }
                Err(e) => return Err(e),
            }
        };
        let errno = Errno::from_raw(errno as i32);
        Ok(match (st, idx) {
            (ST_OK, _) => Ok(()),
            (_, RECORD_FAILED) => Err(FreezeFailure::Record { errno }),
            (_, i) => Err(FreezeFailure::Fifreeze { index: i as usize, errno }),
        })
    }

    /// While a FREEZE is answered: the guardian may sync for a while (its first FIFREEZE
    /// up to `FIRST_FREEZE_LIMIT`), but a dead one (its thread stuck in FIFREEZE keeps
    /// the socket open, so no end of file comes) or one stopped past its own kill point
    /// is lost now, not after a long reply timeout: reseq then thaws what it froze.
    fn still_freezing(&self, asked: Instant) -> std::io::Result<()> {
        let state = procs::stat(self.pid.as_raw()).map(|s| s.state);
        let dead = matches!(state, None | Some('Z' | 'X'));
        let stopped = matches!(state, Some('T' | 't')) && asked.elapsed() > self.give_up_stopped;
        if dead || stopped || asked.elapsed() > FIRST_FREEZE_LIMIT + self.reply_timeout {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the guardian is {} while freezing", if dead { "gone" } else { "not answering" }),
            ));
        }
        Ok(())
    }

    /// The filesystems the guardian froze in the FREEZE under way or just answered.
    pub(crate) fn froze(&self) -> &[usize] {
        &self.froze
    }

    /// Names the device the writes go to (see [`Guardian::permit`]).
    pub(crate) fn set_target(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        self.send_path(OP_TARGET, path)
    }

    /// Asks to write; `chunk` (device offset, length, blake3 of the bytes) is what the
    /// write will be, so that a guardian that must kill reseq mid-write can tell whether
    /// it left those bytes or tore them.
    pub(crate) fn permit(&mut self, chunk: Option<(u64, u64, blake3::Hash)>) -> std::io::Result<Permit> {
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
        Ok(permit_of(st, why, lost))
    }

    /// The granted write has completed.
    pub(crate) fn written(&mut self) -> std::io::Result<()> {
        self.stream.write_all(&msg(OP_WRITTEN, 0, 0))
    }

    /// Whether the window's freeze is still ours, unbroken since it began (the guardian
    /// thaws at the deadline by itself while reseq is stopped or slow); a lost freeze as
    /// [`Permit::FreezeLost`]. Grants nothing.
    pub(crate) fn held(&mut self) -> std::io::Result<Held> {
        let (st, why, v) = self.call(msg(OP_HELD, 0, 0), Some(self.reply_timeout))?;
        Ok(match permit_of(st, why, v) {
            Permit::FreezeLost { index, foreign } => Held::Lost { index, foreign },
            _ => Held::Frozen(st == ST_OK && v == 1),
        })
    }

    /// What another thread (the verifier) calls to report finished writes, so that a
    /// stalled writer thread cannot hold back the thaw. `WRITTEN` has no reply, so it
    /// cannot take the writer's reply to `PERMIT`; and each message is one 16-byte
    /// `write` on a Unix stream socket, queued whole (one skb), so messages from two
    /// threads never interleave.
    pub(crate) fn reporter(&self) -> std::io::Result<impl FnMut() -> std::io::Result<()> + Send + 'static> {
        let mut stream = self.stream.try_clone()?;
        Ok(move || stream.write_all(&msg(OP_WRITTEN, 0, 0)))
    }

    pub(crate) fn thaw(&mut self) -> std::io::Result<ThawReport> {
        let (_st, a, micros) = self.call(msg(OP_THAW, 0, 0), Some(self.reply_timeout))?;
        Ok(thaw_report_of(a, micros))
    }

    /// SIGKILL, without waiting for the exit.
    pub(crate) fn sigkill(&self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
    }

    /// The guardian stopped answering (stopped by hand, or dead): make sure it is gone,
    /// so that it cannot thaw later what is no longer ours.
    /// The wait is bounded: a guardian in D state (a FIFREEZE stuck syncing) dies only
    /// when that returns, and reseq must not hang on it.
    pub(crate) fn kill(self) {
        self.sigkill();
        self.reaped_within(Duration::from_secs(1));
    }

    /// Asks the guardian to thaw what is still frozen and exit; whether it did (false: it
    /// did not exit in time, stopped by hand, and was killed so that reseq never hangs on
    /// it; nothing is known of the thaw).
    pub(crate) fn shutdown(mut self) -> bool {
        let _ = self.stream.write_all(&msg(OP_EXIT, 0, 0));
        match self.reply(Some(self.reply_timeout)) {
            Ok((ST_OK, 1, _)) => {
                log::warn!(
                    "a freeze that waited on another filesystem has not returned: the guardian (PID {}) stays on to thaw it when it does",
                    self.pid
                );
                return true;
            }
            // No reply in all that time: stopped by hand.
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                self.kill();
                return false;
            }
            _ => {}
        }
        let exited = self.reaped_within(self.reply_timeout);
        if !exited {
            self.kill();
        }
        exited
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
    let _ = sys::process::new_session();
    sys::process::ignore_group_signals().ok()?;
    // Without pidfds (Linux < 5.3) the guardian falls back to kill(2) while reseq is
    // still its parent (a parent's PID cannot be reused while its child lives).
    let pidfd = sys::process::pidfd_open(reseq.as_raw()).ok();
    if nix::unistd::getppid() != reseq {
        return None;
    }
    let _ = sys::process::set_process_title("freeze-guardian");
    Some(pidfd)
}

/// How the guardian reaches its filesystems: FIFREEZE, FITHAW and the sentinel reads,
/// apart from what it decides (its unit tests put a scripted fake here).
trait Filesystems {
    fn count(&self) -> usize;
    /// FIFREEZE on filesystem `i`, waiting at most `limit` (`ETIMEDOUT`: abandoned, and
    /// thawed when it returns, see [`crate::host::freezer`]); also the probe (EBUSY:
    /// frozen, by anyone).
    fn fifreeze(&mut self, i: usize, limit: Duration) -> Result<(), Errno>;
    /// Waits up to `limit` for abandoned FIFREEZE calls to return; whether none is left.
    fn settle(&mut self, limit: Duration) -> bool;
    fn fithaw(&mut self, i: usize);
    /// The sentinel block (None: no sentinel, or it cannot be read).
    /// Filesystem `i`'s sentinel block, or None (none, unreadable, or not read within
    /// `limit` nor the reader's own limit).
    fn sentinel(&mut self, i: usize, limit: Duration) -> Option<Vec<u8>>;
    fn name(&self, i: usize) -> &str;
    /// Filesystem `i` as the freeze record names it, with the sentinel as read after our
    /// freeze.
    fn recorded(&self, i: usize, snapshot: Option<&Vec<u8>>) -> RecordedFs;
}

/// The filesystems for real: FIFREEZE and FITHAW on their mount points, and their
/// sentinels read on a thread of their own (see [`crate::host::sentinel`]).
struct Live {
    watched: Vec<Watched>,
    sentinels: SentinelReader,
    freezers: Freezers,
}

impl Live {
    /// The sentinel reads before a thaw at the deadline may take three quarters of the
    /// grace together: the thaw still ends within the bound. (A read slower than that
    /// proves nothing, and the freeze is thawed as ours: a foreign re-freeze is then seen
    /// only on a device that answers in time.)
    fn new(watched: Vec<Watched>, bounds: &Bounds) -> std::io::Result<Live> {
        let fds = watched
            .iter()
            .map(|w| w.sentinel.as_ref().and_then(|(_, fd, offset)| Some((fd.try_clone().ok()?, *offset))))
            .collect();
        let limit = (bounds.grace * 3 / 4 / watched.len().max(1) as u32).max(Duration::from_millis(20));
        let mounts =
            std::sync::Arc::new(watched.iter().map(|w| w.mount.try_clone()).collect::<std::io::Result<Vec<_>>>()?);
        let thaws = mounts.clone();
        let freezers = Freezers::start(
            watched.len(),
            move |i| sys::freeze::fifreeze(mounts[i].as_fd()),
            move |i| {
                let _ = sys::freeze::fithaw(thaws[i].as_fd());
            },
        )?;
        Ok(Live { sentinels: SentinelReader::start(fds, limit)?, watched, freezers })
    }
}

impl Filesystems for Live {
    fn count(&self) -> usize {
        self.watched.len()
    }
    fn fifreeze(&mut self, i: usize, limit: Duration) -> Result<(), Errno> {
        self.freezers.freeze(i, limit)
    }
    fn settle(&mut self, limit: Duration) -> bool {
        self.freezers.settle(limit)
    }
    fn fithaw(&mut self, i: usize) {
        let _ = sys::freeze::fithaw(self.watched[i].mount.as_fd());
    }
    fn sentinel(&mut self, i: usize, limit: Duration) -> Option<Vec<u8>> {
        self.sentinels.read(i, limit)
    }
    fn name(&self, i: usize) -> &str {
        &self.watched[i].name
    }
    fn recorded(&self, i: usize, snapshot: Option<&Vec<u8>>) -> RecordedFs {
        let w = &self.watched[i];
        RecordedFs {
            mount_point: w.name.clone().into(),
            dev: w.dev.clone(),
            sentinel: w.sentinel.as_ref().zip(snapshot).map(|((path, _, offset), snap)| SentinelRecord {
                device: path.clone(),
                offset: *offset,
                blake3: blake3::hash(snap).to_hex().to_string(),
            }),
        }
    }
}

struct Fs {
    /// Frozen by this guardian and not yet thawed.
    ours: bool,
    /// The sentinel block as it read right after our freeze.
    snapshot: Option<Vec<u8>>,
}

struct GuardianState<F: Filesystems = Live> {
    io: F,
    fs: Vec<Fs>,
    bounds: Bounds,
    run_dir: PathBuf,
    reseq: nix::unistd::Pid,
    reseq_fd: Option<OwnedFd>,
    journal: Option<PathBuf>,
    /// The device written (OP_TARGET), and its descriptor (O_DIRECT, read-only).
    target: Option<(PathBuf, OwnedFd)>,
    /// Granted writes not yet reported finished, oldest first: (device offset, length,
    /// blake3), None where the request did not name its write.
    granted: std::collections::VecDeque<Option<(u64, u64, [u8; 32])>>,
    /// Start times of the guardian and of reseq, for the freeze record.
    own_start_ticks: u64,
    reseq_start_ticks: u64,
    freeze_started: Option<Instant>,
    /// The window's end (`--max-freeze` after the freeze began).
    deadline: Option<Instant>,
    /// The deadline passed: no more grants in this window; thaw when `granted` is empty.
    revoked: bool,
    frozen_for: Duration,
    /// How long the last thaw's checks of our freezes (probe and sentinel) took.
    checked_in: Duration,
    /// (index, foreign) of a freeze lost in this window.
    lost: Option<(usize, bool)>,
    windows: u64,
    /// Where `OP_FROZE` goes (the socket; None in unit tests).
    progress: Option<UnixStream>,
}

enum Next {
    Continue,
    Exit(i32),
}

impl<F: Filesystems> GuardianState<F> {
    fn new(
        io: F,
        bounds: Bounds,
        run_dir: PathBuf,
        reseq: nix::unistd::Pid,
        reseq_fd: Option<OwnedFd>,
    ) -> GuardianState<F> {
        GuardianState {
            fs: (0..io.count()).map(|_| Fs { ours: false, snapshot: None }).collect(),
            io,
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
            revoked: false,
            frozen_for: Duration::ZERO,
            checked_in: Duration::ZERO,
            lost: None,
            windows: 0,
            progress: None,
        }
    }

    fn any_ours(&self) -> bool {
        self.fs.iter().any(|f| f.ours)
    }

    fn names(&self) -> String {
        (0..self.fs.len()).map(|i| self.io.name(i)).collect::<Vec<_>>().join(", ")
    }

    fn record(&self) -> FreezeRecord {
        FreezeRecord {
            guardian_pid: std::process::id() as i32,
            guardian_start_ticks: self.own_start_ticks,
            reseq_pid: self.reseq.as_raw(),
            reseq_start_ticks: self.reseq_start_ticks,
            filesystems: self.fs.iter().enumerate().map(|(i, f)| self.io.recorded(i, f.snapshot.as_ref())).collect(),
        }
    }

    /// Thaws every freeze that is ours, never one that is not: the sentinels are read
    /// first on every path (deadline, end of window, reseq gone, kill, exit).
    fn thaw_all(&mut self) {
        let t = Instant::now();
        if self.any_ours() {
            self.check_freezes();
        }
        self.checked_in = t.elapsed();
        // Reverse order: the mirror of freezing.
        for i in (0..self.fs.len()).rev() {
            if !self.fs[i].ours {
                continue;
            }
            self.io.fithaw(i);
            self.fs[i].ours = false;
            self.fs[i].snapshot = None;
        }
        if let Some(start) = self.freeze_started.take() {
            self.frozen_for = start.elapsed();
        }
        self.deadline = None;
        // A FIFREEZE abandoned at its limit may still freeze: the record stays until it
        // has returned and been thawed (see `linger`).
        if self.io.settle(Duration::ZERO) {
            FreezeRecord::remove(&self.run_dir, std::process::id() as i32, self.own_start_ticks);
        }
    }

    /// Before leaving: a FIFREEZE abandoned at its limit (it waits on a filesystem frozen
    /// by someone else) freezes when that one thaws, and only its thread, in this
    /// process, will thaw it then. So the guardian stays as long as it takes.
    fn linger(&mut self) {
        if !self.io.settle(Duration::ZERO) {
            say!(
                "reseq guardian: a freeze that waited on another filesystem has not returned; staying to thaw it when it does ({})",
                self.names()
            );
            while !self.io.settle(Duration::from_secs(60)) {}
            say!("reseq guardian: the late freeze returned and was thawed");
        }
        if !self.any_ours() {
            FreezeRecord::remove(&self.run_dir, std::process::id() as i32, self.own_start_ticks);
        }
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
        self.granted.clear();
        self.windows += 1;
        for i in 0..self.fs.len() {
            let limit = self.freeze_limit();
            if let Err(errno) = self.io.fifreeze(i, limit) {
                self.thaw_all();
                return Err((i as u32, errno));
            }
            self.fs[i].ours = true;
            if let Some(s) = &mut self.progress {
                let _ = s.write_all(&msg(OP_FROZE, i as u32, 0));
            }
            self.fs[i].snapshot = self.io.sentinel(i, Duration::MAX);
        }
        Ok(())
    }

    /// How long the next FIFREEZE may take. Once anything is frozen, only until the
    /// moment that still leaves time to thaw it within the bound: a FIFREEZE that waits
    /// on a frozen filesystem (ours, or someone else's) must not hold ours frozen. The
    /// first may take longer (its own sync; nothing of ours waits on it), within reason.
    fn freeze_limit(&self) -> Duration {
        let until_bound = self
            .deadline
            .map(|d| (d + self.bounds.kill_after()).saturating_duration_since(Instant::now()))
            .unwrap_or_default()
            .max(Duration::from_millis(1));
        if self.any_ours() { until_bound } else { until_bound.max(FIRST_FREEZE_LIMIT) }
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
            match self.io.fifreeze(i, PROBE_LIMIT) {
                Err(Errno::EBUSY) => {
                    // A sentinel that cannot be read now (the device failing: EIO, a FUSE
                    // server gone) says nothing about who froze: the freeze stays ours
                    // and is thawed. Taking it for a foreign one left a filesystem
                    // frozen when an emulated drive's server was killed mid-run.
                    let now = self.io.sentinel(i, self.sentinel_budget());
                    if self.fs[i].snapshot.is_some() && now.is_some() && now != self.fs[i].snapshot {
                        self.fs[i].ours = false;
                        self.lost.get_or_insert((i, true));
                    }
                }
                Ok(()) => {
                    self.fs[i].snapshot = self.io.sentinel(i, self.sentinel_budget());
                    self.lost.get_or_insert((i, false));
                }
                Err(Errno::ETIMEDOUT | Errno::EDEADLK) => {
                    // Someone thawed ours and the probe's own freeze is stuck syncing
                    // (nothing else holds a probe 10 s): it is its thread's to thaw when
                    // it returns, and a FITHAW here would wait behind it.
                    self.fs[i].ours = false;
                    self.lost.get_or_insert((i, false));
                }
                Err(_) => {
                    self.lost.get_or_insert((i, false));
                }
            }
        }
    }

    /// How long a sentinel read before a thaw may take: until the bound, less a fifth of
    /// the grace for the thaw itself. At the deadline that is most of the grace; after a
    /// kill (half the grace later, and the granted writes read back) little or nothing,
    /// and the freeze is then thawed as ours unread, as after a read too slow to tell.
    /// (A read allowed three quarters of the grace there took 255 ms of a loaded host's
    /// disk, and the thaw came at 1,018 ms of a 1,000 ms bound.)
    fn sentinel_budget(&self) -> Duration {
        let Some(start) = self.freeze_started else { return Duration::MAX };
        (self.bounds.window + self.bounds.grace).saturating_sub(start.elapsed()).saturating_sub(self.bounds.grace / 5)
    }

    fn past(&self, extra: Duration) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d + extra)
    }

    /// The deadline has passed: stop granting, and thaw once no write is outstanding.
    fn revoke(&mut self) {
        self.revoked = true;
        if self.granted.is_empty() && self.any_ours() {
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
        let until = if !self.revoked || self.granted.is_empty() { d } else { d + self.bounds.kill_after() };
        Some(until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
    }

    fn serve(&mut self, mut stream: UnixStream) -> i32 {
        self.progress = stream.try_clone().ok();
        loop {
            if stream.set_read_timeout(self.timeout()).is_err() {
                self.thaw_all();
                return exit::NO_TIMEOUT;
            }
            let mut m = [0u8; 16];
            match stream.read_exact(&mut m) {
                Ok(()) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if self.any_ours() && self.past(self.bounds.kill_after()) && !self.granted.is_empty() {
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

    /// One request: read what follows its message, decide, reply.
    fn handle(&mut self, stream: &mut UnixStream, m: Msg) -> Next {
        let Some(request) = read_request(stream, m) else { return Next::Exit(self.reseq_gone()) };
        if let Request::Exit = request {
            // The reply says whether the guardian stays on after this (see `linger`), so
            // that reseq does not wait for it, nor kill it.
            self.thaw_all();
            let _ = stream.write_all(&msg(ST_OK, u32::from(!self.io.settle(Duration::ZERO)), 0));
            return Next::Exit(0);
        }
        let freeze = matches!(request, Request::Freeze(_));
        let reply = match self.apply(request) {
            Ok(reply) => reply,
            Err(code) => return Next::Exit(code),
        };
        if let Some(r) = reply
            && stream.write_all(&r).is_err()
        {
            return Next::Exit(self.reseq_gone());
        }
        if freeze && self.any_ours() {
            // Again, with the sentinels, so that `reseq thaw` can tell our freeze from a
            // later one; after the reply, so that reseq reads its first chunks meanwhile.
            // A failure costs only that check: the first record stands.
            let _ = self.record().write(&self.run_dir);
        }
        Next::Continue
    }

    /// What the guardian decides for one request: the reply (None: the request has
    /// none), or the exit code when it leaves.
    fn apply(&mut self, request: Request) -> Result<Option<Msg>, i32> {
        Ok(Some(match request {
            Request::Journal(path) => {
                self.journal = Some(path);
                msg(ST_OK, 0, 0)
            }
            Request::Freeze(window) => match self.freeze(window) {
                Ok(()) => msg(ST_OK, 0, 0),
                Err((index, errno)) => msg(ST_ERR, index, errno as i32 as u64),
            },
            Request::Target(path) => {
                self.target = sys::block::open_direct_read(&path).ok().map(|fd| (path, fd));
                msg(ST_OK, 0, 0)
            }
            Request::Permit(chunk) => self.permit(chunk),
            Request::Held => self.held(),
            Request::Written => {
                self.written();
                return Ok(None);
            }
            Request::Thaw => self.end_window(),
            Request::Exit => {
                self.thaw_all();
                return Err(0);
            }
            Request::Unknown => {
                self.thaw_all();
                return Err(exit::UNKNOWN_REQUEST);
            }
        }))
    }

    /// One granted write (and its read-back) is over.
    fn written(&mut self) {
        self.granted.pop_front();
        // The deadline passed (or the freeze was lost) during the write: thaw now, not at
        // the next request.
        if self.any_ours() && (self.revoked || self.past(Duration::ZERO)) {
            self.revoke();
        }
    }

    /// THAW: ends the window, and says how it went.
    fn end_window(&mut self) -> Msg {
        self.granted.clear();
        // Also when nothing is ours any more (lost to another freezer): that ends the
        // window's clock and removes its record.
        self.thaw_all();
        // Any window frozen longer than --max-freeze overran, whoever thawed it.
        let overran = self.frozen_for > self.bounds.window;
        let mut flags = u32::from(overran) * THAW_OVERRAN;
        if let Some((i, foreign)) = self.lost {
            flags |= THAW_LOST | (u32::from(foreign) * THAW_FOREIGN) | ((i as u32) << 8);
        }
        msg(ST_OK, flags, self.frozen_for.as_micros() as u64)
    }

    /// HELD: a freeze is still ours only if nothing thawed it meanwhile (checked as for a
    /// permit); a lost one stops the window as a permit would. Grants nothing.
    fn held(&mut self) -> Msg {
        if self.any_ours() {
            self.check_freezes();
        }
        self.stop_if_lost().unwrap_or_else(|| msg(ST_OK, 0, u64::from(self.any_ours())))
    }

    /// A freeze found lost stops the window here: what is still ours is thawed (once no
    /// write is outstanding), what is not is left; the reply names it.
    fn stop_if_lost(&mut self) -> Option<Msg> {
        let lost = self.lost?;
        self.revoked = true;
        if self.granted.is_empty() {
            self.thaw_all();
        }
        Some(freeze_lost_reply(lost))
    }

    fn permit(&mut self, chunk: Option<(u64, u64, [u8; 32])>) -> Msg {
        if !self.any_ours() || self.revoked {
            return self.lost.map_or(msg(ST_DENIED, DENY_DEADLINE, 0), freeze_lost_reply);
        }
        if self.past(Duration::ZERO) {
            self.revoke();
            return msg(ST_DENIED, DENY_DEADLINE, 0);
        }
        self.check_freezes();
        if let Some(reply) = self.stop_if_lost() {
            return reply;
        }
        self.granted.push_back(chunk);
        msg(ST_OK, 0, 0)
    }

    /// After a panic in `serve`: thaw, then say what happened. A second panic while
    /// thawing must not unwind either: the freeze record stays, and `reseq thaw` acts on
    /// the records of guardians that are gone.
    fn recover_from_panic(&mut self) -> i32 {
        let thawed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.thaw_all())).is_ok();
        let note = crate::engine::rescue::take_panic_note(&self.run_dir, std::process::id() as i32);
        say!("{}", note.unwrap_or_default().trim_end());
        if thawed {
            return exit::PANICKED;
        }
        say!("reseq guardian: thawing failed too; run `reseq thaw` (it acts on this guardian's freeze record)");
        exit::THAW_PANICKED
    }

    /// End of file: reseq has exited; none of its I/O is in flight.
    fn reseq_gone(&mut self) -> i32 {
        let n = self.fs.iter().filter(|f| f.ours).count();
        self.thaw_all();
        // What reseq could not print while frozen (a panic), now that stderr cannot block.
        if let Some(note) = crate::engine::rescue::take_panic_note(&self.run_dir, self.reseq.as_raw()) {
            say!("{}", note.trim_end());
        }
        if n > 0 {
            say!("reseq guardian: reseq exited while {n} filesystem(s) were frozen; thawed them ({})", self.names());
        }
        0
    }

    /// A write or read-back is still outstanding at the deadline plus the grace: reseq is
    /// stopped or stalled. Kill it, wait until none of its threads is left (the socket's
    /// end of file), then thaw.
    fn kill_reseq(&mut self, stream: &mut UnixStream) -> i32 {
        // When each step came, in ms of the window: said after the thaw, so that a bound
        // broken here shows where its time went.
        let started = self.freeze_started;
        let at = || started.map(|s| s.elapsed()).unwrap_or_default();
        let kill_at = at().as_millis();
        let killed = match &self.reseq_fd {
            Some(fd) => sys::process::pidfd_kill(fd.as_fd()).is_ok(),
            None => {
                nix::unistd::getppid() == self.reseq
                    && nix::sys::signal::kill(self.reseq, nix::sys::signal::Signal::SIGKILL).is_ok()
            }
        };
        wait_for_the_end(stream, self.reseq.as_raw());
        let frozen_since = at();
        let names = self.names();
        // Still frozen, and none of reseq's I/O in flight: what the granted writes left
        // is theirs alone. After the thaw the filesystem may write there too.
        let in_flight = self.check_granted();
        let checked_at = at().as_millis();
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
        say!(
            "reseq guardian: window {window}: the kill at {kill_at} ms, reseq gone at {} ms, {} granted write(s) read back by {checked_at} ms, freezes checked in {} ms, thawed at {} ms",
            frozen_since.as_millis(),
            in_flight.len(),
            self.checked_in.as_millis(),
            self.frozen_for.as_millis()
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

impl<F: Filesystems> GuardianState<F> {
    /// Reads back each granted, unreported write (reseq is gone, its I/O finished) and
    /// compares it with the bytes it was to write. One that is not intact is also noted
    /// in the run directory, which every later run on the device reads, whatever mode it
    /// runs in and whether or not its journal reached the disk.
    fn check_granted(&self) -> Vec<crate::engine::journal::InFlightCheck> {
        self.granted
            .iter()
            .flatten()
            .map(|&(offset, len, hash)| {
                let intact = self.target.as_ref().and_then(|(_, fd)| {
                    let mut buf = sys::memory::AlignedBuf::new(len as usize, 4096);
                    sys::block::pread_exact(fd.as_fd(), &mut buf[..len as usize], offset).ok()?;
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

/// After the kill: reads the socket until its end of file (no thread of reseq left, so
/// none of its I/O in flight). A reseq frozen by a cgroup v1 freezer cannot die until it
/// is thawed: it is moved out of its frozen group, alone, so that the kill lands.
fn wait_for_the_end(stream: &mut UnixStream, reseq: i32) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let mut sink = [0u8; 256];
    let mut released = false;
    loop {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                released = released || crate::host::cgroup::release_from_v1_freeze(reseq);
            }
            _ => return,
        }
    }
}

/// A message from reseq, with what follows it.
#[derive(Debug)]
enum Request {
    Journal(PathBuf),
    Freeze(Duration),
    Target(PathBuf),
    /// The write to be granted: device offset, length, blake3 (None: not named).
    Permit(Option<(u64, u64, [u8; 32])>),
    Held,
    Written,
    Thaw,
    Exit,
    Unknown,
}

/// Decodes a message, reading the path or hash that follows it (None: reseq is gone).
fn read_request(stream: &mut impl Read, m: Msg) -> Option<Request> {
    let (op, a, b) = fields(&m);
    Some(match op {
        OP_JOURNAL => Request::Journal(read_path(stream, a)?),
        OP_FREEZE => Request::Freeze(Duration::from_millis(b)),
        OP_TARGET => Request::Target(read_path(stream, a)?),
        OP_PERMIT if a > 0 => {
            let mut hash = [0u8; 32];
            stream.read_exact(&mut hash).ok()?;
            Request::Permit(Some((b, u64::from(a), hash)))
        }
        OP_PERMIT => Request::Permit(None),
        OP_HELD => Request::Held,
        OP_WRITTEN => Request::Written,
        OP_THAW => Request::Thaw,
        OP_EXIT => Request::Exit,
        _ => Request::Unknown,
    })
}

/// The path of `len` bytes that follows a message.
fn read_path(stream: &mut impl Read, len: u32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let mut path = vec![0u8; len.min(MAX_PATH) as usize];
    stream.read_exact(&mut path).ok()?;
    Some(PathBuf::from(std::ffi::OsString::from_vec(path)))
}

/// The 4 KiB at `offset` of an O_DIRECT descriptor.
pub(crate) fn read_block(fd: std::os::fd::BorrowedFd<'_>, offset: u64) -> Option<Vec<u8>> {
    let mut buf = sys::memory::AlignedBuf::new(4096, 4096);
    sys::block::pread_exact(fd, &mut buf, offset).ok()?;
    Some(buf.to_vec())
}

#[cfg(test)]
mod tests {
    //! The guardian's decisions, without fork, root or FIFREEZE: its state machine over
    //! scripted filesystems, fed the requests its socket would carry.

    use std::cell::RefCell;
    use std::path::Path;
    use std::rc::Rc;

    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum By {
        Nobody,
        Us,
        Other,
    }

    /// Each filesystem: who froze it, its sentinel (bumped by every freeze, as ext4 and
    /// xfs write their superblock), and whether the sentinel can be read.
    #[derive(Clone, Copy, Debug)]
    struct FakeFs {
        by: By,
        generation: u64,
        readable: bool,
        /// Its FIFREEZE does not return in time (it waits on another freeze).
        stuck: bool,
        /// Its FIFREEZE answers only after 100 ms (a busy host): a shorter wait gives up.
        slow: bool,
    }

    #[derive(Clone)]
    struct Fake(Rc<RefCell<Vec<FakeFs>>>, Vec<String>);

    impl Fake {
        fn new(n: usize) -> Fake {
            let fs = FakeFs { by: By::Nobody, generation: 0, readable: true, stuck: false, slow: false };
            Fake(Rc::new(RefCell::new(vec![fs; n])), (0..n).map(|i| format!("/mnt/{i}")).collect())
        }
        fn by(&self) -> Vec<By> {
            self.0.borrow().iter().map(|f| f.by).collect()
        }
        /// Someone thaws filesystem `i` (ours or not).
        fn thawed_by_someone(&self, i: usize) {
            self.0.borrow_mut()[i].by = By::Nobody;
        }
        /// Someone thaws filesystem `i` and freezes it again: their freeze now.
        fn refrozen_by_someone(&self, i: usize) {
            let mut fs = self.0.borrow_mut();
            fs[i].by = By::Other;
            fs[i].generation += 1;
        }
    }

    impl Filesystems for Fake {
        fn count(&self) -> usize {
            self.1.len()
        }
        fn fifreeze(&mut self, i: usize, limit: Duration) -> Result<(), Errno> {
            let mut fs = self.0.borrow_mut();
            if fs[i].stuck || (fs[i].slow && limit < Duration::from_millis(100)) {
                return Err(Errno::ETIMEDOUT);
            }
            if fs[i].by != By::Nobody {
                return Err(Errno::EBUSY);
            }
            fs[i].by = By::Us;
            fs[i].generation += 1;
            Ok(())
        }
        fn settle(&mut self, _limit: Duration) -> bool {
            !self.0.borrow().iter().any(|f| f.stuck)
        }
        fn fithaw(&mut self, i: usize) {
            let mut fs = self.0.borrow_mut();
            assert_ne!(fs[i].by, By::Other, "the guardian thawed a freeze that is not its own");
            fs[i].by = By::Nobody;
        }
        fn sentinel(&mut self, i: usize, _limit: Duration) -> Option<Vec<u8>> {
            let fs = self.0.borrow()[i];
            fs.readable.then(|| fs.generation.to_le_bytes().to_vec())
        }
        fn name(&self, i: usize) -> &str {
            &self.1[i]
        }
        fn recorded(&self, i: usize, _snapshot: Option<&Vec<u8>>) -> RecordedFs {
            RecordedFs { mount_point: self.1[i].clone().into(), dev: "0:0".into(), sentinel: None }
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    fn guardian(n: usize, window: Duration) -> (GuardianState<Fake>, Fake, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::new(n);
        let bounds = Bounds { window, grace: Duration::from_millis(250) };
        let g = GuardianState::new(fake.clone(), bounds, dir.path().into(), nix::unistd::getpid(), None);
        (g, fake, dir)
    }

    fn reply(g: &mut GuardianState<Fake>, r: Request) -> (u8, u32, u64) {
        fields(&g.apply(r).expect("stays").expect("a reply"))
    }

    fn permit(g: &mut GuardianState<Fake>, offset: u64) -> Permit {
        let (st, why, lost) = reply(g, Request::Permit(Some((offset, 4096, [7; 32]))));
        permit_of(st, why, lost)
    }

    fn thaw(g: &mut GuardianState<Fake>) -> ThawReport {
        let (st, a, micros) = reply(g, Request::Thaw);
        assert_eq!(st, ST_OK);
        thaw_report_of(a, micros)
    }

    fn record_exists(dir: &tempfile::TempDir) -> bool {
        crate::host::freeze_record::list(dir.path()).is_ok_and(|l| !l.is_empty())
    }

    #[test]
    fn grants_within_the_deadline_and_thaws_on_request() {
        let (mut g, fake, dir) = guardian(2, HOUR);
        assert_eq!(reply(&mut g, Request::Freeze(HOUR)).0, ST_OK);
        assert_eq!(fake.by(), [By::Us, By::Us]);
        assert!(record_exists(&dir), "the freeze record is written before the freeze");
        assert_eq!(permit(&mut g, 0), Permit::Granted);
        assert_eq!(g.granted.len(), 1);
        assert_eq!(g.apply(Request::Written), Ok(None), "WRITTEN has no reply");
        assert_eq!(g.granted.len(), 0);
        assert_eq!(fake.by(), [By::Us, By::Us], "a write within the deadline does not end the window");
        let t = thaw(&mut g);
        assert!(!t.overran && t.lost.is_none());
        assert_eq!(fake.by(), [By::Nobody, By::Nobody]);
        assert!(!record_exists(&dir), "the record goes with the thaw");
    }

    #[test]
    fn after_the_deadline_an_idle_window_is_denied_and_thawed_at_once() {
        let (mut g, fake, _dir) = guardian(1, Duration::ZERO);
        assert_eq!(reply(&mut g, Request::Freeze(Duration::ZERO)).0, ST_OK);
        assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed);
        assert_eq!(fake.by(), [By::Nobody], "no write outstanding: thawed at the refusal");
        assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed, "and stays refused");
        assert!(thaw(&mut g).overran, "frozen past a zero --max-freeze");
    }

    #[test]
    fn a_deadline_passing_mid_write_waits_for_written_then_thaws() {
        let (mut g, fake, _dir) = guardian(1, HOUR);
        reply(&mut g, Request::Freeze(HOUR));
        assert_eq!(permit(&mut g, 0), Permit::Granted);
        g.deadline = Instant::now().checked_sub(Duration::from_millis(1));
        assert_eq!(permit(&mut g, 4096), Permit::DeadlinePassed);
        assert_eq!(fake.by(), [By::Us], "never thawed under an outstanding write");
        assert_eq!(g.granted.len(), 1, "a refused write is not waited for");
        g.apply(Request::Written).unwrap();
        assert_eq!(fake.by(), [By::Nobody], "thawed as soon as the write was over");
        assert!(g.timeout().is_none(), "nothing left to wake up for");
    }

    #[test]
    fn written_settles_the_oldest_grant_first() {
        let (mut g, _fake, _dir) = guardian(1, HOUR);
        reply(&mut g, Request::Freeze(HOUR));
        assert_eq!(permit(&mut g, 0), Permit::Granted);
        assert_eq!(permit(&mut g, 4096), Permit::Granted);
        assert_eq!(g.granted.len(), 2);
        g.apply(Request::Written).unwrap();
        assert_eq!(g.granted.iter().flatten().map(|c| c.0).collect::<Vec<_>>(), [4096]);
        thaw(&mut g);
        assert_eq!(g.granted.len(), 0, "a thaw ends the window's accounting");
    }

    #[test]
    fn a_freeze_thawed_by_someone_else_is_denied_and_the_window_ends() {
        let (mut g, fake, _dir) = guardian(2, HOUR);
        reply(&mut g, Request::Freeze(HOUR));
        fake.thawed_by_someone(1);
        assert_eq!(permit(&mut g, 0), Permit::FreezeLost { index: 1, foreign: false });
        assert_eq!(fake.by(), [By::Nobody, By::Nobody], "the probe's fresh freeze is ours, and thawed");
        assert_eq!(thaw(&mut g).lost, Some((1, false)));
    }

    fn held(g: &mut GuardianState<Fake>) -> (u8, u32, u64) {
        reply(g, Request::Held)
    }

    /// HELD grants nothing, and tells a freeze held since the window began from one the
    /// guardian thawed at the deadline, and from one lost to another program.
    #[test]
    fn held_says_whether_the_freeze_was_kept_and_grants_nothing() {
        let (mut g, fake, _dir) = guardian(1, HOUR);
        reply(&mut g, Request::Freeze(HOUR));
        assert_eq!(held(&mut g), (ST_OK, 0, 1));
        assert_eq!(g.granted.len(), 0, "nothing granted");
        assert_eq!(fake.by(), [By::Us]);
        thaw(&mut g);
        assert_eq!(held(&mut g), (ST_OK, 0, 0), "thawed: the filesystem may have written since");

        let (mut g, fake, _dir) = guardian(1, Duration::ZERO);
        reply(&mut g, Request::Freeze(Duration::ZERO));
        assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed);
        assert_eq!(fake.by(), [By::Nobody]);
        assert_eq!(held(&mut g), (ST_OK, 0, 0), "thawed at the deadline");

        let (mut g, fake, _dir) = guardian(2, HOUR);
        reply(&mut g, Request::Freeze(HOUR));
        fake.refrozen_by_someone(1);
        let (st, why, v) = held(&mut g);
        assert_eq!(permit_of(st, why, v), Permit::FreezeLost { index: 1, foreign: true });
        assert_eq!(fake.by(), [By::Nobody, By::Other], "ours thawed, theirs kept");
        assert_eq!(thaw(&mut g).lost, Some((1, true)));
    }

    #[test]
    fn a_foreign_freeze_is_told_by_its_sentinel_and_left_alone() {
        let (mut g, fake, _dir) = guardian(2, HOUR);
        reply(&mut g, Request::Freeze(HOUR));
        fake.refrozen_by_someone(0);
        assert_eq!(permit(&mut g, 0), Permit::FreezeLost { index: 0, foreign: true });
        assert_eq!(fake.by(), [By::Other, By::Nobody], "ours thawed, theirs kept");
        assert_eq!(permit(&mut g, 0), Permit::FreezeLost { index: 0, foreign: true }, "and stays refused");
        assert_eq!(thaw(&mut g).lost, Some((0, true)));
        assert_eq!(fake.by(), [By::Other, By::Nobody]);
    }

    #[test]
    fn an_unreadable_sentinel_proves_nothing_the_freeze_stays_ours() {
        let (mut g, fake, _dir) = guardian(1, HOUR);
        reply(&mut g, Request::Freeze(HOUR));
        fake.0.borrow_mut()[0].readable = false;
        assert_eq!(permit(&mut g, 0), Permit::Granted);
        g.apply(Request::Written).unwrap();
        assert_eq!(thaw(&mut g).lost, None);
        assert_eq!(fake.by(), [By::Nobody], "thawed: it was ours");
    }

    #[test]
    fn a_failed_freeze_is_undone_and_names_the_filesystem() {
        let (mut g, fake, dir) = guardian(3, HOUR);
        fake.refrozen_by_someone(1);
        let (st, index, errno) = reply(&mut g, Request::Freeze(HOUR));
        assert_eq!((st, index, errno), (ST_ERR, 1, Errno::EBUSY as i32 as u64));
        assert_eq!(fake.by(), [By::Nobody, By::Other, By::Nobody], "the first freeze undone, theirs kept");
        assert!(!record_exists(&dir));
        assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed, "nothing granted outside a window");
    }

    #[test]
    fn a_freeze_that_does_not_return_thaws_the_others_and_keeps_the_record() {
        let (mut g, fake, dir) = guardian(3, HOUR);
        fake.0.borrow_mut()[1].stuck = true;
        let (st, index, errno) = reply(&mut g, Request::Freeze(HOUR));
        assert_eq!((st, index, errno), (ST_ERR, 1, Errno::ETIMEDOUT as i32 as u64));
        assert_eq!(fake.by(), [By::Nobody, By::Nobody, By::Nobody], "the first freeze undone at once");
        assert!(record_exists(&dir), "the late freeze may still come: its record stays");
        fake.0.borrow_mut()[1].stuck = false;
        g.linger();
        assert!(!record_exists(&dir), "gone once the late freeze returned");
    }

    #[test]
    fn a_probe_answered_late_after_the_deadline_still_thaws() {
        // Past the deadline the time left to the bound is nothing: a probe given only
        // that gave up on the EBUSY of our own freeze, took it for lost, and never thawed.
        let (mut g, fake, _dir) = guardian(1, Duration::from_millis(10));
        reply(&mut g, Request::Freeze(Duration::from_millis(10)));
        fake.0.borrow_mut()[0].slow = true;
        // Past the deadline and half the grace (125 ms): a stalled writer's kill point.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(permit(&mut g, 0), Permit::DeadlinePassed);
        assert_eq!(fake.by(), [By::Nobody], "thawed");
    }

    #[test]
    fn the_freeze_limit_leaves_time_to_thaw_within_the_bound() {
        let (mut g, _fake, _dir) = guardian(2, Duration::from_millis(500));
        assert_eq!(g.freeze_limit(), FIRST_FREEZE_LIMIT, "outside a window");
        reply(&mut g, Request::Freeze(Duration::from_millis(500)));
        let limit = g.freeze_limit();
        let bound = Duration::from_millis(500) + g.bounds.kill_after();
        assert!(limit <= bound && limit > bound - Duration::from_millis(200), "{limit:?}");
    }

    #[test]
    fn no_freeze_without_its_record() {
        let (mut g, fake, dir) = guardian(1, HOUR);
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        g.run_dir = file.join("run");
        let (st, index, _) = reply(&mut g, Request::Freeze(HOUR));
        assert_eq!((st, index), (ST_ERR, RECORD_FAILED));
        assert_eq!(fake.by(), [By::Nobody]);
    }

    #[test]
    fn exit_and_unknown_messages_thaw_and_leave() {
        for (request, code) in [(Request::Exit, 0), (Request::Unknown, exit::UNKNOWN_REQUEST)] {
            let (mut g, fake, _dir) = guardian(1, HOUR);
            reply(&mut g, Request::Freeze(HOUR));
            assert_eq!(g.apply(request), Err(code));
            assert_eq!(fake.by(), [By::Nobody]);
        }
    }

    #[test]
    fn requests_decode_with_what_follows_them() {
        let hash = [9u8; 32];
        let mut bytes = hash.to_vec();
        let r = read_request(&mut bytes.as_slice(), msg(OP_PERMIT, 4096, 1 << 20));
        assert!(matches!(r, Some(Request::Permit(Some((1048576, 4096, h)))) if h == hash));
        assert!(matches!(read_request(&mut [0u8; 0].as_slice(), msg(OP_PERMIT, 0, 0)), Some(Request::Permit(None))));
        assert!(read_request(&mut [0u8; 5].as_slice(), msg(OP_PERMIT, 4096, 0)).is_none(), "a cut-short hash");
        bytes = b"/state/j".to_vec();
        let r = read_request(&mut bytes.as_slice(), msg(OP_JOURNAL, 8, 0));
        assert!(matches!(r, Some(Request::Journal(p)) if p == Path::new("/state/j")));
        assert!(
            matches!(read_request(&mut [0u8; 0].as_slice(), msg(OP_FREEZE, 0, 1500)), Some(Request::Freeze(d)) if d == Duration::from_millis(1500))
        );
        assert!(matches!(read_request(&mut [0u8; 0].as_slice(), msg(99, 0, 0)), Some(Request::Unknown)));
    }

    #[test]
    fn replies_decode_to_what_reseq_acts_on() {
        assert_eq!(fields(&msg(OP_THAW, u32::MAX, u64::MAX)), (OP_THAW, u32::MAX, u64::MAX));
        let (st, why, lost) = fields(&freeze_lost_reply((3, true)));
        assert_eq!(permit_of(st, why, lost), Permit::FreezeLost { index: 3, foreign: true });
        assert_eq!(permit_of(ST_DENIED, DENY_DEADLINE, 0), Permit::DeadlinePassed);
        let t = thaw_report_of(THAW_OVERRAN | THAW_LOST | (2 << 8), 1_500_000);
        assert!(t.overran);
        assert_eq!(t.lost, Some((2, false)));
        assert_eq!(t.frozen, Duration::from_millis(1500));
    }
}
