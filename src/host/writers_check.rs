//! The check of every window that nothing else writes the target and no swap is active
//! on it ([`WritersCheck`], one of the list in [`crate::host::window_checks`]).
//!
//! Where windows freeze, the scan runs before each window: a frozen window is short and
//! must not spend its stall reading /proc. Where they do not (an unmounted device's run
//! is one long window), it runs beside the writer ([`Beside`]): a thread scans every
//! [`RESCAN`] and the writer takes what it found before each chunk, waiting for /proc
//! only when the scans fall behind (a scan took 21 ms for 71 processes here: 8 % of a
//! memory-backed run when the writer made them itself). A scan's time grows with the
//! host's processes and their open files and mappings (0.3 s for 1,000 processes with
//! 36,000 open files): then the scans begin further apart, a scan's time after the last,
//! so that they take at most half a CPU, and the writer waits only for a scan that is
//! late for that pace, not for one that is slow ([`behind`]). A writer that appears is
//! then seen later, and the run says by how much.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::engine::guard::WindowGuard;
use crate::host::freeze::{RESCAN, rescan_due};
use crate::host::window_checks::WindowCheck;
use crate::support::error::{Error, Result};

/// What a writers' scan looks for: other writers of the target (see
/// [`crate::host::writers`]) and active swap on it.
#[derive(Clone)]
struct Scan {
    target: PathBuf,
    devices: Vec<(u32, u32)>,
    /// What active swap stops the run: any on `devices` (None: device mode), or a swap
    /// file among these (device, inode) only (file mode, which writes its files' blocks
    /// alone: a swap file left out is no matter).
    swap_among: Option<std::collections::HashSet<(u64, u64)>>,
}

impl Scan {
    /// Swap turned on mid-run over the target: the kernel writes it whatever the freeze,
    /// and no counter tells its writes from the filesystem's between windows.
    fn swaps(&self) -> Vec<String> {
        let text = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        match &self.swap_among {
            None => crate::host::device::active_swap_on(&text, &self.devices),
            Some(ids) => crate::host::device::active_swap_files(&text)
                .into_iter()
                .filter_map(|(id, name)| ids.contains(&id).then_some(name))
                .collect(),
        }
    }

    /// Swap every time (one small file), other writers where `procs` (all of /proc).
    fn run(&self, procs: bool) -> Result<()> {
        let swaps = self.swaps();
        if !swaps.is_empty() {
            return Err(crate::host::device::swap_refusal(&self.target, &swaps));
        }
        if !procs {
            return Ok(());
        }
        let t = Instant::now();
        let r = crate::host::writers::refuse_other_writers(&self.target, &self.devices);
        log::trace!("the writers' scan took {:?}", t.elapsed());
        r
    }
}

/// A whole scan as the thread beside the writer makes it (a test's stands in for it).
type ScanFn = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// The check before each window that nothing else writes the target and no swap is
/// active on it: a writer or a swap that appears mid-run stops it between windows, or
/// (where windows freeze nothing) before the next chunk once the scan beside the writer
/// has seen it.
pub(crate) struct WritersCheck {
    scan: Scan,
    /// The scan beside the writer: [`Scan::run`] of all of /proc.
    beside_scan: ScanFn,
    /// This run wrote before this guard's first window (file mode's later device runs):
    /// what its first check finds is not a refusal before anything was written.
    wrote_before: bool,
    /// When the last finished scan began.
    checked: Option<Instant>,
    /// How long the last scan of /proc on the writer's thread took.
    took: Duration,
    /// The warning of slow scans was given.
    warned: Arc<AtomicBool>,
    /// The scan beside the writer, within a window that freezes nothing.
    beside: Option<Beside>,
    /// No thread could be had in this window: the writer scans itself.
    on_writer: bool,
}

impl WritersCheck {
    pub(crate) fn new(
        target: PathBuf,
        devices: Vec<(u32, u32)>,
        swap_among: Option<std::collections::HashSet<(u64, u64)>>,
        wrote_before: bool,
    ) -> WritersCheck {
        let scan = Scan { target, devices, swap_among };
        let whole = scan.clone();
        WritersCheck::with_scan(scan, Arc::new(move || whole.run(true)), wrote_before)
    }

    fn with_scan(scan: Scan, beside_scan: ScanFn, wrote_before: bool) -> WritersCheck {
        WritersCheck {
            scan,
            beside_scan,
            wrote_before,
            checked: None,
            took: Duration::ZERO,
            warned: Arc::default(),
            beside: None,
            on_writer: false,
        }
    }

    /// Before the first write a finding is a refusal (exit 3, nothing written); later it
    /// stops the run before reseq writes more (exit 4, resumable).
    fn check(&mut self, procs: bool) -> Result<()> {
        let first = self.checked.is_none() && !self.wrote_before;
        let began = Instant::now();
        let r = self.scan.run(procs);
        if procs {
            (self.checked, self.took) = (Some(began), began.elapsed());
        }
        match r {
            Err(e) if !first => Err(stopped(e)),
            r => r,
        }
    }

    /// What the scan beside the writer found (Ok: nothing yet); `last`: its final word,
    /// after its scan in flight, at the window's end.
    fn beside_found(&mut self, last: bool) -> Result<()> {
        let Some(b) = &mut self.beside else { return Ok(()) };
        let (found, scanned) = if last { b.finish() } else { b.found() };
        self.checked = self.checked.max(scanned);
        if last {
            self.beside = None;
        }
        found.map_or(Ok(()), |e| Err(stopped(e)))
    }
}

/// A finding after the run's first write: the run stops there, resumable.
fn stopped(e: Error) -> Error {
    match e {
        Error::Refused { reason, hint } => Error::io(
            format!(
                "{reason}; reseq stopped before writing more (every chunk it wrote was verified); {}, then run again with --resume",
                hint.unwrap_or_default()
            ),
            std::io::Error::from_raw_os_error(nix::libc::EBUSY),
        ),
        e => e,
    }
}

impl WindowCheck for WritersCheck {
    /// Before each window: swap always, other writers unless the last scan is under
    /// 100 ms old (a scan reads all of /proc).
    fn before_window(&mut self, _freezes: bool) -> Result<()> {
        self.check(self.checked.is_none_or(|t| t.elapsed() >= Duration::from_millis(100)))
    }
    /// Within a window, only where windows do not freeze: what the scan beside the
    /// writer found, the scan started at the first chunk, its clock from the scan
    /// before the window (on the writer's thread where a thread cannot be had). A frozen
    /// window is short, checked before it began.
    fn recheck(&mut self, freezes: bool) -> Result<()> {
        if freezes {
            return Ok(());
        }
        if self.beside.is_none() && !self.on_writer {
            let warned = Arc::clone(&self.warned);
            self.beside = Beside::start(Arc::clone(&self.beside_scan), self.checked, self.took, warned);
            self.on_writer = self.beside.is_none();
        }
        if self.beside.is_some() {
            self.beside_found(false)
        } else if rescan_due(self.checked) {
            self.check(true)
        } else {
            Ok(())
        }
    }
    /// The scan beside the writer ends with the window: its scan in flight finished, what
    /// it found counts (after the thaw).
    fn before_thaw(&mut self, _guard: &mut dyn WindowGuard) -> Result<()> {
        self.on_writer = false;
        self.beside_found(true)
    }
}

/// The writers' scan on a thread of its own, a scan beginning at the scans' pace after
/// the last ([`pace`]; the first at once if the one before the window is that old) until
/// stopped; it stops at its first finding, which it keeps for the writer. The writer does
/// not outrun it: when the last finished scan began more than [`behind`] ago (a host too
/// busy to scan on time), the writer waits for a scan that began since, as it waited for
/// the scans it made itself.
struct Beside {
    /// Dropped to stop the thread (at once, between scans).
    stop: Option<Sender<()>>,
    seen: Arc<(Mutex<Seen>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

/// Once a run (`warned` is the run's): scans this slow see a writer later.
fn warn_slow(took: Duration, warned: &AtomicBool) {
    if took <= RESCAN || warned.swap(true, Ordering::Relaxed) {
        return;
    }
    log::warn!(
        "the writers' scan of /proc took {} ms (the host's processes, their open files and mappings): a writer of the device that appears mid-run is seen within {:.1} s, not 0.3 s",
        took.as_millis(),
        behind(took).as_secs_f64()
    );
}

/// The time from one scan's beginning to the next's, for scans that take `took`: a
/// period, or twice a scan's time where that is longer (the scans take at most half a
/// CPU, whatever the host's size).
fn pace(took: Duration) -> Duration {
    RESCAN.max(2 * took)
}

/// How far behind the writer lets the scan fall, for scans that take `took`: the last
/// finished scan began at most this long ago. The scans' pace, one scan's time and 50 ms:
/// a scan on time never holds the writer (at 21 ms a scan: 321 ms), and a writer that
/// appears is seen within about as much writing as when the writer scanned itself every
/// 250 ms, or within this long where the scans are slow (the run warns); never more than
/// [`BEHIND_MOST`], where the writer waits for the scans as it did for every one.
fn behind(took: Duration) -> Duration {
    (pace(took) + took + Duration::from_millis(50)).min(BEHIND_MOST)
}

/// The longest the writer goes on after the last finished scan began, however slow the
/// scans.
const BEHIND_MOST: Duration = Duration::from_secs(3);

/// How long the writer waits for one scan before the run stops (exit 4): a scan that
/// takes this long has met something that does not answer.
const SCAN_LIMIT: Duration = Duration::from_secs(60);

struct Seen {
    /// The first finding.
    found: Option<Error>,
    /// When the last finished scan began (at first, the scan before the window).
    scanned: Option<Instant>,
    /// The thread is gone (stopped, or it found something).
    ended: bool,
    /// How long the last two finished scans took, the shorter: one scan slowed by a
    /// passing stall does not loosen the writer's bound.
    took: Duration,
}

impl Beside {
    /// None where no thread can be started (the writer then scans itself). `last`: when
    /// the scan before the window began, and `took` how long it took; `warned`: the run's.
    fn start(scan: ScanFn, last: Option<Instant>, took: Duration, warned: Arc<AtomicBool>) -> Option<Beside> {
        let (tx, rx) = mpsc::channel::<()>();
        let seen = Arc::new((Mutex::new(Seen { found: None, scanned: last, ended: false, took }), Condvar::new()));
        let shared = Arc::clone(&seen);
        let first = last.map_or(Duration::ZERO, |t| pace(took).saturating_sub(t.elapsed()));
        let body = move || {
            let (lock, cv) = &*shared;
            let (mut gap, mut last_took) = (first, took);
            warn_slow(took, &warned);
            while let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(gap) {
                let began = Instant::now();
                let r = scan();
                let took = began.elapsed();
                warn_slow(took.min(last_took), &warned);
                let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
                (s.scanned, s.took) = (Some(began), took.min(last_took));
                last_took = took;
                if let Err(e) = r {
                    s.found = Some(e);
                    break;
                }
                drop(s);
                cv.notify_all();
                // The next begins at the scans' pace after this one began.
                gap = pace(took).saturating_sub(took);
            }
            lock.lock().unwrap_or_else(|p| p.into_inner()).ended = true;
            cv.notify_all();
        };
        match std::thread::Builder::new().name("writers-scan".into()).spawn(body) {
            Ok(t) => Some(Beside { stop: Some(tx), seen, thread: Some(t) }),
            Err(e) => {
                log::debug!("the writers' scan stays on the writer's thread: {e}");
                None
            }
        }
    }

    /// What it found so far, and when its last finished scan began; first, when that is
    /// more than [`behind`] ago, waits for a scan that began since then.
    fn found(&self) -> (Option<Error>, Option<Instant>) {
        let (lock, cv) = &*self.seen;
        let asked = Instant::now();
        let gone = || self.thread.as_ref().is_none_or(|t| t.is_finished());
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        let need = asked.checked_sub(behind(s.took));
        while !s.ended && s.found.is_none() && s.scanned < need && !gone() {
            if asked.elapsed() > SCAN_LIMIT {
                s.found = Some(Error::io(
                    format!("the writers' scan of /proc has not finished in {} s", SCAN_LIMIT.as_secs()),
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                ));
                break;
            }
            s = cv.wait_timeout(s, RESCAN).unwrap_or_else(|p| p.into_inner()).0;
        }
        if !s.ended && s.found.is_none() && gone() {
            // It panicked: no run goes on unscanned.
            s.found = Some(Error::Internal("the writers' scan beside the writer stopped".into()));
        }
        Seen::take(&mut s)
    }

    /// Stops it after its scan in flight; what it found (a panic of its own included).
    fn finish(&mut self) -> (Option<Error>, Option<Instant>) {
        self.stop.take();
        let panicked = self.thread.take().is_some_and(|t| t.join().is_err());
        let mut s = self.seen.0.lock().unwrap_or_else(|p| p.into_inner());
        if panicked && s.found.is_none() {
            s.found = Some(Error::Internal("the writers' scan beside the writer panicked".into()));
        }
        Seen::take(&mut s)
    }
}

impl Seen {
    /// The finding (once: the run stops at it), and when the last finished scan began.
    fn take(&mut self) -> (Option<Error>, Option<Instant>) {
        (self.found.take(), self.scanned)
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A check whose scans beside the writer are `scan`, its scan before the window
    /// `ago` old.
    fn check_with(scan: impl Fn() -> Result<()> + Send + Sync + 'static, ago: Duration) -> WritersCheck {
        let none = Scan { target: PathBuf::from("/nonexistent"), devices: Vec::new(), swap_among: None };
        let mut c = WritersCheck::with_scan(none, Arc::new(scan), false);
        c.checked = Some(Instant::now() - ago);
        c
    }

    fn found_writer() -> Error {
        Error::Refused { reason: "a writer".into(), hint: Some("stop it".into()) }
    }

    /// A finding of the thread's stops the writer at its next chunk (exit 4, not a
    /// refusal), and is said once.
    #[test]
    fn a_finding_beside_the_writer_stops_it_at_the_next_chunk() {
        let n = Arc::new(AtomicU32::new(0));
        let m = Arc::clone(&n);
        let mut c = check_with(
            move || if m.fetch_add(1, Ordering::SeqCst) < 1 { Ok(()) } else { Err(found_writer()) },
            Duration::ZERO,
        );
        c.recheck(false).unwrap();
        assert!(c.beside.is_some(), "the scan runs beside the writer");
        let t = Instant::now();
        let e = loop {
            match c.recheck(false) {
                Ok(()) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => break e,
            }
            assert!(t.elapsed() < Duration::from_secs(5), "the finding never came");
        };
        assert!(!matches!(e, Error::Refused { .. }) && e.to_string().contains("stopped before writing more"), "{e}");
        let mut guard = crate::engine::guard::NoFreeze;
        assert!(c.before_thaw(&mut guard).is_ok(), "said once: the window's end does not hide it");
    }

    /// The scan before the window is stale at the first chunk: the writer waits for a
    /// scan of the thread's, which finds what came meanwhile.
    #[test]
    fn a_stale_scan_before_the_window_is_redone_before_the_first_chunk() {
        let mut c = check_with(|| Err(found_writer()), Duration::from_secs(2));
        assert!(c.recheck(false).is_err(), "the first chunk waits for a scan, which finds the writer");
    }

    /// Slow scans (a host of many processes) are paced at half a CPU and do not hold the
    /// writer: it waits only for a scan that is late for their pace, never for good.
    #[test]
    fn slow_scans_are_paced_and_hold_the_writer_only_when_late() {
        let scans = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&scans);
        let slow = move || {
            counted.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(400));
            Ok(())
        };
        // The scan before the window took as long, and is stale for that pace.
        let mut c = check_with(slow, Duration::from_secs(2));
        c.took = Duration::from_millis(400);
        let t = Instant::now();
        c.recheck(false).unwrap();
        assert!(t.elapsed() >= Duration::from_millis(350), "the stale scan before the window is redone first");
        let (t, mut held) = (Instant::now(), Duration::ZERO);
        while t.elapsed() < Duration::from_secs(2) {
            let asked = Instant::now();
            c.recheck(false).unwrap();
            held += asked.elapsed();
            std::thread::sleep(Duration::from_millis(20));
        }
        // Scans on time for their pace hold no chunk (before, each chunk waited 400 ms);
        // a busy host's scheduler may make one late.
        assert!(held < Duration::from_millis(600), "held {held:?}");
        // One every 800 ms at most (twice the scan's time), the first at once.
        assert!(scans.load(Ordering::SeqCst) <= 5, "{} scans", scans.load(Ordering::SeqCst));
        assert_eq!(behind(Duration::from_millis(400)), Duration::from_millis(1250));
        assert_eq!(behind(Duration::from_millis(21)), Duration::from_millis(321));
        assert_eq!(behind(Duration::from_secs(5)), BEHIND_MOST, "however slow the scans");

        // Fast once, then stuck: the writer waits for the late scan, and not for good.
        let n = Arc::new(AtomicU32::new(0));
        let m = Arc::clone(&n);
        let stuck = move || {
            let ms = if m.fetch_add(1, Ordering::SeqCst) == 0 { 50 } else { 1500 };
            std::thread::sleep(Duration::from_millis(ms));
            Ok(())
        };
        let mut c = check_with(stuck, Duration::from_secs(1));
        c.recheck(false).unwrap();
        std::thread::sleep(Duration::from_millis(600));
        let asked = Instant::now();
        c.recheck(false).unwrap();
        assert!(asked.elapsed() >= Duration::from_millis(500), "held for the late scan: {:?}", asked.elapsed());
        assert!(asked.elapsed() < Duration::from_secs(10), "{:?}", asked.elapsed());
    }

    /// The window's end takes the scan in flight: what it finds counts. A panic of the
    /// thread's fails the check.
    #[test]
    fn the_windows_end_waits_for_the_scan_in_flight_and_a_panic_fails() {
        let mut guard = crate::engine::guard::NoFreeze;
        let late = || {
            std::thread::sleep(Duration::from_millis(300));
            Err(found_writer())
        };
        let mut c = check_with(late, Duration::from_millis(200));
        c.recheck(false).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        assert!(c.before_thaw(&mut guard).is_err(), "the scan in flight found a writer");
        assert!(c.beside.is_none(), "stopped with its window");

        let mut c = check_with(|| panic!("a scan that panics"), Duration::from_millis(200));
        c.recheck(false).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(c.before_thaw(&mut guard).is_err(), "a scan that panicked fails the window");
    }
}
