//! File mode's files as the run will lay them out, for the dry run's prediction: one
//! engine run per filesystem, its files in the order of their first block (as
//! `run::FileRun::members` orders them), each a batch the planner maps in some window,
//! its pieces as `extents::plan_extents` plans them, joined to the file before where
//! both continue each other in the run's address space and on the device.

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use super::extents::plan_extents;
use super::plan::{FilesPlan, Planned};
use crate::report::Report;
use crate::rewrite::predict::{Batch, EngineRun, Layout, Predicted, Run};
use crate::sys;

/// Sets the plan's pipeline depth ([`depth_of`]), into the options and the report.
pub(super) fn choose_depth(plan: &mut FilesPlan, report: &mut Report) {
    plan.depth = depth_of(plan, plan.bytes);
    plan.options.run.read_ahead = plan.depth.depth;
    report.pipeline_depth = Some(plan.depth.clone());
}

/// The depth of the run's pipeline, over the `bytes` it rewrites (the files not left
/// alone nor finished earlier): probed on the first filesystem's device, reading the
/// files' own extents there.
fn depth_of(plan: &FilesPlan, bytes: u64) -> crate::measure::depth_probe::DepthChoice {
    crate::rewrite::predict::depth(&plan.options, bytes, Some(plan.options.max_freeze()), || {
        let run = engine_runs(plan).into_iter().find(|r| r.layout.bytes() > 0)?;
        let mut ranges: Vec<(u64, u64)> =
            run.layout.batches.iter().flat_map(|b| &b.runs).map(|r| (r.offset, r.len)).collect();
        ranges.sort_unstable();
        Some((run.device, ranges))
    })
}

/// A dry run's prediction of every filesystem's engine run (into the report, with the
/// warnings of an absurd plan); None, with a warning, when it cannot be made.
pub(super) fn predict(plan: &FilesPlan, report: &mut Report) -> Option<Predicted> {
    let o = &plan.options;
    let pacing = crate::rewrite::predict::Pacing {
        chunk_size: o.run.chunk_size.bytes(),
        verify: !o.run.no_verify,
        deadline: Some(o.max_freeze()),
        pause: o.run.pause,
        rate: o.run.rate.map(|r| r.bytes_per_second()),
        max_overruns: o.run.max_overruns,
        read_ahead: o.run.read_ahead,
        read_gain: plan.depth.read_gain(),
        notes: Vec::new(),
    };
    match crate::rewrite::predict::predict(&engine_runs(plan), &pacing) {
        Ok(p) => {
            report.warnings.extend(crate::rewrite::predict::absurd(&p.report, &pacing));
            report.prediction = Some(p.report.clone());
            Some(p)
        }
        Err(e) => {
            report.warnings.push(format!("no prediction: {}", crate::support::error::error_chain(&e)));
            None
        }
    }
}

/// Each filesystem's engine run, with the files the run rewrites (those chosen, not
/// finished by an interrupted run, not empty); on btrfs, one run per member device,
/// with the copies of the files' extents it holds.
pub(super) fn engine_runs(plan: &FilesPlan) -> Vec<EngineRun> {
    let plan_time = plan.options.max_freeze().as_secs_f64() / 10.0;
    let mut runs = Vec::new();
    for (gi, g) in plan.groups.iter().enumerate() {
        let todo = |(i, p): &(usize, &Planned)| {
            p.fs == gi && !plan.left_alone.contains_key(i) && !plan.done_before.contains_key(i)
        };
        let align = u64::from(g.device.dio_offset_align).max(1);
        let files: Vec<Mapped> =
            plan.planned.iter().enumerate().filter(todo).filter_map(|(_, p)| map(&p.path, align)).collect();
        let Some(b) = &g.btrfs else {
            runs.push(engine_run(&g.device.path, align, files, plan_time));
            continue;
        };
        for (devid, info, _) in &b.members {
            let copies = files.iter().flat_map(|f| copies_on(f, &b.layout, *devid)).collect();
            runs.push(engine_run(&info.path, u64::from(info.dio_offset_align).max(1), copies, plan_time));
        }
    }
    runs
}

fn engine_run(device: &std::path::Path, align: u64, mut files: Vec<Mapped>, plan_time: f64) -> EngineRun {
    files.sort_by_key(|f| f.first);
    let batches = batches(&files);
    EngineRun {
        device: device.to_path_buf(),
        align,
        layout: Layout { batches, plan_seconds: 0.0, plan_time: Some(plan_time) },
    }
}

/// A file on btrfs (FIEMAP gives btrfs logical addresses) as the copies of its extents
/// on member `devid`, at their device offsets: one per copy the device holds (two with
/// DUP), each laid out as a file of its own. None of it where a range does not map (the
/// run skips that file).
fn copies_on(f: &Mapped, layout: &crate::host::btrfs::Layout, devid: u64) -> Vec<Mapped> {
    let mut copies: Vec<Vec<sys::extents::FiemapExtent>> = Vec::new();
    for e in &f.extents {
        let Ok(pieces) = layout.map(e.physical, e.length) else { return Vec::new() };
        for (copy, p) in crate::host::btrfs::Layout::ranked_on(&pieces, devid) {
            let copy = copy as usize;
            if copies.len() <= copy {
                copies.resize_with(copy + 1, Vec::new);
            }
            let logical = e.logical + (p.logical - e.physical);
            copies[copy].push(sys::extents::FiemapExtent { logical, physical: p.physical, length: p.len, ..*e });
        }
    }
    let seconds = f.seconds / copies.len().max(1) as f64;
    copies
        .into_iter()
        .map(|extents| {
            let first = extents.iter().map(|x| x.physical.max(1)).min().unwrap_or(u64::MAX);
            Mapped { first, span: f.span, extents, seconds }
        })
        .collect()
}

/// One file, mapped now (unfrozen: an estimate; the run maps again in each window).
struct Mapped {
    /// Where it sorts: its first block on the device.
    first: u64,
    /// Its size rounded up to whole blocks: its span in the run's address space.
    span: u64,
    extents: Vec<sys::extents::FiemapExtent>,
    /// Open, stat and FIEMAP, as the planner does in a window.
    seconds: f64,
}

/// Maps one file, timed; None when it is gone or empty (the run leaves those alone).
fn map(path: &std::path::Path, align: u64) -> Option<Mapped> {
    let started = Instant::now();
    let f = std::fs::File::open(path).ok()?;
    let md = f.metadata().ok()?;
    let extents = sys::extents::fiemap(f.as_fd(), 0, 0).ok()?;
    let seconds = started.elapsed().as_secs_f64();
    if md.len() == 0 {
        return None;
    }
    let unit = md.blksize().max(align);
    let first = extents.first().map_or(u64::MAX, |e| e.physical.max(1));
    Some(Mapped { first, span: md.len().div_ceil(unit) * unit, extents, seconds })
}

/// The files as batches: each file's pieces, a piece joining the one before when both
/// are adjacent in the run's address space and on the device (as the planner merges
/// them); a shared range counted once, by its first file.
fn batches(files: &[Mapped]) -> Vec<Batch> {
    let mut shared = std::collections::HashSet::new();
    let (mut base, mut last_end) = (0u64, None::<(u64, u64)>);
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let claim = |p: u64, l: u64| shared.insert((p, l));
        let (mut unwritten, mut elsewhere) = (0, 0);
        // A file the run would skip (flagged extents) costs its map and nothing more.
        let pieces = plan_extents(&f.extents, 0, f.span, claim, &mut unwritten, &mut elsewhere).unwrap_or_default();
        let runs = pieces
            .iter()
            .map(|p| {
                let (virt, joins) = (base + p.logical, last_end == Some((base + p.logical, p.physical)));
                last_end = Some((virt + p.len, p.physical + p.len));
                Run { offset: p.physical, len: p.len, joins }
            })
            .collect();
        out.push(Batch { map_seconds: f.seconds, runs });
        base += f.span;
    }
    out
}
