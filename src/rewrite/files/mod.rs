//! File mode: `reseq rewrite FILE|DIR...` re-sequences the blocks of files on a mounted
//! ext2/3/4 or xfs filesystem, in short freeze windows, while applications keep writing.
//!
//! The engine is the device engine, unchanged; [`planner`] makes files look like a
//! device to it. A large file gets an engine run of its own, and a journal (keyed by
//! device and inode) that lets a run resume it where it stopped. Small files are
//! rewritten up to [`BATCH_FILES`] to one engine run, so that their I/O overlaps and
//! files laid out one after another are rewritten in large chunks; a freeze window kept
//! open (see [`Batched`]) serves the next run while time is left in it.
//!
//! Everything else is the device mode's: the guardian owns every freeze, a chunk's read
//! and write lie inside one window, and every chunk is verified.

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cli::RewriteArgs;
use crate::engine::journal::{self, FileIdentity, Journal, RunRecord};
use crate::engine::target::{BlockTarget, DirectDevice};
use crate::engine::{self, EngineConfig, EngineStats};
use crate::host::device::{self, Sysfs};
use crate::host::freeze::{Batched, GuardedFreeze, WindowGuard, WritersChecked};
use crate::host::mounts::{self, MountedFs};
use crate::options::resume::RunOptions;
use crate::report::{FileReport, Report, now_rfc3339};
use crate::support::error::{Error, Result};
use crate::support::output::Progress;
use crate::support::signals::StopFlag;
use crate::support::units::{self, human_bytes};
use crate::sys;

mod planner;
pub mod record;
pub use planner::{Extent, plan_extents};
use planner::{FileTarget, FilesPlanner, Map, Member, SharedClaims, UNWRITTEN};

/// Filesystems file mode refuses, with why.
fn refuse_fs(fs_type: &str) -> Option<(String, String)> {
    let remote = ["nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "virtiofs", "afs", "glusterfs", "lustre"];
    Some(match fs_type {
        "btrfs" => (
            "btrfs: FIEMAP's physical addresses are btrfs logical addresses, not device offsets; writing there could hit metadata".into(),
            "on btrfs, `btrfs balance start -d` rewrites data".into(),
        ),
        "tmpfs" | "ramfs" | "devtmpfs" => (format!("{fs_type} lives in memory: there is no SSD layout to fix"), "nothing to do".into()),
        "overlay" => ("overlayfs: its files live on another filesystem".into(), "run reseq on the underlying (upper) directory".into()),
        t if t.starts_with("fuse") => (format!("{t} is a FUSE filesystem: its blocks are not reseq's to map"), "run reseq on the backing storage".into()),
        t if remote.contains(&t) => (format!("{t} is a network filesystem"), "run reseq on the server".into()),
        t if !crate::host::usedspace::SUPPORTED.contains(&t) => {
            (format!("{t} is not supported by file mode (ext2/3/4 and xfs are)"), "rewrite the device instead".into())
        }
        _ => return None,
    })
}

/// A file to rewrite, and the filesystem it is on.
struct Planned {
    path: PathBuf,
    fs: usize,
}

/// Files under the targets (directories recursively, on one filesystem each), minus the
/// excluded ones, in path order.
fn collect(args: &RewriteArgs) -> Result<Vec<PathBuf>> {
    let patterns: Vec<glob::Pattern> = args
        .exclude
        .iter()
        .map(|p| glob::Pattern::new(p).map_err(|e| Error::Usage(format!("--exclude {p}: {e}"))))
        .collect::<Result<_>>()?;
    let excluded = |p: &Path| {
        patterns.iter().any(|g| g.matches_path(p) || p.file_name().is_some_and(|n| g.matches(&n.to_string_lossy())))
    };
    let mut out = Vec::new();
    for t in &args.targets {
        let md = std::fs::symlink_metadata(t).map_err(|e| Error::Usage(format!("cannot use {}: {e}", t.display())))?;
        if md.is_dir() {
            walk(t, md.dev(), &excluded, &mut out)?;
        } else if md.is_file() {
            if !excluded(t) {
                out.push(t.clone());
            }
        } else {
            return Err(Error::Usage(format!(
                "{} is neither a regular file nor a directory; a block device is rewritten on its own",
                t.display()
            )));
        }
    }
    out.sort();
    out.dedup();
    // Hard links: one inode, rewritten once (under its first path).
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| std::fs::metadata(p).map(|m| seen.insert((m.dev(), m.ino()))).unwrap_or(true));
    Ok(out)
}

fn walk(dir: &Path, dev: u64, excluded: &dyn Fn(&Path) -> bool, out: &mut Vec<PathBuf>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path();
        let md = entry.metadata().map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        if md.dev() != dev || excluded(&path) {
            continue; // one filesystem; excluded paths
        }
        if md.is_dir() {
            walk(&path, dev, excluded, out)?;
        } else if md.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// A filesystem holding some of the files, with its device.
struct FsGroup {
    fs: MountedFs,
    device: device::BlockDeviceInfo,
}

/// Checks every file's filesystem before anything is frozen or written.
fn check(args: &RewriteArgs, files: &[PathBuf]) -> Result<(Vec<FsGroup>, Vec<Planned>)> {
    let mounts = mounts::read_mounts().map_err(|e| Error::io("reading /proc/self/mountinfo", e))?;
    let sysfs = Sysfs::default();
    let mut groups: Vec<FsGroup> = Vec::new();
    let mut planned = Vec::new();
    for f in files {
        let md = std::fs::metadata(f).map_err(|e| Error::io(format!("stat {}", f.display()), e))?;
        let dev = (nix::sys::stat::major(md.dev()) as u32, nix::sys::stat::minor(md.dev()) as u32);
        let idx = match groups.iter().position(|g| g.fs.dev_num == dev) {
            Some(i) => i,
            None => {
                let abs = std::path::absolute(f).unwrap_or_else(|_| f.clone());
                // btrfs reports an anonymous st_dev (0:N), not its block device: find the
                // mount by path then, so that it is refused with the right reason.
                let entry = mounts
                    .iter()
                    .find(|m| m.dev == dev)
                    .or_else(|| mounts::mount_containing(&mounts, &abs))
                    .ok_or_else(|| {
                        Error::refused(
                            format!("{} is on no mounted filesystem reseq can see", f.display()),
                            "check mountinfo",
                        )
                    })?;
                if let Some((why, hint)) = refuse_fs(&entry.fs_type) {
                    return Err(Error::refused(format!("{}: {why}", f.display()), hint));
                }
                if entry.dev != dev {
                    return Err(Error::refused(
                        format!(
                            "{} is on a filesystem whose device reseq cannot identify ({} reports {}:{})",
                            f.display(),
                            entry.fs_type,
                            dev.0,
                            dev.1
                        ),
                        "rewrite the device instead",
                    ));
                }
                let fs = mounts::filesystems_on(&mounts, &[dev]).remove(0);
                if fs.read_only {
                    return Err(Error::refused(
                        format!("{} is on a read-only mount ({})", f.display(), fs.mount_point.display()),
                        "remount it read-write, or rewrite the device",
                    ));
                }
                if entry.dax {
                    return Err(Error::refused(
                        format!(
                            "{} is on a DAX mount: no FTL to fix, and mmap stores bypass the page cache",
                            f.display()
                        ),
                        "nothing to do",
                    ));
                }
                let (name, _) =
                    sysfs.name_of(dev).ok_or_else(|| Error::Internal(format!("no sysfs entry for {dev:?}")))?;
                let node = PathBuf::from(format!("/dev/{name}"));
                // Only a missing node is "no node"; any other failure says what it is.
                let device = match device::inspect(&node, &sysfs) {
                    Ok(d) => d,
                    Err(_) if !node.exists() => {
                        return Err(Error::refused(
                            format!(
                                "{} ({}) has no device node at {}",
                                fs.mount_point.display(),
                                fs.dev,
                                node.display()
                            ),
                            "create the node (no udev?) and run reseq again",
                        ));
                    }
                    Err(e) => return Err(e),
                };
                if device.read_only {
                    return Err(Error::refused(format!("{} is read-only", node.display()), "choose a writable device"));
                }
                groups.push(FsGroup { fs, device });
                groups.len() - 1
            }
        };
        if sys::statx_encrypted(f).unwrap_or(false) {
            return Err(Error::refused(
                format!(
                    "{} is fscrypt-encrypted: its blocks hold ciphertext reseq cannot read back through the file",
                    f.display()
                ),
                "rewrite the device instead",
            ));
        }
        planned.push(Planned { path: f.clone(), fs: idx });
    }
    if !args.force {
        // Every file mode window freezes a live filesystem.
        let max_freeze = units::parse_duration(args.max_freeze_or(crate::cli::DEFAULT_FILE_MAX_FREEZE))
            .map_err(|e| Error::Usage(format!("--max-freeze: {e}")))?;
        crate::rewrite::plan::check_freeze_length(max_freeze, false)?;
    }
    Ok((groups, planned))
}

fn file_identity(path: &Path, md: &std::fs::Metadata) -> FileIdentity {
    FileIdentity {
        dev: format!("{}:{}", nix::sys::stat::major(md.dev()), nix::sys::stat::minor(md.dev())),
        ino: md.ino(),
        birth_time: md
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as u64),
        path: path.display().to_string(),
        changed_ns: Some(md.ctime() as u64 * 1_000_000_000 + md.ctime_nsec() as u64),
    }
}

/// `reseq rewrite FILE|DIR...`.
pub fn run(args: &RewriteArgs, quiet: bool) -> (Report, Result<()>) {
    let started = Instant::now();
    let mut report = Report::new("rewrite", args.dry_run);
    report.targets = args.targets.iter().map(|t| t.display().to_string()).collect();
    let result = execute(args, quiet, &mut report);
    report.finish(started.elapsed(), &result);
    (report, result)
}

fn execute(args: &RewriteArgs, quiet: bool, report: &mut Report) -> Result<()> {
    let record_path = record::path_for(&crate::host::state_dir::resolve(&args.state_dir), &args.targets);
    let (earlier, mut unfinished) = earlier_run(args, &record_path)?;
    let resumed =
        earlier.as_ref().map(|e| e.header.options.apply(args, crate::cli::DEFAULT_FILE_MAX_FREEZE)).transpose()?;
    let args = resumed.as_ref().unwrap_or(args);
    let chunk_size = units::parse_size(&args.chunk_size).map_err(|e| Error::Usage(format!("--chunk-size: {e}")))?;
    let max_freeze = units::parse_duration(args.max_freeze_or(crate::cli::DEFAULT_FILE_MAX_FREEZE))
        .map_err(|e| Error::Usage(format!("--max-freeze: {e}")))?;
    let pause = units::parse_duration(&args.pause).map_err(|e| Error::Usage(format!("--pause: {e}")))?;
    let rate = crate::rewrite::plan::parse_rate(args)?;
    if max_freeze < Duration::from_millis(10) || chunk_size == 0 || args.read_ahead == 0 || args.max_overruns == 0 {
        return Err(Error::Usage(
            "--max-freeze must be >= 10ms; --chunk-size, --read-ahead, --max-overruns positive".into(),
        ));
    }
    if args.from_scan.is_some() || args.include_free || args.trim_rate.is_some() {
        return Err(Error::Usage(
            "file mode does not take --from-scan, --include-free or --trim-rate (they are about a device's regions and the FITRIM after a device run)".into(),
        ));
    }
    if !(args.slow_threshold > 0.0 && args.slow_threshold <= 1.0) {
        return Err(Error::Usage("--slow-threshold must be in (0, 1]".into()));
    }
    let files = collect(args)?;
    if files.is_empty() {
        return Err(Error::Usage("no regular files under the targets".into()));
    }
    crate::rewrite::plan::check_privileges()?;
    let (groups, planned) = check(args, &files)?;
    for g in &groups {
        if chunk_size % u64::from(g.device.dio_offset_align) != 0 {
            return Err(Error::Usage(format!(
                "--chunk-size must be a multiple of {} bytes on {}",
                g.device.dio_offset_align,
                g.device.path.display()
            )));
        }
    }
    if !groups.is_empty() {
        report.freeze_bound = Some(crate::host::freeze::bound_report(max_freeze));
    }
    if args.dry_run {
        report.plan_text = Some(describe(&groups, &planned, max_freeze));
        return Ok(());
    }
    // --only-slow: time each file's sequential read and leave the fast ones alone.
    let left_alone = if args.only_slow { slow_files(args, &planned)? } else { HashMap::new() };
    // --bench: the files to rewrite, read before and after.
    let measured: Vec<&Path> =
        (0..planned.len()).filter(|fi| !left_alone.contains_key(fi)).map(|fi| planned[fi].path.as_path()).collect();
    if args.bench {
        log::info!("benchmarking {} file(s) before the rewrite", measured.len());
        let (b, s) =
            crate::measure::passes::measure_files(&measured, &crate::cli::lower::bench_options(&args.bench_opts)?)?;
        (report.bench_before, report.scan_before) = (Some(b), Some(s));
    }
    // A cron job's priority: best-effort level 7 (ionice -c2 -n7), not the idle class:
    // an idle-class writer can be starved while the filesystem is frozen, stretching the
    // very stall the windows bound. Set before any thread starts, so all inherit it.
    if let Err(e) = sys::lower_io_priority() {
        log::warn!("could not lower the I/O priority: {e}");
    }
    let stop = StopFlag::install().map_err(|e| Error::io("installing signal handlers", e))?;
    sys::defer_job_control_stops().map_err(|e| Error::io("installing signal handlers", e.into()))?;
    let frozen: Vec<MountedFs> = groups.iter().map(|g| g.fs.clone()).collect();
    let state = crate::host::state_dir::prepare(&args.state_dir, &frozen, chunk_size * 2 + (1 << 20))?;
    let shared: SharedClaims = Arc::default();
    let run_start = Instant::now();
    let mut totals = EngineStats::default();
    let mut windows = 0;
    // Journals of files whose window is still open, and the files done in it: written
    // after it closes.
    let pending = Rc::new(RefCell::new(Pending {
        journals: Vec::new(),
        record: match &earlier {
            Some(e) => record::Record::resume(record_path, e)?,
            None => record::Record::new(
                record_path,
                record::RunHeader {
                    targets: record::canonical_targets(&args.targets),
                    options: RunOptions::of(args),
                    started_at: now_rfc3339(),
                },
            ),
        },
    }));
    let mut file_reports = Vec::new();
    let mut outcome = Ok(());
    for (gi, g) in groups.iter().enumerate() {
        let _lock = crate::host::state_dir::lock_device(
            &state.path,
            &g.device.identity.name,
            &format!("{} ({})", g.device.path.display(), g.fs.mount_point.display()),
        )?;
        let dev = Arc::new(crate::rewrite::open_device(&g.device, true)?);
        crate::engine::rescue::check_device(
            &crate::engine::rescue::dirs(&state.path),
            &g.device.identity,
            dev.as_ref(),
            true,
        )?;
        crate::engine::rescue::check_torn_notes(&g.device.path, dev.as_ref())?;
        // After the rescue checks: what they find matters more.
        if let Some(e) = unfinished.take() {
            return Err(e);
        }
        // One guardian per filesystem, forked while no other thread runs.
        // And nothing else may write its device: a raw writer bypasses the freeze.
        // Small files share windows: one freeze maps and rewrites as many as fit.
        let mut freeze = GuardedFreeze::start(vec![g.fs.clone()], max_freeze)?;
        freeze.set_target(&g.device.path)?;
        let mut guard = Batched::new(
            WritersChecked::new(
                freeze,
                g.device.path.clone(),
                g.device.devices_sharing_bytes(&crate::host::device::Sysfs::default()),
            ),
            pause,
            stop.clone(),
        );
        let state_on_fs = crate::host::state_dir::on_frozen(&state.path, std::slice::from_ref(&g.fs));
        if state_on_fs {
            log::warn!(
                "the state directory {} is on {}, which is frozen: each file gets windows of its own (journals cannot be opened while it is frozen). A state directory on another filesystem lets small files share windows",
                state.path.display(),
                g.fs.mount_point.display()
            );
        }
        let cx = JobContext {
            args,
            quiet,
            stop: &stop,
            shared: &shared,
            g,
            dev: &dev,
            state_dir: &state.path,
            state_on_fs,
            chunk_size,
            pause,
            rate,
            run_start,
        };
        let in_group: Vec<usize> = (0..planned.len()).filter(|&fi| planned[fi].fs == gi).collect();
        for &fi in in_group.iter().filter(|fi| left_alone.contains_key(fi)) {
            let mut fr = skipped_report(&planned[fi].path, "");
            fr.skipped_reason = None;
            fr.left_alone = left_alone.get(&fi).cloned();
            fr.size_bytes = std::fs::metadata(&planned[fi].path).map(|m| m.len()).unwrap_or(0);
            file_reports.push((fi, fr));
        }
        let mut todo: Vec<usize> = in_group.into_iter().filter(|fi| !left_alone.contains_key(fi)).collect();
        if let Some(e) = &earlier {
            todo.retain(|&fi| match done_earlier(e, &planned[fi].path) {
                Some(size) => {
                    let mut fr = skipped_report(&planned[fi].path, "");
                    (fr.skipped_reason, fr.size_bytes, fr.done_earlier) = (None, size, true);
                    fr.verification = if args.no_verify { "off" } else { "passed" }.into();
                    file_reports.push((fi, fr));
                    false
                }
                None => true,
            });
        }
        let r = run_jobs(&cx, &mut guard, &planned, &todo, &pending, &mut totals, &mut file_reports);
        // Whatever ended the jobs, the window closes here; the jobs' error comes first.
        let end = account(&mut totals, guard.finish()).and_then(|()| release(&dev, &pending));
        windows += guard.windows;
        match (r, end) {
            (Err(e), _) => {
                outcome = Err(e);
                break;
            }
            (Ok(()), Err(e)) => outcome = Err(e),
            (Ok(()), Ok(())) => {}
        }
    }
    // Finished, or refused before anything was written or done: no unfinished run to
    // leave behind (a resumed run's record stays: it still lists what was done).
    let refused_untouched = matches!(outcome, Err(Error::Refused { .. }))
        && totals.bytes_written == 0
        && earlier.is_none()
        && pending.borrow().record.nothing_done();
    if outcome.is_ok() || refused_untouched {
        pending.borrow_mut().record.finish();
    }
    if args.bench && outcome.is_ok() {
        log::info!("benchmarking the same files after the rewrite");
        // Files deleted during the run are not read after it either.
        let still: Vec<&Path> = measured.iter().copied().filter(|p| p.exists()).collect();
        outcome = crate::cli::lower::bench_options(&args.bench_opts)
            .and_then(|o| crate::measure::passes::measure_files(&still, &o))
            .map(|(b, s)| {
                report.verdict =
                    report.bench_before.as_ref().map(|before| crate::measure::bench::verdict_of(before, &b));
                (report.bench_after, report.scan_after) = (Some(b), Some(s));
            });
    }
    // Freezes, not engine windows: files rewritten in one freeze share it.
    totals.windows = windows;
    report.results = Some(totals);
    // In path order, whatever order the runs took.
    file_reports.sort_by_key(|(fi, _)| *fi);
    report.files = Some(file_reports.into_iter().map(|(_, r)| r).collect());
    outcome
}

/// The engine runs of one filesystem, in order, in windows shared while time is left in
/// them. Returns at the first error; the caller closes the window.
fn run_jobs(
    cx: &JobContext,
    guard: &mut Batched<WritersChecked<GuardedFreeze>>,
    planned: &[Planned],
    todo: &[usize],
    pending: &Rc<RefCell<Pending>>,
    totals: &mut EngineStats,
    file_reports: &mut Reports,
) -> Result<()> {
    // The record names the run before its first window: killed in it, the next run
    // knows an unfinished run is there.
    release(cx.dev, pending)?;
    // Whenever a window closes, even inside a run of many windows, what waited for
    // it goes out: a kill then loses no file already finished.
    guard.after_thaw = Some(Box::new({
        let (dev, pending) = (Arc::clone(cx.dev), Rc::clone(pending));
        move || release(&dev, &pending)
    }));
    let jobs = group_jobs(cx, planned, todo);
    for (ji, job) in jobs.iter().enumerate() {
        guard.more = !cx.state_on_fs && ji + 1 < jobs.len();
        let (fr, stats, r) = run_job(cx, guard, job, planned, pending);
        add(totals, &stats);
        file_reports.extend(fr);
        r?;
        if !guard.frozen_now() {
            release(cx.dev, pending)?;
        }
        // --rate over the whole run: the windows of each job keep to it; between
        // jobs, wait off whatever the run is still ahead by, thawed.
        if let Some(rate) = cx.rate {
            let due = Duration::from_secs_f64(totals.bytes_written as f64 / rate as f64);
            if due > cx.run_start.elapsed() {
                account(totals, guard.finish())?;
                release(cx.dev, pending)?;
                cx.stop.sleep(due.saturating_sub(cx.run_start.elapsed()));
            }
        }
    }
    Ok(())
}

/// Counts a window that the file loop closed (the engine counted the others).
fn account(t: &mut EngineStats, end: Result<crate::host::freeze::WindowEnd>) -> Result<()> {
    let end = end?;
    let frozen = end.frozen.as_secs_f64();
    let window = EngineStats {
        total_frozen_seconds: frozen,
        longest_freeze_seconds: frozen,
        windows_overrun: u64::from(end.overran),
        ..EngineStats::default()
    };
    add(t, &window);
    Ok(())
}

fn add(t: &mut EngineStats, s: &EngineStats) {
    t.rewrite_seconds += s.rewrite_seconds;
    t.bytes_read += s.bytes_read;
    t.bytes_written += s.bytes_written;
    t.bytes_verified += s.bytes_verified;
    t.chunks_written += s.chunks_written;
    t.bytes_read_ahead_dropped += s.bytes_read_ahead_dropped;
    t.windows += s.windows;
    t.windows_overrun += s.windows_overrun;
    t.longest_freeze_seconds = t.longest_freeze_seconds.max(s.longest_freeze_seconds);
    t.total_frozen_seconds += s.total_frozen_seconds;
    let (a, b) = (&mut t.stages, &s.stages);
    a.read += b.read;
    a.hash += b.hash;
    a.permit += b.permit;
    a.write += b.write;
    a.read_back += b.read_back;
    a.writer_waiting += b.writer_waiting;
}

/// Files at most this large are rewritten many to one engine run (their reads, writes and
/// read-backs overlap, and files laid out one after another merge into large chunks).
/// Larger ones run alone, and keep a journal of their own to resume from.
const SMALL_FILE_CHUNKS: u64 = 1;
/// At most this many files, and bytes, in one engine run: each holds a descriptor open,
/// and an interrupted run does its small files again.
const BATCH_FILES: usize = 256;
const BATCH_BYTES: u64 = 16 << 20;

/// What every engine run of one filesystem shares.
struct JobContext<'a> {
    args: &'a RewriteArgs,
    quiet: bool,
    stop: &'a StopFlag,
    shared: &'a SharedClaims,
    g: &'a FsGroup,
    dev: &'a Arc<DirectDevice>,
    state_dir: &'a Path,
    state_on_fs: bool,
    chunk_size: u64,
    pause: Duration,
    rate: Option<u64>,
    run_start: Instant,
}

/// One engine run: a file alone (resumable from its journal), or a batch of small files.
struct Job {
    files: Vec<usize>,
    batch: bool,
}

/// Splits a filesystem's files into engine runs, in the order of their first block on
/// the device (path order says nothing about where files lie; this order lets small
/// files that lie one after another share chunks, and writes the device ascending). A
/// file with a journal to resume from runs alone, as does a large one; with the state
/// directory on the frozen filesystem every file runs alone (no journal can be written
/// while it is frozen).
fn group_jobs(cx: &JobContext, planned: &[Planned], todo: &[usize]) -> Vec<Job> {
    let mut jobs: Vec<Job> = Vec::new();
    let mut bytes = 0;
    let mut todo = todo.to_vec();
    // Mapped without a freeze, for the order only (each run maps again while frozen).
    let first_block = |fi: &usize| {
        std::fs::File::open(&planned[*fi].path)
            .ok()
            .and_then(|f| sys::fiemap(f.as_fd(), 0, 0).ok())
            .and_then(|e| e.first().map(|e| e.physical))
            .unwrap_or(0)
    };
    todo.sort_by_cached_key(first_block);
    for fi in todo {
        let md = std::fs::metadata(&planned[fi].path).ok();
        let small = md.as_ref().is_some_and(|md| {
            md.len() <= cx.chunk_size * SMALL_FILE_CHUNKS
                && !cx.state_on_fs
                && !file_journal_path(cx.state_dir, &file_identity(&planned[fi].path, md)).exists()
        });
        let size = md.map_or(0, |m| m.len());
        match jobs.last_mut() {
            Some(j) if small && j.batch && j.files.len() < BATCH_FILES && bytes + size <= BATCH_BYTES => {
                j.files.push(fi);
                bytes += size;
            }
            _ => {
                jobs.push(Job { files: vec![fi], batch: small });
                bytes = size;
            }
        }
    }
    jobs
}

fn file_journal_path(state_dir: &Path, id: &FileIdentity) -> PathBuf {
    state_dir.join(format!("file-{}-{}.journal", id.dev.replace(':', "_"), id.ino))
}

/// Files' reports, by their index in the run.
type Reports = Vec<(usize, FileReport)>;

/// What one engine run gave: its files' reports, its engine stats, and the error that
/// stops the whole run, if any.
type JobOutcome = (Reports, EngineStats, Result<()>);

/// Opens a job's files. Files deleted since they were listed get a report instead.
fn open_members(cx: &JobContext, job: &Job, planned: &[Planned]) -> Result<(Vec<Member>, Reports)> {
    let align = u64::from(cx.g.device.dio_offset_align);
    let (mut members, mut gone) = (Vec::new(), Vec::new());
    for &fi in &job.files {
        let path = &planned[fi].path;
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                gone.push((fi, skipped_report(path, "deleted before its turn")));
                continue;
            }
            Err(e) => return Err(Error::io(format!("opening {}", path.display()), e)),
        };
        let md = file.metadata().map_err(|e| Error::io(format!("fstat {}", path.display()), e))?;
        // A file alone ends at its last device block; in a batch at its last filesystem
        // block, so that the next file's first block can follow it in one chunk (the
        // slack after the end of the file is the file's own block, written back as read).
        let unit = if job.batch { (md.blksize()).max(align) } else { align };
        let span = md.len().div_ceil(unit) * unit;
        members.push(Member::new(fi, path.clone(), file, md.len(), span));
    }
    Ok((members, gone))
}

/// The journal of a job: a file alone resumes from its own; a batch has one that only
/// records the run (a batch is not resumed: its files are small, and done again).
fn job_journal(cx: &JobContext, job: &Job, members: &[Member], end: u64, deferred: bool) -> Result<(u64, Journal)> {
    if !job.batch {
        let md = members[0].file_metadata()?;
        let id = file_identity(&members[0].path, &md);
        let path = file_journal_path(cx.state_dir, &id);
        return open_journal(&path, &id, cx.g, cx.chunk_size, end, deferred, cx.args.restart);
    }
    let run = RunRecord {
        version: journal::JOURNAL_VERSION,
        identity: cx.g.device.identity.clone(),
        chunk_size_bytes: cx.chunk_size,
        range_start_bytes: 0,
        range_end_bytes: end,
        chunks_total: end.div_ceil(cx.chunk_size),
        started_at: now_rfc3339(),
        file: None,
        options: None,
    };
    let path = cx.state_dir.join(format!("file-batch-{}.journal", cx.g.device.identity.name));
    if deferred { Ok((0, Journal::create_deferred(&path, run))) } else { Ok((0, Journal::create(&path, run)?)) }
}

fn run_job(
    cx: &JobContext,
    guard: &mut Batched<WritersChecked<GuardedFreeze>>,
    job: &Job,
    planned: &[Planned],
    pending: &Rc<RefCell<Pending>>,
) -> JobOutcome {
    let fail = |reports, e: Error| (reports, EngineStats::default(), Err(e));
    let (members, mut reports) = match open_members(cx, job, planned) {
        Ok(x) => x,
        Err(e) => return fail(Vec::new(), e),
    };
    if members.is_empty() {
        return (reports, EngineStats::default(), Ok(()));
    }
    let map: Map = Arc::default();
    let mut planner = FilesPlanner::new(members, Arc::clone(&map), Arc::clone(cx.shared));
    let range_end = planner.end();
    let (start, mut journal) = match job_journal(cx, job, &planner.members, range_end, guard.frozen_now()) {
        Ok(x) => x,
        Err(e) => return fail(reports, e),
    };
    let name = match &planner.members[..] {
        [one] => one.path.display().to_string(),
        [first, ..] => format!("{} small files from {}", planner.members.len(), first.path.display()),
        [] => unreachable!("members is not empty"),
    };
    let target = FileTarget { dev: Arc::clone(cx.dev), map, len: range_end, name: name.clone() };
    let cfg = EngineConfig {
        chunk_size: cx.chunk_size,
        range_start: 0,
        range_end,
        start_offset: start,
        verify: !cx.args.no_verify,
        read_ahead: cx.args.read_ahead,
        pause: cx.pause,
        journal_on_frozen_fs: cx.state_on_fs,
        max_overruns: cx.args.max_overruns,
        rate_bytes_per_second: cx.rate,
        rescue: Some(crate::engine::rescue::RescueTo {
            dir: cx.state_dir.to_path_buf(),
            device_path: cx.g.device.path.clone(),
            identity: cx.g.device.identity.clone(),
            files: planner.members.iter().map(|m| (m.base, m.span, m.path.display().to_string())).collect(),
        }),
    };
    if !cx.quiet {
        log::info!("{name}: {} from offset {start}", human_bytes(range_end));
    }
    if let Err(e) = guard.inner.inner.set_journal(journal.path()) {
        return fail(reports, e);
    }
    let mut progress = Progress::new(range_end, start, cx.quiet);
    let (stats, result) = engine::run(&target, &cfg, &mut planner, guard, &mut journal, &mut progress, cx.stop);
    progress.finish();
    planner.credit(stats.next_offset_bytes);
    let done = result.is_ok();
    for m in &planner.members {
        reports.push((m.index, member_report(m, start, &stats, done, cfg.verify)));
        // Done when its run finished, or its cursor went past the whole file; a skipped
        // file is not done (a resume looks at it again, and says why it skips it).
        if m.skipped.is_none()
            && (done || m.base + m.span <= stats.next_offset_bytes)
            && let Ok(md) = m.file_metadata()
        {
            pending.borrow_mut().record.done(file_identity(&m.path, &md));
        }
        if let Some(why) = &m.skipped {
            log::warn!("{}: skipped: {why}", m.path.display());
        }
    }
    // Refused before writing anything (another freezer, another writer): a new journal
    // would only make the next run think something is unfinished.
    let refused_untouched = matches!(result, Err(Error::Refused { .. })) && stats.bytes_written == 0 && start == 0;
    if refused_untouched || (done && (job.batch || planner.members.iter().all(|m| m.skipped.is_none()))) {
        // Done: its journal would only say so, and thousands of files would leave
        // thousands of journals behind.
        journal.discard();
    } else if journal.is_held() {
        pending.borrow_mut().journals.push(journal);
    }
    (reports, stats, result)
}

/// What the run did to one file. `start` is where a file alone resumed from.
fn member_report(m: &Member, start: u64, stats: &EngineStats, done: bool, verify: bool) -> FileReport {
    let resumed_from = start.saturating_sub(m.base).min(m.span);
    let accounted = resumed_from + m.bytes_rewritten + m.bytes_unwritten + m.bytes_shared_elsewhere;
    FileReport {
        path: m.path.display().to_string(),
        size_bytes: m.size,
        extents: m.extents,
        bytes_rewritten: m.bytes_rewritten,
        bytes_skipped_unwritten: m.bytes_unwritten,
        bytes_skipped_shared: m.bytes_shared_elsewhere,
        // Whatever of a finished file is neither rewritten nor otherwise skipped is a hole.
        bytes_skipped_holes: if done && m.skipped.is_none() { m.span.saturating_sub(accounted) } else { 0 },
        skipped_reason: m.skipped.clone(),
        left_alone: None,
        read_bytes_per_second: None,
        resumed_from_bytes: resumed_from,
        windows: stats.windows,
        longest_freeze_seconds: stats.longest_freeze_seconds,
        verification: match (done, verify) {
            (true, true) => "passed",
            (true, false) => "off",
            _ => "incomplete",
        }
        .into(),
        done_earlier: false,
    }
}

/// For `--only-slow`: each file's sequential read (O_DIRECT, 1 MiB, QD1, one pass); the
/// files below `--slow-threshold` x the median of the fastest quarter are rewritten, the
/// others returned here with the reason they are left alone.
fn slow_files(args: &RewriteArgs, planned: &[Planned]) -> Result<HashMap<usize, String>> {
    let mut rates = Vec::new();
    for p in planned {
        let src = crate::measure::readbench::Source::open(&p.path)?;
        let len = src.len;
        let target = crate::measure::readbench::Target::Real(vec![src]);
        let t = crate::measure::readbench::read_span(&target, 1 << 20, 1, 0, len)?;
        rates.push(if len == 0 { f64::INFINITY } else { t.rate() });
    }
    let mut sorted: Vec<f64> = rates.iter().copied().filter(|r| r.is_finite()).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let top = sorted.len().div_ceil(4).max(1);
    let reference = crate::measure::bench::median(&sorted[..top.min(sorted.len())]);
    let limit = args.slow_threshold * reference;
    log::info!(
        "--only-slow: reference {}/s (fastest quarter of {} files), slow below {}/s",
        human_bytes(reference as u64),
        planned.len(),
        human_bytes(limit as u64)
    );
    Ok(rates
        .iter()
        .enumerate()
        .filter(|(_, r)| **r >= limit)
        .map(|(i, r)| (i, format!("reads at {}/s, not below {}/s", human_bytes(*r as u64), human_bytes(limit as u64))))
        .collect())
}

fn skipped_report(path: &Path, why: &str) -> FileReport {
    FileReport {
        path: path.display().to_string(),
        size_bytes: 0,
        extents: None,
        bytes_rewritten: 0,
        bytes_skipped_unwritten: 0,
        bytes_skipped_shared: 0,
        bytes_skipped_holes: 0,
        skipped_reason: Some(why.into()),
        left_alone: None,
        read_bytes_per_second: None,
        resumed_from_bytes: 0,
        windows: 0,
        longest_freeze_seconds: 0.0,
        verification: "off".into(),
        done_earlier: false,
    }
}

/// A file's journal: continues an unfinished run of the same file (same device, inode
/// and birth time), starts afresh otherwise (a file whose identity changed is planned
/// again). New ones are started in memory while a shared window is open (`deferred`),
/// and written after it.
fn open_journal(
    path: &Path,
    id: &FileIdentity,
    g: &FsGroup,
    chunk_size: u64,
    end: u64,
    deferred: bool,
    restart: bool,
) -> Result<(u64, Journal)> {
    let resumable = journal::read(path)?.filter(|r| {
        !restart
            && !r.finished
            && r.done_offset < end
            && r.run.as_ref().is_some_and(|run| run.file.as_ref() == Some(id) && run.chunk_size_bytes == chunk_size)
    });
    if let Some(r) = resumable {
        for w in journal::describe_guardian_kills(&r.guardian_kills) {
            log::warn!("{}: {w}", id.path);
        }
        return Ok((r.done_offset, Journal::append_to(path)?));
    }
    let run = RunRecord {
        version: journal::JOURNAL_VERSION,
        identity: g.device.identity.clone(),
        chunk_size_bytes: chunk_size,
        range_start_bytes: 0,
        range_end_bytes: end,
        chunks_total: end.div_ceil(chunk_size),
        started_at: now_rfc3339(),
        file: Some(id.clone()),
        options: None,
    };
    if deferred { Ok((0, Journal::create_deferred(path, run))) } else { Ok((0, Journal::create(path, run)?)) }
}

/// What waits for a window to close before it can be written.
struct Pending {
    journals: Vec<Journal>,
    record: record::Record,
}

/// After a shared window closed: the device is flushed, then the journals of the files
/// rewritten in it and the run's record are written (a `done` record never reaches the
/// disk before the data).
fn release(dev: &DirectDevice, pending: &RefCell<Pending>) -> Result<()> {
    let pending = &mut *pending.borrow_mut();
    if pending.journals.is_empty() && !pending.record.has_waiting() {
        return Ok(());
    }
    dev.flush().map_err(|e| Error::io("flushing the device's write cache", e))?;
    for mut j in pending.journals.drain(..) {
        j.set_hold(false)?;
    }
    pending.record.release()
}

/// An unfinished run over the same targets: continued with `--resume`, discarded with
/// `--restart`, and refused otherwise, as device mode does (the refusal is returned, to
/// be raised after the checks for rescue copies, which say more).
fn earlier_run(args: &RewriteArgs, path: &Path) -> Result<(Option<record::Earlier>, Option<Error>)> {
    let earlier = match record::read(path) {
        Err(e) if args.restart => {
            log::warn!("discarding a damaged run record: {e}");
            None
        }
        r => r?,
    };
    let Some(e) = earlier else {
        if args.resume {
            log::info!("no unfinished run over these files: starting a new run");
        }
        return Ok((None, None));
    };
    let what = format!("the run over these files started {} ({} file(s) done)", e.header.started_at, e.done.len());
    if args.restart {
        log::warn!("discarding {what}");
        return Ok((None, None));
    }
    if args.resume {
        log::info!("resuming {what}, with its options: {}", e.header.options.describe());
        return Ok((Some(e), None));
    }
    if args.dry_run {
        log::info!("{what} is unfinished: the real run needs --resume or --restart");
        return Ok((None, None));
    }
    let refusal = Error::refused(
        format!("an unfinished file-mode run exists: {what}"),
        "pass --resume to continue it (the files it finished are not rewritten again), or --restart to start over",
    );
    Ok((None, Some(refusal)))
}

/// The size of a file the resumed run finished (the same file: device, inode and birth
/// time), or None.
fn done_earlier(e: &record::Earlier, path: &Path) -> Option<u64> {
    let md = std::fs::metadata(path).ok()?;
    e.done.contains(&record::key(&file_identity(path, &md))).then_some(md.len())
}

fn describe(groups: &[FsGroup], planned: &[Planned], max_freeze: Duration) -> String {
    let mut s = format!(
        "plan: {} file(s), windows of at most {:.3} s each; {}\n",
        planned.len(),
        max_freeze.as_secs_f64(),
        crate::host::freeze::describe_bound(max_freeze)
    );
    for (gi, g) in groups.iter().enumerate() {
        s +=
            &format!("  filesystem {} ({}) on {}\n", g.fs.mount_point.display(), g.fs.fs_type, g.device.path.display());
        // A rewrite reads, writes and reads back: assume a third of the read speed,
        // measured on up to 16 MiB of the device (reads only).
        let rate = crate::measure::readbench::Source::open(&g.device.path)
            .and_then(|src| {
                let len = src.len.min(16 << 20);
                crate::measure::readbench::read_span(
                    &crate::measure::readbench::Target::Real(vec![src]),
                    1 << 20,
                    1,
                    0,
                    len,
                )
            })
            .map(|t| t.rate() / 3.0)
            .unwrap_or(0.0);
        let per_window = rate * max_freeze.as_secs_f64() * 0.75;
        // A shared (reflinked) range is rewritten once, by the first file that has it.
        let mut shared_seen = std::collections::HashSet::new();
        for p in planned.iter().filter(|p| p.fs == gi) {
            // Mapped without a freeze, for the plan only (the run maps again while frozen).
            let exts =
                std::fs::File::open(&p.path).ok().and_then(|f| sys::fiemap(f.as_fd(), 0, 0).ok()).unwrap_or_default();
            let n = exts.len();
            let bytes: u64 = exts
                .iter()
                .filter(|x| x.flags & UNWRITTEN == 0)
                .filter(|x| x.flags & planner::SHARED == 0 || shared_seen.insert((x.physical, x.length)))
                .map(|x| x.length)
                .sum();
            let windows = if per_window > 0.0 { (bytes as f64 / per_window).ceil().max(1.0) as u64 } else { 0 };
            s += &format!(
                "    {}: {n} extents, {} to rewrite, about {windows} window(s) at an assumed {}/s\n",
                p.path.display(),
                human_bytes(bytes),
                human_bytes(rate as u64)
            );
        }
    }
    s += "  nothing was written or frozen (dry run)\n";
    s
}
