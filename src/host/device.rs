//! What a block device is: identity, geometry, stacking, and how far to trust what it
//! says about itself.
//!
//! Everything here is read from sysfs (through a root path, so unit tests can build a
//! fake tree), `/proc/swaps` and a few ioctls. Behaviour that depends on the kind of
//! device is decided here, with the reason next to it:
//! - `queue/rotational` is trusted only for real disks. Loop devices inherit it from
//!   whatever holds their backing file, and virtio-blk reports 1 because the host tells it
//!   nothing (measured on this project's CI VM: `/sys/block/vda/queue/rotational` = 1 on an
//!   SSD-backed host). For those we follow the loop's backing file or say "unknown".
//! - Direct-I/O alignment comes from `statx(STATX_DIOALIGN)` (6.11+ for block devices),
//!   falling back to BLKSSZGET, which is the logical sector size.

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::host::devnum::{dev_num, parse_dev};
use crate::support::error::{Error, Result};
use crate::sys;

/// Whether the medium spins, and why we believe it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "kind", content = "reason")]
pub(crate) enum Medium {
    /// Reported non-rotational by a device whose report we trust (or memory-backed).
    SolidState(String),
    /// Reported rotational by a device whose report we trust.
    Rotational(String),
    /// The device cannot know (virtual device); reseq proceeds without a warning.
    Unknown(String),
}

impl std::fmt::Display for Medium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Medium::SolidState(why) => write!(f, "solid state ({why})"),
            Medium::Rotational(why) => write!(f, "rotational ({why})"),
            Medium::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

use crate::engine::identity::DeviceIdentity;

/// Everything reseq needs to know about a block device before planning.
#[derive(Clone, Debug)]
pub(crate) struct BlockDeviceInfo {
    /// The path the user gave.
    pub(crate) path: PathBuf,
    pub(crate) identity: DeviceIdentity,
    pub(crate) dev_num: (u32, u32),
    /// Parent disk name when this is a partition.
    pub(crate) parent_disk: Option<String>,
    /// (name, dev) of the partitions of a whole disk (empty for a partition).
    pub(crate) partitions: Vec<(String, (u32, u32))>,
    /// Devices stacked on top (dm, md, bcache...), of the device or its partitions.
    pub(crate) holders: Vec<String>,
    /// BLKROGET.
    pub(crate) read_only: bool,
    pub(crate) medium: Medium,
    /// Direct-I/O alignment of buffer addresses, in bytes.
    pub(crate) dio_mem_align: u32,
    /// Direct-I/O alignment of offsets and lengths, in bytes.
    pub(crate) dio_offset_align: u32,
    /// Where the alignment came from (`statx` or `BLKSSZGET`).
    pub(crate) dio_align_source: &'static str,
    /// Active swap areas on the device, its partitions, or files on them.
    pub(crate) active_swap: Vec<String>,
}

impl BlockDeviceInfo {
    /// Devices through which the same bytes can be written: the device, its partitions,
    /// and the whole disk it is a partition of.
    pub(crate) fn devices_sharing_bytes(&self, sysfs: &Sysfs) -> Vec<(u32, u32)> {
        let mut d = self.devices_to_freeze();
        if let Some(disk) = &self.parent_disk
            && let Some(dev) = sysfs.dev_of(disk)
        {
            d.push(dev);
        }
        d
    }

    /// Devices whose mounted filesystems must be frozen: the device and its partitions.
    pub(crate) fn devices_to_freeze(&self) -> Vec<(u32, u32)> {
        std::iter::once(self.dev_num).chain(self.partitions.iter().map(|p| p.1)).collect()
    }
}

/// Reads sysfs below a root ("/sys" in production).
#[derive(Clone, Debug)]
pub(crate) struct Sysfs {
    pub(crate) root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs { root: PathBuf::from("/sys") }
    }
}

impl Sysfs {
    fn block_dir(&self, name: &str) -> PathBuf {
        self.root.join("class/block").join(name)
    }

    /// An attribute of a block device, trimmed; None when absent or empty.
    pub(crate) fn read(&self, name: &str, attr: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.block_dir(name).join(attr)).ok()?;
        let t = text.trim();
        (!t.is_empty()).then(|| t.to_string())
    }

    /// Kernel name and parent disk (for a partition) of a device number.
    pub(crate) fn name_of(&self, dev: (u32, u32)) -> Option<(String, Option<String>)> {
        let link = std::fs::read_link(self.root.join(format!("dev/block/{}:{}", dev.0, dev.1))).ok()?;
        let name = link.file_name()?.to_string_lossy().into_owned();
        let is_partition = self.block_dir(&name).join("partition").exists();
        let parent = if is_partition {
            link.parent().and_then(|p| p.file_name()).map(|p| p.to_string_lossy().into_owned())
        } else {
            None
        };
        Some((name, parent))
    }

    pub(crate) fn dev_of(&self, name: &str) -> Option<(u32, u32)> {
        parse_dev(&self.read(name, "dev")?)
    }

    /// Partitions of a whole disk, in name order.
    pub(crate) fn partitions_of(&self, disk: &str) -> Vec<(String, (u32, u32))> {
        let dir = self.block_dir(disk);
        let parts = sorted_names(&dir).into_iter().filter(|n| dir.join(n).join("partition").exists());
        parts.filter_map(|n| self.dev_of(&n).map(|d| (n, d))).collect()
    }

    /// Every block device's kernel name, sorted.
    pub(crate) fn block_names(&self) -> Vec<String> {
        sorted_names(&self.root.join("class/block"))
    }

    pub(crate) fn holders_of(&self, name: &str) -> Vec<String> {
        self.links(name, "holders")
    }

    /// The devices a stacked device is built on (`slaves/`), in name order.
    pub(crate) fn slaves_of(&self, name: &str) -> Vec<String> {
        self.links(name, "slaves")
    }

    /// The names in a device's `holders/` or `slaves/`, sorted.
    fn links(&self, name: &str, dir: &str) -> Vec<String> {
        sorted_names(&self.block_dir(name).join(dir))
    }

    /// A device-mapper device's path under /dev/mapper, or /dev/NAME for any other.
    pub(crate) fn display_name(&self, name: &str) -> String {
        match self.read(name, "dm/name") {
            Some(dm) => format!("/dev/{name} (/dev/mapper/{dm})"),
            None => format!("/dev/{name}"),
        }
    }

    /// The disk that carries the queue (a partition's parent, or the device itself).
    fn disk_of<'a>(name: &'a str, parent: &'a Option<String>) -> &'a str {
        parent.as_deref().unwrap_or(name)
    }

    /// Decides how far to trust `queue/rotational`; see the module docs for why.
    pub(crate) fn medium(&self, disk: &str, depth: u32) -> Medium {
        if disk.starts_with("loop") {
            let Some(backing) = self.read(disk, "loop/backing_file") else {
                return Medium::Unknown("loop device without a backing file".into());
            };
            return match std::fs::metadata(&backing) {
                Ok(md) if depth < 4 => match self.name_of(dev_num(md.dev())) {
                    Some((n, p)) => match self.medium(Self::disk_of(&n, &p), depth + 1) {
                        Medium::Unknown(r) => Medium::Unknown(format!("loop over {backing}: {r}")),
                        Medium::SolidState(r) => Medium::SolidState(format!("loop over {backing}: {r}")),
                        Medium::Rotational(r) => Medium::Rotational(format!("loop over {backing}: {r}")),
                    },
                    None => Medium::SolidState(format!("loop over {backing}, held in memory (no block device)")),
                },
                _ => Medium::Unknown(format!("loop over {backing}, which cannot be inspected")),
            };
        }
        let driver = std::fs::read_link(self.block_dir(disk).join("device/driver"))
            .ok()
            .and_then(|l| l.file_name().map(|f| f.to_string_lossy().into_owned()))
            .unwrap_or_default();
        if driver.starts_with("virtio") || disk.starts_with("vd") || disk.starts_with("xvd") {
            return Medium::Unknown(format!(
                "{disk} is a virtual disk; its rotational flag is a default, not a measurement"
            ));
        }
        if disk.starts_with("zram") || disk.starts_with("ram") || disk.starts_with("pmem") {
            return Medium::SolidState(format!("{disk} is memory-backed"));
        }
        match self.read(disk, "queue/rotational").as_deref() {
            Some("1") => Medium::Rotational(format!("{disk} reports queue/rotational=1")),
            Some("0") => Medium::SolidState(format!("{disk} reports queue/rotational=0")),
            _ => Medium::Unknown(format!("{disk} has no queue/rotational")),
        }
    }

    /// Why `name` is, or stands on, a disk a hypervisor emulates (virtio, Xen, or a model
    /// QEMU, VirtualBox, VMware or Hyper-V gives its disks), following loop devices to
    /// their backing file's disk, stacked devices to theirs, partitions to their disk.
    /// Reads of such a disk are served by its host, whose page cache can make them faster.
    pub(crate) fn emulated_disk(&self, name: &str, depth: u32) -> Option<String> {
        if depth > 4 {
            return None;
        }
        let down = |dev: (u32, u32)| self.emulated_disk(&self.name_of(dev)?.0, depth + 1);
        // A partition is its disk's (not a level of the stack: no depth spent).
        if let Some((_, Some(disk))) = self.dev_of(name).and_then(|d| self.name_of(d)) {
            return self.emulated_disk(&disk, depth);
        }
        if name.starts_with("loop") {
            let backing = self.read(name, "loop/backing_file")?;
            return down(dev_num(std::fs::metadata(&backing).ok()?.dev()));
        }
        if let Some(found) = self.slaves_of(name).iter().find_map(|s| down(self.dev_of(s)?)) {
            return Some(found);
        }
        let driver = std::fs::read_link(self.block_dir(name).join("device/driver"))
            .ok()
            .and_then(|l| l.file_name().map(|f| f.to_string_lossy().into_owned()))
            .unwrap_or_default();
        if driver.starts_with("virtio") || name.starts_with("vd") || name.starts_with("xvd") {
            return Some(format!("{name} is a virtio or Xen disk"));
        }
        let says = [self.read(name, "device/vendor"), self.read(name, "device/model")];
        let said = says.iter().flatten().cloned().collect::<Vec<_>>().join(" ");
        let known = ["QEMU", "VBOX", "VMware", "Virtual disk", "Virtual Disk", "Xen"];
        known.iter().any(|k| said.contains(k)).then(|| format!("{name} is a disk a hypervisor emulates ({said})"))
    }

    /// Serial, WWN and model as the driver exposes them (NVMe, SCSI, virtio differ).
    pub(crate) fn ids(&self, disk: &str) -> (Option<String>, Option<String>, Option<String>) {
        let serial = self.read(disk, "device/serial").or_else(|| self.read(disk, "serial"));
        let wwn = self.read(disk, "wwid").or_else(|| self.read(disk, "device/wwid"));
        let model = self.read(disk, "device/model");
        (serial, wwn, model)
    }
}

/// The names in a directory, sorted (none when it cannot be read).
fn sorted_names(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let mut names: Vec<String> = entries.map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// Active swap areas that live on any of `devs`: swap partitions, or swap files on a
/// filesystem of theirs (found through mountinfo where the file's device number is not
/// a block device's: btrfs). Swap writes are not stopped by a freeze. A name that cannot
/// be looked up (a deleted file, another mount namespace's) may be anywhere: it counts.
pub(crate) fn active_swap_on(swaps_text: &str, devs: &[(u32, u32)]) -> Vec<String> {
    let mut mounts: Option<Vec<crate::host::mounts::MountEntry>> = None;
    let mut on_devs = |md: std::fs::Metadata| {
        if md.file_type().is_block_device() {
            return devs.contains(&dev_num(md.rdev()));
        }
        let d = dev_num(md.dev());
        devs.contains(&d)
            || mounts
                .get_or_insert_with(|| crate::host::mounts::read_mounts().unwrap_or_default())
                .iter()
                .filter(|m| m.dev == d)
                .any(|m| m.devices.iter().any(|x| devs.contains(x)))
    };
    swap_names(swaps_text)
        .filter_map(|f| match std::fs::metadata(&f) {
            Ok(md) => on_devs(md).then_some(f),
            Err(e) => Some(format!("{f}, which cannot be looked up: {e}")),
        })
        .collect()
}

/// The refusal of a target that `swaps` (names in `/proc/swaps`) are active on.
pub(crate) fn swap_refusal(target: &Path, swaps: &[String]) -> Error {
    Error::refused(
        format!(
            "swap is active on {} ({}): the kernel writes swap whatever the freeze",
            target.display(),
            swaps.join(", ")
        ),
        "swapoff it first, or run reseq in a window without swap there",
    )
}

/// The active swap files (not partitions) of `/proc/swaps`' text: each one's (device,
/// inode), and its name.
pub(crate) fn active_swap_files(swaps_text: &str) -> Vec<((u64, u64), String)> {
    swap_names(swaps_text)
        .filter_map(|f| {
            let md = std::fs::metadata(&f).ok().filter(|md| md.is_file())?;
            Some(((md.dev(), md.ino()), f))
        })
        .collect()
}

/// The names `/proc/swaps` lists (its escapes decoded: space, tab, newline, backslash).
fn swap_names(swaps_text: &str) -> impl Iterator<Item = String> + '_ {
    swaps_text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(crate::host::mounts::unescape)
}

/// Fails with a usage error unless `path` is a block device (stat needs no privileges,
/// so this comes before the root check).
pub(crate) fn check_block_device(path: &Path) -> Result<std::fs::Metadata> {
    let md = std::fs::metadata(path).map_err(|e| Error::cannot_use(path, e))?;
    if !md.file_type().is_block_device() {
        let kind = match (md.is_file(), md.is_dir()) {
            (true, _) => "a regular file",
            (_, true) => "a directory",
            _ => "not a block device",
        };
        return Err(Error::Usage(format!(
            "{} is {kind}; `reseq rewrite` takes a block device such as /dev/sdb or /dev/nvme0n1p2",
            path.display()
        )));
    }
    Ok(md)
}

/// Size, read-only flag, and direct-I/O alignment (memory, offset, where it came from:
/// statx where the kernel tells, else the logical sector size) of a block device.
fn geometry(path: &Path) -> Result<(u64, bool, (u32, u32, &'static str))> {
    // Read-only open: inspection never needs write access.
    let file =
        std::fs::File::open(path).map_err(|e| Error::io(format!("opening {} to inspect it", path.display()), e))?;
    let size_bytes = sys::block::blk_size_bytes(file.as_fd()).map_err(|e| Error::io("BLKGETSIZE64", e.into()))?;
    let read_only = sys::block::blk_read_only(file.as_fd()).map_err(|e| Error::io("BLKROGET", e.into()))?;
    let align = sys::block::blk_dio_align(path, file.as_fd()).map_err(|e| Error::io("BLKSSZGET", e.into()))?;
    Ok((size_bytes, read_only, align))
}

pub(crate) fn inspect(path: &Path, sysfs: &Sysfs) -> Result<BlockDeviceInfo> {
    let md = check_block_device(path)?;
    let dev_num = dev_num(md.rdev());
    let (name, parent_disk) = sysfs.name_of(dev_num).ok_or_else(|| {
        Error::Internal(format!(
            "{} ({}:{}) is not in {}/dev/block",
            path.display(),
            dev_num.0,
            dev_num.1,
            sysfs.root.display()
        ))
    })?;

    let (size_bytes, read_only, (dio_mem_align, dio_offset_align, dio_align_source)) = geometry(path)?;
    let disk = Sysfs::disk_of(&name, &parent_disk).to_string();
    let partitions = if parent_disk.is_none() { sysfs.partitions_of(&name) } else { Vec::new() };
    let mut holders = sysfs.holders_of(&name);
    for (p, _) in &partitions {
        holders.extend(sysfs.holders_of(p).into_iter().map(|h| format!("{h} (on {p})")));
    }
    let (serial, wwn, model) = sysfs.ids(&disk);
    let identity = DeviceIdentity {
        dev: format!("{}:{}", dev_num.0, dev_num.1),
        size_bytes,
        serial,
        wwn,
        model,
        partition_start_sectors: sysfs.read(&name, "start").and_then(|s| s.parse().ok()),
        loop_backing_file: sysfs.read(&disk, "loop/backing_file"),
        name,
    };
    let mut devs = vec![dev_num];
    devs.extend(partitions.iter().map(|p| p.1));
    let active_swap = active_swap_on(&std::fs::read_to_string("/proc/swaps").unwrap_or_default(), &devs);
    Ok(BlockDeviceInfo {
        path: path.to_path_buf(),
        medium: sysfs.medium(&disk, 0),
        identity,
        dev_num,
        parent_disk,
        partitions,
        holders,
        read_only,
        dio_mem_align,
        dio_offset_align,
        dio_align_source,
        active_swap,
    })
}

/// A device-mapper target that copies or allocates when a block is written, so that
/// writing the same bytes back is not free: it costs space below, and can run out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CopyOnWrite {
    /// Kernel name (dm-3) of the device with that target.
    pub(crate) name: String,
    /// The target: `thin`, `thin-pool`, `snapshot`, `snapshot-origin`, `snapshot-merge`,
    /// or what LVM's naming says where `dmsetup` is missing.
    pub(crate) target: String,
}

const COW_TARGETS: [&str; 5] = ["thin", "thin-pool", "snapshot", "snapshot-origin", "snapshot-merge"];

/// The device-mapper targets of a device, from `dmsetup table` (None: no dmsetup, or it
/// failed). sysfs does not say which target a dm device has.
pub(crate) fn dmsetup_targets(sysfs: &Sysfs, name: &str) -> Option<Vec<String>> {
    let dm = sysfs.read(name, "dm/name")?;
    let out = crate::support::tool::Tool::new("dmsetup")
        .args(["table", "--", &dm])
        .run()
        .map_err(|e| log::debug!("the targets of {name}: {e}"))
        .ok()?;
    // Lines of "start length target params...".
    Some(out.lines().filter_map(|l| l.split_whitespace().nth(2)).map(String::from).collect())
}

/// Where `dmsetup` cannot be run: what LVM's uuid suffixes say (`-real` under a snapshot
/// origin and its snapshots, `-cow` a snapshot's store, `-tpool` a thin pool), or
/// "unknown" for a dm device that says nothing.
fn targets_by_uuid(sysfs: &Sysfs, name: &str) -> Vec<String> {
    let uuid = sysfs.read(name, "dm/uuid").unwrap_or_default();
    let lvm_suffix = uuid.strip_prefix("LVM-").and_then(|u| u.split_once('-')).map(|(_, s)| s.to_string());
    match lvm_suffix.as_deref() {
        Some("real") => vec!["snapshot-origin (LVM -real)".into()],
        Some("cow") => vec!["snapshot (LVM -cow)".into()],
        Some("tpool") => vec!["thin-pool (LVM -tpool)".into()],
        Some(_) | None if uuid.starts_with("LVM-") || uuid.starts_with("CRYPT-") => Vec::new(),
        _ => vec!["unknown (no dmsetup to ask)".into()],
    }
}

/// The copy-on-write targets in the stack of devices under `name`, itself included.
/// `targets` lists a dm device's targets (`dmsetup_targets`, or a fake in tests).
pub(crate) fn copy_on_write_below(
    sysfs: &Sysfs,
    name: &str,
    targets: &dyn Fn(&Sysfs, &str) -> Option<Vec<String>>,
) -> Vec<CopyOnWrite> {
    let mut found = Vec::new();
    let mut todo = vec![name.to_string()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(cur) = todo.pop() {
        if !seen.insert(cur.clone()) {
            continue;
        }
        if sysfs.block_dir(&cur).join("dm").is_dir() {
            let types = targets(sysfs, &cur).unwrap_or_else(|| targets_by_uuid(sysfs, &cur));
            for t in types {
                let base = t.split(' ').next().unwrap_or(&t);
                if COW_TARGETS.contains(&base) || base == "unknown" {
                    found.push(CopyOnWrite { name: cur.clone(), target: t.clone() });
                }
            }
        }
        todo.extend(sysfs.slaves_of(&cur));
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swap_names_are_unescaped_and_one_that_cannot_be_looked_up_counts() {
        let text = "Filename\tType\tSize\tUsed\tPriority\n/nonexistent/a\\040b\\011c file 100 0 -2\n";
        let on = active_swap_on(text, &[(7, 0)]);
        assert_eq!(on.len(), 1, "{on:?}");
        assert!(on[0].starts_with("/nonexistent/a b\tc, which cannot be looked up"), "{on:?}");
        assert!(active_swap_on("Filename\tType\n", &[(7, 0)]).is_empty());
    }

    #[test]
    fn identity_changes_read_as_a_short_diff() {
        let was = DeviceIdentity {
            name: "nvme0n1p3".into(),
            dev: "259:3".into(),
            size_bytes: 2 << 30,
            serial: Some("S1".into()),
            model: Some("M".into()),
            partition_start_sectors: Some(2048),
            ..DeviceIdentity::default()
        };
        let now = DeviceIdentity { size_bytes: 3 << 30, serial: Some("S2".into()), ..was.clone() };
        assert_eq!(now.changes_since(&was), "size 2.0 GiB -> 3.0 GiB, serial S1 -> S2");
        assert_eq!(was.changes_since(&was), "");
    }

    /// A fake sysfs with a disk `sdz` (rotational), partition `sdz1` held by `dm-7`.
    fn fake_sysfs() -> (tempfile::TempDir, Sysfs) {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let disk = r.join("devices/pci0/block/sdz");
        std::fs::create_dir_all(disk.join("sdz1/holders/dm-7")).unwrap();
        std::fs::create_dir_all(disk.join("queue")).unwrap();
        std::fs::create_dir_all(disk.join("holders")).unwrap();
        std::fs::create_dir_all(disk.join("device")).unwrap();
        std::fs::write(disk.join("queue/rotational"), "1\n").unwrap();
        std::fs::write(disk.join("dev"), "8:0\n").unwrap();
        std::fs::write(disk.join("device/serial"), "ABC123 \n").unwrap();
        std::fs::write(disk.join("sdz1/dev"), "8:1\n").unwrap();
        std::fs::write(disk.join("sdz1/partition"), "1\n").unwrap();
        std::fs::write(disk.join("sdz1/start"), "2048\n").unwrap();
        std::fs::create_dir_all(r.join("class/block")).unwrap();
        std::fs::create_dir_all(r.join("dev/block")).unwrap();
        std::os::unix::fs::symlink(&disk, r.join("class/block/sdz")).unwrap();
        std::os::unix::fs::symlink(disk.join("sdz1"), r.join("class/block/sdz1")).unwrap();
        std::os::unix::fs::symlink("../../devices/pci0/block/sdz", r.join("dev/block/8:0")).unwrap();
        std::os::unix::fs::symlink("../../devices/pci0/block/sdz/sdz1", r.join("dev/block/8:1")).unwrap();
        let sysfs = Sysfs { root: r.to_path_buf() };
        (dir, sysfs)
    }

    /// dm devices in a fake tree: `name` with dm/name, dm/uuid and slaves.
    fn fake_dm(s: &Sysfs, name: &str, dm_name: &str, uuid: &str, slaves: &[&str]) {
        let d = s.root.join("devices/virtual/block").join(name);
        std::fs::create_dir_all(d.join("dm")).unwrap();
        std::fs::create_dir_all(d.join("slaves")).unwrap();
        std::fs::create_dir_all(d.join("holders")).unwrap();
        std::fs::write(d.join("dm/name"), format!("{dm_name}\n")).unwrap();
        std::fs::write(d.join("dm/uuid"), format!("{uuid}\n")).unwrap();
        for sl in slaves {
            std::fs::create_dir_all(d.join("slaves").join(sl)).unwrap();
        }
        std::os::unix::fs::symlink(&d, s.root.join("class/block").join(name)).unwrap();
    }

    #[test]
    fn finds_thin_and_snapshot_targets_down_the_stack() {
        let (_d, s) = fake_sysfs();
        let lv = "LVM-aaaaaaaabbbbbbbbccccccccddddddddeeeeeeeeffffffffgggggggghhhhhhhh";
        // A thin volume (dm-3) on its pool (dm-2) on data and metadata (dm-0, dm-1) on sdz1;
        // dm-crypt (dm-4) over the thin volume; a plain linear LV (dm-5).
        fake_dm(&s, "dm-0", "vg-pool_tmeta", &format!("{lv}-tmeta"), &["sdz1"]);
        fake_dm(&s, "dm-1", "vg-pool_tdata", &format!("{lv}-tdata"), &["sdz1"]);
        fake_dm(&s, "dm-2", "vg-pool-tpool", &format!("{lv}-tpool"), &["dm-0", "dm-1"]);
        fake_dm(&s, "dm-3", "vg-thin", lv, &["dm-2"]);
        fake_dm(&s, "dm-4", "secret", "CRYPT-LUKS2-0123-secret", &["dm-3"]);
        fake_dm(&s, "dm-5", "vg-lin", lv, &["sdz1"]);
        let table = |_: &Sysfs, n: &str| -> Option<Vec<String>> {
            Some(vec![
                match n {
                    "dm-2" => "thin-pool",
                    "dm-3" => "thin",
                    "dm-4" => "crypt",
                    _ => "linear",
                }
                .to_string(),
            ])
        };
        let names = |v: Vec<CopyOnWrite>| v.into_iter().map(|c| format!("{}:{}", c.name, c.target)).collect::<Vec<_>>();
        assert_eq!(names(copy_on_write_below(&s, "dm-4", &table)), vec!["dm-2:thin-pool", "dm-3:thin"]);
        assert!(copy_on_write_below(&s, "dm-5", &table).is_empty());
        assert!(copy_on_write_below(&s, "sdz1", &table).is_empty());
        // Without dmsetup, LVM's uuid suffixes still tell a thin pool; an unknown dm
        // device is named as such.
        let none = |_: &Sysfs, _: &str| -> Option<Vec<String>> { None };
        assert_eq!(names(copy_on_write_below(&s, "dm-4", &none)), vec!["dm-2:thin-pool (LVM -tpool)"]);
        assert!(copy_on_write_below(&s, "dm-5", &none).is_empty());
        fake_dm(&s, "dm-6", "mystery", "", &["sdz1"]);
        assert_eq!(names(copy_on_write_below(&s, "dm-6", &none)), vec!["dm-6:unknown (no dmsetup to ask)"]);
        assert_eq!(s.display_name("dm-3"), "/dev/dm-3 (/dev/mapper/vg-thin)");
        assert_eq!(s.slaves_of("dm-2"), vec!["dm-0".to_string(), "dm-1".to_string()]);
    }

    #[test]
    fn names_partitions_and_holders() {
        let (_d, s) = fake_sysfs();
        assert_eq!(s.name_of((8, 1)), Some(("sdz1".into(), Some("sdz".into()))));
        assert_eq!(s.name_of((8, 0)), Some(("sdz".into(), None)));
        assert_eq!(s.partitions_of("sdz"), vec![("sdz1".to_string(), (8, 1))]);
        assert_eq!(s.holders_of("sdz1"), vec!["dm-7".to_string()]);
        assert!(s.holders_of("sdz").is_empty());
        assert_eq!(s.ids("sdz").0.as_deref(), Some("ABC123"));
    }

    #[test]
    fn trusts_rotational_only_on_real_disks() {
        let (_d, s) = fake_sysfs();
        assert!(matches!(s.medium("sdz", 0), Medium::Rotational(_)));
        std::fs::create_dir_all(s.root.join("class/block/vdq/queue")).unwrap();
        std::fs::write(s.root.join("class/block/vdq/queue/rotational"), "1").unwrap();
        assert!(matches!(s.medium("vdq", 0), Medium::Unknown(_)));
        assert!(matches!(s.medium("zram3", 0), Medium::SolidState(_)));
    }

    #[test]
    fn finds_a_hypervisors_disk_down_the_stack() {
        let (_d, s) = fake_sysfs();
        assert_eq!(s.emulated_disk("sdz", 0), None, "a real disk");
        std::fs::write(s.root.join("class/block/sdz/device/model"), "QEMU HARDDISK   \n").unwrap();
        std::fs::write(s.root.join("class/block/sdz/device/vendor"), "QEMU    \n").unwrap();
        let why = s.emulated_disk("sdz", 0).expect("QEMU's SCSI disk");
        assert!(why.contains("sdz is a disk a hypervisor emulates (QEMU QEMU HARDDISK)"), "{why}");
        // Through a dm device on its partition.
        fake_dm(&s, "dm-0", "vg-lv", "LVM-x", &["sdz1"]);
        std::fs::write(s.root.join("class/block/dm-0/dev"), "253:0\n").unwrap();
        assert_eq!(s.emulated_disk("dm-0", 0).as_deref(), Some(why.as_str()));
        std::fs::create_dir_all(s.root.join("class/block/vdq")).unwrap();
        assert!(s.emulated_disk("vdq", 0).unwrap().contains("virtio"));
    }
}
