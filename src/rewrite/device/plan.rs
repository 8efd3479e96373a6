//! Check, then plan: everything decided before the first byte is written.
//!
//! [`plan_rewrite`] turns the options into a [`RewritePlan`] or a refusal, through the
//! named checks of [`crate::rewrite::checks`]; the order goes from cheap and certain (what kind
//! of file is this) to the ones that need the device open. The plan is data: the dry
//! run prints it ([`super::describe::describe_plan`]), the engine runs it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::EngineConfig;
use crate::engine::journal::{self, Replay};
use crate::engine::trial::{self, Shape, Trial};
use crate::host::device::{self, BlockDeviceInfo, Sysfs};
use crate::host::holes::{Backing, HolesPlanned};
use crate::host::in_use::{Environment, addressable_end, used_space_spans};
use crate::host::mounts::{self, MountedFs};
use crate::measure::depth_probe::DepthChoice;
use crate::options::rewrite::RewriteOptions;
use crate::rewrite::sequence::{self, Span};
use crate::rewrite::{checks, predict};
use crate::support::error::{Error, Result};
use crate::support::units;

/// Where a run starts.
#[derive(Clone, Debug)]
pub(crate) enum Start {
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
pub(crate) struct RewritePlan {
    /// The options as given, kept in the journal for `--resume`.
    pub(crate) options: crate::options::rewrite::RunOptions,
    /// The device and what we know about it.
    pub(crate) device: BlockDeviceInfo,
    /// Filesystems frozen in every window, in the order they are frozen; empty when
    /// nothing is mounted (no freeze).
    pub(crate) filesystems: Vec<MountedFs>,
    /// Why some filesystems are frozen before others ("/b before /a: ...").
    pub(crate) freeze_order: Vec<String>,
    /// Chunking, verification and read-ahead, as the engine runs them.
    pub(crate) engine: EngineConfig,
    /// The guardian's deadline for one window.
    pub(crate) max_freeze: Duration,
    /// The kernel's hung-task timeout (None: disabled or unreadable).
    pub(crate) hung_task_timeout: Option<Duration>,
    pub(crate) journal_path: PathBuf,
    pub(crate) start: Start,
    /// An unfinished run neither continued nor dropped: refused before anything is
    /// written (see [`crate::rewrite::sequence`]).
    pub(crate) unfinished: Option<sequence::Unfinished>,
    /// Filesystems whose free space is left out: (filesystem, its start on the target,
    /// its length). Empty: everything is rewritten.
    pub(crate) used_space: Vec<(MountedFs, u64, u64)>,
    /// FITRIM the filesystems afterwards.
    pub(crate) trim: bool,
    /// How the FITRIM slices are spaced (`--trim-rate`, `--pause`).
    pub(crate) trim_pace: crate::host::trim::Pace,
    /// Devices through which the target's bytes can be written (itself, its partitions,
    /// its disk): nothing else may hold them for writing, checked before every window.
    pub(crate) writer_devices: Vec<(u32, u32)>,
    /// The device's partitions, holders, loops and mounts when planned: compared at every
    /// window (`host::shape`).
    pub(crate) shape: crate::host::shape::Shape,
    /// Where the freeze guardian goes (None: nothing is frozen).
    pub(crate) guardian: Option<crate::host::cgroup::Placement>,
    /// Things the user should know that did not stop the plan.
    pub(crate) warnings: Vec<String>,
    /// A dry run's prediction of the run (None: a run, or nothing could be probed).
    pub(crate) prediction: Option<crate::report::Prediction>,
    /// The pipeline's depth (`engine.read_ahead`) and why.
    pub(crate) depth: DepthChoice,
    /// What the run rewrites as planned (ascending, from where it starts): the ranges
    /// in use (or all), less the holes of a backing file; each window maps again.
    pub(crate) ranges: Vec<(u64, u64)>,
    /// Seconds that planning took (GETFSMAP, the hole map): each window pays it again.
    pub(crate) plan_seconds: f64,
    /// Never-written space: the hole map, or why there is none, and what it left out.
    pub(crate) holes: HolesPlanned,
}

impl RewritePlan {
    pub(crate) fn needs_freeze(&self) -> bool {
        !self.filesystems.is_empty()
    }

    pub(crate) fn total_bytes(&self) -> u64 {
        self.engine.range_end - self.engine.range_start
    }
}

/// What the device is and what is on it, once checked.
struct Checked {
    dev: BlockDeviceInfo,
    filesystems: Vec<MountedFs>,
    freeze_order: Vec<String>,
    writer_devices: Vec<(u32, u32)>,
    warnings: Vec<String>,
    guardian: Option<crate::host::cgroup::Placement>,
    /// A thin volume, rewritten only where its pool's map says (its map must be read).
    thin: bool,
}

/// The checks of the device itself: what it is, who holds it, what is mounted on it,
/// whether its alignment, medium and the freeze length suit the options.
fn check_device(o: &RewriteOptions, env: &Environment) -> Result<Checked> {
    device::check_block_device(o.device())?;
    crate::host::privileges::check()?;
    let dev = device::inspect(o.device(), &env.sysfs)?;
    checks::writable(&dev)?;
    checks::nothing_stacked(&dev, &env.sysfs)?;
    let thin = crate::host::thin::Thin::of(&dev, &env.sysfs);
    checks::no_copy_on_write(&dev, &env.sysfs, &thin)?;
    let thin = matches!(thin, Ok(Some(_)));
    checks::no_swap(&dev)?;
    let writer_devices = checks::no_other_writers(&dev, &env.sysfs)?;
    // Filesystems to freeze: on the device, or on its partitions for a whole disk.
    let filesystems = mounts::filesystems_on(&env.mounts, &dev.devices_to_freeze());
    checks::freezable_in_device_mode(&dev, &filesystems, o.run.include_free)?;
    let order = checks::freeze_order(filesystems, env)?;
    let (filesystems, freeze_order) = (order.filesystems, order.reasons);
    checks::exclusive_if_unmounted(&dev, &filesystems, &env.mounts)?;
    checks::aligned(o.run.chunk_size, &dev)?;
    let mut warnings: Vec<String> = checks::not_rotational(&dev, o.force)?.into_iter().collect();
    warnings.extend(crate::host::writers::refuse_uninspected(o.force)?);
    if !filesystems.is_empty() {
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        warnings.extend(crate::host::freeze_order::swap_through(&filesystems, &swaps, &env.sysfs));
        warnings.extend(checks::freeze_length(o.max_freeze(), o.force)?);
        warnings.extend(checks::no_realtime_hogs(o.force)?);
    }
    let guardian =
        if filesystems.is_empty() { None } else { Some(crate::host::cgroup::plan_or_refuse(o.accept_cgroup_risk)?) };
    Ok(Checked { dev, filesystems, freeze_order, writer_devices, warnings, guardian, thin })
}

/// Checks everything and builds the plan. Writes nothing and freezes nothing.
pub(crate) fn plan_rewrite(o: &RewriteOptions, env: &Environment) -> Result<RewritePlan> {
    let Checked { dev, filesystems, freeze_order, writer_devices, mut warnings, guardian, thin } =
        check_device(o, env)?;
    let state = checks::state_dir(&o.state_dir, &filesystems, o.run.chunk_size, o.dry_run)?;
    let journal_path = journal::journal_path(&state.path, &dev.identity);
    let (start, unfinished) = decide_start(o, &dev, o.run.chunk_size.bytes(), &journal_path, &mut warnings)?;
    warnings.extend(unfinished.iter().filter(|_| o.dry_run).map(|u| u.warning()));
    if state.on_frozen_fs {
        warnings.push(format!(
            "the state directory {} is on a filesystem reseq freezes: journal records are kept in memory during each window and written between windows, so a crash loses at most one window of progress",
            o.state_dir.display()
        ));
    }
    let used_space =
        if o.run.include_free { Vec::new() } else { used_space_spans(&env.sysfs, &dev, &filesystems, &mut warnings) };
    let from = if let Start::Resume { done_offset, .. } = start { done_offset } else { 0 };
    let backing = Backing::of(&dev, &env.sysfs);
    if let (true, Err(why)) = (thin, &backing) {
        // Without its map, every block would be written, and allocated from the pool.
        return Err(Error::refused(
            format!("{} is a thin volume, and its map cannot be read: {why}", dev.path.display()),
            "check the pool (lvs -a, dmsetup status), then run reseq again",
        ));
    }
    let (ranges, plan_seconds, holes) =
        run_ranges(&dev, &used_space, backing.as_ref(), (from, addressable_end(&dev)), &mut warnings);
    let freezes = !filesystems.is_empty();
    let (engine, depth) = engine_config(o, &dev, &start, (&journal_path, &state), freezes, &ranges)?;
    warnings.extend(space_warnings(o, (&dev, holes.mapped), &engine, &filesystems, &env.sysfs));
    let (hung_task_timeout, _) = checks::hung_task();
    // Taken last: what the checks above found is the shape every window must see again.
    let shape = crate::host::shape::Shape::take(dev.dev_num, &env.sysfs);
    let mut plan = RewritePlan {
        used_space,
        trim: !o.run.no_trim,
        trim_pace: crate::host::trim::Pace::of(o.run.trim_rate.map(|r| r.bytes_per_second()), o.run.pause),
        device: dev,
        filesystems,
        freeze_order,
        engine,
        max_freeze: o.max_freeze(),
        hung_task_timeout,
        journal_path,
        start,
        unfinished,
        shape,
        writer_devices,
        guardian,
        warnings,
        options: o.run.clone(),
        prediction: None,
        depth,
        ranges,
        plan_seconds,
        holes,
    };
    forecast(o, &mut plan)?;
    Ok(plan)
}

/// What the run leaves out or rewrites that the user should know: the device's tail
/// past its last sector, free space rewritten where nothing is mounted, whole unmounted
/// partitions.
fn space_warnings(
    o: &RewriteOptions,
    (dev, holes_mapped): (&BlockDeviceInfo, bool),
    engine: &EngineConfig,
    filesystems: &[MountedFs],
    sysfs: &Sysfs,
) -> Vec<String> {
    let mut warnings = Vec::new();
    if engine.range_end < dev.identity.size_bytes {
        let (tail, device) = (dev.identity.size_bytes - engine.range_end, o.device().display());
        warnings.push(format!(
            "the last {tail} bytes of {device} (from offset {}) are less than one {}-byte sector, which direct I/O cannot address: they are left as they are, not rewritten",
            engine.range_end, dev.dio_offset_align
        ));
    }
    if filesystems.is_empty() {
        warnings.push(format!(
            "nothing is mounted from {}: all of it{} is rewritten, free space included, which tells the SSD that space is in use (undoing TRIM). To skip free space, mount its ext4/xfs filesystem and run reseq again",
            o.device().display(),
            if holes_mapped { " that holds data (its backing file's holes are left out)" } else { "" }
        ));
    }
    if !filesystems.is_empty() && !o.run.include_free {
        warnings.extend(unmounted_partitions(dev, filesystems, sysfs));
    }
    warnings
}

/// The pipeline's depth over the run's ranges (probed on them, or `--read-ahead`), set in
/// `engine`; a run that freezes keeps it within the freeze budget.
fn choose_depth(
    o: &RewriteOptions,
    dev: &BlockDeviceInfo,
    engine: &mut EngineConfig,
    freezes: bool,
    ranges: &[(u64, u64)],
) -> DepthChoice {
    let depth = predict::depth(o, sum_of(ranges), freezes.then_some(o.max_freeze()), || {
        Some((dev.path.clone(), ranges.to_vec()))
    });
    engine.read_ahead = depth.depth;
    depth
}

/// What the run rewrites, from `from` to `to`: the ranges in use (what GETFSMAP does not
/// call free, asked now, unfrozen: each window asks again), or all of them, less the holes
/// of the device's backing file; how long that took to find; and what the holes left out.
/// A map that cannot be read now counts everything from `from` (a warning): each window
/// maps again, and refuses then.
fn run_ranges(
    dev: &BlockDeviceInfo,
    used_space: &[(MountedFs, u64, u64)],
    backing: std::result::Result<&Backing, &String>,
    (from, to): (u64, u64),
    warnings: &mut Vec<String>,
) -> (Vec<(u64, u64)>, f64, HolesPlanned) {
    let align = u64::from(dev.dio_offset_align).max(512);
    let asked = std::time::Instant::now();
    type Ranges = Vec<(u64, u64)>;
    let found = (|| -> Result<(Ranges, Ranges)> {
        let used = if used_space.is_empty() {
            vec![(from, to.saturating_sub(from))]
        } else {
            let spans = used_space
                .iter()
                .map(|(fs, at, len)| crate::host::usedspace::FsSpan::open(fs.clone(), *at, *len))
                .collect::<Result<Vec<_>>>()?;
            let free = crate::host::usedspace::free_ranges(&spans, from, to)?;
            crate::host::usedspace::subtract(from, to, &free, align)
        };
        let data = match backing {
            Ok(b) => crate::engine::intersect(&used, &b.all_data_ranges((from, to), align)?),
            Err(_) => used.clone(),
        };
        Ok((used, data))
    })();
    let plan_seconds = asked.elapsed().as_secs_f64();
    let mapped = found.is_ok();
    let (used, data) = found.unwrap_or_else(|e| {
        warnings
            .push(format!("what the run rewrites could not be mapped now: {}", crate::support::error::error_chain(&e)));
        let all = vec![(from, to.saturating_sub(from))];
        (all.clone(), all)
    });
    let data: Vec<(u64, u64)> = data.into_iter().filter(|r| r.1 > 0).collect();
    // A thin volume's blocks shared with a snapshot: in use, holding data, left out.
    let shared = backing.ok().filter(|_| mapped).map_or(0, |b| sum_of(&crate::engine::intersect(&used, &b.shared())));
    let holes = HolesPlanned {
        mapped: backing.is_ok(),
        source: backing.map_or_else(|why| why.clone(), |b| b.described.clone()),
        bytes_in_holes: sum_of(&used) - sum_of(&data),
        bytes_to_rewrite: sum_of(&data),
        bytes_shared: shared,
    };
    (data, plan_seconds, holes)
}

fn sum_of(ranges: &[(u64, u64)]) -> u64 {
    ranges.iter().map(|r| r.1).sum()
}

/// The chunk-size trial (`engine::trial`): on a long fresh run that freezes nothing (its
/// stretches are windows of their own), keeps no pace (`--rate`) and rewrites the whole
/// range (not `--only-slow`'s or a scan's regions, chosen later), when neither the chunk
/// size nor the depth was given, and both shapes' buffers take at most a quarter of the
/// memory available. A resumed run keeps the shape its journal says: its first run's
/// `--chunk-size`, given or not, is not on its command line.
fn choose_trial(
    o: &RewriteOptions,
    engine: &EngineConfig,
    (freezes, resumed): (bool, bool),
    ranges: &[(u64, u64)],
) -> Option<Trial> {
    let chooses = o.run.only_slow || o.run.from_scan.is_some();
    let given = o.given.chunk_size || o.given.read_ahead || o.run.rate.is_some();
    if freezes || resumed || chooses || given || engine.read_ahead == 0 {
        return None;
    }
    let own = Shape { chunk_size: engine.chunk_size, read_ahead: engine.read_ahead };
    let bytes: u64 = ranges.iter().map(|r| r.1).sum();
    let from = crate::support::hooks::size("trial-from").unwrap_or(trial::TRIAL_FROM);
    let stretch = crate::support::hooks::size("trial-stretch").unwrap_or(trial::STRETCH);
    let trial = Trial::offer(own, bytes, from, stretch)?;
    let tried = EngineConfig { trial: Some(trial.clone()), ..engine.clone() };
    match mem_available() {
        Some(free) if tried.peak_memory_bytes() > free / 4 => {
            log::info!(
                "no chunk-size trial: its buffers ({}) would take more than a quarter of the memory available ({})",
                units::human_bytes(tried.peak_memory_bytes()),
                units::human_bytes(free)
            );
            None
        }
        _ => Some(trial),
    }
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib << 10)
}

/// `--rate` against the bytes to rewrite (refused past a year), and a dry run's
/// prediction. A prediction that cannot be made is a warning, never a refusal.
fn forecast(o: &RewriteOptions, plan: &mut RewritePlan) -> Result<()> {
    if o.run.rate.is_none() && !o.dry_run {
        return Ok(());
    }
    let layout = match device_layout(plan) {
        Ok(l) => l,
        Err(e) => {
            plan.warnings.push(format!("no prediction: {}", crate::support::error::error_chain(&e)));
            return Ok(());
        }
    };
    let rate = o.run.rate.map(|r| r.bytes_per_second());
    plan.warnings.extend(checks::finishes(layout.bytes(), plan.engine.chunk_size, rate, o.force, o.dry_run)?);
    if !o.dry_run {
        return Ok(());
    }
    let pacing = pacing(o, plan);
    let run =
        predict::EngineRun { device: plan.device.path.clone(), align: u64::from(plan.device.dio_offset_align), layout };
    match predict::predict(&[run], &pacing) {
        Ok(mut p) => {
            if let Some(t) = &plan.engine.trial {
                predict::with_trial(&mut p.report, t, pacing.pause);
            }
            plan.warnings.extend(predict::absurd(&p.report, &pacing));
            plan.prediction = Some(p.report);
        }
        Err(e) => plan.warnings.push(format!("no prediction: {}", crate::support::error::error_chain(&e))),
    }
    Ok(())
}

/// The run's pacing, for the prediction.
fn pacing(o: &RewriteOptions, plan: &RewritePlan) -> predict::Pacing {
    let e = &plan.engine;
    let chooses = o.run.only_slow || o.run.from_scan.is_some();
    predict::Pacing {
        chunk_size: e.chunk_size,
        verify: e.verify,
        deadline: plan.needs_freeze().then_some(plan.max_freeze),
        pause: e.pause,
        rate: e.rate_bytes_per_second,
        max_overruns: e.max_overruns,
        read_ahead: e.read_ahead,
        read_gain: plan.depth.read_gain(),
        notes: chooses
            .then(|| "choice: the regions to rewrite are chosen at the run's start; this counts every byte in use, the most the run rewrites".to_string())
            .into_iter()
            .chain([predict::depth_note(&plan.depth)])
            .chain(e.trial.as_ref().map(|t| {
                format!(
                    "chunk trial: every chunk is costed at {}, the run's own shape; the first {} are rewritten in the trial's shapes, the rest in the faster",
                    trial::label(t.shapes[0]),
                    units::human_bytes(t.stretch_bytes * 2 * t.shapes.len() as u64)
                )
            }))
            .collect(),
    }
}

/// What the run rewrites, as the engine's planner will see it: the plan's ranges (in
/// use, holding data), each window planning again as long as the plan took.
fn device_layout(plan: &RewritePlan) -> Result<predict::Layout> {
    let runs = plan.ranges.iter().map(|&(offset, len)| predict::Run { offset, len, joins: false });
    let batches = vec![predict::Batch { map_seconds: 0.0, runs: runs.collect() }];
    let plan_seconds = if plan.used_space.is_empty() && !plan.holes.mapped { 0.0 } else { plan.plan_seconds };
    Ok(predict::Layout { batches, plan_seconds, plan_time: None })
}

/// A whole disk with some partitions mounted: each unmounted one is rewritten whole,
/// free space included (which undoes its TRIM), and the plan says so, with the total.
fn unmounted_partitions(dev: &BlockDeviceInfo, filesystems: &[MountedFs], sysfs: &Sysfs) -> Vec<String> {
    let mounted: Vec<(u32, u32)> = filesystems.iter().map(|f| f.dev_num).collect();
    let unmounted: Vec<(&String, u64)> = dev
        .partitions
        .iter()
        .filter(|(_, d)| !mounted.contains(d))
        .map(|(name, _)| (name, sysfs.read(name, "size").and_then(|s| s.parse::<u64>().ok()).unwrap_or(0) * 512))
        .collect();
    let mut out: Vec<String> = unmounted
        .iter()
        .map(|(name, bytes)| {
            format!(
                "partition /dev/{name} ({}) is not mounted: all of it is rewritten, free space included (which tells the SSD that space is in use again); mount its ext4/xfs to skip its free space",
                units::human_bytes(*bytes)
            )
        })
        .collect();
    if unmounted.len() > 1 {
        let total: u64 = unmounted.iter().map(|u| u.1).sum();
        out.push(format!("unmounted partitions rewritten whole: {} in all", units::human_bytes(total)));
    }
    out
}

/// Chunking, verification and pacing as the engine runs them; a resumed run keeps the
/// journal's chunk size; the depth chosen for it ([`choose_depth`]).
fn engine_config(
    o: &RewriteOptions,
    dev: &BlockDeviceInfo,
    start: &Start,
    (journal_path, state): (&Path, &crate::host::state_dir::StateDir),
    freezes: bool,
    ranges: &[(u64, u64)],
) -> Result<(EngineConfig, DepthChoice)> {
    let (chunk_size, start_offset) = match start {
        Start::Resume { done_offset, .. } => (
            journal::read(journal_path)?
                .and_then(|r| r.run)
                .map(|r| r.chunk_size_bytes)
                .unwrap_or(o.run.chunk_size.bytes()),
            *done_offset,
        ),
        Start::Fresh => (o.run.chunk_size.bytes(), 0),
    };
    let span =
        Span { chunk_size, range: (0, addressable_end(dev)), start_offset, journal_on_frozen_fs: state.on_frozen_fs };
    let rescue = sequence::rescue_to(state.path.clone(), dev, Vec::new());
    let mut engine = sequence::engine_config(o, span, Some(rescue));
    let depth = choose_depth(o, dev, &mut engine, freezes, ranges);
    engine.trial = choose_trial(o, &engine, (freezes, matches!(start, Start::Resume { .. })), ranges);
    Ok((engine, depth))
}

/// With `--resume`: the options with the interrupted run's in place of those left out
/// (see [`crate::options::resume`]). None without `--resume`, without an unfinished run,
/// or when the device cannot be inspected (planning then says why).
pub(crate) fn resumed_options(o: &RewriteOptions, env: &Environment) -> Result<Option<RewriteOptions>> {
    if !o.resume {
        return Ok(None);
    }
    let Ok(dev) = device::inspect(o.device(), &env.sysfs) else { return Ok(None) };
    let state = crate::host::state_dir::resolve(&o.state_dir);
    let Ok(Some(replay)) = journal::read(&journal::journal_path(&state, &dev.identity)) else { return Ok(None) };
    let Some(options) = replay.run.filter(|r| !replay.finished && r.identity == dev.identity).and_then(|r| r.options)
    else {
        return Ok(None);
    };
    let resumed = options.apply(o, o.default_max_freeze())?;
    if resumed.run != o.run {
        log::info!("resuming with the interrupted run's options: {}", options.describe());
    }
    Ok(Some(resumed))
}

/// New run or continuation, from the device's journal and `--resume`/`--restart`; an
/// unfinished run neither continued nor dropped comes with the fresh start.
fn decide_start(
    o: &RewriteOptions,
    dev: &BlockDeviceInfo,
    chunk_size: u64,
    path: &Path,
    warnings: &mut Vec<String>,
) -> Result<(Start, Option<sequence::Unfinished>)> {
    let replay: Option<Replay> = journal::read(path)?;
    let Some(r) = replay else {
        if o.resume {
            log::info!("no journal at {}: starting a new run", path.display());
        }
        return Ok((Start::Fresh, None));
    };
    if let Some(d) = &r.damage {
        warnings.push(d.describe(path));
        // Without its first record nothing says what the last run did, nor which chunks
        // it left in flight.
        if r.run.is_none() && !o.restart {
            return Err(Error::refused(
                format!("the journal's first record is damaged: {}", d.describe(path)),
                "pass --restart to discard it and start over (the chunks a crashed run left in flight are then not checked)",
            ));
        }
    }
    let Some(run) = r.run.clone().filter(|_| !r.finished) else {
        if o.resume {
            log::info!("the last run of {} finished: starting a new run", dev.path.display());
        }
        return Ok((Start::Fresh, None));
    };
    if o.restart {
        // Its notes of ranges to check go into the new journal (`Journal::create`).
        let risk: String = r.at_risk.iter().map(|n| format!("; it {}", n.describe())).collect();
        warnings.push(format!(
            "discarding the unfinished run started at {} ({} of {} chunks done{risk})",
            run.started_at, r.done, run.chunks_total
        ));
        return Ok((Start::Fresh, None));
    }
    if !o.resume {
        return Ok((Start::Fresh, Some(unfinished_run(dev, &r, &run))));
    }
    resumable(dev, &run, chunk_size, warnings)?;
    warnings.extend(journal::describe_guardian_kills(&r.guardian_kills));
    warnings.extend(r.at_risk.iter().map(|n| format!("the run being resumed {}", n.describe())));
    let start = Start::Resume {
        done: r.done,
        done_offset: r.done_offset,
        killed_mid_write: r
            .killed_last
            .then(|| r.guardian_kills.last().map(|k| k.in_flight.clone()).unwrap_or_default()),
        in_flight: r.in_flight,
        started_at: run.started_at,
    };
    Ok((start, None))
}

/// A run without `--resume` or `--restart` over an unfinished one: refused.
fn unfinished_run(dev: &BlockDeviceInfo, r: &Replay, run: &journal::RunRecord) -> sequence::Unfinished {
    let (start, end) = (run.range_start_bytes, run.range_end_bytes);
    let risk: String = r.at_risk.iter().map(|n| format!("; it {}", n.describe())).collect();
    sequence::Unfinished {
        what: format!(
            "an unfinished run of {} exists ({} of {} done, started {}{risk})",
            dev.path.display(),
            units::human_bytes(r.done_offset.clamp(start, end) - start),
            units::human_bytes(end - start),
            run.started_at
        ),
    }
}

/// The journal's run can be continued on this device: the same device, the same range.
fn resumable(
    dev: &BlockDeviceInfo,
    run: &journal::RunRecord,
    chunk_size: u64,
    warnings: &mut Vec<String>,
) -> Result<()> {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trial is for fresh, whole-range, unpaced runs whose shape was not given: a
    /// resumed run keeps its journal's shape (its first run's `--chunk-size` is not on its
    /// command line), and `--only-slow` or `--from-scan` rewrite regions chosen later.
    #[test]
    fn only_a_fresh_whole_run_with_its_shape_not_given_has_a_trial() {
        let engine = EngineConfig {
            chunk_size: 4 << 20,
            range_start: 0,
            range_end: 16 << 30,
            start_offset: 0,
            verify: true,
            read_ahead: 2,
            max_overruns: 3,
            ..EngineConfig::default()
        };
        let o = RewriteOptions::default();
        let all = [(0, 16u64 << 30)];
        let trial = |o: &RewriteOptions, freezes, resumed| choose_trial(o, &engine, (freezes, resumed), &all).is_some();
        let enough_memory = mem_available().is_none_or(|m| m / 4 > 400 << 20);
        assert_eq!(trial(&o, false, false), enough_memory);
        assert!(!trial(&o, true, false), "a run that freezes");
        assert!(!trial(&o, false, true), "a resumed run");
        let mut only_slow = o.clone();
        only_slow.run.only_slow = true;
        let mut from_scan = o.clone();
        from_scan.run.from_scan = Some("scan.json".into());
        let mut given = o.clone();
        given.given.chunk_size = true;
        let mut depth = o.clone();
        depth.given.read_ahead = true;
        for (what, o) in
            [("--only-slow", only_slow), ("--from-scan", from_scan), ("--chunk-size", given), ("--read-ahead", depth)]
        {
            assert!(!trial(&o, false, false), "{what}");
        }
    }
}
