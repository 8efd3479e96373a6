//! Used-space device mode: rewrite what the filesystem uses, skip its free space.
//!
//! Every rewrite costs flash endurance, and writing free space tells the SSD that space
//! is in use again, undoing what TRIM achieved. So when a device carries mounted ext4 or
//! xfs filesystems, each window asks them (GETFSMAP, while frozen, so the answer holds
//! for the whole window) which ranges are FREE, and leaves those out. Everything not
//! reported FREE counts as in use: ext4 leaves some used ranges out of GETFSMAP entirely
//! (its own metadata, for one). After the run, FITRIM discards free space again, in
//! paced slices (`trim.rs`).

use std::os::fd::{AsFd, OwnedFd};

use crate::engine::Planner;
use crate::host::freeze::open_mount_point;
use crate::host::mounts::MountedFs;
use crate::support::error::{Error, Result};
use crate::sys;

/// Filesystems whose free space we can read (GETFSMAP).
pub(crate) const SUPPORTED: [&str; 4] = ["ext2", "ext3", "ext4", "xfs"];

/// One filesystem on the target: where it starts on the target and how long it is.
pub(crate) struct FsSpan {
    pub(crate) fs: MountedFs,
    fd: OwnedFd,
    /// Offset of the filesystem's device on the target (a partition's start on its disk).
    pub(crate) start: u64,
    pub(crate) len: u64,
}

impl FsSpan {
    pub(crate) fn open(fs: MountedFs, start: u64, len: u64) -> Result<FsSpan> {
        let fd = open_mount_point(&fs.mount_point)?;
        Ok(FsSpan { fs, fd, start, len })
    }

    /// The mount point, open: what FITRIM and GETFSMAP are asked through.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Free ranges of the spans within `[from, to)` of the target, sorted, in target offsets.
pub(crate) fn free_ranges(spans: &[FsSpan], from: u64, to: u64) -> Result<Vec<(u64, u64)>> {
    let mut free = Vec::new();
    for s in spans {
        let (lo, hi) = (from.max(s.start), to.min(s.start + s.len));
        if lo >= hi {
            continue;
        }
        if let Some(member) = s.fs.btrfs_member {
            free.extend(btrfs_free(s, member, lo, hi)?);
            continue;
        }
        let dev = sys::block::encode_dev(s.fs.dev_num);
        let recs = sys::extents::getfsmap(s.fd.as_fd(), lo - s.start, hi - s.start)
            .map_err(|e| Error::io(format!("GETFSMAP on {}", s.fs.mount_point.display()), e.into()))?;
        for r in recs {
            // Only the data device's records; an xfs external log has its own.
            if r.owner == sys::extents::FMR_OWN_FREE && r.device == dev {
                let a = (s.start + r.physical).max(lo);
                let b = (s.start + r.physical + r.length).min(hi);
                if a < b {
                    free.push((a, b - a));
                }
            }
        }
    }
    free.sort_unstable();
    Ok(free)
}

/// The first MiB of a btrfs device: its superblock and the space btrfs never allocates.
const BTRFS_RESERVED: u64 = 1 << 20;

/// A btrfs member's free ranges within `[lo, hi)` (target offsets): what no device
/// extent covers (tree 4: the chunks allocated on it, data, metadata and system alike),
/// past the first MiB. Asked frozen in every window, which also refuses the window
/// while btrfs's own writers run (scrub, balance, device replace).
fn btrfs_free(s: &FsSpan, member: (u32, u32), lo: u64, hi: u64) -> Result<Vec<(u64, u64)>> {
    let layout = crate::host::btrfs::Layout::read(s.fd.as_fd())?;
    crate::host::btrfs::refuse_own_writers(s.fd.as_fd(), &layout, &s.fs.mount_point)?;
    let m = layout.members.iter().find(|m| m.dev == member).ok_or_else(|| {
        Error::refused(
            format!("the device is no longer a member of the btrfs at {}", s.fs.mount_point.display()),
            "run reseq again",
        )
    })?;
    let mut used = vec![(0, BTRFS_RESERVED)];
    used.extend(crate::host::btrfs::dev_extents(s.fd.as_fd(), m.devid)?);
    used.sort_unstable();
    let mut free = Vec::new();
    let mut at = s.start;
    for (off, len) in used.into_iter().map(|(o, l)| (s.start + o, l)).chain([(s.start + s.len, 0)]) {
        let (a, b) = (at.max(lo), off.min(hi));
        if a < b {
            free.push((a, b - a));
        }
        at = at.max(off + len);
    }
    Ok(free)
}

/// `[from, to)` minus the `free` ranges (sorted), with every boundary rounded so that
/// only whole `align` blocks inside a free range are left out.
pub(crate) fn subtract(from: u64, to: u64, free: &[(u64, u64)], align: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = from;
    for &(f, len) in free {
        let (fa, fb) = (f.div_ceil(align) * align, (f + len) / align * align);
        if fb <= fa || fb <= at || fa >= to {
            continue;
        }
        if fa > at {
            out.push((at, fa - at));
        }
        at = at.max(fb);
    }
    if at < to {
        out.push((at, to - at));
    }
    out
}

/// A planner that leaves out what the filesystems report FREE.
pub(crate) struct UsedSpace {
    pub(crate) spans: Vec<FsSpan>,
    pub(crate) align: u64,
}

impl Planner for UsedSpace {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        let free = free_ranges(&self.spans, cursor, end)?;
        Ok(subtract(cursor, end, &free, self.align))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtracts_free_ranges() {
        let free = [(100, 50), (400, 100), (900, 200)];
        assert_eq!(subtract(0, 1000, &free, 1), vec![(0, 100), (150, 250), (500, 400)]);
        // Alignment only ever shrinks what is skipped: here only [960, 1000) is whole.
        assert_eq!(subtract(0, 1000, &free, 64), vec![(0, 960)]);
        assert_eq!(subtract(120, 450, &free, 1), vec![(150, 250)]);
        assert_eq!(subtract(0, 100, &[], 4096), vec![(0, 100)]);
    }
}
