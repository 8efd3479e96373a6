//! Other writers of the target: processes that hold it (or a partition of it, or the
//! disk it is part of, or another name of the same bytes) open for writing or mapped
//! writable, loop devices backed by it or by the same file, and filesystems mounted from
//! another name of its bytes.
//!
//! Why: a freeze stops the filesystem's writes, and O_EXCL stops other exclusive
//! openers, but neither stops a process that opened the block device itself: a VM on a
//! raw partition, a database on a raw device, `dd`, or a loop device stacked on the
//! target with a filesystem mounted from it (which shows in no `holders/`). Nor do they
//! stop a write that reaches the same bytes under another name ([`crate::host::aliases`]:
//! a second loop over the target's backing file, a process writing that file). Their
//! writes race reseq's rewrite of the same bytes, and one of them loses. Nothing in the
//! kernel excludes them, so reseq looks (`/proc/*/fd`, `/proc/*/fdinfo`, `/proc/*/maps`,
//! loop devices' status, mountinfo, sysfs) and refuses when it finds one: before the
//! first write, and again before each window.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::host::aliases::{self, FileId, Reach};
use crate::host::device::Sysfs;
use crate::host::{mounts, procs};
use crate::support::error::{Error, Result};

/// A process or device that may write the target behind reseq's back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Writer {
    /// None for a loop device (the kernel writes, for whoever uses it).
    pub(crate) pid: Option<i32>,
    /// The process's command line, or the loop device's name.
    pub(crate) what: String,
    /// How it holds the target: "fd 5 (O_RDWR) on /dev/loop6", "loop7 is backed by it"...
    pub(crate) how: String,
    /// What to do about it, when not "stop the process".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fix: Option<String>,
}

fn rdev_of(meta: &std::fs::Metadata) -> Option<(u32, u32)> {
    meta.file_type().is_block_device().then(|| crate::host::device::dev_num(meta.rdev()))
}

/// The access mode of an open file from `/proc/PID/fdinfo/N` ("flags: 0100002", octal).
fn opened_for_writing(pid: i32, fd: &str) -> bool {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap_or_default();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .unwrap_or(0);
    flags & 0o3 != 0 // O_WRONLY or O_RDWR
}

/// Every process other than reseq and its guardians holding one of the devices or files
/// of `r` for writing.
fn processes(r: &Reach, out: &mut Vec<Writer>) {
    let me = std::process::id() as i32;
    let devs = r.devices();
    for pid in procs::pids().into_iter().filter(|&p| p != me) {
        let how = holds_for_writing(pid, r, &devs);
        // Our guardians are forked from us, so they hold copies of our fds.
        if !how.is_empty() && procs::stat(pid).is_none_or(|s| s.ppid != me) {
            let what = procs::cmdline(pid);
            out.extend(how.into_iter().map(|how| Writer { pid: Some(pid), what: what.clone(), how, fix: None }));
        }
    }
}

/// What an open file or mapping with this identity is to the target: one of its devices,
/// an alias of them, one of its backing files; None if nothing.
fn reaches(r: &Reach, devs: &[(u32, u32)], md: &std::fs::Metadata) -> Option<String> {
    if let Some(dev) = rdev_of(md) {
        return devs.contains(&dev).then(|| match r.alias(dev) {
            Some(a) => format!(", which holds the same bytes (it {})", a.why),
            None => String::new(),
        });
    }
    r.file(FileId::of(md)).map(|f| format!(": {}", f.describe()))
}

/// How process `pid` holds the target for writing: open fds and shared writable
/// mappings, of its devices, their aliases or their backing files.
fn holds_for_writing(pid: i32, r: &Reach, devs: &[(u32, u32)]) -> Vec<String> {
    let dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    let mut how = Vec::new();
    for fd in std::fs::read_dir(dir.join("fd")).into_iter().flatten().flatten() {
        let Some(what) = std::fs::metadata(fd.path()).ok().and_then(|m| reaches(r, devs, &m)) else { continue };
        let name = fd.file_name().to_string_lossy().into_owned();
        if opened_for_writing(pid, &name) {
            let target = std::fs::read_link(fd.path()).map(|l| l.display().to_string()).unwrap_or_default();
            how.push(format!("has {target} open for writing (fd {name}){what}"));
        }
    }
    let maps = std::fs::read_to_string(dir.join("maps")).unwrap_or_default();
    for line in maps.lines() {
        // address perms offset dev inode path
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(perms), Some(path)) = (f.first(), f.get(1), f.get(5)) else { continue };
        if !(perms.contains('w') && perms.contains('s') && path.starts_with('/')) {
            continue;
        }
        // map_files/ names the mapped file itself (a path may be stale); the path is the
        // fallback where it cannot be read.
        let md = std::fs::metadata(dir.join("map_files").join(addr)).or_else(|_| std::fs::metadata(path));
        if let Some(what) = md.ok().and_then(|m| reaches(r, devs, &m)) {
            how.push(format!("maps {path} writable{what}"));
            break;
        }
    }
    how
}

/// Everything that may write `devs` besides reseq: processes writing them, an alias of
/// them or a backing file of theirs; loop devices over any of those; filesystems mounted
/// from an alias (see [`crate::host::aliases`]).
pub(crate) fn find(devs: &[(u32, u32)]) -> Vec<Writer> {
    let sysfs = Sysfs::default();
    let r = aliases::reach(devs, &sysfs);
    let mut out = Vec::new();
    processes(&r, &mut out);
    let mounts = mounts::read_mounts().unwrap_or_default();
    out.extend(aliases::in_use(&r, &mounts, &sysfs).into_iter().map(|u| Writer {
        pid: None,
        what: u.what,
        how: u.how,
        fix: Some(u.fix),
    }));
    out
}

/// What is still there after a few looks 100 ms apart: tools that probe devices (a
/// `losetup --find` scanning for a free loop device, blkid) hold one for a moment, a
/// writer to fear holds it on.
pub(crate) fn find_lasting(devs: &[(u32, u32)]) -> Vec<Writer> {
    let mut found = find(devs);
    for _ in 0..3 {
        if found.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let again = find(devs);
        found.retain(|w| again.contains(w));
    }
    found
}

/// Refuses when anything else may write `devs`; `target` names them in the message.
pub(crate) fn refuse_other_writers(target: &Path, devs: &[(u32, u32)]) -> Result<()> {
    let found = find_lasting(devs);
    let Some(first) = found.first() else { return Ok(()) };
    // Another reseq (its state directory may differ, so its lock may not be seen).
    if let Some(pid) = found.iter().filter_map(|w| w.pid).find(|&p| procs::comm(p) == "reseq") {
        return Err(Error::refused(
            format!("another reseq (PID {pid}) is working on {}", target.display()),
            "wait for it to finish, or stop it (it thaws and can be resumed); two runs on one device would freeze and write over each other",
        ));
    }
    let list: Vec<String> = found
        .iter()
        .map(|w| match w.pid {
            Some(pid) => format!("PID {pid} ({}) {}", w.what, w.how),
            None => format!("{} {}", w.what, w.how),
        })
        .collect();
    Err(Error::refused(
        format!(
            "another writer of {}: {}. Its writes bypass any freeze and would race the rewrite of the same bytes; one of them would be lost",
            target.display(),
            list.join("; ")
        ),
        match first.pid {
            Some(pid) => {
                format!("stop PID {pid} (and any other listed) or let it close the device, then run reseq again")
            }
            None => first.fix.clone().unwrap_or_else(|| format!("stop what uses {}, then run reseq again", first.what)),
        },
    ))
}
