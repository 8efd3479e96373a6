//! Freeze records: before each freeze, the guardian writes what it is about to freeze to
//! a small file under `/run/reseq/` and removes it after the thaw.
//!
//! Why: the guardian outlives `pkill -9 reseq`, but not a `kill -9` of both processes
//! (a cgroup-wide kill does that). A freeze outlives its maker, so afterwards only a
//! record says which filesystems were ours. `reseq thaw` reads the records whose guardian
//! is gone and thaws those filesystems, and nothing else: a freeze made by someone else
//! has no record. The directory must not be on a filesystem reseq freezes (a write there
//! would block the guardian; [`check_run_dir`] refuses one); `/run` is a tmpfs on most
//! hosts, which also empties itself at boot, when no freeze survives anyway.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::mounts::MountedFs;
use crate::host::procs;
use crate::support::error::{Error, Result};

/// One filesystem a guardian is freezing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecordedFs {
    pub(crate) mount_point: PathBuf,
    /// "major:minor" of its device: the mount point must still hold this filesystem.
    pub(crate) dev: String,
    /// The freeze's trace, once frozen: if it reads differently later, the freeze in
    /// place is someone else's (see the guardian's module docs).
    #[serde(default)]
    pub(crate) sentinel: Option<SentinelRecord>,
}

/// The superblock's 4 KiB as it read right after the guardian's freeze.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SentinelRecord {
    pub(crate) device: PathBuf,
    pub(crate) offset: u64,
    pub(crate) blake3: String,
}

/// What one guardian is about to freeze, or holds frozen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FreezeRecord {
    pub(crate) guardian_pid: i32,
    /// Start time of the guardian (`/proc/PID/stat` field 22): tells it from a later
    /// process that reused its PID.
    pub(crate) guardian_start_ticks: u64,
    pub(crate) reseq_pid: i32,
    /// Start time of that reseq: a reseq still alive may still write what the guardian
    /// granted, so its freeze is not to be thawed from outside either.
    #[serde(default)]
    pub(crate) reseq_start_ticks: u64,
    pub(crate) filesystems: Vec<RecordedFs>,
}

impl FreezeRecord {
    /// Named by the guardian's PID and start time: two guardians with one PID (another
    /// PID namespace, a reused PID) never share a record.
    pub(crate) fn path(dir: &Path, guardian_pid: i32, start_ticks: u64) -> PathBuf {
        dir.join(format!("guardian-{guardian_pid}-{start_ticks}.freeze"))
    }

    /// Writes the record whole (temporary file, then rename): a reader never sees half.
    pub(crate) fn write(&self, dir: &Path) -> std::io::Result<()> {
        let tmp = dir.join(format!(".guardian-{}-{}.tmp", self.guardian_pid, self.guardian_start_ticks));
        let mut f = File::create(&tmp)?;
        f.write_all(serde_json::to_string(self).map_err(std::io::Error::other)?.as_bytes())?;
        drop(f);
        std::fs::rename(&tmp, FreezeRecord::path(dir, self.guardian_pid, self.guardian_start_ticks))
    }

    pub(crate) fn remove(dir: &Path, guardian_pid: i32, start_ticks: u64) {
        let _ = std::fs::remove_file(FreezeRecord::path(dir, guardian_pid, start_ticks));
    }

    /// Whether the guardian that wrote this record still runs, and in which state
    /// (`/proc/PID/stat` field 3: `T` stopped, `D` in uninterruptible I/O...).
    /// A zombie (`Z`, `X`) is gone: it can no longer thaw anything.
    pub(crate) fn guardian_state(&self) -> Option<char> {
        procs::alive(self.guardian_pid, self.guardian_start_ticks)
    }

    /// The state of the reseq this guardian served, if it still runs.
    pub(crate) fn reseq_state(&self) -> Option<char> {
        procs::alive(self.reseq_pid, self.reseq_start_ticks)
    }
}

/// Every record in `dir`, with the ones that cannot be read as errors.
pub(crate) fn list(dir: &Path) -> std::io::Result<Vec<(PathBuf, std::result::Result<FreezeRecord, String>)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "freeze") {
            continue;
        }
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()));
        out.push((path, parsed));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Makes sure the guardian can record its freezes before anything is frozen: the
/// directory exists, is writable, and is not on a filesystem about to be frozen.
pub(crate) fn check_run_dir(dir: &Path, frozen: &[MountedFs]) -> Result<()> {
    let hint = "set RESEQ_RUN_DIR to a writable directory on tmpfs (normally /run/reseq)";
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| {
        Error::refused(format!("cannot create the freeze-record directory {}: {e}", dir.display()), hint)
    })?;
    let meta = std::fs::metadata(dir)
        .map_err(|e| Error::refused(format!("cannot read the freeze-record directory {}: {e}", dir.display()), hint))?;
    let dev = crate::host::devnum::dev_num(meta.dev());
    if let Some(fs) = frozen.iter().find(|f| f.dev_num == dev) {
        return Err(Error::refused(
            format!(
                "the freeze-record directory {} is on {}, which reseq would freeze: the guardian could not write there",
                dir.display(),
                fs.mount_point.display()
            ),
            hint,
        ));
    }
    // An overlay or FUSE filesystem can be backed by one reseq freezes (a container's
    // /run on the host disk), and its device number does not say so: a record write
    // there would block the guardian inside a freeze.
    use nix::sys::statfs::{FUSE_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC, statfs};
    if let Ok(st) = statfs(dir)
        && [OVERLAYFS_SUPER_MAGIC, FUSE_SUPER_MAGIC].contains(&st.filesystem_type())
    {
        return Err(Error::refused(
            format!(
                "the freeze-record directory {} is on an overlay or FUSE filesystem, which may be backed by one reseq freezes",
                dir.display()
            ),
            hint,
        ));
    }
    let probe = dir.join(format!(".probe-{}", std::process::id()));
    File::create(&probe).and_then(|mut f| f.write_all(b"probe")).map_err(|e| {
        Error::refused(format!("cannot write in the freeze-record directory {}: {e}", dir.display()), hint)
    })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_list() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let procs::Stat { start_ticks: start, .. } = procs::stat(me).unwrap();
        let r = FreezeRecord {
            guardian_pid: me,
            guardian_start_ticks: start,
            reseq_pid: 1,
            reseq_start_ticks: 0,
            filesystems: vec![RecordedFs { mount_point: "/mnt/x".into(), dev: "7:1".into(), sentinel: None }],
        };
        r.write(dir.path()).unwrap();
        std::fs::write(dir.path().join("guardian-9.freeze"), "{half").unwrap();
        let l = list(dir.path()).unwrap();
        assert_eq!(l.len(), 2);
        assert!(l.iter().any(|(_, p)| p.as_ref().is_ok_and(|x| *x == r)));
        assert!(l.iter().any(|(_, p)| p.is_err()));
        // The state itself may change between two reads (running, sleeping).
        assert!(r.guardian_state().is_some(), "the live guardian is found");
        let reused = FreezeRecord { guardian_start_ticks: start + 1, ..r.clone() };
        assert_eq!(reused.guardian_state(), None, "a reused PID is not the guardian");
        FreezeRecord::remove(dir.path(), me, start + 1);
        assert_eq!(list(dir.path()).unwrap().len(), 2, "another guardian's record with the same PID stays");
        FreezeRecord::remove(dir.path(), me, start);
        assert_eq!(list(dir.path()).unwrap().len(), 1);
    }
}
