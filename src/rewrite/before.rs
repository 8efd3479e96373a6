//! The benchmarks around a `--bench` run, both modes. The one before is kept beside the
//! run's journal (or file record): a resumed run compares with it, since the data it
//! measured is partly rewritten by then and a new "before" would measure the run's own
//! work. The one after reads the same bytes the same way, and gives the verdict.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::measure::bench::{self, BenchResult};
use crate::measure::passes as measure;
use crate::measure::readbench::{Ranges, Target};
use crate::measure::verdict;
use crate::report::Report;
use crate::support::signals::StopFlag;

use crate::measure::scan::ScanResult;
use crate::options::bench::BenchOptions;
use crate::support::error::{Error, Result};

/// What the benchmark before measured, and on which bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Before {
    pub(crate) bench: BenchResult,
    pub(crate) scan: ScanResult,
    /// The device's ranges in use then (device mode on mounted filesystems).
    pub(crate) in_use: Option<Ranges>,
}

/// Where a run's benchmark before is kept: beside its journal or record.
pub(crate) fn path_of(record: &Path) -> PathBuf {
    let mut name = record.file_name().unwrap_or_default().to_os_string();
    name.push(".before.json");
    record.with_file_name(name)
}

impl Before {
    /// Written whole, as journals are: a crash leaves the old one or the new one.
    pub(crate) fn save(&self, record: &Path) -> Result<()> {
        let path = path_of(record);
        let text = serde_json::to_string(self).map_err(|e| Error::io("encoding the benchmark before", e.into()))?;
        crate::engine::journal::replace_atomically(&path, &text)
            .map_err(|e| Error::io(format!("saving the benchmark before to {}", path.display()), e))
    }

    /// Forgets a run's benchmark before: the run wrote nothing, so there is nothing to
    /// resume and compare with.
    pub(crate) fn discard(record: &Path) {
        let _ = std::fs::remove_file(path_of(record));
    }

    /// The interrupted run's, if it was kept (None, said in the log, if not).
    pub(crate) fn load(record: &Path) -> Option<Before> {
        let path = path_of(record);
        let found = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Before>(&b).ok());
        match &found {
            Some(_) => {
                log::info!("comparing with the benchmark taken before the interrupted run started ({})", path.display())
            }
            None => log::warn!(
                "the interrupted run's benchmark before is not in the state directory ({}): this run measures after, with no verdict",
                path.display()
            ),
        }
        found
    }
}

/// The benchmark options that read as the benchmark before did: the after-benchmark of
/// a resumed run reads the same way, whatever the resuming command says.
fn same_reads(bench: &BenchResult, scan: &ScanResult, given: &BenchOptions) -> BenchOptions {
    let p = &bench.params;
    BenchOptions {
        block_size: p.block_size_bytes,
        queue_depth: p.queue_depth,
        passes: bench.passes.len().max(1),
        regions: scan.regions.len().max(1),
        ..given.clone()
    }
}

/// The benchmark before a run, both modes: for a resumed run the interrupted run's, kept
/// beside its `record` (None: not kept; the run then has no verdict); otherwise measured
/// now by `measure` and kept there.
pub(crate) fn bench_before(
    resumed: bool,
    record: &Path,
    measure: impl FnOnce() -> Result<Before>,
) -> Result<Option<Before>> {
    if resumed {
        return Ok(Before::load(record));
    }
    let b = measure().map_err(before_writing)?;
    b.save(record).map_err(before_writing)?;
    Ok(Some(b))
}

/// The benchmark after a rewrite, both modes: `target` opens the same bytes as the
/// benchmark before (again for a re-check); the verdict, re-checked where it is close.
/// A stop during it keeps the finished rewrite, and the verdict says "unreliable".
/// Returns whether it measured.
pub(crate) fn bench_after(
    report: &mut Report,
    opts: &crate::options::bench::BenchOptions,
    stop: &StopFlag,
    target: impl Fn() -> Result<Target>,
) -> Result<bool> {
    log::info!("benchmarking the same data after the rewrite");
    let opts = &match (&report.bench_before, &report.scan_before) {
        (Some(b), Some(s)) => same_reads(b, s, opts),
        _ => opts.clone(),
    };
    let (b, s) = match target().and_then(|t| measure::measure_target(&t, opts)) {
        Ok(m) => m,
        Err(e) => {
            report.verdict = cut_short(report.bench_before.as_ref(), e)?;
            return Ok(false);
        }
    };
    if let Some(before) = &report.bench_before {
        let v = verdict::verdict_of(before, &b);
        report.verdict = measure::recheck(Some(v), before, &b, opts, stop, &target);
    }
    (report.bench_after, report.scan_after) = (Some(b), Some(s));
    Ok(true)
}

/// A stop during the benchmark after a finished rewrite: the rewrite stands (verified,
/// nothing to resume), the verdict is "unreliable", saying so. Other errors stay errors.
fn cut_short(before: Option<&bench::BenchResult>, e: Error) -> Result<Option<verdict::Verdict>> {
    let Error::Stopped { signal, .. } = e else { return Err(e) };
    log::warn!("the benchmark after the rewrite was stopped by {signal}: the rewrite itself is complete and verified");
    Ok(before.map(|_| verdict::Verdict {
        verdict: verdict::Finding::Unreliable,
        rule: format!("the benchmark after the rewrite was stopped by {signal}: nothing to compare"),
        speedup: 1.0,
        p_value: 1.0,
        needed_effect: verdict::MIN_EFFECT,
        ..verdict::Verdict::default()
    }))
}

/// A stop during the before-benchmark: nothing was written.
pub(crate) fn before_writing(e: Error) -> Error {
    match e {
        Error::Stopped { signal, .. } => Error::Stopped {
            signal,
            what: "interrupted before anything was written (during the benchmark before the rewrite)".into(),
        },
        e => e,
    }
}
