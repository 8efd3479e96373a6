//! Devices a mounted filesystem writes beside its own: an ext4 external journal, an
//! xfs external log or realtime device. They have no mountinfo line of their own, and
//! the filesystem holds them exclusively, so without this a refusal could only guess
//! ("lazily unmounted, or held by another program").

use std::io::Read;
use std::path::Path;

use crate::host::mounts::{MountEntry, block_rdev};

/// ext2/3/4 on-disk superblock: at byte 1024 of the device.
const EXT_SUPERBLOCK: u64 = 1024;
const EXT_MAGIC_AT: usize = 0x38;
const EXT_MAGIC: u16 = 0xEF53;
const EXT_INCOMPAT_AT: usize = 0x60;
/// `EXT3_FEATURE_INCOMPAT_JOURNAL_DEV`: this device is an external journal.
const EXT_INCOMPAT_JOURNAL_DEV: u32 = 0x8;
const EXT_UUID_AT: usize = 0x68;
/// `s_journal_uuid`: the UUID of a filesystem's external journal.
const EXT_JOURNAL_UUID_AT: usize = 0xD0;

/// What mounted filesystem uses `path` (device number `dev`) as a companion device,
/// said as "the external journal of ext4 mounted at /mnt/x (from /dev/loop3)".
pub(crate) fn user_of(path: &Path, dev: (u32, u32), mounts: &[MountEntry]) -> Option<String> {
    for m in mounts {
        for (option, what) in [("logdev=", "external log"), ("rtdev=", "realtime device")] {
            let named = m.super_options.split(',').filter_map(|o| o.strip_prefix(option));
            if named.into_iter().any(|p| block_rdev(Path::new(p)) == Some(dev)) {
                return Some(describe(what, m));
            }
        }
    }
    let uuid = ext_journal_device_uuid(path)?;
    let m = mounts.iter().find(|m| {
        matches!(m.fs_type.as_str(), "ext3" | "ext4")
            && ext_superblock(Path::new(&m.source)).is_some_and(|sb| sb[EXT_JOURNAL_UUID_AT..][..16] == uuid)
    })?;
    Some(describe("external journal", m))
}

fn describe(what: &str, m: &MountEntry) -> String {
    format!("the {what} of {} mounted at {} (from {})", m.fs_type, m.mount_point.display(), m.source)
}

/// `s_journal_inum`: 0 when the journal is not an inode of the filesystem itself.
const EXT_JOURNAL_INUM_AT: usize = 0xE0;
/// `s_journal_dev`: the external journal's device number (the kernel's "new" encoding),
/// which the kernel opens at mount and keeps up to date there.
const EXT_JOURNAL_DEV_AT: usize = 0xE4;

/// The devices a mounted filesystem writes beside its own, each with what it is to it:
/// an ext3/4 external journal, an xfs external log or realtime device.
pub(crate) fn companions_of(m: &MountEntry) -> Vec<((u32, u32), &'static str)> {
    let mut out = Vec::new();
    for (option, what) in [("logdev=", "external log"), ("rtdev=", "realtime device")] {
        let named = m.super_options.split(',').filter_map(|o| o.strip_prefix(option));
        out.extend(named.filter_map(|p| block_rdev(Path::new(p))).map(|d| (d, what)));
    }
    if matches!(m.fs_type.as_str(), "ext3" | "ext4")
        && let Some(dev) = ext_superblock(Path::new(&m.source)).and_then(|sb| ext_external_journal(&sb))
    {
        out.push((dev, "external journal"));
    }
    out
}

/// The device number of an ext3/4 filesystem's external journal, from its superblock.
fn ext_external_journal(sb: &[u8]) -> Option<(u32, u32)> {
    let word = |at: usize| u32::from_le_bytes(sb[at..][..4].try_into().unwrap_or_default());
    let external = sb[EXT_JOURNAL_UUID_AT..][..16].iter().any(|&b| b != 0) && word(EXT_JOURNAL_INUM_AT) == 0;
    let dev = word(EXT_JOURNAL_DEV_AT);
    // include/linux/kdev_t.h, new_decode_dev.
    (external && dev != 0).then_some(((dev & 0xfff00) >> 8, (dev & 0xff) | ((dev >> 12) & 0xfff00)))
}

/// The UUID of an ext3/4 external journal device; None for anything else.
fn ext_journal_device_uuid(path: &Path) -> Option<[u8; 16]> {
    let sb = ext_superblock(path)?;
    let incompat = u32::from_le_bytes(sb[EXT_INCOMPAT_AT..][..4].try_into().ok()?);
    (incompat & EXT_INCOMPAT_JOURNAL_DEV != 0).then(|| sb[EXT_UUID_AT..][..16].try_into().ok()).flatten()
}

/// The first 1 KiB of an ext2/3/4 superblock, None without the magic number.
fn ext_superblock(path: &Path) -> Option<Vec<u8>> {
    use std::io::Seek;
    let mut f = std::fs::File::open(path).ok()?;
    f.seek(std::io::SeekFrom::Start(EXT_SUPERBLOCK)).ok()?;
    let mut sb = vec![0u8; 1024];
    f.read_exact(&mut sb).ok()?;
    (u16::from_le_bytes([sb[EXT_MAGIC_AT], sb[EXT_MAGIC_AT + 1]]) == EXT_MAGIC).then_some(sb)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn superblock(incompat: u32, uuid: u8, journal_uuid: u8) -> Vec<u8> {
        let mut img = vec![0u8; 4096];
        let sb = &mut img[EXT_SUPERBLOCK as usize..];
        sb[EXT_MAGIC_AT..][..2].copy_from_slice(&EXT_MAGIC.to_le_bytes());
        sb[EXT_INCOMPAT_AT..][..4].copy_from_slice(&incompat.to_le_bytes());
        sb[EXT_UUID_AT..][..16].fill(uuid);
        sb[EXT_JOURNAL_UUID_AT..][..16].fill(journal_uuid);
        img
    }

    #[test]
    fn an_ext4_filesystem_names_its_external_journal_device() {
        let mut sb = superblock(0, 1, 7)[EXT_SUPERBLOCK as usize..].to_vec();
        // 259:1 in the kernel's new encoding; 7:300 has a minor above 255.
        for ((major, minor), encoded) in [((259, 1), 0x10301u32), ((7, 300), 0x10072c)] {
            sb[EXT_JOURNAL_DEV_AT..][..4].copy_from_slice(&encoded.to_le_bytes());
            assert_eq!(ext_external_journal(&sb), Some((major, minor)));
        }
        sb[EXT_JOURNAL_INUM_AT..][..4].copy_from_slice(&8u32.to_le_bytes());
        assert_eq!(ext_external_journal(&sb), None, "a journal in inode 8 is internal");
    }

    #[test]
    fn an_ext4_external_journal_is_named_by_its_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, data, other) = (dir.path().join("j"), dir.path().join("d"), dir.path().join("o"));
        std::fs::write(&journal, superblock(EXT_INCOMPAT_JOURNAL_DEV, 7, 0)).unwrap();
        std::fs::write(&data, superblock(0, 1, 7)).unwrap();
        std::fs::write(&other, superblock(0, 2, 9)).unwrap();
        let line = |src: &Path, at: &str| format!("40 22 7:1 / {at} rw - ext4 {} rw\n", src.display());
        let text = line(&other, "/mnt/o") + &line(&data, "/mnt/d");
        let mounts = crate::host::mounts::parse_mountinfo(&text);
        let said = user_of(&journal, (7, 9), &mounts).unwrap();
        assert!(said.contains("external journal of ext4 mounted at /mnt/d"), "{said}");
        assert_eq!(user_of(&data, (7, 1), &mounts), None, "a filesystem's own device is no journal");
    }
}
