//! Parse, check, plan: everything decided before the first byte is written.
//!
//! [`plan_rewrite`] turns raw arguments into a [`RewritePlan`] or a refusal. Each check
//! has its own message saying why and what to do instead; the order goes from cheap and
//! certain (what kind of file is this) to the ones that need the device open.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::RewriteArgs;
use crate::engine::EngineConfig;
use crate::engine::journal::{self, Replay};
use crate::host::device::{self, BlockDeviceInfo, Medium, Sysfs};
use crate::host::mounts::{self, MountedFs};
pub use crate::host::privileges::check as check_privileges;
use crate::support::error::{Error, Result};
use crate::support::hooks;
use crate::support::units;

/// Where a run starts.
#[derive(Clone, Debug)]
pub enum Start {
    /// From the first chunk, with a new journal.
    Fresh,
    /// After the chunks an earlier run finished.
    Resume {
        /// Chunks already finished.
        done: u64,
        /// Everything before this offset is done.
        done_offset: u64,
        /// The chunks begun and not done when it stopped: (offset, length, pre-write blake3).
        in_flight: Vec<(u64, u64, String)>,
        /// It stopped because its guardian killed it with a write outstanding: what the
        /// guardian found of the writes it had granted, before it thawed.
        killed_mid_write: Option<Vec<crate::engine::journal::InFlightCheck>>,
        started_at: String,
    },
}

/// A checked, complete description of a device rewrite.
#[derive(Clone, Debug)]
pub struct RewritePlan {
    /// The options as given, kept in the journal for `--resume`.
    pub options: crate::options::resume::RunOptions,
    /// The device and what we know about it.
    pub device: BlockDeviceInfo,
    /// Filesystems frozen in every window; empty when nothing is mounted (no freeze).
    pub filesystems: Vec<MountedFs>,
    /// Chunking, verification and read-ahead, as the engine runs them.
    pub engine: EngineConfig,
    /// The guardian's deadline for one window.
    pub max_freeze: Duration,
    /// The kernel's hung-task timeout (None: disabled or unreadable).
    pub hung_task_timeout: Option<Duration>,
    /// Whether a hung task panics the host (`kernel.hung_task_panic`).
    pub hung_task_panic: bool,
    /// The journal of this device.
    pub journal_path: PathBuf,
    /// New run or continuation.
    pub start: Start,
    /// Filesystems whose free space is left out: (filesystem, its start on the target,
    /// its length). Empty: everything is rewritten.
    pub used_space: Vec<(MountedFs, u64, u64)>,
    /// FITRIM the filesystems afterwards.
    pub trim: bool,
    /// How the FITRIM slices are spaced (`--trim-rate`, `--pause`).
    pub trim_pace: crate::host::trim::Pace,
    /// Devices through which the target's bytes can be written (itself, its partitions,
    /// its disk): nothing else may hold them for writing, checked before every window.
    pub writer_devices: Vec<(u32, u32)>,
    /// Things the user should know that did not stop the plan.
    pub warnings: Vec<String>,
}

impl RewritePlan {
    pub fn needs_freeze(&self) -> bool {
        !self.filesystems.is_empty()
    }

    pub fn total_bytes(&self) -> u64 {
        self.engine.range_end - self.engine.range_start
    }
}

fn read_proc_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `kernel.hung_task_timeout_secs` (None: disabled) and whether a hung task panics.
pub fn hung_task() -> (Option<Duration>, bool) {
    let timeout = read_proc_u64("/proc/sys/kernel/hung_task_timeout_secs").filter(|&s| s > 0).map(Duration::from_secs);
    (timeout, read_proc_u64("/proc/sys/kernel/hung_task_panic").is_some_and(|v| v != 0))
}

/// Refuses (or, with --force, warns about) a window whose hard bound (`--max-freeze`
/// plus the guardian's grace) is longer than half the hung-task timeout: writers blocked
/// by the freeze can trip the watchdog.
pub fn check_freeze_length(max_freeze: Duration, force: bool) -> Result<Vec<String>> {
    let (timeout, panic) = hung_task();
    let bound = crate::host::freeze::freeze_bound(max_freeze);
    let Some(t) = timeout.filter(|t| bound > *t / 2) else { return Ok(Vec::new()) };
    let msg = format!(
        "--max-freeze {:.3} s plus the guardian's grace of {:.3} s is longer than half of kernel.hung_task_timeout_secs ({} s): writers blocked by the freeze can trip the hung-task watchdog{}",
        max_freeze.as_secs_f64(),
        crate::host::freeze::freeze_grace(max_freeze).as_secs_f64(),
        t.as_secs(),
        if panic { ", and kernel.hung_task_panic=1 turns that into a kernel panic" } else { "" }
    );
    if !force {
        let limit = (t / 2).saturating_sub(Duration::from_secs(1));
        return Err(Error::refused(msg, format!("use --max-freeze {}ms or less, or --force", limit.as_millis())));
    }
    Ok(vec![msg])
}

/// `--rate`, in bytes per second.
pub fn parse_rate(args: &RewriteArgs) -> Result<Option<u64>> {
    parse_rate_option("--rate", args.rate.as_deref())
}

/// A rate option (`100M` or `100M/s`), in bytes per second; positive.
pub fn parse_rate_option(name: &str, value: Option<&str>) -> Result<Option<u64>> {
    match value {
        None => Ok(None),
        Some(r) => match units::parse_size(r.trim_end_matches("/s")) {
            Ok(0) => Err(Error::Usage(format!("{name} must be positive"))),
            Ok(v) => Ok(Some(v)),
            Err(e) => Err(Error::Usage(format!("{name}: {e}"))),
        },
    }
}

/// Names the top of a stack of holders (dm on dm on a partition...), as the device to
/// target instead.
fn top_holders(sysfs: &Sysfs, holders: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for h in holders {
        let name = h.split(' ').next().unwrap_or(h).to_string();
        let mut cur = name.clone();
        for _ in 0..8 {
            match sysfs.holders_of(&cur).first() {
                Some(up) => cur = up.clone(),
                None => break,
            }
        }
        let dm_name = std::fs::read_to_string(sysfs.root.join("class/block").join(&cur).join("dm/name"))
            .map(|n| format!(" (/dev/mapper/{})", n.trim()))
            .unwrap_or_default();
        out.push(format!("/dev/{cur}{dm_name}"));
    }
    out.sort();
    out.dedup();
    out
}

/// Everything the plan needs from the outside world, so tests can supply their own.
pub struct Environment {
    pub sysfs: Sysfs,
    pub mounts: Vec<mounts::MountEntry>,
}

impl Environment {
    pub fn live() -> Result<Environment> {
        Ok(Environment {
            sysfs: Sysfs::default(),
            mounts: mounts::read_mounts().map_err(|e| Error::io("reading /proc/self/mountinfo", e))?,
        })
    }
}

/// Checks everything and builds the plan. Writes nothing and freezes nothing.
pub fn plan_rewrite(args: &RewriteArgs, env: &Environment) -> Result<RewritePlan> {
    // 1. Arguments that need no device.
    let chunk_size = units::parse_size(&args.chunk_size).map_err(|e| Error::Usage(format!("--chunk-size: {e}")))?;
    if chunk_size == 0 || chunk_size > (1 << 30) {
        return Err(Error::Usage(format!("--chunk-size must be between 1 sector and 1 GiB, not {}", args.chunk_size)));
    }
    if args.targets.len() > 1 {
        return Err(Error::Usage("device mode takes one block device; several targets are files (file mode)".into()));
    }
    let max_freeze = units::parse_duration(args.max_freeze_or(crate::cli::DEFAULT_MAX_FREEZE))
        .map_err(|e| Error::Usage(format!("--max-freeze: {e}")))?;
    if max_freeze < Duration::from_millis(10) {
        return Err(Error::Usage("--max-freeze must be at least 10ms".into()));
    }
    let pause = units::parse_duration(&args.pause).map_err(|e| Error::Usage(format!("--pause: {e}")))?;
    let rate = parse_rate(args)?;
    let trim_pace = crate::host::trim::Pace::of(parse_rate_option("--trim-rate", args.trim_rate.as_deref())?, pause);
    if args.max_overruns == 0 {
        return Err(Error::Usage("--max-overruns must be at least 1".into()));
    }
    if args.read_ahead == 0 || args.read_ahead > 64 {
        return Err(Error::Usage("--read-ahead must be between 1 and 64".into()));
    }

    // 2. Is it a block device at all?
    device::check_block_device(args.device())?;

    // 3. Privileges, then what the device is.
    check_privileges()?;
    let dev = device::inspect(args.device(), &env.sysfs)?;
    let mut warnings = Vec::new();

    if dev.read_only {
        return Err(Error::refused(
            format!("{} is read-only (BLKROGET)", args.device().display()),
            "make it writable (blockdev --setrw) if that is really intended, or choose another device",
        ));
    }
    if !dev.holders.is_empty() {
        let tops = top_holders(&env.sysfs, &dev.holders);
        return Err(Error::refused(
            format!(
                "{} is used by {} stacked on top of it (device-mapper, md or LVM): writing below them bypasses their view of the data",
                args.device().display(),
                dev.holders.join(", ")
            ),
            format!("target the top device instead: {}", tops.join(", ")),
        ));
    }
    if !dev.active_swap.is_empty() {
        return Err(Error::refused(
            format!(
                "swap is active on {} ({}): the kernel writes swap whatever the freeze",
                args.device().display(),
                dev.active_swap.join(", ")
            ),
            "swapoff it first, or run reseq in a window without swap there",
        ));
    }

    // 3b. Nobody else may write it: a raw writer bypasses freezes and O_EXCL alike.
    let writer_devices = dev.devices_sharing_bytes(&env.sysfs);
    crate::host::writers::refuse_other_writers(args.device(), &writer_devices)?;

    // 4. Filesystems to freeze: on the device, or on its partitions for a whole disk.
    let filesystems = mounts::filesystems_on(&env.mounts, &dev.devices_to_freeze());
    if filesystems.is_empty() {
        probe_exclusive(&dev)?;
    }

    // 5. Alignment.
    if chunk_size % u64::from(dev.dio_offset_align) != 0 {
        return Err(Error::Usage(format!(
            "--chunk-size {} ({chunk_size} bytes) is not a multiple of the device's direct-I/O alignment of {} bytes ({}); try {}",
            args.chunk_size,
            dev.dio_offset_align,
            dev.dio_align_source,
            units::human_bytes(chunk_size.div_ceil(u64::from(dev.dio_offset_align)) * u64::from(dev.dio_offset_align)),
        )));
    }

    // 6. Medium.
    let medium = if hooks::pretend_rotational() { Medium::Rotational("test hook".into()) } else { dev.medium.clone() };
    if let Medium::Rotational(why) = &medium {
        let msg = format!(
            "{} is a rotational disk ({why}): a spinning disk has no FTL to re-sequence, so this only costs time",
            args.device().display()
        );
        if !args.force {
            return Err(Error::refused(msg, "pass --force if you really mean it"));
        }
        warnings.push(msg);
    }

    // 7. Freeze length against the hung-task watchdog.
    let (hung_task_timeout, hung_task_panic) = hung_task();
    if !filesystems.is_empty() {
        warnings.extend(check_freeze_length(max_freeze, args.force)?);
    }

    // 8. The state directory must take a journal and a rescue copy, before any freeze.
    let state =
        crate::host::state_dir::prepare_as(&args.state_dir, &filesystems, chunk_size * 2 + (1 << 20), args.dry_run)?;

    // 9. Journal: new run, or continuation of an unfinished one.
    let journal_path = journal::journal_path(&state.path, &dev.identity);
    let start = decide_start(args, &dev, chunk_size, &journal_path, &mut warnings)?;
    let chunk_size = match &start {
        Start::Resume { .. } => {
            journal::read(&journal_path)?.and_then(|r| r.run).map(|r| r.chunk_size_bytes).unwrap_or(chunk_size)
        }
        Start::Fresh => chunk_size,
    };
    let journal_on_frozen_fs = state.on_frozen_fs;
    if journal_on_frozen_fs {
        warnings.push(format!(
            "the state directory {} is on a filesystem reseq freezes: journal records are kept in memory during each window and written between windows, so a crash loses at most one window of progress",
            args.state_dir.display()
        ));
    }

    let range_end = addressable_end(&dev);
    if range_end < dev.identity.size_bytes {
        warnings.push(format!(
            "the last {} bytes of {} (from offset {range_end}) are less than one {}-byte sector, which direct I/O cannot address: they are left as they are, not rewritten",
            dev.identity.size_bytes - range_end,
            args.device().display(),
            dev.dio_offset_align
        ));
    }
    let engine = EngineConfig {
        chunk_size,
        range_start: 0,
        range_end,
        start_offset: match &start {
            Start::Resume { done_offset, .. } => *done_offset,
            Start::Fresh => 0,
        },
        verify: !args.no_verify,
        read_ahead: args.read_ahead,
        pause,
        journal_on_frozen_fs,
        max_overruns: args.max_overruns,
        rate_bytes_per_second: rate,
        rescue: Some(crate::engine::rescue::RescueTo {
            dir: state.path.clone(),
            device_path: dev.path.clone(),
            identity: dev.identity.clone(),
            files: Vec::new(),
        }),
    };
    let used_space =
        if args.include_free { Vec::new() } else { used_space_spans(&env.sysfs, &dev, &filesystems, &mut warnings) };
    if filesystems.is_empty() {
        warnings.push(format!(
            "nothing is mounted from {}: all of it is rewritten, free space included, which tells the SSD that space is in use (undoing TRIM). To skip free space, mount its ext4/xfs filesystem and run reseq again",
            args.device().display()
        ));
    }
    Ok(RewritePlan {
        used_space,
        trim: !args.no_trim,
        trim_pace,
        device: dev,
        filesystems,
        engine,
        max_freeze,
        hung_task_timeout,
        hung_task_panic,
        journal_path,
        start,
        writer_devices,
        warnings,
        options: crate::options::resume::RunOptions::of(args),
    })
}

/// Where each mounted ext4/xfs filesystem lies on the target, for used-space mode.
fn used_space_spans(
    sysfs: &Sysfs,
    dev: &BlockDeviceInfo,
    filesystems: &[MountedFs],
    warnings: &mut Vec<String>,
) -> Vec<(MountedFs, u64, u64)> {
    let mut spans = Vec::new();
    for fs in filesystems {
        if !crate::host::usedspace::SUPPORTED.contains(&fs.fs_type.as_str()) {
            warnings.push(format!(
                "{} is {}, whose free space reseq cannot read (GETFSMAP): all of it is rewritten",
                fs.mount_point.display(),
                fs.fs_type
            ));
            continue;
        }
        if fs.dev_num == dev.dev_num {
            spans.push((fs.clone(), 0, dev.identity.size_bytes));
            continue;
        }
        // A partition of the target disk: its start and size from sysfs, in sectors.
        let part = sysfs.name_of(fs.dev_num).map(|(n, _)| n).unwrap_or_default();
        let read = |attr: &str| {
            std::fs::read_to_string(sysfs.root.join("class/block").join(&part).join(attr))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        match (read("start"), read("size")) {
            (Some(start), Some(size)) => spans.push((fs.clone(), start * 512, size * 512)),
            _ => {
                warnings.push(format!("cannot place {} on the disk: all of it is rewritten", fs.mount_point.display()))
            }
        }
    }
    spans
}

/// The ranges of `path` (a block device) that its mounted ext4/xfs filesystems use:
/// everything but what GETFSMAP reports free, as a used-space rewrite sees it. None when
/// no such filesystem is mounted on it (then all of it counts). Benchmarks read only
/// these: free space, trimmed or not, says nothing about the data.
pub fn in_use_ranges(path: &Path) -> Result<Option<Vec<(u64, u64)>>> {
    let env = Environment::live()?;
    let dev = device::inspect(path, &env.sysfs)?;
    let filesystems = mounts::filesystems_on(&env.mounts, &dev.devices_to_freeze());
    let spans = used_space_spans(&env.sysfs, &dev, &filesystems, &mut Vec::new());
    if spans.is_empty() {
        return Ok(None);
    }
    let spans: Vec<crate::host::usedspace::FsSpan> = spans
        .into_iter()
        .map(|(fs, start, len)| crate::host::usedspace::FsSpan::open(fs, start, len))
        .collect::<Result<_>>()?;
    let align = u64::from(dev.dio_offset_align).max(512);
    let end = addressable_end(&dev);
    let free = crate::host::usedspace::free_ranges(&spans, 0, end)?;
    Ok(Some(crate::host::usedspace::subtract(0, end, &free, align)))
}

/// An unmounted device must be ours alone: O_EXCL fails with EBUSY if anything holds it,
/// in particular a lazily unmounted filesystem (no mountinfo line, nothing to freeze,
/// still writing).
fn probe_exclusive(dev: &BlockDeviceInfo) -> Result<()> {
    match crate::sys::open_exclusive(&dev.path) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => Err(busy_unmounted(dev)),
        Err(e) => Err(Error::io(format!("opening {} exclusively", dev.path.display()), e)),
    }
}

pub fn busy_unmounted(dev: &BlockDeviceInfo) -> Error {
    Error::refused(
        format!(
            "{} is busy (exclusive open gave EBUSY) but no mounted filesystem was found on it: most likely a lazily unmounted filesystem (umount -l) still in use, which cannot be frozen, or another program holding it exclusively",
            dev.path.display()
        ),
        "find the holder (lsof, fuser -vm), let it finish or close, then run reseq again",
    )
}

/// The end of what direct I/O can address: a device whose size is not a whole number of
/// its sectors (a loop device with 4096-byte sectors over an odd-sized file) has a tail
/// that no aligned read or write reaches.
fn addressable_end(dev: &BlockDeviceInfo) -> u64 {
    let align = u64::from(dev.dio_offset_align).max(1);
    dev.identity.size_bytes / align * align
}

/// With `--resume`: the arguments with the interrupted run's options in place of those
/// left out (see [`crate::options::resume`]). None without `--resume`, without an unfinished
/// run, or when the device cannot be inspected (planning then says why).
pub fn resumed_args(args: &RewriteArgs, env: &Environment) -> Result<Option<RewriteArgs>> {
    if !args.resume || args.device().to_string_lossy().starts_with("sim:") {
        return Ok(None);
    }
    let Ok(dev) = device::inspect(args.device(), &env.sysfs) else { return Ok(None) };
    let state = crate::host::state_dir::resolve(&args.state_dir);
    let Ok(Some(replay)) = journal::read(&journal::journal_path(&state, &dev.identity)) else { return Ok(None) };
    let Some(options) = replay.run.filter(|r| !replay.finished && r.identity == dev.identity).and_then(|r| r.options)
    else {
        return Ok(None);
    };
    let resumed = options.apply(args, crate::cli::DEFAULT_MAX_FREEZE)?;
    if crate::options::resume::RunOptions::of(&resumed) != crate::options::resume::RunOptions::of(args) {
        log::info!("resuming with the interrupted run's options: {}", options.describe());
    }
    Ok(Some(resumed))
}

fn decide_start(
    args: &RewriteArgs,
    dev: &BlockDeviceInfo,
    chunk_size: u64,
    path: &std::path::Path,
    warnings: &mut Vec<String>,
) -> Result<Start> {
    let replay: Option<Replay> = journal::read(path)?;
    let Some(r) = replay else {
        if args.resume {
            log::info!("no journal at {}: starting a new run", path.display());
        }
        return Ok(Start::Fresh);
    };
    if let Some(d) = &r.damage {
        warnings.push(d.describe(path));
    }
    if r.run.is_none()
        && let Some(d) = &r.damage
        && !args.restart
    {
        // Without its first record nothing says what the last run did, nor which chunks
        // it left in flight.
        return Err(Error::refused(
            format!("the journal's first record is damaged: {}", d.describe(path)),
            "pass --restart to discard it and start over (the chunks a crashed run left in flight are then not checked)",
        ));
    }
    let Some(run) = r.run.filter(|_| !r.finished) else {
        if args.resume {
            log::info!("the last run of {} finished: starting a new run", dev.path.display());
        }
        return Ok(Start::Fresh);
    };
    if args.restart {
        warnings.push(format!(
            "discarding the unfinished run started at {} ({} of {} chunks done)",
            run.started_at, r.done, run.chunks_total
        ));
        return Ok(Start::Fresh);
    }
    if !args.resume {
        return Err(Error::refused(
            format!(
                "an unfinished run of {} exists ({} of {} chunks done, started {})",
                dev.path.display(),
                r.done,
                run.chunks_total,
                run.started_at
            ),
            match crate::engine::rescue::pending(
                &crate::engine::rescue::dirs(path.parent().unwrap_or(Path::new("."))),
                &dev.identity,
            ) {
                Some(copy) => format!(
                    "pass --resume to continue it, or --restart to start over; either checks the rescue copy first: {copy}"
                ),
                None => "pass --resume to continue it, or --restart to start over".into(),
            },
        ));
    }
    if run.identity != dev.identity {
        return Err(Error::refused(
            format!(
                "cannot resume: the device changed since the journal was written: {}",
                dev.identity.changes_since(&run.identity)
            ),
            "pass --restart to start a new run on this device",
        ));
    }
    if run.range_end_bytes != addressable_end(dev) || run.range_start_bytes != 0 {
        return Err(Error::refused("cannot resume: the journal's range does not match the device", "pass --restart"));
    }
    if run.chunk_size_bytes != chunk_size {
        warnings
            .push(format!("resuming with the journal's chunk size of {}", units::human_bytes(run.chunk_size_bytes)));
    }
    warnings.extend(journal::describe_guardian_kills(&r.guardian_kills));
    Ok(Start::Resume {
        done: r.done,
        done_offset: r.done_offset,
        in_flight: r.in_flight,
        killed_mid_write: r
            .killed_last
            .then(|| r.guardian_kills.last().map(|k| k.in_flight.clone()).unwrap_or_default()),
        started_at: run.started_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The holders refusal names the top of the stack. This kernel has no device-mapper
    /// or md, so the stack is a fake sysfs tree: sdz1 <- dm-7 <- dm-9 ("vg-data").
    #[test]
    fn names_the_top_of_a_holder_stack() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for (dev, holder) in [("sdz1", Some("dm-7")), ("dm-7", Some("dm-9")), ("dm-9", None)] {
            let d = r.join("class/block").join(dev);
            std::fs::create_dir_all(d.join("holders")).unwrap();
            if let Some(h) = holder {
                std::fs::create_dir_all(d.join("holders").join(h)).unwrap();
            }
        }
        std::fs::create_dir_all(r.join("class/block/dm-9/dm")).unwrap();
        std::fs::write(r.join("class/block/dm-9/dm/name"), "vg-data\n").unwrap();
        let sysfs = Sysfs { root: r.to_path_buf() };
        let holders = sysfs.holders_of("sdz1");
        assert_eq!(holders, vec!["dm-7".to_string()]);
        assert_eq!(top_holders(&sysfs, &holders), vec!["/dev/dm-9 (/dev/mapper/vg-data)".to_string()]);
    }
}
