//! The guardian's end: the forked process, out of reach of what is aimed at reseq, and
//! its state machine over the filesystems it freezes.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;

use super::protocol::*;
use crate::host::freeze_record::{FreezeRecord, RecordedFs, SentinelRecord};
use crate::host::freezer::Freezers;
use crate::host::hardening::Hardening;
use crate::host::procs;
use crate::host::sentinel::SentinelReader;
use crate::sys;

/// The guardian, in the child of the fork: out of reach of reseq's session and signals,
/// it says hello, serves until reseq leaves or is gone, and exits without unwinding into
/// reseq's copied stack.
pub(super) fn child(
    theirs: UnixStream,
    fs: Vec<Watched>,
    bounds: Bounds,
    run_dir: PathBuf,
    reseq: nix::unistd::Pid,
) -> ! {
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

/// In the child, before anything else: leave reseq's session, ignore what is aimed at
/// reseq's group, take a pidfd on reseq, and change name. None if reseq is already gone.
fn detach(reseq: nix::unistd::Pid) -> Option<Option<OwnedFd>> {
    // A new session and process group, without a controlling terminal: signals aimed at
    // reseq's group (a terminal's Ctrl-Z, `timeout`, `kill -- -PGID`) do not reach it.
    let _ = nix::unistd::setsid();
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

#[cfg(test)]
mod tests;
