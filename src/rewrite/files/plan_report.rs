//! File mode's plan as a report shows it (`plan` in JSON, as device mode's): the chunks,
//! the limits, the filesystems frozen, and every file with what the run does with it.

use std::path::Path;

use crate::report::{Planned, PlannedFile, Report};
use crate::rewrite::sequence::{self, Span};

use super::plan::{FilesPlan, file_identity, mapped};
use super::record;

/// Records the plan in the report as device mode's is ([`Report::set_plan`]): what
/// `reseq rewrite --dry-run --json` shows, and a run's report keeps.
pub(super) fn record_plan(plan: &FilesPlan, report: &mut Report) {
    let o = &plan.options;
    let chunk = o.run.chunk_size.bytes();
    let files = files(plan);
    // The shape of the engine's largest run: its buffers are the plan's memory.
    let span =
        Span { chunk_size: chunk, range: (0, largest_run(plan, &files)), start_offset: 0, journal_on_frozen_fs: false };
    let engine = sequence::engine_config(o, span, None);
    let runs = super::layout::engine_runs(plan);
    let filesystems: Vec<_> = plan.groups.iter().map(|g| g.fs.clone()).collect();
    report.set_plan(Planned {
        device: None,
        engine: &engine,
        chunks_total: runs.iter().map(|r| r.layout.chunks(chunk).len() as u64).sum(),
        files: Some(files),
        filesystems: &filesystems,
        resume_from_chunk: 0,
        max_freeze: Some(o.max_freeze()),
        hung_task_timeout: crate::rewrite::checks::hung_task().0,
        journal_path: &plan.record_path,
        // The plan's own warnings are the report's already.
        warnings: &[],
        holes: None,
    });
}

/// The bytes of the longest run: a filesystem's files to rewrite laid end to end, each
/// rounded up to its device's offset alignment (as the run lays them).
fn largest_run(plan: &FilesPlan, files: &[PlannedFile]) -> u64 {
    let mut span = vec![0u64; plan.groups.len()];
    for (p, f) in plan.planned.iter().zip(files).filter(|(_, f)| f.left_alone.is_none() && !f.done_earlier) {
        let align = u64::from(plan.groups[p.fs].device.dio_offset_align).max(1);
        span[p.fs] += f.size_bytes.div_ceil(align) * align;
    }
    span.into_iter().max().unwrap_or(0)
}

/// Every file found, in the plan's order.
fn files(plan: &FilesPlan) -> Vec<PlannedFile> {
    plan.planned
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let done_earlier = plan.done_before.contains_key(&i);
            let left_alone = plan.left_alone.get(&i).cloned();
            let size_bytes = std::fs::metadata(&p.path).map_or(0, |m| m.len());
            let counted = !done_earlier && left_alone.is_none();
            PlannedFile {
                path: p.path.display().to_string(),
                filesystem: plan.groups[p.fs].fs.mount_point.display().to_string(),
                size_bytes,
                bytes_to_rewrite: if counted { plan.to_rewrite[i] } else { 0 },
                left_alone: left_alone.or_else(|| (size_bytes == 0).then(|| super::plan::EMPTY.to_string())),
                done_earlier,
                resumed_from_bytes: if counted { resumed_from(plan, &p.path) } else { 0 },
            }
        })
        .collect()
}

/// Where the interrupted run stopped in a file (0: it did not start it, or none).
fn resumed_from(plan: &FilesPlan, path: &Path) -> u64 {
    let Some(e) = &plan.earlier else { return 0 };
    let Ok(md) = std::fs::metadata(path) else { return 0 };
    let key = record::key(&file_identity(path, &md, mapped(path).as_deref()));
    e.partial.get(&key).copied().unwrap_or(0)
}
