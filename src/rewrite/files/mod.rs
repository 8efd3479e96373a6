//! File mode: `reseq rewrite FILE|DIR...` re-sequences the blocks of files on a mounted
//! ext2/3/4, xfs or btrfs filesystem (btrfs: [`mirrors`]), in short freeze windows, while applications keep writing.
//!
//! A plan and a run, as device mode: [`plan`] checks the files, their filesystems and
//! devices, decides about an interrupted run and chooses the files; the dry run prints
//! that plan, and [`run`] executes it, one filesystem at a time, through the same steps
//! as device mode ([`crate::rewrite::sequence`]). The engine is the device engine,
//! unchanged; [`planner`] makes files look like a device to it. One engine run rewrites
//! the files of one filesystem, in the order of their first block, so that their I/O
//! overlaps and files laid out one after another are rewritten in large chunks; its
//! journal (files keyed by device and inode) lets a later run resume it where it stopped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::engine::EngineStats;
use crate::engine::journal::FileIdentity;
use crate::options::rewrite::RewriteOptions;
use crate::report::Report;
use crate::support::error::Result;
use crate::support::output::Progress;
use crate::support::signals::StopFlag;
use crate::support::units::now_rfc3339;

mod extents;
mod hot;
mod layout;
mod mirrors;
mod plan;
mod plan_report;
mod planner;
pub mod record;
mod refreshed;
mod run;
mod select;

use plan::FilesPlan;
use run::FileRun;

/// The maps' lock, whether or not an earlier holder panicked.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `reseq rewrite FILE|DIR...`: plans, then (unless a dry run) executes. The depth is
/// chosen after the plan, over the bytes it rewrites.
pub(crate) fn plan_and_execute(o: &RewriteOptions, quiet: bool, report: &mut Report) -> Result<()> {
    let mut plan = plan::plan(o, report)?;
    layout::choose_depth(&mut plan, report);
    plan_report::record_plan(&plan, report);
    if plan.options.dry_run {
        let predicted = layout::predict(&plan, report);
        let (text, detail) = plan::describe(&plan, report, predicted.as_ref());
        (report.plan_text, report.plan_detail) = (Some(text), Some(detail));
        return Ok(());
    }
    execute_plan(&plan, quiet, report)
}

/// The run of a plan: the benchmark before (`--bench`), each filesystem through the
/// steps of [`crate::rewrite::sequence`], the benchmark after, the files' reports.
fn execute_plan(plan: &FilesPlan, quiet: bool, report: &mut Report) -> Result<()> {
    let o = &plan.options;
    let measured = plan.measured();
    // A run to be refused (an unfinished run) benchmarks nothing first.
    if o.run.bench
        && plan.unfinished.is_none()
        && let Some(b) = bench_before(plan, &measured)?
    {
        (report.bench_before, report.scan_before) = (Some(b.bench), Some(b.scan));
    }
    let stop = crate::rewrite::sequence::ready_to_write()?;
    let (mut progress, files_total, files_done) = overall_progress(plan, quiet);
    let finished = Arc::new(std::sync::atomic::AtomicUsize::new(files_done));
    progress.count_files(Arc::clone(&finished), files_total);
    let mut run = FileRun {
        plan,
        stop: &stop,
        record_header: record_header(o, plan.earlier.as_ref()),
        record_written: Arc::default(),
        progress,
        files_done,
        files_total,
        finished,
        totals: EngineStats::default(),
        reports: Vec::new(),
        cost: None,
        findings: Vec::new(),
    };
    let outcome = run.groups();
    run.progress.close();
    let result = run.finish(outcome?.into_result(), &measured, report);
    // A run that wrote nothing and did not finish (refused) leaves the state as it was.
    let wrote = result.is_ok() || report.results.as_ref().is_some_and(|r| r.bytes_written > 0);
    if !wrote && plan.earlier.is_none() {
        crate::rewrite::before::Before::discard(&plan.record_path);
    }
    chosen_files_done(plan, report, wrote);
    result
}

/// The benchmark before a file-mode run, kept beside the run's record.
fn bench_before(plan: &FilesPlan, measured: &[&Path]) -> Result<Option<crate::rewrite::before::Before>> {
    use crate::rewrite::before::{self, Before};
    before::bench_before(plan.earlier.is_some(), &plan.record_path, || {
        log::info!("benchmarking {} file(s) before the rewrite", measured.len());
        let target = crate::measure::passes::files_target(measured)?;
        let (bench, scan) = crate::measure::passes::measure_target(&target, &plan.options.bench_opts)?;
        Ok(Before { bench, scan, in_use: None })
    })
}

/// After a run that chose files: each chosen file's report says why, and a run that
/// chose by age and wrote records what it refreshed (other runs leave the state
/// directory as they found it).
fn chosen_files_done(plan: &FilesPlan, report: &mut Report, wrote: bool) {
    let o = &plan.options;
    if o.run.older_than.is_some() && wrote {
        refreshed::remember(&o.state_dir, report.files.as_deref().unwrap_or_default());
    }
    if let Some(c) = &plan.choice {
        let paths: Vec<PathBuf> = plan.planned.iter().map(|p| p.path.clone()).collect();
        say_why(report, &paths, c);
    }
}

/// Each chosen file's report says why it was chosen, and how fast it read if it was read.
fn say_why(report: &mut Report, paths: &[PathBuf], c: &select::Choice) {
    let why: HashMap<String, &String> = c.chosen.iter().map(|(i, w)| (paths[*i].display().to_string(), w)).collect();
    let read = c.summary.scan.iter().flat_map(|s| s.files.iter()).map(|f| (f.path.clone(), f.bytes_per_second));
    let read: HashMap<String, f64> = read.collect();
    for f in report.files.iter_mut().flatten() {
        f.chosen_because = why.get(&f.path).map(|w| (*w).clone());
        f.read_bytes_per_second = read.get(&f.path).copied();
    }
}

/// The run's record: the interrupted run's, with the files it finished, or a new one.
/// Written with the first journal, before the first write (killed after it, the next
/// run knows an unfinished run is there); a run refused before that writes nothing.
fn record_header(o: &RewriteOptions, earlier: Option<&record::Earlier>) -> (record::RunHeader, Vec<FileIdentity>) {
    let header = match earlier {
        Some(e) => e.header.clone(),
        None => record::RunHeader {
            targets: record::canonical_targets(&o.targets),
            options: o.run.clone(),
            started_at: now_rfc3339(),
        },
    };
    (header, earlier.iter().flat_map(|e| e.done.values()).cloned().collect())
}

/// One progress over every file to rewrite (not one per engine run, which would start
/// again for each batch of small files), over the bytes the run will rewrite (their
/// written extents, not their sizes: holes and unwritten ranges are not rewritten), and
/// how many files that is and are already done (by the interrupted run a resumed one
/// continues).
fn overall_progress(plan: &FilesPlan, quiet: bool) -> (Progress, usize, usize) {
    let (mut bytes, mut already, mut files, mut done) = (0, 0, 0, 0);
    let chosen = |(fi, _): &(usize, &plan::Planned)| !plan.left_alone.contains_key(fi);
    for (fi, p) in plan.planned.iter().enumerate().filter(chosen) {
        if std::fs::metadata(&p.path).map_or(0, |m| m.len()) == 0 {
            continue;
        }
        let to_rewrite = plan.to_rewrite[fi];
        (bytes, files) = (bytes + to_rewrite, files + 1);
        if plan.done_before.contains_key(&fi) {
            (already, done) = (already + to_rewrite, done + 1);
        }
    }
    let mut progress = Progress::new(bytes, already, quiet).spanning();
    progress.set_message(format!("{done} of {files} files"));
    (progress, files, done)
}

/// The benchmark after the rewrite, of the files still there (files deleted during the
/// run are not read after it, nor at the re-check those deleted by then).
pub(super) fn bench_after(o: &RewriteOptions, stop: &StopFlag, measured: &[&Path], report: &mut Report) -> Result<()> {
    let target = || {
        let left: Vec<&Path> = measured.iter().copied().filter(|p| p.exists()).collect();
        crate::measure::passes::files_target(&left)
    };
    crate::rewrite::before::bench_after(report, &o.bench_opts, stop, target).map(drop)
}
