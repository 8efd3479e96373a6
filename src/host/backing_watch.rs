//! The kernel's own record of writes to the target's backing files: a fanotify
//! `FAN_MODIFY` mark on the inode of each loop device's backing file that holds the
//! target's bytes.
//!
//! Why: the written-sectors counter ([`crate::host::written`]) sees every write through
//! the device node, none through the file behind a loop device. A process that opens the
//! backing file for each write, or writes it through an io_uring whose fds it closed,
//! slips between two scans of `/proc` (issue 49: fsync'd blocks reverted, exit 0). The
//! kernel queues a `FAN_MODIFY` event for every write(2), pwrite, io_uring write,
//! fallocate and truncate of a marked inode, with the writer's PID, whatever the fd or
//! path; the loop driver's own reads and writes of its backing file raise none
//! (measured on 6.18, buffered and direct I/O, discards too). So any event during a run
//! is a foreign writer. The group is made before the first write and read, without
//! blocking, where the counters are read: before each write and at each window's end.
//!
//! Not seen: stores through a shared writable mapping of the file (no write(2): the scan
//! looks for those mappings), writers on another host (NFS, a cluster filesystem).
//! `FAN_OPEN_PERM` could deny other opens outright, but a listener that does not answer
//! holds every opener of the image (a reseq stopped by Ctrl-Z would hang a hypervisor
//! opening it), it denies readers too (the event does not say how the file is opened),
//! and it does not stop a writer whose fd was open before: docs/SAFETY.md.

use std::os::fd::{AsFd, OwnedFd};

use crate::host::aliases::{self, BackingFile, FileId};
use crate::host::device::Sysfs;
use crate::host::procs;
use crate::support::error::{Error, Result};
use crate::sys;

/// The watch over every backing file of the target's bytes.
pub(crate) struct BackingWatch {
    group: OwnedFd,
    files: Vec<BackingFile>,
}

impl BackingWatch {
    /// A watch over the backing files of `devs` (the target, its partitions, its disk)
    /// and of the loops they are stacked on; None when no loop device is among them.
    /// Refused when a backing file cannot be watched: a write there would go unseen.
    pub(crate) fn start(devs: &[(u32, u32)], sysfs: &Sysfs) -> Result<Option<BackingWatch>> {
        let r = aliases::reach(devs, sysfs);
        if r.files.is_empty() {
            return Ok(None);
        }
        let cannot = |f: &BackingFile, why: String| {
            Error::refused(
                format!(
                    "reseq cannot watch {} for writes: {why}. A process writing that file changes the device's bytes where no counter of the device sees it, and reseq could write older bytes over its newer ones",
                    f.describe()
                ),
                "run reseq where fanotify works (CONFIG_FANOTIFY, CAP_SYS_ADMIN in the initial user namespace), or on the backing file's own device",
            )
        };
        let group = sys::fanotify::fanotify_notify_group()
            .map_err(|e| cannot(&r.files[0], format!("fanotify_init failed ({e})")))?;
        for f in &r.files {
            let file =
                std::fs::File::open(&f.path).map_err(|e| cannot(f, format!("opening {} failed ({e})", f.path)))?;
            let md = file.metadata().map_err(|e| cannot(f, format!("fstat failed ({e})")))?;
            if FileId::of(&md) != f.id {
                return Err(cannot(f, format!("its path {} now names another file (renamed or deleted?)", f.path)));
            }
            sys::fanotify::fanotify_mark_modify(group.as_fd(), file.as_fd())
                .map_err(|e| cannot(f, format!("fanotify_mark failed ({e})")))?;
        }
        Ok(Some(BackingWatch { group, files: r.files }))
    }

    /// What the watch covers, for messages: "/x.img (the backing file of /dev/loop3)".
    pub(crate) fn names(&self) -> String {
        let names: Vec<String> =
            self.files.iter().map(|f| format!("{} (the backing file of /dev/{})", f.path, f.of)).collect();
        names.join(", ")
    }

    /// The writers the kernel reported since the last look, one phrase each ("PID 7
    /// (python3 w.py)"); empty when none wrote. Err when the group cannot be read.
    pub(crate) fn writers(&self) -> Result<Vec<String>> {
        let events = sys::fanotify::fanotify_read(self.group.as_fd())
            .map_err(|e| Error::io(format!("reading the fanotify watch of {}", self.names()), e.into()))?;
        let mut seen: Vec<String> = Vec::new();
        for e in events {
            let who = if e.mask & sys::fanotify::FAN_Q_OVERFLOW != 0 {
                "writers the kernel's queue overflowed with".to_string()
            } else {
                let what = procs::cmdline(e.pid);
                if what.is_empty() { format!("PID {} (gone)", e.pid) } else { format!("PID {} ({what})", e.pid) }
            };
            if !seen.contains(&who) {
                seen.push(who);
            }
        }
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel facts the watch stands on, on this host: a process's write to the
    /// backing file is reported with its PID; the loop driver's writes are not.
    #[test]
    fn a_backing_file_write_is_reported_and_the_loops_own_are_not() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("img");
        std::fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
        let out =
            std::process::Command::new("losetup").args(["--direct-io=on", "-f", "--show"]).arg(&img).output().unwrap();
        let lo = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if lo.is_empty() {
            return;
        }
        let detach = || {
            let _ = std::process::Command::new("losetup").args(["-d", &lo]).status();
        };
        let result = std::panic::catch_unwind(|| {
            use std::os::unix::fs::{FileExt, MetadataExt};
            let md = std::fs::metadata(&lo).unwrap();
            let dev = crate::host::devnum::dev_num(md.rdev());
            let w = BackingWatch::start(&[dev], &Sysfs::default()).unwrap().expect("a loop device is watched");
            let node = std::fs::OpenOptions::new().write(true).open(&lo).unwrap();
            node.write_all_at(&[7u8; 65536], 0).unwrap();
            node.sync_all().unwrap();
            assert_eq!(w.writers().unwrap(), Vec::<String>::new(), "the loop's own writes");
            let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
            f.write_all_at(&[1u8; 4096], 4096).unwrap();
            let me = format!("PID {} (", std::process::id());
            assert!(w.writers().unwrap().iter().any(|s| s.starts_with(&me)), "our own pwrite");
            assert!(w.writers().unwrap().is_empty(), "read once");
        });
        detach();
        result.unwrap();
    }
}
