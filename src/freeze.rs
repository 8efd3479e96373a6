//! Freeze windows: the engine's only view of freezing.
//!
//! The engine calls [`WindowGuard::begin`] before reading a window's first chunk,
//! [`WindowGuard::may_write`] before each write, and [`WindowGuard::end`] after the last.
//! Implementations: [`NoFreeze`] for an unmounted device or a simulated one, and
//! [`GuardedFreeze`], which freezes through the [guardian](crate::guardian).

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;

use crate::error::{Error, Result};
use crate::guardian::{Guardian, Permit, ThawReport, WrittenReporter};
use crate::mounts::MountedFs;

/// How one window ended.
#[derive(Debug, Clone, Copy, Default)]
pub struct WindowEnd {
    /// How long filesystems were frozen (zero without a freeze).
    pub frozen: Duration,
    /// The guardian thawed at the deadline before reseq asked.
    pub overran: bool,
}

pub trait WindowGuard {
    /// Whether windows freeze anything (if not, output need not be held back).
    fn freezes(&self) -> bool;
    /// The hard limit of one window, if any.
    fn deadline(&self) -> Option<Duration>;
    /// Starts a window (freezes).
    fn begin(&mut self) -> Result<()>;
    /// Asks to write; `Ok(false)` means the window is over and nothing may be written.
    fn may_write(&mut self) -> Result<bool>;
    /// The write allowed by `may_write` has completed.
    fn wrote(&mut self) -> Result<()>;
    /// The same report, from another thread (the verifier reports after its read-back).
    fn reporter(&self) -> Result<Reporter>;
    /// Ends the window (thaws).
    fn end(&mut self) -> Result<WindowEnd>;
}

/// Reports finished writes from the verifier thread.
pub struct Reporter(Option<WrittenReporter>);

impl Reporter {
    pub fn written(&mut self) -> Result<()> {
        match &mut self.0 {
            Some(r) => r.written().map_err(|e| Error::io("telling the thaw guardian a write finished", e)),
            None => Ok(()),
        }
    }
}

/// Nothing to freeze: the device is not mounted (and is held with O_EXCL so it cannot
/// be mounted meanwhile), or it is simulated.
pub struct NoFreeze;

impl WindowGuard for NoFreeze {
    fn freezes(&self) -> bool {
        false
    }
    fn deadline(&self) -> Option<Duration> {
        None
    }
    fn begin(&mut self) -> Result<()> {
        Ok(())
    }
    fn may_write(&mut self) -> Result<bool> {
        Ok(true)
    }
    fn wrote(&mut self) -> Result<()> {
        Ok(())
    }
    fn reporter(&self) -> Result<Reporter> {
        Ok(Reporter(None))
    }
    fn end(&mut self) -> Result<WindowEnd> {
        Ok(WindowEnd::default())
    }
}

/// Opens a mount point for FIFREEZE/FITHAW (any fd on the filesystem works).
pub fn open_mount_point(path: &Path) -> Result<OwnedFd> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| Error::io(format!("opening mount point {} to freeze it", path.display()), e))
}

/// Freezes through the guardian.
pub struct GuardedFreeze {
    guardian: Option<Guardian>,
    filesystems: Vec<MountedFs>,
    /// Our own fds, to thaw directly if the guardian itself has died.
    fds: Vec<OwnedFd>,
    deadline: Duration,
    frozen: bool,
    first_window: bool,
}

impl GuardedFreeze {
    /// Opens the filesystems and forks the guardian. Call before any thread starts.
    pub fn start(filesystems: Vec<MountedFs>, deadline: Duration) -> Result<GuardedFreeze> {
        let fds = filesystems.iter().map(|f| open_mount_point(&f.mount_point)).collect::<Result<Vec<_>>>()?;
        let names: Vec<String> = filesystems.iter().map(|f| f.mount_point.display().to_string()).collect();
        let guardian = Guardian::spawn(&fds, &names).map_err(|e| Error::io("starting the thaw guardian", e))?;
        log::debug!("guardian started as pid {}", guardian.pid());
        Ok(GuardedFreeze { guardian: Some(guardian), filesystems, fds, deadline, frozen: false, first_window: true })
    }

    fn guardian(&mut self) -> Result<&mut Guardian> {
        self.guardian.as_mut().ok_or_else(|| Error::Internal("the guardian is gone".into()))
    }

    /// The guardian stopped answering: thaw ourselves (these are our freezes) and fail.
    fn guardian_lost(&mut self, e: std::io::Error) -> Error {
        if self.frozen {
            for fd in &self.fds {
                let _ = crate::sys::fithaw(std::os::fd::AsFd::as_fd(fd));
            }
            self.frozen = false;
        }
        self.guardian = None;
        Error::io("the thaw guardian stopped answering; thawed directly and stopped", e)
    }

    fn freeze_error(&self, index: usize, errno: Errno) -> Error {
        let fs = &self.filesystems[index];
        let what = format!("{} ({}, {} on {})", fs.mount_point.display(), fs.fs_type, fs.source, fs.dev);
        match errno {
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
        match self.guardian()?.freeze(deadline) {
            Err(e) => Err(self.guardian_lost(e)),
            Ok(Err(f)) => {
                let err = self.freeze_error(f.index, f.errno);
                // After the first window a refusal is no longer "nothing written".
                if !self.first_window
                    && let Error::Refused { reason, .. } = err
                {
                    return Err(Error::io(
                        format!("{reason}; stopped between windows, resume later with --resume"),
                        std::io::Error::from_raw_os_error(f.errno as i32),
                    ));
                }
                Err(err)
            }
            Ok(Ok(())) => {
                self.frozen = true;
                self.first_window = false;
                Ok(())
            }
        }
    }

    fn may_write(&mut self) -> Result<bool> {
        match self.guardian()?.permit() {
            Ok(Permit::Granted) => Ok(true),
            Ok(Permit::DeadlinePassed) => Ok(false),
            Ok(Permit::FreezeLost) => Err(Error::Io {
                context: "another process thawed reseq's freeze during a window (FITHAW from outside); stopped before writing anything read in that window. Resume with --resume once nothing else manages freezes on this filesystem".into(),
                offset: None,
                source: std::io::Error::from_raw_os_error(nix::libc::EBUSY),
            }),
            Err(e) => Err(self.guardian_lost(e)),
        }
    }

    fn wrote(&mut self) -> Result<()> {
        match self.guardian()?.written() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.guardian_lost(e)),
        }
    }

    fn reporter(&self) -> Result<Reporter> {
        let g = self.guardian.as_ref().ok_or_else(|| Error::Internal("the guardian is gone".into()))?;
        Ok(Reporter(Some(g.reporter().map_err(|e| Error::io("cloning the guardian socket", e))?)))
    }

    fn end(&mut self) -> Result<WindowEnd> {
        let r: std::io::Result<ThawReport> = self.guardian()?.thaw();
        match r {
            Ok(t) => {
                self.frozen = false;
                if t.thawed_by_someone_else {
                    log::warn!(
                        "a filesystem was thawed by another process during the window (found before writing; nothing was written after it)"
                    );
                }
                Ok(WindowEnd { frozen: t.frozen, overran: t.overran })
            }
            Err(e) => Err(self.guardian_lost(e)),
        }
    }
}

impl Drop for GuardedFreeze {
    fn drop(&mut self) {
        if let Some(g) = self.guardian.take() {
            // EXIT also thaws anything still frozen (a panic mid-window).
            g.shutdown();
        }
    }
}
