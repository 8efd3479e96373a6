//! The files a file-mode run with `--older-than` refreshed, kept in the state directory
//! (`refreshed.json`), so that `--older-than` counts a file's age from its refresh.
//!
//! A file-mode rewrite writes the same bytes through the device, not the filesystem, so
//! mtime and ctime stay as they were, and by them a refreshed file is as old as before. A
//! file whose device, inode, size, mtime and ctime are still those recorded was not
//! written since: its data is as old as the refresh. Any write changes mtime or ctime,
//! and then the file's own times are its age again.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::measure::byfile::unix_now;
use crate::report::FileReport;

/// The record's file name in the state directory.
pub(crate) const FILE: &str = "refreshed.json";

/// What identifies a file's data as unchanged since its refresh.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Entry {
    path: String,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    /// Unix seconds.
    refreshed_at: f64,
}

/// "dev:ino" -> entry.
type Record = BTreeMap<String, Entry>;

fn key(md: &std::fs::Metadata) -> String {
    format!("{}:{}", md.dev(), md.ino())
}

fn entry(path: &Path, md: &std::fs::Metadata, at: f64) -> Entry {
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    Entry {
        path: path.display().to_string(),
        size: md.len(),
        mtime_ns: ns(md.mtime(), md.mtime_nsec()),
        ctime_ns: ns(md.ctime(), md.ctime_nsec()),
        refreshed_at: at,
    }
}

/// The record; none yet is empty, and so is one that cannot be read, with a warning (its
/// files are then chosen again, which costs writes, not data).
fn read(state_dir: &Path) -> Record {
    let path = state_dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Record::new(),
        Err(e) => {
            log::warn!("cannot read {}: {e}; files refreshed before count by their own times", path.display());
            return Record::new();
        }
    };
    serde_json::from_str(&text).unwrap_or_else(|e| {
        log::warn!("{} is not a record of refreshed files ({e}); it will be replaced", path.display());
        Record::new()
    })
}

/// Seconds since `path` was refreshed, if the record has it and it was not written since.
pub(crate) struct Refreshed(Record);

impl Refreshed {
    pub(crate) fn load(state_dir: &Path) -> Refreshed {
        Refreshed(read(&crate::host::state_dir::resolve(state_dir)))
    }

    pub(crate) fn since(&self, path: &Path, md: &std::fs::Metadata) -> Option<f64> {
        let e = self.0.get(&key(md))?;
        let same = entry(path, md, e.refreshed_at);
        (same.size == e.size && same.mtime_ns == e.mtime_ns && same.ctime_ns == e.ctime_ns)
            .then(|| (unix_now() - e.refreshed_at).max(0.0))
    }
}

/// Records the files a run rewrote to their end, this run or the interrupted one it
/// resumed (`files`' paths; their times now are those a refreshed file keeps). A record
/// that cannot be written costs only a warning: the files are rewritten, a later
/// `--older-than` chooses them again. Runs sharing a state directory take turns (a lock),
/// so that neither loses the other's files.
pub(crate) fn remember(state_dir: &Path, files: &[FileReport]) {
    let done: Vec<&FileReport> = files
        .iter()
        .filter(|f| {
            (f.bytes_rewritten > 0 || f.done_earlier) && f.verification != crate::report::Verification::Incomplete
        })
        .collect();
    if done.is_empty() {
        return;
    }
    let dir = crate::host::state_dir::resolve(state_dir);
    let _turn = std::fs::File::create(dir.join(format!("{FILE}.lock")))
        .ok()
        .and_then(|f| nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).ok());
    let mut record = read(&dir);
    let at = unix_now();
    let mut devices = std::collections::BTreeSet::new();
    for f in done {
        // Absolute, so that a run from another directory finds it.
        let path = std::fs::canonicalize(&f.path).unwrap_or_else(|_| PathBuf::from(&f.path));
        if let Ok(md) = std::fs::metadata(&path) {
            devices.insert(md.dev());
            record.insert(key(&md), entry(&path, &md, at));
        }
    }
    // Files gone since their refresh leave the record, judged only on the filesystems
    // this run wrote to: they are mounted now, another may be only unmounted.
    record.retain(|k, e| !devices.iter().any(|d| k.starts_with(&format!("{d}:"))) || Path::new(&e.path).exists());
    let text = serde_json::to_string_pretty(&record).unwrap_or_default();
    if let Err(e) = crate::engine::journal::replace_atomically(&dir.join(FILE), &text) {
        log::warn!("could not record the refreshed files in {}: {e}", dir.join(FILE).display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(path: &Path, earlier: bool) -> FileReport {
        let mut f = super::super::run::skipped_report(path, "");
        (f.skipped_reason, f.verification, f.done_earlier) = (None, crate::report::Verification::Passed, earlier);
        f.bytes_rewritten = if earlier { 0 } else { 4096 };
        f
    }

    #[test]
    fn files_are_recorded_by_absolute_path_and_a_resumed_runs_earlier_files_too() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        // A relative spelling, as a run from another directory would give it.
        std::env::set_current_dir(dir.path()).unwrap();
        remember(&state, &[done(Path::new("a"), false), done(&b, true)]);
        let r = Refreshed::load(&state);
        for p in [&a, &b] {
            let since = r.since(p, &std::fs::metadata(p).unwrap());
            assert!(since.is_some_and(|s| s < 60.0), "{} not recorded: {:?}", p.display(), r.0);
        }
        assert!(r.0.values().all(|e| Path::new(&e.path).is_absolute()), "{:?}", r.0);
        // Written since: its own times again.
        std::fs::write(&a, b"changed").unwrap();
        assert_eq!(r.since(&a, &std::fs::metadata(&a).unwrap()), None);
        // Gone: it leaves the record at the next run on its filesystem.
        std::fs::remove_file(&b).unwrap();
        remember(&state, &[done(&a, false)]);
        assert_eq!(Refreshed::load(&state).0.len(), 1);
        // A damaged record is replaced, not kept.
        std::fs::write(state.join(FILE), "{garbage").unwrap();
        remember(&state, &[done(&a, false)]);
        assert_eq!(Refreshed::load(&state).0.len(), 1);
    }
}
