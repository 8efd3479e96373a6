//! `reseq thaw`: thaw what a killed reseq left frozen, and nothing else.
//!
//! The guardian outlives everything aimed at reseq, but not a `kill -9` of both
//! processes. Then only its freeze record (see [`crate::host::freeze_record`]) says which
//! filesystems were frozen by reseq. A record is acted on only when its guardian is gone
//! (a live guardian thaws by itself within its bound; a stopped one is named), when the
//! mount point still holds the same filesystem, and when the freeze's sentinel still
//! reads as the guardian left it (otherwise someone else froze it since).

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::host::freeze_record::{self, FreezeRecord, RecordedFs};
use crate::support::error::{Error, Result};

/// What happened to one filesystem of a record.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FsOutcome {
    /// FITHAW succeeded: it was frozen, and now is not.
    Thawed,
    /// FITHAW said it was not frozen.
    NotFrozen,
    /// Left alone, with the reason.
    LeftAlone(String),
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FsResult {
    pub(crate) mount_point: PathBuf,
    pub(crate) dev: String,
    pub(crate) outcome: FsOutcome,
}

/// What `reseq thaw` did.
#[derive(Debug, Clone, Serialize, Default)]
pub(crate) struct ThawSummary {
    pub(crate) run_dir: PathBuf,
    pub(crate) filesystems: Vec<FsResult>,
    /// Records whose guardian still runs: (guardian PID, its state letter).
    pub(crate) live_guardians: Vec<(i32, char)>,
    /// Records that could not be read, with why.
    pub(crate) unreadable: Vec<(PathBuf, String)>,
}

impl ThawSummary {
    pub(crate) fn to_text(&self) -> String {
        let mut s = String::new();
        for f in &self.filesystems {
            let what = match &f.outcome {
                FsOutcome::Thawed => "thawed (reseq's guardian had been killed while it was frozen)".to_string(),
                FsOutcome::NotFrozen => "not frozen (nothing to do)".to_string(),
                FsOutcome::LeftAlone(why) => format!("left alone: {why}"),
            };
            s += &format!("{} ({}): {what}\n", f.mount_point.display(), f.dev);
        }
        for (path, why) in &self.unreadable {
            s += &format!("{}: unreadable freeze record, left in place: {why}\n", path.display());
        }
        if s.is_empty() && self.live_guardians.is_empty() {
            s += &format!("nothing to thaw: no freeze record of a killed guardian in {}\n", self.run_dir.display());
        }
        s
    }
}

/// Thaws the filesystems of every record whose guardian is gone. Refuses (after doing
/// that) when a guardian still runs: it holds its freeze, and only it may thaw it.
pub(crate) fn run(dir: &Path) -> Result<ThawSummary> {
    let mut summary = ThawSummary { run_dir: dir.to_path_buf(), ..ThawSummary::default() };
    let records = freeze_record::list(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
    for (path, record) in records {
        let record = match record {
            Ok(r) => r,
            Err(why) => {
                summary.unreadable.push((path, why));
                continue;
            }
        };
        // Also when the guardian is gone but reseq is not (stopped, say): it may still make a
        // write the guardian granted, so thawing under it could lose the filesystem's newer data.
        let guardian = record.guardian_state().map(|s| (record.guardian_pid, s));
        if let Some(live) = guardian.or_else(|| record.reseq_state().map(|s| (record.reseq_pid, s))) {
            summary.live_guardians.push(live);
            continue;
        }
        let mut settled = true;
        for fs in &record.filesystems {
            let outcome = thaw_one(fs);
            settled &= matches!(outcome, FsOutcome::Thawed | FsOutcome::NotFrozen);
            summary.filesystems.push(FsResult { mount_point: fs.mount_point.clone(), dev: fs.dev.clone(), outcome });
        }
        // Kept while a filesystem was left alone: the reason may pass (a mount point that
        // could not be opened), and the record is what says the freeze is ours.
        if settled {
            FreezeRecord::remove(dir, record.guardian_pid, record.guardian_start_ticks);
        }
    }
    Ok(summary)
}

/// The refusal for guardians that still run, if any.
pub(crate) fn live_guardian_error(summary: &ThawSummary) -> Option<Error> {
    let (pid, state) = *summary.live_guardians.first()?;
    let stopped = state == 'T' || state == 't';
    Some(Error::refused(
        format!(
            "reseq's freeze guardian, or the reseq it serves, still runs as PID {pid} (state {state}{}); its freeze is still in use and will be ended by the guardian (or, if only reseq is left, by reseq's exit)",
            if stopped { ": stopped" } else { "" }
        ),
        if stopped {
            format!("it was stopped by hand: `kill -CONT {pid}` lets it thaw within its bound")
        } else {
            format!(
                "wait for it (it thaws within its window's bound), or see `ps -o pid,stat,args -p {pid}`; never thaw its filesystems by hand while it runs"
            )
        },
    ))
}

fn thaw_one(fs: &RecordedFs) -> FsOutcome {
    let dir = match std::fs::File::open(&fs.mount_point) {
        Ok(d) => d,
        Err(e) => return FsOutcome::LeftAlone(format!("cannot open the mount point: {e}")),
    };
    // A stat of a frozen filesystem does not block.
    let dev = match dir.metadata() {
        Ok(m) => format!("{}:{}", nix::sys::stat::major(m.dev()), nix::sys::stat::minor(m.dev())),
        Err(e) => return FsOutcome::LeftAlone(format!("cannot stat the mount point: {e}")),
    };
    if dev != fs.dev {
        return FsOutcome::LeftAlone(format!("the mount point now holds another filesystem ({dev})"));
    }
    if let Some(s) = &fs.sentinel {
        let now = crate::sys::block::open_direct_read(&s.device)
            .ok()
            .and_then(|fd| crate::host::sentinel::read_block(fd.as_fd(), s.offset))
            .map(|b| blake3::hash(&b).to_hex().to_string());
        if now.as_ref() != Some(&s.blake3) {
            return FsOutcome::LeftAlone(
                "its superblock changed since reseq's freeze: it was thawed since, and a freeze in place now is someone else's".into(),
            );
        }
    }
    match crate::sys::freeze::fithaw(dir.as_fd()) {
        Ok(()) => FsOutcome::Thawed,
        Err(nix::errno::Errno::EINVAL) => FsOutcome::NotFrozen,
        Err(e) => FsOutcome::LeftAlone(format!("FITHAW failed: {e}")),
    }
}

/// What reseq says when it stops abnormally after freezing: that nothing of this run is
/// left frozen (checked), or what to run if something is.
pub(crate) fn after_abnormal_stop() -> String {
    let me = std::process::id() as i32;
    let left: Vec<String> = freeze_record::list(&crate::engine::rescue::run_dir())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(_, r)| r.ok())
        .filter(|r| r.reseq_pid == me)
        .flat_map(|r| r.filesystems.into_iter().map(|f| f.mount_point.display().to_string()))
        .collect();
    if left.is_empty() {
        "no filesystem is left frozen by this run. Should one ever stay frozen after reseq (its guardian killed too), `reseq thaw` thaws what reseq froze and nothing else".into()
    } else {
        format!("{} may still be frozen by this run: run `reseq thaw`", left.join(", "))
    }
}
