//! The guardian: a forked process that owns every freeze reseq makes, so that no way
//! of dying leaves a filesystem frozen.
//!
//! Why a process and not a thread or a signal handler: SIGKILL runs no handler and kills
//! every thread, while a freeze outlives its maker (see `../shared/KERNEL-FACTS.md`).
//! Only another process can thaw after that. Why the guardian freezes (not reseq):
//! then it knows exactly which freezes are its own. If reseq froze and died before
//! telling it, the guardian could not tell our freeze from an admin's, and must never
//! thaw the latter.
//!
//! Protocol (a Unix socket pair, fixed 16-byte messages, strictly request/reply):
//! - `FREEZE ms`: freeze every filesystem in order; undo and report the first failure.
//!   The window deadline starts *before* the first FIFREEZE: the stall applications see
//!   starts there.
//! - `PERMIT`: reseq asks before each device write. Granted only while the window is
//!   frozen and its deadline has not passed. A refusal after the deadline makes the
//!   guardian thaw at once. Because reseq reads a chunk before asking and writes it only
//!   after a grant, a chunk's read and write always lie inside one freeze.
//! - `WRITTEN`: one granted write finished, and its read-back too. Several may be
//!   outstanding (the verifier reads back one chunk while the next is written). While any
//!   is, the guardian does not thaw even past the deadline: thawing under an in-flight
//!   write of stale bytes could let the filesystem's newer write lose, and a read-back
//!   after a thaw could see the filesystem's own changes. Past the deadline it refuses
//!   new grants and thaws the moment the last outstanding write reports.
//! - `THAW`: end the window; the reply says whether the deadline was overrun and how
//!   long the filesystems were frozen.
//! - `EXIT`: leave.
//!
//! End of file on the socket means reseq is gone. The socket closes only when the last
//! thread of reseq has exited, and a process cannot exit while its O_DIRECT I/O is in
//! flight, so at EOF nothing of reseq's can still reach the device: the guardian thaws
//! and exits.
//!
//! The guardian never execs and writes nothing while a filesystem is frozen (its stderr
//! could be a file on that filesystem): it speaks only after thawing.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::sys;

const OP_FREEZE: u8 = 1;
const OP_PERMIT: u8 = 2;
const OP_WRITTEN: u8 = 3;
const OP_THAW: u8 = 4;
const OP_EXIT: u8 = 5;

const ST_OK: u8 = 0;
const ST_ERR: u8 = 1;
const ST_DENIED: u8 = 2;

const DENY_DEADLINE: u32 = 1;
const DENY_FREEZE_LOST: u32 = 2;

/// The answer to a request to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Write now, then report `WRITTEN`.
    Granted,
    /// The window's deadline passed; the guardian has thawed. Do not write.
    DeadlinePassed,
    /// Someone else thawed our freeze during the window. Do not write.
    FreezeLost,
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
pub struct FreezeFailure {
    /// Index into the filesystem list of the one that failed.
    pub index: usize,
    pub errno: Errno,
}

/// What the end of a window reports.
#[derive(Debug, Clone, Copy)]
pub struct ThawReport {
    /// The deadline passed and the guardian thawed on its own.
    pub overran: bool,
    /// How long the filesystems were frozen (from the first FIFREEZE call to the thaw).
    pub frozen: Duration,
    /// FITHAW said a filesystem was not frozen: someone thawed our freeze.
    pub thawed_by_someone_else: bool,
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
}

impl Guardian {
    /// Forks the guardian. `fs_fds` are open descriptors of the filesystems to freeze
    /// (mount point directories), `names` their mount points for messages.
    /// Must be called while the process has a single thread.
    pub fn spawn(fs_fds: &[OwnedFd], names: &[String]) -> std::io::Result<Guardian> {
        let (ours, theirs) = UnixStream::pair()?;
        match sys::fork_single_threaded()? {
            sys::Forked::Parent { child } => {
                drop(theirs);
                Ok(Guardian { stream: ours, pid: child })
            }
            sys::Forked::Child => {
                drop(ours);
                let code = guardian_main(theirs, fs_fds, names);
                sys::exit_immediately(code)
            }
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    fn call(&mut self, m: Msg) -> std::io::Result<(u8, u32, u64)> {
        self.stream.write_all(&m)?;
        let mut reply = [0u8; 16];
        self.stream.read_exact(&mut reply)?;
        Ok(fields(&reply))
    }

    /// Freezes every filesystem; the window may last `deadline`.
    pub fn freeze(&mut self, deadline: Duration) -> std::io::Result<Result<(), FreezeFailure>> {
        let (st, idx, errno) = self.call(msg(OP_FREEZE, 0, deadline.as_millis() as u64))?;
        Ok(if st == ST_OK {
            Ok(())
        } else {
            Err(FreezeFailure { index: idx as usize, errno: Errno::from_raw(errno as i32) })
        })
    }

    /// Asks to write.
    pub fn permit(&mut self) -> std::io::Result<Permit> {
        let (st, why, _) = self.call(msg(OP_PERMIT, 0, 0))?;
        Ok(match (st, why) {
            (ST_OK, _) => Permit::Granted,
            (_, DENY_FREEZE_LOST) => Permit::FreezeLost,
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
        let (st, flags, micros) = self.call(msg(OP_THAW, 0, 0))?;
        Ok(ThawReport {
            overran: flags & 1 != 0,
            thawed_by_someone_else: flags & 2 != 0 || st == ST_ERR,
            frozen: Duration::from_micros(micros),
        })
    }

    /// Tells the guardian to leave and reaps it.
    pub fn shutdown(mut self) {
        let _ = self.stream.write_all(&msg(OP_EXIT, 0, 0));
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

struct GuardianState<'a> {
    fds: &'a [OwnedFd],
    names: &'a [String],
    /// Indices this guardian froze and has not thawed.
    frozen: Vec<usize>,
    freeze_started: Option<Instant>,
    deadline: Option<Instant>,
    /// Granted writes not yet reported finished.
    writing: u32,
    /// The deadline passed: no more grants in this window; thaw when `writing` is 0.
    revoked: bool,
    overran: bool,
    frozen_for: Duration,
    someone_else_thawed: bool,
}

impl GuardianState<'_> {
    fn thaw_all(&mut self) {
        // Reverse order: the mirror of freezing.
        while let Some(i) = self.frozen.pop() {
            if let Err(e) = sys::fithaw(self.fds[i].as_fd())
                && e == Errno::EINVAL
            {
                self.someone_else_thawed = true;
            }
        }
        if let Some(start) = self.freeze_started.take() {
            self.frozen_for = start.elapsed();
        }
        self.deadline = None;
    }

    fn freeze(&mut self, window: Duration) -> Result<(), FreezeFailure> {
        let start = Instant::now();
        for i in 0..self.fds.len() {
            if let Err(errno) = sys::fifreeze(self.fds[i].as_fd()) {
                self.thaw_all();
                return Err(FreezeFailure { index: i, errno });
            }
            self.frozen.push(i);
        }
        self.freeze_started = Some(start);
        self.deadline = Some(start + window);
        self.overran = false;
        self.revoked = false;
        self.someone_else_thawed = false;
        self.writing = 0;
        Ok(())
    }

    /// Checks that our freezes still hold: there is no status file, but a FIFREEZE on a
    /// frozen filesystem gives EBUSY. If it succeeds, someone thawed ours (a stray
    /// `fsfreeze -u`): we now hold a fresh freeze, kept in our list so it gets thawed,
    /// and the data read earlier in the window must not be written.
    fn still_frozen(&mut self) -> bool {
        let mut all = true;
        for &i in &self.frozen {
            match sys::fifreeze(self.fds[i].as_fd()) {
                Err(Errno::EBUSY) => {}
                _ => {
                    all = false;
                    self.someone_else_thawed = true;
                }
            }
        }
        all
    }

    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The deadline has passed: stop granting, and thaw once no write is outstanding.
    fn revoke(&mut self) {
        self.revoked = true;
        self.overran = true;
        if self.writing == 0 && !self.frozen.is_empty() {
            self.overrun_thaw();
        }
    }

    fn overrun_thaw(&mut self) {
        let n = self.frozen.len();
        self.thaw_all();
        // Safe to speak: nothing of ours is frozen any more.
        eprintln!(
            "reseq guardian: freeze window overran its deadline; thawed {n} filesystem(s) ({})",
            self.names.join(", ")
        );
    }
}

fn guardian_main(mut stream: UnixStream, fds: &[OwnedFd], names: &[String]) -> i32 {
    if sys::ignore_group_signals().is_err() {
        return 70;
    }
    let mut st = GuardianState {
        fds,
        names,
        frozen: Vec::new(),
        freeze_started: None,
        deadline: None,
        writing: 0,
        revoked: false,
        overran: false,
        frozen_for: Duration::ZERO,
        someone_else_thawed: false,
    };
    loop {
        let timeout = match st.deadline {
            Some(d) if !st.frozen.is_empty() && !st.revoked => {
                Some(d.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
            }
            _ => None,
        };
        if stream.set_read_timeout(timeout).is_err() {
            st.thaw_all();
            return 71;
        }
        let mut m = [0u8; 16];
        match stream.read_exact(&mut m) {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if !st.frozen.is_empty() && st.past_deadline() {
                    st.revoke();
                }
                continue;
            }
            Err(_) => {
                // EOF (or a broken socket): reseq has exited; none of its I/O is in flight.
                let n = st.frozen.len();
                st.thaw_all();
                if n > 0 {
                    eprintln!(
                        "reseq guardian: reseq exited while {n} filesystem(s) were frozen; thawed them ({})",
                        names.join(", ")
                    );
                }
                return 0;
            }
        }
        let (op, _a, b) = fields(&m);
        let reply = match op {
            OP_FREEZE => match st.freeze(Duration::from_millis(b)) {
                Ok(()) => Some(msg(ST_OK, 0, 0)),
                Err(f) => Some(msg(ST_ERR, f.index as u32, f.errno as i32 as u64)),
            },
            OP_PERMIT => {
                if st.frozen.is_empty() || st.revoked {
                    Some(msg(ST_DENIED, DENY_DEADLINE, 0))
                } else if st.past_deadline() {
                    st.revoke();
                    Some(msg(ST_DENIED, DENY_DEADLINE, 0))
                } else if !st.still_frozen() {
                    Some(msg(ST_DENIED, DENY_FREEZE_LOST, 0))
                } else {
                    st.writing += 1;
                    Some(msg(ST_OK, 0, 0))
                }
            }
            OP_WRITTEN => {
                st.writing = st.writing.saturating_sub(1);
                // The deadline passed during the write: thaw now, not at the next request.
                if !st.frozen.is_empty() && st.past_deadline() {
                    st.revoke();
                }
                None
            }
            OP_THAW => {
                st.writing = 0;
                if !st.frozen.is_empty() {
                    // A window that ends after its deadline overran, whoever thaws it.
                    st.overran |= st.past_deadline();
                    st.thaw_all();
                }
                let flags = u32::from(st.overran) | (u32::from(st.someone_else_thawed) << 1);
                Some(msg(ST_OK, flags, st.frozen_for.as_micros() as u64))
            }
            OP_EXIT => {
                st.thaw_all();
                return 0;
            }
            _ => {
                st.thaw_all();
                return 72;
            }
        };
        if let Some(r) = reply
            && stream.write_all(&r).is_err()
        {
            st.thaw_all();
            return 0;
        }
    }
}
