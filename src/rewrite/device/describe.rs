//! Device mode's dry-run text: what a plan will do, and what it will not. The freeze,
//! guardian and closing lines are both modes' ([`crate::rewrite::describe`]).

use super::plan::{RewritePlan, Start};
use crate::rewrite::{describe_guardian, dry_run_end, frozen_share};
use crate::support::units::human_bytes;

/// The plan, for `--dry-run`.
pub(crate) fn describe_plan(plan: &RewritePlan) -> String {
    let d = &plan.device;
    let mut s =
        format!("plan for {} ({}, {}):\n", d.path.display(), d.identity.dev, human_bytes(d.identity.size_bytes));
    s += &describe_chunks(plan);
    s += &describe_freeze(plan);
    s += &format!(
        "  other writers: none (checked every file table of every process the kernel shows reseq (each thread's own too), their writable mappings, io_uring registered files and io_uring rings mapped with no fd (refused: their files cannot be listed), and loop devices backed by {} or its partitions/disk: {}); checked again before windows and within them; the device's written-sectors counters are compared with reseq's own writes before every write (exit 9 if they grew more); a loop device's backing files are watched by the kernel (fanotify FAN_MODIFY on their inodes), read before every write (exit 9 on any write, naming the PID); its partitions, holders, loops and mounts are compared with the plan's at every window. Not seen: {}fds in flight over unix sockets until the writes show in the counters, stores through a shared mapping of a backing file made after the last scan, SCSI/NVMe passthrough, writers on another host or below the device\n",
        plan.device.path.display(),
        plan.writer_devices.iter().map(|(a, b)| format!("{a}:{b}")).collect::<Vec<_>>().join(", "),
        crate::host::writers::describe_uninspected(),
    );
    s += &crate::host::aliases::describe(&plan.writer_devices, &crate::host::device::Sysfs::default());
    s += &describe_space(plan);
    s += &describe_selection(&plan.options);
    s += &format!("  medium: {}\n", d.medium);
    s += &format!("  journal: {}\n", plan.journal_path.display());
    s += &plan.prediction.as_ref().map(crate::report::render::prediction).unwrap_or_default();
    s + &dry_run_end(&plan.warnings)
}

/// `--only-slow` and `--from-scan`: what chooses the regions, since a dry run does not
/// scan.
fn describe_selection(o: &crate::options::rewrite::RunOptions) -> String {
    let rule = format!(
        "regions reading below {:.0} % of the fastest quarter's median are rewritten, the others left alone",
        o.slow_threshold * 100.0
    );
    match (&o.from_scan, o.only_slow) {
        (Some(p), _) => format!("  selection: --from-scan {}: {rule}\n", p.display()),
        (None, true) => format!(
            "  selection: --only-slow: a scan of {} regions at the start of the run times each; {rule} (the report and progress count only those)\n",
            o.scan_regions
        ),
        (None, false) => String::new(),
    }
}

/// Range, chunks, resume point, verification and memory.
fn describe_chunks(plan: &RewritePlan) -> String {
    let (e, d) = (&plan.engine, &plan.device);
    let mut s =
        format!("  range: bytes {}..{} ({})\n", e.range_start, e.range_end, human_bytes(e.range_end - e.range_start));
    let (chunks, size) = (e.chunks_total(), human_bytes(e.chunk_size));
    s += &format!(
        "  chunks: {chunks} of {size} (direct-I/O alignment {} B from {}), ascending, one writer\n",
        d.dio_offset_align, d.dio_align_source
    );
    if let Start::Resume { done, started_at, .. } = &plan.start {
        s += &format!("  resume: {done} chunks already done by the run started {started_at}\n");
    }
    s += &format!(
        "  verify: {}\n",
        if e.verify { "read back and compare with the bytes written, after every write" } else { "off" }
    );
    s += &match e.read_ahead {
        0 => format!(
            "  memory: {} in aligned buffers of {} (serial, --read-ahead 0: one chunk at a time{})\n",
            human_bytes(e.memory_bytes()),
            human_bytes(e.chunk_size),
            if e.verify { ", and its read-back" } else { "" },
        ),
        n => format!(
            "  memory: {} in aligned buffers of {} (depth {n}: {n} read ahead, {} read at once, 1 being written{})\n",
            human_bytes(e.memory_bytes()),
            human_bytes(e.chunk_size),
            e.readers(),
            if e.verify { ", read-backs queued, 1 read back" } else { "" },
        ),
    };
    s += &format!("  depth: {} ({})\n", plan.depth.depth, plan.depth.why);
    if let Some(t) = &e.trial {
        s += &format!("  chunk trial: {} (buffers: {} at most)\n", t.describe(), human_bytes(e.peak_memory_bytes()));
    }
    s
}

/// What is frozen, and how long each window may be.
fn describe_freeze(plan: &RewritePlan) -> String {
    if plan.filesystems.is_empty() {
        return "  freeze: nothing mounted; the device is opened exclusively (O_EXCL), so nothing can mount it meanwhile\n"
            .into();
    }
    let mut s = String::new();
    for f in &plan.filesystems {
        s += &format!("  freeze: {} ({}, {} on {})\n", f.mount_point.display(), f.fs_type, f.source, f.dev);
    }
    for why in &plan.freeze_order {
        s += &format!("  freeze order: {why}\n");
    }
    if !plan.freeze_order.is_empty() {
        s += "  freeze order: dependents first, thawed last: a freeze syncs, and a sync that reaches a frozen filesystem waits for its thaw\n";
    }
    s += &format!(
        "  windows: at most {:.3} s frozen each (new chunks stop when one more, its read-back and the thaw would not fit), pause {:.3} s between; the guardian thaws at the deadline, and {}{}\n",
        plan.max_freeze.as_secs_f64(),
        plan.engine.pause.as_secs_f64(),
        crate::host::freeze::describe_bound(plan.max_freeze),
        plan.hung_task_timeout.map(|t| format!(" (hung-task timeout {} s)", t.as_secs())).unwrap_or_default()
    );
    s += &frozen_share(plan.max_freeze, plan.engine.pause, plan.engine.rate_bytes_per_second, plan.prediction.as_ref());
    s + &plan.guardian.as_ref().map(describe_guardian).unwrap_or_default()
}

/// Which space is rewritten, and the FITRIM after; what the holes of a backing file leave out.
fn describe_space(plan: &RewritePlan) -> String {
    let h = &plan.holes;
    let shared = (h.bytes_shared > 0).then(|| format!(" and {} shared with a snapshot", human_bytes(h.bytes_shared)));
    let holes = match h.mapped {
        true => format!(
            "  holes: {} holding no data{} in {} are left out: {} to rewrite\n",
            human_bytes(h.bytes_in_holes.saturating_sub(h.bytes_shared)),
            shared.unwrap_or_default(),
            h.source,
            human_bytes(h.bytes_to_rewrite)
        ),
        false => format!("  holes: {}\n", h.source),
    };
    if plan.used_space.is_empty() {
        let what = if h.mapped { "everything that holds data" } else { "everything" };
        return format!("  space: {what} is rewritten\n{holes}");
    }
    let mut s = String::new();
    let trim = plan.trim.then(|| format!(", FITRIM afterwards in slices, pace {}", plan.trim_pace.describe()));
    for (fs, start, len) in &plan.used_space {
        let (mount, end, fitrim) = (fs.mount_point.display(), start + len, trim.as_deref().unwrap_or_default());
        s += &format!(
            "  space: free space of {mount} ({}, bytes {start}..{end}) is left out (GETFSMAP in each window){fitrim}\n",
            fs.fs_type
        );
    }
    s + &holes
}
