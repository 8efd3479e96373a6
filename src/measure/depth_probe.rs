//! How deep the engine's pipeline should be on this device, measured before the run.
//!
//! One device serves a second read side by side no faster than one after the other
//! (a SATA drive, a slow stick); another needs several in flight for its bandwidth (an
//! NVMe drive; a loop device over a virtual disk, measured 0.55-0.8 of its bound at the
//! old fixed depth of 2 and up to 1.05 at 8, issue 40). So the probe reads stretches of
//! the run's own chunks with 1, 2, 4 and 8 reads in flight (threads reading consecutive
//! chunks side by side, O_DIRECT, as the engine's readers do), each stretch once, in two
//! rounds in opposite orders (a host's load comes and goes: the better of the two counts),
//! and keeps the fewest reads in flight that read within [`GOOD_ENOUGH`] of the best.
//! The depth is then twice that (as many chunks read and waiting for the writer, and
//! written chunks queued for their read-back: `EngineConfig::readers`), at most what the
//! memory and the freeze budget allow (see [`choose`]). Reads only.
//!
//! A rewrite at depth 4 has 4 I/Os in flight, not 2: its 2 reads, the write and its
//! read-back. So where the device reads slower at 4 in flight than at 2, depth 4 is halved (see [`past_the_peak`]): on a memory-backed loop device, whose
//! one worker serves every I/O in turn, 2 reads in flight read up to 10 % faster than one
//! and 4 slower than 2, and a rewrite at depth 4 took 1.06 times as long as at depth 2.

use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::engine::target::{DirectReader, ReadTarget};
use crate::support::error::{Error, Result};
use crate::sys::memory::AlignedBuf;

/// Reads in flight tried.
const IN_FLIGHT: [usize; 4] = [1, 2, 4, 8];
/// The fewest reads in flight within this share of the best rate are kept: more would
/// only cost memory and reads dropped at a window's end.
const GOOD_ENOUGH: f64 = 0.95;
/// The engine's buffers stay under this, whatever the device wants.
pub(crate) const MEMORY_CAP: u64 = 256 << 20;
/// A window reads ahead at most this share of its budget's worth of chunks: what is
/// read ahead is dropped at the thaw, and reads in flight at a window's end compete
/// with its last writes and read-backs.
const FREEZE_SHARE: f64 = 0.25;
/// The probe reads for at most this share of one read pass over the run's bytes.
const RUN_SHARE: f64 = 0.03;
/// The depth with nothing to probe (a simulation, nothing to rewrite): the old default.
pub(crate) const FALLBACK: usize = 2;

/// One measurement: reads in flight and the rate they read at.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct DepthRate {
    pub(crate) reads_in_flight: usize,
    pub(crate) bytes_per_second: f64,
}

/// The pipeline's depth (`--read-ahead`) and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct DepthChoice {
    /// Chunks read ahead of the writer; half of them read at once, and as many written
    /// chunks queued for their read-back (0: serial).
    pub(crate) depth: usize,
    /// `given` (`--read-ahead`), `probed`, or `fallback` (nothing to probe).
    pub(crate) source: String,
    /// The probe's rates, best of its two rounds (empty unless probed).
    pub(crate) measured: Vec<DepthRate>,
    /// The deepest the memory cap and the freeze budget allow.
    pub(crate) limit: usize,
    /// Seconds the probe took.
    pub(crate) seconds: f64,
    /// In words.
    pub(crate) why: String,
}

impl DepthChoice {
    /// `--read-ahead N`, as given.
    pub(crate) fn given(depth: usize) -> DepthChoice {
        DepthChoice {
            depth,
            source: "given".into(),
            measured: Vec::new(),
            limit: depth,
            seconds: 0.0,
            why: format!("--read-ahead {depth} as given"),
        }
    }

    /// Nothing to probe: the old default.
    pub(crate) fn fallback(why: String) -> DepthChoice {
        DepthChoice { source: "fallback".into(), why, ..DepthChoice::given(FALLBACK) }
    }

    /// How much faster the chosen reads in flight read than one at a time (1: no probe).
    pub(crate) fn read_gain(&self) -> f64 {
        let rate = |n: usize| self.measured.iter().find(|m| m.reads_in_flight == n).map(|m| m.bytes_per_second);
        match (rate((self.depth / 2).max(1)), rate(1)) {
            (Some(a), Some(b)) if b > 0.0 => (a / b).max(1.0),
            _ => 1.0,
        }
    }
}

/// What bounds the depth: the chunk size, verification, and the freeze budget.
pub(crate) struct Limits {
    pub(crate) chunk_size: u64,
    pub(crate) verify: bool,
    /// `--max-freeze` (None: nothing frozen).
    pub(crate) deadline: Option<Duration>,
}

impl Limits {
    /// The deepest the memory cap allows: buffers are depth + 2, + 2 with verification.
    fn memory(&self) -> usize {
        let buffers = (MEMORY_CAP / self.chunk_size.max(1)) as usize;
        buffers.saturating_sub(2 + 2 * usize::from(self.verify)).max(FALLBACK)
    }

    /// The deepest the freeze budget allows at `rate`: depth chunks read in at most
    /// [`FREEZE_SHARE`] of it.
    fn freeze(&self, rate: f64) -> usize {
        self.deadline.map_or(usize::MAX, |d| {
            ((d.as_secs_f64() * FREEZE_SHARE * rate / self.chunk_size.max(1) as f64) as usize).max(FALLBACK)
        })
    }
}

/// Probes `device` by reading `chunks` (device offsets and lengths, ascending: the
/// run's own, `run_bytes` in all) for at most about `cap`, and chooses the depth within
/// `limits`.
pub(crate) fn choose(
    device: &Path,
    chunks: &[(u64, u64)],
    run_bytes: u64,
    limits: &Limits,
    cap: Duration,
) -> Result<DepthChoice> {
    let started = Instant::now();
    let reader = DirectReader::open(device).map_err(|e| Error::io(format!("opening {}", device.display()), e))?;
    let measured = measure(&reader, chunks, run_bytes, cap)?;
    let Some(best) = measured.iter().map(|m| m.bytes_per_second).reduce(f64::max).filter(|&b| b > 0.0) else {
        return Ok(DepthChoice::fallback("the probe read nothing".into()));
    };
    let enough = measured.iter().find(|m| m.bytes_per_second >= GOOD_ENOUGH * best).expect("the best is good enough");
    let within = enough.reads_in_flight;
    let (enough, halved) = past_the_peak(&measured, enough);
    let wanted = 2 * enough.reads_in_flight;
    let (memory, freeze) = (limits.memory(), limits.freeze(enough.bytes_per_second));
    let limit = memory.min(freeze);
    let depth = wanted.clamp(FALLBACK, limit.max(FALLBACK));
    let rates: Vec<String> = measured
        .iter()
        .map(|m| format!("{}: {:.0} MiB/s", m.reads_in_flight, m.bytes_per_second / 1048576.0))
        .collect();
    let capped = match (depth < wanted, memory <= freeze) {
        (false, _) => String::new(),
        (true, true) => format!(", capped by memory ({} MiB at most)", MEMORY_CAP >> 20),
        (true, false) => format!(", capped by the freeze budget (a quarter of it reads {freeze} chunks)"),
    };
    let halved = halved.map_or(String::new(), |n| {
        let t = 2 * n;
        format!("; {t} in flight read slower than {n}, and a rewrite at depth {t} has {t} I/Os in flight (its reads, the write, its read-back): halved")
    });
    let why = format!(
        "reads in flight -> rate: {}; {} in flight read within {:.0} % of the best{halved}: depth {depth} ({} read at once, {} written chunks queued for their read-back){capped}",
        rates.join(", "),
        within,
        GOOD_ENOUGH * 100.0,
        (depth / 2).max(1),
        (depth / 2).max(1),
    );
    let seconds = started.elapsed().as_secs_f64();
    Ok(DepthChoice { depth, source: "probed".into(), measured, limit, seconds, why })
}

/// `enough` (the fewest reads in flight within [`GOOD_ENOUGH`] of the best), halved from
/// 2 to 1 where 4 in flight read [`SLOWER`] than 2: a rewrite at depth 4 has 4 in flight
/// (2 reads, the write, its read-back), as the module doc says. Deeper, the one writer
/// and one verifier put fewer than twice the reads in flight (4 reads, 1 write, 1
/// read-back at depth 8), and the probe measured nothing in between: those stay as chosen.
/// The `n` halved from, if any.
fn past_the_peak<'a>(measured: &'a [DepthRate], enough: &'a DepthRate) -> (&'a DepthRate, Option<usize>) {
    let at = |n: usize| measured.iter().find(|m| m.reads_in_flight == n);
    match (enough.reads_in_flight, at(1), at(4)) {
        (2, Some(one), Some(four)) if four.bytes_per_second < SLOWER * enough.bytes_per_second => (one, Some(2)),
        _ => (enough, None),
    }
}

/// Slower: below this share of the rate (the probe's rounds differ by a few per cent).
const SLOWER: f64 = 0.97;

/// The rates at each number of reads in flight: two rounds, in opposite orders, each
/// over a stretch of chunks of its own; the better of each pair. The probe reads for at
/// most `cap`, and at most [`RUN_SHARE`] of the time one read pass over `run_bytes`
/// takes at the rate read so far: on a fast device a probe of a fixed length cost more
/// than any depth could win (0.25-0.3 s of a 2 s run over 4 GiB in memory). The first
/// stretch judges its own length by its own rate as it reads: a first stretch of a fixed
/// share of `cap` was a third of the probe on an 8 GiB memory-backed device (25 ms).
fn measure(reader: &DirectReader, chunks: &[(u64, u64)], run_bytes: u64, cap: Duration) -> Result<Vec<DepthRate>> {
    let rounds: Vec<usize> = IN_FLIGHT.iter().chain(IN_FLIGHT.iter().rev()).copied().collect();
    // Each measurement a stretch of its own, spread over the chunks.
    let per = chunks.len() / rounds.len();
    let mut out: Vec<DepthRate> =
        IN_FLIGHT.iter().map(|&n| DepthRate { reads_in_flight: n, bytes_per_second: 0.0 }).collect();
    if per == 0 {
        return Ok(Vec::new());
    }
    // Made once, before any clock starts, as the run makes its own.
    let align = reader.offset_align().max(1);
    let largest = chunks.iter().map(|c| c.1).max().unwrap_or(0).div_ceil(align) * align;
    let deepest = IN_FLIGHT.iter().copied().max().unwrap_or(1);
    let mut bufs: Vec<AlignedBuf> =
        (0..deepest).map(|_| AlignedBuf::for_transfers(largest.max(align) as usize, reader.mem_align())).collect();
    let slice_at = slice_at(cap, run_bytes, largest, rounds.len());
    let mut slice = None;
    for (k, &n) in rounds.iter().enumerate() {
        let stretch = &chunks[k * per..(k + 1) * per];
        let rate = read_side_by_side(reader, stretch, &mut bufs[..n], &|rate| slice.unwrap_or_else(|| slice_at(rate)))?;
        if slice.is_none() && rate > 0.0 {
            slice = Some(slice_at(rate));
        }
        let m = out.iter_mut().find(|m| m.reads_in_flight == n).expect("each is tried");
        m.bytes_per_second = m.bytes_per_second.max(rate);
    }
    Ok(out)
}

/// How long one stretch of the probe reads at `rate` (bytes a second; 0 before any
/// read): its share of `cap` at most, of [`RUN_SHARE`] of a pass over `run_bytes` split
/// over `rounds`, and at least a few chunks' time, or a stretch measures its threads'
/// start.
fn slice_at(cap: Duration, run_bytes: u64, largest: u64, rounds: usize) -> impl Fn(f64) -> Duration {
    let most = cap.div_f64(rounds.max(1) as f64);
    move |rate| {
        if rate <= 0.0 {
            return most;
        }
        let share = Duration::from_secs_f64(RUN_SHARE * run_bytes as f64 / rate).div_f64(rounds.max(1) as f64);
        let few_chunks = Duration::from_secs_f64(4.0 * largest as f64 / rate);
        most.min(share.max(few_chunks))
    }
}

/// Reads `stretch` in order with one thread per buffer side by side (each takes the
/// next chunk) until the time `slice` gives at the rate read so far has passed (at least
/// one chunk each); returns bytes a second.
fn read_side_by_side(
    reader: &DirectReader,
    stretch: &[(u64, u64)],
    bufs: &mut [AlignedBuf],
    slice: &(dyn Fn(f64) -> Duration + Sync),
) -> Result<f64> {
    let align = reader.offset_align().max(1);
    let n = bufs.len();
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let read = |buf: &mut AlignedBuf| -> Result<()> {
        loop {
            let i = next.fetch_add(1, Ordering::SeqCst);
            if i >= stretch.len() || (i >= n && over(started, done.load(Ordering::SeqCst), slice)) {
                return Ok(());
            }
            let (offset, len) = stretch[i];
            let at = offset / align * align;
            let len = ((offset + len).div_ceil(align) * align - at) as usize;
            reader.read_at(&mut buf[..len], at).map_err(|e| Error::io_at("probing the depth", at, e))?;
            done.fetch_add(len as u64, Ordering::SeqCst);
        }
    };
    std::thread::scope(|s| {
        let threads: Vec<_> = bufs.iter_mut().map(|buf| s.spawn(move || read(buf))).collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().unwrap_or_else(|_| Err(Error::Internal("a probe panicked".into()))))
    })?;
    Ok(done.load(Ordering::SeqCst) as f64 / started.elapsed().as_secs_f64().max(1e-9))
}

/// Whether a stretch begun at `started` that has read `bytes` has read for its slice.
fn over(started: Instant, bytes: u64, slice: &(dyn Fn(f64) -> Duration + Sync)) -> bool {
    let elapsed = started.elapsed();
    elapsed >= slice(bytes as f64 / elapsed.as_secs_f64().max(1e-9))
}

/// The run's chunks over `[start, end)` of a device, at most `max` of them from the
/// start (the probe reads a few of them; an old region reads like any other for this).
pub(crate) fn chunks_of(ranges: &[(u64, u64)], chunk_size: u64, max: usize) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(off, len) in ranges {
        let mut at = off;
        while at < off + len && out.len() < max {
            let n = (off + len - at).min(chunk_size);
            out.push((at, n));
            at += n;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_cap_the_depth_by_memory_and_by_the_freeze_budget() {
        let l = Limits { chunk_size: 4 << 20, verify: true, deadline: None };
        assert_eq!(l.memory(), 60, "256 MiB of 4 MiB buffers, 4 of them not read ahead");
        assert_eq!(l.freeze(1e9), usize::MAX);
        let l = Limits { deadline: Some(Duration::from_millis(300)), ..l };
        // A quarter of 300 ms at 100 MiB/s: 7.5 MiB, one chunk; never below the fallback.
        assert_eq!(l.freeze(100.0 * 1048576.0), FALLBACK);
        assert_eq!(l.freeze(1000.0 * 1048576.0), 18);
        let huge = Limits { chunk_size: 1 << 30, verify: true, deadline: None };
        assert_eq!(huge.memory(), FALLBACK);
    }

    #[test]
    fn the_gain_is_the_chosen_rate_over_one_read_at_a_time() {
        let rates = |v: &[(usize, f64)]| {
            v.iter().map(|&(n, r)| DepthRate { reads_in_flight: n, bytes_per_second: r }).collect::<Vec<_>>()
        };
        let c =
            DepthChoice { depth: 8, measured: rates(&[(1, 100.0), (2, 150.0), (4, 200.0)]), ..DepthChoice::given(8) };
        assert_eq!(c.read_gain(), 2.0);
        assert_eq!(DepthChoice::given(8).read_gain(), 1.0);
        let serial = DepthChoice { depth: 0, ..c };
        assert_eq!(serial.read_gain(), 1.0);
    }

    #[test]
    fn the_depth_is_halved_where_twice_as_many_in_flight_read_slower() {
        let rates = |v: [f64; 4]| {
            IN_FLIGHT.iter().zip(v).map(|(&n, r)| DepthRate { reads_in_flight: n, bytes_per_second: r }).collect()
        };
        let chosen = |v: [f64; 4]| {
            let m: Vec<DepthRate> = rates(v);
            let best = v.iter().copied().fold(0.0, f64::max);
            let enough = m.iter().find(|m| m.bytes_per_second >= GOOD_ENOUGH * best).unwrap();
            let (c, from) = past_the_peak(&m, enough);
            (2 * c.reads_in_flight, from)
        };
        // The memory-backed loop device (this VM): 2 in flight 6 % faster, 4 slower.
        assert_eq!(chosen([9704.0, 10298.0, 9738.0, 9281.0]), (2, Some(2)));
        // Within the noise: 4 in flight 1 % slower than 2 keeps depth 4.
        assert_eq!(chosen([9704.0, 10298.0, 10200.0, 9281.0]), (4, None));
        // Deeper choices stay: the probe measured nothing between 4 and 8 in flight.
        assert_eq!(chosen([100.0, 150.0, 200.0, 190.0]), (8, None));
        // Still gaining at the deepest measured: as before, nothing halved.
        assert_eq!(chosen([100.0, 180.0, 300.0, 420.0]), (16, None));
        assert_eq!(chosen([100.0, 180.0, 300.0, 310.0]), (8, None));
        // Flat, or one in flight the best: depth 2 either way.
        assert_eq!(chosen([100.0, 99.0, 98.0, 97.0]), (2, None));
        assert_eq!(chosen([100.0, 100.0, 100.0, 100.0]), (2, None));
    }

    #[test]
    fn a_stretch_reads_a_share_of_a_pass_a_few_chunks_at_least_the_cap_at_most() {
        let cap = Duration::from_millis(200);
        let at = slice_at(cap, 8 << 30, 4 << 20, 8);
        // Before any read: the cap's share.
        assert_eq!(at(0.0), Duration::from_millis(25));
        // 8 GiB at 8 GiB/s: 3 % of 1 s over 8 stretches, 3.75 ms, above 4 chunks' 2 ms.
        let s = at((8u64 << 30) as f64).as_secs_f64();
        assert!((s - 0.00375).abs() < 1e-6, "{s}");
        // A fast read of a small run: 4 chunks' time.
        let small = slice_at(cap, 64 << 20, 4 << 20, 8);
        assert!((small((1u64 << 30) as f64).as_secs_f64() - 4.0 / 256.0).abs() < 1e-6);
        // A slow device: the cap's share.
        assert_eq!(at(10.0 * 1048576.0), Duration::from_millis(25));
    }

    #[test]
    fn chunks_are_cut_from_the_ranges_up_to_the_most_asked() {
        assert_eq!(chunks_of(&[(0, 10), (20, 5)], 4, 100), vec![(0, 4), (4, 4), (8, 2), (20, 4), (24, 1)]);
        assert_eq!(chunks_of(&[(0, 10), (20, 5)], 4, 2), vec![(0, 4), (4, 4)]);
    }
}
