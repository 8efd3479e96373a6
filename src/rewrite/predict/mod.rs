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

use crate::measure::plan_probe::{self, PlanProbe};
use crate::report::{CountRange, Prediction, SecondsRange};
use crate::support::error::{Error, Result};
use crate::support::units::{human_bytes, human_rate, human_seconds};

/// The probe reads for at most this long in all (split between the devices).
pub(crate) const PROBE_CAP: Duration = Duration::from_secs(1);

/// The ends of each range on a quiet host: every cost this much lower, or higher, than
/// the model's. A busy host (pressure `p`, the share of time some task waited for a CPU
/// or for I/O) widens both by `1 + 2p`: the load may go (the probe read more slowly for
/// it) or double.
const LOW: f64 = 0.8;
const HIGH: f64 = 1.25;

/// A run longer than this is said to be absurd (a warning, also in the run's log).
pub(crate) const ABSURD: Duration = Duration::from_secs(7 * 86_400);

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
        let p = plan_probe::probe(&r.device, &chunks, cap)
            .map_err(|e| Error::Internal(format!("probing {}: {}", r.device.display(), crate::error_chain(&e))))?;
        probes.push(p);
    }
    let pressure =
        probes.iter().filter_map(|p| p.host_pressure.as_ref()).map(|h| h.cpu_some.max(h.io_some)).fold(0.0, f64::max);
    let scales = [LOW / (1.0 + 2.0 * pressure), 1.0, HIGH * (1.0 + 2.0 * pressure)];
    let mut outcomes: Vec<Vec<model::Outcome>> =
        scales.iter().map(|&s| simulate_all(runs, &probes, pacing, s)).collect();
    let total = |i: usize| sum(&outcomes[i]);
    let (low, expected, high) = (total(0), total(1), total(2));
    let bytes: u64 = runs.iter().map(|r| r.layout.bytes()).sum();
    let report = Prediction {
        bytes_read: bytes,
        bytes_written: bytes,
        bytes_verified: if pacing.verify { bytes } else { 0 },
        chunks: expected.chunks,
        windows: counts([low.windows, expected.windows, high.windows]),
        frozen_seconds: spans([low.frozen, expected.frozen, high.frozen]),
        longest_freeze_seconds: expected.longest,
        duration_seconds: spans([low.seconds, expected.seconds, high.seconds]),
        windows_overrun: expected.overruns,
        basis: basis(&probes, pacing, pressure),
        probes,
    };
    Ok(Predicted { report, each: outcomes.swap_remove(1) })
}

/// Every engine run at one cost scale (each with its own probe; runs with nothing to
/// rewrite come to nothing).
fn simulate_all(runs: &[EngineRun], probes: &[PlanProbe], pacing: &Pacing, scale: f64) -> Vec<model::Outcome> {
    let mut probes = probes.iter();
    let settings = |align: u64| model::Settings {
        chunk_size: pacing.chunk_size,
        align,
        verify: pacing.verify,
        deadline: pacing.deadline.map(|d| d.as_secs_f64()),
        pause: pacing.pause.as_secs_f64(),
        rate: pacing.rate.map(|r| r as f64),
        max_overruns: pacing.max_overruns,
    };
    runs.iter()
        .map(|r| match r.layout.bytes() {
            0 => model::Outcome::default(),
            _ => {
                let p = probes.next().expect("a probe for each run with bytes");
                let costs = model::Costs { latency: p.latency_seconds, bytes_per_second: p.bytes_per_second, scale };
                model::simulate(&r.layout, costs, &settings(r.align))
            }
        })
        .collect()
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
    let reads = if pacing.verify { model::READS_PER_CHUNK } else { model::READS_PER_CHUNK_UNVERIFIED };
    out.push(format!(
        "model: a chunk costs {reads} times its read ({} share the device and partly overlap; a write is taken to cost a read, since a dry run writes nothing) and {:.2} ms (the permit and checks before each write); a window {:.0} ms for its freeze and {:.0} ms for its thaw, and {:.0} ms before it (syncfs): not measured, since a dry run freezes nothing (ext4 over a loop device took about that; an NVMe drive takes less); windows cut as the engine's pacer cuts them (a chunk starts only if it, its read-backs and the thaw fit twice over, with a tenth of the budget spare){}",
        if pacing.verify { "its read, write and read-back" } else { "its read and write" },
        model::PER_CHUNK_SECONDS * 1e3,
        model::FREEZE_SECONDS * 1e3,
        model::THAW_SECONDS * 1e3,
        model::FREEZE_BEFORE_SECONDS * 1e3,
        if pacing.deadline.is_none() { "; nothing is frozen here: one window" } else { "" },
    ));
    out.push(match pressure {
        p if p >= 0.1 => format!(
            "host: busy before the probe (some task waited for a CPU or for I/O {:.0} % of the time, /proc/pressure): the range allows for that load to go or to double (x{:.2}-x{:.2} of every cost)",
            p * 100.0,
            LOW / (1.0 + 2.0 * p),
            HIGH * (1.0 + 2.0 * p)
        ),
        p => format!(
            "host: quiet before the probe (pressure {:.0} %, /proc/pressure): the range is the model's own, x{LOW}-x{HIGH} of every cost",
            p * 100.0
        ),
    });
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
    format!(
        "probe: {} of the run's {} chunks on {} read as the run reads them (O_DIRECT at their device offsets, up to {} each, one at a time, spread over the data, each once), {} in {:.2} s (cap {:.1} s): a read takes {:.2} ms + its bytes at {}",
        p.reads,
        p.chunks_in_plan,
        p.device,
        human_bytes(chunk_size),
        human_bytes(p.bytes),
        p.seconds,
        p.time_cap_seconds,
        p.latency_seconds * 1e3,
        human_rate(p.bytes_per_second.min(1e13)),
    )
}

/// The prediction's lines in the dry run's text.
pub(crate) fn describe(p: &Prediction) -> String {
    let verb = if p.bytes_verified > 0 { "read, written and read back" } else { "read and written" };
    let w = &p.windows;
    let mut s = format!(
        "  prediction: {} {verb} in {} chunk(s); about {} window(s) ({}-{}), {} frozen in all ({}-{}), the longest {}; the whole run about {} ({}-{})\n",
        human_bytes(p.bytes_written),
        p.chunks,
        w.expected,
        w.low,
        w.high,
        human_seconds(p.frozen_seconds.expected),
        human_seconds(p.frozen_seconds.low),
        human_seconds(p.frozen_seconds.high),
        human_seconds(p.longest_freeze_seconds),
        human_seconds(p.duration_seconds.expected),
        human_seconds(p.duration_seconds.low),
        human_seconds(p.duration_seconds.high),
    );
    for b in &p.basis {
        s += &format!("  prediction rests on {b}\n");
    }
    s
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
    if p.windows_overrun > 0 {
        out.push(format!(
            "{} window(s) would overrun --max-freeze: a window's freeze, planning and one chunk do not fit in it (the run stops after --max-overruns of them, exit 7); give a longer --max-freeze or a smaller --chunk-size",
            p.windows_overrun
        ));
    }
    out
}
