//! The checks made before anything is frozen or written, each named, with its refusal
//! text beside it. Device mode ([`super::device::plan`]) and file mode ([`super::files`]) run
//! the ones they share from here: privileges, the freeze length against the hung-task
//! watchdog, the chunk size against the device's alignment, a writable device, nobody
//! else writing it.

use std::path::Path;
use std::time::Duration;

use crate::host::device::{BlockDeviceInfo, Medium, Sysfs};
use crate::host::mounts::{MountEntry, MountedFs};
use crate::support::error::{Error, Result};
use crate::support::hooks;
use crate::support::units::{Size, human_bytes};

fn read_proc_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Refuses (or, with --force, warns about) real-time processes keeping a CPU busy: they
/// starve the kernel threads a freeze and a thaw wait for, and no priority of reseq's
/// can bound a window then (docs/SAFETY.md).
pub(crate) fn no_realtime_hogs(force: bool) -> Result<Option<String>> {
    let hogs = crate::host::hardening::realtime_hogs(std::time::Duration::from_millis(200));
    if hogs.is_empty() {
        return Ok(None);
    }
    let list = hogs.iter().map(|(p, c)| format!("{p} ({c})")).collect::<Vec<_>>().join(", ");
    let reason = format!(
        "real-time processes keep a CPU busy: {list}. They starve the kernel threads a freeze and a thaw wait for, so a freeze could last far beyond its bound (measured: 12-15 s against 1 s with two SCHED_FIFO 50 busy loops)"
    );
    if force {
        return Ok(Some(reason));
    }
    Err(Error::refused(reason, "stop them or run reseq when they are idle; --force goes ahead anyway"))
}

/// `kernel.hung_task_timeout_secs` (None: disabled) and whether a hung task panics.
pub(crate) fn hung_task() -> (Option<Duration>, bool) {
    let timeout = read_proc_u64("/proc/sys/kernel/hung_task_timeout_secs").filter(|&s| s > 0).map(Duration::from_secs);
    (timeout, read_proc_u64("/proc/sys/kernel/hung_task_panic").is_some_and(|v| v != 0))
}

/// Refuses (or, with --force, warns about) a window whose hard bound (`--max-freeze`
/// plus the guardian's grace) is longer than half the hung-task timeout: writers blocked
/// by the freeze can trip the watchdog.
pub(crate) fn freeze_length(max_freeze: Duration, force: bool) -> Result<Vec<String>> {
    let (timeout, panic) = hung_task();
    let bound = crate::host::freeze::freeze_bound(max_freeze);
    let Some(t) = timeout.filter(|t| bound > *t / 2) else { return Ok(Vec::new()) };
    let msg = format!(
        "--max-freeze {:.3} s plus the guardian's grace of {:.3} s is longer than half of kernel.hung_task_timeout_secs ({} s): writers blocked by the freeze can trip the hung-task watchdog{}",
        max_freeze.as_secs_f64(),
        crate::host::freeze::freeze_grace(max_freeze).as_secs_f64(),
        t.as_secs(),
        if panic { ", and kernel.hung_task_panic=1 turns that into a kernel panic" } else { "" }
    );
    if !force {
        let limit = (t / 2).saturating_sub(Duration::from_secs(1));
        return Err(Error::refused(msg, format!("use --max-freeze {}ms or less, or --force", limit.as_millis())));
    }
    Ok(vec![msg])
}

/// Beyond this, a run that `--rate` alone keeps from finishing sooner is refused.
pub(crate) const LONGEST_RUN: Duration = Duration::from_secs(365 * 86_400);

/// `--rate` against the bytes to rewrite: no run at that rate takes less than its bytes
/// but the last chunk at that rate (the last is written once the rest is paid for),
/// which is arithmetic, not a prediction. Past [`LONGEST_RUN`] that is almost surely a
/// slip of the unit (`--rate 1` is one byte a second), so the run is refused unless
/// `--force`; a dry run says so in a warning and plans on.
pub(crate) fn finishes(
    bytes: u64,
    chunk: u64,
    rate: Option<u64>,
    force: bool,
    dry_run: bool,
) -> Result<Option<String>> {
    let Some(rate) = rate.filter(|&r| r > 0) else { return Ok(None) };
    let least = bytes.saturating_sub(chunk) as f64 / rate as f64;
    if least <= LONGEST_RUN.as_secs_f64() {
        return Ok(None);
    }
    let (rate, least) = (crate::support::units::human_rate(rate as f64), crate::support::units::human_seconds(least));
    let reason =
        format!("at --rate {rate} the {} to rewrite take at least {least}, more than a year", human_bytes(bytes));
    let hint = "--rate counts bytes per second (--rate 100M is 100 MiB a second); --force runs it anyway";
    match (force, dry_run) {
        (true, _) => Ok(Some(format!("{reason}: going on (--force)"))),
        (false, true) => Ok(Some(format!("{reason}: the run itself is refused (exit 3); {hint}"))),
        (false, false) => Err(Error::refused(reason, hint)),
    }
}

/// The chunk size must be a multiple of the device's direct-I/O alignment.
pub(crate) fn aligned(chunk_size: Size, dev: &BlockDeviceInfo) -> Result<()> {
    let (bytes, align) = (chunk_size.bytes(), u64::from(dev.dio_offset_align));
    if bytes % align == 0 {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "--chunk-size {chunk_size} ({bytes} bytes) is not a multiple of the device's direct-I/O alignment of {align} bytes ({}) on {}; try {}",
        dev.dio_align_source,
        dev.path.display(),
        human_bytes(bytes.div_ceil(align) * align),
    )))
}

/// The device takes writes (BLKROGET).
pub(crate) fn writable(dev: &BlockDeviceInfo) -> Result<()> {
    if !dev.read_only {
        return Ok(());
    }
    Err(Error::refused(
        format!("{} is read-only (BLKROGET)", dev.path.display()),
        "make it writable (blockdev --setrw) if that is really intended, or choose another device",
    ))
}

/// Nothing is stacked on the device (device-mapper, md, LVM): writing below them
/// bypasses their view of the data.
pub(crate) fn nothing_stacked(dev: &BlockDeviceInfo, sysfs: &Sysfs) -> Result<()> {
    if dev.holders.is_empty() {
        return Ok(());
    }
    let tops = top_holders(sysfs, &dev.holders);
    Err(Error::refused(
        format!(
            "{} is used by {} stacked on top of it (device-mapper, md or LVM): writing below them bypasses their view of the data",
            dev.path.display(),
            dev.holders.join(", ")
        ),
        format!("target the top device instead: {}", tops.join(", ")),
    ))
}

/// Names the tops of the stacks of holders (dm on dm on a partition...), as the devices
/// to target instead: every branch, since a device can hold several (a snapshot origin's
/// `-real` device holds both the origin and the snapshot).
pub(crate) fn top_holders(sysfs: &Sysfs, holders: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo: Vec<(String, u32)> =
        holders.iter().map(|h| (h.split(' ').next().unwrap_or(h).to_string(), 0)).collect();
    while let Some((cur, depth)) = todo.pop() {
        let up = sysfs.holders_of(&cur);
        if up.is_empty() || depth >= 8 {
            out.push(sysfs.display_name(&cur));
        } else {
            todo.extend(up.into_iter().map(|u| (u, depth + 1)));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Nothing in the device's stack copies or allocates on write: a thin volume (a block
/// shared with a snapshot, or never written, gets a new block in the pool), a dm
/// snapshot's origin (each block is first copied into every snapshot's store) or a
/// snapshot (its store takes the write). Rewriting the same bytes would cost space
/// below, which reseq cannot bound, and a full pool or store fails every volume in it or
/// invalidates the snapshot.
///
/// A thin volume itself is the exception where its pool's metadata can be read
/// (`thin`: [`crate::host::thin::Thin::of`]): only the blocks it alone holds are
/// rewritten, each where it is, and nothing is allocated (`host/holes.rs`). File mode
/// reads no such map (`thin`: `Ok(None)`), and is refused there.
pub(crate) fn no_copy_on_write(
    dev: &BlockDeviceInfo,
    sysfs: &Sysfs,
    thin: &std::result::Result<Option<crate::host::thin::Thin>, String>,
) -> Result<()> {
    let mut found =
        crate::host::device::copy_on_write_below(sysfs, &dev.identity.name, &crate::host::device::dmsetup_targets);
    let kind = |c: &crate::host::device::CopyOnWrite| c.target.split(' ').next().unwrap_or_default().to_string();
    if matches!(thin, Ok(Some(_))) {
        // The volume and the pool under it: what the map accounts for.
        found.retain(|c| !(c.name == dev.identity.name && kind(c) == "thin" || kind(c) == "thin-pool"));
    }
    if found.is_empty() {
        return Ok(());
    }
    let no_map = match thin {
        Err(why) => format!(" (and its blocks cannot be mapped: {why})"),
        Ok(_) => String::new(),
    };
    let what: Vec<String> = found
        .iter()
        .map(|c| {
            let why = match c.target.split(' ').next().unwrap_or_default() {
                "thin" => "a thin volume: each block rewritten that is shared with a snapshot, or was never written, takes a new block of its pool",
                "thin-pool" => "a thin pool: its volumes' blocks are shared and allocated on write",
                "snapshot-origin" => "the origin of a dm snapshot: each block rewritten is first copied into every snapshot's store, which invalidates the snapshot when full",
                "snapshot" | "snapshot-merge" => "a dm snapshot: each block rewritten takes space in its store, which invalidates the snapshot when full",
                _ => "a device-mapper device whose target reseq cannot tell without dmsetup",
            };
            format!("{} is {why} ({})", sysfs.display_name(&c.name), c.target)
        })
        .collect();
    Err(Error::refused(
        format!(
            "{} is on copy-on-write storage: {}{no_map}. Writing the same bytes back costs space below, which reseq cannot bound",
            dev.path.display(),
            what.join("; ")
        ),
        "remove the snapshots (lvremove) before a run, or leave snapshot origins out; rewrite a thin volume in device mode (its pool's map is read with thin_dump: install thin-provisioning-tools); where dmsetup is missing, install it",
    ))
}

/// No active swap on the device: the kernel writes swap whatever the freeze.
pub(crate) fn no_swap(dev: &BlockDeviceInfo) -> Result<()> {
    match dev.active_swap.is_empty() {
        true => Ok(()),
        false => Err(crate::host::device::swap_refusal(&dev.path, &dev.active_swap)),
    }
}

/// Nobody else writes the device, under its own name or another: a raw writer bypasses
/// freezes and O_EXCL alike, and so does one that reaches the same bytes through an alias
/// (a second loop device over the backing file, at any offset; a process writing that
/// file; a filesystem mounted from the alias; another path to the same LUN). Refused
/// before any write, naming what was found (`host::writers`, `host::aliases`).
/// Returns the devices through which its bytes can be written, checked again later.
pub(crate) fn no_other_writers(dev: &BlockDeviceInfo, sysfs: &Sysfs) -> Result<Vec<(u32, u32)>> {
    let writer_devices = dev.devices_sharing_bytes(sysfs);
    crate::host::writers::refuse_other_writers(&dev.path, &writer_devices)?;
    Ok(writer_devices)
}

/// An unmounted device must be ours alone: O_EXCL fails with EBUSY if anything holds it,
/// in particular a lazily unmounted filesystem (no mountinfo line, nothing to freeze,
/// still writing).
pub(crate) fn exclusive_if_unmounted(
    dev: &BlockDeviceInfo,
    filesystems: &[MountedFs],
    mounts: &[MountEntry],
) -> Result<()> {
    if !filesystems.is_empty() {
        return Ok(());
    }
    match crate::sys::block::open_exclusive(&dev.path) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::EBUSY) => Err(busy_unmounted(&dev.path, dev.dev_num, mounts)),
        Err(e) => Err(Error::io(format!("opening {} exclusively", dev.path.display()), e)),
    }
}

/// Why a device with no mount of its own is held exclusively: a filesystem's companion
/// device (external journal or log), or else most likely a lazily unmounted filesystem.
pub(crate) fn busy_unmounted(path: &Path, dev: (u32, u32), mounts: &[MountEntry]) -> Error {
    if let Some(user) = crate::host::companions::user_of(path, dev, mounts) {
        return Error::refused(
            format!(
                "{} is {user}: that filesystem writes it, and reseq rewrites only the devices a filesystem lives on, frozen through its mount",
                path.display()
            ),
            "rewrite the filesystem's own device (its journal or log is rewritten only once the filesystem is unmounted), or unmount it and run reseq again",
        );
    }
    Error::refused(
        format!(
            "{} is busy (exclusive open gave EBUSY) but no mounted filesystem was found on it: most likely a lazily unmounted filesystem (umount -l) still in use, which cannot be frozen, or another program holding it exclusively",
            path.display()
        ),
        "find the holder (lsof, fuser -vm), let it finish or close, then run reseq again",
    )
}

/// A mounted btrfs in device mode: none of its own writers running (scrub, balance and
/// device replace write through a freeze, and a raw rewrite could put back bytes they
/// changed; they are checked again in every window), and no RAID5/6 chunk (refused as
/// in file mode: reseq does not rewrite stripes whose parity it cannot check).
/// With `--include-free` it is refused: the check of btrfs's own writers in every window
/// is made where the used space is read, which `--include-free` skips.
pub(crate) fn freezable_in_device_mode(
    dev: &BlockDeviceInfo,
    filesystems: &[MountedFs],
    include_free: bool,
) -> Result<()> {
    use std::os::fd::AsFd;
    for fs in filesystems.iter().filter(|f| f.fs_type == "btrfs") {
        if include_free {
            return Err(Error::refused(
                format!(
                    "{} holds btrfs, mounted at {}: --include-free is not supported there (btrfs's own writers, scrub, balance and device replace, are checked in every window where its used space is read)",
                    dev.path.display(),
                    fs.mount_point.display()
                ),
                "run without --include-free (what btrfs allocates on the device is rewritten), or unmount it (an unmounted device is rewritten whole)",
            ));
        }
        let fd = crate::host::freeze::open_mount_point(&fs.mount_point)?;
        let layout = crate::host::btrfs::Layout::read(fd.as_fd())?;
        if let Some(why) = layout.chunks.iter().find_map(|c| c.profile().refused()) {
            let (device, mount) = (dev.path.display(), fs.mount_point.display());
            return Err(Error::refused(
                format!("{device} holds btrfs, mounted at {mount} (from {}), with chunks in {why}", fs.source),
                "unmount it and run reseq again (an unmounted device is rewritten whole), or let btrfs rewrite its own data: btrfs balance start --full-balance MOUNTPOINT",
            ));
        }
        crate::host::btrfs::refuse_own_writers(fd.as_fd(), &layout, &fs.mount_point)?;
    }
    Ok(())
}

/// The filesystems in the order they can be frozen: one that writes through another (its
/// journal, log or device on a loop over a file there) before it (`host::freeze_order`).
/// Filesystems that write through each other cannot be frozen at all, and are refused.
pub(crate) fn freeze_order(
    filesystems: Vec<MountedFs>,
    env: &crate::host::in_use::Environment,
) -> Result<crate::host::freeze_order::FreezeOrder> {
    if hooks::flag("mount-order") {
        return Ok(crate::host::freeze_order::FreezeOrder { filesystems, reasons: Vec::new() });
    }
    crate::host::freeze_order::order(filesystems, &env.mounts, &env.sysfs).map_err(|cycle| {
        Error::refused(
            format!("{cycle}: freezing either one would wait for the other's thaw, and could never finish"),
            "move the journal, log or image file off the filesystems this run freezes, or rewrite them one at a time unmounted",
        )
    })
}

/// A spinning disk has no FTL to re-sequence: refused, or with --force a warning.
pub(crate) fn not_rotational(dev: &BlockDeviceInfo, force: bool) -> Result<Option<String>> {
    let medium = if hooks::flag("rotational") { Medium::Rotational("test hook".into()) } else { dev.medium.clone() };
    let Medium::Rotational(why) = &medium else { return Ok(None) };
    let msg = format!(
        "{} is a rotational disk ({why}): a spinning disk has no FTL to re-sequence, so this only costs time",
        dev.path.display()
    );
    if !force {
        return Err(Error::refused(msg, "pass --force if you really mean it"));
    }
    Ok(Some(msg))
}

/// The state directory takes a journal and a rescue copy of a chunk, before any freeze.
pub(crate) fn state_dir(
    dir: &Path,
    frozen: &[MountedFs],
    chunk_size: Size,
    dry_run: bool,
) -> Result<crate::host::state_dir::StateDir> {
    crate::host::state_dir::prepare(dir, frozen, chunk_size.bytes() * 2 + (1 << 20), dry_run)
}

/// File mode: the mount holding `f` (on device `dev`): a filesystem type whose FIEMAP
/// gives device offsets and that lives on an SSD, a device reseq can identify, not DAX.
pub(crate) fn file_mode_mount(f: &Path, entry: &MountEntry, dev: (u32, u32)) -> Result<()> {
    if let Some((why, hint)) = refuse_fs(&entry.fs_type) {
        return Err(Error::refused(format!("{}: {why}", f.display()), hint));
    }
    // A btrfs subvolume has an st_dev of its own: the same filesystem if its fsid is.
    if entry.dev != dev && !(entry.fs_type == "btrfs" && crate::host::btrfs::same_filesystem(f, &entry.mount_point)) {
        return Err(Error::refused(
            format!(
                "{} is on a filesystem whose device reseq cannot identify ({} reports {}:{})",
                f.display(),
                entry.fs_type,
                dev.0,
                dev.1
            ),
            "rewrite the device instead",
        ));
    }
    if entry.dax {
        return Err(Error::refused(
            format!("{} is on a DAX mount: no FTL to fix, and mmap stores bypass the page cache", f.display()),
            "nothing to do",
        ));
    }
    Ok(())
}

/// Filesystems file mode refuses, with why.
fn refuse_fs(fs_type: &str) -> Option<(String, String)> {
    let remote = ["nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "virtiofs", "afs", "glusterfs", "lustre"];
    Some(match fs_type {
        "tmpfs" | "ramfs" | "devtmpfs" => {
            (format!("{fs_type} lives in memory: there is no SSD layout to fix"), "nothing to do".into())
        }
        "overlay" => (
            "overlayfs: its files live on another filesystem".into(),
            "run reseq on the underlying (upper) directory".into(),
        ),
        t if t.starts_with("fuse") => (
            format!("{t} is a FUSE filesystem: its blocks are not reseq's to map"),
            "run reseq on the backing storage".into(),
        ),
        t if remote.contains(&t) => (format!("{t} is a network filesystem"), "run reseq on the server".into()),
        t if !crate::host::usedspace::SUPPORTED.contains(&t) && t != "btrfs" => (
            format!("{t} is not supported by file mode (ext2/3/4, xfs and btrfs are)"),
            "rewrite the device instead".into(),
        ),
        _ => return None,
    })
}

/// File mode: the file's filesystem is read-write (each window freezes it, and its files
/// are written through their device). A read-only view of it (a read-only bind, a unit's
/// `ProtectSystem=strict`) is no reason to refuse: nothing is written through a mount.
pub(crate) fn read_write(f: &Path, fs: &MountedFs) -> Result<()> {
    if !fs.read_only {
        return Ok(());
    }
    Err(Error::refused(
        format!("{} is on a filesystem mounted read-only ({})", f.display(), fs.mount_point.display()),
        "remount it read-write, or rewrite the device",
    ))
}

/// File mode: not an active swap file. The kernel writes swap through its own map of the
/// file's blocks, whatever the freeze: a page swapped out between a chunk's read and its
/// write would be lost.
pub(crate) fn not_active_swap(f: &Path, id: (u64, u64), swap_files: &[((u64, u64), String)]) -> Result<()> {
    let Some((_, name)) = swap_files.iter().find(|(s, _)| *s == id) else { return Ok(()) };
    Err(Error::refused(
        format!("{} is an active swap file ({name}): the kernel writes swap whatever the freeze", f.display()),
        format!("leave it out (--exclude '{}'), or swapoff it first", f.display()),
    ))
}

/// File mode: fscrypt: the blocks hold ciphertext, which reading through the file does not
/// give.
pub(crate) fn not_encrypted(f: &Path) -> Result<()> {
    if !crate::sys::block::statx_encrypted(f).unwrap_or(false) {
        return Ok(());
    }
    Err(Error::refused(
        format!(
            "{} is fscrypt-encrypted: its blocks hold ciphertext reseq cannot read back through the file",
            f.display()
        ),
        "rewrite the device instead",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_that_keeps_a_run_from_finishing_within_a_year_is_refused_unless_forced() {
        const MIB: u64 = 1 << 20;
        assert_eq!(finishes(480 * MIB, 4 * MIB, None, false, false).unwrap(), None);
        assert_eq!(finishes(480 * MIB, 4 * MIB, Some(1 << 20), false, false).unwrap(), None, "8 minutes");
        let e = finishes(480 * MIB, 4 * MIB, Some(1), false, false).unwrap_err();
        assert!(matches!(&e, Error::Refused { reason, .. } if reason.contains("at least 16 years")), "{e:?}");
        let dry = finishes(480 * MIB, 4 * MIB, Some(1), false, true).unwrap().unwrap();
        assert!(dry.contains("the run itself is refused (exit 3)"), "{dry}");
        let forced = finishes(480 * MIB, 4 * MIB, Some(1), true, false).unwrap().unwrap();
        assert!(forced.ends_with("going on (--force)"), "{forced}");
        // A year and a little: the last chunk is not waited for.
        let year = LONGEST_RUN.as_secs();
        assert_eq!(finishes(year + 4 * MIB, 4 * MIB, Some(1), false, false).unwrap(), None);
        assert!(finishes(year + 4 * MIB + 1, 4 * MIB, Some(1), false, false).is_err());
    }

    #[test]
    fn refuses_filesystems_without_device_offsets_or_an_ftl() {
        for t in ["tmpfs", "overlay", "fuse.sshfs", "nfs4", "zfs"] {
            assert!(refuse_fs(t).is_some(), "{t}");
        }
        for t in ["ext4", "xfs", "btrfs"] {
            assert!(refuse_fs(t).is_none(), "{t}");
        }
    }

    /// The holders refusal names the top of the stack. This kernel has no device-mapper
    /// or md, so the stack is a fake sysfs tree: sdz1 <- dm-7 <- dm-9 ("vg-data").
    #[test]
    fn names_the_top_of_a_holder_stack() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for (dev, holder) in [("sdz1", Some("dm-7")), ("dm-7", Some("dm-9")), ("dm-9", None)] {
            let d = r.join("class/block").join(dev);
            std::fs::create_dir_all(d.join("holders")).unwrap();
            if let Some(h) = holder {
                std::fs::create_dir_all(d.join("holders").join(h)).unwrap();
            }
        }
        std::fs::create_dir_all(r.join("class/block/dm-9/dm")).unwrap();
        std::fs::write(r.join("class/block/dm-9/dm/name"), "vg-data\n").unwrap();
        let sysfs = Sysfs { root: r.to_path_buf() };
        let holders = sysfs.holders_of("sdz1");
        assert_eq!(holders, vec!["dm-7".to_string()]);
        assert_eq!(top_holders(&sysfs, &holders), vec!["/dev/dm-9 (/dev/mapper/vg-data)".to_string()]);
    }

    /// A classic snapshot's `-real` device is held by both the origin and the snapshot
    /// (seen in the VM tests, tests/vm): the refusal names both tops.
    #[test]
    fn names_every_top_of_a_branching_stack() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let stack: [(&str, &[&str]); 5] = [
            ("sdz", &["dm-0", "dm-1"]),
            ("dm-0", &["dm-2", "dm-3"]),
            ("dm-1", &["dm-3"]),
            ("dm-2", &[]),
            ("dm-3", &[]),
        ];
        for (dev, holders) in stack {
            let d = r.join("class/block").join(dev);
            std::fs::create_dir_all(d.join("holders")).unwrap();
            for h in holders {
                std::fs::create_dir_all(d.join("holders").join(h)).unwrap();
            }
        }
        for (dev, name) in [("dm-2", "vg-origin"), ("dm-3", "vg-snap")] {
            std::fs::create_dir_all(r.join("class/block").join(dev).join("dm")).unwrap();
            std::fs::write(r.join("class/block").join(dev).join("dm/name"), format!("{name}\n")).unwrap();
        }
        let sysfs = Sysfs { root: r.to_path_buf() };
        assert_eq!(
            top_holders(&sysfs, &sysfs.holders_of("sdz")),
            vec!["/dev/dm-2 (/dev/mapper/vg-origin)".to_string(), "/dev/dm-3 (/dev/mapper/vg-snap)".to_string()]
        );
    }
}
