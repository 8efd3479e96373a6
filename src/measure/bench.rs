//! `reseq bench`: timed passes over a range, what the host did meanwhile (its pressure,
//! an emulated drive's late replies), and more passes for a closer look. The scan of
//! regions is [`super::scan`]; the before/after verdict, [`super::verdict`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::measure::noise::{median, stopped};
use crate::measure::readbench::{CacheCheck, ReadParams, Target, Timed, read_span};
use crate::support::error::Result;

/// One pass of a benchmark.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Pass {
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    pub(crate) bytes_per_second: f64,
    /// Read command latency percentiles, as fio reports them (null on a simulated SSD,
    /// which times a pass, not its commands).
    #[serde(default)]
    pub(crate) latency_p50_seconds: Option<f64>,
    #[serde(default)]
    pub(crate) latency_p99_seconds: Option<f64>,
}

use crate::support::units::percentile;

impl From<Timed> for Pass {
    fn from(t: Timed) -> Pass {
        Pass {
            bytes: t.bytes,
            seconds: t.seconds,
            bytes_per_second: t.rate(),
            latency_p50_seconds: percentile(&t.latencies, 0.50),
            latency_p99_seconds: percentile(&t.latencies, 0.99),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct BenchResult {
    pub(crate) target: String,
    /// Measured on a simulated SSD's virtual clock.
    pub(crate) virtual_time: bool,
    pub(crate) params: ReadParams,
    pub(crate) settle_seconds: f64,
    pub(crate) passes: Vec<Pass>,
    pub(crate) median_bytes_per_second: f64,
    pub(crate) min_bytes_per_second: f64,
    pub(crate) max_bytes_per_second: f64,
    /// The check for a cache below O_DIRECT, made before the passes (null: a simulated
    /// SSD, which has none).
    #[serde(default)]
    pub(crate) cache: Option<CacheCheck>,
    /// How loaded the host was during the passes (null: no PSI, or a simulated SSD).
    #[serde(default)]
    pub(crate) host_pressure: Option<HostPressure>,
    /// A drive emulated by `reseq sim serve` under the target: its replies during the
    /// passes, and how many left later than their modelled completion (null: not one).
    #[serde(default)]
    pub(crate) emulated: Option<EmulatedDrive>,
}

/// The replies of an emulated drive (`reseq sim serve`) during a benchmark's passes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct EmulatedDrive {
    pub(crate) replies: u64,
    /// Replies sent more than 1 ms after their modelled completion: the host did not keep
    /// up with the drive's time scale.
    pub(crate) late_replies: u64,
    /// The sum of the replies' delays past their modelled completion, as a share of the
    /// passes' time: how much the host, not the model, could have slowed the passes.
    pub(crate) late_share: f64,
    pub(crate) time_scale: f64,
}

/// The share of the passes' time the replies of an emulated drive may be late by, in
/// sum, before a verdict on it is unreliable. Lateness slows a benchmark by at most this
/// share; faking the x[`MIN_EFFECT`](crate::measure::verdict::MIN_EFFECT) a verdict needs
/// would take a third. Measured on the shared 2-core VM at load average 4: 0.03 to 0.07.
pub(crate) const LATE_SHARE: f64 = 0.20;

/// The emulated drive under the first source of `target`, if any.
fn served_stats(target: &Target) -> Option<crate::sim::serve::ServedStats> {
    match target {
        Target::Real(s) => crate::sim::serve::served_stats_of(&s.first()?.path),
        Target::Sim { .. } => None,
    }
}

/// The share of the passes' wall time in which some task waited for a CPU, or for I/O
/// (Linux pressure stall information, /proc/pressure). Our own reader waits for I/O
/// too, so `io_some` is high on both sides; a change between before and after is what
/// matters: on a shared host, another job's load makes the same device read x1.8 slower.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct HostPressure {
    pub(crate) cpu_some: f64,
    pub(crate) io_some: f64,
}

/// CPU pressure from which a host is too busy for a sample to tell slow data from its
/// load ([`Sureness::effect_needed`](crate::measure::noise::Sureness::effect_needed)).
/// Seen on a 2-core host while `estimate` read a loop device: 0.04-0.07 alone, 0.21-0.44
/// under `bench/load.sh`, 0.4-0.6 with the whole test suite running.
pub(crate) const BUSY_CPU: f64 = 0.15;

/// `some total=` (microseconds) of /proc/pressure/KIND.
fn psi_total(kind: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/pressure/{kind}")).ok()?;
    let line = text.lines().find(|l| l.starts_with("some"))?;
    line.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
}

/// A change of the host's pressure between two benchmarks larger than this makes the
/// comparison unreliable.
pub(crate) const PRESSURE_CHANGE: f64 = 0.15;

/// Runs `passes` sequential reads of the range.
pub(crate) fn bench(target: &Target, params: &ReadParams, passes: usize, settle_for: Duration) -> Result<BenchResult> {
    let (block, qd) = (params.block_size_bytes, params.queue_depth);
    let mut cache = crate::measure::readbench::cache_check(target, block, qd)?;
    let watch = Watch::start(target);
    let mut out = Vec::new();
    for i in 0..passes.max(1) {
        stopped()?;
        if i > 0 {
            // A drive that reorganises itself in the background can, between passes.
            std::thread::sleep(settle_for);
        }
        let t =
            read_span(target, params.block_size_bytes, params.queue_depth, params.offset_bytes, params.length_bytes)?;
        let p = Pass::from(t);
        log_pass(i, &p);
        out.push(p);
        if i == 0
            && let Some(c) = cache.as_mut()
        {
            recheck_cache(c, target, params)?;
        }
    }
    let pass_seconds: f64 = out.iter().map(|p| p.seconds).sum();
    let result = BenchResult {
        target: target.describe(),
        virtual_time: target.is_virtual(),
        params: params.clone(),
        settle_seconds: settle_for.as_secs_f64(),
        cache,
        host_pressure: watch.host_pressure(target),
        emulated: watch.emulated(target, pass_seconds),
        ..BenchResult::default()
    };
    Ok(result.with_passes(&out))
}

impl BenchResult {
    /// The passes' throughputs, in order.
    pub(crate) fn rates(&self) -> Vec<f64> {
        self.passes.iter().map(|p| p.bytes_per_second).collect()
    }

    /// With `extra` passes added, and the median, min and max of all of them.
    pub(crate) fn with_passes(mut self, extra: &[Pass]) -> BenchResult {
        self.passes.extend_from_slice(extra);
        let rates = self.rates();
        self.median_bytes_per_second = median(&rates);
        self.min_bytes_per_second = rates.iter().copied().fold(f64::INFINITY, f64::min);
        self.max_bytes_per_second = rates.iter().copied().fold(0.0, f64::max);
        self
    }
}

/// What a measurement watches while it reads, besides the device: the host's pressure
/// and an emulated drive's late replies (`bench`, and `scan --by-file` per file).
pub(crate) struct Watch {
    psi: (Option<u64>, Option<u64>, std::time::Instant),
    served: Option<crate::sim::serve::ServedStats>,
}

impl Watch {
    pub(crate) fn start(target: &Target) -> Watch {
        Watch { psi: (psi_total("cpu"), psi_total("io"), std::time::Instant::now()), served: served_stats(target) }
    }

    /// The host's pressure since the start; None on a simulated SSD or without PSI.
    pub(crate) fn host_pressure(&self, target: &Target) -> Option<HostPressure> {
        let wall_us = self.psi.2.elapsed().as_micros().max(1) as f64;
        let share = |a: Option<u64>, b: Option<u64>| Some((b?.saturating_sub(a?) as f64 / wall_us).min(1.0));
        match (share(self.psi.0, psi_total("cpu")), share(self.psi.1, psi_total("io"))) {
            (Some(cpu_some), Some(io_some)) if !target.is_virtual() => Some(HostPressure { cpu_some, io_some }),
            _ => None,
        }
    }

    /// The CPU pressure of `pressure` (this watch's, the figure the report shows), where it
    /// reached [`BUSY_CPU`]. Never for an emulated drive: its model keeps the time, and a
    /// late reply is what makes its reads unreliable ([`LATE_SHARE`]).
    pub(crate) fn busy(&self, pressure: Option<&HostPressure>) -> Option<f64> {
        pressure.map(|p| p.cpu_some).filter(|&c| c >= BUSY_CPU && self.served.is_none())
    }

    /// The emulated drive's replies since the start, over `read_seconds` of reads.
    pub(crate) fn emulated(&self, target: &Target, read_seconds: f64) -> Option<EmulatedDrive> {
        let (a, b) = (self.served.as_ref()?, served_stats(target)?);
        Some(EmulatedDrive {
            replies: b.replies.saturating_sub(a.replies),
            late_replies: b.late_replies.saturating_sub(a.late_replies),
            late_share: (b.late_seconds - a.late_seconds).max(0.0) / read_seconds.max(f64::MIN_POSITIVE),
            time_scale: b.time_scale,
        })
    }
}

/// Up to `max` more passes of the benchmark `after` took, each after a pause as long as
/// the pass before it (so that they sample the device over a longer time than its
/// passes did back to back), none started once `budget` seconds have gone by.
pub(crate) fn more_passes(target: &Target, after: &BenchResult, max: usize, budget: f64) -> Result<Vec<Pass>> {
    let p = &after.params;
    let started = std::time::Instant::now();
    let mut pause = after.passes.last().map_or(0.0, |l| l.seconds);
    let mut out = Vec::new();
    while out.len() < max && started.elapsed().as_secs_f64() + pause < budget {
        std::thread::sleep(Duration::from_secs_f64(pause));
        stopped()?;
        let pass = Pass::from(read_span(target, p.block_size_bytes, p.queue_depth, p.offset_bytes, p.length_bytes)?);
        log_pass(after.passes.len() + out.len(), &pass);
        pause = pass.seconds;
        out.push(pass);
    }
    Ok(out)
}

fn log_pass(i: usize, p: &Pass) {
    let lat = match (p.latency_p50_seconds, p.latency_p99_seconds) {
        (Some(a), Some(b)) => format!(", latency p50 {:.2} ms, p99 {:.2} ms", a * 1e3, b * 1e3),
        _ => String::new(),
    };
    log::info!(
        "pass {}: {} in {:.3} s = {}{lat}",
        i + 1,
        crate::support::units::human_bytes(p.bytes),
        p.seconds,
        crate::support::units::human_rate(p.bytes_per_second)
    );
}

/// After the first pass: whether a cache the check saw still holds its sample.
fn recheck_cache(c: &mut CacheCheck, target: &Target, params: &ReadParams) -> Result<()> {
    let (block, qd) = (params.block_size_bytes, params.queue_depth);
    crate::measure::readbench::recheck_after_pass(c, target, block, qd, (params.offset_bytes, params.length_bytes))?;
    if c.cache_suspected {
        // Information, not a warning: the report says it under the benchmark's line
        // (UNRELIABLE, the cache check), once; a job's mail has no room for it twice.
        log::info!("results unreliable: {}", c.finding);
    } else if c.after_pass_bytes_per_second.is_some() {
        log::info!("{}", c.finding);
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn bench_of(rates: &[f64]) -> BenchResult {
        let passes: Vec<Pass> = rates
            .iter()
            .map(|r| Pass { bytes: 1 << 20, seconds: (1 << 20) as f64 / r, bytes_per_second: *r, ..Pass::default() })
            .collect();
        let params = ReadParams { block_size_bytes: 1 << 20, queue_depth: 1, offset_bytes: 0, length_bytes: 1 << 20 };
        BenchResult { target: "t".into(), params, ..BenchResult::default() }.with_passes(&passes)
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(50.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
        assert_eq!(percentile(&[3.0], 0.99), Some(3.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
