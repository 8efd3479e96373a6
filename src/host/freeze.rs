//! Freeze windows: the [`WindowGuard`]s that freeze.
//!
//! The seam itself ([`WindowGuard`], [`NoFreeze`](crate::engine::guard::NoFreeze)) is the
//! engine's, in [`crate::engine::guard`]; here is [`GuardedFreeze`], which freezes through
//! the [guardian](crate::host::guardian). The check of other writers and swap every window
//! runs is `host::writers_check`.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;

use crate::engine::guard::{Reporter, WindowEnd, WindowGuard};
use crate::host::cgroup::Placement;
use crate::host::guardian::client::Guardian;
use crate::host::guardian::protocol::{Bounds, FreezeFailure, Held, Permit, Watched};
use crate::host::mounts::MountedFs;
use crate::support::error::{Error, Result};

/// How long past `--max-freeze` a write already under way may hold a window before the
/// guardian kills reseq: a quarter second at least (a 64 KiB write and its read-back on
/// a busy device), at most one second, and never more than the window itself.
pub(crate) fn freeze_grace(max_freeze: Duration) -> Duration {
    max_freeze.min(Duration::from_secs(1)).max(Duration::from_millis(250))
}

/// The hard bound of one freeze: `--max-freeze` plus the grace.
pub(crate) fn freeze_bound(max_freeze: Duration) -> Duration {
    max_freeze + freeze_grace(max_freeze)
}

/// The bound as the dry runs state it.
pub(crate) fn describe_bound(max_freeze: Duration) -> String {
    format!(
        "a write still outstanding {:.3} s after the deadline (grace) gets reseq killed and the filesystem thawed: no freeze lasts beyond {:.3} s",
        freeze_grace(max_freeze).as_secs_f64(),
        freeze_bound(max_freeze).as_secs_f64()
    )
}

/// The bound as the report carries it.
pub(crate) fn bound_report(max_freeze: Duration) -> FreezeBound {
    let grace = freeze_grace(max_freeze);
    FreezeBound {
        max_freeze_seconds: max_freeze.as_secs_f64(),
        grace_seconds: grace.as_secs_f64(),
        bound_seconds: (max_freeze + grace).as_secs_f64(),
    }
}

/// The limits every freeze window of a run kept to.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct FreezeBound {
    /// `--max-freeze`: a window frozen longer counts in `windows_overrun`.
    pub(crate) max_freeze_seconds: f64,
    /// How long past it a write already under way may hold the window.
    pub(crate) grace_seconds: f64,
    /// The hard bound (the sum): past it the guardian kills reseq and thaws.
    pub(crate) bound_seconds: f64,
}

/// Proof that no freeze window of this run is open: made only by ending the windows
/// ([`Thawed::end_windows`], which drops the guard and with it the guardian, thawing
/// anything still frozen) or by a command that never freezes. What must never run
/// inside a window (FITRIM) asks for one.
pub(crate) struct Thawed {
    _private: (),
}

impl Thawed {
    /// Ends the run's windows: the guard goes, and with it any freeze.
    pub(crate) fn end_windows(guard: Box<dyn WindowGuard + '_>) -> Thawed {
        drop(guard);
        Thawed { _private: () }
    }

    /// For commands that freeze nothing (`bench --trim-impact`).
    pub(crate) fn never_froze() -> Thawed {
        Thawed { _private: () }
    }
}

/// Opens a mount point for FIFREEZE/FITHAW (any fd on the filesystem works).
pub(crate) fn open_mount_point(path: &Path) -> Result<OwnedFd> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| Error::io(format!("opening mount point {} to freeze it", path.display()), e))
}

/// Where a freeze leaves a trace: the 4 KiB holding the superblock, which ext2/3/4 and
/// xfs write on every freeze (s_wtime and s_kbytes_written for ext4; the log's state for
/// xfs), and btrfs at 64 KiB. Other filesystems: none known.
fn sentinel_offset(fs_type: &str) -> Option<u64> {
    match fs_type {
        "ext2" | "ext3" | "ext4" | "xfs" => Some(0),
        "btrfs" => Some(64 << 10),
        _ => None,
    }
}

/// The block device node of a filesystem: its mount source if that is the node, else
/// `/dev/block/MAJ:MIN` or `/dev/NAME` from sysfs.
pub(crate) fn device_node(fs: &MountedFs) -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from(&fs.source), PathBuf::from(format!("/dev/block/{}", fs.dev))];
    if let Ok(uevent) = std::fs::read_to_string(format!("/sys/dev/block/{}/uevent", fs.dev))
        && let Some(name) = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))
    {
        candidates.push(PathBuf::from(format!("/dev/{name}")));
    }
    candidates.into_iter().find(|p| crate::host::mounts::block_rdev(p) == Some(fs.dev_num))
}

fn open_sentinel(fs: &MountedFs) -> Option<(PathBuf, OwnedFd, u64)> {
    let offset = sentinel_offset(&fs.fs_type)?;
    let node = device_node(fs)?;
    let f = crate::sys::block::open_direct_read(&node).ok()?;
    Some((node, f, offset))
}

/// Freezes through the guardian.
pub(crate) struct GuardedFreeze {
    guardian: Option<Guardian>,
    filesystems: Vec<MountedFs>,
    /// Our own fds, to thaw directly if the guardian itself is lost.
    fds: Vec<OwnedFd>,
    deadline: Duration,
    frozen: bool,
    /// A FREEZE is under way (the guardian may have frozen some filesystems already).
    freezing: bool,
    windows: u64,
    /// The chunk the next permit is for.
    announced: Option<(u64, u64, blake3::Hash)>,
}

impl GuardedFreeze {
    /// Opens the filesystems, forks the guardian and moves it where `placement` says
    /// (out of reseq's cgroup). Call before any thread starts.
    pub(crate) fn start(
        filesystems: Vec<MountedFs>,
        deadline: Duration,
        placement: &Placement,
    ) -> Result<GuardedFreeze> {
        let run_dir = crate::engine::rescue::run_dir();
        crate::host::freeze_record::check_run_dir(&run_dir, &filesystems)?;
        let mut fds = Vec::new();
        let mut watched = Vec::new();
        for f in &filesystems {
            let sentinel = open_sentinel(f);
            if sentinel.is_none() {
                log::info!(
                    "{} ({}): no freeze sentinel; a program that thaws and re-freezes it during a window cannot be detected (see docs/SAFETY.md)",
                    f.mount_point.display(),
                    f.fs_type
                );
            }
            let mount = open_mount_point(&f.mount_point)?;
            fds.push(mount.try_clone().map_err(|e| Error::io("duplicating a mount point descriptor", e))?);
            watched.push(Watched { mount, name: f.mount_point.display().to_string(), dev: f.dev.clone(), sentinel });
        }
        let bounds = Bounds { window: deadline, grace: freeze_grace(deadline) };
        let mut guardian =
            Guardian::spawn(watched, bounds, run_dir).map_err(|e| Error::io("starting the thaw guardian", e))?;
        log::debug!("guardian started as pid {}", guardian.pid());
        if let Err(e) = place(&mut guardian, placement) {
            guardian.shutdown();
            return Err(e);
        }
        warn_about_other_freezers();
        Ok(GuardedFreeze {
            guardian: Some(guardian),
            filesystems,
            fds,
            deadline,
            frozen: false,
            freezing: false,
            windows: 0,
            announced: None,
        })
    }

    /// The device the writes go to: the guardian reads back the writes it granted if it
    /// must kill reseq mid-write.
    pub(crate) fn set_target(&mut self, path: &Path) -> Result<()> {
        self.call(|g| g.set_target(path))
    }

    /// The journal in which the guardian notes it had to kill reseq.
    pub(crate) fn set_journal(&mut self, path: &Path) -> Result<()> {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        self.call(|g| g.set_journal(&path))
    }

    /// One exchange with the guardian; a failed one means it is lost.
    fn call<T>(&mut self, f: impl FnOnce(&mut Guardian) -> std::io::Result<T>) -> Result<T> {
        let g = self.guardian.as_mut().ok_or_else(|| Error::Internal("the guardian is gone".into()))?;
        f(g).map_err(|e| self.guardian_lost(e))
    }

    /// The guardian stopped answering (stopped by hand, or dead): make sure it is gone,
    /// thaw ourselves (these are our freezes), and fail.
    fn guardian_lost(&mut self, e: std::io::Error) -> Error {
        let froze = self.guardian.as_ref().map(|g| g.froze().to_vec()).unwrap_or_default();
        let guardian = self.guardian.take();
        // Stopped for good first; reaped after the thaw (a guardian with a thread in D
        // state is reaped only once that FIFREEZE returns, which the thaw may allow).
        if let Some(g) = &guardian {
            g.sigkill();
        }
        if self.frozen {
            for fd in &self.fds {
                let _ = crate::sys::freeze::fithaw(std::os::fd::AsFd::as_fd(fd));
            }
            self.frozen = false;
        } else if self.freezing {
            // Lost mid-FREEZE: what it said it froze, in that order, then the one it was
            // freezing, whose FIFREEZE may return once those thaw, with no thread left to
            // thaw it (this FITHAW waits for that FIFREEZE, and then ends it).
            let next = froze.len();
            for i in froze.into_iter().chain([next]).filter(|&i| i < self.fds.len()) {
                let _ = crate::sys::freeze::fithaw(std::os::fd::AsFd::as_fd(&self.fds[i]));
            }
        }
        if let Some(g) = guardian {
            g.kill();
        }
        Error::io("the thaw guardian stopped answering; reseq thawed directly and stopped", e)
    }

    fn freeze_lost(&self, index: usize, foreign: bool) -> Error {
        let fs = &self.filesystems[index.min(self.filesystems.len() - 1)];
        Error::FreezeLost {
            filesystem: format!("{} ({}, {})", fs.mount_point.display(), fs.fs_type, fs.dev),
            window: self.windows,
            foreign,
            written: Vec::new(),
        }
    }

    fn freeze_error(&self, index: usize, errno: Errno, waited: Duration) -> Error {
        let fs = &self.filesystems[index];
        let what = format!("{} ({}, {} on {})", fs.mount_point.display(), fs.fs_type, fs.source, fs.dev);
        match errno {
            Errno::ETIMEDOUT | Errno::EDEADLK => Error::FreezeStuck {
                filesystem: what,
                window: self.windows + 1,
                waited_ms: waited.as_millis() as u64,
                thawed: self.filesystems[..index]
                    .iter()
                    .map(|f| f.mount_point.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            },
            Errno::EBUSY => Error::refused(
                format!(
                    "{what} is already frozen by someone else (FIFREEZE gave EBUSY); reseq never thaws a freeze it did not make"
                ),
                "find who froze it (fsfreeze, a backup or snapshot tool), let them thaw it, then run reseq again",
            ),
            Errno::EOPNOTSUPP | Errno::ENOTTY => Error::refused(
                format!(
                    "{what} cannot be frozen ({} does not support FIFREEZE), and a mounted filesystem is never written without a freeze",
                    fs.fs_type
                ),
                "unmount it and run reseq on the unmounted device",
            ),
            Errno::EPERM => {
                Error::refused(format!("FIFREEZE on {what} was denied (EPERM)"), "run as root with CAP_SYS_ADMIN")
            }
            e => Error::io(format!("freezing {what}"), e.into()),
        }
    }
}

/// Moves the guardian out of reseq's cgroup, and says what it lacks, before anything is
/// frozen.
fn place(guardian: &mut Guardian, placement: &Placement) -> Result<()> {
    let went = placement.apply(guardian.pid()).map_err(|why| crate::host::cgroup::refusal(&why))?;
    // Out of a cgroup v1 cpu group (no real-time budget there), real-time may be allowed
    // now where the guardian's own request at its start was not.
    if guardian.hardening.realtime.is_err() {
        let priority = crate::host::hardening::guardian_priority();
        if crate::sys::process::set_scheduling_of(guardian.pid(), crate::sys::process::Scheduling::Fifo(priority))
            .is_ok()
        {
            guardian.hardening.realtime = Ok(priority);
        }
    }
    if placement.stays() {
        log::warn!("{went}");
    } else {
        // Where it was meant to go: routine, for -v (a job's mail has no room for it).
        log::debug!("freeze guardian (pid {}): in {went}", guardian.pid());
    }
    if let Some(s) = guardian.hardening.shortfall() {
        log::warn!("{s}");
    }
    Ok(())
}

/// Programs known to freeze filesystems on their own schedule. One running is not an
/// error (its hooks may be off), but a freeze it makes mid-window stops the run.
fn warn_about_other_freezers() {
    const KNOWN: [(&str, &str); 3] = [
        ("qemu-ga", "qemu-guest-agent (guest-fsfreeze-freeze from the VM host's snapshots)"),
        ("vmtoolsd", "VMware Tools (quiesced snapshots)"),
        ("waagent", "the Azure agent (VM backup snapshots)"),
    ];
    let running: Vec<String> = crate::host::procs::pids().into_iter().map(crate::host::procs::comm).collect();
    for (_, what) in KNOWN.iter().filter(|(name, _)| running.iter().any(|c| c == name)) {
        log::warn!(
            "{what} is running: if it freezes a filesystem during a window, reseq stops (exit 8). Do not schedule snapshots or backups during a run"
        );
    }
}

impl WindowGuard for GuardedFreeze {
    fn freezes(&self) -> bool {
        true
    }
    fn deadline(&self) -> Option<Duration> {
        Some(self.deadline)
    }

    fn begin(&mut self) -> Result<()> {
        // Flush dirty data first, unfrozen: the freeze then has little left to sync, so
        // the stall it causes is shorter. syncfs is not blocked by anyone's freeze.
        for fd in &self.fds {
            let _ = nix::unistd::syncfs(fd);
        }
        let deadline = self.deadline;
        let asked = std::time::Instant::now();
        self.freezing = true;
        let answer = self.call(|g| g.freeze(deadline));
        self.freezing = false;
        match answer? {
            Err(FreezeFailure::Record { errno }) => Err(Error::io(
                format!(
                    "the guardian could not write its freeze record in {}, so nothing was frozen",
                    crate::engine::rescue::run_dir().display()
                ),
                errno.into(),
            )),
            Err(FreezeFailure::Fifreeze { index, errno }) => {
                let err = self.freeze_error(index, errno, asked.elapsed());
                // After the first window a refusal is no longer "nothing written".
                if self.windows > 0
                    && let Error::Refused { reason, .. } = err
                {
                    return Err(Error::io(
                        format!("{reason}; stopped between windows, resume later with --resume"),
                        std::io::Error::from_raw_os_error(errno as i32),
                    ));
                }
                Err(err)
            }
            Ok(()) => {
                self.frozen = true;
                self.windows += 1;
                Ok(())
            }
        }
    }

    fn announce(&mut self, offset: u64, len: u64, hash: &blake3::Hash) {
        self.announced = Some((offset, len, *hash));
    }

    fn may_write(&mut self) -> Result<bool> {
        let chunk = self.announced.take();
        match self.call(|g| g.permit(chunk))? {
            Permit::Granted => Ok(true),
            Permit::DeadlinePassed => Ok(false),
            Permit::FreezeLost { index, foreign } => Err(self.freeze_lost(index, foreign)),
        }
    }

    fn wrote(&mut self) -> Result<()> {
        self.call(Guardian::written)
    }

    /// Checks that stop a run mid-window are the window checks' (`host::window_checks`).
    fn recheck(&mut self) -> Result<()> {
        Ok(())
    }
    /// The freeze keeps no record of writes: the counters and the watch do.
    fn at_risk(&self) -> Option<Vec<(u64, u64)>> {
        None
    }
    fn held(&mut self) -> Result<bool> {
        if !self.frozen {
            return Ok(false);
        }
        match self.call(Guardian::held)? {
            Held::Frozen(held) => Ok(held),
            Held::Lost { index, foreign } => Err(self.freeze_lost(index, foreign)),
        }
    }

    fn reporter(&self) -> Result<Reporter> {
        let g = self.guardian.as_ref().ok_or_else(|| Error::Internal("the guardian is gone".into()))?;
        Ok(Reporter::new(g.reporter().map_err(|e| Error::io("cloning the guardian socket", e))?))
    }

    fn end(&mut self) -> Result<WindowEnd> {
        let t = self.call(Guardian::thaw)?;
        self.frozen = false;
        if let Some((index, foreign)) = t.lost {
            return Err(self.freeze_lost(index, foreign));
        }
        let bound = freeze_bound(self.deadline);
        Ok(WindowEnd { frozen: t.frozen, overran: t.overran, beyond_bound: (t.frozen > bound).then_some(bound) })
    }
}

impl Drop for GuardedFreeze {
    fn drop(&mut self) {
        if let Some(g) = self.guardian.take() {
            // EXIT also thaws anything still frozen (a panic mid-window); once it has,
            // stderr cannot block on a frozen filesystem any more.
            if g.shutdown() {
                crate::support::output::release();
            }
        }
    }
}

/// Whether a look within a window that freezes nothing (the device's shape) is due
/// again: every 250 ms, on the writer's thread. The writers' scan, which reads all of
/// /proc, runs beside the writer at the same period instead (`host::writers_check`).
pub(crate) fn rescan_due(last: Option<std::time::Instant>) -> bool {
    last.is_none_or(|t| t.elapsed() >= RESCAN)
}

/// The period of a look within a window that freezes nothing.
pub(crate) const RESCAN: Duration = Duration::from_millis(250);
