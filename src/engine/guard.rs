//! The engine's view of freeze windows: the [`WindowGuard`] seam.
//!
//! The engine calls [`WindowGuard::begin`] before reading a window's first chunk,
//! [`WindowGuard::may_write`] before each write, and [`WindowGuard::end`] after the last.
//! It lives here, below the host layer, so that the engine depends on no implementation:
//! [`NoFreeze`] (an unmounted device, a simulation) is here; the guarded freeze through
//! the forked guardian is in `host::freeze`, and the guard that runs the checks of every
//! window around either, in `host::window_checks`.

use std::time::Duration;

use crate::support::error::{Error, Result};

/// How one window ended.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WindowEnd {
    /// How long filesystems were frozen (zero without a freeze).
    pub(crate) frozen: Duration,
    /// The filesystems were frozen longer than `--max-freeze`.
    pub(crate) overran: bool,
    /// The hard bound (`--max-freeze` plus grace), when this window went past it.
    pub(crate) beyond_bound: Option<Duration>,
}

/// No method has a default: a guard answers every call itself (the checks of a window,
/// which act only where they look, are `host::window_checks::WindowCheck`s, run by the one
/// guard that holds the freeze and the list).
pub(crate) trait WindowGuard {
    /// Whether windows freeze anything (if not, output need not be held back).
    fn freezes(&self) -> bool;
    /// The hard limit of one window, if any.
    fn deadline(&self) -> Option<Duration>;
    /// Starts a window (freezes).
    fn begin(&mut self) -> Result<()>;
    /// Asks to write; `Ok(false)` means the window is over and nothing may be written.
    fn may_write(&mut self) -> Result<bool>;
    /// What the next `may_write` is for: `len` bytes at device offset `offset` with this
    /// blake3 (a guardian checks them if it must kill reseq mid-write).
    fn announce(&mut self, offset: u64, len: u64, hash: &blake3::Hash);
    /// The write allowed by `may_write` has completed.
    fn wrote(&mut self) -> Result<()>;
    /// The same report, from another thread (the verifier reports after its read-back).
    fn reporter(&self) -> Result<Reporter>;
    /// Ends the window (thaws).
    fn end(&mut self) -> Result<WindowEnd>;
    /// Called before each chunk's write: checks that may stop the run mid-window.
    fn recheck(&mut self) -> Result<()>;
    /// Whether the window's freeze (or hold) has been in place, unbroken, since the window
    /// began: what was seen on the device before this call happened under it. Grants
    /// nothing. Err: the freeze was lost to another program.
    fn held(&mut self) -> Result<bool>;
    /// The device ranges written since the kernel's write records (the device's
    /// counters, a backing file's watch) last saw no foreign write; None where there are
    /// no such records. For the message of a read-back that differed.
    fn at_risk(&self) -> Option<Vec<(u64, u64)>>;
}

/// Reports finished writes from the verifier thread (see [`WindowGuard::reporter`]).
pub(crate) struct Reporter(Box<dyn FnMut() -> std::io::Result<()> + Send>);

impl Reporter {
    /// A reporter that sends each report through `send`.
    pub(crate) fn new(send: impl FnMut() -> std::io::Result<()> + Send + 'static) -> Reporter {
        Reporter(Box::new(send))
    }

    pub(crate) fn written(&mut self) -> Result<()> {
        (self.0)().map_err(|e| Error::io("telling the thaw guardian a write finished", e))
    }
}

/// Nothing to freeze: the device is not mounted (and is held with O_EXCL so it cannot
/// be mounted meanwhile), or it is simulated.
pub(crate) struct NoFreeze;

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
        // No one to tell: nothing is frozen.
        Ok(Reporter::new(|| Ok(())))
    }
    fn end(&mut self) -> Result<WindowEnd> {
        Ok(WindowEnd::default())
    }
    fn announce(&mut self, _offset: u64, _len: u64, _hash: &blake3::Hash) {}
    fn recheck(&mut self) -> Result<()> {
        Ok(())
    }
    /// Nothing is held: there was nothing to hold.
    fn held(&mut self) -> Result<bool> {
        Ok(true)
    }
    fn at_risk(&self) -> Option<Vec<(u64, u64)>> {
        None
    }
}
