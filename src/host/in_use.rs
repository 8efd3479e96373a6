//! Where a block device's data lies: the mounted ext4/xfs filesystems on it, placed on
//! the device, and the ranges they use (everything GETFSMAP does not report free). The
//! rewrite leaves free space out with these; benchmarks read only these ranges (free
//! space, trimmed or not, says nothing about the data).

use std::path::Path;

use crate::host::device::{self, BlockDeviceInfo, Sysfs};
use crate::host::mounts::{self, MountedFs};
use crate::host::usedspace::{self, FsSpan};
use crate::support::error::{Error, Result};

/// Everything a plan needs from the outside world, so tests can supply their own.
pub(crate) struct Environment {
    pub(crate) sysfs: Sysfs,
    pub(crate) mounts: Vec<mounts::MountEntry>,
}

impl Environment {
    pub(crate) fn live() -> Result<Environment> {
        Ok(Environment {
            sysfs: Sysfs::default(),
            mounts: mounts::read_mounts().map_err(|e| Error::io("reading /proc/self/mountinfo", e))?,
        })
    }
}

/// The end of what direct I/O can address: a device whose size is not a whole number of
/// its sectors (a loop device with 4096-byte sectors over an odd-sized file) has a tail
/// that no aligned read or write reaches.
pub(crate) fn addressable_end(dev: &BlockDeviceInfo) -> u64 {
    let align = u64::from(dev.dio_offset_align).max(1);
    dev.identity.size_bytes / align * align
}

/// Where each mounted ext4/xfs filesystem lies on the target, for used-space mode.
pub(crate) fn used_space_spans(
    sysfs: &Sysfs,
    dev: &BlockDeviceInfo,
    filesystems: &[MountedFs],
    warnings: &mut Vec<String>,
) -> Vec<(MountedFs, u64, u64)> {
    let mut spans = Vec::new();
    for fs in filesystems {
        // A btrfs member: its used space is what the device tree allocates on it.
        if fs.fs_type == "btrfs" {
            match btrfs_member_span(sysfs, dev, fs) {
                Some(span) => spans.push(span),
                None => warnings.push(format!(
                    "cannot place the btrfs at {} on the disk: all of it is rewritten",
                    fs.mount_point.display()
                )),
            }
            continue;
        }
        if !usedspace::SUPPORTED.contains(&fs.fs_type.as_str()) {
            warnings.push(format!(
                "{} is {}, whose free space reseq cannot read (GETFSMAP): all of it is rewritten",
                fs.mount_point.display(),
                fs.fs_type
            ));
            continue;
        }
        if fs.dev_num == dev.dev_num {
            spans.push((fs.clone(), 0, dev.identity.size_bytes));
            continue;
        }
        match partition_span(sysfs, fs) {
            Some((start, len)) => spans.push((fs.clone(), start, len)),
            None => {
                warnings.push(format!("cannot place {} on the disk: all of it is rewritten", fs.mount_point.display()))
            }
        }
    }
    spans
}

/// The member of a btrfs that is the target or one of its partitions, placed.
fn btrfs_member_span(sysfs: &Sysfs, dev: &BlockDeviceInfo, fs: &MountedFs) -> Option<(MountedFs, u64, u64)> {
    let fd = crate::host::freeze::open_mount_point(&fs.mount_point).ok()?;
    let layout = crate::host::btrfs::Layout::read(std::os::fd::AsFd::as_fd(&fd)).ok()?;
    let with = |member: (u32, u32)| MountedFs { btrfs_member: Some(member), ..fs.clone() };
    if layout.members.iter().any(|m| m.dev == dev.dev_num) {
        return Some((with(dev.dev_num), 0, dev.identity.size_bytes));
    }
    layout.members.iter().find_map(|m| {
        let part = sysfs.name_of(m.dev).map(|(n, _)| n)?;
        let read = |attr: &str| sysfs.read(&part, attr).and_then(|s| s.parse::<u64>().ok());
        let parent = sysfs.name_of(dev.dev_num).map(|(n, _)| n)?;
        let on_target = std::path::Path::new(&sysfs.root).join("class/block").join(&parent).join(&part).exists();
        on_target.then(|| Some((with(m.dev), read("start")? * 512, read("size")? * 512)))?
    })
}

/// A partition of the target disk: its start and size in bytes, from sysfs (in sectors).
fn partition_span(sysfs: &Sysfs, fs: &MountedFs) -> Option<(u64, u64)> {
    let part = sysfs.name_of(fs.dev_num).map(|(n, _)| n).unwrap_or_default();
    let read = |attr: &str| sysfs.read(&part, attr).and_then(|s| s.parse::<u64>().ok());
    Some((read("start")? * 512, read("size")? * 512))
}

/// The ranges of `path` (a block device) that its mounted ext4/xfs filesystems use:
/// everything but what GETFSMAP reports free, as a used-space rewrite sees it. None when
/// no such filesystem is mounted on it (then all of it counts).
pub(crate) fn in_use_ranges(path: &Path) -> Result<Option<Vec<(u64, u64)>>> {
    let env = Environment::live()?;
    let dev = device::inspect(path, &env.sysfs)?;
    let filesystems = mounts::filesystems_on(&env.mounts, &dev.devices_to_freeze());
    let spans = used_space_spans(&env.sysfs, &dev, &filesystems, &mut Vec::new());
    if spans.is_empty() {
        return Ok(None);
    }
    let spans = spans.into_iter().map(|(fs, start, len)| FsSpan::open(fs, start, len)).collect::<Result<Vec<_>>>()?;
    let align = u64::from(dev.dio_offset_align).max(512);
    let end = addressable_end(&dev);
    let free = usedspace::free_ranges(&spans, 0, end)?;
    Ok(Some(usedspace::subtract(0, end, &free, align)))
}
