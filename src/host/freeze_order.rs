//! The order in which a run's filesystems are frozen.
//!
//! Why: FIFREEZE syncs a filesystem before it returns, and that sync writes wherever
//! the filesystem keeps its bytes. If filesystem B keeps some of them (its external
//! journal or log, or its whole device) on a loop device over a file on filesystem A,
//! freezing A first makes B's freeze wait in D state until A thaws (measured: A stayed
//! frozen 76 s). Freezing B first, then A, is safe: B's sync reaches A while A still
//! writes, and once B is frozen nothing of B's writes reaches A. So dependents are
//! frozen first, and thawed last (the guardian thaws in reverse order). A cycle cannot
//! be frozen at all, and is refused.
//!
//! What is followed, from each device a filesystem writes (its own, and its companions:
//! [`crate::host::companions`]): a loop device to the filesystem its backing file is on,
//! a stacked device (dm, md) to its `slaves/`, a partition to its disk; then on from the
//! device below, so that a chain of images (a loop over a file on a filesystem mounted
//! from a loop over a file on A) still leads to A.

use crate::host::aliases;
use crate::host::device::Sysfs;
use crate::host::mounts::{MountEntry, MountedFs};

type DevNum = (u32, u32);

/// Filesystem `dependent` writes through filesystem `on`: it is frozen before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Dependency {
    pub(crate) dependent: usize,
    pub(crate) on: usize,
    /// "its external journal /dev/loop1 writes through a loop device over /mnt/a/j.img".
    pub(crate) how: String,
}

/// The filesystems in the order to freeze them, and why where it is not the given one.
pub(crate) struct FreezeOrder {
    pub(crate) filesystems: Vec<MountedFs>,
    /// One line per dependency found: "/mnt/b before /mnt/a: ...".
    pub(crate) reasons: Vec<String>,
}

/// Orders `filesystems` dependents first; Err names a cycle, which no order can freeze.
pub(crate) fn order(filesystems: Vec<MountedFs>, mounts: &[MountEntry], sysfs: &Sysfs) -> Result<FreezeOrder, String> {
    let deps = dependencies(&filesystems, mounts, sysfs);
    let name = |i: usize| filesystems[i].mount_point.display().to_string();
    let reasons = deps.iter().map(|d| format!("{} before {}: {}", name(d.dependent), name(d.on), d.how)).collect();
    let sorted = dependents_first(filesystems.len(), &deps).map_err(|cycle| {
        let names: Vec<String> = cycle.iter().map(|&i| name(i)).collect();
        let hows: Vec<&str> = deps.iter().filter(|d| cycle.contains(&d.dependent)).map(|d| d.how.as_str()).collect();
        format!("{} depend on each other ({})", names.join(" and "), hows.join("; "))
    })?;
    let mut slots: Vec<Option<MountedFs>> = filesystems.into_iter().map(Some).collect();
    Ok(FreezeOrder { filesystems: sorted.into_iter().filter_map(|i| slots[i].take()).collect(), reasons })
}

/// A topological order of `0..n` with every `dependent` before what it is `on`, stable
/// otherwise; Err with the filesystems left in a cycle.
fn dependents_first(n: usize, deps: &[Dependency]) -> Result<Vec<usize>, Vec<usize>> {
    let mut out = Vec::with_capacity(n);
    let mut left: Vec<usize> = (0..n).collect();
    while !left.is_empty() {
        // The first one left that nothing left still has to come before.
        let next = left.iter().position(|&i| !deps.iter().any(|d| d.on == i && left.contains(&d.dependent)));
        let Some(at) = next else { return Err(left) };
        out.push(left.remove(at));
    }
    Ok(out)
}

/// Every dependency between `filesystems` (indices into it).
pub(crate) fn dependencies(filesystems: &[MountedFs], mounts: &[MountEntry], sysfs: &Sysfs) -> Vec<Dependency> {
    let (loops, _) = aliases::loops(sysfs);
    let mut out = Vec::new();
    for (i, f) in filesystems.iter().enumerate() {
        let entry = mounts.iter().find(|m| m.dev == f.dev_num);
        let mut writes: Vec<(DevNum, String)> = vec![(f.dev_num, "its device".into())];
        if let Some(m) = entry {
            writes.extend(m.devices.iter().filter(|&&d| d != f.dev_num).map(|&d| (d, "a device of it".into())));
            writes.extend(
                crate::host::companions::companions_of(m).into_iter().map(|(d, what)| (d, format!("its {what}"))),
            );
        }
        for (dev, what) in writes {
            let mut seen = Vec::new();
            for (file_dev, path) in files_below(dev, sysfs, &loops, &mut seen) {
                let on = filesystems.iter().position(|g| g.dev_num == file_dev || mounts_on(mounts, g, file_dev));
                // `on == i` too: a filesystem that writes through a file on itself
                // waits on its own freeze, a cycle of one.
                if let Some(on) = on {
                    let how = format!("{what} {} writes through {path}", dev_name(sysfs, dev));
                    if !out.iter().any(|d: &Dependency| d.dependent == i && d.on == on) {
                        out.push(Dependency { dependent: i, on, how });
                    }
                }
            }
        }
    }
    out
}

/// Swap areas on a device that writes through a file on one of `filesystems` (swap on a
/// loop over a swap image there): swap-outs wait while it is frozen, which can stall any
/// process that needs memory. A warning: the guardian, whose memory is locked, still
/// thaws on time. (A swap file on the filesystem itself is refused elsewhere: the
/// kernel writes it whatever the freeze.)
pub(crate) fn swap_through(filesystems: &[MountedFs], swaps_text: &str, sysfs: &Sysfs) -> Vec<String> {
    let (loops, _) = aliases::loops(sysfs);
    let mut out = Vec::new();
    for area in swaps_text.lines().skip(1).filter_map(|l| l.split_whitespace().next()) {
        let Some(dev) = crate::host::mounts::block_rdev(std::path::Path::new(area)) else { continue };
        for (file_dev, path) in files_below(dev, sysfs, &loops, &mut Vec::new()) {
            if let Some(f) = filesystems.iter().find(|g| g.dev_num == file_dev) {
                out.push(format!(
                    "swap on {area} writes through {path}, on {} which each window freezes: swap-outs wait while it is frozen, and a host short of memory stalls with them (swapoff {area} during the run to avoid it)",
                    f.mount_point.display()
                ));
            }
        }
    }
    out
}

/// Whether `dev` is one of the devices of filesystem `g` (btrfs members).
fn mounts_on(mounts: &[MountEntry], g: &MountedFs, dev: DevNum) -> bool {
    mounts.iter().any(|m| m.dev == g.dev_num && m.devices.contains(&dev))
}

fn dev_name(sysfs: &Sysfs, dev: DevNum) -> String {
    sysfs.name_of(dev).map_or_else(|| format!("{}:{}", dev.0, dev.1), |(n, _)| format!("/dev/{n}"))
}

/// The files that writes to `dev` end up in, each as (the device of the filesystem the
/// file is on, "a loop device over PATH"), followed down through loops, stacked devices
/// and partitions. `seen` stops a loop of loops.
fn files_below(dev: DevNum, sysfs: &Sysfs, loops: &[aliases::Loop], seen: &mut Vec<DevNum>) -> Vec<(DevNum, String)> {
    if seen.contains(&dev) || seen.len() > 64 {
        return Vec::new();
    }
    seen.push(dev);
    let Some((name, parent)) = sysfs.name_of(dev) else { return Vec::new() };
    let mut out = Vec::new();
    if let Some(l) = loops.iter().find(|l| l.dev == dev) {
        match l.backing_dev {
            // A loop over a block device: on to that device.
            Some(below) => out.extend(files_below(below, sysfs, loops, seen)),
            None => {
                out.push((l.file.dev, format!("a loop device over {}", l.path)));
                out.extend(files_below(l.file.dev, sysfs, loops, seen));
            }
        }
    }
    let below = sysfs.slaves_of(&name).into_iter().chain(parent).filter_map(|n| sysfs.dev_of(&n));
    for d in below.collect::<Vec<_>>() {
        out.extend(files_below(d, sysfs, loops, seen));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(dependent: usize, on: usize) -> Dependency {
        Dependency { dependent, on, how: String::new() }
    }

    #[test]
    fn dependents_come_first_and_the_rest_keep_their_order() {
        assert_eq!(dependents_first(3, &[]), Ok(vec![0, 1, 2]));
        // 1 writes through 0 (its journal on a file there): 1 first.
        assert_eq!(dependents_first(3, &[dep(1, 0)]), Ok(vec![1, 0, 2]));
        // A chain: 2 through 1 through 0.
        assert_eq!(dependents_first(3, &[dep(1, 0), dep(2, 1)]), Ok(vec![2, 1, 0]));
        assert_eq!(dependents_first(3, &[dep(0, 2)]), Ok(vec![0, 1, 2]));
    }

    #[test]
    fn a_cycle_cannot_be_ordered() {
        assert_eq!(dependents_first(3, &[dep(0, 1), dep(1, 0)]), Err(vec![0, 1]));
        assert_eq!(dependents_first(3, &[dep(0, 1), dep(1, 2), dep(2, 0)]), Err(vec![0, 1, 2]));
    }
}
