//! `reseq bench`, `reseq scan` and `reseq estimate`: a target read, into a report.

use std::path::Path;
use std::time::Instant;

use crate::cli::{BenchArgs, ReadArgs, ScanArgs};
use crate::measure::bench;
use crate::measure::readbench::{ReadParams, Target, resolve_params};
use crate::report::Report;
use crate::support::error::{Error, Result};

/// Opens the target of `bench`/`scan` and checks the read parameters against it.
fn open_read(a: &ReadArgs) -> Result<(Target, ReadParams)> {
    let target = if a.include_free { Target::open(&a.target)? } else { Target::open_in_use(&a.target, None)?.0 };
    let length = a.length.map(|l| l.bytes());
    let params = resolve_params(&target, a.block_size.bytes(), a.queue_depth, a.offset.bytes(), length)?;
    Ok((target, params))
}

/// Runs one measuring command into a report.
fn measured(command: &str, target: &Path, body: impl FnOnce(&mut Report) -> Result<()>) -> (Report, Result<()>) {
    let started = Instant::now();
    let mut report = Report::new(command, false);
    report.targets = vec![target.display().to_string()];
    let result = body(&mut report);
    report.finish(started.elapsed(), &result);
    (report, result)
}

/// `reseq bench`.
pub fn run_bench(args: &BenchArgs) -> (Report, Result<()>) {
    measured("bench", &args.read.target, |report| {
        if args.trim_impact {
            return crate::measure::trim_impact::run(args, report);
        }
        let settle = args.settle;
        if args.passes == 0 {
            return Err(Error::Usage("--passes must be at least 1".into()));
        }
        let (target, params) = open_read(&args.read)?;
        report.bench = Some(bench::bench(&target, &params, args.passes, settle)?);
        Ok(())
    })
}

/// `reseq scan`.
pub fn run_scan(args: &ScanArgs) -> (Report, Result<()>) {
    measured("scan", &args.read.target, |report| {
        if args.regions == 0 || args.regions > 100_000 {
            return Err(Error::Usage("--regions must be between 1 and 100000".into()));
        }
        if !(args.threshold > 0.0 && args.threshold <= 1.0) {
            return Err(Error::Usage("--threshold must be in (0, 1]".into()));
        }
        let (target, params) = open_read(&args.read)?;
        report.scan = Some(bench::scan(&target, &params, args.regions, args.threshold)?);
        Ok(())
    })
}

/// `reseq estimate`.
pub fn run_estimate(args: &crate::cli::EstimateArgs) -> (Report, Result<()>) {
    measured("estimate", &args.target, |report| {
        let sample = args.sample.bytes();
        let (target, _) = Target::open_in_use(&args.target, None)?;
        let block = (1u64 << 20).max(target.offset_align());
        let e = bench::estimate(&target, block, sample, args.regions)?;
        log::info!("{}", e.advice);
        report.estimate = Some(e);
        Ok(())
    })
}
