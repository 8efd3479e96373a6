//! `reseq simulate` and `reseq sim …`: the simulated SSD from the command line.
//!
//! `simulate` reproduces the article's experiment in one command: write a file, degrade
//! it in four stages of random 4 KiB writes, read it after each, re-sequence it with
//! reseq's own engine, read it again. `sim` keeps a simulated device in a state file so
//! the same steps can be run one at a time (create, write, fragment, read, rewrite).

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::engine::guard::NoFreeze;
use crate::engine::journal::Journal;
use crate::engine::{self, EngineConfig, EngineStats};
use crate::measure::readbench::{ReadParams, Target};
use crate::measure::scan::Selection;
use crate::options::bench::BenchOptions;
use crate::options::sim::{Override, SimRange, SimRewrite, SimStep, SimulateOptions};
use crate::sim::experiment::degrade;
use crate::sim::ftl::{PRESETS, Params, SLOT, Stuck, seq_read_time};
use crate::sim::pyrandom::PyRandom;
use crate::sim::{SimDevice, SimState, load, save};
use crate::support::error::{Error, Result};
use crate::support::output::Progress;
use crate::support::signals::StopFlag;
use crate::support::units::human_bytes;

const MIB: u64 = 1 << 20;

/// Builds model parameters from a preset, a size and `--set` overrides.
pub(crate) fn build_params(preset: &str, device_size: u64, overrides: &[Override]) -> Result<Params> {
    let base = Params::preset(preset)
        .ok_or_else(|| Error::Usage(format!("unknown preset '{preset}' (choose one of: {})", PRESETS.join(", "))))?;
    let mut value = serde_json::to_value(Params { logical_bytes: device_size, ..base }).expect("params serialize");
    for o in overrides {
        let slot = value.get_mut(&o.key).ok_or_else(|| {
            let keys: Vec<String> = serde_json::to_value(Params::default())
                .ok()
                .and_then(|p| p.as_object().map(|m| m.keys().cloned().collect()))
                .unwrap_or_default();
            Error::Usage(format!("--set: unknown model parameter '{}' (parameters: {})", o.key, keys.join(", ")))
        })?;
        *slot = o.value.clone();
    }
    let p: Params = serde_json::from_value(value).map_err(|e| Error::Usage(format!("--set: {e}")))?;
    if p.logical_bytes < 64 * MIB || !p.logical_bytes.is_multiple_of(SLOT) {
        return Err(Error::Usage("the simulated device must be at least 64 MiB, in whole 4 KiB blocks".into()));
    }
    p.check_gc().map_err(|e| Error::Usage(format!("this simulated drive cannot work: {e}")))?;
    p.check_retention().map_err(|e| Error::Usage(format!("--set: {e}")))?;
    Ok(p)
}

/// One row of the experiment's table.
#[derive(Debug, Serialize)]
pub(crate) struct Step {
    pub(crate) label: String,
    pub(crate) read_seconds: f64,
    pub(crate) read_bytes_per_second: f64,
    pub(crate) slowdown_vs_fresh: f64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Experiment {
    pub(crate) schema_version: u32,
    pub(crate) preset: String,
    pub(crate) params: Params,
    pub(crate) device_bytes: u64,
    pub(crate) file_bytes: u64,
    pub(crate) random_write_stages_bytes: Vec<u64>,
    pub(crate) steps: Vec<Step>,
    pub(crate) rewrite: EngineStats,
    pub(crate) rewrite_virtual_seconds: f64,
    pub(crate) wall_seconds: f64,
    pub(crate) model_state_bytes: u64,
}

/// Runs reseq's engine over `[start, end)` of a simulated device, rewriting what
/// `planner` picks (everything, or only the slow regions).
pub(crate) fn engine_rewrite(
    dev: &SimDevice,
    start: u64,
    end: u64,
    chunk_size: u64,
    verify: bool,
    quiet: bool,
    planner: &mut dyn crate::engine::Planner,
) -> Result<EngineStats> {
    if chunk_size == 0 || !chunk_size.is_multiple_of(SLOT) {
        return Err(Error::Usage(format!(
            "--chunk-size must be a multiple of 4 KiB on a simulated device, not {chunk_size}"
        )));
    }
    let cfg = EngineConfig {
        chunk_size,
        range_start: start,
        range_end: end,
        start_offset: start,
        verify,
        read_ahead: 2,
        max_overruns: 1,
        ..EngineConfig::default()
    };
    let mut progress = Progress::new(end - start, 0, quiet);
    let (stats, result) =
        engine::run(dev, &cfg, planner, &mut NoFreeze, &mut Journal::none(), &mut progress, &StopFlag::default());
    result.map(|()| stats)
}

/// `reseq simulate`.
pub(crate) fn simulate(o: &SimulateOptions, quiet: bool) -> Result<Experiment> {
    let wall = Instant::now();
    let p = build_params(&o.preset, o.device_size, &o.set)?;
    let file = o.file_size;
    if file == 0 || !file.is_multiple_of(SLOT) || file > p.logical_bytes {
        return Err(Error::Usage("--file-size must be whole 4 KiB blocks and fit on the device".into()));
    }
    // The article's stages are for a 4 GiB file; scale them to this file.
    let scale = file as f64 / (4u64 << 30) as f64;
    let stages_mib: Vec<f64> = o.stages.iter().map(|&m| m * scale).collect();
    let nf = file / SLOT;
    let mut state = SimState::new(p.clone());
    let times = degrade(&mut state.ftl, nf, o.seed, &stages_mib).map_err(stuck)?;
    log::debug!("model: write, degrade and 5 reads took {:.2} s", wall.elapsed().as_secs_f64());
    let t = Instant::now();
    let dev = SimDevice::new(state);
    let stats = engine_rewrite(&dev, 0, file, o.chunk_size, true, quiet, &mut crate::engine::Everything)?;
    let mut state = dev.into_state();
    log::debug!("engine: rewrite took {:.2} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    let after = seq_read_time(&mut state.ftl, 0, nf, MIB, 1);
    log::debug!("model: final read took {:.2} s", t.elapsed().as_secs_f64());
    let mut reads = times;
    reads.push(after);
    Ok(Experiment {
        schema_version: 1,
        preset: o.preset.clone(),
        device_bytes: p.logical_bytes,
        file_bytes: file,
        random_write_stages_bytes: stages_mib.iter().map(|m| (m * MIB as f64) as u64).collect(),
        steps: steps(file, &stages_mib, &reads, o.chunk_size),
        rewrite_virtual_seconds: state.writer.t / 1e6,
        rewrite: stats,
        wall_seconds: wall.elapsed().as_secs_f64(),
        model_state_bytes: state.ftl.state_bytes(),
        params: p,
    })
}

/// The rows of the table: the fresh read, one per stage, and the one after the rewrite
/// (`reads` holds their times in that order).
fn steps(file: u64, stages_mib: &[f64], reads: &[f64], chunk: u64) -> Vec<Step> {
    let fresh = reads[0];
    let row = |label: String, t: f64| Step {
        label,
        read_seconds: t,
        read_bytes_per_second: file as f64 / t,
        slowdown_vs_fresh: t / fresh,
    };
    let mut steps = vec![row("fresh (file written sequentially)".into(), fresh)];
    let mut total = 0.0;
    for (mb, t) in stages_mib.iter().zip(&reads[1..]) {
        total += mb;
        steps.push(row(
            format!(
                "+{} random 4 KiB writes (total {})",
                human_bytes((mb * MIB as f64) as u64),
                human_bytes((total * MIB as f64) as u64)
            ),
            *t,
        ));
    }
    let after = *reads.last().expect("the read after the rewrite");
    steps.push(row(format!("after reseq rewrite ({} chunks, verified)", human_bytes(chunk)), after));
    steps
}

impl Experiment {
    pub(crate) fn to_text(&self) -> String {
        let mut s = format!(
            "simulated {} SSD: {} device, {} file\neach step reads the file in order: 1 MiB commands, QD1, virtual time\n\n",
            self.preset,
            human_bytes(self.device_bytes),
            human_bytes(self.file_bytes)
        );
        s += &format!("  {:<52} {:>8} {:>12} {:>9}\n", "step", "read", "throughput", "slowdown");
        for st in &self.steps {
            let (rate, slowdown) =
                (human_bytes(st.read_bytes_per_second as u64), format!("x{:.2}", st.slowdown_vs_fresh));
            s += &format!("  {:<52} {:>6.2} s {rate:>10}/s {slowdown:>8}\n", st.label, st.read_seconds);
        }
        s += &format!(
            "\n  the rewrite wrote {} in {:.1} s of virtual time; simulation took {:.2} s of wall time\n",
            human_bytes(self.rewrite.bytes_written),
            self.rewrite_virtual_seconds,
            self.wall_seconds
        );
        s
    }
}

/// A drive GC got stuck on was sized too small for what was asked of it.
fn stuck(s: Stuck) -> Error {
    Error::Usage(s.to_string())
}

/// (first LBA, LBA count) of a range on a device.
fn lba_range(r: &SimRange, state: &SimState) -> Result<(u64, u64)> {
    let len_dev = state.len_bytes();
    let off = r.offset;
    let len = r.length.unwrap_or(len_dev.saturating_sub(off));
    if !off.is_multiple_of(SLOT) || !len.is_multiple_of(SLOT) || len == 0 || off + len > len_dev {
        return Err(Error::Usage(format!(
            "range {off}+{len} must be whole 4 KiB blocks inside the {} device",
            human_bytes(len_dev)
        )));
    }
    Ok((off / SLOT, len / SLOT))
}

/// `reseq sim …`. Returns what to print.
pub(crate) fn sim_command(step: &SimStep, quiet: bool) -> Result<serde_json::Value> {
    match step {
        SimStep::Create { state, preset, device_size, set } => create(state, preset, *device_size, set),
        SimStep::Write { state, range } => {
            let mut st = load(state)?;
            let (first, n) = lba_range(range, &st)?;
            st.ftl.write_lpns(first..first + n).map_err(stuck)?;
            save(&st, state)?;
            Ok(serde_json::json!({"written_bytes": n * SLOT}))
        }
        SimStep::Fragment { state, range, random_writes, seed } => fragment(state, range, *random_writes, *seed),
        SimStep::Read { state, range, block_size, queue_depth } => read(state, range, *block_size, *queue_depth),
        SimStep::Rewrite(rw) => sim_rewrite(rw, quiet),
        SimStep::Serve { state, mount_dir, time_scale } => {
            serde_json::to_value(crate::sim::serve::serve(state, mount_dir, *time_scale, quiet)?)
                .map_err(|e| Error::Internal(format!("serve summary: {e}")))
        }
        SimStep::Info { state } => info(state),
        SimStep::Age { state, days } => {
            let aged = crate::sim::control::age(state, *days)?;
            if !aged.retention_on && !quiet {
                eprintln!(
                    "reseq sim age: retention is off (retention_max_factor 1): this drive reads the same at any age"
                );
            }
            serde_json::to_value(aged).map_err(|e| Error::Internal(format!("age: {e}")))
        }
    }
}

/// `reseq sim info`: parameters, counters, the age clock and how much data is how old.
fn info(state: &Path) -> Result<serde_json::Value> {
    let st = load(state)?;
    let p = &st.ftl.p;
    let ages: Vec<_> =
        st.ftl.data_ages().into_iter().map(|(d, b)| serde_json::json!({"age_days": d, "bytes": b})).collect();
    let retention = serde_json::json!({"on": p.retention_on(), "onset_days": p.retention_onset_days,
        "full_days": p.retention_full_days, "max_factor": p.retention_max_factor});
    Ok(serde_json::json!({"params": p, "device_bytes": st.len_bytes(), "mapped_bytes": st.ftl.mapped_bytes(),
                          "stats": st.ftl.stats, "model_state_bytes": st.ftl.state_bytes(),
                          "age_clock_days": st.ftl.age_days, "retention": retention, "data_by_age": ages}))
}

/// `reseq sim create`.
fn create(state: &Path, preset: &str, device_size: u64, set: &[Override]) -> Result<serde_json::Value> {
    if state.exists() {
        return Err(Error::Usage(format!("{} exists; remove it first", state.display())));
    }
    let st = SimState::new(build_params(preset, device_size, set)?);
    save(&st, state)?;
    Ok(serde_json::json!({"created": state, "preset": preset, "device_bytes": st.len_bytes(),
                          "model_state_bytes": st.ftl.state_bytes()}))
}

/// `reseq sim fragment`: random 4 KiB writes into the range.
fn fragment(state: &Path, range: &SimRange, bytes: u64, seed: u64) -> Result<serde_json::Value> {
    let mut st = load(state)?;
    let (first, n) = lba_range(range, &st)?;
    let mut rng = PyRandom::new(seed);
    let lpns: Vec<u64> = (0..bytes / SLOT).map(|_| first + rng.randrange(0, n)).collect();
    st.ftl.write_lpns(lpns).map_err(stuck)?;
    save(&st, state)?;
    Ok(serde_json::json!({"random_4k_writes": bytes / SLOT, "gc_runs": st.ftl.stats.gc_runs}))
}

/// `reseq sim read`: a sequential read of the range, on the virtual clock.
fn read(state: &Path, range: &SimRange, bs: u64, queue_depth: usize) -> Result<serde_json::Value> {
    let mut st = load(state)?;
    let (first, n) = lba_range(range, &st)?;
    if bs == 0 || !bs.is_multiple_of(SLOT) || queue_depth == 0 {
        return Err(Error::Usage("--block-size must be whole 4 KiB blocks and --queue-depth at least 1".into()));
    }
    let secs = seq_read_time(&mut st.ftl, first, n, bs, queue_depth);
    Ok(serde_json::json!({"read_bytes": n * SLOT, "virtual_seconds": secs,
                          "read_bytes_per_second": (n * SLOT) as f64 / secs,
                          "block_size_bytes": bs, "queue_depth": queue_depth}))
}

/// `reseq sim rewrite` (and `reseq rewrite sim:STATE`): reseq's engine over the range,
/// everything or only the slow regions.
pub(crate) fn sim_rewrite(rw: &SimRewrite, quiet: bool) -> Result<serde_json::Value> {
    let st = load(&rw.state)?;
    let (first, n) = lba_range(&rw.range, &st)?;
    let (start, end) = (first * SLOT, (first + n) * SLOT);
    let selection =
        rw.only_slow.map(|slow| slow_regions_of(st.clone(), start, end, slow.regions, slow.threshold)).transpose()?;
    let t0 = st.writer.t;
    let dev = SimDevice::new(st);
    let stats = match &selection {
        Some(sel) => {
            let mut planner = crate::engine::Selected { inner: &mut crate::engine::Everything, selected: sel.ranges() };
            engine_rewrite(&dev, start, end, rw.chunk_size, rw.verify, quiet, &mut planner)?
        }
        None => engine_rewrite(&dev, start, end, rw.chunk_size, rw.verify, quiet, &mut crate::engine::Everything)?,
    };
    let st = dev.into_state();
    save(&st, &rw.state)?;
    Ok(serde_json::json!({"rewrite": stats, "virtual_seconds": (st.writer.t - t0) / 1e6, "selection": selection}))
}

/// `reseq rewrite sim:STATE` as a report like any rewrite's (so that `--json`, `--format`,
/// `--metrics-file` and `reseq report` treat it alike); the virtual time is a warning.
/// `bench`: measure before and after (`--bench`).
pub(crate) fn rewrite_report(
    rw: &SimRewrite,
    bench: Option<&BenchOptions>,
    quiet: bool,
) -> (crate::report::Report, Result<()>) {
    let mut target = std::ffi::OsString::from("sim:");
    target.push(rw.state.as_os_str());
    let target = std::path::PathBuf::from(target);
    crate::report::Report::of_run("rewrite", false, &[&target], |report| {
        let measure = |o: &BenchOptions| {
            let target = crate::measure::readbench::Target::open(&target)?;
            crate::measure::passes::measure_target(&target, o)
        };
        if let Some(o) = bench {
            let (b, s) = measure(o)?;
            (report.bench_before, report.scan_before) = (Some(b), Some(s));
        }
        let v = sim_rewrite(rw, quiet)?;
        report.results = serde_json::from_value(v["rewrite"].clone()).ok();
        report.selection = serde_json::from_value(v["selection"].clone()).ok();
        report.warnings.push(format!(
            "a simulated SSD: the rewrite took {:.3} s of its virtual time",
            v["virtual_seconds"].as_f64().unwrap_or(0.0)
        ));
        if let Some(o) = bench {
            let (b, s) = measure(o)?;
            report.verdict = report.bench_before.as_ref().map(|before| crate::measure::verdict::verdict_of(before, &b));
            (report.bench_after, report.scan_after) = (Some(b), Some(s));
        }
        Ok(())
    })
}

/// Scans `[start, end)` of a simulated SSD (1 MiB reads, QD1, virtual time) and picks
/// the slow regions.
pub(crate) fn slow_regions_of(
    state: SimState,
    start: u64,
    end: u64,
    regions: usize,
    threshold: f64,
) -> Result<Selection> {
    if regions == 0 || !(threshold > 0.0 && threshold <= 1.0) {
        return Err(Error::Usage("--scan-regions must be positive and --slow-threshold in (0, 1]".into()));
    }
    let target = Target::Sim { path: "simulated".into(), state: Box::new(std::sync::Mutex::new(state)) };
    let params = ReadParams { block_size_bytes: MIB, queue_depth: 1, offset_bytes: start, length_bytes: end - start };
    let scan = crate::measure::scan::scan(&target, &params, (regions, crate::measure::noise::ROUNDS), threshold)?;
    Ok(Selection::from_scan(&scan, "scan in this run".into()))
}
