//! The kernel's own count of what was written to the target: the catch-all for writers
//! no scan can see.
//!
//! Why: a process scan misses fds in flight over SCM_RIGHTS, a writer that opens, writes
//! and closes between two scans, and kernel users that hold no fd. The block layer counts
//! every sector written through a device (`/sys/class/block/NAME/stat`, field 7, 512-byte
//! units), a partition's writes in its own counter and the whole disk's. Within a window
//! reseq knows what it wrote itself, so a counter that grew by more means someone else
//! wrote. Measured only while a window's filesystems are frozen (or, unmounted, held
//! `O_EXCL`), where nothing of the filesystem's own writes.

use std::collections::BTreeMap;

use crate::host::device::Sysfs;

/// Sectors written or discarded through one device: fields 7 and 14 of its `stat`
/// (reseq discards nothing inside a window, so any discard there is someone else's).
fn sectors_written(sysfs: &Sysfs, name: &str) -> Option<u64> {
    changed_sectors(&sysfs.read(name, "stat")?)
}

/// Fields 7 (sectors written) and 14 (sectors discarded, where the kernel has it) of a
/// block device's `stat`.
fn changed_sectors(stat: &str) -> Option<u64> {
    let f: Vec<&str> = stat.split_whitespace().collect();
    let discarded = f.get(13).and_then(|d| d.parse::<u64>().ok()).unwrap_or(0);
    Some(f.get(6)?.parse::<u64>().ok()? + discarded)
}

/// One reading of the counters that see writes to the target's bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reading {
    /// The target's own counter.
    target: Option<u64>,
    /// For a partition: the whole disk's, and each of its partitions' (by name).
    disk: Option<u64>,
    parts: BTreeMap<String, u64>,
}

/// The counters of the target `name` (a partition of `disk`, or a whole device).
#[derive(Clone, Debug)]
pub(crate) struct Counters {
    sysfs: Sysfs,
    name: String,
    disk: Option<String>,
}

impl Counters {
    pub(crate) fn new(sysfs: Sysfs, dev: (u32, u32)) -> Option<Counters> {
        let (name, disk) = sysfs.name_of(dev)?;
        Some(Counters { sysfs, name, disk })
    }

    /// The device a foreign write shows on, for messages.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn read(&self) -> Reading {
        let s = &self.sysfs;
        let Some(disk) = &self.disk else {
            return Reading { target: sectors_written(s, &self.name), ..Reading::default() };
        };
        let parts = s.partitions_of(disk).into_iter().filter_map(|(p, _)| Some((p.clone(), sectors_written(s, &p)?)));
        Reading { target: sectors_written(s, &self.name), disk: sectors_written(s, disk), parts: parts.collect() }
    }
}

/// Bytes written to the target's bytes between two readings, by anyone: through the
/// target (a whole disk's counter includes its partitions'), and, for a partition,
/// through the whole disk's node (the disk's growth less its partitions'). A partition
/// added or removed between the readings is not subtracted: its writes count. None when a
/// counter could not be read (the device gone).
pub(crate) fn bytes_between(before: &Reading, after: &Reading) -> Option<u64> {
    let own = after.target?.checked_sub(before.target?)?;
    let through_disk = match (before.disk, after.disk) {
        (None, None) => 0,
        (Some(b), Some(a)) => {
            let parts: u64 =
                before.parts.iter().filter_map(|(p, b)| after.parts.get(p).map(|a| a.saturating_sub(*b))).sum();
            a.checked_sub(b)?.saturating_sub(parts)
        }
        _ => return None,
    };
    Some((own + through_disk) * 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(target: u64, disk: Option<u64>, parts: &[(&str, u64)]) -> Reading {
        Reading { target: Some(target), disk, parts: parts.iter().map(|(n, v)| (n.to_string(), *v)).collect() }
    }

    #[test]
    fn counts_sectors_written_and_discarded() {
        let stat = "  100 0 800 5   7 0 56 3   0 9 9   2 0 4096 1   3 0";
        assert_eq!(changed_sectors(stat), Some(56 + 4096));
        assert_eq!(changed_sectors("1 0 8 0 2 0 16 0 0 0 0"), Some(16), "an old kernel: no discard fields");
        assert_eq!(changed_sectors("1 0 8"), None);
    }

    #[test]
    fn a_whole_device_counts_its_own_counter() {
        assert_eq!(bytes_between(&reading(100, None, &[]), &reading(108, None, &[])), Some(8 * 512));
        assert_eq!(bytes_between(&reading(100, None, &[]), &Reading::default()), None, "gone");
    }

    #[test]
    fn a_partition_counts_writes_through_the_disk_node_but_not_its_siblings() {
        let before = reading(10, Some(1000), &[("p1", 10), ("p2", 500)]);
        // p2 (a sibling) wrote 100 sectors: none of the target's bytes.
        let after = reading(10, Some(1100), &[("p1", 10), ("p2", 600)]);
        assert_eq!(bytes_between(&before, &after), Some(0));
        // 8 sectors through the disk node itself, 2 through p1.
        let after = reading(12, Some(1110), &[("p1", 12), ("p2", 600)]);
        assert_eq!(bytes_between(&before, &after), Some(10 * 512));
        // A partition added meanwhile: its writes count (they may overlap the target).
        let after = reading(10, Some(1040), &[("p1", 10), ("p2", 500), ("p3", 40)]);
        assert_eq!(bytes_between(&before, &after), Some(40 * 512));
    }
}
