//! reseq's end: the guardian forked, and each request of a window sent and answered.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::protocol::*;
use nix::errno::Errno;

use crate::host::hardening::Hardening;
use crate::host::procs;
use crate::sys;

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
                super::serve::child(theirs, fs, bounds, run_dir, reseq)
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
