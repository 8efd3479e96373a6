//! A light read probe: small O_DIRECT reads of data in use, spread out, to see what a
//! trim (host::trim) costs the readers of a device or a file.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::engine::target::{DirectReader, ReadTarget};
use crate::host::freeze::Thawed;
use crate::host::trim::{Pace, ProbeComparison, TrimReport, TrimTarget, run};
use crate::support::signals::StopFlag;
use crate::sys::memory::AlignedBuf;

/// The probe's read size and spacing: about 200 small reads a second, which a drive
/// barely notices and which still gives a p99 within a second or two.
pub(crate) const PROBE_BLOCK: u64 = 4096;
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(5);
/// How long the probe measures just before the trim, at least.
pub(crate) const PROBE_BEFORE: Duration = Duration::from_secs(2);
/// Reads the reference before the trim needs for its p99 to be more than its maximum: on
/// a busy host 2 s can hold a few dozen, so it reads on until it has these...
pub(crate) const PROBE_BEFORE_READS: usize = 100;
/// ...or for this long, at most: the trim waits for it.
pub(crate) const PROBE_BEFORE_MAX: Duration = Duration::from_secs(10);

/// Small O_DIRECT reads at spread-out places of data in use.
pub(crate) struct Probe {
    reader: DirectReader,
    /// (device or file offset, length), ascending; reads land inside them.
    ranges: Vec<(u64, u64)>,
    total: u64,
    block: u64,
    describe: String,
}

impl Probe {
    /// A probe of `path` (a device or a file) within `ranges` (None: all of it).
    pub(crate) fn open(path: &Path, ranges: Option<&[(u64, u64)]>) -> crate::support::error::Result<Probe> {
        let src = crate::measure::readbench::Source::open(path)?;
        let align = src.reader.offset_align();
        let block = PROBE_BLOCK.max(align).div_ceil(align) * align;
        let ranges: Vec<(u64, u64)> = match ranges {
            Some(r) => r
                .iter()
                .map(|&(o, l)| {
                    let a = o.div_ceil(align) * align;
                    (a, l.saturating_sub(a - o))
                })
                .filter(|&(_, l)| l >= block)
                .collect(),
            None => vec![(0, src.len)],
        };
        let total = ranges.iter().map(|r| r.1 / block).sum::<u64>();
        if total == 0 {
            return Err(crate::support::error::Error::Usage(format!("{}: nothing in use to probe", path.display())));
        }
        Ok(Probe { describe: path.display().to_string(), reader: src.reader, ranges, total, block })
    }

    /// The `i`th probe block's offset.
    fn offset_of(&self, mut i: u64) -> u64 {
        for &(o, l) in &self.ranges {
            let n = l / self.block;
            if i < n {
                return o + i * self.block;
            }
            i -= n;
        }
        self.ranges[0].0
    }

    /// Reads until `done(reads so far)` (at least once), one read every
    /// [`PROBE_INTERVAL`]; returns each read's latency.
    fn sample(&self, done: impl Fn(usize) -> bool, seed: u64) -> Vec<f64> {
        let mut rng = crate::support::scratch::XorShift::new(seed);
        let mut buf = AlignedBuf::new(self.block as usize, self.reader.mem_align());
        let mut lat = Vec::new();
        loop {
            let at = self.offset_of(rng.next_u64() % self.total);
            let t = Instant::now();
            if self.reader.read_some_at(&mut buf, at).is_ok() {
                lat.push(t.elapsed().as_secs_f64());
            }
            if done(lat.len()) {
                return lat;
            }
            std::thread::sleep(PROBE_INTERVAL);
            if done(lat.len()) {
                return lat;
            }
        }
    }

    /// The reference: probes for [`PROBE_BEFORE`] and until it has [`PROBE_BEFORE_READS`],
    /// for [`PROBE_BEFORE_MAX`] at most (or until `stop`).
    pub(crate) fn sample_before(&self, stop: &StopFlag) -> Vec<f64> {
        let t0 = Instant::now();
        let done = |n: usize| {
            let t = t0.elapsed();
            stop.signal().is_some() || t >= PROBE_BEFORE_MAX || (t >= PROBE_BEFORE && n >= PROBE_BEFORE_READS)
        };
        self.sample(done, 1)
    }

    /// Probes in the background until [`Running::finish`].
    pub(crate) fn start(self: &Arc<Self>) -> Running {
        let done = Arc::new(AtomicBool::new(false));
        let (p, d) = (Arc::clone(self), Arc::clone(&done));
        Running { done, thread: Some(std::thread::spawn(move || p.sample(|_| d.load(Ordering::SeqCst), 2))) }
    }
}

/// A probe reading in the background.
pub(crate) struct Running {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<f64>>>,
}

impl Running {
    pub(crate) fn finish(mut self) -> Vec<f64> {
        self.done.store(true, Ordering::SeqCst);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs the trim with the probe reading before ([`Probe::sample_before`]) and during it.
pub(crate) fn run_probed(
    targets: &[TrimTarget<'_>],
    pace: Pace,
    stop: &StopFlag,
    thawed: &Thawed,
    probe: Arc<Probe>,
) -> TrimReport {
    let before = probe.sample_before(stop);
    let running = probe.start();
    let mut report = run(targets, pace, stop, thawed);
    let during = running.finish();
    report.probe = Some(ProbeComparison::new(probe.describe.clone(), probe.block, PROBE_INTERVAL, &before, &during));
    report
}
