//! The state directory (journals, rescue copies, locks), checked before anything is
//! frozen or written.
//!
//! - It is resolved with `canonicalize`: a symlink into a filesystem reseq freezes is
//!   that filesystem, and writing there inside a window would block until the thaw.
//! - A directory that cannot take a journal and a rescue copy (unwritable, read-only,
//!   full) is refused up front (exit 3): finding out at the first commit would stop a
//!   run that has begun, and a failed chunk's rescue copy would have nowhere to go.
//! - One lock per device: two runs on one device (or on files of one filesystem) would
//!   freeze each other's filesystem and interleave writes.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::host::mounts::{self, MountedFs};
use crate::support::error::{Error, Result};

const HINT: &str = "choose a state directory on a writable local filesystem with room (--state-dir or RESEQ_STATE_DIR)";

/// `path` with every symlink resolved, also when its last components do not exist yet.
pub(crate) fn resolve(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            return rest.iter().rev().fold(c, |p: PathBuf, r| p.join(r));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return abs,
        }
    }
}

/// A state directory that passed its checks.
#[derive(Debug, Clone)]
pub(crate) struct StateDir {
    /// Canonical path.
    pub(crate) path: PathBuf,
    /// It lies on a filesystem reseq freezes (or may: overlay, FUSE), so nothing may be
    /// written there during a window.
    pub(crate) on_frozen_fs: bool,
}

/// Creates and checks the state directory: writable, not read-only, room for `need`
/// bytes (a journal and a rescue copy). `frozen` are the filesystems the run freezes. A
/// dry run creates and writes nothing, so it checks only what is there.
pub(crate) fn prepare(dir: &Path, frozen: &[MountedFs], need: u64, dry_run: bool) -> Result<StateDir> {
    let path = resolve(dir);
    if dry_run && !path.is_dir() {
        return Ok(StateDir {
            on_frozen_fs: on_frozen(path.ancestors().find(|p| p.is_dir()).unwrap_or(&path), frozen),
            path,
        });
    }
    let shown = if path == dir { dir.display().to_string() } else { format!("{} ({})", dir.display(), path.display()) };
    std::fs::create_dir_all(&path)
        .map_err(|e| Error::refused(format!("cannot create the state directory {shown}: {e}"), HINT))?;
    use nix::sys::statvfs::{FsFlags, statvfs};
    let st =
        statvfs(&path).map_err(|e| Error::refused(format!("cannot examine the state directory {shown}: {e}"), HINT))?;
    if st.flags().contains(FsFlags::ST_RDONLY) {
        return Err(Error::refused(format!("the state directory {shown} is on a read-only filesystem"), HINT));
    }
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    if free < need {
        return Err(Error::refused(
            format!(
                "the state directory {shown} has {} free, less than the {} a journal and a rescue copy of one chunk may need",
                crate::support::units::human_bytes(free),
                crate::support::units::human_bytes(need)
            ),
            HINT,
        ));
    }
    if !dry_run {
        probe_write(&path, need.min(1 << 20))
            .map_err(|e| Error::refused(format!("cannot write in the state directory {shown}: {e}"), HINT))?;
    }
    Ok(StateDir { on_frozen_fs: on_frozen(&path, frozen), path })
}

/// Writes, syncs and removes `bytes` in a uniquely named file.
fn probe_write(dir: &Path, bytes: u64) -> std::io::Result<()> {
    let mut f = tempfile::Builder::new().prefix(".probe-").tempfile_in(dir)?;
    f.write_all(&vec![0u8; bytes.max(1) as usize])?;
    f.as_file().sync_all()
}

/// Whether writing in `path` may block on one of the `frozen` filesystems.
pub(crate) fn on_frozen(path: &Path, frozen: &[MountedFs]) -> bool {
    use nix::sys::statfs::{FUSE_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC, statfs};
    // An overlay or FUSE filesystem may be backed by one that is frozen.
    if statfs(path).is_ok_and(|st| [OVERLAYFS_SUPER_MAGIC, FUSE_SUPER_MAGIC].contains(&st.filesystem_type())) {
        return !frozen.is_empty();
    }
    let by_stat = std::fs::metadata(path).ok().map(|m| crate::host::devnum::dev_num(m.dev()));
    let by_mount = mounts::read_mounts().ok().and_then(|m| mounts::mount_containing(&m, path).map(|e| e.dev));
    frozen.iter().any(|f| Some(f.dev_num) == by_stat || Some(f.dev_num) == by_mount)
}

/// An exclusive lock on one device, held for the run (and by its guardian, which
/// inherits the descriptor, until the thaw). The file is removed when the run ends.
#[derive(Debug)]
pub(crate) struct DeviceLock {
    _lock: Flock<File>,
    pub(crate) path: PathBuf,
}

impl Drop for DeviceLock {
    fn drop(&mut self) {
        // Removed while still locked; a run that opened it meanwhile sees, once it has
        // the lock, that the path no longer names its file, and starts over.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes the lock of device `name`, or refuses naming the PID that holds it.
pub(crate) fn lock_device(dir: &Path, name: &str, shown: &str) -> Result<DeviceLock> {
    let path = dir.join(format!("device-{name}.lock"));
    for _ in 0..100 {
        let lock = try_lock(&path, shown)?;
        let same = std::fs::metadata(&path)
            .ok()
            .zip(lock.metadata().ok())
            .is_some_and(|(p, f)| p.ino() == f.ino() && p.dev() == f.dev());
        if same {
            return Ok(DeviceLock { _lock: lock, path });
        }
    }
    Err(Error::Internal(format!("the lock of {shown} kept being replaced")))
}

fn try_lock(path: &Path, shown: &str) -> Result<Flock<File>> {
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path);
    let file = file.map_err(|e| Error::refused(format!("cannot create the lock {}: {e}", path.display()), HINT))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            let _ = lock.set_len(0);
            let _ = lock.rewind();
            let _ = writeln!(lock, "{}", std::process::id());
            Ok(lock)
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let pid = text.trim();
            let who = if pid.is_empty() { "another reseq".to_string() } else { format!("another reseq (PID {pid})") };
            Err(Error::refused(
                format!("{who} is working on {shown} (it holds {})", path.display()),
                "wait for it to finish, or stop it (it thaws and can be resumed); two runs on one device would freeze and write over each other",
            ))
        }
        Err((_, e)) => Err(Error::refused(format!("cannot lock {}: {e}", path.display()), HINT)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_symlinks_also_below_missing_parts() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().canonicalize().unwrap().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
        assert_eq!(resolve(&d.path().join("link/a/b")), real.join("a/b"));
    }

    #[test]
    fn a_second_lock_on_one_device_is_refused_with_the_pid() {
        let d = tempfile::tempdir().unwrap();
        let _first = lock_device(d.path(), "loop9", "/dev/loop9").unwrap();
        let second = lock_device(d.path(), "loop9", "/dev/loop9").unwrap_err().to_string();
        assert!(second.contains(&format!("another reseq (PID {})", std::process::id())), "{second}");
        assert!(lock_device(d.path(), "loop8", "/dev/loop8").is_ok(), "another device is not locked");
    }

    #[test]
    fn a_full_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = prepare(d.path(), &[], u64::MAX / 2, false).unwrap_err().to_string();
        assert!(e.contains("free, less than"), "{e}");
    }
}
