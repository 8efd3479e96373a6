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

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn read(state_dir: &Path) -> Record {
    std::fs::read_to_string(state_dir.join(FILE)).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
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
            .then(|| (now() - e.refreshed_at).max(0.0))
    }
}

/// Records the files a run rewrote to their end (`files`' paths; their times now are
/// those a refreshed file keeps). A record that cannot be written costs only a warning:
/// the files are rewritten, a later `--older-than` chooses them again.
pub(crate) fn remember(state_dir: &Path, files: &[FileReport]) {
    let done: Vec<&FileReport> =
        files.iter().filter(|f| f.bytes_rewritten > 0 && f.verification != "incomplete").collect();
    if done.is_empty() {
        return;
    }
    let dir = crate::host::state_dir::resolve(state_dir);
    let mut record = read(&dir);
    let at = now();
    for f in done {
        let path = PathBuf::from(&f.path);
        if let Ok(md) = std::fs::metadata(&path) {
            record.insert(key(&md), entry(&path, &md, at));
        }
    }
    // Files gone since their refresh leave the record.
    record.retain(|_, e| Path::new(&e.path).exists());
    let text = serde_json::to_string_pretty(&record).unwrap_or_default();
    if let Err(e) = crate::engine::journal::replace_atomically(&dir.join(FILE), &text) {
        log::warn!("could not record the refreshed files in {}: {e}", dir.join(FILE).display());
    }
}
