//! SIGINT, SIGTERM and SIGHUP stop a run cleanly: the current chunk finishes, the
//! window thaws, the journal is saved, and reseq exits with "interrupted".
//! A second signal of the same kind exits at once (status 130): still safe, because the
//! guardian thaws as soon as reseq is gone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::support::error::{Error, Result};

static INSTALLED: std::sync::OnceLock<StopFlag> = std::sync::OnceLock::new();

/// Set by a signal handler; polled by the engine between chunks. A default one is set
/// by nothing (tests, simulations).
#[derive(Clone, Default)]
pub(crate) struct StopFlag(Arc<AtomicUsize>);

impl StopFlag {
    /// Installs the handlers once per process and returns the process's flag: a command
    /// installs them before its first step, so that a signal during planning or the
    /// before-benchmark stops the run cleanly rather than killing it without a word.
    pub(crate) fn install() -> std::io::Result<StopFlag> {
        if let Some(f) = INSTALLED.get() {
            return Ok(f.clone());
        }
        let f = StopFlag::install_with(true)?;
        Ok(INSTALLED.get_or_init(|| f).clone())
    }

    /// The process's flag, if [`StopFlag::install`] ran (else one never raised): long
    /// measurements poll it, so a Ctrl-C does not wait out a benchmark.
    pub(crate) fn installed() -> StopFlag {
        INSTALLED.get().cloned().unwrap_or_default()
    }

    /// `Err(Stopped)`, saying what was stopped (`what`), once a signal came.
    pub(crate) fn check(&self, what: &str) -> Result<()> {
        self.signal().map_or(Ok(()), |sig| Err(Error::Stopped { signal: sig.into(), what: what.into() }))
    }

    /// Installs the handlers; without `second_exits`, a second signal only stops as the
    /// first did (for work whose cleanup must run: a scratch file to remove).
    pub(crate) fn install_with(second_exits: bool) -> std::io::Result<StopFlag> {
        let flag = StopFlag::default();
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            if second_exits {
                let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
                signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&seen))?;
                signal_hook::flag::register(sig, seen)?;
            }
            signal_hook::flag::register_usize(sig, Arc::clone(&flag.0), sig as usize)?;
        }
        Ok(flag)
    }

    /// The signal that asked us to stop, if any.
    pub(crate) fn signal(&self) -> Option<&'static str> {
        match self.0.load(Ordering::SeqCst) as i32 {
            0 => None,
            SIGINT => Some("SIGINT"),
            SIGTERM => Some("SIGTERM"),
            SIGHUP => Some("SIGHUP"),
            _ => Some("a signal"),
        }
    }

    /// Sleeps up to `d`, waking early when stopped.
    pub(crate) fn sleep(&self, d: Duration) {
        let end = Instant::now() + d;
        while self.signal().is_none() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}
