//! Device mode: `reseq rewrite DEVICE`, plan then act, through the steps of
//! [`crate::rewrite::sequence`].
//!
//! Acting means: open the device (exclusively if nothing is mounted), claim every
//! unmounted partition of a whole disk so nothing can be mounted behind our back, check
//! the chunk an earlier run left in flight, start the journal, fork the guardian (before
//! any thread exists), install the signal handlers, and hand over to the engine.

mod describe;
pub(crate) mod plan;

use describe::describe_plan;

use std::fs::File;

use crate::engine::journal::Journal;
use crate::engine::target::BlockTarget;
use crate::engine::{self, Everything, Planner, Selected};
use crate::host::freeze::Thawed;
use crate::host::holes::{Backing, SkipHoles};
use crate::host::in_use::Environment;
use crate::host::trim::{self, TrimReport, TrimTarget};
use crate::host::usedspace::{FsSpan, UsedSpace};
use crate::measure::passes as measure;
use crate::measure::probe::{self, Probe};
use crate::measure::readbench::{Target, resolve_params};
use crate::measure::scan::Selection;
use crate::measure::{scan, verdict};
use crate::options::rewrite::RewriteOptions;
use crate::report::{Report, SpaceReport};
use crate::rewrite::before::{self, before_writing, bench_after};
use crate::rewrite::checks;
use crate::rewrite::sequence::{self, run_record};
use crate::support::error::{Error, Result};
use crate::support::output::Progress;
use crate::support::signals::StopFlag;
use crate::support::units::human_bytes;
use crate::sys::memory::AlignedBuf;
use plan::{RewritePlan, Start};

pub(super) fn plan_and_execute(o: &RewriteOptions, env: &Environment, quiet: bool, report: &mut Report) -> Result<()> {
    let plan = plan::plan_rewrite(o, env)?;
    report.set_plan(crate::report::Planned {
        device: Some(&plan.device),
        engine: &plan.engine,
        chunks_total: plan.engine.chunks_total(),
        files: None,
        filesystems: &plan.filesystems,
        resume_from_chunk: if let Start::Resume { done, .. } = plan.start { done } else { 0 },
        max_freeze: plan.needs_freeze().then_some(plan.max_freeze),
        hung_task_timeout: plan.hung_task_timeout,
        journal_path: &plan.journal_path,
        warnings: &plan.warnings,
        holes: Some(&plan.holes),
    });
    report.pipeline_depth = Some(plan.depth.clone());
    if plan.needs_freeze() {
        report.freeze_bound = Some(crate::host::freeze::bound_report(plan.max_freeze));
    }
    report.guardian = plan.guardian.as_ref().map(|p| p.describe());
    // A dry run's plan lists its warnings: logged too, each would be said twice.
    for w in plan.warnings.iter().filter(|_| !o.dry_run) {
        log::warn!("{w}");
    }
    if o.dry_run {
        report.plan_text = Some(describe_plan(&plan));
        report.prediction = plan.prediction.clone();
        return Ok(());
    }
    if plan.unfinished.is_some() {
        // Refused once the device is taken (what the last run left is checked first):
        // nothing to benchmark or scan for a run that will not write.
        return execute(&plan, quiet, false, report);
    }
    if o.run.only_slow || o.run.from_scan.is_some() {
        let sel = select_slow(&plan, o).map_err(before_writing)?;
        let nothing = sel.chosen.is_empty();
        report.selection = Some(sel);
        if nothing {
            log::info!("no region reads slowly: nothing to rewrite");
            // A resumed run that finds nothing slow any more is finished: its journal
            // says so, or every later run would resume it again.
            if let Start::Resume { .. } = plan.start {
                Journal::append_to(&plan.journal_path)?.finished()?;
            }
            return Ok(());
        }
    }
    if o.run.bench { execute_with_bench(&plan, o, quiet, report) } else { execute(&plan, quiet, false, report) }
}

/// For a whole disk with some partitions mounted, claims the unmounted ones with O_EXCL:
/// while we hold them nobody can mount them, so no unfrozen filesystem appears mid-run.
fn claim_unmounted_partitions(plan: &RewritePlan) -> Result<Vec<File>> {
    let mounted: Vec<(u32, u32)> = plan.filesystems.iter().map(|f| f.dev_num).collect();
    let mut held = Vec::new();
    if !plan.needs_freeze() {
        return Ok(held); // the whole disk itself is held with O_EXCL
    }
    for (name, dev) in &plan.device.partitions {
        if mounted.contains(dev) {
            continue;
        }
        let path = std::path::PathBuf::from(format!("/dev/{name}"));
        match crate::sys::block::open_exclusive(&path) {
            Ok(f) => held.push(f),
            Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => {
                let mounts = crate::host::mounts::read_mounts().unwrap_or_default();
                return Err(checks::busy_unmounted(&path, *dev, &mounts));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::refused(
                    format!("partition {name} has no device node at {} to hold it unmountable", path.display()),
                    "create the node (no udev here?) or target the partitions one by one",
                ));
            }
            Err(e) => return Err(Error::io(format!("opening {}", path.display()), e)),
        }
    }
    Ok(held)
}

/// Re-reads the chunks an interrupted run had begun and not finished, and compares each
/// with the blake3 it had been read with.
fn reverify_in_flight(target: &dyn BlockTarget, plan: &RewritePlan) -> Result<Option<String>> {
    let Start::Resume { in_flight, killed_mid_write, .. } = &plan.start else { return Ok(None) };
    let mut outcome = None;
    for (offset, len, expected) in in_flight {
        let changed = reverify_chunk(target, plan, *offset, *len as usize, expected, killed_mid_write.as_deref())?;
        if changed || outcome.is_none() {
            outcome = Some(if changed { "changed" } else { "intact" }.to_string());
        }
    }
    Ok(outcome)
}

/// Whether one chunk in flight changed (allowed only under a mounted filesystem).
fn reverify_chunk(
    target: &dyn BlockTarget,
    plan: &RewritePlan,
    offset: u64,
    len: usize,
    expected: &str,
    killed_mid_write: Option<&[crate::engine::journal::InFlightCheck]>,
) -> Result<bool> {
    // What the guardian found there when it killed reseq, still frozen, if this chunk's
    // write was one it had granted and not heard back about (any other was read back).
    let at_kill =
        killed_mid_write.and_then(|c| c.iter().find(|c| c.offset == offset && c.len == len as u64)).map(|c| c.intact);
    let chunk = offset / plan.engine.chunk_size;
    let bytes = format!("chunk {chunk} (device bytes {offset}..{})", offset + len as u64);
    let mut buf = AlignedBuf::new(len, target.mem_align());
    target.read_at(&mut buf, offset).map_err(|e| Error::io_at("re-reading the chunk in flight", offset, e))?;
    let now = blake3::hash(&buf).to_hex().to_string();
    if now == *expected {
        log::info!("chunk {chunk} (offset {offset}), in flight when the last run stopped, is intact");
        Ok(false)
    } else if plan.needs_freeze() && matches!(at_kill, Some(Some(false))) {
        Err(Error::refused(
            format!(
                "{bytes} was being written when the guardian killed reseq (the write stalled past the freeze bound, often a failing device), and the guardian found it torn before it thawed: those bytes are not the data, and nothing kept the original (blake3 {expected})"
            ),
            "restore those bytes from a backup and check the filesystem (fsck -n, the application's own checks), then --restart",
        ))
    } else if plan.needs_freeze() && matches!(at_kill, Some(None)) {
        // A write that stalled past the bound is a failing device's sign; it may have
        // torn, and nothing kept its bytes (reseq was killed before the write returned).
        Err(Error::refused(
            format!(
                "{bytes} was being written when the guardian killed reseq (the write stalled past the freeze bound, often a failing device), and it changed since (blake3 now {now}, the journal's {expected}): either the mounted filesystem wrote there after the thaw, or the write tore, and the guardian could not read it back to tell"
            ),
            "check the device's health (dmesg, smartctl) and the filesystem (fsck -n, the application's own checks); once satisfied, --restart starts over",
        ))
    } else if plan.needs_freeze() {
        log::info!(
            "chunk {chunk} (offset {offset}) changed since the last run stopped: the mounted filesystem wrote there after the thaw, as it may"
        );
        Ok(true)
    } else {
        // Nothing writes an unmounted device that reseq held exclusively, so this is a
        // torn or failed write, or a writer that should not be there. Rewriting would
        // bless whatever is there now as the data.
        Err(Error::refused(
            format!(
                "{bytes} of the unmounted device changed since the last run stopped (blake3 now {now}, the journal's {expected}): a torn or failed write, or another writer. reseq will not continue over it"
            ),
            "find out what wrote there; restore those bytes (the journal records their blake3; a rescue copy, if any, is in the state directory: reseq restore) from a backup, then run again with --restart",
        ))
    }
}

/// `rewrite --bench`: the same reads before and after, and the verdict.
fn execute_with_bench(plan: &RewritePlan, o: &RewriteOptions, quiet: bool, report: &mut Report) -> Result<()> {
    let in_use = match bench_before(plan, o)? {
        Some(b) => {
            (report.bench_before, report.scan_before) = (Some(b.bench), Some(b.scan));
            b.in_use
        }
        None => None,
    };
    execute(plan, quiet, true, report)?;
    // The same bytes as before: the ranges in use then (what the rewrite rewrote).
    let stop = StopFlag::install().map_err(|e| Error::io("installing signal handlers", e))?;
    let target = || Target::open_in_use(&plan.device.path, in_use.as_deref()).map(|t| t.0);
    if !bench_after(report, &o.bench_opts, &stop, target)? {
        return Ok(());
    }
    // What the filesystems freed meanwhile, the run's FITRIM discarded, and it reads
    // fast: the same ranges are then not the same data. (Without a trim, freed blocks
    // keep their data and their speed.)
    let trimmed = report.space.as_ref().and_then(|s| s.bytes_trimmed).is_some_and(|t| t > 0);
    let measured = report.bench_after.as_ref().map_or(0, |b| b.params.length_bytes);
    if let (Some(then), true) = (&in_use, trimmed) {
        match crate::host::in_use::in_use_ranges(&plan.device.path) {
            Ok(Some(now)) => {
                let freed = verdict::bytes_freed(then, &now, measured);
                report.verdict = report.verdict.take().map(|v| verdict::with_freed(v, freed, measured));
            }
            Ok(None) => log::warn!("the filesystems are gone: bytes freed during the run not checked"),
            Err(e) => log::warn!("bytes freed during the run not checked: {e}"),
        }
    }
    Ok(())
}

/// The benchmark before a device-mode run, kept beside the journal.
fn bench_before(plan: &RewritePlan, o: &RewriteOptions) -> Result<Option<before::Before>> {
    before::bench_before(matches!(plan.start, Start::Resume { .. }), &plan.journal_path, || {
        log::info!("benchmarking before the rewrite");
        // Only the ranges in use, the same ones before and after: the run's FITRIM makes
        // free space fast, which is not the data.
        let (target, in_use) = Target::open_in_use(&plan.device.path, None)?;
        let (bench, scan) = measure::measure_target(&target, &o.bench_opts)?;
        Ok(before::Before { bench, scan, in_use })
    })
}

/// The regions to rewrite for --only-slow (a scan now) or --from-scan (a saved one).
fn select_slow(plan: &RewritePlan, o: &RewriteOptions) -> Result<Selection> {
    if let Some(path) = &o.run.from_scan {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let saved: Report = serde_json::from_str(&text)
            .map_err(|e| Error::Usage(format!("{} is not a reseq report: {e}", path.display())))?;
        let scan = saved
            .scan
            .ok_or_else(|| Error::Usage(format!("{} holds no scan (use reseq scan --json)", path.display())))?;
        let covered: u64 = scan.regions.iter().map(|r| r.length_bytes).sum();
        // A scan of the ranges in use names its device ranges; one of the whole device
        // must cover it.
        let in_use_scan = scan.regions.iter().any(|r| !r.device_ranges.is_empty());
        if !in_use_scan && (scan.params.offset_bytes != 0 || covered != plan.total_bytes()) {
            return Err(Error::refused(
                format!(
                    "the saved scan covers {covered} bytes from offset {}, not this whole device",
                    scan.params.offset_bytes
                ),
                "scan the whole device (reseq scan DEVICE --json), or use --only-slow",
            ));
        }
        return sure_selection(&scan, path.display().to_string());
    }
    log::info!("scanning {} in {} regions to find the slow ones", plan.device.path.display(), o.run.scan_regions);
    // In-use ranges only: trimmed free space reads fast and would make every used region
    // look slow.
    let (target, _) = Target::open_in_use(&plan.device.path, None)?;
    let params = resolve_params(&target, o.bench_opts.block_size, o.bench_opts.queue_depth, 0, None)?;
    let scan = scan::scan(&target, &params, (o.run.scan_regions, crate::measure::noise::ROUNDS), o.run.slow_threshold)?;
    sure_selection(&scan, "scan in this run".into())
}

/// The slow regions of a scan, refused when its readings of one region differ more than
/// an effect could: on a busy host, a scan flagged a random third of a device without an
/// FTL slow at each of its readings.
fn sure_selection(scan: &scan::ScanResult, source: String) -> Result<Selection> {
    if scan.sureness.noisy() {
        return Err(Error::refused(
            format!("--only-slow cannot tell which regions read slowly: {}", scan.sureness.words),
            "run it again when the host is quieter (nothing was written)",
        ));
    }
    Ok(Selection::from_scan(scan, source))
}

/// FITRIM of the filesystems' free space, in paced slices; with `bench`, a light read
/// probe of the data in use before and during it.
fn trim_free_space(plan: &RewritePlan, spans: &[FsSpan], bench: bool, stop: &StopFlag, thawed: &Thawed) -> TrimReport {
    let targets: Vec<TrimTarget> = spans
        .iter()
        .map(|s| TrimTarget { name: s.fs.mount_point.display().to_string(), fd: s.fd(), start: 0, end: s.len })
        .collect();
    crate::support::hooks::point("before-trim");
    log::info!(
        "trimming the free space of {} filesystem(s) in slices, pace {}",
        targets.len(),
        plan.trim_pace.describe()
    );
    // The ranges in use now, after the rewrite: the data readers want.
    let in_use = || crate::host::in_use::in_use_ranges(&plan.device.path);
    let probe = bench.then(|| in_use().and_then(|r| Probe::open(&plan.device.path, r.as_deref()))).and_then(|p| {
        p.inspect_err(|e| log::warn!("no read probe during the trim: {}", crate::support::error::error_chain(e))).ok()
    });
    let t = match probe {
        Some(p) => probe::run_probed(&targets, plan.trim_pace, stop, thawed, std::sync::Arc::new(p)),
        None => trim::run(&targets, plan.trim_pace, stop, thawed),
    };
    log::info!(
        "FITRIM discarded {} of free space in {} slice(s), {:.1} s (slowest slice {:.3} s)",
        human_bytes(t.bytes_trimmed),
        t.slices,
        t.seconds,
        t.slowest_slice_seconds
    );
    if let Some(p) = &t.probe {
        log::info!("{}", p.text().trim());
    }
    t
}

/// Steps 2-3 of [`sequence`] for a device: the device taken and checked for what an
/// earlier run left, then (device mode's own) the unmounted partitions of a whole disk
/// claimed and the chunks the last run left in flight re-read.
fn take_device(plan: &RewritePlan, report: &mut Report) -> Result<(sequence::Taken, Vec<File>)> {
    let state_dir = plan.journal_path.parent().unwrap_or(std::path::Path::new("."));
    let taken = sequence::take_device(&sequence::Taking {
        state_dir,
        device: &plan.device,
        shown: plan.device.path.display().to_string(),
        mounted: plan.needs_freeze(),
        unfinished: plan.unfinished.as_ref(),
    })?;
    let claims = claim_unmounted_partitions(plan)?;
    report.in_flight_reverify = reverify_in_flight(&taken.device, plan)?;
    Ok((taken, claims))
}

/// Runs the plan: the engine over the device in freeze windows, then the FITRIM.
fn execute(plan: &RewritePlan, quiet: bool, bench: bool, report: &mut Report) -> Result<()> {
    crate::support::hooks::point("planned");
    let stop = sequence::ready_to_write()?;
    let (taken, _claims) = take_device(plan, report)?;
    // Before the journal: a refusal here leaves nothing behind.
    let backing = backing_of(plan)?;
    let mut journal = start_journal(plan)?;
    let journal_path = journal.path().to_path_buf();
    let selection = report.selection.as_ref();
    let w = sequence::windows(
        &plan.device,
        || sequence::guardian(&guarded(plan), &journal_path),
        || Ok((progress_of(plan, selection, quiet), used_space(plan)?)),
        |(progress, used), guard| {
            let mut everything = Everything;
            let base: &mut dyn Planner = if plan.used_space.is_empty() { &mut everything } else { used };
            let mut holes = None;
            let base: &mut dyn Planner = match &backing {
                Some(b) => holes.insert(skip_holes(plan, base, b)),
                None => base,
            };
            let mut selected;
            let planner: &mut dyn Planner = match selection {
                Some(sel) => {
                    selected = Selected { inner: base, selected: sel.ranges() };
                    &mut selected
                }
                None => base,
            };
            let (stats, result) =
                engine::run(&taken.device, &plan.engine, planner, guard, &mut journal, progress, &stop);
            let in_holes = holes.as_mut().map_or(0, |h| h.skipped(stats.next_offset_bytes));
            (stats, result, in_holes)
        },
    )?;
    let ((progress, used), (mut stats, mut result, in_holes)) = (w.prepared, w.ran);
    if let Start::Resume { done, .. } = plan.start {
        stats.chunks_already_done = done;
    }
    // Thawed: FITRIM runs on live filesystems, never inside a window.
    let mut space = space_report(plan, report, &stats, in_holes);
    result = trim_after(plan, (&used, bench, &stop, &w.thawed), &stats, result, &mut space);
    report.space = Some(space);
    progress.finish();
    discard_if_untouched(plan, &journal, &result, &stats);
    report.results = Some(stats);
    report.write_cost = Some(w.cost.end());
    result
}

/// The filesystems' used space, for the planner of a used-space run (none: the whole
/// range).
fn used_space(plan: &RewritePlan) -> Result<UsedSpace> {
    let spans = plan
        .used_space
        .iter()
        .map(|(fs, start, len)| FsSpan::open(fs.clone(), *start, *len))
        .collect::<Result<Vec<_>>>()?;
    Ok(UsedSpace { spans, align: u64::from(plan.device.dio_offset_align) })
}

/// A refusal at the first freeze (EBUSY, EOPNOTSUPP) means nothing was done. The
/// journal is only written when needed, so there is none, unless the state directory
/// is on a frozen filesystem (it is written before the freeze then): remove that one,
/// so the next run does not ask for --resume.
fn discard_if_untouched(plan: &RewritePlan, journal: &Journal, result: &Result<()>, stats: &engine::EngineStats) {
    let untouched = matches!(plan.start, Start::Fresh) && stats.chunks_written == 0;
    if matches!(result, Err(Error::Refused { .. })) && untouched {
        if journal.created() {
            let _ = std::fs::remove_file(journal.path());
        }
        before::Before::discard(&plan.journal_path);
    }
}

/// `base` less the holes of the device's backing file, mapped in each window, a bounded
/// share of data at a time (a little more than a window writes when frozen).
fn skip_holes<'a>(plan: &RewritePlan, base: &'a mut dyn Planner, backing: &'a Backing) -> SkipHoles<'a> {
    let align = u64::from(plan.device.dio_offset_align).max(512);
    use crate::host::holes::{FROZEN_DATA, UNFROZEN_DATA};
    let max_data = if plan.needs_freeze() { FROZEN_DATA } else { UNFROZEN_DATA };
    let max_data = if backing.is_thin() { max_data.min(crate::host::thin::THIN_DATA) } else { max_data };
    SkipHoles::new(base, backing, align, Some(max_data))
}

/// The device's backing file, for its hole map, when the plan read one: it must still be
/// the file the loop holds (`Backing::of` checks), or the run is refused.
fn backing_of(plan: &RewritePlan) -> Result<Option<Backing>> {
    if !plan.holes.mapped {
        return Ok(None);
    }
    Backing::of(&plan.device, &crate::host::device::Sysfs::default()).map(Some).map_err(|why| {
        Error::refused(
            format!("the hole map of {} read at planning cannot be read again: {why}", plan.device.path.display()),
            "check what changed below the device (losetup -l), then run reseq again",
        )
    })
}

/// Step 8 of [`sequence`], device mode's own: the FITRIM of free space, on thawed
/// filesystems. Only after a run that did something: a refused run (someone else's
/// freeze, no freeze support) must leave the device exactly as it was, free space
/// included. Never after a lost freeze: the filesystem may be frozen by someone else, and
/// is not ours to touch until the admin has looked. Not after a stop signal either: the
/// run that finishes the rewrite trims.
fn trim_after(
    plan: &RewritePlan,
    (used, bench, stop, thawed): (&UsedSpace, bool, &StopFlag, &Thawed),
    stats: &engine::EngineStats,
    result: Result<()>,
    space: &mut SpaceReport,
) -> Result<()> {
    // Not after someone else's freeze either: lost mid-window, or met as a window began
    // (FIFREEZE's EBUSY, host/freeze.rs): it may still be in place, and a FITRIM would
    // wait on it.
    let foreign = match &result {
        Err(Error::FreezeLost { .. }) => true,
        Err(Error::Io { source, .. }) => source.raw_os_error() == Some(nix::libc::EBUSY),
        _ => false,
    };
    let ran = (result.is_ok() || stats.bytes_written > 0) && !foreign;
    if !(plan.trim && ran && !used.spans.is_empty() && stop.signal().is_none()) {
        return result;
    }
    let t = trim_free_space(plan, &used.spans, bench, stop, thawed);
    space.bytes_trimmed = Some(t.bytes_trimmed);
    let result = result.and_then(|()| trim_stopped(&t));
    space.trim = Some(t);
    result
}

/// A new journal for a fresh run (its first record is the plan; written when the run
/// first needs it), or the unfinished one.
fn start_journal(plan: &RewritePlan) -> Result<Journal> {
    let e = &plan.engine;
    match &plan.start {
        // Written at the first write: a run refused before it leaves the old journal.
        Start::Fresh => Ok(Journal::deferred(
            &plan.journal_path,
            run_record(&plan.device.identity, e.chunk_size, (e.range_start, e.range_end), Some(plan.options.clone())),
            None,
        )),
        Start::Resume { .. } => Journal::append_to(&plan.journal_path),
    }
}

/// What the guardian freezes and every window checks, for the plan's device.
fn guarded(plan: &RewritePlan) -> sequence::Guarded<'_> {
    sequence::Guarded {
        device: &plan.device,
        filesystems: &plan.filesystems,
        max_freeze: plan.max_freeze,
        placement: plan.guardian.as_ref(),
        writer_devices: plan.writer_devices.clone(),
        shape: &plan.shape,
        swap_among: None,
        wrote_before: false,
        btrfs_mount: None,
    }
}

/// The bar and its ETA count what will be written: with free space left out, the bytes
/// in use (mapped now, unfrozen: an estimate; each window maps again while frozen).
fn progress_of(plan: &RewritePlan, selection: Option<&Selection>, quiet: bool) -> Progress {
    let done_bytes = plan.engine.start_offset - plan.engine.range_start;
    if let Some(sel) = selection {
        // --only-slow: the chosen regions are the whole job.
        log::info!(
            "rewriting the {} slow region(s) chosen: {} of {}",
            sel.chosen.len(),
            human_bytes(sel.bytes_chosen),
            human_bytes(sel.bytes_chosen + sel.bytes_left_alone)
        );
        return Progress::new(sel.bytes_chosen, 0, quiet);
    }
    let in_use = || crate::host::in_use::in_use_ranges(&plan.device.path).ok().flatten();
    let (to_write, written_before) = match (!plan.used_space.is_empty()).then(in_use).flatten() {
        // The holes of a backing file are not written either: the plan's own ranges.
        _ if plan.holes.mapped => (plan.holes.bytes_to_rewrite, 0),
        Some(r) => {
            let below = |end: u64| r.iter().map(|&(o, l)| (o + l).min(end).saturating_sub(o)).sum::<u64>();
            (below(plan.engine.range_end), below(plan.engine.start_offset))
        }
        None => (plan.total_bytes(), done_bytes),
    };
    if to_write != plan.total_bytes() {
        log::info!(
            "{} of {} in use (an estimate, mapped before the run): progress and ETA count those",
            human_bytes(to_write),
            human_bytes(plan.total_bytes())
        );
    }
    let (n, max) = (plan.filesystems.len(), plan.max_freeze.as_secs_f64());
    let freezing =
        plan.needs_freeze().then(|| format!(", freezing {n} filesystem(s) for at most {max:.3} s per window"));
    log::info!(
        "rewriting {} ({}) in {} chunks of {}{}",
        plan.device.path.display(),
        human_bytes(plan.total_bytes()),
        (plan.total_bytes() - done_bytes).div_ceil(plan.engine.chunk_size),
        human_bytes(plan.engine.chunk_size),
        freezing.unwrap_or_default()
    );
    Progress::new(to_write, written_before, quiet)
}

/// What the run covered and left out (`in_holes`: passed over as holes of the backing file).
fn space_report(plan: &RewritePlan, report: &Report, stats: &engine::EngineStats, in_holes: u64) -> SpaceReport {
    let covered = stats.next_offset_bytes - plan.engine.start_offset;
    SpaceReport {
        mode: if plan.used_space.is_empty() { "everything" } else { "used_space" }.into(),
        // Covered but not written: free space, holes, and regions --only-slow left alone.
        bytes_skipped_as_free: if plan.used_space.is_empty() {
            0
        } else {
            let left_alone = report.selection.as_ref().map_or(0, |s| s.bytes_left_alone);
            covered.saturating_sub(stats.bytes_written).saturating_sub(left_alone).saturating_sub(in_holes)
        },
        bytes_skipped_as_holes: in_holes,
        bytes_trimmed: None,
        trim: None,
    }
}

/// A stop signal during the FITRIM after a finished rewrite.
fn trim_stopped(t: &TrimReport) -> Result<()> {
    let Some(sig) = &t.stopped_by else { return Ok(()) };
    Err(Error::Stopped {
        signal: sig.clone(),
        what: format!(
            "the rewrite had finished and is verified; the FITRIM after it stopped between slices after {} slice(s), {} discarded. The rest of the free space is discarded by fstrim or the next run",
            t.slices,
            human_bytes(t.bytes_trimmed)
        ),
    })
}
