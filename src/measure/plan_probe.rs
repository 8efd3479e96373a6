//! The dry run's probe: a few of the run's own chunks read the way the run reads them,
//! so that the plan's times rest on this device and this data, not on an assumed rate.
//!
//! The engine reads a window's chunks with one reader thread (its read-ahead is buffers,
//! not parallel reads), O_DIRECT, at the device offsets the plan gives, in the run's
//! chunk size, one after another. The probe does the same, in stretches of consecutive
//! chunks spread over the whole plan (old data reads slower than new on the drives that
//! need reseq, so the first megabytes say little; and chunks read out of order lose
//! what a device's own read-ahead gives a sequential reader: on a loop device over a
//! virtual disk, 5 ms a 4 MiB chunk against 2.3 ms in order), each read once (a second
//! read of the same bytes could come from a cache below the device), until a time cap.
//! Each read is timed alone, and a line is fitted through them: a read of `n` bytes
//! takes `latency + n / bytes_per_second` (file mode's small pieces cost mostly the
//! latency, full chunks mostly the bytes).
//!
//! The host's load is watched (PSI, as `bench` does) for a moment before the reads, not
//! during them: reading through a loop device keeps its workers busy, and the probe's
//! own reads would look like another job's load. The reads run on a thread of their own
//! at the lowest real-time priority, as the run's writer and verifier run during a
//! window: on a busy host a normal thread waits up to a scheduler tick after each read
//! (4 ms for a 16 KiB read that takes 0.1 ms), which is the load's cost, not the
//! device's; the prediction's range allows for the load.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::engine::target::ReadTarget;
use crate::measure::bench::{HostPressure, Watch};
use crate::measure::readbench::{Source, Target};
use crate::support::error::{Error, Result};
use crate::sys::AlignedBuf;

/// Stretches of consecutive chunks read, and chunks in each, at most.
const STRETCHES: usize = 8;
const STRETCH: usize = 8;
/// How long the host's load is watched before the reads.
pub(crate) const WATCH: Duration = Duration::from_millis(400);

/// What the probe read and what it found.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct PlanProbe {
    /// The device read.
    pub(crate) device: String,
    /// Chunks of the plan read, each once, one at a time (O_DIRECT), in stretches of
    /// consecutive ones.
    pub(crate) reads: u64,
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    /// The probe starts no read after this long.
    pub(crate) time_cap_seconds: f64,
    /// Chunks in the plan, of which `reads` were read, spread over it.
    pub(crate) chunks_in_plan: u64,
    /// The fit: a read of `n` bytes takes `latency_seconds + n / bytes_per_second`.
    pub(crate) latency_seconds: f64,
    pub(crate) bytes_per_second: f64,
    /// How loaded the host was just before the probe read (null: no PSI).
    pub(crate) host_pressure: Option<HostPressure>,
}

/// Reads stretches of `chunks` (device offset, length: the run's chunks in its order)
/// from `device`, spread over them, until `cap`. Reads only.
pub(crate) fn probe(device: &Path, chunks: &[(u64, u64)], cap: Duration) -> Result<PlanProbe> {
    let target = Target::Real(vec![Source::open(device)?]);
    let Target::Real(sources) = &target else { return Err(Error::Internal("a device read as a simulation".into())) };
    let reader = &sources[0].reader;
    let align = reader.offset_align().max(1);
    let largest = chunks.iter().map(|c| c.1).max().unwrap_or(0).div_ceil(align) * align;
    let mut buf = AlignedBuf::new(largest.max(align) as usize, reader.mem_align());
    let watch = Watch::start(&target);
    std::thread::sleep(WATCH);
    let host_pressure = watch.host_pressure(&target);
    let started = Instant::now();
    let read = || {
        // Back to normal as the thread ends; where real time is not allowed, as it is.
        let _ = crate::sys::set_scheduling_of(0, crate::sys::Scheduling::Fifo(1));
        let mut timed = Vec::new();
        for i in stretches(chunks.len()) {
            if !timed.is_empty() && started.elapsed() >= cap {
                break;
            }
            let (offset, len) = chunks[i];
            let (at, end) = (offset / align * align, (offset + len).div_ceil(align) * align);
            let n = (end - at) as usize;
            let t = Instant::now();
            let r = reader.read_at(&mut buf[..n], at);
            r.map_err(|e| Error::io_at(format!("reading {}", device.display()), at, e))?;
            timed.push((n as u64, t.elapsed().as_secs_f64()));
        }
        Ok::<_, Error>(timed)
    };
    let timed =
        std::thread::scope(|s| s.spawn(read).join()).map_err(|_| Error::Internal("the probe panicked".into()))??;
    let (latency_seconds, bytes_per_second) = fit(&timed);
    Ok(PlanProbe {
        device: device.display().to_string(),
        reads: timed.len() as u64,
        bytes: timed.iter().map(|t| t.0).sum(),
        seconds: started.elapsed().as_secs_f64(),
        time_cap_seconds: cap.as_secs_f64(),
        chunks_in_plan: chunks.len() as u64,
        latency_seconds,
        bytes_per_second,
        host_pressure,
    })
}

/// The chunks to read, of `0..n`: [`STRETCHES`] stretches of up to [`STRETCH`]
/// consecutive ones, evenly spaced, every chunk when there are few; the stretches in an
/// order that covers the whole range early (a probe cut short by its cap has still
/// sampled all of it).
fn stretches(n: usize) -> Vec<usize> {
    if n <= STRETCHES * STRETCH {
        return (0..n).collect();
    }
    // Each stretch starts where its share of the range starts; the middle ones come
    // after the ends (0, 4, 2, 6, 1, 5, 3, 7: bit-reversed).
    let order = (0..STRETCHES).map(|j| (j as u8).reverse_bits() as usize >> (8 - STRETCHES.trailing_zeros()));
    order.flat_map(|j| (0..STRETCH).map(move |k| j * n / STRETCHES + k)).collect()
}

/// `seconds = latency + bytes / rate`, by medians (a read that waited behind another
/// job's I/O must not set the rate): the rate from the large reads (over half the
/// largest), the latency from the small ones, what those take beyond their bytes at that
/// rate. Fewer than three of either (device mode: nearly all full chunks) cannot
/// separate the two: then all of it is rate.
fn fit(timed: &[(u64, f64)]) -> (f64, f64) {
    let rate_of = |t: &(u64, f64)| t.0 as f64 / t.1.max(1e-9);
    let largest = timed.iter().map(|t| t.0).max().unwrap_or(0);
    let (small, large): (Vec<&(u64, f64)>, Vec<_>) = timed.iter().partition(|t| t.0 * 2 <= largest);
    if small.len() < 3 || large.len() < 3 {
        return (0.0, median(timed.iter().map(rate_of)));
    }
    let rate = median(large.iter().copied().map(rate_of));
    let latency = median(small.iter().map(|t| t.1 - t.0 as f64 / rate)).max(0.0);
    (latency, rate)
}

/// The median (0 of nothing).
fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretches_cover_the_range_early_in_order_within_and_never_repeat() {
        let s = stretches(1000);
        assert_eq!(s.len(), 64);
        assert_eq!(&s[..8], &[0, 1, 2, 3, 4, 5, 6, 7], "consecutive chunks, read in order");
        assert_eq!(&s[8..10], &[500, 501], "then the middle");
        let starts: Vec<usize> = s.iter().step_by(8).copied().collect();
        assert_eq!(starts, vec![0, 500, 250, 750, 125, 625, 375, 875]);
        let mut sorted = s.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 64, "each once");
        assert_eq!(stretches(3), vec![0, 1, 2]);
        assert!(stretches(0).is_empty());
        assert_eq!(stretches(65).len(), 64);
    }

    #[test]
    fn the_fit_separates_latency_from_rate_when_sizes_differ() {
        // 0.1 ms + 1 GB/s.
        let t = |n: u64| (n, 1e-4 + n as f64 / 1e9);
        // Large reads at 1 GB/s with no latency of their own to speak of.
        let large = |n: u64| (n, n as f64 / 1e9);
        let mut reads = vec![t(4096), t(8192), t(65536), large(3 << 20), large(4 << 20), large(4 << 20)];
        let (lat, rate) = fit(&reads);
        assert!((lat - 1e-4).abs() < 1e-6 && (rate - 1e9).abs() < 1.0, "{lat} {rate}");
        // Reads that waited behind other I/O do not move the medians.
        reads.extend([(4096, 0.004), (4 << 20, 0.5)]);
        let (lat2, rate2) = fit(&reads);
        assert!((lat2 - lat).abs() < 1e-4 && (rate2 - rate).abs() / rate < 0.2, "{lat2} {rate2}");
        // All one size, or too few small ones: all of it is rate.
        let (lat, rate) = fit(&[(4 << 20, 0.004), (4 << 20, 0.006), (4096, 0.003)]);
        assert_eq!(lat, 0.0);
        assert!((rate - (4 << 20) as f64 / 0.006).abs() < 1.0, "{rate}");
        assert_eq!(fit(&[]), (0.0, 0.0));
    }
}
