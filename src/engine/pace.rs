//! When a window stops starting chunks.
//!
//! A chunk started is a chunk finished inside the window: its permit and write, the
//! read-backs still queued before its own, its read-back, then the thaw. So the writer
//! starts one only if all that, as this run has measured it, fits in what is left of the
//! window's budget, with a safety factor and a margin for what no measurement foresaw.
//!
//! The same test, put earlier, decides what the reader reads: a chunk read ahead and not
//! written is dropped at the thaw and read again in the next window, so a chunk is read
//! only if, started when the writer should be done with the chunks before it, it would
//! still fit ([`Pace::start_in`]).

use std::time::Duration;

/// A measurement counts in full; older ones fade by this factor with each new one (a
/// decaying maximum: one fast chunk does not hide a slow one).
const DECAY: f64 = 0.8;

/// And by this factor at the start of each window.
const WINDOW_DECAY: f64 = 0.5;

/// What the end of a window is predicted to take is doubled: the last chunk may be slower
/// than the slowest recent one (a busy host, a device's hiccup).
const SAFETY: f64 = 2.0;

/// Share of the budget kept free in every window, whatever was measured.
const MARGIN: f64 = 0.1;

/// In predicting when the writer reaches a chunk the reader may read early, each step
/// after the first (the chunk after the writer's next and beyond) counts this many times.
/// Two chunks ahead the prediction is a guess: a window's later chunks, written while
/// reads and read-backs compete with them, were measured up to three times slower than
/// its first (a loop device on a busy host), and every chunk read in vain is read twice.
/// So the reader reads one chunk ahead near the window's end and `--read-ahead` only well
/// before it. Measured with 60 files of 5 MiB in 100 ms windows, on a host loaded by other
/// builds: reads were 1.05-1.26 x the writes at 2, 1.06-1.14 at 4, 1.00-1.09 at 8, and no
/// better at 100 (1.01-1.12).
const FURTHER_STEP: u32 = 8;

/// How long one operation on a chunk takes, learned from the chunks measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cost {
    /// Decaying maximum of the time any chunk took.
    time: Duration,
    /// Decaying maximum of the seconds per byte of full chunks (at least half the chunk
    /// size): a chunk bigger than the last ones is predicted at that rate, not in the time
    /// a small one took. Smaller pieces (file mode's small files), whose time is mostly a
    /// fixed cost, do not count: at their rate a full chunk would look many times slower.
    per_byte: f64,
    /// The largest chunk measured (0: none yet).
    largest: u64,
    /// `time` and `per_byte` without the fade of each new window (they decay chunk by
    /// chunk only): what a chunk the writer comes to later in a window is predicted by,
    /// when the window may not have measured its own costs yet (see [`Pace::fits_ahead`]).
    unfaded: (Duration, f64),
}

impl Cost {
    /// One chunk of `len` bytes took `took`; `full` is the window's chunk size.
    pub(crate) fn learn(&mut self, len: u64, took: Duration, full: u64) {
        let len = len.max(1);
        self.time = took.max(self.time.mul_f64(DECAY));
        if len.saturating_mul(2) >= full {
            self.per_byte = (took.as_secs_f64() / len as f64).max(self.per_byte * DECAY);
        }
        self.largest = self.largest.max(len);
        let (time, per_byte) = self.unfaded;
        self.unfaded.0 = took.max(time.mul_f64(DECAY));
        if len.saturating_mul(2) >= full {
            self.unfaded.1 = (took.as_secs_f64() / len as f64).max(per_byte * DECAY);
        }
    }

    /// A new window: what the last one measured counts for less (a slow spell that ended
    /// must not keep every later window short), though the slowest still counts most.
    pub(crate) fn fade(&mut self) {
        self.time = self.time.mul_f64(WINDOW_DECAY);
        self.per_byte *= WINDOW_DECAY;
    }

    /// How long a chunk of `len` bytes should take (None: nothing measured yet). Before
    /// any full chunk, a larger chunk than those measured is taken to cost in proportion
    /// to its bytes (cautious: their time is partly a fixed cost).
    pub(crate) fn predict(&self, len: u64) -> Option<Duration> {
        self.predict_by(self.time, self.per_byte, len)
    }

    /// As [`Cost::predict`], without the fade of each new window.
    pub(crate) fn cautious(&self, len: u64) -> Option<Duration> {
        self.predict_by(self.unfaded.0, self.unfaded.1, len)
    }

    fn predict_by(&self, time: Duration, per_byte: f64, len: u64) -> Option<Duration> {
        if self.largest == 0 {
            return None;
        }
        let by_rate = match per_byte > 0.0 {
            true => per_byte * len as f64,
            false => time.as_secs_f64() * len as f64 / self.largest as f64,
        };
        Some(time.max(seconds(by_rate)))
    }
}

/// What a window's end costs, as measured in this run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Pace {
    /// A chunk's permit and write (the writer's own time).
    pub(crate) write: Cost,
    /// A chunk's read-back (the verifier's).
    pub(crate) read_back: Cost,
    /// A chunk's read and blake3 (the reader's and the hasher's): how long after it is
    /// let through the reader a chunk can be written.
    pub(crate) ready: Cost,
    /// From one chunk's permit to the next one's, within a window: the writer's pace,
    /// waits for the reader and the verifier included.
    pub(crate) step: Cost,
    /// From the writer's stop to the thaw (decaying maximum).
    thaw: Duration,
}

impl Pace {
    pub(crate) fn thawed(&mut self, took: Duration) {
        self.thaw = took.max(self.thaw.mul_f64(DECAY));
    }

    /// A new window begins (see [`Cost::fade`]).
    pub(crate) fn fade(&mut self) {
        self.write.fade();
        self.read_back.fade();
        self.ready.fade();
        self.step.fade();
    }

    /// How long from now until the writer, about to take its next chunk, starts a
    /// `len`-byte chunk that comes after the chunks `before` (their lengths, the next one
    /// first): a step for each of them (those after the first [`FURTHER_STEP`] times),
    /// and no sooner than this chunk can be read and hashed if its read starts now
    /// (cautious costs: see [`Pace::fits_ahead`]). Before any step is measured, one is
    /// taken to cost a write; before any read, a read-back.
    pub(crate) fn start_in(&self, before: impl Iterator<Item = u64>, len: u64) -> Duration {
        let steps = before.enumerate().fold(Duration::ZERO, |at, (i, l)| {
            let step = self.step.cautious(l).or(self.write.cautious(l)).unwrap_or_default();
            at.saturating_add(if i == 0 { step } else { step.saturating_mul(FURTHER_STEP) })
        });
        steps.max(self.ready_in(len))
    }

    /// How long a `len`-byte chunk takes to be read and hashed (cautious: see
    /// [`Pace::fits_ahead`]).
    pub(crate) fn ready_in(&self, len: u64) -> Duration {
        self.ready.cautious(len).or(self.read_back.cautious(len)).unwrap_or_default()
    }

    /// The time a window still needs if it starts a `len`-byte chunk now, with
    /// `read_backs` read-backs to wait for after its write (this chunk's included; none
    /// without verification). Before any read-back is measured one is taken to cost as
    /// much as a write.
    pub(crate) fn need(&self, len: u64, read_backs: u32, budget: Duration) -> Duration {
        self.need_by(Cost::predict, len, read_backs, budget)
    }

    fn need_by(&self, predict: fn(&Cost, u64) -> Option<Duration>, len: u64, rb: u32, budget: Duration) -> Duration {
        let write = predict(&self.write, len).unwrap_or_default().as_secs_f64();
        let back = predict(&self.read_back, len).map_or(write, |d| d.as_secs_f64());
        let end = write + back * f64::from(rb) + self.thaw.as_secs_f64();
        seconds(end * SAFETY + budget.as_secs_f64() * MARGIN)
    }

    /// Whether a window `elapsed` into a `budget` may start a `len`-byte chunk.
    pub(crate) fn fits(&self, elapsed: Duration, budget: Duration, len: u64, read_backs: u32) -> bool {
        elapsed.saturating_add(self.need(len, read_backs, budget)) <= budget
    }

    /// Whether [`Pace::fits`] should say yes when the writer comes to a chunk `elapsed`
    /// into the window, asked before: with the costs not faded for the new window. The
    /// fade lets a window's first chunks start after a slow spell; by the time the writer
    /// reaches a later chunk it has measured this window's costs and judges by them, so a
    /// chunk read ahead on a faded prediction would be read and then not written. Before
    /// any write is measured (a run's first window) no chunk is read ahead.
    pub(crate) fn fits_ahead(&self, elapsed: Duration, budget: Duration, len: u64, read_backs: u32) -> bool {
        self.write.largest > 0
            && elapsed.saturating_add(self.need_by(Cost::cautious, len, read_backs, budget)) <= budget
    }
}

/// Clean windows in a row after which a budget an overrun halved doubles back.
pub(crate) const GROW_AFTER: u32 = 3;

/// The share of the deadline a window's budget is: halved by each overrun (not below a
/// tenth), and doubled back after [`GROW_AFTER`] clean windows in a row, never above the
/// deadline, so that a run whose load went away does not crawl for the rest of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Share {
    share: f64,
    clean: u32,
}

impl Default for Share {
    fn default() -> Share {
        Share { share: 1.0, clean: 0 }
    }
}

impl Share {
    pub(crate) fn get(&self) -> f64 {
        self.share
    }

    pub(crate) fn overran(&mut self) {
        self.share = (self.share / 2.0).max(0.1);
        self.clean = 0;
    }

    /// A window ended within its deadline; true when the share grew.
    pub(crate) fn clean(&mut self) -> bool {
        if self.share >= 1.0 {
            return false;
        }
        self.clean += 1;
        if self.clean < GROW_AFTER {
            return false;
        }
        (self.share, self.clean) = ((self.share * 2.0).min(1.0), 0);
        true
    }
}

/// A duration of `s` seconds; a device that hung makes it huge, never a panic.
fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const FULL: u64 = 4 * MIB;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn close(a: Option<Duration>, b: Duration) -> bool {
        a.is_some_and(|a| a.abs_diff(b) < Duration::from_micros(1))
    }

    #[test]
    fn a_chunk_larger_than_those_measured_is_predicted_at_their_rate() {
        let mut c = Cost::default();
        assert_eq!(c.predict(MIB), None);
        c.learn(2 * MIB, ms(5), FULL);
        assert!(close(c.predict(2 * MIB), ms(5)));
        // Twice the bytes: twice the time, not the smaller chunk's 5 ms.
        assert!(close(c.predict(4 * MIB), ms(10)));
        // A smaller chunk takes no less than the decaying maximum of the times measured.
        assert!(close(c.predict(64 << 10), ms(5)));
    }

    #[test]
    fn small_pieces_do_not_set_the_rate_of_full_chunks() {
        let mut c = Cost::default();
        c.learn(FULL, ms(20), FULL);
        // Many small pieces (small files), each mostly fixed cost: far more per byte.
        for _ in 0..50 {
            c.learn(40 << 10, ms(2), FULL);
        }
        assert!(close(c.predict(FULL), ms(20)), "the full chunks' rate is kept");
        // The decaying maximum follows the small pieces down to their own time.
        assert!(c.predict(40 << 10).unwrap() < ms(3));
        // No full chunk yet: a larger one is extrapolated from the largest measured.
        let mut c = Cost::default();
        c.learn(64 << 10, ms(2), FULL);
        assert!(close(c.predict(FULL), ms(128)), "cautious: 64 x the 64 KiB piece's time");
        c.learn(FULL, ms(20), FULL);
        assert!(close(c.predict(FULL), ms(20)));
    }

    #[test]
    fn a_slow_chunk_fades_with_later_chunks_and_windows() {
        let mut c = Cost::default();
        c.learn(FULL, ms(100), FULL);
        c.learn(FULL, ms(5), FULL);
        assert!(close(c.predict(FULL), ms(80)));
        for _ in 0..30 {
            c.learn(FULL, ms(5), FULL);
        }
        assert!(close(c.predict(FULL), ms(5)));
        // After an overrun the chunks are halved: the halves fade the slow rate too.
        let mut c = Cost::default();
        c.learn(FULL, ms(400), FULL);
        for _ in 0..30 {
            c.learn(FULL / 2, ms(5), FULL / 2);
        }
        assert!(close(c.predict(FULL), ms(10)));
        // A window that managed one chunk does not keep the next ones as short.
        let mut c = Cost::default();
        c.learn(FULL, ms(400), FULL);
        c.fade();
        c.fade();
        assert!(close(c.predict(FULL), ms(100)));
    }

    #[test]
    fn a_chunk_starts_only_if_it_its_read_backs_and_the_thaw_fit_with_margin() {
        let mut p = Pace::default();
        let budget = ms(500);
        p.write.learn(FULL, ms(10), FULL);
        p.read_back.learn(FULL, ms(5), FULL);
        p.thawed(ms(5));
        // 2 x (10 + 2 x 5 + 5) + 10 % of 500 = 100 ms.
        assert_eq!(p.need(FULL, 2, budget), ms(100));
        assert!(p.fits(ms(400), budget, FULL, 2));
        assert!(!p.fits(ms(401), budget, FULL, 2));
        // Without verification no read-back is waited for.
        assert_eq!(p.need(FULL, 0, budget), ms(80));
        // A halved budget (after an overrun) keeps its own margin.
        assert!(!p.fits(ms(200), ms(250), FULL, 2));
        // A slow device: the reserve grows with what it measured.
        p.write.learn(FULL, ms(100), FULL);
        assert!(!p.fits(ms(250), budget, FULL, 2));
    }

    #[test]
    fn windows_shrunk_by_overruns_grow_back_after_clean_windows_never_past_the_deadline() {
        let mut s = Share::default();
        s.overran();
        s.overran();
        assert_eq!(s.get(), 0.25, "two overruns: a quarter, as in issue 35");
        // Two clean windows are not yet enough; an overrun between starts the count over.
        assert!(!s.clean() && !s.clean());
        s.overran();
        assert_eq!(s.get(), 0.125);
        let mut grown = 0;
        for _ in 0..3 * GROW_AFTER {
            grown += u32::from(s.clean());
        }
        assert_eq!((s.get(), grown), (1.0, 3), "back to the whole deadline, one doubling at a time");
        for _ in 0..10 {
            assert!(!s.clean());
        }
        assert_eq!(s.get(), 1.0, "never above the deadline");
        for _ in 0..10 {
            s.overran();
        }
        assert_eq!(s.get(), 0.1, "never below a tenth");
    }

    #[test]
    fn a_chunk_read_ahead_is_judged_by_the_costs_before_the_windows_fade() {
        let mut p = Pace::default();
        let budget = ms(100);
        p.write.learn(FULL, ms(10), FULL);
        p.read_back.learn(FULL, ms(5), FULL);
        p.thawed(ms(5));
        // 2 x (10 + 2 x 5 + 5) + 10 = 60 ms: a chunk may start up to 40 ms in.
        assert!(p.fits(ms(40), budget, FULL, 2) && p.fits_ahead(ms(40), budget, FULL, 2));
        // A new window: the writer's own test trusts half the costs until it measures...
        p.fade();
        assert!(p.fits(ms(60), budget, FULL, 2));
        // ...but a chunk it reaches later is judged after it has: read early only if it
        // fits as last measured.
        assert!(!p.fits_ahead(ms(41), budget, FULL, 2));
        // A fast first chunk does not wipe out the slow ones measured before the fade.
        p.write.learn(FULL, ms(2), FULL);
        assert!(close(p.write.cautious(FULL), ms(8)), "{:?}", p.write.cautious(FULL));
        assert!(close(p.write.predict(FULL), ms(4)));
        // Before any write is measured nothing is read ahead.
        assert!(!Pace::default().fits_ahead(ms(0), budget, FULL, 2));
    }

    #[test]
    fn the_start_of_a_chunk_ahead_counts_further_steps_more_and_waits_for_its_read() {
        let mut p = Pace::default();
        // Before any step: a write's time per step.
        p.write.learn(FULL, ms(4), FULL);
        assert!(close(Some(p.start_in([FULL].into_iter(), FULL)), ms(4)));
        p.step.learn(FULL, ms(5), FULL);
        p.ready.learn(FULL, ms(3), FULL);
        // The chunk right after the writer's next: one step.
        assert!(close(Some(p.start_in([FULL].into_iter(), FULL)), ms(5)));
        // Two ahead: the second step counts FURTHER_STEP times.
        let two = ms(5) + ms(5) * FURTHER_STEP;
        assert!(close(Some(p.start_in([FULL, FULL].into_iter(), FULL)), two));
        // The writer's next chunk itself, not yet read: its read and blake3.
        assert!(close(Some(p.start_in(std::iter::empty(), FULL)), ms(3)));
        // A slow read: the chunk is not ready a step ahead.
        p.ready.learn(FULL, ms(9), FULL);
        assert!(close(Some(p.start_in([FULL].into_iter(), FULL)), ms(9)));
    }

    #[test]
    fn a_hung_device_makes_the_need_huge_not_a_panic() {
        let mut p = Pace::default();
        p.write.learn(512, Duration::from_secs(3600 * 24 * 365), FULL);
        p.read_back.learn(512, Duration::MAX, FULL);
        assert!(!p.fits(ms(1), ms(500), 1 << 30, 3));
    }

    #[test]
    fn before_any_read_back_one_costs_as_much_as_a_write() {
        let mut p = Pace::default();
        p.write.learn(FULL, ms(10), FULL);
        assert_eq!(p.need(FULL, 1, ms(1000)), ms(2 * 20 + 100));
        // Nothing measured at all: only the margin (the first chunk of a run always starts).
        assert_eq!(Pace::default().need(FULL, 1, ms(1000)), ms(100));
    }
}
