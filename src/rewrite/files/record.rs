//! The record of a file-mode run: its targets and options, and the files it finished.
//! It lets `--resume` skip the files an interrupted run finished and continue with the
//! options it was started with; and it makes an unfinished file-mode run as visible as
//! a device's: without `--resume` or `--restart`, the next run over the same targets is
//! refused.
//!
//! `STATE/files-KEY.run`, KEY from the targets' canonical paths: JSON lines, a `run`
//! record, then a `done` record per file finished by a run before the one that wrote
//! it. Beside it, one engine journal per filesystem, `STATE/files-KEY-DEVICE.journal`,
//! whose run record holds the files in the order they are rewritten: every file below
//! the journal's cursor is finished, and the one the cursor is in is resumed from
//! there. All of it is removed when a run ends with every file done.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::journal::{self, FileIdentity};
use crate::options::rewrite::RunOptions;
use crate::support::error::{Error, Result};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RunHeader {
    pub(crate) targets: Vec<String>,
    pub(crate) options: RunOptions,
    pub(crate) started_at: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Run(RunHeader),
    Done(FileIdentity),
}

/// What an earlier, unfinished run left.
#[derive(Debug)]
pub struct Earlier {
    pub(crate) header: RunHeader,
    /// Files it finished.
    pub done: HashMap<Key, FileIdentity>,
    /// Files it stopped in, and the bytes of each it had done.
    pub(crate) partial: HashMap<Key, u64>,
}

/// A file as it was when it was finished: one whose extents moved since (recreated,
/// extended, truncated) is not done, whatever its inode; one written in place (a live
/// database's pages) still is.
pub(crate) type Key = (String, u64, Option<u64>, Option<String>);

pub(crate) fn key(id: &FileIdentity) -> Key {
    (id.dev.clone(), id.ino, id.birth_time, id.extents.clone())
}

/// Where the record of a run over `targets` lives.
pub(crate) fn path_for(state_dir: &Path, targets: &[PathBuf]) -> PathBuf {
    let mut names = canonical_targets(targets);
    names.sort();
    names.dedup();
    let hash = blake3::hash(names.join("\n").as_bytes()).to_hex();
    state_dir.join(format!("files-{}.run", &hash[..16]))
}

/// The journal of the run recorded at `record`, for the filesystem on `device`.
pub(crate) fn journal_path(record: &Path, device: &str) -> PathBuf {
    record.with_file_name(format!("{}-{device}.journal", stem(record)))
}

fn stem(record: &Path) -> String {
    record.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// What the stops of the run recorded at `record` left to check, from its journals.
pub(crate) fn at_risk(record: &Path) -> Vec<crate::engine::journal::AtRiskNote> {
    let replays = journals(record).into_iter().filter_map(|j| crate::engine::journal::read(&j).ok().flatten());
    replays.flat_map(|r| r.at_risk).collect()
}

/// The journals of the run recorded at `record`.
fn journals(record: &Path) -> Vec<PathBuf> {
    let prefix = format!("{}-", stem(record));
    let Some(dir) = record.parent().and_then(|d| std::fs::read_dir(d).ok()) else { return Vec::new() };
    dir.flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".journal"))
        })
        .collect()
}

pub(crate) fn canonical_targets(targets: &[PathBuf]) -> Vec<String> {
    targets.iter().map(|t| std::fs::canonicalize(t).unwrap_or_else(|_| t.clone()).display().to_string()).collect()
}

/// Reads the record at `path` and its journals, if there is one. A damaged first line
/// is refused: nothing then says which files were done.
pub fn read(path: &Path) -> Result<Option<Earlier>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    let mut lines = text.lines();
    let header = match lines.next().map(serde_json::from_str::<Line>) {
        Some(Ok(Line::Run(h))) => h,
        _ => {
            return Err(Error::refused(
                format!("the file-mode run record {} is damaged (its first line)", path.display()),
                "pass --restart to discard it and start over",
            ));
        }
    };
    // A torn last line (a crash mid-write) is ignored: that file is done again.
    let done = lines
        .filter_map(|l| match serde_json::from_str::<Line>(l) {
            Ok(Line::Done(id)) => Some((key(&id), id)),
            _ => None,
        })
        .collect();
    let mut earlier = Earlier { header, done, partial: HashMap::new() };
    for j in journals(path) {
        from_journal(&j, &mut earlier);
    }
    Ok(Some(earlier))
}

/// The files a filesystem's journal says were finished, and the one it stopped in. A
/// journal that cannot be read says nothing: its files are done again.
fn from_journal(path: &Path, e: &mut Earlier) {
    let Ok(Some(r)) = journal::read(path) else { return };
    for p in r.run.iter().flat_map(|run| &run.files) {
        if r.finished || p.base + p.span <= r.done_offset {
            e.done.insert(key(&p.file), p.file.clone());
        } else if p.base < r.done_offset {
            e.partial.insert(key(&p.file), r.done_offset - p.base);
        }
    }
}

/// Writes the record: the run, and the files finished before it (replacing the record
/// whole, so that the journals of a resumed run can start afresh).
pub(crate) fn write<'a>(path: &Path, header: &RunHeader, done: impl Iterator<Item = &'a FileIdentity>) -> Result<()> {
    let line = |l: &Line| serde_json::to_string(l).unwrap_or_default() + "\n";
    let mut text = line(&Line::Run(header.clone()));
    for id in done {
        text += &line(&Line::Done(id.clone()));
    }
    journal::replace_atomically(path, &text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Every file is done: the record and its journals go.
pub(crate) fn remove(path: &Path) {
    for j in journals(path) {
        let _ = std::fs::remove_file(j);
    }
    let _ = std::fs::remove_file(crate::rewrite::before::path_of(path));
    let _ = std::fs::remove_file(path);
}
