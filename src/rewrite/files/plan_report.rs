//! File mode's plan as a report shows it (`plan` in JSON, as device mode's): the chunks,
//! the limits, the filesystems frozen, and every file with what the run does with it.

use std::path::Path;

use crate::engine;
use crate::report::{PlanReport, PlannedFile};

use super::plan::{FilesPlan, file_identity, mapped};
use super::record;

/// The plan's report: what `reseq rewrite --dry-run --json` shows, and a run's report
/// keeps.
pub(super) fn report(plan: &FilesPlan) -> PlanReport {
    let o = &plan.options;
    let chunk = o.chunk_size.bytes();
    let runs = super::layout::engine_runs(plan);
    let filesystems_frozen = plan.groups.iter().map(|g| g.fs.clone()).collect();
    PlanReport {
        holes: None,
        range_start_bytes: None,
        range_end_bytes: None,
        chunk_size_bytes: chunk,
        chunks_total: runs.iter().map(|r| r.layout.chunks(chunk).len() as u64).sum(),
        resume_from_chunk: 0,
        verify: !o.no_verify,
        read_ahead_chunks: o.read_ahead,
        memory_bytes: engine::memory_bytes(chunk, o.read_ahead, !o.no_verify),
        max_freeze_seconds: Some(o.max_freeze().as_secs_f64()),
        pause_seconds: o.pause.as_secs_f64(),
        hung_task_timeout_seconds: crate::rewrite::checks::hung_task().0.map(|t| t.as_secs()),
        filesystems_frozen,
        journal_path: plan.record_path.display().to_string(),
        files: Some(files(plan)),
        chunk_trial: None,
    }
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
