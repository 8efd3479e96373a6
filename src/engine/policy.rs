//! How a run's chunks and windows are sized and paced, as pure functions with their
//! constants: the engine follows them, and the dry run's model (`rewrite::predict`)
//! calls the same ones, so that a change here moves the prediction with the run.
//! (When a window stops starting chunks is `pace.rs`, shared the same way.)

use std::time::Duration;

/// Within one long window (an unmounted device is a single window), finished chunks
/// are flushed and journaled at least this often, so a crash loses little progress.
pub(crate) const COMMIT_INTERVAL_BYTES: u64 = 256 << 20;

/// How far ahead of `--rate` a window may write before it ends and a pause makes up
/// the time (a window of its own at most four times a second: each freeze costs the
/// filesystem a commit).
pub(crate) const RATE_BURST: Duration = Duration::from_millis(250);

/// The smallest chunk the size halves to (or the alignment, if larger).
pub(crate) const CHUNK_FLOOR: u64 = 64 << 10;

/// Each chunk's time counts in full; the last ones' fade by this factor with each new
/// one (a decaying maximum).
const CHUNK_TIME_DECAY: f64 = 0.8;

/// The time a chunk takes as the size rule sees it, after one more took `took`.
pub(crate) fn chunk_time(estimate: Duration, took: Duration) -> Duration {
    took.max(estimate.mul_f64(CHUNK_TIME_DECAY))
}

/// Chunks adapt to the window: when one takes more than a quarter of the budget (a slow
/// device, a busy host), or a window overran, the next windows use chunks half the size,
/// down to [`CHUNK_FLOOR`]; when chunks are quick again (under a sixteenth) they grow
/// back towards `max`, the run's `--chunk-size`. Smaller chunks let a window end closer
/// to its budget. Returns the new size (a multiple of `align`, for direct I/O) and the
/// chunk time scaled to it.
pub(crate) fn adapt_chunk(
    size: u64,
    estimate: Duration,
    budget: Duration,
    overran: bool,
    max: u64,
    align: u64,
) -> (u64, Duration) {
    let align = align.max(1);
    let next = if overran || estimate > budget / 4 {
        (size / 2).max(CHUNK_FLOOR.max(align))
    } else if estimate < budget / 16 {
        size.saturating_mul(2).min(max)
    } else {
        size
    };
    let next = (next / align * align).max(align);
    match next == size {
        true => (size, estimate),
        false => (next, estimate.mul_f64(next as f64 / size.max(1) as f64)),
    }
}

/// Whether writing `more` bytes now, `elapsed` into the run with `written` done, would
/// put it ahead of `rate` (bytes per second) by more than [`RATE_BURST`].
pub(crate) fn ahead_of_rate(rate: Option<f64>, written: u64, more: u64, elapsed: Duration) -> bool {
    rate.filter(|&r| r > 0.0).is_some_and(|r| (written + more) as f64 > r * (elapsed + RATE_BURST).as_secs_f64())
}

/// The pause before the next window: `--pause`, or longer when the run is ahead of
/// `rate` (until the bytes written are due).
pub(crate) fn pause_before_window(pause: Duration, rate: Option<f64>, written: u64, elapsed: Duration) -> Duration {
    let due = rate.filter(|&r| r > 0.0).map_or(Duration::ZERO, |r| {
        Duration::try_from_secs_f64(written as f64 / r).unwrap_or(Duration::MAX).saturating_sub(elapsed)
    });
    pause.max(due)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_slow_chunk_halves_the_size_to_the_floor_and_quick_ones_double_it_back() {
        let budget = 100 * MS;
        let (size, est) = adapt_chunk(4 << 20, 30 * MS, budget, false, 4 << 20, 4096);
        assert_eq!((size, est), (2 << 20, 15 * MS), "over a quarter: half, and its time with it");
        assert_eq!(adapt_chunk(4 << 20, 10 * MS, budget, false, 4 << 20, 4096).0, 4 << 20, "in between: kept");
        assert_eq!(adapt_chunk(4 << 20, MS, budget, true, 4 << 20, 4096).0, 2 << 20, "an overrun halves");
        assert_eq!(adapt_chunk(64 << 10, 90 * MS, budget, true, 4 << 20, 4096).0, CHUNK_FLOOR, "never below the floor");
        assert_eq!(adapt_chunk(64 << 10, 90 * MS, budget, true, 4 << 20, 1 << 20).0, 1 << 20, "nor the alignment");
        assert_eq!(adapt_chunk(1 << 20, MS, budget, false, 4 << 20, 4096).0, 2 << 20, "quick: doubled");
        assert_eq!(adapt_chunk(3 << 20, MS, budget, false, 4 << 20, 4096).0, 4 << 20, "up to --chunk-size");
    }

    #[test]
    fn the_rate_allows_a_quarter_second_ahead_and_the_pause_makes_up_the_rest() {
        let rate = Some(1e6);
        assert!(!ahead_of_rate(rate, 0, 250_000, Duration::ZERO));
        assert!(ahead_of_rate(rate, 0, 250_001, Duration::ZERO));
        assert!(!ahead_of_rate(None, 0, u64::MAX / 2, Duration::ZERO), "no --rate: never ahead");
        assert_eq!(pause_before_window(10 * MS, rate, 1_000_000, 400 * MS), 600 * MS);
        assert_eq!(pause_before_window(10 * MS, rate, 1_000, 400 * MS), 10 * MS, "behind: --pause only");
        assert_eq!(pause_before_window(10 * MS, None, 1_000_000, Duration::ZERO), 10 * MS);
    }
}
