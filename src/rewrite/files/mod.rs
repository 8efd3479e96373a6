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

use crate::engine::journal::{self, FileIdentity, Journal, RunRecord};
use crate::engine::target::{BlockTarget, DirectDevice};
use crate::engine::{self, EngineConfig, EngineStats};
use crate::host::device::{self, Sysfs};
use crate::host::freeze::{Batched, GuardedFreeze, WindowGuard, WritersChecked};
use crate::host::mounts::{self, MountedFs};
use crate::options::resume::RunOptions;
use crate::options::rewrite::{DEFAULT_FILE_MAX_FREEZE, RewriteOptions};
use crate::report::{FileReport, Report, now_rfc3339};
use crate::rewrite::checks;
use crate::support::error::{Error, Result};
use crate::support::output::Progress;
use crate::support::signals::StopFlag;
use crate::support::units::human_bytes;
use crate::sys;

mod planner;
pub mod record;
pub use planner::{Extent, plan_extents};
use planner::{FileTarget, FilesPlanner, Map, Member, SharedClaims};

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
    Ok(FsGroup { fs, device })
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

/// "major:minor" of the filesystem a file is on.
fn file_dev(md: &std::fs::Metadata) -> String {
    format!("{}:{}", nix::sys::stat::major(md.dev()), nix::sys::stat::minor(md.dev()))
}

fn file_identity(path: &Path, md: &std::fs::Metadata) -> FileIdentity {
    FileIdentity {
        dev: file_dev(md),
        ino: md.ino(),
        birth_time: md
            .created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as u64),
        path: path.display().to_string(),
        changed_ns: Some(md.ctime() as u64 * 1_000_000_000 + md.ctime_nsec() as u64),
        extents: extents_fingerprint(path),
    }
}

/// blake3 of a file's extents (logical, physical, length), without syncing it.
fn extents_fingerprint(path: &Path) -> Option<String> {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(path).ok()?;
    let extents = sys::fiemap(f.as_fd(), 0, 0).ok()?;
    let mut h = blake3::Hasher::new();
    for e in &extents {
        for v in [e.logical, e.physical, e.length] {
            h.update(&v.to_le_bytes());
        }
    }
    Some(h.finalize().to_hex().to_string())
}

/// `reseq rewrite FILE|DIR...`.
pub fn run(o: &RewriteOptions, quiet: bool) -> (Report, Result<()>) {
    let started = Instant::now();
    let mut report = Report::new("rewrite", o.dry_run);
    report.targets = o.targets.iter().map(|t| t.display().to_string()).collect();
    let mut verify = !o.no_verify;
    let result = execute(o, quiet, &mut report, &mut verify);
    report.finish(started.elapsed(), &result);
    report.verification = verification(&report, verify, &result).into();
    (report, result)
}

/// The run's verification. [`Report::finish`] reads it from a device plan, which file
/// mode has none of: every file was read back when the run finished with `verify` on.
fn verification(report: &Report, verify: bool, result: &Result<()>) -> &'static str {
    match result {
        Err(Error::ChecksumMismatch { .. } | Error::WriteFailed { .. }) => "failed",
        // Refused or stopped before a file was rewritten: nothing verified, nothing left half.
        _ if report.dry_run || report.results.is_none() || !verify => "off",
        Ok(()) => "passed",
        Err(_) => "incomplete",
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
    if o.dry_run {
        let (text, detail) = describe(o, &groups, &planned, &placement, &report.warnings);
        (report.plan_text, report.plan_detail) = (Some(text), Some(detail));
        return Ok(());
    }
    // --only-slow: time each file's sequential read and leave the fast ones alone.
    let left_alone =
        if o.only_slow { slow_files(o, &planned).map_err(crate::rewrite::before_writing)? } else { HashMap::new() };
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
    let state = crate::host::state_dir::prepare(&o.state_dir, &frozen, o.chunk_size.bytes() * 2 + (1 << 20))?;
    let (progress, files_total, files_done) = overall_progress(&planned, &left_alone, earlier.as_ref(), quiet);
    let run = FileRun {
        o,
        stop: &stop,
        shared: Arc::default(),
        state_dir: &state.path,
        planned: &planned,
        left_alone: &left_alone,
        earlier: earlier.as_ref(),
        placement: &placement,
        pending: Rc::new(RefCell::new(Pending {
            journals: Vec::new(),
            record: run_record(o, record_path, earlier.as_ref())?,
        })),
        freezes: RefCell::default(),
        progress: RefCell::new(progress),
        files_done: files_done.into(),
        files_total,
        run_start: Instant::now(),
    };
    let mut acc = Accounts::default();
    let outcome = run.groups(&groups, unfinished, &mut acc);
    run.progress.borrow().close();
    run.finish(outcome?, acc, &measured, report)
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
    earlier: Option<&record::Earlier>,
    quiet: bool,
) -> (Progress, usize, usize) {
    let (mut bytes, mut already, mut files, mut done) = (0, 0, 0, 0);
    for (_, p) in planned.iter().enumerate().filter(|(fi, _)| !left_alone.contains_key(fi)) {
        let size = std::fs::metadata(&p.path).map_or(0, |m| m.len());
        if size == 0 {
            continue;
        }
        (bytes, files) = (bytes + size, files + 1);
        if let Some(size) = earlier.and_then(|e| done_earlier(e, &p.path)) {
            (already, done) = (already + size, done + 1);
        }
    }
    let mut progress = Progress::new(bytes, already, quiet).spanning();
    progress.set_message(format!("{done} of {files} files"));
    (progress, files, done)
}

/// The run's record: the interrupted one's, continued, or a new one.
fn run_record(o: &RewriteOptions, path: PathBuf, earlier: Option<&record::Earlier>) -> Result<record::Record> {
    Ok(match earlier {
        Some(e) => record::Record::resume(path, e)?,
        None => record::Record::new(
            path,
            record::RunHeader {
                targets: record::canonical_targets(&o.targets),
                options: RunOptions::of(o),
                started_at: now_rfc3339(),
            },
        ),
    })
}

/// What a file-mode run shares across its filesystems.
struct FileRun<'a> {
    o: &'a RewriteOptions,
    stop: &'a StopFlag,
    shared: SharedClaims,
    state_dir: &'a Path,
    planned: &'a [Planned],
    /// `--only-slow`: the files left alone, with why.
    left_alone: &'a HashMap<usize, String>,
    earlier: Option<&'a record::Earlier>,
    /// Where each filesystem's guardian goes.
    placement: &'a crate::host::cgroup::Placement,
    /// Journals of files whose window is still open, and the files done in it: written
    /// after it closes.
    pending: Rc<RefCell<Pending>>,
    /// Every freeze of the run, and the ones each file was rewritten in.
    freezes: RefCell<Freezes>,
    /// One progress over all files: bytes and files done, rate and ETA.
    progress: RefCell<Progress>,
    files_done: std::cell::Cell<usize>,
    files_total: usize,
    run_start: Instant,
}

/// The run's freezes, numbered across its filesystems, and each file's first and last:
/// small files share freezes that another engine run (or the file loop) closes, so a
/// file's own engine run cannot tell how long its freeze lasted.
#[derive(Default)]
struct Freezes {
    /// Seconds frozen, by window number - 1.
    seconds: Vec<f64>,
    /// A file's first and last window.
    files: HashMap<usize, (u64, u64)>,
}

impl Freezes {
    fn closed(&mut self, window: u64, end: &Result<crate::host::freeze::WindowEnd>) {
        let (Ok(end), Some(i)) = (end, (window as usize).checked_sub(1)) else { return };
        if self.seconds.len() <= i {
            self.seconds.resize(i + 1, 0.0);
        }
        self.seconds[i] = end.frozen.as_secs_f64();
    }

    /// Each file's windows, and the longest of them, into its report.
    fn fill(&self, reports: &mut Reports) {
        for (fi, r) in reports.iter_mut() {
            let Some(&(first, last)) = self.files.get(fi) else { continue };
            r.windows = last + 1 - first;
            let own = self.seconds.get(first as usize - 1..(last as usize).min(self.seconds.len())).unwrap_or(&[]);
            r.longest_freeze_seconds = own.iter().copied().fold(0.0, f64::max);
        }
    }
}

/// The file loop's guard as the engine sees it: the same, and each freeze it closes is
/// noted in the run's [`Freezes`].
struct Noted<'a> {
    guard: &'a mut Batched<WritersChecked<GuardedFreeze>>,
    freezes: &'a RefCell<Freezes>,
    /// Windows of the filesystems before this one.
    base: u64,
}

impl Noted<'_> {
    /// Ends the window (`end` or `end_complete`), noting it if it closed.
    fn close(
        &mut self,
        end: impl FnOnce(&mut Batched<WritersChecked<GuardedFreeze>>) -> Result<crate::host::freeze::WindowEnd>,
    ) -> Result<crate::host::freeze::WindowEnd> {
        let (window, open) = (self.base + self.guard.windows, self.guard.frozen_now());
        let r = end(self.guard);
        if open && !self.guard.frozen_now() {
            self.freezes.borrow_mut().closed(window, &r);
        }
        r
    }
}

impl WindowGuard for Noted<'_> {
    fn freezes(&self) -> bool {
        self.guard.freezes()
    }
    fn deadline(&self) -> Option<Duration> {
        self.guard.deadline()
    }
    fn time_left(&self) -> Option<Duration> {
        self.guard.time_left()
    }
    fn begin(&mut self) -> Result<()> {
        self.guard.begin()
    }
    fn may_write(&mut self) -> Result<bool> {
        self.guard.may_write()
    }
    fn announce(&mut self, offset: u64, len: u64, hash: &blake3::Hash) {
        self.guard.announce(offset, len, hash)
    }
    fn wrote(&mut self) -> Result<()> {
        self.guard.wrote()
    }
    fn reporter(&self) -> Result<crate::engine::guard::Reporter> {
        self.guard.reporter()
    }
    fn recheck(&mut self) -> Result<()> {
        self.guard.recheck()
    }
    fn end(&mut self) -> Result<crate::host::freeze::WindowEnd> {
        self.close(|g| g.end())
    }
    fn end_complete(&mut self) -> Result<crate::host::freeze::WindowEnd> {
        self.close(|g| g.end_complete())
    }
    fn frozen_now(&self) -> bool {
        self.guard.frozen_now()
    }
}

/// What the run added up: engine figures, freezes, and each file's report.
#[derive(Default)]
struct Accounts {
    totals: EngineStats,
    windows: u64,
    file_reports: Reports,
}

impl FileRun<'_> {
    /// Each filesystem in turn. `Err`: stopped before its jobs (nothing more is
    /// reported); `Ok(outcome)`: the first error of the jobs, or of closing a window.
    fn groups(&self, groups: &[FsGroup], mut unfinished: Option<Error>, acc: &mut Accounts) -> Result<Result<()>> {
        let mut outcome = Ok(());
        for (gi, g) in groups.iter().enumerate() {
            let (jobs, end) = self.group(gi, g, &mut unfinished, acc)?;
            match (jobs, end) {
                (Err(e), _) => return Ok(Err(e)),
                (Ok(()), Err(e)) => outcome = Err(e),
                (Ok(()), Ok(())) => {}
            }
        }
        Ok(outcome)
    }

    /// One filesystem: its device taken and checked, one guardian, its files' jobs.
    /// Returns the jobs' result and that of closing the last window.
    fn group(
        &self,
        gi: usize,
        g: &FsGroup,
        unfinished: &mut Option<Error>,
        acc: &mut Accounts,
    ) -> Result<(Result<()>, Result<()>)> {
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
        let mut guard = self.guard(g)?;
        let state_on_fs = crate::host::state_dir::on_frozen(self.state_dir, std::slice::from_ref(&g.fs));
        if state_on_fs {
            log::warn!(
                "the state directory {} is on {}, which is frozen: each file gets windows of its own (journals cannot be opened while it is frozen). A state directory on another filesystem lets small files share windows",
                self.state_dir.display(),
                g.fs.mount_point.display()
            );
        }
        let cx = JobContext { run: self, g, dev: &dev, state_on_fs, window_base: acc.windows };
        let todo = self.todo(gi, &mut acc.file_reports);
        let r = run_jobs(&cx, &mut guard, &todo, &mut acc.totals, &mut acc.file_reports);
        // Whatever ended the jobs, the window closes here; the jobs' error comes first.
        let end = account(&mut acc.totals, cx.noted(&mut guard).close(|g| g.finish()))
            .and_then(|()| release(&dev, &self.pending));
        acc.windows += guard.windows;
        Ok((r, end))
    }

    /// One guardian per filesystem, forked while no other thread runs, and nothing else
    /// may write its device (a raw writer bypasses the freeze). Small files share
    /// windows: one freeze maps and rewrites as many as fit.
    fn guard(&self, g: &FsGroup) -> Result<Batched<WritersChecked<GuardedFreeze>>> {
        let mut freeze = GuardedFreeze::start(vec![g.fs.clone()], self.o.max_freeze(), self.placement)?;
        freeze.set_target(&g.device.path)?;
        let writers =
            WritersChecked::new(freeze, g.device.path.clone(), g.device.devices_sharing_bytes(&Sysfs::default()));
        Ok(Batched::new(writers, self.o.pause, self.stop.clone()))
    }

    /// The files of filesystem `gi` to rewrite; those left alone (`--only-slow`) and
    /// those the resumed run finished get their report here.
    fn todo(&self, gi: usize, file_reports: &mut Reports) -> Vec<usize> {
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
            file_reports.push((fi, fr));
        }
        if let Some(e) = self.earlier {
            todo.retain(|&fi| match done_earlier(e, &planned[fi].path) {
                Some(size) => {
                    let mut fr = skipped_report(&planned[fi].path, "");
                    (fr.skipped_reason, fr.size_bytes, fr.done_earlier) = (None, size, true);
                    fr.verification = if self.o.no_verify { "off" } else { "passed" }.into();
                    file_reports.push((fi, fr));
                    false
                }
                None => true,
            });
        }
        todo
    }

    /// After the last filesystem: the record closed when nothing is left unfinished,
    /// the benchmark after, and the report's figures.
    fn finish(&self, mut outcome: Result<()>, acc: Accounts, measured: &[&Path], report: &mut Report) -> Result<()> {
        let Accounts { mut totals, windows, mut file_reports } = acc;
        self.freezes.borrow().fill(&mut file_reports);
        // Finished, or refused before anything was written or done: no unfinished run to
        // leave behind (a resumed run's record stays: it still lists what was done).
        let refused_untouched = matches!(outcome, Err(Error::Refused { .. }))
            && totals.bytes_written == 0
            && self.earlier.is_none()
            && self.pending.borrow().record.nothing_done();
        if outcome.is_ok() || refused_untouched {
            self.pending.borrow_mut().record.finish();
        }
        if self.o.bench && outcome.is_ok() {
            log::info!("benchmarking the same files after the rewrite");
            // Files deleted during the run are not read after it either (nor at the
            // re-check, those deleted by then).
            let still: Vec<&Path> = measured.iter().copied().filter(|p| p.exists()).collect();
            outcome = match crate::measure::passes::measure_files(&still, &self.o.bench_opts) {
                Ok((b, s)) => {
                    if let Some(before) = &report.bench_before {
                        let v = crate::measure::bench::verdict_of(before, &b);
                        let target = || {
                            let left: Vec<&Path> = still.iter().copied().filter(|p| p.exists()).collect();
                            crate::measure::passes::files_target(&left)
                        };
                        report.verdict =
                            crate::measure::passes::recheck(Some(v), before, &b, &self.o.bench_opts, self.stop, target);
                    }
                    (report.bench_after, report.scan_after) = (Some(b), Some(s));
                    Ok(())
                }
                Err(e) => crate::rewrite::cut_short(report.bench_before.as_ref(), e).map(|v| report.verdict = v),
            };
        }
        // Freezes, not engine windows: files rewritten in one freeze share it.
        totals.windows = windows;
        report.results = Some(totals);
        // In path order, whatever order the runs took.
        file_reports.sort_by_key(|(fi, _)| *fi);
        report.files = Some(file_reports.into_iter().map(|(_, r)| r).collect());
        outcome
    }
}

/// The engine runs of one filesystem, in order, in windows shared while time is left in
/// them. Returns at the first error; the caller closes the window.
fn run_jobs(
    cx: &JobContext,
    guard: &mut Batched<WritersChecked<GuardedFreeze>>,
    todo: &[usize],
    totals: &mut EngineStats,
    file_reports: &mut Reports,
) -> Result<()> {
    let pending = &cx.run.pending;
    // The record names the run before its first window: killed in it, the next run
    // knows an unfinished run is there.
    release(cx.dev, pending)?;
    // Whenever a window closes, even inside a run of many windows, what waited for
    // it goes out: a kill then loses no file already finished.
    guard.after_thaw = Some(Box::new({
        let (dev, pending) = (Arc::clone(cx.dev), Rc::clone(pending));
        move || release(&dev, &pending)
    }));
    let jobs = group_jobs(cx, todo);
    for (ji, job) in jobs.iter().enumerate() {
        guard.more = !cx.state_on_fs && ji + 1 < jobs.len();
        let (fr, stats, r) = run_job(cx, guard, job);
        add(totals, &stats);
        file_reports.extend(fr);
        r?;
        if !guard.frozen_now() {
            release(cx.dev, pending)?;
        }
        // --rate over the whole run: the windows of each job keep to it; between
        // jobs, wait off whatever the run is still ahead by, thawed.
        if let Some(rate) = cx.run.o.rate.map(|r| r.bytes_per_second()) {
            let due = Duration::from_secs_f64(totals.bytes_written as f64 / rate as f64);
            if due > cx.run.run_start.elapsed() {
                account(totals, cx.noted(guard).close(|g| g.finish()))?;
                release(cx.dev, pending)?;
                cx.run.stop.sleep(due.saturating_sub(cx.run.run_start.elapsed()));
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
    run: &'a FileRun<'a>,
    g: &'a FsGroup,
    dev: &'a Arc<DirectDevice>,
    state_on_fs: bool,
    /// Windows of the filesystems before this one.
    window_base: u64,
}

impl JobContext<'_> {
    fn chunk_size(&self) -> u64 {
        self.run.o.chunk_size.bytes()
    }

    /// The guard, noting the freezes it closes.
    fn noted<'g>(&'g self, guard: &'g mut Batched<WritersChecked<GuardedFreeze>>) -> Noted<'g> {
        Noted { guard, freezes: &self.run.freezes, base: self.window_base }
    }
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
fn group_jobs(cx: &JobContext, todo: &[usize]) -> Vec<Job> {
    let planned = cx.run.planned;
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
            md.len() <= cx.chunk_size() * SMALL_FILE_CHUNKS
                && !cx.state_on_fs
                && !file_journal_path(cx.run.state_dir, &file_dev(md), md.ino()).exists()
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

/// A large file's journal: by device and inode (its identity, extents included, is
/// inside, checked on resume).
fn file_journal_path(state_dir: &Path, dev: &str, ino: u64) -> PathBuf {
    state_dir.join(format!("file-{}-{ino}.journal", dev.replace(':', "_")))
}

/// Files' reports, by their index in the run.
type Reports = Vec<(usize, FileReport)>;

/// What one engine run gave: its files' reports, its engine stats, and the error that
/// stops the whole run, if any.
type JobOutcome = (Reports, EngineStats, Result<()>);

/// Opens a job's files. Files deleted since they were listed get a report instead.
fn open_members(cx: &JobContext, job: &Job) -> Result<(Vec<Member>, Reports)> {
    let planned = cx.run.planned;
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
        let path = file_journal_path(cx.run.state_dir, &id.dev, id.ino);
        return open_journal(&path, &id, cx.g, cx.chunk_size(), end, deferred, cx.run.o.restart);
    }
    let run = RunRecord {
        version: journal::JOURNAL_VERSION,
        identity: cx.g.device.identity.clone(),
        chunk_size_bytes: cx.chunk_size(),
        range_start_bytes: 0,
        range_end_bytes: end,
        chunks_total: end.div_ceil(cx.chunk_size()),
        started_at: now_rfc3339(),
        file: None,
        options: None,
    };
    let path = cx.run.state_dir.join(format!("file-batch-{}.journal", cx.g.device.identity.name));
    if deferred { Ok((0, Journal::create_deferred(&path, run))) } else { Ok((0, Journal::create(&path, run)?)) }
}

fn run_job(cx: &JobContext, guard: &mut Batched<WritersChecked<GuardedFreeze>>, job: &Job) -> JobOutcome {
    let fail = |reports, e: Error| (reports, EngineStats::default(), Err(e));
    let (members, mut reports) = match open_members(cx, job) {
        Ok(x) => x,
        Err(e) => return fail(Vec::new(), e),
    };
    if members.is_empty() {
        return (reports, EngineStats::default(), Ok(()));
    }
    let map: Map = Arc::default();
    let mut planner = FilesPlanner::new(members, Arc::clone(&map), Arc::clone(&cx.run.shared));
    let range_end = planner.end();
    let (start, mut journal) = match job_journal(cx, job, &planner.members, range_end, guard.frozen_now()) {
        Ok(x) => x,
        Err(e) => return fail(reports, e),
    };
    let name = job_name(&planner.members, start, range_end);
    let target = FileTarget { dev: Arc::clone(cx.dev), map, name: name.clone() };
    let cfg = job_config(cx, &planner.members, start, range_end);
    // A line per file would be a line per file in a cron mail: the progress says how far
    // the run is; -v says what each engine run rewrites. A resumed file is news.
    if start > 0 {
        log::info!("{name}");
    } else {
        log::debug!("{name}");
    }
    if let Err(e) = guard.inner.inner.set_journal(journal.path()) {
        return fail(reports, e);
    }
    let (stats, result) = run_engine(cx, guard, &target, &cfg, &mut planner, &mut journal);
    planner.credit(stats.next_offset_bytes);
    let done = result.is_ok();
    for m in &planner.members {
        reports.push((m.index, member_report(m, start, &stats, done, cfg.verify)));
    }
    settle_members(cx, &planner.members, &stats, done);
    // Refused before writing anything (another freezer, another writer): a new journal
    // would only make the next run think something is unfinished.
    let refused_untouched = matches!(result, Err(Error::Refused { .. })) && stats.bytes_written == 0 && start == 0;
    if refused_untouched || (done && (job.batch || planner.members.iter().all(|m| m.skipped.is_none()))) {
        // Done: its journal would only say so, and thousands of files would leave
        // thousands of journals behind.
        journal.discard();
    } else if journal.is_held() {
        cx.run.pending.borrow_mut().journals.push(journal);
    }
    (reports, stats, result)
}

/// The engine over a job's files, with the run's progress, noting the freezes its files
/// were rewritten in.
fn run_engine(
    cx: &JobContext,
    guard: &mut Batched<WritersChecked<GuardedFreeze>>,
    target: &FileTarget,
    cfg: &EngineConfig,
    planner: &mut FilesPlanner,
    journal: &mut Journal,
) -> (EngineStats, Result<()>) {
    let progress = &mut *cx.run.progress.borrow_mut();
    let job_end = progress.done() + planner.members.iter().map(|m| m.size).sum::<u64>();
    let (before, was_open) = (guard.windows, guard.frozen_now());
    let (stats, result) = engine::run(target, cfg, planner, &mut cx.noted(guard), journal, progress, cx.run.stop);
    // Holes, unwritten and shared ranges are not rewritten, yet done; a resumed file's
    // start was done before.
    if result.is_ok() {
        progress.advance(job_end.saturating_sub(progress.done()));
    }
    cx.run.files_done.set(cx.run.files_done.get() + planner.members.len());
    progress.set_message(format!("{} of {} files", cx.run.files_done.get(), cx.run.files_total));
    // The windows its files were rewritten in: the one open when it began, if one was.
    let first = if was_open { before } else { before + 1 };
    if guard.windows >= first.max(1) {
        let span = (cx.window_base + first, cx.window_base + guard.windows);
        cx.run.freezes.borrow_mut().files.extend(planner.members.iter().map(|m| (m.index, span)));
    }
    (stats, result)
}

/// What a job rewrites, in words: a file alone (resumed, perhaps), or a batch of small
/// files. Also the target's name in the engine's errors.
fn job_name(members: &[Member], start: u64, end: u64) -> String {
    match members {
        [one] if start > 0 => {
            format!("{}: resuming at {} of {}", one.path.display(), human_bytes(start), human_bytes(end))
        }
        [one] => format!("{} ({})", one.path.display(), human_bytes(one.size)),
        [first, .., last] => format!(
            "{} small files ({}), in device order, from {} to {}",
            members.len(),
            human_bytes(members.iter().map(|m| m.size).sum()),
            first.path.display(),
            last.path.display()
        ),
        [] => unreachable!("members is not empty"),
    }
}

/// The engine's configuration for one job over `[0, range_end)` of its files.
fn job_config(cx: &JobContext, members: &[Member], start: u64, range_end: u64) -> EngineConfig {
    let o = cx.run.o;
    EngineConfig {
        chunk_size: cx.chunk_size(),
        range_start: 0,
        range_end,
        start_offset: start,
        verify: !o.no_verify,
        read_ahead: o.read_ahead,
        pause: o.pause,
        journal_on_frozen_fs: cx.state_on_fs,
        max_overruns: o.max_overruns,
        rate_bytes_per_second: o.rate.map(|r| r.bytes_per_second()),
        rescue: Some(crate::engine::rescue::RescueTo {
            dir: cx.run.state_dir.to_path_buf(),
            device_path: cx.g.device.path.clone(),
            identity: cx.g.device.identity.clone(),
            files: members.iter().map(|m| (m.base, m.span, m.path.display().to_string())).collect(),
        }),
    }
}

/// Files done go into the run's record (after the window closes); skipped ones are said.
fn settle_members(cx: &JobContext, members: &[Member], stats: &EngineStats, done: bool) {
    for m in members {
        // Done when its run finished, or its cursor went past the whole file; a skipped
        // file is not done (a resume looks at it again, and says why it skips it).
        if m.skipped.is_none()
            && (done || m.base + m.span <= stats.next_offset_bytes)
            && let Ok(md) = m.file_metadata()
        {
            cx.run.pending.borrow_mut().record.done(file_identity(&m.path, &md));
        }
        if let Some(why) = &m.skipped {
            log::warn!("{}: skipped: {why}", m.path.display());
        }
    }
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
fn slow_files(o: &RewriteOptions, planned: &[Planned]) -> Result<HashMap<usize, String>> {
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
    let limit = o.slow_threshold * reference;
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

/// A file's journal: continues an unfinished run of the same file (same device, inode,
/// birth time and extents), starts afresh otherwise (a file whose identity changed is planned
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
            && r.run.as_ref().is_some_and(|run| {
                run.file.as_ref().is_some_and(|f| f.same_layout(id)) && run.chunk_size_bytes == chunk_size
            })
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

/// The size of a file the resumed run finished (the same file, its extents unmoved:
/// [`FileIdentity::same_layout`]), or None.
fn done_earlier(e: &record::Earlier, path: &Path) -> Option<u64> {
    let md = std::fs::metadata(path).ok()?;
    e.done.contains(&record::key(&file_identity(path, &md))).then_some(md.len())
}

/// What the dry run says: per filesystem the files, the bytes to rewrite, and the
/// windows and time frozen to expect; the warnings. Returns it and every file's line
/// (shown with `-v`).
fn describe(
    o: &RewriteOptions,
    groups: &[FsGroup],
    planned: &[Planned],
    placement: &crate::host::cgroup::Placement,
    warnings: &[String],
) -> (String, String) {
    let max_freeze = o.max_freeze();
    let mut s = format!(
        "plan: {} file(s), windows of at most {:.3} s each; {}\n  guardian: {}\n  guardian priority: {}\n",
        planned.len(),
        max_freeze.as_secs_f64(),
        crate::host::freeze::describe_bound(max_freeze),
        placement.describe(),
        crate::host::hardening::expected()
    );
    let mut detail = String::from("  every file:\n");
    let state_dir = crate::host::state_dir::resolve(&o.state_dir);
    for (gi, g) in groups.iter().enumerate() {
        s +=
            &format!("  filesystem {} ({}) on {}\n", g.fs.mount_point.display(), g.fs.fs_type, g.device.path.display());
        s += &crate::host::aliases::describe(&g.device.devices_sharing_bytes(&Sysfs::default()), &Sysfs::default());
        let files: Vec<&Planned> = planned.iter().filter(|p| p.fs == gi).collect();
        let alone = crate::host::state_dir::on_frozen(&state_dir, std::slice::from_ref(&g.fs));
        s += &describe_group(g, &files, max_freeze, alone, &mut detail);
    }
    for w in warnings {
        s += &format!("  warning: {w}\n");
    }
    s += "  nothing was written or frozen (dry run)\n";
    (s, detail)
}

/// One filesystem's files in the plan: their totals, and each file's line into `detail`.
/// Small files share windows (each file has its own when the state directory is on the
/// frozen filesystem, `alone`).
fn describe_group(g: &FsGroup, files: &[&Planned], max_freeze: Duration, alone: bool, detail: &mut String) -> String {
    let rate = assumed_rate(g);
    let per_window = rate * max_freeze.as_secs_f64() * 0.75;
    let windows_for = |bytes: u64| match (bytes, per_window > 0.0) {
        (0, _) | (_, false) => 0,
        (b, true) => (b as f64 / per_window).ceil().max(1.0) as u64,
    };
    // A shared (reflinked) range is rewritten once, by the first file that has it.
    let mut shared_seen = std::collections::HashSet::new();
    let (mut total, mut empty, mut windows) = (0, 0, 0);
    for p in files {
        let (extents, bytes, size) = planned_bytes(&p.path, &mut shared_seen);
        total += bytes;
        windows += if alone { windows_for(bytes) } else { 0 };
        let hot = hot_kind(&p.path).map(|(kind, _)| format!(" ({kind}: written all the time)")).unwrap_or_default();
        let what = match (size, bytes) {
            (0, _) => {
                empty += 1;
                EMPTY.to_string()
            }
            (_, 0) => {
                format!("{extents} extent(s), nothing to rewrite (holes, unwritten, or shared with a file before it)")
            }
            (_, b) if windows_for(b) > 1 => {
                format!("{extents} extent(s), {} to rewrite, about {} windows", human_bytes(b), windows_for(b))
            }
            (_, b) => format!("{extents} extent(s), {} to rewrite", human_bytes(b)),
        };
        *detail += &format!("    {}: {what}{hot}\n", p.path.display());
    }
    if !alone {
        windows = windows_for(total);
    }
    let frozen = if rate > 0.0 { format!("{:.1} s", total as f64 / rate) } else { "unknown".into() };
    format!(
        "    {} file(s){}, {} to rewrite: about {windows} window(s), {frozen} frozen in all, at an assumed {}/s{}\n",
        files.len(),
        if empty > 0 { format!(" ({empty} empty: nothing to rewrite)") } else { String::new() },
        human_bytes(total),
        human_bytes(rate as u64),
        if alone { " (a window or more per file: the state directory is on this filesystem)" } else { "" }
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

/// A file's extents, the bytes a run would rewrite, and its size; mapped without a
/// freeze, for the plan only (the run maps again while frozen).
fn planned_bytes(path: &Path, shared_seen: &mut std::collections::HashSet<(u64, u64)>) -> (usize, u64, u64) {
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let exts = std::fs::File::open(path).ok().and_then(|f| sys::fiemap(f.as_fd(), 0, 0).ok()).unwrap_or_default();
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
