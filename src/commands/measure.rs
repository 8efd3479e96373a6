//! `reseq bench`, `reseq scan` and `reseq estimate`: a target read, into a report.

use crate::measure::readbench::{ReadParams, Target, resolve_params};
use crate::measure::{bench, byfile, scan};
use crate::options::bench::{BenchCommand, EstimateOptions, ReadOptions, ScanOptions};
use crate::report::Report;
use crate::support::error::Result;

/// Opens the target of `bench`/`scan` and checks the read parameters against it.
fn open_read(o: &ReadOptions) -> Result<(Target, ReadParams)> {
    let target = if o.include_free { Target::open(&o.target)? } else { Target::open_in_use(&o.target, None)?.0 };
    let params = resolve_params(&target, o.block_size, o.queue_depth, o.offset, o.length)?;
    Ok((target, params))
}

/// `reseq bench`.
pub(crate) fn run_bench(o: &BenchCommand) -> (Report, Result<()>) {
    match o {
        BenchCommand::TrimImpact(t) => Report::of_run("bench", false, &[&t.target], |report| {
            let (impact, result) = crate::measure::trim_impact::run(t);
            report.trim_impact = impact;
            result
        }),
        BenchCommand::Passes { read, passes, settle } => Report::of_run("bench", false, &[&read.target], |report| {
            let (target, params) = open_read(read)?;
            report.bench = Some(bench::bench(&target, &params, *passes, *settle)?);
            Ok(())
        }),
    }
}

/// `reseq scan`.
pub(crate) fn run_scan(o: &ScanOptions) -> (Report, Result<()>) {
    Report::of_run("scan", false, &[&o.read.target], |report| {
        if let Some(sort) = o.by_file {
            let r = &o.read;
            report.scan_files = Some(byfile::scan(&r.target, r.block_size, r.queue_depth, o.threshold, sort)?);
            return Ok(());
        }
        let (target, params) = open_read(&o.read)?;
        report.scan = Some(scan::scan(&target, &params, (o.regions, crate::measure::noise::ROUNDS), o.threshold)?);
        Ok(())
    })
}

/// `reseq estimate`.
pub(crate) fn run_estimate(o: &EstimateOptions) -> (Report, Result<()>) {
    Report::of_run("estimate", false, &[&o.target], |report| {
        // A directory: its files by age band (cold data), sampled.
        if std::fs::metadata(&o.target).is_ok_and(|m| m.is_dir()) {
            let dev = around(&o.target);
            let e = crate::measure::cold_estimate::estimate(&o.target, dev.as_ref(), 1 << 20, (o.sample, o.regions))?;
            report.estimate_files = Some(e);
            return Ok(());
        }
        let (target, _) = Target::open_in_use(&o.target, None)?;
        let around = around(&o.target);
        let block = (1u64 << 20).max(target.offset_align()).max(around.as_ref().map_or(0, Target::offset_align));
        let e = crate::measure::estimate::estimate(&target, around.as_ref(), block, (o.sample, o.regions))?;
        // The report says it first: logged too, it was said twice.
        log::debug!("{}", e.advice);
        report.estimate = Some(e);
        Ok(())
    })
}

/// The data in use on the device under a file, for the estimate's reference: a file slow
/// all over is compared with the drive, not with itself. None (said in the log) when it
/// cannot be read.
fn around(target: &std::path::Path) -> Option<Target> {
    let dev = crate::measure::readbench::device_around(target)?;
    match Target::open_in_use(&dev, None) {
        Ok((t, _)) => Some(t),
        Err(e) => {
            log::warn!(
                "cannot read {} around {} for a reference ({e}): the file is compared with itself",
                dev.display(),
                target.display()
            );
            None
        }
    }
}
