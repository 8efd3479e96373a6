//! File mode's plan: the files under the targets, their filesystems and devices
//! checked, the interrupted run decided, the files chosen. A value: the dry run prints
//! it ([`describe`]), [`super::plan_and_execute`] runs it.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::engine::journal::FileIdentity;
use crate::host::cgroup::Placement;
use crate::host::device::{self, Sysfs};
use crate::host::mounts::{self, MountedFs};
use crate::host::shape::Shape;
use crate::host::state_dir::StateDir;
use crate::options::rewrite::{DEFAULT_FILE_MAX_FREEZE, RewriteOptions};
use crate::report::Report;
use crate::rewrite::checks;
use crate::rewrite::predict::{Outcome, Predicted};
use crate::rewrite::sequence::Unfinished;
use crate::support::error::{Error, Result};
use crate::support::units::{human_bytes, human_seconds};
use crate::sys;

use super::{hot, record, select};

/// A checked, complete description of a file-mode run.
pub(super) struct FilesPlan {
    /// The options the run uses: a resumed run's own where these leave them out.
    pub(super) options: RewriteOptions,
    pub(super) groups: Vec<FsGroup>,
    pub(super) planned: Vec<Planned>,
    /// The run's record (each filesystem's journal lies beside it).
    pub(super) record_path: PathBuf,
    /// The interrupted run this one continues (`--resume`).
    pub(super) earlier: Option<record::Earlier>,
    /// The files the interrupted run finished, with their sizes.
    pub(super) done_before: HashMap<usize, u64>,
    /// Each file's bytes a run rewrites (its written extents as mapped now; a range
    /// shared with a file before it counts once), by index: what the progress counts.
    pub(super) to_rewrite: Vec<u64>,
    /// Where each filesystem's guardian goes.
    pub(super) placement: Placement,
    /// `--only-slow`, `--older-than`: the choice (None: every file).
    pub(super) choice: Option<select::Choice>,
    /// The files the choice leaves alone, with why.
    pub(super) left_alone: HashMap<usize, String>,
    pub(super) state: StateDir,
    /// An unfinished run neither continued nor dropped: refused before anything is
    /// written (see [`crate::rewrite::sequence`]).
    pub(super) unfinished: Option<Unfinished>,
    /// The pipeline's depth (`options.read_ahead`) and why: over the bytes this run
    /// rewrites, chosen once the plan is made ([`super::layout::choose_depth`]).
    pub(super) depth: crate::measure::depth_probe::DepthChoice,
    /// The bytes this run rewrites: the files' not left alone nor finished earlier.
    pub(super) bytes: u64,
}

impl FilesPlan {
    /// The files to rewrite (to benchmark before and after): those not left alone.
    pub(super) fn measured(&self) -> Vec<&Path> {
        let chosen = |fi: &usize| !self.left_alone.contains_key(fi);
        (0..self.planned.len()).filter(chosen).map(|fi| self.planned[fi].path.as_path()).collect()
    }
}

/// Checks everything and builds the plan; writes nothing and freezes nothing (with
/// `--only-slow` or `--older-than`, reads the files to choose them). The choice and the
/// hot files' warnings go into `report`.
pub(super) fn plan(o: &RewriteOptions, report: &mut Report) -> Result<FilesPlan> {
    let record_path = record::path_for(&crate::host::state_dir::resolve(&o.state_dir), &o.targets);
    let earlier = earlier_run(o, &record_path)?;
    if matches!(earlier, Earlier::Continue(_)) {
        let notes = record::at_risk(&record_path);
        report.warnings.extend(notes.iter().map(|n| format!("the run being resumed {}", n.describe())));
    }
    let (earlier, unfinished) = match earlier {
        Earlier::Continue(e) => (Some(*e), None),
        Earlier::Refuse(what) => (None, Some(what)),
        Earlier::None => (None, None),
    };
    let resumed = earlier.as_ref().map(|e| e.header.options.apply(o, DEFAULT_FILE_MAX_FREEZE)).transpose()?;
    let o = resumed.unwrap_or_else(|| o.clone());
    let (groups, planned) = plan_files(&o)?;
    let unfinished = unfinished.map(|what| Unfinished { what: format!("an unfinished file-mode run exists: {what}") });
    report.warnings.extend(unfinished.iter().filter(|_| o.dry_run).map(|u| u.warning()));
    if !groups.is_empty() {
        report.freeze_bound = Some(crate::host::freeze::bound_report(o.max_freeze()));
    }
    let placement = crate::host::cgroup::plan_or_refuse(o.accept_cgroup_risk)?;
    report.guardian = Some(placement.describe());
    // A dry run's plan lists its warnings: logged too, each would be said twice.
    let hot = hot::hot_files(planned.iter().map(|p| p.path.as_path()));
    report.warnings.extend(crate::host::writers::refuse_uninspected(o.force)?.into_iter().chain(hot).inspect(|w| {
        if !o.dry_run {
            log::warn!("{w}");
        }
    }));
    // A run to be refused reads nothing to choose its files.
    let (choice, left_alone) =
        if unfinished.is_some() && !o.dry_run { (None, HashMap::new()) } else { choose(&o, &planned, report)? };
    let frozen: Vec<MountedFs> = groups.iter().map(|g| g.fs.clone()).collect();
    let state = checks::state_dir(&o.state_dir, &frozen, o.run.chunk_size, o.dry_run)?;
    let done_before = earlier.as_ref().map(|e| finished_earlier(e, &planned, &groups)).unwrap_or_default();
    let mut shared_seen = std::collections::HashSet::new();
    let to_rewrite: Vec<u64> =
        planned.iter().map(|p| planned_bytes(&p.path, &mut shared_seen).1 * copies(&groups[p.fs])).collect();
    let left = |(i, _): &(usize, &u64)| !left_alone.contains_key(i) && !done_before.contains_key(i);
    let bytes = to_rewrite.iter().enumerate().filter(left).map(|(_, b)| b).sum();
    let rate = o.run.rate.map(|r| r.bytes_per_second());
    report.warnings.extend(checks::finishes(bytes, o.run.chunk_size.bytes(), rate, o.force, o.dry_run)?);
    let plan = FilesPlan {
        options: o,
        groups,
        planned,
        record_path,
        earlier,
        done_before,
        to_rewrite,
        placement,
        choice,
        left_alone,
        state,
        unfinished,
        depth: crate::measure::depth_probe::DepthChoice::given(0),
        bytes,
    };
    Ok(plan)
}

/// Why an empty file is left alone (it has no block to rewrite).
pub(super) const EMPTY: &str = "empty, nothing to rewrite";

/// A file to rewrite, and the filesystem it is on.
pub(super) struct Planned {
    pub(super) path: PathBuf,
    pub(super) fs: usize,
}

/// Files under the targets (directories recursively, on one filesystem each), minus the
/// excluded ones, in path order.
fn collect(o: &RewriteOptions) -> Result<Vec<PathBuf>> {
    let patterns: Vec<glob::Pattern> = o
        .run
        .exclude
        .iter()
        .map(|p| glob::Pattern::new(p).map_err(|e| Error::Usage(format!("--exclude {p}: {e}"))))
        .collect::<Result<_>>()?;
    let excluded = |p: &Path| {
        patterns.iter().any(|g| g.matches_path(p) || p.file_name().is_some_and(|n| g.matches(&n.to_string_lossy())))
    };
    let mut out = Vec::new();
    for t in &o.targets {
        let md = std::fs::symlink_metadata(t).map_err(|e| Error::cannot_use(t, e))?;
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
pub(super) struct FsGroup {
    pub(super) fs: MountedFs,
    /// Its device (on btrfs, its first member).
    pub(super) device: device::BlockDeviceInfo,
    /// The device as planned, compared at every window.
    pub(super) shape: Shape,
    /// On btrfs: the chunk map and every member device.
    pub(super) btrfs: Option<BtrfsGroup>,
}

/// A mounted btrfs of the plan: each member is rewritten by an engine run of its own.
pub(super) struct BtrfsGroup {
    pub(super) layout: crate::host::btrfs::Layout,
    /// (devid, device, its shape as planned).
    pub(super) members: Vec<(u64, device::BlockDeviceInfo, Shape)>,
}

impl BtrfsGroup {
    /// The most copies a data chunk keeps of each byte: what a file's bytes are
    /// multiplied by in the bytes to rewrite.
    pub(super) fn copies(&self) -> u64 {
        let data = self.layout.chunks.iter().filter(|c| c.is_data());
        data.map(|c| c.copies() as u64).max().unwrap_or(1)
    }
}

/// The copies a file's bytes are rewritten in on filesystem `g`.
pub(super) fn copies(g: &FsGroup) -> u64 {
    g.btrfs.as_ref().map_or(1, BtrfsGroup::copies)
}

/// Checks every file's filesystem before anything is frozen or written.
fn check(o: &RewriteOptions, files: &[PathBuf]) -> Result<(Vec<FsGroup>, Vec<Planned>)> {
    let mounts = mounts::read_mounts().map_err(|e| Error::io("reading /proc/self/mountinfo", e))?;
    let sysfs = Sysfs::default();
    let mut groups: Vec<FsGroup> = Vec::new();
    let mut planned = Vec::new();
    let swap_files = device::active_swap_files(&std::fs::read_to_string("/proc/swaps").unwrap_or_default());
    for f in files {
        let md = std::fs::metadata(f).map_err(|e| Error::io(format!("stat {}", f.display()), e))?;
        let dev = (nix::sys::stat::major(md.dev()) as u32, nix::sys::stat::minor(md.dev()) as u32);
        let entry = mount_of(f, dev, &mounts)?;
        let idx = match groups.iter().position(|g| g.fs.dev_num == entry.dev) {
            Some(i) => i,
            None => {
                groups.push(fs_group(f, dev, entry, &mounts, &sysfs)?);
                groups.len() - 1
            }
        };
        checks::not_encrypted(f)?;
        checks::not_active_swap(f, (md.dev(), md.ino()), &swap_files)?;
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

/// The mount holding `f` (st_dev `dev`).
fn mount_of<'a>(f: &Path, dev: (u32, u32), mounts: &'a [mounts::MountEntry]) -> Result<&'a mounts::MountEntry> {
    let abs = std::path::absolute(f).unwrap_or_else(|_| f.to_path_buf());
    // btrfs reports an anonymous st_dev (0:N, another for each subvolume), not its
    // block device: find the mount by path then.
    mounts.iter().find(|m| m.dev == dev).or_else(|| mounts::mount_containing(mounts, &abs)).ok_or_else(|| {
        Error::refused(format!("{} is on no mounted filesystem reseq can see", f.display()), "check mountinfo")
    })
}

/// The filesystem of `f` (on device `dev`, mounted as `entry`) and its device, checked:
/// a supported type, writable, not DAX, with a device node.
fn fs_group(
    f: &Path,
    dev: (u32, u32),
    entry: &mounts::MountEntry,
    mounts: &[mounts::MountEntry],
    sysfs: &Sysfs,
) -> Result<FsGroup> {
    checks::file_mode_mount(f, entry, dev)?;
    let fs = mounts::filesystems_on(mounts, &entry.devices)
        .into_iter()
        .find(|fs| fs.dev_num == entry.dev)
        .ok_or_else(|| Error::Internal(format!("no filesystem for the mount of {}", f.display())))?;
    checks::read_write(f, &fs)?;
    if fs.fs_type == "btrfs" {
        return btrfs_group(fs, sysfs);
    }
    let device = device_of(&fs, sysfs)?;
    checks::writable(&device)?;
    checks::no_copy_on_write(&device, sysfs, &Ok(None))?;
    let shape = Shape::take(device.dev_num, sysfs);
    Ok(FsGroup { fs, device, shape, btrfs: None })
}

/// A mounted btrfs, checked: its data in profiles reseq rewrites, none of its own
/// writers running, every member a writable device.
fn btrfs_group(fs: MountedFs, sysfs: &Sysfs) -> Result<FsGroup> {
    let fd = crate::host::freeze::open_mount_point(&fs.mount_point)?;
    let layout = crate::host::btrfs::Layout::read(fd.as_fd())?;
    for (profile, _) in layout.data_profiles() {
        if let Some(why) = profile.refused() {
            return Err(Error::refused(
                format!("the btrfs at {} keeps data in {why}", fs.mount_point.display()),
                "convert its data to RAID1 or RAID10 (btrfs balance start -dconvert=raid1), or let btrfs rewrite it: btrfs balance start -d",
            ));
        }
    }
    crate::host::btrfs::refuse_own_writers(fd.as_fd(), &layout, &fs.mount_point)?;
    let mut members = Vec::new();
    for m in &layout.members {
        let info = device::inspect(&m.path, sysfs)?;
        let reader = crate::engine::target::DirectReader::open(&m.path)
            .map_err(|e| Error::io(format!("opening btrfs devid {} ({})", m.devid, m.path.display()), e))?;
        crate::host::btrfs::check_member(&layout, m, &reader)?;
        // Every member's refusals before any member is written (each run checks its own
        // again at its windows).
        checks::no_other_writers(&info, sysfs)?;
        checks::writable(&info)?;
        checks::no_copy_on_write(&info, sysfs, &Ok(None))?;
        let shape = Shape::take(info.dev_num, sysfs);
        members.push((m.devid, info, shape));
    }
    let (_, device, shape) =
        members.first().cloned().ok_or_else(|| Error::Internal("a btrfs without member devices".into()))?;
    Ok(FsGroup { fs, device, shape, btrfs: Some(BtrfsGroup { layout, members }) })
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

/// A file as a run records it: device, inode, birth time, and where its extents lie.
pub(super) fn file_identity(
    path: &Path,
    md: &std::fs::Metadata,
    exts: Option<&[sys::extents::FiemapExtent]>,
) -> FileIdentity {
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

/// A file's identity in the journal of a btrfs member's run: each member's journal
/// finishes it on its own.
pub(super) fn on_devid(mut id: FileIdentity, devid: Option<u64>) -> FileIdentity {
    if let Some(d) = devid {
        id.dev = format!("{}#devid{d}", id.dev);
    }
    id
}

/// A file's extents, mapped without syncing it or a freeze (for its identity, the run's
/// order and the plan; the run maps again while frozen).
pub(super) fn mapped(path: &Path) -> Option<Vec<sys::extents::FiemapExtent>> {
    let f = std::fs::File::open(path).ok()?;
    sys::extents::fiemap(f.as_fd(), 0, 0).ok()
}

/// blake3 of a file's extents (logical, physical, length).
fn fingerprint(extents: &[sys::extents::FiemapExtent]) -> String {
    let mut h = blake3::Hasher::new();
    for e in extents {
        for v in [e.logical, e.physical, e.length] {
            h.update(&v.to_le_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

/// The files under the targets and their filesystems, checked.
fn plan_files(o: &RewriteOptions) -> Result<(Vec<FsGroup>, Vec<Planned>)> {
    let files = collect(o)?;
    if files.is_empty() {
        return Err(Error::Usage("no regular files under the targets".into()));
    }
    crate::host::privileges::check()?;
    let (groups, planned) = check(o, &files)?;
    for g in &groups {
        checks::aligned(o.run.chunk_size, &g.device)?;
        for (_, d, _) in g.btrfs.iter().flat_map(|b| &b.members) {
            checks::aligned(o.run.chunk_size, d)?;
        }
    }
    Ok((groups, planned))
}

/// `--only-slow`, `--older-than`: the files to rewrite, chosen before the plan is shown;
/// the choice (None: every file) and the files left alone.
fn choose(
    o: &RewriteOptions,
    planned: &[Planned],
    report: &mut Report,
) -> Result<(Option<select::Choice>, HashMap<usize, String>)> {
    let paths: Vec<PathBuf> = planned.iter().map(|p| p.path.clone()).collect();
    let choice = select::choose(o, &paths).map_err(crate::rewrite::before::before_writing)?;
    report.file_selection = choice.as_ref().map(|c| c.summary.clone());
    let left_alone = choice.as_ref().map(|c| c.left_alone.clone()).unwrap_or_default();
    Ok((choice, left_alone))
}

/// What the plan does about an earlier run over the same targets.
enum Earlier {
    /// None is unfinished (or `--restart` drops it, or a dry run only mentions it).
    None,
    /// `--resume`: continued.
    Continue(Box<record::Earlier>),
    /// Neither asked: refused, as device mode does (this says which run); a dry run
    /// warns.
    Refuse(String),
}

/// An unfinished run over the same targets: continued with `--resume`, discarded with
/// `--restart`, and refused otherwise.
fn earlier_run(o: &RewriteOptions, path: &Path) -> Result<Earlier> {
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
        return Ok(Earlier::None);
    };
    let risk: String = record::at_risk(path).iter().map(|n| format!("; it {}", n.describe())).collect();
    let what =
        format!("the run over these files started {} ({} file(s) done{risk})", e.header.started_at, e.done.len());
    if o.restart {
        log::warn!("discarding {what}");
        return Ok(Earlier::None);
    }
    if o.resume {
        log::info!("resuming {what}, with its options: {}", e.header.options.describe());
        return Ok(Earlier::Continue(Box::new(e)));
    }
    Ok(Earlier::Refuse(what))
}

/// The files of `planned` the interrupted run finished, with their sizes: each mapped
/// once (FIEMAP and a hash of its extents), for the progress and the plan alike.
/// On btrfs, a file is finished once every member's run finished it.
fn finished_earlier(e: &record::Earlier, planned: &[Planned], groups: &[FsGroup]) -> HashMap<usize, u64> {
    let devids = |g: &FsGroup| match &g.btrfs {
        Some(b) => b.members.iter().map(|(d, ..)| Some(*d)).collect(),
        None => vec![None],
    };
    let done = |(fi, p): (usize, &Planned)| done_earlier(e, &p.path, &devids(&groups[p.fs])).map(|size| (fi, size));
    planned.iter().enumerate().filter_map(done).collect()
}

/// The size of a file the resumed run finished (the same file, its extents unmoved:
/// [`record::key`]) on every device of `devids`, or None.
fn done_earlier(e: &record::Earlier, path: &Path, devids: &[Option<u64>]) -> Option<u64> {
    let md = std::fs::metadata(path).ok()?;
    let id = file_identity(path, &md, mapped(path).as_deref());
    devids.iter().all(|d| e.done.contains_key(&record::key(&on_devid(id.clone(), *d)))).then_some(md.len())
}

/// What the dry run says: per filesystem the files, the bytes to rewrite, and the
/// windows, time frozen and duration to expect (`predicted`: each filesystem's engine
/// run, in order); the prediction and what it rests on; the warnings. Returns it and
/// every file's line (shown with `-v`).
pub(super) fn describe(plan: &FilesPlan, report: &Report, predicted: Option<&Predicted>) -> (String, String) {
    let (o, planned) = (&plan.options, &plan.planned);
    let max_freeze = o.max_freeze();
    let (files, bound) = (planned.len(), crate::host::freeze::describe_bound(max_freeze));
    let mut s = format!("plan: {files} file(s), windows of at most {:.3} s each; {bound}\n", max_freeze.as_secs_f64());
    let rate = o.run.rate.map(|r| r.bytes_per_second());
    s += &crate::rewrite::frozen_share(max_freeze, o.run.pause, rate, report.prediction.as_ref());
    s += &crate::rewrite::describe_guardian(&plan.placement);
    let mut detail = String::from("  every file:\n");
    if let (Some(sel), Some(c)) = (&report.file_selection, &plan.choice) {
        s += &format!("  {}\n  note: {}\n", sel.rule, sel.ages_after_rewrite);
        detail = format!("  the choice (-v):\n{}", select::each_why(c, planned.iter().map(|p| p.path.as_path())));
        detail += "  every file chosen:\n";
    }
    for (gi, g) in plan.groups.iter().enumerate() {
        s +=
            &format!("  filesystem {} ({}) on {}\n", g.fs.mount_point.display(), g.fs.fs_type, g.device.path.display());
        let devices: Vec<&device::BlockDeviceInfo> = match &g.btrfs {
            Some(b) => b.members.iter().map(|(_, d, _)| d).collect(),
            None => vec![&g.device],
        };
        for d in devices {
            s += &crate::host::aliases::describe(&d.devices_sharing_bytes(&Sysfs::default()), &Sysfs::default());
        }
        if let Some(b) = &g.btrfs {
            s += &format!(
                "    {}: every copy of each extent is rewritten in place, on its own device, and compared with the others\n",
                b.layout.describe()
            );
        }
        let chosen = |(i, p): &(usize, &Planned)| {
            p.fs == gi && !plan.left_alone.contains_key(i) && !plan.done_before.contains_key(i)
        };
        let files: Vec<&Planned> = planned.iter().enumerate().filter(chosen).map(|(_, p)| p).collect();
        s += &describe_group(&files, copies(g), predicted.and_then(|p| p.each.get(gi)), &mut detail);
    }
    if !plan.done_before.is_empty() {
        s += &format!(
            "  resumed: {} file(s) ({}) finished by the interrupted run, not rewritten again\n",
            plan.done_before.len(),
            human_bytes(plan.done_before.values().sum())
        );
    }
    s += &report.prediction.as_ref().map(crate::report::render::prediction).unwrap_or_default();
    (s + &crate::rewrite::dry_run_end(&report.warnings), detail)
}

/// One filesystem's files in the plan: their totals and what its engine run is expected
/// to come to, and each file's line into `detail`.
fn describe_group(files: &[&Planned], copies: u64, expected: Option<&Outcome>, detail: &mut String) -> String {
    // A shared (reflinked) range is rewritten once, by the first file that has it.
    let mut shared_seen = std::collections::HashSet::new();
    let (mut total, mut empty) = (0, 0);
    for p in files {
        let (extents, bytes, size) = planned_bytes(&p.path, &mut shared_seen);
        let bytes = bytes * copies;
        total += bytes;
        let hot =
            hot::hot_kind(&p.path).map(|(kind, _)| format!(" ({kind}: written all the time)")).unwrap_or_default();
        let what = match (size, bytes) {
            (0, _) => {
                empty += 1;
                EMPTY.to_string()
            }
            (_, 0) => {
                format!("{extents} extent(s), nothing to rewrite (holes, unwritten, or shared with a file before it)")
            }
            (_, b) if copies > 1 => format!("{extents} extent(s), {} to rewrite ({copies} copies)", human_bytes(b)),
            (_, b) => format!("{extents} extent(s), {} to rewrite", human_bytes(b)),
        };
        *detail += &format!("    {}: {what}{hot}\n", p.path.display());
    }
    let expect = expected.map_or_else(
        || " (no prediction)".to_string(),
        |e| {
            format!(
                " in {} chunk(s): about {} window(s), {} frozen, {} in all",
                e.chunks,
                e.windows,
                human_seconds(e.frozen),
                human_seconds(e.seconds)
            )
        },
    );
    let empties = if empty > 0 { format!(" ({empty} empty: nothing to rewrite)") } else { String::new() };
    format!("    {} file(s){empties}, {} to rewrite{expect}\n", files.len(), human_bytes(total))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn options(targets: &[&Path]) -> RewriteOptions {
        RewriteOptions { targets: targets.iter().map(|t| t.to_path_buf()).collect(), ..RewriteOptions::default() }
    }

    #[test]
    fn collects_files_once_in_path_order_without_the_excluded() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("sub/pg_wal")).unwrap();
        for f in ["b", "a", "sub/c", "sub/pg_wal/w", "x.tmp"] {
            std::fs::write(d.join(f), b"x").unwrap();
        }
        std::fs::hard_link(d.join("a"), d.join("sub/a-link")).unwrap();
        let mut o = options(&[d, &d.join("b")]);
        o.run.exclude = vec!["pg_wal".into(), "*.tmp".into()];
        let got = collect(&o).unwrap();
        let names: Vec<String> = got.iter().map(|p| p.strip_prefix(d).unwrap().display().to_string()).collect();
        assert_eq!(names, ["a", "b", "sub/c"], "a hard link once, excluded names and directories left out");
        o.run.exclude = vec!["[".into()];
        assert!(matches!(collect(&o), Err(Error::Usage(m)) if m.contains("--exclude [")));
    }

    #[test]
    fn an_unfinished_run_is_continued_dropped_or_refused_never_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let o = options(&[dir.path()]);
        let path = dir.path().join("run.json");
        assert!(matches!(earlier_run(&o, &path).unwrap(), Earlier::None), "no record: a new run");
        let header = record::RunHeader {
            targets: record::canonical_targets(&o.targets),
            options: o.run.clone(),
            started_at: "2026-11-28T03:00:00Z".into(),
        };
        record::write(&path, &header, std::iter::empty()).unwrap();
        assert!(matches!(earlier_run(&o, &path).unwrap(), Earlier::Refuse(w) if w.contains("2026-11-28T03:00:00Z")));
        let with = |f: fn(&mut RewriteOptions)| {
            let mut o = o.clone();
            f(&mut o);
            earlier_run(&o, &path).unwrap()
        };
        assert!(matches!(with(|o| o.resume = true), Earlier::Continue(_)));
        assert!(matches!(with(|o| o.restart = true), Earlier::None));
    }
}
