//! Aliases: the target's bytes under another name.
//!
//! Why: a write can reach the target's bytes without touching its device node. A second
//! loop device over the same backing file (at any offset), a process writing that file,
//! a filesystem mounted from the second loop, the device a loop is stacked on, a second
//! path to one LUN: none shows in `holders/`, none is stopped by freezing a filesystem
//! mounted from the target (the target itself may look unmounted), and a read-back
//! cannot see that reseq wrote older bytes over newer ones. Measured before this check:
//! 5 of 2,048 fsync'd blocks reverted through a second loop device, 32 through a process
//! writing the backing file, and runs that exited 0.
//!
//! This module names the aliases ([`reach`]) and says which of them are in use
//! ([`in_use`]); [`crate::host::writers`] looks in `/proc` for processes writing them and
//! refuses, before the first write and again between windows.
//!
//! A loop device's backing file is identified by the kernel's `LOOP_GET_STATUS64`
//! (device and inode), not by the path sysfs shows: a path may be stale (renamed,
//! unlinked, another mount namespace), and a hard link or a bind mount is another path to
//! one inode.

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use crate::host::device::Sysfs;
use crate::host::devnum::dev_num;
use crate::host::mounts::MountEntry;
use crate::sys;

pub(crate) type DevNum = (u32, u32);

/// A file by identity (st_dev, st_ino): one file whatever its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    pub(crate) dev: DevNum,
    pub(crate) ino: u64,
}

impl FileId {
    pub(crate) fn of(md: &std::fs::Metadata) -> FileId {
        FileId { dev: dev_num(md.dev()), ino: md.ino() }
    }
}

/// An attached loop device and what backs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Loop {
    pub(crate) name: String,
    pub(crate) dev: DevNum,
    /// The backing file (for a block device node, the node's own identity).
    pub(crate) file: FileId,
    /// The backing block device, when it is one.
    pub(crate) backing_dev: Option<DevNum>,
    /// The backing file's path as sysfs shows it: for messages only.
    pub(crate) path: String,
    pub(crate) offset: u64,
    /// 0: to the end of the file.
    pub(crate) size_limit: u64,
    pub(crate) read_only: bool,
}

impl Loop {
    /// ", at offset N, N bytes long, read-only": what tells it from the target's loop.
    fn placement(&self) -> String {
        let parts = [
            (self.offset != 0).then(|| format!(", at offset {}", self.offset)),
            (self.size_limit != 0).then(|| format!(", {} bytes long", self.size_limit)),
            self.read_only.then(|| ", read-only".into()),
        ];
        parts.into_iter().flatten().collect()
    }
}

/// The loop device's status from the kernel, through its node in /dev (checked to be
/// that device).
fn status_by_ioctl(name: &str, dev: DevNum) -> Option<sys::block::LoopStatus> {
    let f = sys::block::open_nonblocking(format!("/dev/{name}").as_ref()).ok()?;
    let md = f.metadata().ok()?;
    if !md.file_type().is_block_device() || dev_num(md.rdev()) != dev {
        return None;
    }
    sys::block::loop_status(f.as_fd()).ok()
}

/// The loop device's status from sysfs and its backing file's path.
fn status_by_path(sysfs: &Sysfs, name: &str, path: &str) -> Option<sys::block::LoopStatus> {
    let md = std::fs::metadata(path).ok()?;
    let num = |attr: &str| sysfs.read(name, attr).and_then(|v| v.parse().ok()).unwrap_or(0);
    Some(sys::block::LoopStatus {
        file_dev: dev_num(md.dev()),
        file_ino: md.ino(),
        file_rdev: if md.file_type().is_block_device() { dev_num(md.rdev()) } else { (0, 0) },
        offset: num("loop/offset"),
        size_limit: num("loop/sizelimit"),
        read_only: sysfs.read(name, "ro").as_deref() == Some("1"),
    })
}

/// The loop device `name`, if attached. Err(reason) when attached but its backing file
/// cannot be identified.
pub(crate) fn loop_of(sysfs: &Sysfs, name: &str) -> Option<Result<Loop, String>> {
    let path = sysfs.read(name, "loop/backing_file")?;
    let dev = sysfs.dev_of(name)?;
    // Closing a loop device marked autoclear as its last opener detaches it
    // (drivers/block/loop.c, lo_release), and `mount -o loop` sets that flag before it
    // mounts: such a loop is opened only when its path says nothing.
    let status = if sysfs.read(name, "loop/autoclear").as_deref() == Some("1") {
        status_by_path(sysfs, name, &path).or_else(|| status_by_ioctl(name, dev))
    } else {
        status_by_ioctl(name, dev).or_else(|| status_by_path(sysfs, name, &path))
    };
    let Some(s) = status else {
        return Some(Err(format!("/dev/{name} (backed by {path}: neither LOOP_GET_STATUS64 nor the path answered)")));
    };
    Some(Ok(Loop {
        name: name.to_string(),
        dev,
        file: FileId { dev: s.file_dev, ino: s.file_ino },
        backing_dev: (s.file_rdev != (0, 0)).then_some(s.file_rdev),
        path,
        offset: s.offset,
        size_limit: s.size_limit,
        read_only: s.read_only,
    }))
}

/// Every attached loop device, and those whose backing file could not be identified.
pub(crate) fn loops(sysfs: &Sysfs) -> (Vec<Loop>, Vec<String>) {
    let (mut found, mut unknown) = (Vec::new(), Vec::new());
    for r in sysfs.block_names().iter().filter_map(|n| loop_of(sysfs, n)) {
        match r {
            Ok(l) => found.push(l),
            Err(e) => unknown.push(e),
        }
    }
    (found, unknown)
}

/// A block device that holds (some of) the target's bytes and is not the target's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Alias {
    pub(crate) name: String,
    pub(crate) dev: DevNum,
    /// "backs /dev/loop7", "another path to the same LUN as /dev/sdb (WWN naa.5...)".
    pub(crate) why: String,
}

/// A regular file that holds the target's bytes: a loop device's backing file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BackingFile {
    pub(crate) id: FileId,
    /// The loop device it backs.
    pub(crate) of: String,
    pub(crate) path: String,
}

impl BackingFile {
    pub(crate) fn describe(&self) -> String {
        format!(
            "the backing file of /dev/{} ({}, inode {} on {}:{})",
            self.of, self.path, self.id.ino, self.id.dev.0, self.id.dev.1
        )
    }
}

/// Everything through which the target's bytes can be reached.
#[derive(Clone, Debug, Default)]
pub(crate) struct Reach {
    /// The target's own devices, as given (itself, its partitions, its disk).
    pub(crate) own: Vec<DevNum>,
    /// Other block devices with the same bytes: what a loop among them is stacked on (and
    /// that device's disk and partitions), other paths to the same LUN (and partitions).
    pub(crate) aliases: Vec<Alias>,
    /// Regular files with the same bytes: the backing files of loops among them.
    pub(crate) files: Vec<BackingFile>,
    /// Every attached loop device.
    pub(crate) loops: Vec<Loop>,
    /// Loop devices whose backing file could not be identified.
    pub(crate) unknown_loops: Vec<String>,
}

impl Reach {
    /// The target's devices and their aliases.
    pub(crate) fn devices(&self) -> Vec<DevNum> {
        self.own.iter().copied().chain(self.aliases.iter().map(|a| a.dev)).collect()
    }

    pub(crate) fn alias(&self, dev: DevNum) -> Option<&Alias> {
        self.aliases.iter().find(|a| a.dev == dev)
    }

    pub(crate) fn file(&self, id: FileId) -> Option<&BackingFile> {
        self.files.iter().find(|f| f.id == id)
    }

    fn add_alias(&mut self, name: &str, dev: DevNum, why: String, todo: &mut Vec<DevNum>) {
        if !self.own.contains(&dev) && self.alias(dev).is_none() {
            self.aliases.push(Alias { name: name.to_string(), dev, why });
            todo.push(dev);
        }
    }

    /// A device and the devices whose bytes overlap it: its disk, its partitions.
    fn add_with_overlaps(&mut self, sysfs: &Sysfs, dev: DevNum, why: &str, todo: &mut Vec<DevNum>) {
        let Some((name, parent)) = sysfs.name_of(dev) else { return };
        self.add_alias(&name, dev, why.to_string(), todo);
        match parent {
            Some(disk) => {
                if let Some(d) = sysfs.dev_of(&disk) {
                    self.add_alias(&disk, d, format!("the disk of /dev/{name}, which {why}"), todo);
                }
            }
            None => {
                for (p, d) in sysfs.partitions_of(&name) {
                    self.add_alias(&p, d, format!("a partition of /dev/{name}, which {why}"), todo);
                }
            }
        }
    }

    /// What backs `dev` if it is (on) a loop device, and other paths to its disk.
    fn follow(&mut self, sysfs: &Sysfs, dev: DevNum, todo: &mut Vec<DevNum>) {
        let Some((name, parent)) = sysfs.name_of(dev) else { return };
        let disk = parent.unwrap_or(name);
        if let Some(l) = self.loops.iter().find(|l| l.name == disk).cloned() {
            match l.backing_dev {
                Some(b) => self.add_with_overlaps(sysfs, b, &format!("backs /dev/{disk}"), todo),
                None if self.file(l.file).is_none() => {
                    self.files.push(BackingFile { id: l.file, of: disk.clone(), path: l.path.clone() })
                }
                None => {}
            }
        }
        for (other, why) in same_lun_paths(sysfs, &disk) {
            if let Some(d) = sysfs.dev_of(&other) {
                self.add_with_overlaps(
                    sysfs,
                    d,
                    &format!("is another path to the same LUN as /dev/{disk} ({why})"),
                    todo,
                );
            }
        }
    }
}

/// The target's bytes (`devs`: the target, its partitions, its disk) under every name
/// found: followed down through loop devices and across paths to one LUN.
pub(crate) fn reach(devs: &[DevNum], sysfs: &Sysfs) -> Reach {
    let (loops, unknown_loops) = loops(sysfs);
    let mut r = Reach { own: devs.to_vec(), loops, unknown_loops, ..Reach::default() };
    let mut todo = devs.to_vec();
    // Bounded: each device is visited once, and stacks are short.
    for _ in 0..64 {
        let Some(dev) = todo.pop() else { break };
        r.follow(sysfs, dev, &mut todo);
    }
    r
}

/// How a disk identifies its LUN: WWN (per LUN or namespace), else serial with size (and
/// the NVMe namespace id: an NVMe disk's `device/serial` is its controller's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct LunId {
    wwn: Option<String>,
    serial: Option<String>,
    size: Option<String>,
    nsid: Option<String>,
}

/// An identifier that says something: not empty, not zeros (some devices report
/// `naa.0000000000000000` or a serial of zeros).
fn meaningful(v: Option<String>) -> Option<String> {
    let v = v?.trim().to_string();
    let body = v.split_once('.').map_or(v.as_str(), |(_, b)| b);
    body.chars().any(|c| c.is_ascii_alphanumeric() && c != '0').then_some(v)
}

impl LunId {
    fn of(sysfs: &Sysfs, disk: &str) -> LunId {
        let (serial, wwn, _) = sysfs.ids(disk);
        LunId {
            wwn: meaningful(wwn),
            serial: meaningful(serial),
            size: sysfs.read(disk, "size"),
            nsid: sysfs.read(disk, "nsid"),
        }
    }

    /// Why `other` is the same LUN, or None. Two WWNs decide alone (one target's LUNs
    /// may share a serial); without both, serial, size and namespace must all match.
    fn same_as(&self, other: &LunId) -> Option<String> {
        if let (Some(a), Some(b)) = (&self.wwn, &other.wwn) {
            return (a == b).then(|| format!("the same WWN {a}"));
        }
        match (&self.serial, &other.serial) {
            (Some(a), Some(b)) if a == b && self.size == other.size && self.nsid == other.nsid => {
                Some(format!("the same serial {a} and size"))
            }
            _ => None,
        }
    }
}

/// Other whole disks that report the same LUN as `disk` (multipath without dm-multipath
/// on top, or a LUN presented twice), with why.
pub(crate) fn same_lun_paths(sysfs: &Sysfs, disk: &str) -> Vec<(String, String)> {
    let me = LunId::of(sysfs, disk);
    if me.wwn.is_none() && me.serial.is_none() {
        return Vec::new();
    }
    let disks = sysfs.block_names().into_iter().filter(|n| n != disk && sysfs.read(n, "partition").is_none());
    disks.filter_map(|d| me.same_as(&LunId::of(sysfs, &d)).map(|why| (d, why))).collect()
}

/// Something that uses an alias, as `writers` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct InUse {
    /// The device: "/dev/loop1".
    pub(crate) what: String,
    pub(crate) how: String,
    /// What the user can do about it.
    pub(crate) fix: String,
}

/// ", with ext4 mounted from it at /mnt/a, /mnt/b", or "" (a device and its partitions).
fn mounted_from(mounts: &[MountEntry], sysfs: &Sysfs, name: &str, dev: DevNum) -> (String, Vec<String>) {
    let mut devs = vec![dev];
    devs.extend(sysfs.partitions_of(name).into_iter().map(|p| p.1));
    let hits: Vec<&MountEntry> = mounts.iter().filter(|m| m.devices.iter().any(|d| devs.contains(d))).collect();
    let points: Vec<String> = hits.iter().map(|m| m.mount_point.display().to_string()).collect();
    match hits.first() {
        Some(m) => (format!(", with {} mounted from it at {}", m.fs_type, points.join(", ")), points),
        None => (String::new(), points),
    }
}

fn fix_for(what: &str, points: &[String], detach: bool) -> String {
    let mut steps = Vec::new();
    if !points.is_empty() {
        steps.push(format!("unmount {}", points.join(", ")));
    }
    if detach {
        steps.push(format!("detach {what} (losetup -d)"));
    } else if points.is_empty() {
        steps.push(format!("stop what uses {what}"));
    }
    format!("{}, then run reseq again", steps.join(" and "))
}

/// Loop devices that reach the target's bytes and are not the target: stacked on one of
/// its devices or aliases, or over one of its backing files (at any offset or size).
/// Each is a writer whatever uses it: the kernel writes for whoever does.
fn other_loops(r: &Reach, mounts: &[MountEntry], sysfs: &Sysfs) -> Vec<InUse> {
    let devices = r.devices();
    let mut out = Vec::new();
    for l in r.loops.iter().filter(|l| !devices.contains(&l.dev)) {
        let how = match (l.backing_dev, r.file(l.file)) {
            (Some(b), _) if devices.contains(&b) => format!("is a loop device backed by {}{}", l.path, l.placement()),
            (None, Some(f)) => format!(
                "is a loop device backed by the same file as /dev/{} ({}, inode {} on {}:{}){}",
                f.of,
                l.path,
                f.id.ino,
                f.id.dev.0,
                f.id.dev.1,
                l.placement()
            ),
            _ => continue,
        };
        let what = format!("/dev/{}", l.name);
        let (mounted, points) = mounted_from(mounts, sysfs, &l.name, l.dev);
        out.push(InUse { fix: fix_for(&what, &points, true), what, how: how + &mounted });
    }
    out
}

/// Aliases (not loops: see [`other_loops`]) that something uses: a filesystem mounted
/// from one, or a device stacked on it. Processes writing one are found from /proc.
fn used_aliases(r: &Reach, mounts: &[MountEntry], sysfs: &Sysfs) -> Vec<InUse> {
    let mut out = Vec::new();
    for a in &r.aliases {
        let what = format!("/dev/{}", a.name);
        let hits: Vec<&MountEntry> = mounts.iter().filter(|m| m.devices.contains(&a.dev)).collect();
        let points: Vec<String> = hits.iter().map(|m| m.mount_point.display().to_string()).collect();
        let holders = sysfs.holders_of(&a.name);
        let mounted = hits.first().map(|m| format!("has {} mounted from it at {}", m.fs_type, points.join(", ")));
        let held = (!holders.is_empty()).then(|| format!("is held by {} stacked on it", holders.join(", ")));
        let uses: Vec<String> = mounted.into_iter().chain(held).collect();
        if !uses.is_empty() {
            let how = format!("holds the same bytes (it {}) and {}", a.why, uses.join(" and "));
            out.push(InUse { fix: fix_for(&what, &points, false), what, how });
        }
    }
    out
}

/// Every alias in use: loop devices over the same bytes, and aliases mounted or held.
pub(crate) fn in_use(r: &Reach, mounts: &[MountEntry], sysfs: &Sysfs) -> Vec<InUse> {
    let mut out = other_loops(r, mounts, sysfs);
    out.extend(used_aliases(r, mounts, sysfs));
    out
}

/// For the dry run: the names the target's bytes have, what is checked, and what no
/// check on this host can see.
pub(crate) fn describe(devs: &[DevNum], sysfs: &Sysfs) -> String {
    let r = reach(devs, sysfs);
    let mut names: Vec<String> = r.files.iter().map(BackingFile::describe).collect();
    names.extend(r.aliases.iter().map(|a| format!("/dev/{}, which {}", a.name, a.why)));
    let mut s = format!(
        "  aliases: {}; checked with the other writers: other loop devices over the same bytes (any offset or size), processes with a backing file open for writing, filesystems mounted from any alias, other paths to the same LUN (same WWN, or serial and size)\n",
        if names.is_empty() { "none found".to_string() } else { names.join("; ") }
    );
    if !r.unknown_loops.is_empty() {
        s += &format!("  warning: loop devices not identified, so not checked: {}\n", r.unknown_loops.join("; "));
    }
    s += "  not visible from this host: another host or VM writing the same LUN or image, a hypervisor or storage array below the device, a writer that appears and writes between two checks; make sure there is none\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// A fake sysfs: whole disks with attributes and partitions, linked as the kernel
    /// links them (`class/block/NAME`, `dev/block/MAJ:MIN`). No real device here has a
    /// WWN (the only disk is a virtio disk with serial "overlayblk"), so the LUN logic is
    /// tested on this tree.
    struct Fake {
        _dir: tempfile::TempDir,
        sysfs: Sysfs,
    }

    impl Fake {
        fn new() -> Fake {
            let dir = tempfile::tempdir().unwrap();
            for d in ["class/block", "dev/block"] {
                std::fs::create_dir_all(dir.path().join(d)).unwrap();
            }
            let sysfs = Sysfs { root: dir.path().to_path_buf() };
            Fake { _dir: dir, sysfs }
        }

        fn node(&self, dir: &Path, name: &str, dev: DevNum) {
            std::fs::create_dir_all(dir.join("holders")).unwrap();
            std::fs::write(dir.join("dev"), format!("{}:{}\n", dev.0, dev.1)).unwrap();
            let r = &self.sysfs.root;
            std::os::unix::fs::symlink(dir, r.join("class/block").join(name)).unwrap();
            std::os::unix::fs::symlink(dir, r.join(format!("dev/block/{}:{}", dev.0, dev.1))).unwrap();
        }

        /// A disk with `attrs` (paths relative to its directory) and partitions.
        fn disk(&self, name: &str, dev: DevNum, attrs: &[(&str, &str)], parts: &[(&str, DevNum)]) -> PathBuf {
            let dir = self.sysfs.root.join("devices/fake/block").join(name);
            self.node(&dir, name, dev);
            for (a, v) in attrs {
                std::fs::create_dir_all(dir.join(a).parent().unwrap()).unwrap();
                std::fs::write(dir.join(a), format!("{v}\n")).unwrap();
            }
            for (p, d) in parts {
                self.node(&dir.join(p), p, *d);
                std::fs::write(dir.join(p).join("partition"), "1\n").unwrap();
            }
            dir
        }
    }

    fn mount(dev: DevNum, at: &str) -> MountEntry {
        let line = format!("36 25 {}:{} / {at} rw,relatime shared:1 - ext4 /dev/x rw", dev.0, dev.1);
        crate::host::mounts::parse_mountinfo(&line).remove(0)
    }

    const WWN: &str = "naa.5000c500a1b2c3d4";

    #[test]
    fn a_second_path_to_the_same_lun_is_named_by_its_wwn() {
        let f = Fake::new();
        f.disk("sdb", (8, 16), &[("device/wwid", WWN), ("size", "100")], &[("sdb1", (8, 17))]);
        f.disk("sdc", (8, 32), &[("device/wwid", WWN), ("size", "100")], &[("sdc1", (8, 33))]);
        f.disk("sdd", (8, 48), &[("device/wwid", "naa.5000c500ffffffff"), ("size", "100")], &[]);
        let paths = same_lun_paths(&f.sysfs, "sdb");
        assert_eq!(paths, vec![("sdc".to_string(), format!("the same WWN {WWN}"))]);
        // The target is sdb1: sdc and its partitions are aliases, sdd is not.
        let r = reach(&[(8, 17), (8, 16)], &f.sysfs);
        let names: Vec<&str> = r.aliases.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["sdc", "sdc1"]);
        // Unused, the other path is no refusal; mounted, it is, naming the mount.
        assert!(in_use(&r, &[], &f.sysfs).is_empty());
        let used = in_use(&r, &[mount((8, 33), "/srv/data")], &f.sysfs);
        assert_eq!(used.len(), 1, "{used:?}");
        assert_eq!(used[0].what, "/dev/sdc1");
        assert!(used[0].how.contains("/srv/data") && used[0].how.contains(WWN), "{}", used[0].how);
        assert!(used[0].fix.starts_with("unmount /srv/data"), "{}", used[0].fix);
    }

    #[test]
    fn a_second_path_held_by_a_stacked_device_is_in_use() {
        let f = Fake::new();
        f.disk("sdb", (8, 16), &[("wwid", WWN)], &[]);
        let sdc = f.disk("sdc", (8, 32), &[("wwid", WWN)], &[]);
        std::fs::create_dir_all(sdc.join("holders/dm-3")).unwrap();
        let used = in_use(&reach(&[(8, 16)], &f.sysfs), &[], &f.sysfs);
        assert_eq!(used.len(), 1, "{used:?}");
        assert!(used[0].how.contains("held by dm-3"), "{}", used[0].how);
    }

    /// Without WWNs, serial, size and namespace id must all match; an NVMe disk's
    /// `device/serial` is its controller's, shared by its namespaces.
    #[test]
    fn serials_count_only_with_the_same_size_and_namespace() {
        let f = Fake::new();
        let ser = |s: &'static str, size: &'static str| vec![("device/serial", s), ("size", size)];
        f.disk("sdb", (8, 16), &ser("S123", "100"), &[]);
        f.disk("sdc", (8, 32), &ser("S123", "100"), &[]);
        f.disk("sdd", (8, 48), &ser("S123", "200"), &[]);
        f.disk("sde", (8, 64), &ser("S999", "100"), &[]);
        assert_eq!(
            same_lun_paths(&f.sysfs, "sdb"),
            vec![("sdc".to_string(), "the same serial S123 and size".to_string())]
        );
        let ns = |nsid: &'static str| vec![("device/serial", "NV1"), ("size", "100"), ("nsid", nsid)];
        f.disk("nvme0n1", (259, 0), &ns("1"), &[]);
        f.disk("nvme0n2", (259, 1), &ns("2"), &[]);
        f.disk("nvme1n1", (259, 2), &ns("1"), &[]);
        assert_eq!(same_lun_paths(&f.sysfs, "nvme0n1").into_iter().map(|p| p.0).collect::<Vec<_>>(), ["nvme1n1"]);
    }

    /// Two WWNs decide alone (LUNs of one target may share a serial); identifiers of
    /// zeros say nothing.
    #[test]
    fn different_wwns_or_placeholder_ids_are_not_one_lun() {
        let f = Fake::new();
        f.disk("sdb", (8, 16), &[("wwid", WWN), ("device/serial", "S1"), ("size", "1")], &[]);
        f.disk("sdc", (8, 32), &[("wwid", "naa.5000c500a1b2c3d5"), ("device/serial", "S1"), ("size", "1")], &[]);
        assert!(same_lun_paths(&f.sysfs, "sdb").is_empty());
        let zeros = [("wwid", "naa.0000000000000000"), ("device/serial", "000000"), ("size", "1")];
        f.disk("sdx", (8, 80), &zeros, &[]);
        f.disk("sdy", (8, 96), &zeros, &[]);
        assert!(same_lun_paths(&f.sysfs, "sdx").is_empty());
        assert_eq!(meaningful(Some(" t10.ATA SSD 1 ".into())).as_deref(), Some("t10.ATA SSD 1"));
        assert_eq!(meaningful(Some("".into())), None);
    }

    /// What tells an alias loop from the target's, in the refusal.
    #[test]
    fn loop_placement_names_offset_size_and_read_only() {
        let l = Loop {
            name: "loop9".into(),
            dev: (7, 9),
            file: FileId { dev: (254, 0), ino: 12 },
            backing_dev: None,
            path: "/x.img".into(),
            offset: 4096,
            size_limit: 8192,
            read_only: true,
        };
        assert_eq!(l.placement(), ", at offset 4096, 8192 bytes long, read-only");
    }
}
