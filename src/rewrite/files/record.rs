//! The record of a file-mode run: its targets and options, then one line per file it
//! finished. It lets `--resume` skip the files an interrupted run finished (their
//! journals are gone: a finished file keeps none) and continue with the options it was
//! started with; and it makes an unfinished file-mode run as visible as a device's:
//! without `--resume` or `--restart`, the next run over the same targets is refused.
//!
//! `STATE/files-KEY.run`, KEY from the targets' canonical paths. JSON lines: a `run`
//! record (written whole, atomically), then `done` records appended after the device was
//! flushed (a file is never said done before its bytes are durable). A torn last line
//! (a crash mid-append) is ignored: that file is done again. Removed when a run ends
//! with every file done.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::journal::FileIdentity;
use crate::options::resume::RunOptions;
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
pub(crate) struct Earlier {
    pub(crate) header: RunHeader,
    /// Files it finished: (device, inode, birth time, extents).
    pub(crate) done: HashSet<Key>,
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
    let mut names: Vec<String> =
        targets.iter().map(|t| std::fs::canonicalize(t).unwrap_or_else(|_| t.clone()).display().to_string()).collect();
    names.sort();
    names.dedup();
    let hash = blake3::hash(names.join("\n").as_bytes()).to_hex();
    state_dir.join(format!("files-{}.run", &hash[..16]))
}

pub(crate) fn canonical_targets(targets: &[PathBuf]) -> Vec<String> {
    targets.iter().map(|t| std::fs::canonicalize(t).unwrap_or_else(|_| t.clone()).display().to_string()).collect()
}

/// Reads the record at `path`, if there is one. A damaged first line is refused: nothing
/// then says which files were done.
pub(crate) fn read(path: &Path) -> Result<Option<Earlier>> {
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
    let done = lines
        .filter_map(|l| match serde_json::from_str::<Line>(l) {
            Ok(Line::Done(id)) => Some(key(&id)),
            _ => None,
        })
        .collect();
    Ok(Some(Earlier { header, done }))
}

/// The record of the running run.
pub(crate) struct Record {
    path: PathBuf,
    file: Option<File>,
    header: RunHeader,
    /// Files done, waiting for the device flush (and a thawed state directory).
    waiting: Vec<FileIdentity>,
    finished: bool,
    any_done: bool,
}

impl Record {
    /// A record, written at the first [`Record::release`] (the state directory may be on
    /// a frozen filesystem until then).
    pub(crate) fn new(path: PathBuf, header: RunHeader) -> Record {
        Record { path, file: None, header, waiting: Vec::new(), finished: false, any_done: false }
    }

    /// Continues the record of a resumed run.
    pub(crate) fn resume(path: PathBuf, earlier: &Earlier) -> Result<Record> {
        let ctx = |e| Error::io(format!("opening {}", path.display()), e);
        let torn = !std::fs::read(&path).map_err(ctx)?.ends_with(b"\n");
        let mut file = OpenOptions::new().append(true).open(&path).map_err(ctx)?;
        // A line torn by a crash (or a full disk) mid-append: end it, so that the next
        // record starts a line of its own.
        if torn {
            file.write_all(b"\n").map_err(ctx)?;
        }
        Ok(Record {
            path,
            file: Some(file),
            header: earlier.header.clone(),
            waiting: Vec::new(),
            finished: false,
            any_done: false,
        })
    }

    pub(crate) fn done(&mut self, id: FileIdentity) {
        self.waiting.push(id);
        self.any_done = true;
    }

    /// No file was recorded done by this run.
    pub(crate) fn nothing_done(&self) -> bool {
        !self.any_done
    }

    /// Writes what waits, durably. Call it only after the device was flushed, thawed.
    pub(crate) fn release(&mut self) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        let ctx = |e| Error::io(format!("writing {}", self.path.display()), e);
        if self.file.is_none() {
            let first = serde_json::to_string(&Line::Run(self.header.clone())).unwrap_or_default() + "\n";
            crate::engine::journal::replace_atomically(&self.path, &first).map_err(ctx)?;
            self.file = Some(OpenOptions::new().append(true).open(&self.path).map_err(ctx)?);
        }
        if self.waiting.is_empty() {
            return Ok(());
        }
        let text: String = self
            .waiting
            .drain(..)
            .map(|id| serde_json::to_string(&Line::Done(id)).unwrap_or_default() + "\n")
            .collect();
        let f = self.file.as_mut().expect("opened above");
        f.write_all(text.as_bytes()).map_err(ctx)?;
        f.sync_data().map_err(ctx)?;
        crate::support::hooks::point("files-recorded");
        Ok(())
    }

    pub(crate) fn has_waiting(&self) -> bool {
        !self.finished && (!self.waiting.is_empty() || self.file.is_none())
    }

    /// Every file is done: the record goes (and is not written again).
    pub(crate) fn finish(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        self.finished = true;
    }
}
