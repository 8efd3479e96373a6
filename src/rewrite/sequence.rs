//! The order of every rewrite, device mode and file mode alike. Each step is one call
//! here; the modes differ only in their target and planner (and device mode's extra
//! steps, named where they fall):
//!
//! 1. [`ready_to_write`]: stop signals handled, job-control stops deferred; before any
//!    thread starts, so that every thread inherits them.
//! 2. [`take_device`]: locked against another reseq, opened (exclusively when nothing
//!    on it is mounted).
//! 3. What the last run left, in the same call: rescue copies first (they hold the
//!    bytes a restore needs), then the guardian's torn-write notes. Device mode then
//!    claims the unmounted partitions of a whole disk and re-reads the chunks in flight.
//! 4. The record: a deferred journal, written at the first write, so that a run refused
//!    before it leaves the last run's record as it was.
//! 5. to 7., one call in both modes, [`windows`]:
//! 5. [`guardian`]: forked while this process has one thread, told the target and then
//!    the journal; wrapped in the checks of every window ([`checks`](fn@checks)). The host's writes
//!    to the device are counted from here ([`Cost`]).
//! 6. `engine::run`, configured by [`engine_config`] in both modes, at a low I/O priority
//!    ([`LowIoPriority`]: its threads only; not the guardian's, nor the benchmarks').
//! 7. The end of the windows (`Thawed::end_windows`).
//! 8. Device mode: the FITRIM of free space, on thawed filesystems.
//!
//! An unfinished run is decided by the plan in both modes: continued with `--resume`,
//! dropped with `--restart`, otherwise a warning in a dry run and a refusal at step 3
//! ([`Unfinished`]), naming any rescue copy; nothing is written before it.

use std::path::{Path, PathBuf};

use crate::engine::EngineConfig;
use crate::engine::guard::{NoFreeze, WindowGuard};
use crate::engine::journal::{self, RunRecord};
use crate::engine::target::{DirectDevice, OpenMode};
use crate::host::device::BlockDeviceInfo;
use crate::host::freeze::{GuardedFreeze, Thawed};
use crate::host::mounts::MountedFs;
use crate::host::shape::{Shape, ShapeCheck};
use crate::host::state_dir::DeviceLock;
use crate::host::window_checks::{Checked, WindowCheck};
use crate::host::writers_check::WritersCheck;
use crate::measure::passes::Cost;
use crate::options::rewrite::RewriteOptions;
use crate::rewrite::checks;
use crate::support::error::{Error, Result};
use crate::support::signals::StopFlag;
use crate::support::units::now_rfc3339;
use crate::sys;

/// Step 1: the process before its first write.
pub(crate) fn ready_to_write() -> Result<StopFlag> {
    let stop = StopFlag::install().map_err(|e| Error::io("installing signal handlers", e))?;
    stop.check("interrupted before anything was written")?;
    sys::process::defer_job_control_stops().map_err(|e| Error::io("installing signal handlers", e.into()))?;
    Ok(stop)
}

/// Step 6's I/O priority, for the engine's threads (they inherit it from this one): a
/// cron job's, best-effort level 7 (`ionice -c2 -n7`), not the idle class, which can be
/// starved while the filesystem is frozen, stretching the very stall the windows bound.
/// Set after the guardian is forked (its freeze's sync and sentinel reads keep theirs),
/// given back when dropped (the benchmark after the run measures as the one before did).
pub(crate) struct LowIoPriority(Option<nix::libc::c_long>);

impl LowIoPriority {
    pub(crate) fn set() -> LowIoPriority {
        let before = sys::process::io_priority().ok();
        if let Err(e) = sys::process::lower_io_priority() {
            log::warn!("could not lower the I/O priority: {e}");
            return LowIoPriority(None);
        }
        LowIoPriority(before)
    }
}

impl Drop for LowIoPriority {
    fn drop(&mut self) {
        if let Some(v) = self.0 {
            let _ = sys::process::set_io_priority(v);
        }
    }
}

/// The device a rewrite writes, held for the run: its open descriptor, then its lock
/// (fields drop in order: closed before another reseq may take it).
pub(crate) struct Taken {
    pub(crate) device: DirectDevice,
    pub(crate) _lock: DeviceLock,
}

/// An unfinished run the plan found and was asked neither to continue nor to drop.
/// Refused at step 3, after what the last run left, which says more (bytes to put back).
#[derive(Clone, Debug)]
pub(crate) struct Unfinished {
    /// Which run: "an unfinished run of /dev/X exists (...)".
    pub(crate) what: String,
}

impl Unfinished {
    /// The plan's warning in a dry run, which refuses nothing.
    pub(crate) fn warning(&self) -> String {
        format!("{}: the real run is refused without --resume (continue it) or --restart (start over)", self.what)
    }
}

/// What a device's rewrite is taken with.
pub(crate) struct Taking<'a> {
    pub(crate) state_dir: &'a Path,
    pub(crate) device: &'a BlockDeviceInfo,
    /// Names the device in a lock conflict.
    pub(crate) shown: String,
    /// Filesystems on it are frozen by the run (the device is shared with them); else it
    /// is opened exclusively.
    pub(crate) mounted: bool,
    pub(crate) unfinished: Option<&'a Unfinished>,
}

/// Steps 2 and 3: the device locked, opened and checked for what an earlier run left;
/// then an unfinished run the plan found is refused.
pub(crate) fn take_device(t: &Taking) -> Result<Taken> {
    let dev = t.device;
    let lock = crate::host::state_dir::lock_device(t.state_dir, &dev.identity.name, &t.shown)?;
    let device = open_device(dev, t.mounted)?;
    let dirs = crate::engine::rescue::dirs(t.state_dir);
    crate::engine::rescue::check_device(&dirs, &dev.identity, &device, t.mounted)?;
    crate::engine::rescue::check_torn_notes(&dev.path, &device)?;
    if let Some(u) = t.unfinished {
        // The hint names a rescue copy still there after the check above.
        return Err(Error::refused(u.what.clone(), unfinished_hint(t.state_dir, dev)));
    }
    Ok(Taken { device, _lock: lock })
}

/// What the guardian freezes, and what every window checks.
pub(crate) struct Guarded<'a> {
    pub(crate) device: &'a BlockDeviceInfo,
    /// Frozen in every window, in this order; empty: nothing is frozen.
    pub(crate) filesystems: &'a [MountedFs],
    pub(crate) max_freeze: std::time::Duration,
    pub(crate) placement: Option<&'a crate::host::cgroup::Placement>,
    /// Devices whose writers write the target's bytes.
    pub(crate) writer_devices: Vec<(u32, u32)>,
    /// The device as planned.
    pub(crate) shape: &'a Shape,
    /// File mode: the run's files, (device, inode): only these turned into swap stop it.
    pub(crate) swap_among: Option<std::collections::HashSet<(u64, u64)>>,
    /// This run wrote before this device's run (file mode: an earlier filesystem's or
    /// btrfs member's): a finding at its first window is no refusal.
    pub(crate) wrote_before: bool,
    /// A btrfs member's run (file mode): the mount point, whose own writers (scrub,
    /// balance, device operations) are checked before each freeze.
    pub(crate) btrfs_mount: Option<&'a Path>,
}

/// What steps 5 to 7 leave: what `prepare` made and the engine used, what the engine
/// returned, the host's writes counted since the guardian (ended by the caller, after
/// what it does thawed), and the proof that no window is open.
pub(crate) struct Windows<S, R> {
    pub(crate) prepared: S,
    pub(crate) ran: R,
    pub(crate) cost: Cost,
    pub(crate) thawed: Thawed,
}

/// Steps 5 to 7, the same in both modes: the guardian (`guardian`: forked here, while
/// this process has one thread); the host's writes to `dev` counted from then (after the
/// fork: smartctl, held past its time limit, leaves threads a fork refuses); what the
/// engine reads, made after the fork (`prepare`: device mode maps what is in use, and
/// says it is rewriting once the guardian is there); the engine (`engine`) at a low I/O
/// priority; the end of the windows.
pub(crate) fn windows<'g, S, R>(
    dev: &BlockDeviceInfo,
    guardian: impl FnOnce() -> Result<Box<dyn WindowGuard + 'g>>,
    prepare: impl FnOnce() -> Result<S>,
    engine: impl FnOnce(&mut S, &mut dyn WindowGuard) -> R,
) -> Result<Windows<S, R>> {
    let mut guard = guardian()?;
    // Around the engine in both modes, with or without `--bench`.
    let cost = Cost::start(&dev.identity.name, dev.parent_disk.as_deref());
    let mut prepared = prepare()?;
    let low = LowIoPriority::set();
    let ran = engine(&mut prepared, guard.as_mut());
    drop(low);
    let thawed = Thawed::end_windows(guard);
    Ok(Windows { prepared, ran, cost, thawed })
}

/// Step 5: the guardian's freeze when filesystems are mounted, none otherwise, with the
/// checks of every window either way. Forks the guardian.
pub(crate) fn guardian(g: &Guarded, journal: &Path) -> Result<Box<dyn WindowGuard>> {
    if g.filesystems.is_empty() {
        return Ok(Box::new(Checked::new(NoFreeze, checks(g, false)?)));
    }
    let placement = g.placement.ok_or_else(|| Error::Internal("a freeze without a guardian placement".into()))?;
    let mut freeze = GuardedFreeze::start(g.filesystems.to_vec(), g.max_freeze, placement)?;
    freeze.set_target(&g.device.path)?;
    freeze.set_journal(journal)?;
    Ok(Box::new(Checked::new(freeze, checks(g, true)?)))
}

/// The checks of every window of a run, in the order they run: btrfs's own writers (a
/// btrfs member's run), other writers and swap, then the device's shape, its
/// written-sectors counters and the watch of its backing files (after the writers:
/// their message names the process or the alias).
fn checks(g: &Guarded, freezes: bool) -> Result<Vec<Box<dyn WindowCheck>>> {
    let mut list: Vec<Box<dyn WindowCheck>> = Vec::new();
    if let Some(mount) = g.btrfs_mount {
        let fd = crate::host::freeze::open_mount_point(mount)?;
        list.push(Box::new(crate::host::btrfs::OwnWritersCheck { fd, mount: mount.to_path_buf() }));
    }
    let (target, devices) = (g.device.path.clone(), g.writer_devices.clone());
    list.push(Box::new(WritersCheck::new(target, devices, g.swap_among.clone(), g.wrote_before)));
    list.push(Box::new(ShapeCheck::new(freezes, g.device.dev_num, &g.writer_devices, g.shape.clone())?));
    Ok(list)
}

/// Where a run's bytes lie for the engine, and where it starts.
pub(crate) struct Span {
    pub(crate) chunk_size: u64,
    pub(crate) range: (u64, u64),
    pub(crate) start_offset: u64,
    /// Journal records wait in memory while the state directory is frozen.
    pub(crate) journal_on_frozen_fs: bool,
}

/// Where step 6 puts a chunk's original bytes if its write fails: the state directory;
/// `files` names the files laid end to end in the range (file mode).
pub(crate) fn rescue_to(
    state_dir: PathBuf,
    dev: &BlockDeviceInfo,
    files: Vec<(u64, u64, String)>,
) -> crate::engine::rescue::RescueTo {
    crate::engine::rescue::RescueTo {
        dir: state_dir,
        device_path: dev.path.clone(),
        identity: dev.identity.clone(),
        files,
    }
}

/// Step 6's configuration, the same in both modes (and in file mode's plan, which has
/// no rescue): chunking, verification and pacing from the options.
pub(crate) fn engine_config(
    o: &RewriteOptions,
    span: Span,
    rescue: Option<crate::engine::rescue::RescueTo>,
) -> EngineConfig {
    EngineConfig {
        chunk_size: span.chunk_size,
        range_start: span.range.0,
        range_end: span.range.1,
        start_offset: span.start_offset,
        verify: !o.run.no_verify,
        read_ahead: o.run.read_ahead,
        pause: o.run.pause,
        journal_on_frozen_fs: span.journal_on_frozen_fs,
        max_overruns: o.run.max_overruns,
        rate_bytes_per_second: o.run.rate.map(|r| r.bytes_per_second()),
        rescue,
        trial: None,
    }
}

/// The hint of a refusal over an unfinished run: how to go on, and the rescue copy
/// either way checks first, if there is one.
fn unfinished_hint(state_dir: &Path, dev: &BlockDeviceInfo) -> String {
    match crate::engine::rescue::pending(&crate::engine::rescue::dirs(state_dir), &dev.identity) {
        Some(copy) => format!(
            "pass --resume to continue it, or --restart to start over; either checks the rescue copy first: {copy}"
        ),
        None => "pass --resume to continue it, or --restart to start over".into(),
    }
}

/// Opens a device for direct I/O: shared when filesystems on it are mounted (the freeze
/// keeps them still), exclusive otherwise. EBUSY gets its own explanation.
pub(crate) fn open_device(d: &crate::host::device::BlockDeviceInfo, mounted: bool) -> Result<DirectDevice> {
    let mode = if mounted { OpenMode::SharedWithMounts } else { OpenMode::Exclusive };
    DirectDevice::open(&d.path, mode, d.dio_mem_align as usize, u64::from(d.dio_offset_align)).map_err(
        |e| match (e.raw_os_error(), mode) {
            (Some(nix::libc::EBUSY), OpenMode::SharedWithMounts) => {
                let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
                let boot = if cmdline.contains("bdev_allow_write_mounted=0") {
                    "the kernel was booted with bdev_allow_write_mounted=0"
                } else {
                    "the kernel is built with CONFIG_BLK_DEV_WRITE_MOUNTED=n or booted with bdev_allow_write_mounted=0"
                };
                Error::refused(
                    format!("the kernel refuses to open the mounted device {} for writing (EBUSY): {boot}", d.path.display()),
                    "unmount the filesystem and run reseq on the unmounted device; reseq never writes around this through another device",
                )
            }
            (Some(nix::libc::EBUSY), OpenMode::Exclusive) => {
                checks::busy_unmounted(&d.path, d.dev_num, &crate::host::mounts::read_mounts().unwrap_or_default())
            }
            _ => Error::io(format!("opening {} for direct I/O", d.path.display()), e),
        },
    )
}

/// A run's first journal record: the device, the chunks and the range; `options`, a
/// device run's, for `--resume`.
pub(crate) fn run_record(
    identity: &crate::engine::identity::DeviceIdentity,
    chunk_size: u64,
    (start, end): (u64, u64),
    options: Option<crate::options::rewrite::RunOptions>,
) -> RunRecord {
    RunRecord {
        version: journal::JOURNAL_VERSION,
        identity: identity.clone(),
        chunk_size_bytes: chunk_size,
        range_start_bytes: start,
        range_end_bytes: end,
        chunks_total: (end - start).div_ceil(chunk_size),
        started_at: now_rfc3339(),
        files: Vec::new(),
        options,
    }
}
