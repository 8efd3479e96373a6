//! FITRIM in paced slices, and what they cost readers as a light read probe saw it (the
//! probe itself reads, so it is measure::probe's).
//!
//! One FITRIM over a whole filesystem discards all its free space in one go: measured on
//! real drives, reads fell from ~58k/s to ~5k/s for the 16 s such a trim took. So reseq
//! trims in slices (FITRIM's `start`/`len`, filesystem byte offsets), ascending, each
//! byte of the filesystem in exactly one slice, with the device left idle between them:
//!
//! - by default each slice's time is measured and reseq sleeps [`IDLE_FACTOR`] times as
//!   long before the next, so the trim keeps the device busy at most 1/(1 + k) of the
//!   time; slices grow or shrink so that one lasts about [`TARGET_SLICE`] (a reader
//!   stalls at most about that long);
//! - `--trim-rate` paces by bytes discarded per second (what the drive has to do), in
//!   slices of a quarter second's worth; `--pause` sleeps that long between slices (with
//!   slices sized as by default). Given both, the longer sleep wins.
//!
//! What FITRIM reports differs: ext4 the bytes it discarded, xfs the length of the range
//! it went through. The pace and the report count what the filesystem reports.
//!
//! A slice only runs after the last freeze window is thawed: [`run`] takes a
//! [`crate::host::freeze::Thawed`], which only ending the windows makes. A stop signal ends the
//! trim between slices; the report says what was trimmed until then.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::host::freeze::Thawed;
use crate::support::signals::StopFlag;
use crate::support::units::{human_bytes, human_rate};
use crate::sys;

const MIB: u64 = 1 << 20;
/// Slice boundaries are multiples of this (whole blocks on any block size up to 64 KiB).
pub(crate) const SLICE_ALIGN: u64 = MIB;
/// The first slice of the default pace: small, as the drive's speed is not known yet
/// (slices double while they take under a quarter of [`TARGET_SLICE`]).
pub(crate) const DEFAULT_SLICE: u64 = 64 * MIB;
/// Slices of an unpaced trim (`bench --trim-impact`): small enough to time one by one.
pub(crate) const UNPACED_SLICE: u64 = 16 * MIB;
pub(crate) const MIN_SLICE: u64 = MIB;
pub(crate) const MAX_SLICE: u64 = 4 << 30;
/// Default pace: sleep this many times each slice's duration before the next one.
pub(crate) const IDLE_FACTOR: u32 = 4;
/// Default pace: the slice length adapts so that one slice takes about this long.
pub(crate) const TARGET_SLICE: Duration = Duration::from_millis(100);
/// With `--trim-rate`, one slice is this much time's worth of the rate.
pub(crate) const RATE_SLICE_TIME: Duration = Duration::from_millis(250);

/// How the slices are spaced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pace {
    /// Sleep [`IDLE_FACTOR`] x each slice's time; slices sized to about [`TARGET_SLICE`].
    Auto,
    /// At most `rate` bytes discarded per second (averaged), and at least `pause`
    /// between slices.
    Fixed { rate: Option<u64>, pause: Duration },
    /// No sleep at all (`bench --trim-impact` without a rate: the drive's worst case).
    Unpaced,
}

impl Pace {
    /// The pace of `--trim-rate` and `--pause` (a zero pause is no pause).
    pub(crate) fn of(rate: Option<u64>, pause: Duration) -> Pace {
        if rate.is_none() && pause.is_zero() { Pace::Auto } else { Pace::Fixed { rate, pause } }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Pace::Auto => format!(
                "auto: idle {IDLE_FACTOR} x each slice's time (device busy at most {} %), slices of about {} ms",
                100 / (1 + IDLE_FACTOR),
                TARGET_SLICE.as_millis()
            ),
            Pace::Fixed { rate, pause } => {
                let rate = rate.map(|r| format!("at most {} discarded", human_rate(r as f64)));
                let pause = (!pause.is_zero()).then(|| format!("{:.3} s between slices", pause.as_secs_f64()));
                rate.into_iter().chain(pause).collect::<Vec<_>>().join(", ")
            }
            Pace::Unpaced => "unpaced (slices back to back)".into(),
        }
    }
}

/// Rounds `v` up to a multiple of `a`, within `[lo, hi]`.
fn clamp_aligned(v: u64, a: u64, lo: u64, hi: u64) -> u64 {
    (v.div_ceil(a) * a).clamp(lo, hi)
}

/// Decides slice lengths and the sleeps between slices. Pure: time comes in as offsets
/// from the start of the trim, so the arithmetic is unit-tested.
#[derive(Debug)]
pub(crate) struct Pacer {
    pace: Pace,
    slice: u64,
    /// Rate pacing: bytes trimmed since `base`, which is when they were due from.
    base: Duration,
    since_base: u64,
}

impl Pacer {
    pub(crate) fn new(pace: Pace) -> Pacer {
        let slice = match pace {
            Pace::Fixed { rate: Some(r), .. } => {
                clamp_aligned((r as f64 * RATE_SLICE_TIME.as_secs_f64()) as u64, SLICE_ALIGN, MIN_SLICE, MAX_SLICE)
            }
            Pace::Unpaced => UNPACED_SLICE,
            _ => DEFAULT_SLICE,
        };
        Pacer { pace, slice, base: Duration::ZERO, since_base: 0 }
    }

    /// The length of the next slice.
    pub(crate) fn slice_len(&self) -> u64 {
        self.slice
    }

    /// Halves a slice that stalled readers longer than [`TARGET_SLICE`], doubles one that
    /// took under a quarter of it.
    fn adapt(&mut self, took: Duration) {
        if took > TARGET_SLICE && self.slice > MIN_SLICE {
            self.slice = clamp_aligned(self.slice / 2, SLICE_ALIGN, MIN_SLICE, MAX_SLICE);
        } else if took < TARGET_SLICE / 4 && self.slice < MAX_SLICE {
            self.slice = clamp_aligned(self.slice * 2, SLICE_ALIGN, MIN_SLICE, MAX_SLICE);
        }
    }

    /// After a slice that took `took`, trimmed `trimmed` bytes and ended at `now` (since
    /// the start): how long to sleep before the next one.
    pub(crate) fn after_slice(&mut self, took: Duration, trimmed: u64, now: Duration) -> Duration {
        match self.pace {
            Pace::Unpaced => Duration::ZERO,
            Pace::Auto => {
                self.adapt(took);
                took * IDLE_FACTOR
            }
            Pace::Fixed { rate, pause } => {
                if rate.is_none() {
                    self.adapt(took);
                }
                let by_rate = rate.filter(|&r| r > 0).map_or(Duration::ZERO, |r| {
                    let secs = |bytes: u64| Duration::from_secs_f64(bytes as f64 / r as f64);
                    self.since_base += trimmed;
                    let mut due = self.base + secs(self.since_base);
                    // Far behind (the process was stopped, the device was slow): count
                    // afresh from this slice rather than catch up in a burst, which is
                    // the stall the pace is there to prevent.
                    if now > due + RATE_SLICE_TIME * 2 {
                        (self.base, self.since_base) = (now, trimmed);
                        due = now + secs(trimmed);
                    }
                    due.saturating_sub(now)
                });
                by_rate.max(pause)
            }
        }
    }
}

/// One FITRIM call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct TrimSlice {
    /// When it started, in seconds from the start of the trim (the pacing shows in these).
    pub(crate) at_seconds: f64,
    /// Byte offset in the filesystem (FITRIM's `start`).
    pub(crate) start_bytes: u64,
    /// FITRIM's `len` as asked (the last slice may reach past the filesystem's end,
    /// which the kernel clamps).
    pub(crate) length_bytes: u64,
    /// What FITRIM reported in `len`. ext4: the bytes it discarded (a free extent that
    /// begins in the slice is discarded up to its end, at most its block group's end, so
    /// this can exceed `length_bytes`; the next slices find those blocks done). xfs: the
    /// length of the range it went through, whatever was free in it.
    pub(crate) trimmed_bytes: u64,
    pub(crate) seconds: f64,
}

/// The slices of one filesystem.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct TrimFs {
    pub(crate) mount_point: String,
    /// The range the slices cover, in filesystem bytes.
    pub(crate) start_bytes: u64,
    pub(crate) end_bytes: u64,
    pub(crate) trimmed_bytes: u64,
    /// Ascending, each byte of the range in exactly one.
    pub(crate) slices: Vec<TrimSlice>,
    /// Why the slices stopped early (an error, the filesystem's end), if they did.
    pub(crate) error: Option<String>,
}

/// Read latency of the probe: small O_DIRECT reads of data in use, spaced out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct LatencySample {
    pub(crate) reads: u64,
    pub(crate) p50_seconds: Option<f64>,
    pub(crate) p99_seconds: Option<f64>,
    pub(crate) max_seconds: Option<f64>,
}

impl LatencySample {
    pub(crate) fn of(lat: &[f64]) -> LatencySample {
        LatencySample {
            reads: lat.len() as u64,
            p50_seconds: crate::support::units::percentile(lat, 0.50),
            p99_seconds: crate::support::units::percentile(lat, 0.99),
            max_seconds: lat.iter().copied().reduce(f64::max),
        }
    }
}

/// The probe just before the trim and during it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct ProbeComparison {
    /// What was read: a device's ranges in use, or a file kept for the purpose.
    pub(crate) target: String,
    pub(crate) block_size_bytes: u64,
    /// The probe's gap between reads (it is light on purpose: it must not be the load).
    pub(crate) interval_seconds: f64,
    pub(crate) before: LatencySample,
    pub(crate) during: LatencySample,
    /// during / before, for p50 and p99 (null: a side had no reads).
    pub(crate) p50_ratio: Option<f64>,
    pub(crate) p99_ratio: Option<f64>,
}

impl ProbeComparison {
    /// Latencies (seconds) of a probe of `target` reading `block` bytes every `interval`.
    pub(crate) fn new(
        target: String,
        block: u64,
        interval: Duration,
        before: &[f64],
        during: &[f64],
    ) -> ProbeComparison {
        let (b, d) = (LatencySample::of(before), LatencySample::of(during));
        let ratio = |x: Option<f64>, y: Option<f64>| Some(y? / x.filter(|&v| v > 0.0)?);
        ProbeComparison {
            target,
            block_size_bytes: block,
            interval_seconds: interval.as_secs_f64(),
            p50_ratio: ratio(b.p50_seconds, d.p50_seconds),
            p99_ratio: ratio(b.p99_seconds, d.p99_seconds),
            before: b,
            during: d,
        }
    }

    pub(crate) fn text(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.2} ms", v * 1e3));
        let x = |v: Option<f64>| v.map_or("-".into(), |v| format!("x{v:.2}"));
        let (b, d) = (&self.before, &self.during);
        let (b50, b99, d50, d99) = (ms(b.p50_seconds), ms(b.p99_seconds), ms(d.p50_seconds), ms(d.p99_seconds));
        let (block, x50, x99) = (human_bytes(self.block_size_bytes), x(self.p50_ratio), x(self.p99_ratio));
        format!(
            "    read latency ({block} reads of {}): before p50 {b50} p99 {b99} ({} reads), during the trim p50 {d50} p99 {d99} ({} reads): p50 {x50}, p99 {x99}\n",
            self.target, b.reads, d.reads
        )
    }
}

/// What a sliced trim did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct TrimReport {
    /// The pace, in words.
    pub(crate) pace: String,
    /// `--trim-rate`, if given.
    pub(crate) rate_limit_bytes_per_second: Option<u64>,
    pub(crate) bytes_trimmed: u64,
    pub(crate) slices: u64,
    /// From the first slice's start to the last one's end, sleeps included.
    pub(crate) seconds: f64,
    /// The slices' own time (the device busy discarding).
    pub(crate) busy_seconds: f64,
    pub(crate) slowest_slice_seconds: f64,
    /// bytes_trimmed / seconds.
    pub(crate) bytes_per_second: f64,
    /// The signal that stopped the trim between slices (null: it ran to the end).
    pub(crate) stopped_by: Option<String>,
    pub(crate) filesystems: Vec<TrimFs>,
    /// `--bench` / `bench --trim-impact`: the probe's read latency before and during.
    pub(crate) probe: Option<ProbeComparison>,
}

impl TrimReport {
    /// One line: how much, how long, and with `--bench` what it did to reads; failures
    /// each on a line of their own. The pace and the slices are [`TrimReport::text`]'s.
    pub(crate) fn short_text(&self) -> String {
        let x = |v: Option<f64>| v.map_or("-".into(), |v| format!("x{v:.2}"));
        let probe = self
            .probe
            .as_ref()
            .map(|p| format!("; read latency meanwhile p50 {}, p99 {}", x(p.p50_ratio), x(p.p99_ratio)));
        let (bytes, probe) = (human_bytes(self.bytes_trimmed), probe.unwrap_or_default());
        let stopped = self.stopped_by.as_ref().map(|s| format!("; STOPPED by {s}")).unwrap_or_default();
        let mut s = format!("  trim: {bytes} of free space discarded in {:.1} s{probe}{stopped}\n", self.seconds);
        s += &self.failures();
        s
    }

    fn failures(&self) -> String {
        let failed = self.filesystems.iter().filter(|f| f.error.is_some());
        failed.map(|f| format!("    {}: {}\n", f.mount_point, f.error.as_deref().unwrap_or_default())).collect()
    }

    pub(crate) fn text(&self) -> String {
        let (bytes, rate) = (human_bytes(self.bytes_trimmed), human_rate(self.bytes_per_second));
        let stopped = self.stopped_by.as_ref().map(|s| format!("; STOPPED by {s}")).unwrap_or_default();
        let mut s = format!(
            "  trim: {bytes} discarded in {} slice(s) over {:.1} s ({rate}), busy {:.2} s, slowest slice {:.3} s; pace {}{stopped}\n",
            self.slices, self.seconds, self.busy_seconds, self.slowest_slice_seconds, self.pace
        );
        s += &self.failures();
        if let Some(p) = &self.probe {
            s += &p.text();
        }
        s
    }
}

/// One filesystem to trim: its name, an open file on it, and the range to cover.
pub(crate) struct TrimTarget<'a> {
    pub(crate) name: String,
    pub(crate) fd: BorrowedFd<'a>,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// Trims the targets one after the other, in ascending slices, paced. Stops between
/// slices when `stop` is raised. `_thawed` proves no freeze window is open.
pub(crate) fn run(targets: &[TrimTarget<'_>], pace: Pace, stop: &StopFlag, _thawed: &Thawed) -> TrimReport {
    let started = Instant::now();
    let rate_limit_bytes_per_second = if let Pace::Fixed { rate, .. } = pace { rate } else { None };
    let out = TrimReport { pace: pace.describe(), rate_limit_bytes_per_second, ..TrimReport::default() };
    let mut run = Trimming { started, pacer: Pacer::new(pace), out, sleep: Duration::ZERO, last_end: started };
    for t in targets {
        let (fs, stopped) = run.filesystem(t, stop);
        run.out.filesystems.push(fs);
        if stopped {
            break;
        }
    }
    let mut out = run.out;
    out.seconds = (run.last_end - started).as_secs_f64();
    out.bytes_per_second = if out.seconds > 0.0 { out.bytes_trimmed as f64 / out.seconds } else { 0.0 };
    out
}

/// A trim under way: the pacing and the figures so far.
struct Trimming {
    started: Instant,
    pacer: Pacer,
    out: TrimReport,
    /// The pause before the next slice.
    sleep: Duration,
    /// When the last slice ended.
    last_end: Instant,
}

impl Trimming {
    /// Trims one filesystem in slices; `true` with it when a stop ended the run.
    fn filesystem(&mut self, t: &TrimTarget<'_>, stop: &StopFlag) -> (TrimFs, bool) {
        let mut fs =
            TrimFs { mount_point: t.name.clone(), start_bytes: t.start, end_bytes: t.end, ..TrimFs::default() };
        let mut at = t.start;
        while at < t.end {
            stop.sleep(self.sleep);
            if let Some(sig) = stop.signal() {
                self.out.stopped_by = Some(sig.into());
                return (fs, true);
            }
            let len = self.pacer.slice_len().min(t.end - at);
            crate::support::hooks::point("trim-slice");
            let t0 = Instant::now();
            let r = sys::extents::fitrim_range(t.fd, at, len);
            let took = t0.elapsed();
            self.last_end = Instant::now();
            match r {
                Ok(n) => {
                    log::debug!(
                        "FITRIM {} bytes {at}..{}: {n} discarded in {:.3} s",
                        t.name,
                        at + len,
                        took.as_secs_f64()
                    );
                    let slice = TrimSlice {
                        at_seconds: (t0 - self.started).as_secs_f64(),
                        start_bytes: at,
                        length_bytes: len,
                        trimmed_bytes: n,
                        seconds: took.as_secs_f64(),
                    };
                    self.slice_done(&mut fs, slice, took);
                }
                // Past the filesystem's last block (it is shorter than its device): done.
                Err(nix::errno::Errno::EINVAL) if at > t.start => {
                    fs.end_bytes = at;
                    break;
                }
                Err(e) => {
                    // Not fatal: the data is rewritten; the report and a warning say so.
                    fs.error = Some(format!("FITRIM bytes {at}..{} failed: {e}", at + len));
                    log::warn!("{}: {}", t.name, fs.error.as_deref().unwrap_or_default());
                    break;
                }
            }
            at += len;
        }
        (fs, false)
    }

    /// Counts a slice, and paces the next one.
    fn slice_done(&mut self, fs: &mut TrimFs, slice: TrimSlice, took: Duration) {
        let n = slice.trimmed_bytes;
        fs.slices.push(slice);
        fs.trimmed_bytes += n;
        self.out.bytes_trimmed += n;
        self.out.slices += 1;
        self.out.busy_seconds += took.as_secs_f64();
        self.out.slowest_slice_seconds = self.out.slowest_slice_seconds.max(took.as_secs_f64());
        self.sleep = self.pacer.after_slice(took, n, self.last_end - self.started);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn the_default_pace_idles_k_times_each_slice_and_sizes_slices_to_the_target() {
        let mut p = Pacer::new(Pace::Auto);
        assert_eq!(p.slice_len(), DEFAULT_SLICE);
        // A fast slice: idle 4x, and the next is twice as long.
        assert_eq!(p.after_slice(ms(10), 0, ms(10)), ms(40));
        assert_eq!(p.slice_len(), 2 * DEFAULT_SLICE);
        // Near the target: unchanged.
        assert_eq!(p.after_slice(ms(60), 0, ms(200)), ms(240));
        assert_eq!(p.slice_len(), 2 * DEFAULT_SLICE);
        // A slow one: halved, and never under the minimum or over the maximum.
        p.after_slice(ms(500), 0, ms(900));
        assert_eq!(p.slice_len(), DEFAULT_SLICE);
        for _ in 0..40 {
            p.after_slice(Duration::from_secs(2), 0, ms(900));
        }
        assert_eq!(p.slice_len(), MIN_SLICE);
        for _ in 0..40 {
            p.after_slice(Duration::ZERO, 0, ms(900));
        }
        assert_eq!(p.slice_len(), MAX_SLICE);
        // Busy at most 1/(1+k) of the time: slice + sleep = (1+k) x slice.
        let took = ms(37);
        assert_eq!(took + Pacer::new(Pace::Auto).after_slice(took, 0, took), took * (1 + IDLE_FACTOR));
    }

    #[test]
    fn a_rate_spaces_slices_by_bytes_discarded_and_never_catches_up_in_a_burst() {
        let rate = 100 * MIB;
        let mut p = Pacer::new(Pace::Fixed { rate: Some(rate), pause: Duration::ZERO });
        assert_eq!(p.slice_len(), 25 * MIB, "a quarter second's worth");
        // 25 MiB discarded by t = 10 ms: due at 250 ms, so sleep 240 ms.
        assert_eq!(p.after_slice(ms(10), 25 * MIB, ms(10)), ms(240));
        // Nothing discarded (a slice of used space): no sleep needed beyond the schedule.
        assert_eq!(p.after_slice(ms(5), 0, ms(255)), Duration::ZERO);
        // 50 MiB by 260 ms: due at 500 ms.
        assert_eq!(p.after_slice(ms(5), 25 * MIB, ms(260)), ms(240));
        // Stopped (SIGSTOP) for 10 s: counting starts afresh from that slice, which is
        // paced like any other; no burst of catch-up slices.
        assert_eq!(p.after_slice(ms(5), 25 * MIB, ms(10_500)), ms(250));
        assert_eq!(p.after_slice(ms(5), 25 * MIB, ms(10_755)), ms(245));
        // Over a long run the average holds: 400 slices of 25 MiB.
        let mut p = Pacer::new(Pace::Fixed { rate: Some(rate), pause: Duration::ZERO });
        let mut now = Duration::ZERO;
        for _ in 0..400 {
            now += ms(3); // the slice
            now += p.after_slice(ms(3), 25 * MIB, now);
        }
        let got = (400 * 25 * MIB) as f64 / now.as_secs_f64();
        assert!((got / rate as f64 - 1.0).abs() < 0.01, "{got}");
        // Small rates get the minimum slice; huge ones the maximum.
        assert_eq!(Pacer::new(Pace::Fixed { rate: Some(1000), pause: Duration::ZERO }).slice_len(), MIN_SLICE);
        assert_eq!(Pacer::new(Pace::Fixed { rate: Some(1 << 40), pause: Duration::ZERO }).slice_len(), MAX_SLICE);
    }

    #[test]
    fn a_pause_is_a_floor_and_no_pace_is_auto() {
        let mut p = Pacer::new(Pace::Fixed { rate: None, pause: ms(300) });
        assert_eq!(p.after_slice(ms(1), 10 * MIB, ms(1)), ms(300));
        assert_eq!(p.slice_len(), 2 * DEFAULT_SLICE, "slices still sized to the stall target");
        let mut p = Pacer::new(Pace::Fixed { rate: Some(100 * MIB), pause: ms(300) });
        assert_eq!(p.after_slice(ms(1), 25 * MIB, ms(1)), ms(300), "the longer of the two");
        assert_eq!(Pace::of(None, Duration::ZERO), Pace::Auto);
        assert_eq!(Pacer::new(Pace::Unpaced).after_slice(ms(50), 1, ms(50)), Duration::ZERO);
    }

    #[test]
    fn slices_are_aligned_ascending_and_cover_the_range_once() {
        // The slicing of `run`, with the pacer's lengths, over an odd-sized range.
        let end = 10 * (1 << 30) + 12345;
        let mut p = Pacer::new(Pace::Auto);
        let (mut at, mut slices) = (0u64, Vec::new());
        let mut i = 0u64;
        while at < end {
            let len = p.slice_len().min(end - at);
            slices.push((at, len));
            at += len;
            i += 1;
            p.after_slice(ms(i * 37 % 200), 0, ms(i));
        }
        assert!(slices.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0), "contiguous and ascending");
        assert_eq!(slices[0].0, 0);
        assert_eq!(slices.iter().map(|s| s.1).sum::<u64>(), end);
        assert!(slices[..slices.len() - 1].iter().all(|s| s.0 % SLICE_ALIGN == 0 && s.1 % SLICE_ALIGN == 0));
    }
}
