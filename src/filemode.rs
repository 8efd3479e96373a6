//! File mode: `reseq rewrite FILE|DIR...` re-sequences the blocks of files on a mounted
//! ext2/3/4 or xfs filesystem, in short freeze windows, while applications keep writing.
//!
//! The engine is the device engine, unchanged. Two adapters make a file look like a
//! device to it:
//! - [`FilePlanner`] maps the file with FIEMAP at the start of every window, *while
//!   frozen* (only then is the map true for the whole window; a file seen in delayed
//!   allocation before the freeze has its real extents once frozen), and plans the file's
//!   ranges in file-offset order: the order in which a sequential scan reads them.
//!   Unwritten extents and holes are never written; shared (reflinked) extents are
//!   rewritten once per physical range across the whole run; a file with extents flagged
//!   UNKNOWN, DELALLOC, ENCODED, DATA_INLINE, DATA_TAIL, NOT_ALIGNED or DATA_ENCRYPTED is
//!   skipped with the reason.
//! - [`FileTarget`] turns the engine's file offsets into device offsets through that map,
//!   so every chunk is read from and written back to the device blocks the file occupies.
//!
//! Everything else is the device mode's: the guardian owns every freeze, a chunk's read
//! and write lie inside one window, every chunk is verified, and the journal (one per
//! file, keyed by device and inode) lets a run resume file by file.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cli::RewriteArgs;
use crate::device::{self, Sysfs};
use crate::engine::{self, EngineConfig, EngineStats, Planner};
use crate::error::{Error, Result};
use crate::freeze::{Batched, GuardedFreeze, WindowGuard, WritersChecked};
use crate::journal::{self, FileIdentity, Journal, RunRecord};
use crate::mounts::{self, MountedFs};
use crate::output::Progress;
use crate::report::{Report, now_rfc3339};
use crate::signals::StopFlag;
use crate::sys;
use crate::target::{BlockTarget, DirectDevice};
use crate::units::{self, human_bytes};

/// One piece of a file: `len` bytes at file offset `logical` live at device offset
/// `physical`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub len: u64,
}

type Map = Arc<Mutex<Vec<Extent>>>;

// include/uapi/linux/fiemap.h extent flags.
const UNWRITTEN: u32 = 0x800;
const SHARED: u32 = 0x2000;
const SKIP_FLAGS: [(u32, &str); 7] = [
    (0x2, "UNKNOWN"),
    (0x4, "DELALLOC"),
    (0x8, "ENCODED"),
    (0x80, "DATA_ENCRYPTED"),
    (0x100, "NOT_ALIGNED"),
    (0x200, "DATA_INLINE"),
    (0x400, "DATA_TAIL"),
];

/// Physical ranges of shared extents, and which file of the run claimed each.
pub type SharedClaims = Arc<Mutex<HashMap<(u64, u64), usize>>>;

/// Plans a file's ranges from FIEMAP, in every window.
pub struct FilePlanner {
    file: std::fs::File,
    /// This file's index in the run (for shared-extent claims).
    index: usize,
    map: Map,
    shared: SharedClaims,
    /// Why the file is skipped, if it is.
    pub skipped: Option<String>,
    /// Extents in the first map.
    pub extents: Option<usize>,
    pub bytes_unwritten: u64,
    pub bytes_shared_elsewhere: u64,
}

/// Turns FIEMAP extents from `cursor` on into the pieces to rewrite, merging pieces that
/// are adjacent both in the file and on the device. Returns the skip reason instead if an
/// extent cannot be rewritten safely.
pub fn plan_extents(
    exts: &[sys::FiemapExtent],
    cursor: u64,
    end: u64,
    mut shared_ok: impl FnMut(u64, u64) -> bool,
    unwritten: &mut u64,
    shared_elsewhere: &mut u64,
) -> std::result::Result<Vec<Extent>, String> {
    let mut out: Vec<Extent> = Vec::new();
    for e in exts {
        let bad: Vec<&str> = SKIP_FLAGS.iter().filter(|(f, _)| e.flags & f != 0).map(|(_, n)| *n).collect();
        if !bad.is_empty() {
            return Err(format!("an extent at file offset {} is flagged {}", e.logical, bad.join("|")));
        }
        let lo = e.logical.max(cursor);
        let hi = (e.logical + e.length).min(end);
        if lo >= hi {
            continue;
        }
        let (len, physical) = (hi - lo, e.physical + (lo - e.logical));
        if e.flags & UNWRITTEN != 0 {
            *unwritten += len;
            continue;
        }
        if e.flags & SHARED != 0 && !shared_ok(e.physical, e.length) {
            *shared_elsewhere += len;
            continue;
        }
        match out.last_mut() {
            Some(l) if l.logical + l.len == lo && l.physical + l.len == physical => l.len += len,
            _ => out.push(Extent { logical: lo, physical, len }),
        }
    }
    Ok(out)
}

impl Planner for FilePlanner {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        let clear = |map: &Map| map.lock().unwrap_or_else(|p| p.into_inner()).clear();
        if self.skipped.is_some() {
            return Ok(Vec::new());
        }
        let md = self.file.metadata().map_err(|e| Error::io("fstat", e))?;
        if md.nlink() == 0 {
            self.skipped = Some("deleted during the run".into());
            clear(&self.map);
            return Ok(Vec::new());
        }
        // FIEMAP_FLAG_SYNC returns at once on a frozen filesystem (nothing can be dirty).
        let exts =
            sys::fiemap(self.file.as_fd(), cursor, sys::FIEMAP_FLAG_SYNC).map_err(|e| Error::io("FIEMAP", e.into()))?;
        self.extents.get_or_insert(exts.len());
        let (index, shared) = (self.index, Arc::clone(&self.shared));
        let claim = |p: u64, l: u64| {
            let mut claims = shared.lock().unwrap_or_else(|p| p.into_inner());
            *claims.entry((p, l)).or_insert(index) == index
        };
        match plan_extents(&exts, cursor, end, claim, &mut self.bytes_unwritten, &mut self.bytes_shared_elsewhere) {
            Ok(pieces) => {
                let ranges = pieces.iter().map(|e| (e.logical, e.len)).collect();
                *self.map.lock().unwrap_or_else(|p| p.into_inner()) = pieces;
                Ok(ranges)
            }
            Err(reason) => {
                self.skipped = Some(reason);
                clear(&self.map);
                Ok(Vec::new())
            }
        }
    }
}

/// A file seen as a block device: file offsets in, device offsets out.
pub struct FileTarget {
    dev: Arc<DirectDevice>,
    map: Map,
    len: u64,
    name: String,
}

impl FileTarget {
    fn device_offset(&self, offset: u64, len: u64) -> std::io::Result<u64> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.iter()
            .find(|e| e.logical <= offset && offset + len <= e.logical + e.len)
            .map(|e| e.physical + (offset - e.logical))
            .ok_or_else(|| std::io::Error::other(format!("file offset {offset}+{len} is not in this window's map")))
    }
}

impl BlockTarget for FileTarget {
    fn describe(&self) -> String {
        self.name.clone()
    }
    fn len_bytes(&self) -> u64 {
        self.len
    }
    fn mem_align(&self) -> usize {
        self.dev.mem_align()
    }
    fn offset_align(&self) -> u64 {
        self.dev.offset_align()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let at = self.device_offset(offset, buf.len() as u64)?;
        self.dev.read_at(buf, at)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let at = self.device_offset(offset, buf.len() as u64)?;
        self.dev.write_at(buf, at)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.dev.flush()
    }
    fn device_offset(&self, offset: u64, len: u64) -> Option<u64> {
        FileTarget::device_offset(self, offset, len).ok()
    }
}

/// What file mode did to one file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct FileReport {
    pub path: String,
    pub size_bytes: u64,
    /// Extents in the first map (null: the file was never mapped).
    pub extents: Option<usize>,
    pub bytes_rewritten: u64,
    pub bytes_skipped_unwritten: u64,
    /// Shared extents another file of this run already rewrote.
    pub bytes_skipped_shared: u64,
    /// Holes (never allocated, never written), for a file done to its end.
    pub bytes_skipped_holes: u64,
    /// Why the file was skipped, if it was (its bytes then count as not rewritten).
    pub skipped_reason: Option<String>,
    /// `--only-slow`: why the file was left alone (it reads fast enough).
    pub left_alone: Option<String>,
    /// `--only-slow`: the file's sequential read throughput before the run.
    pub read_bytes_per_second: Option<f64>,
    /// Resumed from this file offset.
    pub resumed_from_bytes: u64,
    pub windows: u64,
    pub longest_freeze_seconds: f64,
    /// `passed`, `off` or `incomplete`.
    pub verification: String,
}

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
        t if !crate::usedspace::SUPPORTED.contains(&t) => {
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
                let device = device::inspect(&node, &sysfs).map_err(|_| {
                    Error::refused(
                        format!("{} ({}) has no device node at {}", fs.mount_point.display(), fs.dev, node.display()),
                        "create the node (no udev?) and run reseq again",
                    )
                })?;
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
        crate::plan::check_freeze_length(max_freeze, false)?;
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
    }
}

/// `reseq rewrite FILE|DIR...`.
pub fn run(args: &RewriteArgs, quiet: bool) -> (Report, Result<()>) {
    let started = Instant::now();
    let mut report = Report::new("rewrite", args.dry_run);
    let result = execute(args, quiet, &mut report);
    report.finish(started.elapsed(), &result);
    (report, result)
}

fn execute(args: &RewriteArgs, quiet: bool, report: &mut Report) -> Result<()> {
    let chunk_size = units::parse_size(&args.chunk_size).map_err(|e| Error::Usage(format!("--chunk-size: {e}")))?;
    let max_freeze = units::parse_duration(args.max_freeze_or(crate::cli::DEFAULT_FILE_MAX_FREEZE))
        .map_err(|e| Error::Usage(format!("--max-freeze: {e}")))?;
    let pause = units::parse_duration(&args.pause).map_err(|e| Error::Usage(format!("--pause: {e}")))?;
    let rate = crate::plan::parse_rate(args)?;
    if max_freeze < Duration::from_millis(10) || chunk_size == 0 || args.read_ahead == 0 || args.max_overruns == 0 {
        return Err(Error::Usage(
            "--max-freeze must be >= 10ms; --chunk-size, --read-ahead, --max-overruns positive".into(),
        ));
    }
    if args.bench || args.from_scan.is_some() || args.include_free || args.restart {
        return Err(Error::Usage(
            "file mode does not take --bench, --from-scan, --include-free or --restart (use reseq bench on the files)"
                .into(),
        ));
    }
    if !(args.slow_threshold > 0.0 && args.slow_threshold <= 1.0) {
        return Err(Error::Usage("--slow-threshold must be in (0, 1]".into()));
    }
    let files = collect(args)?;
    if files.is_empty() {
        return Err(Error::Usage("no regular files under the targets".into()));
    }
    crate::plan::check_privileges()?;
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
        report.freeze_bound = Some(crate::freeze::bound_report(max_freeze));
    }
    if args.dry_run {
        report.plan_text = Some(describe(&groups, &planned, max_freeze));
        return Ok(());
    }
    // --only-slow: time each file's sequential read and leave the fast ones alone.
    let left_alone = if args.only_slow { slow_files(args, &planned)? } else { HashMap::new() };
    // A cron job's priority: best-effort level 7 (ionice -c2 -n7), not the idle class:
    // an idle-class writer can be starved while the filesystem is frozen, stretching the
    // very stall the windows bound. Set before any thread starts, so all inherit it.
    if let Err(e) = sys::lower_io_priority() {
        log::warn!("could not lower the I/O priority: {e}");
    }
    let stop = StopFlag::install().map_err(|e| Error::io("installing signal handlers", e))?;
    sys::defer_job_control_stops().map_err(|e| Error::io("installing signal handlers", e.into()))?;
    let frozen: Vec<MountedFs> = groups.iter().map(|g| g.fs.clone()).collect();
    let state = crate::state_dir::prepare(&args.state_dir, &frozen, chunk_size * 2 + (1 << 20))?;
    let shared: SharedClaims = Arc::default();
    let run_start = Instant::now();
    let mut totals = EngineStats::default();
    let mut windows = 0;
    // Journals of files whose window is still open: written after it closes.
    let mut pending: Vec<Journal> = Vec::new();
    let mut file_reports = Vec::new();
    let mut outcome = Ok(());
    'groups: for (gi, g) in groups.iter().enumerate() {
        let _lock = crate::state_dir::lock_device(
            &state.path,
            &g.device.identity.name,
            &format!("{} ({})", g.device.path.display(), g.fs.mount_point.display()),
        )?;
        let dev = Arc::new(crate::rewrite::open_device(&g.device, true)?);
        crate::rescue::check_device(&crate::rescue::dirs(&state.path), &g.device.identity, dev.as_ref(), true)?;
        crate::rescue::check_torn_notes(&g.device.path, dev.as_ref())?;
        // One guardian per filesystem, forked while no other thread runs.
        // And nothing else may write its device: a raw writer bypasses the freeze.
        // Small files share windows: one freeze maps and rewrites as many as fit.
        let mut freeze = GuardedFreeze::start(vec![g.fs.clone()], max_freeze)?;
        freeze.set_target(&g.device.path)?;
        let mut guard = Batched::new(
            WritersChecked::new(
                freeze,
                g.device.path.clone(),
                g.device.devices_sharing_bytes(&crate::device::Sysfs::default()),
            ),
            pause,
        );
        let state_on_fs = crate::state_dir::on_frozen(&state.path, std::slice::from_ref(&g.fs));
        if state_on_fs {
            log::warn!(
                "the state directory {} is on {}, which is frozen: each file gets windows of its own (journals cannot be opened while it is frozen). A state directory on another filesystem lets small files share windows",
                state.path.display(),
                g.fs.mount_point.display()
            );
        }
        let last =
            planned.iter().enumerate().rfind(|(fi, p)| p.fs == gi && !left_alone.contains_key(fi)).map(|(fi, _)| fi);
        for (fi, p) in planned.iter().enumerate().filter(|(_, p)| p.fs == gi) {
            if let Some(why) = left_alone.get(&fi) {
                let mut fr = skipped_report(&p.path, "");
                fr.skipped_reason = None;
                fr.left_alone = Some(why.clone());
                fr.size_bytes = std::fs::metadata(&p.path).map(|m| m.len()).unwrap_or(0);
                file_reports.push(fr);
                continue;
            }
            guard.more = !state_on_fs && last != Some(fi);
            let (fr, stats, r) = rewrite_file(
                args,
                quiet,
                &stop,
                &shared,
                fi,
                &p.path,
                g,
                &dev,
                &mut guard,
                (chunk_size, pause, rate),
                (&state.path, state_on_fs),
                &mut pending,
            );
            add(&mut totals, &stats);
            file_reports.extend(fr);
            if let Err(e) = r {
                // The file's error comes first.
                let _ = account(&mut totals, guard.finish());
                let _ = release_journals(&dev, &mut pending);
                windows += guard.windows;
                outcome = Err(e);
                break 'groups;
            }
            if !guard.frozen_now()
                && let Err(e) = release_journals(&dev, &mut pending)
            {
                windows += guard.windows;
                outcome = Err(e);
                break 'groups;
            }
            // --rate over the whole run: the windows of each file keep to it; between
            // files, wait off whatever the run is still ahead by, thawed.
            if let Some(rate) = rate {
                let due = Duration::from_secs_f64(totals.bytes_written as f64 / rate as f64);
                if due > run_start.elapsed() {
                    if let Err(e) =
                        account(&mut totals, guard.finish()).and_then(|()| release_journals(&dev, &mut pending))
                    {
                        windows += guard.windows;
                        outcome = Err(e);
                        break 'groups;
                    }
                    stop.sleep(due.saturating_sub(run_start.elapsed()));
                }
            }
        }
        if let Err(e) = account(&mut totals, guard.finish()).and_then(|()| release_journals(&dev, &mut pending)) {
            outcome = Err(e);
        }
        windows += guard.windows;
    }
    // Freezes, not engine windows: files rewritten in one freeze share it.
    totals.windows = windows;
    report.results = Some(totals);
    report.files = Some(file_reports);
    outcome
}

/// Counts a window that the file loop closed (the engine counted the others).
fn account(t: &mut EngineStats, end: Result<crate::freeze::WindowEnd>) -> Result<()> {
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

/// What one file's rewrite gave: its report (if it got that far), its engine stats, and
/// the error that stops the whole run, if any.
type FileOutcome = (Option<FileReport>, EngineStats, Result<()>);

#[allow(clippy::too_many_arguments)]
fn rewrite_file(
    args: &RewriteArgs,
    quiet: bool,
    stop: &StopFlag,
    shared: &SharedClaims,
    index: usize,
    path: &Path,
    g: &FsGroup,
    dev: &Arc<DirectDevice>,
    guard: &mut Batched<WritersChecked<GuardedFreeze>>,
    (chunk_size, pause, rate): (u64, Duration, Option<u64>),
    (state_dir, state_on_fs): (&Path, bool),
    pending: &mut Vec<Journal>,
) -> FileOutcome {
    let fail = |e: Error| (None, EngineStats::default(), Err(e));
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        // Deleted between listing and now: nothing to do.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (Some(skipped_report(path, "deleted before its turn")), EngineStats::default(), Ok(()));
        }
        Err(e) => return fail(Error::io(format!("opening {}", path.display()), e)),
    };
    let md = match file.metadata() {
        Ok(m) => m,
        Err(e) => return fail(Error::io("fstat", e)),
    };
    let identity = file_identity(path, &md);
    let align = u64::from(g.device.dio_offset_align);
    // The file as it is now, rounded up to whole blocks of the device.
    let range_end = md.len().div_ceil(align) * align;
    let jpath = state_dir.join(format!("file-{}-{}.journal", identity.dev.replace(':', "_"), identity.ino));
    let (start, mut journal) = match open_journal(&jpath, &identity, g, chunk_size, range_end, guard.frozen_now()) {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let map: Map = Arc::default();
    let mut planner = FilePlanner {
        file,
        index,
        map: Arc::clone(&map),
        shared: Arc::clone(shared),
        skipped: None,
        extents: None,
        bytes_unwritten: 0,
        bytes_shared_elsewhere: 0,
    };
    let target = FileTarget { dev: Arc::clone(dev), map, len: range_end, name: path.display().to_string() };
    let cfg = EngineConfig {
        chunk_size,
        range_start: 0,
        range_end,
        start_offset: start,
        verify: !args.no_verify,
        read_ahead: args.read_ahead,
        pause,
        journal_on_frozen_fs: state_on_fs,
        max_overruns: args.max_overruns,
        rate_bytes_per_second: rate,
        rescue: Some(crate::rescue::RescueTo {
            dir: state_dir.to_path_buf(),
            device_path: g.device.path.clone(),
            identity: g.device.identity.clone(),
            file: Some(path.display().to_string()),
        }),
    };
    if !quiet {
        log::info!("{}: {} from offset {start}", path.display(), human_bytes(md.len()));
    }
    if let Err(e) = guard.inner.inner.set_journal(journal.path()) {
        return fail(e);
    }
    let mut progress = Progress::new(range_end, start, quiet);
    let (stats, result) = engine::run(&target, &cfg, &mut planner, guard, &mut journal, &mut progress, stop);
    progress.finish();
    let fr = FileReport {
        path: path.display().to_string(),
        size_bytes: md.len(),
        extents: planner.extents,
        bytes_rewritten: stats.bytes_written,
        bytes_skipped_unwritten: planner.bytes_unwritten,
        bytes_skipped_shared: planner.bytes_shared_elsewhere,
        bytes_skipped_holes: if result.is_ok() && planner.skipped.is_none() {
            // Whatever of the file is neither rewritten nor otherwise skipped is a hole.
            range_end
                .saturating_sub(start + stats.bytes_written + planner.bytes_unwritten + planner.bytes_shared_elsewhere)
        } else {
            0
        },
        skipped_reason: planner.skipped.clone(),
        left_alone: None,
        read_bytes_per_second: None,
        resumed_from_bytes: start,
        windows: stats.windows,
        longest_freeze_seconds: stats.longest_freeze_seconds,
        verification: match (&result, cfg.verify) {
            (Ok(()), true) => "passed",
            (Ok(()), false) => "off",
            _ => "incomplete",
        }
        .into(),
    };
    if let Some(why) = &planner.skipped {
        log::warn!("{}: skipped: {why}", path.display());
    }
    if result.is_ok() && planner.skipped.is_none() {
        // Done: its journal would only say so, and thousands of files would leave
        // thousands of journals behind.
        journal.discard();
    } else if journal.is_held() {
        pending.push(journal);
    }
    (Some(fr), stats, result)
}

/// For `--only-slow`: each file's sequential read (O_DIRECT, 1 MiB, QD1, one pass); the
/// files below `--slow-threshold` x the median of the fastest quarter are rewritten, the
/// others returned here with the reason they are left alone.
fn slow_files(args: &RewriteArgs, planned: &[Planned]) -> Result<HashMap<usize, String>> {
    let mut rates = Vec::new();
    for p in planned {
        let src = crate::readbench::Source::open(&p.path)?;
        let len = src.len;
        let target = crate::readbench::Target::Real(vec![src]);
        let t = crate::readbench::read_span(&target, 1 << 20, 1, 0, len)?;
        rates.push(if len == 0 { f64::INFINITY } else { t.rate() });
    }
    let mut sorted: Vec<f64> = rates.iter().copied().filter(|r| r.is_finite()).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let top = sorted.len().div_ceil(4).max(1);
    let reference = crate::bench::median(&sorted[..top.min(sorted.len())]);
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
    }
}

/// The file's journal: continues an unfinished run of the same file (same device, inode
/// and birth time), starts afresh otherwise: a file whose identity changed is planned
/// again.
/// A file's journal: the one to resume, or a new one; new ones are started in memory
/// while a shared window is open (`deferred`), and written after it.
fn open_journal(
    path: &Path,
    id: &FileIdentity,
    g: &FsGroup,
    chunk_size: u64,
    end: u64,
    deferred: bool,
) -> Result<(u64, Journal)> {
    let resumable = journal::read(path)?.filter(|r| {
        !r.finished
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
    };
    if deferred { Ok((0, Journal::create_deferred(path, run))) } else { Ok((0, Journal::create(path, run)?)) }
}

/// After a shared window closed: the device is flushed, then the journals of the files
/// rewritten in it are written (a `done` record never reaches the disk before the data).
fn release_journals(dev: &DirectDevice, pending: &mut Vec<Journal>) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    dev.flush().map_err(|e| Error::io("flushing the device's write cache", e))?;
    for mut j in pending.drain(..) {
        j.set_hold(false)?;
    }
    Ok(())
}

fn describe(groups: &[FsGroup], planned: &[Planned], max_freeze: Duration) -> String {
    let mut s = format!(
        "plan: {} file(s), windows of at most {:.3} s each; {}\n",
        planned.len(),
        max_freeze.as_secs_f64(),
        crate::freeze::describe_bound(max_freeze)
    );
    for (gi, g) in groups.iter().enumerate() {
        s +=
            &format!("  filesystem {} ({}) on {}\n", g.fs.mount_point.display(), g.fs.fs_type, g.device.path.display());
        // A rewrite reads, writes and reads back: assume a third of the read speed,
        // measured on up to 16 MiB of the device (reads only).
        let rate = crate::readbench::Source::open(&g.device.path)
            .and_then(|src| {
                let len = src.len.min(16 << 20);
                crate::readbench::read_span(&crate::readbench::Target::Real(vec![src]), 1 << 20, 1, 0, len)
            })
            .map(|t| t.rate() / 3.0)
            .unwrap_or(0.0);
        let per_window = rate * max_freeze.as_secs_f64() * 0.75;
        for p in planned.iter().filter(|p| p.fs == gi) {
            // Mapped without a freeze, for the plan only (the run maps again while frozen).
            let (n, bytes) = std::fs::File::open(&p.path)
                .ok()
                .and_then(|f| sys::fiemap(f.as_fd(), 0, 0).ok())
                .map(|e| (e.len(), e.iter().filter(|x| x.flags & UNWRITTEN == 0).map(|x| x.length).sum::<u64>()))
                .unwrap_or((0, 0));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(logical: u64, physical: u64, length: u64, flags: u32) -> sys::FiemapExtent {
        sys::FiemapExtent { logical, physical, length, flags, ..Default::default() }
    }

    #[test]
    fn plans_in_file_order_merging_physically_adjacent_pieces() {
        let (mut u, mut s) = (0, 0);
        let exts = [
            ext(0, 8192, 4096, 0),
            ext(4096, 12288, 4096, 0),          // adjacent in file and on disk: merged
            ext(8192, 4096, 4096, 0),           // behind on disk: its own piece, in file order
            ext(12288, 40960, 8192, UNWRITTEN), // never written
            ext(24576, 81920, 4096, SHARED),
        ];
        let got = plan_extents(&exts, 0, 1 << 20, |_, _| true, &mut u, &mut s).unwrap();
        assert_eq!(
            got,
            vec![
                Extent { logical: 0, physical: 8192, len: 8192 },
                Extent { logical: 8192, physical: 4096, len: 4096 },
                Extent { logical: 24576, physical: 81920, len: 4096 },
            ]
        );
        assert_eq!(u, 8192);
        // From a cursor inside an extent, and a shared range claimed by another file.
        let got = plan_extents(&exts, 6144, 1 << 20, |_, _| false, &mut u, &mut s).unwrap();
        assert_eq!(
            got,
            vec![
                Extent { logical: 6144, physical: 14336, len: 2048 },
                Extent { logical: 8192, physical: 4096, len: 4096 }
            ]
        );
        assert_eq!(s, 4096);
        let bad = [ext(0, 0, 4096, 0x200 | 0x100)];
        assert!(plan_extents(&bad, 0, 4096, |_, _| true, &mut u, &mut s).unwrap_err().contains("DATA_INLINE"));
    }
}
