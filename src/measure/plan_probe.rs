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
//! window: on a busy host a normal thread waits up to a scheduler tick after a read (4 ms
//! for a 16 KiB read that takes 0.1 ms), which is the load's cost, not the device's. That
//! cost is measured apart, since the run's reader is a normal thread: one block read at
//! some chunks at each priority, and the difference of their means.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::engine::target::ReadTarget;
use crate::measure::bench::{HostPressure, Watch};
use crate::measure::readbench::{Source, Target};
use crate::support::error::{Error, Result};
use crate::sys::memory::AlignedBuf;

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
    /// How much longer, on average, a one-block read took from a thread at normal
    /// priority than from one at real-time priority (16 of each, the slowest and the
    /// fastest left out): what the host's load costs each read of the run's reader,
    /// which is a normal thread.
    pub(crate) normal_priority_penalty_seconds: f64,
    /// How loaded the host was just before the probe read (null: no PSI).
    pub(crate) host_pressure: Option<HostPressure>,
    /// CPUs idle just before the probe read, in CPUs (1.5 of 2: one and a half idle;
    /// null: /proc/stat unreadable). Pressure misses a host whose CPUs are all busy with
    /// one task each: nothing waits, until the run's threads come.
    #[serde(default)]
    pub(crate) cpus_idle: Option<f64>,
}

/// Reads stretches of `chunks` (device offset, length: the run's chunks in its order)
/// from `device`, spread over them, until `cap`; then one block at some of them, at
/// real-time and at normal priority. Reads only.
pub(crate) fn probe(device: &Path, chunks: &[(u64, u64)], cap: Duration) -> Result<PlanProbe> {
    let target = Target::Real(vec![Source::open(device)?]);
    let Target::Real(sources) = &target else { return Err(Error::Internal("a device read as a simulation".into())) };
    let r = Reads { reader: &sources[0].reader, device, chunks };
    let (watch, cpu) = (Watch::start(&target), cpu_times());
    std::thread::sleep(WATCH);
    let host_pressure = watch.host_pressure(&target);
    let cpus_idle = cpu.zip(cpu_times()).map(|((idle0, all0), (idle1, all1))| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        cpus * (idle1 - idle0) as f64 / (all1 - all0).max(1) as f64
    });
    let started = Instant::now();
    let timed = r.urgent(&stretches(chunks), Some(started + cap), false)?;
    let seconds = started.elapsed().as_secs_f64();
    // The run's reader is a normal thread: what that costs a read on this host now.
    let (a, b): (Vec<usize>, Vec<usize>) =
        (0..2 * PENALTY_READS).map(|k| k * chunks.len() / (2 * PENALTY_READS)).partition(|i| i % 2 == 0);
    let (urgent, normal) = (r.urgent(&a, None, true)?, r.timed(&b, None, true)?);
    // Without the slowest and the fastest of each: one read behind another job's I/O
    // must not make a quiet host look busy.
    let mean = |v: &[(u64, f64)]| {
        let mut t: Vec<f64> = v.iter().map(|t| t.1).collect();
        t.sort_by(f64::total_cmp);
        let middle = t.get(1..t.len().saturating_sub(1)).filter(|m| !m.is_empty()).unwrap_or(&t);
        middle.iter().sum::<f64>() / middle.len().max(1) as f64
    };
    let (latency_seconds, bytes_per_second) = fit(&timed);
    Ok(PlanProbe {
        device: device.display().to_string(),
        reads: timed.len() as u64,
        bytes: timed.iter().map(|t| t.0).sum(),
        seconds,
        time_cap_seconds: cap.as_secs_f64(),
        chunks_in_plan: chunks.len() as u64,
        latency_seconds,
        bytes_per_second,
        normal_priority_penalty_seconds: (mean(&normal) - mean(&urgent)).max(0.0),
        host_pressure,
        cpus_idle,
    })
}

/// The host's CPU time so far (/proc/stat's first line, in ticks): idle (with iowait),
/// and all of it.
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> =
        stat.lines().next()?.strip_prefix("cpu ")?.split_whitespace().filter_map(|t| t.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is counted in user).
    let (idle, all) = (ticks.get(3)? + ticks.get(4)?, ticks.iter().take(8).sum());
    Some((idle, all))
}

/// One-block reads at each priority for the penalty.
const PENALTY_READS: usize = 16;

/// The probe's reads of a device.
struct Reads<'a> {
    reader: &'a crate::engine::target::DirectReader,
    device: &'a Path,
    chunks: &'a [(u64, u64)],
}

impl Reads<'_> {
    /// [`Reads::timed`] on a thread of its own at the lowest real-time priority (as it
    /// is where the host allows none), as the run's writer and verifier run.
    fn urgent(&self, which: &[usize], until: Option<Instant>, one_block: bool) -> Result<Vec<(u64, f64)>> {
        let read = || {
            // Back to normal as the thread ends.
            let _ = crate::sys::process::set_scheduling_of(0, crate::sys::process::Scheduling::Fifo(1));
            self.timed(which, until, one_block)
        };
        std::thread::scope(|s| s.spawn(read).join()).map_err(|_| Error::Internal("the probe panicked".into()))?
    }

    /// Reads chunks `which` (or one aligned block at each), each timed alone; none
    /// started after `until` but the first.
    fn timed(&self, which: &[usize], until: Option<Instant>, one_block: bool) -> Result<Vec<(u64, f64)>> {
        let align = self.reader.offset_align().max(1);
        let block = align.max(4096).div_ceil(align) * align;
        let largest = which.iter().map(|&i| self.chunks[i].1).max().unwrap_or(0).div_ceil(align) * align;
        let size = if one_block { block } else { largest.max(align) };
        let mut buf = AlignedBuf::for_transfers(size as usize, self.reader.mem_align());
        let mut timed = Vec::new();
        for &i in which {
            if !timed.is_empty() && until.is_some_and(|u| Instant::now() >= u) {
                break;
            }
            let (offset, len) = self.chunks[i];
            let at = offset / align * align;
            let end = if one_block { at + block } else { (offset + len).div_ceil(align) * align };
            let n = (end - at) as usize;
            let t = Instant::now();
            let read = self.reader.read_at(&mut buf[..n], at);
            read.map_err(|e| Error::io_at(format!("reading {}", self.device.display()), at, e))?;
            timed.push((n as u64, t.elapsed().as_secs_f64()));
        }
        Ok(timed)
    }
}

/// The chunks to read, as indices into `chunks`: [`STRETCHES`] stretches of up to
/// [`STRETCH`] consecutive ones, every chunk when there are few. Half the stretches start
/// at evenly spaced chunks, half at evenly spaced bytes (thousands of small files and a
/// few large ones: the chunks alone would sample the small files only, the bytes the
/// large ones only). In an order that covers the whole range early (a probe cut short by
/// its cap has still sampled all of it); a chunk is read once.
fn stretches(chunks: &[(u64, u64)]) -> Vec<usize> {
    let n = chunks.len();
    if n <= STRETCHES * STRETCH {
        return (0..n).collect();
    }
    let total: u64 = chunks.iter().map(|c| c.1).sum();
    let ends: Vec<u64> = chunks.iter().scan(0, |at, c| Some(std::mem::replace(at, *at + c.1) + c.1)).collect();
    let at_byte = |b: u64| ends.partition_point(|&e| e <= b).min(n - 1);
    // By turns a chunk and a byte position: chunks at 0, 1/2, 1/4, 3/4 of them, bytes at
    // 1/8, 5/8, 3/8, 7/8 of them (each sequence the middle after the ends).
    let quarters = [0, 2, 1, 3];
    let starts = (0..STRETCHES).map(|k| match (k % 2, quarters[k / 2 % 4] as u64) {
        (0, q) => q as usize * n / 4,
        (_, q) => at_byte((total as u128 * (2 * q as u128 + 1) / 8) as u64),
    });
    let mut taken = vec![false; n];
    let mut out = Vec::new();
    for first in starts {
        for i in (first..n).take(STRETCH) {
            if !std::mem::replace(&mut taken[i], true) {
                out.push(i);
            }
        }
    }
    out
}

/// `seconds = latency + bytes / rate`, fitted on relative errors (a 16 KiB read counts as
/// much as a 4 MiB one: file mode's small pieces cost mostly the latency, full chunks
/// mostly the bytes), then again without the reads the first fit missed by more than
/// half (a read that waited behind another job's I/O must not set the rate). Reads all
/// of about one size (device mode) cannot separate the two: then all of it is rate.
fn fit(timed: &[(u64, f64)]) -> (f64, f64) {
    let points: Vec<(f64, f64)> = timed.iter().filter(|t| t.1 > 0.0).map(|&(n, t)| (n as f64, t)).collect();
    let first = weighted_line(&points);
    let kept: Vec<(f64, f64)> =
        points.iter().copied().filter(|&(n, t)| ((first.0 + n / first.1 - t) / t).abs() <= 0.5).collect();
    if kept.len() * 4 >= points.len() * 3 { weighted_line(&kept) } else { first }
}

/// Least squares of `t = a + n / rate` weighted by `1 / t²`; `a` and `1 / rate` not
/// negative.
fn weighted_line(points: &[(f64, f64)]) -> (f64, f64) {
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y) in points {
        let w = 1.0 / (y * y);
        (sw, sx, sy, sxx, sxy) = (sw + w, sx + w * x, sy + w * y, sxx + w * x * x, sxy + w * x * y);
    }
    if sxx == 0.0 {
        return (0.0, 0.0);
    }
    let through_origin = (0.0, sxx / sxy);
    // Both ends of the sizes need reads of their own: a few partial chunks among full
    // ones (device mode) would set a latency from their noise.
    let (min, max) = points.iter().fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let small = points.iter().filter(|p| p.0 < (min * max).sqrt()).count();
    let enough = |n: usize| n >= 3 && n * 10 >= points.len();
    let det = sw * sxx - sx * sx;
    if max < 2.0 * min || !enough(small) || !enough(points.len() - small) || det <= 0.0 {
        return through_origin;
    }
    let (slope, latency) = ((sw * sxy - sx * sy) / det, (sxx * sy - sx * sxy) / det);
    match (slope > 0.0, latency >= 0.0) {
        (true, true) => (latency, 1.0 / slope),
        (true, false) => through_origin,
        // Larger reads no slower: the latency is all there is to see.
        (false, _) => (sy / sw, 1e15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretches_cover_the_chunks_and_the_bytes_early_in_order_and_never_repeat() {
        // 1000 small chunks, then 100 of 4 MiB: most chunks are small, most bytes large.
        let mut chunks: Vec<(u64, u64)> = (0..1000).map(|i| (i * 8192, 8192)).collect();
        chunks.extend((0..100).map(|i| ((1 << 30) + i * (4 << 20), 4 << 20)));
        let s = stretches(&chunks);
        assert_eq!(&s[..8], &[0, 1, 2, 3, 4, 5, 6, 7], "consecutive chunks, read in order");
        let starts: Vec<usize> = s.iter().step_by(8).copied().collect();
        // By turns a chunk position (0, 1/2, 1/4, 3/4 of the chunks) and a byte position
        // (1/8, 5/8, 3/8, 7/8 of the bytes: all in the large chunks).
        let by_chunk: Vec<usize> = starts.iter().step_by(2).copied().collect();
        assert_eq!(by_chunk, vec![0, 550, 275, 825]);
        assert!(starts.iter().skip(1).step_by(2).all(|&i| i >= 1000), "{starts:?}");
        assert!(s.iter().filter(|&&i| i >= 1000).count() >= 32, "half the reads are large ones");
        let mut sorted = s.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), s.len(), "each once");
        assert!(s.len() <= 64);
        assert_eq!(stretches(&chunks[..3]), vec![0, 1, 2]);
        assert!(stretches(&[]).is_empty());
    }

    #[test]
    fn the_fit_separates_latency_from_rate_when_sizes_differ() {
        // 0.1 ms + 1 GB/s.
        let t = |n: u64| (n, 1e-4 + n as f64 / 1e9);
        let mut reads: Vec<(u64, f64)> = [4096, 8192, 16384, 65536, 300_000, 1 << 20, 4 << 20].map(t).to_vec();
        let (lat, rate) = fit(&reads);
        assert!((lat - 1e-4).abs() < 1e-7 && (rate - 1e9).abs() < 1e-3 * 1e9, "{lat} {rate}");
        // Reads that waited behind other I/O do not move it.
        reads.extend([(4096, 0.004), (4 << 20, 0.5)]);
        let (lat2, rate2) = fit(&reads);
        assert!((lat2 - lat).abs() < 1e-6 && (rate2 - rate).abs() / rate < 0.01, "{lat2} {rate2}");
        // All one size, or a few partial chunks among full ones: all of it is rate.
        let (lat, rate) = fit(&[(4 << 20, 0.004), (4 << 20, 0.004), (4 << 20, 0.004)]);
        assert_eq!(lat, 0.0);
        assert!((rate - (4 << 20) as f64 / 0.004).abs() < 1.0, "{rate}");
        let mut device = vec![(4 << 20, 0.004); 40];
        device.extend([(4096, 0.0005), (1 << 20, 0.0015)]);
        assert_eq!(fit(&device).0, 0.0);
        assert_eq!(fit(&[]), (0.0, 0.0));
    }
}
