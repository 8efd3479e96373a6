//! Which filesystems are mounted from which block devices, from `/proc/self/mountinfo`.
//!
//! Field 3 (major:minor) identifies the superblock's device. One device can appear
//! several times (bind mounts, double mounts): it is one superblock, frozen once
//! (a second FIFREEZE on it would give EBUSY and look like someone else's freeze).

use std::path::{Path, PathBuf};

/// One line of mountinfo that matters to us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Device number of the mounted filesystem's superblock (field 3): its block device,
    /// except where the filesystem has an anonymous number (btrfs: `0:NN`).
    pub(crate) dev: (u32, u32),
    /// The block devices that hold the filesystem's data: `dev`, or for an anonymous
    /// number, the source's device and (btrfs) every member device (see
    /// [`resolve_devices`]).
    pub(crate) devices: Vec<(u32, u32)>,
    /// Where it is mounted (octal escapes decoded).
    pub mount_point: PathBuf,
    /// Filesystem type (`ext4`, `xfs`, ...).
    pub(crate) fs_type: String,
    /// Mount source as the kernel shows it (`/dev/loop0`).
    pub(crate) source: String,
    /// Whether the filesystem itself is read-only (the superblock's `ro`, among the
    /// options after the source), not only this view of it: a read-only bind, or the
    /// read-only view systemd's `ProtectSystem=` gives a unit, of a read-write filesystem
    /// is not (reseq writes the device, never through the mount).
    pub(crate) read_only: bool,
    /// Whether the filesystem is mounted with DAX (super option `dax`, `dax=always` or
    /// `dax=inode`; `dax=never` is not).
    pub(crate) dax: bool,
    /// The directory of the filesystem this mount shows at its mount point (field 4:
    /// `/` for the whole filesystem; a cgroup hierarchy mounted inside a cgroup namespace
    /// or bound from a subgroup shows that group).
    pub(crate) root: String,
    /// The filesystem's own options (after the source): a cgroup v1 hierarchy lists its
    /// controllers there (`rw,freezer`).
    pub(crate) super_options: String,
}

/// Parses the text of a mountinfo file. Malformed lines are skipped: the kernel's
/// format is stable, and a line we cannot read cannot be one we would freeze.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<MountEntry> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    let (major, minor) = fields.get(2)?.split_once(':')?;
    let mount_point = PathBuf::from(unescape(fields.get(4)?));
    fields.get(5)?;
    let dev = (major.parse().ok()?, minor.parse().ok()?);
    Some(MountEntry {
        dev,
        devices: vec![dev],
        mount_point,
        read_only: fields.get(sep + 3).is_some_and(|o| o.split(',').any(|x| x == "ro")),
        dax: fields
            .get(sep + 3)
            .is_some_and(|o| o.split(',').any(|x| x == "dax" || (x.starts_with("dax=") && x != "dax=never"))),
        fs_type: fields.get(sep + 1)?.to_string(),
        source: unescape(fields.get(sep + 2)?),
        root: unescape(fields.get(3)?),
        super_options: fields.get(sep + 3).map_or(String::new(), |o| o.to_string()),
    })
}

/// mountinfo (and /proc/swaps) escape space, tab, newline and backslash as `\ooo`.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn read_mounts() -> std::io::Result<Vec<MountEntry>> {
    let mut entries = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo")?);
    resolve_devices(&mut entries, Path::new("/sys"), block_rdev);
    Ok(entries)
}

/// Anonymous major number: a superblock without a block device of its own (btrfs,
/// tmpfs, overlayfs, ...).
const ANONYMOUS_MAJOR: u32 = 0;

/// Fills `devices` of the btrfs mounts (their superblock number is anonymous): every
/// member device listed in `/sys/fs/btrfs/FSID/devices/` of the filesystem that has the
/// mount's source as a member.
/// Matching by number alone misses a btrfs mounted from the very device reseq is asked
/// to rewrite.
pub(crate) fn resolve_devices(entries: &mut [MountEntry], sys: &Path, rdev: impl Fn(&Path) -> Option<(u32, u32)>) {
    // btrfs only: any other anonymous mount's source is free text (a FUSE mount may
    // name any device as its `fsname`), and must not make a device look mounted.
    for e in entries.iter_mut().filter(|e| e.dev.0 == ANONYMOUS_MAJOR && e.fs_type == "btrfs") {
        let Some(source) = rdev(Path::new(&e.source)) else { continue };
        let members = btrfs_members(sys, source);
        // The source must be a member of a btrfs the kernel knows, not just any device.
        if members.contains(&source) {
            e.devices = members;
            e.devices.sort();
        }
    }
}

/// The member devices of the btrfs filesystem that has `member` among its devices.
fn btrfs_members(sys: &Path, member: (u32, u32)) -> Vec<(u32, u32)> {
    let dev_of = |p: PathBuf| crate::host::devnum::parse_dev(&std::fs::read_to_string(p.join("dev")).ok()?);
    let Ok(filesystems) = std::fs::read_dir(sys.join("fs/btrfs")) else { return Vec::new() };
    for fs in filesystems.flatten() {
        let Ok(devices) = std::fs::read_dir(fs.path().join("devices")) else { continue };
        let members: Vec<(u32, u32)> = devices.flatten().filter_map(|d| dev_of(d.path())).collect();
        if members.contains(&member) {
            return members;
        }
    }
    Vec::new()
}

/// The device number of a block device node, None for anything else.
pub(crate) fn block_rdev(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::metadata(path).ok()?;
    md.file_type().is_block_device().then(|| crate::host::devnum::dev_num(md.rdev()))
}

/// One mounted filesystem (superblock) that must be frozen, with every mount point
/// it is visible at.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct MountedFs {
    /// Device number as "major:minor".
    pub(crate) dev: String,
    #[serde(skip)]
    pub(crate) dev_num: (u32, u32),
    pub(crate) fs_type: String,
    pub(crate) source: String,
    /// The mount point reseq freezes through (the first one listed).
    pub mount_point: PathBuf,
    /// Every place it is mounted (bind mounts included).
    pub(crate) all_mount_points: Vec<PathBuf>,
    pub(crate) read_only: bool,
    /// Device mode on a btrfs: the member device the run rewrites (its used space is
    /// what the device tree allocates on that member).
    #[serde(skip)]
    pub(crate) btrfs_member: Option<(u32, u32)>,
}

/// Groups the mounts of the given devices by superblock, in device-list order.
pub(crate) fn filesystems_on(entries: &[MountEntry], devices: &[(u32, u32)]) -> Vec<MountedFs> {
    let mut out: Vec<MountedFs> = Vec::new();
    for dev in devices {
        for e in entries.iter().filter(|e| e.devices.contains(dev)) {
            if let Some(fs) = out.iter_mut().find(|f| f.dev_num == e.dev) {
                fs.all_mount_points.push(e.mount_point.clone());
            } else {
                out.push(MountedFs {
                    dev: format!("{}:{}", e.dev.0, e.dev.1),
                    dev_num: e.dev,
                    fs_type: e.fs_type.clone(),
                    source: e.source.clone(),
                    mount_point: e.mount_point.clone(),
                    all_mount_points: vec![e.mount_point.clone()],
                    read_only: e.read_only,
                    btrfs_member: None,
                });
            }
        }
    }
    out
}

/// The mount whose mount point is the longest prefix of `path` (the filesystem that
/// holds it), for deciding whether the state directory sits on a frozen filesystem.
pub(crate) fn mount_containing<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    entries.iter().filter(|e| path.starts_with(&e.mount_point)).max_by_key(|e| e.mount_point.as_os_str().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,dax=never
42 22 7:0 / /tmp/m\\040x rw,relatime - ext4 /dev/loop0 rw,dax=always
43 22 7:0 /sub /srv/bind ro,relatime - ext4 /dev/loop0 rw
44 22 7:1 / /mnt/x ro shared:5 master:2 - xfs /dev/loop1 ro,attr2
bogus line
";

    #[test]
    fn parses_and_groups_by_superblock() {
        let e = parse_mountinfo(SAMPLE);
        assert_eq!(e.len(), 4);
        assert_eq!(e[1].mount_point, PathBuf::from("/tmp/m x"));
        assert_eq!(e[3].fs_type, "xfs");
        assert_eq!(e.iter().map(|m| m.dax).collect::<Vec<_>>(), vec![false, true, false, false]);
        assert!(e[3].read_only);
        assert!(!e[2].read_only, "a read-only view (a bind, a unit's sandbox) of a read-write filesystem");
        let fs = filesystems_on(&e, &[(7, 0), (7, 1), (7, 9)]);
        assert_eq!(fs.len(), 2);
        assert_eq!(fs[0].all_mount_points.len(), 2);
        assert!(!fs[0].read_only);
        assert!(fs[1].read_only);
    }

    #[test]
    fn a_btrfs_is_found_by_its_source_and_members() {
        let text = "50 22 0:39 / /mnt/b rw - btrfs /dev/loop5 rw,subvolid=5\n51 22 0:40 / /mnt/t rw - tmpfs tmpfs rw\n52 22 0:41 / /mnt/f rw - fuse.x /dev/loop5 rw\n";
        let mut e = parse_mountinfo(text);
        let sys = tempfile::tempdir().unwrap();
        for (name, dev) in [("loop5", "7:5"), ("loop6", "7:6")] {
            let d = sys.path().join("fs/btrfs/1234-abcd/devices").join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("dev"), format!("{dev}\n")).unwrap();
        }
        resolve_devices(&mut e, sys.path(), |p| (p == Path::new("/dev/loop5")).then_some((7, 5)));
        assert_eq!(e[0].devices, vec![(7, 5), (7, 6)]);
        assert_eq!(e[1].devices, vec![(0, 40)], "a source that is no device changes nothing");
        assert_eq!(e[2].devices, vec![(0, 41)], "a FUSE mount naming a device does not make it mounted");
        for member in [(7, 5), (7, 6)] {
            let fs = filesystems_on(&e, &[member]);
            assert_eq!(fs.len(), 1, "the btrfs is found from {member:?}");
            assert_eq!((fs[0].dev_num, fs[0].fs_type.as_str()), ((0, 39), "btrfs"));
        }
        assert!(filesystems_on(&e, &[(7, 7)]).is_empty());
    }

    #[test]
    fn containing_mount() {
        let e = parse_mountinfo(SAMPLE);
        assert_eq!(mount_containing(&e, Path::new("/tmp/m x/a")).unwrap().dev, (7, 0));
        assert_eq!(mount_containing(&e, Path::new("/var/lib")).unwrap().dev, (254, 0));
    }
}
