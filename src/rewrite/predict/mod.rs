//! The dry run's prediction (both modes): the bytes the run reads and writes, its
//! windows, the time frozen and the whole duration, from a probe of the run's own
//! chunks on its device (`measure::plan_probe`) and a simulation of its windows
//! ([`model`]); and when a plan is absurd.
//!
//! Each figure is a range: the model's own error on a quiet host, wider when the probe
//! found the host busy (a run on a loaded host took three times the windows of a quiet
//! one, issue 37).

mod model;

pub(crate) use model::{Batch, Layout, Outcome, Run};

use std::path::PathBuf;
use std::time::Duration;

use crate::measure::depth_probe::{self, DepthChoice};
use crate::measure::plan_probe::{self, PlanProbe};
use crate::report::{CountRange, Prediction, SecondsRange};
use crate::support::error::{Error, Result};
use crate::support::units::{human_bytes, human_rate, human_seconds};

/// The probe reads for at most this long in all (split between the devices).
pub(crate) const PROBE_CAP: Duration = Duration::from_secs(1);

/// On a host whose CPU pressure before the probe was `p` (the share of time some task
/// waited for a CPU), a window's own costs (syncfs, freeze, thaw) are the model's times
/// `1 + p × LOAD_ON_WINDOWS`: they wait on the disk's other writers (measured 45-88 ms
/// loaded against 14-45 ms quiet; fitted on runs at pressures of 0-1 on 2 shared cores,
/// 2026-11-28). The load on chunks is the CPUs' (below): pressure did not see it.
const LOAD_ON_WINDOWS: f64 = 1.0;
/// What each chunk's reader waits for a CPU when no CPU is idle before the run starts
/// (each busy with a task of its own, which pressure does not see): the run's reader
/// and hasher, normal threads, then share CPUs with those tasks. Two CPU-bound tasks
/// on 2 cores made runs of small files 1-4 ms a chunk slower; one made no difference.
const SATURATED_SECONDS: f64 = 0.002;
/// And every chunk's cost grows by this share: the loop device's kernel workers and the
/// hasher share the CPUs too (runs of 4 MiB chunks x1.1-x1.8 under the same two tasks).
const SATURATED_SCALE: f64 = 0.4;
/// The ends of each range: the model's own error, every cost x0.8 (and no load at all,
/// no write cap) to x1.25, with half again the load's effect.
const LOW: f64 = 0.8;
const HIGH: f64 = 1.25;
const HIGH_LOAD: f64 = 1.5;
/// The high end of each range grows by this times the I/O pressure before the probe (the
/// share of time some task waited for I/O): another job's writes to the same disk
/// slow the run's writes and each window's syncfs as no read probe shows. Not the
/// expected figure: a task blocked on a FUSE file counts there too (0.5 measured while
/// the run went as fast as on an idle host).
const IO_ON_HIGH: f64 = 1.0;

/// A run longer than this is said to be absurd (a warning, also in the run's log).
pub(crate) const ABSURD: Duration = Duration::from_secs(7 * 86_400);

/// How long the depth probe reads, at most (before every run, dry or not; measured
/// 0.3-0.4 s in all with its threads and last reads).
pub(crate) const DEPTH_PROBE_CAP: Duration = Duration::from_millis(200);
/// Runs over fewer bytes are not probed: the probe would cost more than a depth can win
/// (on a 1 GiB loop device the probe added 0.4 s to a 2.5 s run, and no depth was
/// faster than 2 there: docs/CHUNK-SIZE.md, "Depth").
const DEPTH_PROBE_FROM: u64 = 4 << 30;

/// The pipeline's depth of a run of `bytes`: `--read-ahead` as given, else, when that
/// many bytes are worth it, probed (`measure::depth_probe`) on what `probe_on` names:
/// a device and ranges of it to read (ascending offsets and lengths; a device's depth is
/// the same over all of it). A probe that fails, or has nothing to read, is no reason to
/// refuse a run: it falls back to the old default, and says why.
pub(crate) fn depth(
    o: &crate::options::rewrite::RewriteOptions,
    bytes: u64,
    deadline: Option<Duration>,
    probe_on: impl FnOnce() -> Option<(std::path::PathBuf, Vec<(u64, u64)>)>,
) -> DepthChoice {
    if o.given.read_ahead {
        return DepthChoice::given(o.run.read_ahead);
    }
    if bytes < DEPTH_PROBE_FROM {
        return DepthChoice::fallback(format!(
            "{} to rewrite, less than {}: not worth a probe, the old default",
            human_bytes(bytes),
            human_bytes(DEPTH_PROBE_FROM)
        ));
    }
    let Some((device, ranges)) = probe_on() else {
        return DepthChoice::fallback("no file's extents to probe the device with: the old default".into());
    };
    let (device, ranges) = (device.as_path(), ranges.as_slice());
    let probed: u64 = ranges.iter().map(|r| r.1).sum();
    let chunk_size = o.run.chunk_size.bytes();
    let chunks = depth_probe::chunks_of(ranges, chunk_size, 512);
    let limits = depth_probe::Limits { chunk_size, verify: !o.run.no_verify, deadline };
    match depth_probe::choose(device, &chunks, probed, &limits, DEPTH_PROBE_CAP) {
        Ok(c) => {
            log::debug!("pipeline depth {}: {}", c.depth, c.why);
            c
        }
        Err(e) => DepthChoice::fallback(format!(
            "the depth probe failed ({}): the old default",
            crate::support::error::error_chain(&e)
        )),
    }
}

/// The depth in the prediction's basis.
pub(crate) fn depth_note(d: &DepthChoice) -> String {
    match d.read_gain() {
        g if g > 1.0 => {
            format!("depth {}: {}; reads counted x{g:.2} faster than the probe's one at a time", d.depth, d.why)
        }
        _ => format!("depth {}: {}", d.depth, d.why),
    }
}

/// One engine run: a device (device mode) or one filesystem's files (file mode).
pub(crate) struct EngineRun {
    pub(crate) device: PathBuf,
    /// The device's direct-I/O offset alignment.
    pub(crate) align: u64,
    pub(crate) layout: Layout,
}

/// The run's pacing, as its options set it.
#[derive(Clone, Debug)]
pub(crate) struct Pacing {
    pub(crate) chunk_size: u64,
    pub(crate) verify: bool,
    /// `--max-freeze` (None: nothing is frozen).
    pub(crate) deadline: Option<Duration>,
    pub(crate) pause: Duration,
    pub(crate) rate: Option<u64>,
    pub(crate) max_overruns: u32,
    pub(crate) read_ahead: usize,
    /// How much faster the depth's reads in flight read than one at a time, as its
    /// probe measured (1: not probed): the plan probe reads one at a time.
    pub(crate) read_gain: f64,
    /// What else the figures rest on, in words (a choice made only at the run's start).
    pub(crate) notes: Vec<String>,
}

/// The prediction, and each engine run's expected figures (file mode's filesystems).
pub(crate) struct Predicted {
    pub(crate) report: Prediction,
    pub(crate) each: Vec<Outcome>,
}

/// Probes each run's device and simulates its windows.
pub(crate) fn predict(runs: &[EngineRun], pacing: &Pacing) -> Result<Predicted> {
    let cap = PROBE_CAP.div_f64(runs.len().max(1) as f64).max(Duration::from_millis(200));
    let mut probes = Vec::new();
    for r in runs.iter().filter(|r| r.layout.bytes() > 0) {
        let chunks = r.layout.chunks(pacing.chunk_size);
        let p = plan_probe::probe(&r.device, &chunks, cap).map_err(|e| {
            Error::Internal(format!("probing {}: {}", r.device.display(), crate::support::error::error_chain(&e)))
        })?;
        probes.push(p);
    }
    // The CPU's pressure only: I/O pressure counts any task stalled on any device (one
    // blocked on a FUSE file measured 0.5 while the run went as fast as on an idle host).
    let pressure = probes.iter().filter_map(|p| p.host_pressure.as_ref()).map(|h| h.cpu_some).fold(0.0, f64::max);
    let windows = pressure * LOAD_ON_WINDOWS;
    let chunks = saturation(&probes) * SATURATED_SCALE;
    let io = io_pressure(&probes) * IO_ON_HIGH;
    // (chunks, windows, the write cap, the reader's penalty): the low end with no load
    // and writes as fast as the reads.
    let scales = [
        (LOW, LOW, false, 0.0),
        (1.0 + chunks, 1.0 + windows, true, 1.0),
        (HIGH * (1.0 + HIGH_LOAD * chunks + io), HIGH * (1.0 + HIGH_LOAD * windows + io), true, HIGH_LOAD),
    ];
    let mut outcomes: Vec<Vec<model::Outcome>> =
        scales.iter().map(|&s| simulate_all(runs, &probes, pacing, s)).collect();
    let total = |i: usize| sum(&outcomes[i]);
    let (low, expected, high) = (total(0), total(1), total(2));
    let bytes: u64 = runs.iter().map(|r| r.layout.bytes()).sum();
    let report = Prediction {
        bytes_to_rewrite: bytes,
        bytes_read: expected.bytes + expected.dropped,
        bytes_written: expected.bytes,
        bytes_verified: if pacing.verify { expected.bytes } else { 0 },
        chunks: expected.chunks,
        windows: counts([low.windows, expected.windows, high.windows]),
        frozen_seconds: spans([low.frozen, expected.frozen, high.frozen]),
        longest_freeze_seconds: expected.longest,
        duration_seconds: spans([low.seconds, expected.seconds, high.seconds]),
        windows_overrun: expected.overruns,
        stops_at_overruns: expected.stopped,
        basis: basis(&probes, pacing, pressure),
        probes,
    };
    Ok(Predicted { report, each: outcomes.swap_remove(1) })
}

/// A chunk-size trial (`engine::trial`): its stretches are windows of their own, each
/// after the run's `pause`, and the other shapes' stretches write fewer, larger chunks.
/// What each such window costs beyond its chunks (its first read and last read-back
/// overlap nothing; the other shape's buffers are made) is left out: tenths of a second
/// in a run of 16 GiB or more.
pub(crate) fn with_trial(p: &mut Prediction, t: &crate::engine::trial::Trial, pause: Duration) {
    let n = t.stretches() as u64;
    let waits = pause.as_secs_f64() * n as f64;
    for w in [&mut p.windows.low, &mut p.windows.expected, &mut p.windows.high] {
        *w += n;
    }
    for s in [&mut p.duration_seconds.low, &mut p.duration_seconds.expected, &mut p.duration_seconds.high] {
        *s += waits;
    }
    let in_chunks = |size: u64| t.stretch_bytes.div_ceil(size.max(1));
    let own = in_chunks(t.shapes[0].chunk_size);
    let fewer: u64 = t.shapes[1..].iter().map(|s| 2 * own.saturating_sub(in_chunks(s.chunk_size))).sum();
    p.chunks = p.chunks.saturating_sub(fewer);
}

/// Every engine run at one cost scale (each with its own probe; runs with nothing to
/// rewrite come to nothing).
fn simulate_all(
    runs: &[EngineRun],
    probes: &[PlanProbe],
    pacing: &Pacing,
    (scale, fixed_scale, capped, penalty): (f64, f64, bool, f64),
) -> Vec<model::Outcome> {
    let mut probes = probes.iter();
    let settings = |align: u64| model::Settings {
        chunk_size: pacing.chunk_size,
        align,
        verify: pacing.verify,
        deadline: pacing.deadline.map(|d| d.as_secs_f64()),
        pause: pacing.pause.as_secs_f64(),
        rate: pacing.rate.map(|r| r as f64),
        max_overruns: pacing.max_overruns,
        read_ahead: pacing.read_ahead,
    };
    runs.iter()
        .map(|r| match r.layout.bytes() {
            0 => model::Outcome::default(),
            _ => {
                let p = probes.next().expect("a probe for each run with bytes");
                let cap = if capped { model::WRITE_CAP_BYTES_PER_SECOND } else { f64::MAX };
                let reads = p.bytes_per_second * pacing.read_gain.max(1.0);
                let costs = model::Costs {
                    latency: p.latency_seconds,
                    bytes_per_second: reads,
                    write_bytes_per_second: p.bytes_per_second.min(cap),
                    penalty: reader_penalty(p) * penalty,
                    scale,
                    fixed_scale,
                };
                model::simulate(&r.layout, costs, &settings(r.align))
            }
        })
        .collect()
}

/// The most I/O pressure any probe saw before it read.
fn io_pressure(probes: &[PlanProbe]) -> f64 {
    probes.iter().filter_map(|p| p.host_pressure.as_ref()).map(|h| h.io_some).fold(0.0, f64::max)
}

/// What each read of the run's reader is taken to wait for a CPU: as measured, or, with
/// no CPU idle, [`SATURATED_SECONDS`].
fn reader_penalty(p: &PlanProbe) -> f64 {
    let saturated = SATURATED_SECONDS * saturation(std::slice::from_ref(p));
    p.normal_priority_penalty_seconds.max(saturated)
}

/// How far the CPUs were from having one idle before the probes: 0 with a CPU or more
/// idle, 1 with none.
fn saturation(probes: &[PlanProbe]) -> f64 {
    probes.iter().filter_map(|p| p.cpus_idle).map(|idle| (1.0 - idle).clamp(0.0, 1.0)).fold(0.0, f64::max)
}

/// Engine runs one after another (file mode's filesystems).
fn sum(outcomes: &[model::Outcome]) -> model::Outcome {
    outcomes.iter().fold(model::Outcome::default(), |a, o| model::Outcome {
        windows: a.windows + o.windows,
        frozen: a.frozen + o.frozen,
        longest: a.longest.max(o.longest),
        seconds: a.seconds + o.seconds,
        overruns: a.overruns + o.overruns,
        stopped: a.stopped || o.stopped,
        bytes: a.bytes + o.bytes,
        chunks: a.chunks + o.chunks,
        dropped: a.dropped + o.dropped,
    })
}

/// A range from three simulations (fewer windows need not come with lower costs).
fn counts(v: [u64; 3]) -> CountRange {
    CountRange { low: v.iter().copied().min().unwrap_or(0), expected: v[1], high: v.iter().copied().max().unwrap_or(0) }
}

fn spans(v: [f64; 3]) -> SecondsRange {
    SecondsRange {
        low: v.iter().copied().fold(f64::MAX, f64::min),
        expected: v[1],
        high: v.iter().copied().fold(0.0, f64::max),
    }
}

/// What the figures rest on, in words.
fn basis(probes: &[PlanProbe], pacing: &Pacing, pressure: f64) -> Vec<String> {
    let mut out: Vec<String> = probes.iter().map(|p| describe_probe(p, pacing.chunk_size)).collect();
    let reads = if pacing.verify { model::READ_SHARE } else { model::READ_SHARE_UNVERIFIED };
    out.push(format!(
        "model: a chunk costs {reads} x its bytes at the probe's rate ({}, overlapped) and {} x its bytes at the write rate, taken as the probe's rate but at most {} (a dry run writes nothing; sustained writes outlast a drive's or a virtual disk's write cache, recent data may read from one; the low end lifts the cap), the probe's latency once, and {:.2} ms (the permit and checks before each write); a window {:.0} ms before its freeze (syncfs, the guardian), {:.0} ms for the freeze and {:.0} ms for the thaw: not measured, since a dry run freezes nothing, but what ext4 over a loop device took on a quiet host; windows cut as the engine's pacer cuts them (a chunk starts only if it, its read-backs and the thaw fit twice over, with a tenth of the budget spare){}",
        if pacing.verify { "its read and read-back" } else { "its read" },
        model::WRITE_SHARE,
        human_rate(model::WRITE_CAP_BYTES_PER_SECOND),
        model::PER_CHUNK_SECONDS * 1e3,
        model::FREEZE_BEFORE_SECONDS * 1e3,
        model::FREEZE_SECONDS * 1e3,
        model::THAW_SECONDS * 1e3,
        if pacing.deadline.is_none() { "; nothing is frozen here: one window" } else { "" },
    ));
    let penalty = probes.iter().map(reader_penalty).fold(0.0, f64::max);
    let idle = probes.iter().filter_map(|p| p.cpus_idle).fold(f64::MAX, f64::min);
    let idle = if idle == f64::MAX { String::new() } else { format!(", {idle:.1} CPU(s) idle") };
    out.push(match pressure {
        p if p >= 0.1 || penalty > 0.0005 => format!(
            "host: busy before the probe (some task waited for a CPU {:.0} % of the time, /proc/pressure{idle}): each window's syncfs, freeze and thaw counted x{:.2}, each chunk x{:.2} and at least its read and {:.2} ms (what the run's reader, a normal thread, waits for a CPU); the range from x{LOW} with no load to x{HIGH} with half again its effect",
            p * 100.0,
            1.0 + p * LOAD_ON_WINDOWS,
            1.0 + saturation(probes) * SATURATED_SCALE,
            penalty * 1e3
        ),
        p => format!(
            "host: quiet before the probe (CPU pressure {:.0} %, /proc/pressure{idle}): the range is the model's own, x{LOW}-x{HIGH} of every cost",
            p * 100.0
        ),
    });
    let io = io_pressure(probes);
    if io >= 0.05 {
        out.push(format!(
            "I/O: some task waited for I/O {:.0} % of the time before the probe (/proc/pressure/io): another job's I/O may slow the run's writes and syncs as no read probe shows, so the high end of each range is x{:.2} more",
            io * 100.0,
            1.0 + io * IO_ON_HIGH
        ));
    }
    if let Some(r) = pacing.rate {
        out.push(format!(
            "--rate {}: no faster than that on average, the pauses making up the time",
            human_rate(r as f64)
        ));
    }
    out.extend(pacing.notes.iter().cloned());
    out
}

/// The probe in words.
fn describe_probe(p: &PlanProbe, chunk_size: u64) -> String {
    let fit = match p.latency_seconds {
        0.0 => {
            format!("its bytes at {} (the reads too alike in size to tell a latency)", human_rate(p.bytes_per_second))
        }
        l => format!("{:.2} ms + its bytes at {}", l * 1e3, human_rate(p.bytes_per_second.min(1e13))),
    };
    let (each, bytes) = (human_bytes(chunk_size), human_bytes(p.bytes));
    format!(
        "probe: {} of the run's {} chunks on {} read as the run reads them (O_DIRECT at their device offsets, up to {each} each, one at a time at real-time priority as the run's writer, spread over the data, each once), {bytes} in {:.2} s (cap {:.1} s): a read takes {fit}",
        p.reads, p.chunks_in_plan, p.device, p.seconds, p.time_cap_seconds,
    )
}

/// Warnings for a plan that makes no sense: a run of months or years, windows that
/// overrun until the run stops.
pub(crate) fn absurd(p: &Prediction, pacing: &Pacing) -> Vec<String> {
    let mut out = Vec::new();
    let d = p.duration_seconds.expected;
    if d > ABSURD.as_secs_f64() {
        let why = match pacing.rate {
            Some(r) if p.bytes_written as f64 / r as f64 > d / 2.0 => format!(
                ": {} at --rate {} (bytes per second: 1M is a MiB a second)",
                human_bytes(p.bytes_written),
                human_rate(r as f64)
            ),
            _ => String::new(),
        };
        out.push(format!("this run would take about {}{why}: is that what was meant?", human_seconds(d)));
    }
    let fix = "give a longer --max-freeze or a smaller --chunk-size";
    if p.stops_at_overruns {
        out.push(format!(
            "the run would stop (exit 7) once {} windows overran --max-freeze, having rewritten {} of {}: a window's freeze, planning and one chunk do not fit in it; {fix}",
            p.windows_overrun,
            human_bytes(p.bytes_written),
            human_bytes(p.bytes_to_rewrite)
        ));
    } else if p.windows_overrun > 0 {
        out.push(format!(
            "{} window(s) would overrun --max-freeze (the guardian thaws each at its deadline and the next windows are shorter; --max-overruns of them stop the run, exit 7); {fix}",
            p.windows_overrun
        ));
    }
    out
}
