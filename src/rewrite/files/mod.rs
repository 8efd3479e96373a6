//! File mode: `reseq rewrite FILE|DIR...` re-sequences the blocks of files on a mounted
//! ext2/3/4 or xfs filesystem, in short freeze windows, while applications keep writing.
//!
//! The engine is the device engine, unchanged; [`planner`] makes files look like a
//! device to it. One engine run rewrites the files of one filesystem, in the order of
//! their first block, so that their I/O overlaps and files laid out one after another are
//! rewritten in large chunks; its journal (files keyed by device and inode) lets a later
//! run resume it where it stopped.
//!
//! Everything else is the device mode's: the guardian owns every freeze, a chunk's read
//! and write lie inside one window, and every chunk is verified.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::journal::{FileIdentity, Journal, Placed};
use crate::engine::{self, EngineConfig, EngineStats};
use crate::host::device::{self, Sysfs};
use crate::host::freeze::{GuardedFreeze, WritersChecked};
use crate::host::mounts::{self, MountedFs};
use crate::host::shape::{Shape, ShapeChecked};
use crate::options::resume::RunOptions;
use crate::options::rewrite::{DEFAULT_FILE_MAX_FREEZE, RewriteOptions};
use crate::report::{FileReport, Report, Verification, now_rfc3339};
use crate::rewrite::checks;
use crate::support::error::{Error, Result};
use crate::support::output::Progress;
use crate::support::signals::StopFlag;
use crate::support::units::human_bytes;
use crate::sys;

mod planner;
pub mod record;
mod refreshed;
mod select;

use planner::{FileTarget, FilesPlanner, Map, Member};

/// Why an empty file is left alone (it has no block to rewrite).
const EMPTY: &str = "empty, nothing to rewrite";

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
fn collect(o: &RewriteOptions) -> Result<Vec<PathBuf>> {
    let patterns: Vec<glob::Pattern> = o
        .exclude
        .iter()
        .map(|p| glob::Pattern::new(p).map_err(|e| Error::Usage(format!("--exclude {p}: {e}"))))
        .collect::<Result<_>>()?;
    let excluded = |p: &Path| {
        patterns.iter().any(|g| g.matches_path(p) || p.file_name().is_some_and(|n| g.matches(&n.to_string_lossy())))
    };
    let mut out = Vec::new();
    for t in &o.targets {
        let md = std::fs::symlink_metadata(t).map_err(|e| Error::Usage(format!("cannot use {}: {e}", t.display())))?;
        if md.is_dir() {
            crate::support::walk::regular_files(t, md.dev(), &excluded, &mut out)?;
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

/// A filesystem holding some of the files, with its device.
struct FsGroup {
    fs: MountedFs,
    device: device::BlockDeviceInfo,
    /// The device as planned, compared at every window.
    shape: Shape,
}

/// Checks every file's filesystem before anything is frozen or written.
fn check(o: &RewriteOptions, files: &[PathBuf]) -> Result<(Vec<FsGroup>, Vec<Planned>)> {
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
                groups.push(fs_group(f, dev, &mounts, &sysfs)?);
                groups.len() - 1
            }
        };
        not_encrypted(f)?;
        planned.push(Planned { path: f.clone(), fs: idx });
    }
    if !o.force {
        // Every file mode window freezes a live filesystem.
        checks::freeze_length(o.max_freeze(), false)?;
    }
    if let Some(w) = checks::no_realtime_hogs(o.force)? {
        log::warn!("{w}");
    }
    Ok((groups, planned))
}

/// The filesystem of `f` (on device `dev`) and its device, checked: a supported type,
/// writable, not DAX, with a device node.
fn fs_group(f: &Path, dev: (u32, u32), mounts: &[mounts::MountEntry], sysfs: &Sysfs) -> Result<FsGroup> {
    let abs = std::path::absolute(f).unwrap_or_else(|_| f.to_path_buf());
    // btrfs reports an anonymous st_dev (0:N), not its block device: find the mount by
    // path then, so that it is refused with the right reason.
    let entry =
        mounts.iter().find(|m| m.dev == dev).or_else(|| mounts::mount_containing(mounts, &abs)).ok_or_else(|| {
            Error::refused(format!("{} is on no mounted filesystem reseq can see", f.display()), "check mountinfo")
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
    let fs = mounts::filesystems_on(mounts, &[dev]).remove(0);
    if fs.read_only {
        return Err(Error::refused(
            format!("{} is on a read-only mount ({})", f.display(), fs.mount_point.display()),
            "remount it read-write, or rewrite the device",
        ));
    }
    if entry.dax {
        return Err(Error::refused(
            format!("{} is on a DAX mount: no FTL to fix, and mmap stores bypass the page cache", f.display()),
            "nothing to do",
        ));
    }
    let device = device_of(&fs, sysfs)?;
    checks::writable(&device)?;
    checks::no_copy_on_write(&device, sysfs)?;
    let shape = Shape::take(device.dev_num, sysfs);
    Ok(FsGroup { fs, device, shape })
}

/// The block device under a mounted filesystem, by its device node.
fn device_of(fs: &MountedFs, sysfs: &Sysfs) -> Result<device::BlockDeviceInfo> {
    let dev = fs.dev_num;
    let (name, _) = sysfs.name_of(dev).ok_or_else(|| Error::Internal(format!("no sysfs entry for {dev:?}")))?;
    let node = PathBuf::from(format!("/dev/{name}"));
    // Only a missing node is "no node"; any other failure says what it is.
    match device::inspect(&node, sysfs) {
        Ok(d) => Ok(d),
        Err(_) if !node.exists() => Err(Error::refused(
            format!("{} ({}) has no device node at {}", fs.mount_point.display(), fs.dev, node.display()),
            "create the node (no udev?) and run reseq again",
        )),
        Err(e) => Err(e),
    }
}

/// fscrypt: the blocks hold ciphertext, which reading through the file does not give.
fn not_encrypted(f: &Path) -> Result<()> {
    if !sys::statx_encrypted(f).unwrap_or(false) {
        return Ok(());
    }
    Err(Error::refused(
        format!(
            "{} is fscrypt-encrypted: its blocks hold ciphertext reseq cannot read back through the file",
            f.display()
        ),
        "rewrite the device instead",
    ))
}

/// A file as a run records it: device, inode, birth time, and where its extents lie.
fn file_identity(path: &Path, md: &std::fs::Metadata, exts: Option<&[sys::FiemapExtent]>) -> FileIdentity {
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
        extents: exts.map(fingerprint),
    }
}

/// A file's extents, mapped without syncing it or a freeze (for its identity, the run's
/// order and the plan; the run maps again while frozen).
fn mapped(path: &Path) -> Option<Vec<sys::FiemapExtent>> {
    let f = std::fs::File::open(path).ok()?;
    sys::fiemap(f.as_fd(), 0, 0).ok()
}

/// blake3 of a file's extents (logical, physical, length).
fn fingerprint(extents: &[sys::FiemapExtent]) -> String {
    let mut h = blake3::Hasher::new();
    for e in extents {
        for v in [e.logical, e.physical, e.length] {
            h.update(&v.to_le_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

/// `reseq rewrite FILE|DIR...`.
pub(crate) fn run(o: &RewriteOptions, quiet: bool) -> (Report, Result<()>) {
    let started = Instant::now();
    let mut report = Report::new("rewrite", o.dry_run);
    report.targets = o.targets.iter().map(|t| t.display().to_string()).collect();
    let mut verify = !o.no_verify;
    let result = execute(o, quiet, &mut report, &mut verify);
    report.finish(started.elapsed(), &result);
    report.verification = verification(&report, verify, &result);
    (report, result)
}

/// The run's verification. [`Report::finish`] reads it from a device plan, which file
/// mode has none of: every file was read back when the run finished with `verify` on.
fn verification(report: &Report, verify: bool, result: &Result<()>) -> Verification {
    match result {
        Err(Error::ChecksumMismatch { .. } | Error::WriteFailed { .. }) => Verification::Failed,
        // Refused or stopped before a file was rewritten: nothing verified, nothing left half.
        _ if report.dry_run || report.results.is_none() || !verify => Verification::Off,
        Ok(()) => Verification::Passed,
        Err(_) => Verification::Incomplete,
    }
}

/// The files under the targets and their filesystems, checked.
fn plan_files(o: &RewriteOptions) -> Result<(Vec<FsGroup>, Vec<Planned>)> {
    let files = collect(o)?;
    if files.is_empty() {
        return Err(Error::Usage("no regular files under the targets".into()));
    }
    checks::privileges()?;
    let (groups, planned) = check(o, &files)?;
    for g in &groups {
        checks::aligned(o.chunk_size, &g.device)?;
    }
    Ok((groups, planned))
}

/// The run; `verify` is set to whether it verifies (a resumed run keeps its own choice).
fn execute(o: &RewriteOptions, quiet: bool, report: &mut Report, verify: &mut bool) -> Result<()> {
    let record_path = record::path_for(&crate::host::state_dir::resolve(&o.state_dir), &o.targets);
    let (earlier, unfinished) = earlier_run(o, &record_path)?;
    let resumed = earlier.as_ref().map(|e| e.header.options.apply(o, DEFAULT_FILE_MAX_FREEZE)).transpose()?;
    let o = resumed.as_ref().unwrap_or(o);
    *verify = !o.no_verify;
    let (groups, planned) = plan_files(o)?;
    if !groups.is_empty() {
        report.freeze_bound = Some(crate::host::freeze::bound_report(o.max_freeze()));
    }
    let placement = checks::guardian_can_leave(o.accept_cgroup_risk)?;
    report.guardian = Some(placement.describe());
    report.warnings.extend(hot_files(&planned).into_iter().inspect(|w| log::warn!("{w}")));
    let (paths, choice, left_alone) = choose(o, &planned, report)?;
    if o.dry_run {
        let (text, detail) = describe(o, (&groups, &planned, choice.as_ref()), &placement, report);
        (report.plan_text, report.plan_detail) = (Some(text), Some(detail));
        return Ok(());
    }
    // --bench: the files to rewrite, read before and after.
    let measured: Vec<&Path> =
        (0..planned.len()).filter(|fi| !left_alone.contains_key(fi)).map(|fi| planned[fi].path.as_path()).collect();
    if o.bench {
        log::info!("benchmarking {} file(s) before the rewrite", measured.len());
        let (b, s) =
            crate::measure::passes::measure_files(&measured, &o.bench_opts).map_err(crate::rewrite::before_writing)?;
        (report.bench_before, report.scan_before) = (Some(b), Some(s));
    }
    let stop = ready_to_write()?;
    let frozen: Vec<MountedFs> = groups.iter().map(|g| g.fs.clone()).collect();
    let state = checks::state_dir(&o.state_dir, &frozen, o.chunk_size, false)?;
    let done_before = earlier.as_ref().map(|e| finished_earlier(e, &planned)).unwrap_or_default();
    let (progress, files_total, files_done) = overall_progress(&planned, &left_alone, &done_before, quiet);
    let mut run = FileRun {
        o,
        stop: &stop,
        state_dir: &state.path,
        planned: &planned,
        left_alone: &left_alone,
        done_before: &done_before,
        earlier: earlier.as_ref(),
        record_header: record_header(o, earlier.as_ref()),
        record_written: Arc::default(),
        record: record_path,
        placement: &placement,
        progress,
        files_done,
        files_total,
        totals: EngineStats::default(),
        reports: Vec::new(),
    };
    let outcome = run.groups(&groups, unfinished);
    run.progress.close();
    let result = run.finish(outcome?, &measured, report);
    // A run that wrote nothing and did not finish (refused) leaves the state as it was.
    let wrote = result.is_ok() || report.results.as_ref().is_some_and(|r| r.bytes_written > 0);
    chosen_files_done(o, report, &paths, choice.as_ref(), wrote);
    result
}

/// After a run that chose files: each chosen file's report says why, and a run that
/// chose by age and wrote records what it refreshed (other runs leave the state
/// directory as they found it).
fn chosen_files_done(
    o: &RewriteOptions,
    report: &mut Report,
    paths: &[PathBuf],
    choice: Option<&select::Choice>,
    wrote: bool,
) {
    if o.older_than.is_some() && wrote {
        refreshed::remember(&o.state_dir, report.files.as_deref().unwrap_or_default());
    }
    if let Some(c) = choice {
        say_why(report, paths, c);
    }
}

/// The run's paths, the choice (None: every file), and the files left alone.
type Chosen = (Vec<PathBuf>, Option<select::Choice>, HashMap<usize, String>);

/// `--only-slow`, `--older-than`: the files to rewrite, chosen before the plan is shown;
/// the run's paths, the choice, and the files left alone.
fn choose(o: &RewriteOptions, planned: &[Planned], report: &mut Report) -> Result<Chosen> {
    let paths: Vec<PathBuf> = planned.iter().map(|p| p.path.clone()).collect();
    let choice = select::choose(o, &paths).map_err(crate::rewrite::before_writing)?;
    report.file_selection = choice.as_ref().map(|c| c.summary.clone());
    let left_alone = choice.as_ref().map(|c| c.left_alone.clone()).unwrap_or_default();
    Ok((paths, choice, left_alone))
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
            options: RunOptions::of(o),
            started_at: now_rfc3339(),
        },
    };
    (header, earlier.iter().flat_map(|e| e.done.values()).cloned().collect())
}

/// The process before its first write: a low I/O priority, and the signals that stop it
/// handled.
fn ready_to_write() -> Result<StopFlag> {
    // A cron job's priority: best-effort level 7 (ionice -c2 -n7), not the idle class:
    // an idle-class writer can be starved while the filesystem is frozen, stretching the
    // very stall the windows bound. Set before any thread starts, so all inherit it.
    if let Err(e) = sys::lower_io_priority() {
        log::warn!("could not lower the I/O priority: {e}");
    }
    let stop = StopFlag::install().map_err(|e| Error::io("installing signal handlers", e))?;
    stop.check_before_writing()?;
    sys::defer_job_control_stops().map_err(|e| Error::io("installing signal handlers", e.into()))?;
    Ok(stop)
}

/// One progress over every file to rewrite (not one per engine run, which would start
/// again for each batch of small files), and how many files that is and are already done
/// (by the interrupted run a resumed one continues).
fn overall_progress(
    planned: &[Planned],
    left_alone: &HashMap<usize, String>,
    done_before: &HashMap<usize, u64>,
    quiet: bool,
) -> (Progress, usize, usize) {
    let (mut bytes, mut already, mut files, mut done) = (0, 0, 0, 0);
    for (fi, p) in planned.iter().enumerate().filter(|(fi, _)| !left_alone.contains_key(fi)) {
        let size = std::fs::metadata(&p.path).map_or(0, |m| m.len());
        if size == 0 {
            continue;
        }
        (bytes, files) = (bytes + size, files + 1);
        if let Some(size) = done_before.get(&fi) {
            (already, done) = (already + size, done + 1);
        }
    }
    let mut progress = Progress::new(bytes, already, quiet).spanning();
    progress.set_message(format!("{done} of {files} files"));
    (progress, files, done)
}

/// What a file-mode run shares across its filesystems.
struct FileRun<'a> {
    o: &'a RewriteOptions,
    stop: &'a StopFlag,
    state_dir: &'a Path,
    planned: &'a [Planned],
    /// `--only-slow`: the files left alone, with why.
    left_alone: &'a HashMap<usize, String>,
    /// The files the interrupted run finished, with their sizes.
    done_before: &'a HashMap<usize, u64>,
    earlier: Option<&'a record::Earlier>,
    /// The run's record; each filesystem's journal lies beside it.
    record: PathBuf,
    /// What the record says, written with the first journal this run writes.
    record_header: (record::RunHeader, Vec<FileIdentity>),
    /// Whether this run wrote the record.
    record_written: Arc<std::sync::atomic::AtomicBool>,
    /// Where each filesystem's guardian goes.
    placement: &'a crate::host::cgroup::Placement,
    /// One progress over all files: bytes and files done, rate and ETA.
    progress: Progress,
    files_done: usize,
    files_total: usize,
    totals: EngineStats,
    /// Files' reports, by their index in the run.
    reports: Vec<(usize, FileReport)>,
}

impl FileRun<'_> {
    /// Each filesystem in turn. `Err`: stopped before its run (nothing more is
    /// reported); `Ok(outcome)`: what its engine run came to.
    fn groups(&mut self, groups: &[FsGroup], mut unfinished: Option<Error>) -> Result<Result<()>> {
        for (gi, g) in groups.iter().enumerate() {
            if let Err(e) = self.group(gi, g, &mut unfinished)? {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// One filesystem: its device taken and checked, one guardian, one engine run over
    /// its files.
    fn group(&mut self, gi: usize, g: &FsGroup, unfinished: &mut Option<Error>) -> Result<Result<()>> {
        let _lock = crate::host::state_dir::lock_device(
            self.state_dir,
            &g.device.identity.name,
            &format!("{} ({})", g.device.path.display(), g.fs.mount_point.display()),
        )?;
        let dev = Arc::new(crate::rewrite::open_device(&g.device, true)?);
        let rescue_dirs = crate::engine::rescue::dirs(self.state_dir);
        crate::engine::rescue::check_device(&rescue_dirs, &g.device.identity, dev.as_ref(), true)?;
        crate::engine::rescue::check_torn_notes(&g.device.path, dev.as_ref())?;
        // After the rescue checks: what they find matters more.
        if let Some(e) = unfinished.take() {
            return Err(e);
        }
        let todo = self.todo(gi);
        if todo.is_empty() {
            return Ok(Ok(()));
        }
        let (members, table, start) = self.members(g, &todo);
        let map: Map = Arc::default();
        let mut planner = FilesPlanner::new(members, Arc::clone(&map), self.o.max_freeze() / 10);
        let end = planner.end();
        let mut run = crate::rewrite::run_record(&g.device.identity, self.o.chunk_size.bytes(), (0, end), None);
        run.files = table;
        let journal_path = record::journal_path(&self.record, &g.device.identity.name);
        let mut journal = Journal::deferred(&journal_path, run, Some(self.write_record()));
        let mut guard = self.guard(g, journal.path())?;
        let name = format!("{} file(s) on {}", planner.members.len(), g.fs.mount_point.display());
        let target = FileTarget { dev, map, name };
        let cfg = self.config(g, &planner.members, start, end);
        let goal = self.progress.done() + planner.members.iter().map(|m| m.size).sum::<u64>();
        let (stats, result) =
            engine::run(&target, &cfg, &mut planner, &mut guard, &mut journal, &mut self.progress, self.stop);
        planner.credit(stats.next_offset_bytes);
        // Holes, unwritten and shared ranges are not rewritten, yet done; so is the start
        // of a resumed file.
        if result.is_ok() {
            self.progress.advance(goal.saturating_sub(self.progress.done()));
        }
        self.settle(&planner.members, start, &stats, result.is_ok());
        Ok(result)
    }

    /// The files to rewrite, in the order of their first block on the device (path order
    /// says nothing about where files lie; this order lets files that lie one after
    /// another share I/Os, and writes the device ascending), the file the interrupted
    /// run stopped in first; their table for the journal; and where that file resumes.
    fn members(&mut self, g: &FsGroup, todo: &[usize]) -> (Vec<Member>, Vec<Placed>, u64) {
        let align = u64::from(g.device.dio_offset_align);
        let mut files: Vec<(u64, Member, FileIdentity)> = Vec::new();
        let mut start = 0;
        for &fi in todo {
            let path = &self.planned[fi].path;
            let Ok(md) = std::fs::metadata(path) else {
                self.reports.push((fi, skipped_report(path, "deleted before its turn")));
                continue;
            };
            let exts = mapped(path);
            let id = file_identity(path, &md, exts.as_deref());
            // A file ends at its last filesystem block, so that the next file's first
            // block can follow it in one I/O (the slack after the end of the file is the
            // file's own block, written back as read).
            let unit = md.blksize().max(align);
            let m = Member::new(fi, path.clone(), md.len(), md.len().div_ceil(unit) * unit);
            let resumed = self.earlier.and_then(|e| e.partial.get(&record::key(&id))).filter(|&&at| at < m.span);
            let first = match resumed {
                Some(&at) if start == 0 => {
                    start = at;
                    0
                }
                _ => exts.as_deref().and_then(|e| e.first()).map_or(u64::MAX, |e| e.physical.max(1)),
            };
            files.push((first, m, id));
        }
        files.sort_by_key(|f| f.0);
        let (mut base, mut table) = (0, Vec::new());
        let members = files
            .into_iter()
            .map(|(_, m, file)| {
                table.push(Placed { base, span: m.span, file });
                base += m.span;
                m
            })
            .collect();
        (members, table, start)
    }

    /// Writes the run's record, once: what a deferred journal does first.
    fn write_record(&self) -> Box<dyn FnOnce() -> Result<()> + Send> {
        let (path, (header, done)) = (self.record.clone(), self.record_header.clone());
        let written = Arc::clone(&self.record_written);
        Box::new(move || {
            if written.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            record::write(&path, &header, done.iter())?;
            written.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
    }

    /// One guardian per filesystem, forked while no other thread runs, and nothing else
    /// may write its device (a raw writer bypasses the freeze).
    fn guard(&self, g: &FsGroup, journal: &Path) -> Result<ShapeChecked<WritersChecked<GuardedFreeze>>> {
        let mut freeze = GuardedFreeze::start(vec![g.fs.clone()], self.o.max_freeze(), self.placement)?;
        freeze.set_target(&g.device.path)?;
        freeze.set_journal(journal)?;
        let writers =
            WritersChecked::new(freeze, g.device.path.clone(), g.device.devices_sharing_bytes(&Sysfs::default()));
        Ok(ShapeChecked::new(writers, g.device.dev_num, g.shape.clone()))
    }

    /// The engine's configuration for the files of one filesystem, laid end to end in
    /// `[0, range_end)`.
    fn config(&self, g: &FsGroup, members: &[Member], start: u64, range_end: u64) -> EngineConfig {
        let o = self.o;
        if start > 0 {
            log::info!(
                "{}: resuming at {} of {}",
                members[0].path.display(),
                human_bytes(start),
                human_bytes(members[0].span)
            );
        }
        EngineConfig {
            chunk_size: o.chunk_size.bytes(),
            range_start: 0,
            range_end,
            start_offset: start,
            verify: !o.no_verify,
            read_ahead: o.read_ahead,
            pause: o.pause,
            // Journal records wait in memory while the state directory is frozen.
            journal_on_frozen_fs: crate::host::state_dir::on_frozen(self.state_dir, std::slice::from_ref(&g.fs)),
            max_overruns: o.max_overruns,
            rate_bytes_per_second: o.rate.map(|r| r.bytes_per_second()),
            rescue: Some(crate::engine::rescue::RescueTo {
                dir: self.state_dir.to_path_buf(),
                device_path: g.device.path.clone(),
                identity: g.device.identity.clone(),
                files: members.iter().map(|m| (m.base, m.span, m.path.display().to_string())).collect(),
            }),
        }
    }

    /// After a filesystem's run: its figures into the totals, and each file's report
    /// (done when the run finished, or its cursor went past the whole file).
    fn settle(&mut self, members: &[Member], start: u64, stats: &EngineStats, finished: bool) {
        add(&mut self.totals, stats);
        for m in members {
            let done = finished || m.base + m.span <= stats.next_offset_bytes;
            let mut r = member_report(m, start, done, !self.o.no_verify);
            if let Some((first, last)) = m.windows {
                let own = stats.window_seconds.get(first as usize - 1..last as usize).unwrap_or(&[]);
                r.windows = last + 1 - first;
                r.longest_freeze_seconds = own.iter().copied().fold(0.0, f64::max);
            }
            if let Some(why) = &m.skipped {
                log::warn!("{}: skipped: {why}", m.path.display());
            }
            self.files_done += usize::from(done);
            self.reports.push((m.index, r));
        }
        self.progress.set_message(format!("{} of {} files", self.files_done, self.files_total));
    }

    /// The files of filesystem `gi` to rewrite; those left alone (`--only-slow`) and
    /// those the resumed run finished get their report here.
    fn todo(&mut self, gi: usize) -> Vec<usize> {
        let planned = self.planned;
        let mut todo = Vec::new();
        for fi in (0..planned.len()).filter(|&fi| planned[fi].fs == gi) {
            let size = std::fs::metadata(&planned[fi].path).map(|m| m.len()).ok();
            let why = if size == Some(0) { Some(EMPTY.to_string()) } else { self.left_alone.get(&fi).cloned() };
            let Some(why) = why else {
                todo.push(fi);
                continue;
            };
            let mut fr = skipped_report(&planned[fi].path, "");
            (fr.skipped_reason, fr.left_alone, fr.size_bytes) = (None, Some(why), size.unwrap_or(0));
            self.reports.push((fi, fr));
        }
        todo.retain(|&fi| match self.done_before.get(&fi) {
            Some(&size) => {
                let mut fr = skipped_report(&planned[fi].path, "");
                (fr.skipped_reason, fr.size_bytes, fr.done_earlier) = (None, size, true);
                fr.verification = if self.o.no_verify { Verification::Off } else { Verification::Passed };
                self.reports.push((fi, fr));
                false
            }
            None => true,
        });
        todo
    }

    /// After the last filesystem: the record removed when nothing is left unfinished,
    /// the benchmark after, and the report's figures.
    fn finish(self, mut outcome: Result<()>, measured: &[&Path], report: &mut Report) -> Result<()> {
        // Finished, or refused before anything was written: no unfinished run to leave
        // behind (a resumed run's record stays: it still lists what was done). Only a
        // record this run wrote goes: one it did not write is another run's.
        let wrote_record = self.record_written.load(std::sync::atomic::Ordering::SeqCst);
        let refused_untouched = matches!(outcome, Err(Error::Refused { .. }))
            && self.totals.bytes_written == 0
            && self.earlier.is_none()
            && wrote_record;
        if outcome.is_ok() || refused_untouched {
            record::remove(&self.record);
        }
        if self.o.bench && outcome.is_ok() {
            outcome = bench_after(self.o, self.stop, measured, report);
        }
        report.results = Some(self.totals);
        // In path order, whatever order the runs took.
        let mut reports = self.reports;
        reports.sort_by_key(|(fi, _)| *fi);
        report.files = Some(reports.into_iter().map(|(_, r)| r).collect());
        outcome
    }
}

/// The benchmark after the rewrite, and its verdict.
fn bench_after(o: &RewriteOptions, stop: &StopFlag, measured: &[&Path], report: &mut Report) -> Result<()> {
    log::info!("benchmarking the same files after the rewrite");
    // Files deleted during the run are not read after it either (nor at the re-check,
    // those deleted by then).
    let still: Vec<&Path> = measured.iter().copied().filter(|p| p.exists()).collect();
    match crate::measure::passes::measure_files(&still, &o.bench_opts) {
        Ok((b, s)) => {
            if let Some(before) = &report.bench_before {
                let v = crate::measure::bench::verdict_of(before, &b);
                let target = || {
                    let left: Vec<&Path> = still.iter().copied().filter(|p| p.exists()).collect();
                    crate::measure::passes::files_target(&left)
                };
                report.verdict = crate::measure::passes::recheck(Some(v), before, &b, &o.bench_opts, stop, target);
            }
            (report.bench_after, report.scan_after) = (Some(b), Some(s));
            Ok(())
        }
        Err(e) => crate::rewrite::cut_short(report.bench_before.as_ref(), e).map(|v| report.verdict = v),
    }
}

/// The journal's run record for the files of one filesystem, `[0, end)`.
/// Sums the figures of the filesystems' runs.
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

/// What the run did to one file. `start` is where the first file resumed from.
fn member_report(m: &Member, start: u64, done: bool, verify: bool) -> FileReport {
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
        resumed_from_bytes: resumed_from,
        verification: match (done, verify) {
            (true, true) => Verification::Passed,
            (true, false) => Verification::Off,
            (false, _) => Verification::Incomplete,
        },
        ..FileReport::default()
    }
}

pub(super) fn skipped_report(path: &Path, why: &str) -> FileReport {
    FileReport {
        path: path.display().to_string(),
        skipped_reason: Some(why.into()),
        verification: Verification::Off,
        ..FileReport::default()
    }
}

/// An unfinished run over the same targets: continued with `--resume`, discarded with
/// `--restart`, and refused otherwise, as device mode does (the refusal is returned, to
/// be raised after the checks for rescue copies, which say more).
fn earlier_run(o: &RewriteOptions, path: &Path) -> Result<(Option<record::Earlier>, Option<Error>)> {
    let earlier = match record::read(path) {
        Err(e) if o.restart => {
            log::warn!("discarding a damaged run record: {e}");
            None
        }
        r => r?,
    };
    let Some(e) = earlier else {
        if o.resume {
            log::info!("no unfinished run over these files: starting a new run");
        }
        return Ok((None, None));
    };
    let what = format!("the run over these files started {} ({} file(s) done)", e.header.started_at, e.done.len());
    if o.restart {
        log::warn!("discarding {what}");
        return Ok((None, None));
    }
    if o.resume {
        log::info!("resuming {what}, with its options: {}", e.header.options.describe());
        return Ok((Some(e), None));
    }
    if o.dry_run {
        log::info!("{what} is unfinished: the real run needs --resume or --restart");
        return Ok((None, None));
    }
    let refusal = Error::refused(
        format!("an unfinished file-mode run exists: {what}"),
        "pass --resume to continue it (the files it finished are not rewritten again), or --restart to start over",
    );
    Ok((None, Some(refusal)))
}

/// The files of `planned` the interrupted run finished, with their sizes: each mapped
/// once (FIEMAP and a hash of its extents), for the progress and the plan alike.
fn finished_earlier(e: &record::Earlier, planned: &[Planned]) -> HashMap<usize, u64> {
    planned.iter().enumerate().filter_map(|(fi, p)| done_earlier(e, &p.path).map(|size| (fi, size))).collect()
}

/// The size of a file the resumed run finished (the same file, its extents unmoved:
/// [`record::key`]), or None.
fn done_earlier(e: &record::Earlier, path: &Path) -> Option<u64> {
    let md = std::fs::metadata(path).ok()?;
    e.done.contains_key(&record::key(&file_identity(path, &md, mapped(path).as_deref()))).then_some(md.len())
}

/// What the dry run says: per filesystem the files, the bytes to rewrite, and the
/// windows and time frozen to expect; the warnings. Returns it and every file's line
/// (shown with `-v`).
fn describe(
    o: &RewriteOptions,
    (groups, planned, choice): (&[FsGroup], &[Planned], Option<&select::Choice>),
    placement: &crate::host::cgroup::Placement,
    report: &Report,
) -> (String, String) {
    let max_freeze = o.max_freeze();
    let mut s = format!(
        "plan: {} file(s), windows of at most {:.3} s each; {}\n",
        planned.len(),
        max_freeze.as_secs_f64(),
        crate::host::freeze::describe_bound(max_freeze),
    );
    s += &crate::rewrite::frozen_share(max_freeze, o.pause, o.rate.map(|r| r.bytes_per_second()));
    s += &crate::rewrite::describe_guardian(placement);
    let mut detail = String::from("  every file:\n");
    if let (Some(sel), Some(c)) = (&report.file_selection, choice) {
        s += &format!("  {}\n  note: {}\n", sel.rule, sel.ages_after_rewrite);
        detail = format!("  the choice (-v):\n{}", select::each_why(c, planned.iter().map(|p| p.path.as_path())));
        detail += "  every file chosen:\n";
    }
    let no_one = HashMap::new();
    let left_alone = choice.map_or(&no_one, |c| &c.left_alone);
    for (gi, g) in groups.iter().enumerate() {
        s +=
            &format!("  filesystem {} ({}) on {}\n", g.fs.mount_point.display(), g.fs.fs_type, g.device.path.display());
        s += &crate::host::aliases::describe(&g.device.devices_sharing_bytes(&Sysfs::default()), &Sysfs::default());
        let chosen = |(i, p): &(usize, &Planned)| p.fs == gi && !left_alone.contains_key(i);
        let files: Vec<&Planned> = planned.iter().enumerate().filter(chosen).map(|(_, p)| p).collect();
        s += &describe_group(g, &files, max_freeze, &mut detail);
    }
    (s + &crate::rewrite::dry_run_end(&report.warnings), detail)
}

/// One filesystem's files in the plan: their totals, and each file's line into `detail`.
fn describe_group(g: &FsGroup, files: &[&Planned], max_freeze: Duration, detail: &mut String) -> String {
    let rate = assumed_rate(g);
    // Measured windows end at 80-90 % of the budget on an idle device (engine/pace.rs):
    // 3/4 leaves room for the freeze itself and a busy one.
    let per_window = rate * max_freeze.as_secs_f64() * 0.75;
    let windows_for = |bytes: u64| match (bytes, per_window > 0.0) {
        (0, _) | (_, false) => 0,
        (b, true) => (b as f64 / per_window).ceil().max(1.0) as u64,
    };
    // A shared (reflinked) range is rewritten once, by the first file that has it.
    let mut shared_seen = std::collections::HashSet::new();
    let (mut total, mut empty) = (0, 0);
    for p in files {
        let (extents, bytes, size) = planned_bytes(&p.path, &mut shared_seen);
        total += bytes;
        let hot = hot_kind(&p.path).map(|(kind, _)| format!(" ({kind}: written all the time)")).unwrap_or_default();
        let what = match (size, bytes) {
            (0, _) => {
                empty += 1;
                EMPTY.to_string()
            }
            (_, 0) => {
                format!("{extents} extent(s), nothing to rewrite (holes, unwritten, or shared with a file before it)")
            }
            (_, b) => format!("{extents} extent(s), {} to rewrite", human_bytes(b)),
        };
        *detail += &format!("    {}: {what}{hot}\n", p.path.display());
    }
    let frozen = if rate > 0.0 { format!("{:.1} s", total as f64 / rate) } else { "unknown".into() };
    format!(
        "    {} file(s){}, {} to rewrite: about {} window(s), {frozen} frozen in all, at an assumed {}/s\n",
        files.len(),
        if empty > 0 { format!(" ({empty} empty: nothing to rewrite)") } else { String::new() },
        human_bytes(total),
        windows_for(total),
        human_bytes(rate as u64),
    )
}

/// A rewrite reads, writes and reads back: assume a third of the device's read speed,
/// measured on up to 16 MiB of it (reads only). 0 when it cannot be read.
fn assumed_rate(g: &FsGroup) -> f64 {
    use crate::measure::readbench::{Source, Target, read_span};
    Source::open(&g.device.path)
        .and_then(|src| {
            let len = src.len.min(16 << 20);
            read_span(&Target::Real(vec![src]), 1 << 20, 1, 0, len)
        })
        .map(|t| t.rate() / 3.0)
        .unwrap_or(0.0)
}

/// A file's extents, the bytes a run would rewrite, and its size.
fn planned_bytes(path: &Path, shared_seen: &mut std::collections::HashSet<(u64, u64)>) -> (usize, u64, u64) {
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let exts = mapped(path).unwrap_or_default();
    let bytes = exts
        .iter()
        .filter(|x| !x.is_unwritten())
        .filter(|x| !x.is_shared() || shared_seen.insert((x.physical, x.length)))
        .map(|x| x.length)
        .sum();
    (exts.len(), bytes, size)
}

/// A database's files that it writes all the time (its redo log, WAL or temporary
/// space), with the option that leaves them out. Rewriting them freezes the very writes
/// a commit waits for: an InnoDB redo log in a 0.92 s window held a commit 910 ms.
fn hot_kind(path: &Path) -> Option<(&'static str, &'static str)> {
    let name = path.file_name()?.to_str()?;
    let under = |dir: &str| path.parent().is_some_and(|p| p.components().any(|c| c.as_os_str() == dir));
    if name.starts_with("ib_logfile") || under("#innodb_redo") {
        Some(("InnoDB redo log", "--exclude 'ib_logfile*' --exclude '#innodb_redo'"))
    } else if name == "ibtmp1" {
        Some(("InnoDB temporary tablespace", "--exclude ibtmp1"))
    } else if under("pg_wal") || under("pg_xlog") {
        Some(("PostgreSQL WAL", "--exclude pg_wal"))
    } else if name.ends_with("-wal") {
        Some(("SQLite write-ahead log", "--exclude '*-wal'"))
    } else {
        None
    }
}

/// One warning per kind of hot database file among those planned (empty ones are not
/// rewritten): what they are, why it matters, and the option that leaves them out.
fn hot_files(planned: &[Planned]) -> Vec<String> {
    let mut kinds: Vec<(&str, &str, Vec<&Path>)> = Vec::new();
    for p in planned {
        let Some((kind, hint)) = hot_kind(&p.path) else { continue };
        if std::fs::metadata(&p.path).is_ok_and(|m| m.len() == 0) {
            continue;
        }
        match kinds.iter_mut().find(|k| k.0 == kind) {
            Some(k) => k.2.push(&p.path),
            None => kinds.push((kind, hint, vec![&p.path])),
        }
    }
    kinds
        .into_iter()
        .map(|(kind, hint, paths)| {
            let more = if paths.len() > 1 { format!(" and {} more", paths.len() - 1) } else { String::new() };
            format!(
                "the {kind} is among the files ({}{more}): the database writes it all the time, and each of those writes waits while a window freezes it (a commit can wait for a whole window); leave it out with {hint}",
                paths[0].display()
            )
        })
        .collect()
}
