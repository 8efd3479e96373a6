//! btrfs: tree search, filesystem and device info, superblock identity, and whether a
//! scrub, balance or replace is running (fs/btrfs/ioctl.c).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::libc;

// include/uapi/linux/btrfs.h: the ioctls reseq reads a btrfs through. Every one is
// read-only; those that need it run with CAP_SYS_ADMIN (fs/btrfs/ioctl.c).
const BTRFS_IOCTL_MAGIC: u8 = 0x94;
/// `struct btrfs_ioctl_search_key` (104 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct BtrfsSearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: u32,
    unused1: [u64; 4],
}
const _: () = assert!(size_of::<BtrfsSearchKey>() == 104);
/// `struct btrfs_ioctl_search_args_v2` with its buffer.
#[repr(C)]
struct BtrfsSearchV2<const N: usize> {
    key: BtrfsSearchKey,
    buf_size: u64,
    buf: [u64; N],
}
const _: () = assert!(size_of::<BtrfsSearchV2<0>>() == 112);
/// `BTRFS_IOC_TREE_SEARCH_V2 _IOWR(0x94, 17, struct btrfs_ioctl_search_args_v2)`.
const BTRFS_IOC_TREE_SEARCH_V2: libc::c_ulong =
    nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 17, size_of::<BtrfsSearchV2<0>>());
/// `struct btrfs_ioctl_search_header` (32 bytes), before each item in the buffer.
const BTRFS_SEARCH_HEADER: usize = 32;
const BTRFS_SEARCH_WORDS: usize = 8192;
/// `BTRFS_CHUNK_TREE_OBJECTID`, `BTRFS_DEV_TREE_OBJECTID` (include/uapi/linux/btrfs_tree.h).
pub(crate) const BTRFS_CHUNK_TREE: u64 = 3;
pub(crate) const BTRFS_DEV_TREE: u64 = 4;
/// `BTRFS_FIRST_CHUNK_TREE_OBJECTID`: the objectid of every chunk item.
pub(crate) const BTRFS_FIRST_CHUNK_TREE_OBJECTID: u64 = 256;
/// `BTRFS_BALANCE_STATE_RUNNING` (fs/btrfs/fs.h, reported by BALANCE_PROGRESS).
pub(crate) const BTRFS_BALANCE_STATE_RUNNING: u64 = 1;
/// `BTRFS_IOCTL_DEV_REPLACE_STATE_STARTED`, `_SUSPENDED` (include/uapi/linux/btrfs.h).
pub(crate) const BTRFS_DEV_REPLACE_STATE_STARTED: u64 = 1;
pub(crate) const BTRFS_DEV_REPLACE_STATE_SUSPENDED: u64 = 4;
/// `BTRFS_CHUNK_ITEM_KEY`, `BTRFS_DEV_EXTENT_KEY` (include/uapi/linux/btrfs_tree.h).
pub(crate) const BTRFS_CHUNK_ITEM_KEY: u32 = 228;
pub(crate) const BTRFS_DEV_EXTENT_KEY: u32 = 204;
/// `BTRFS_BLOCK_GROUP_*` (include/uapi/linux/btrfs_tree.h): a chunk's type and profile.
pub(crate) const BTRFS_BLOCK_GROUP_DATA: u64 = 1 << 0;
pub(crate) const BTRFS_BLOCK_GROUP_SYSTEM: u64 = 1 << 1;
pub(crate) const BTRFS_BLOCK_GROUP_METADATA: u64 = 1 << 2;
pub(crate) const BTRFS_BLOCK_GROUP_RAID0: u64 = 1 << 3;
pub(crate) const BTRFS_BLOCK_GROUP_RAID1: u64 = 1 << 4;
pub(crate) const BTRFS_BLOCK_GROUP_DUP: u64 = 1 << 5;
pub(crate) const BTRFS_BLOCK_GROUP_RAID10: u64 = 1 << 6;
pub(crate) const BTRFS_BLOCK_GROUP_RAID5: u64 = 1 << 7;
pub(crate) const BTRFS_BLOCK_GROUP_RAID6: u64 = 1 << 8;
pub(crate) const BTRFS_BLOCK_GROUP_RAID1C3: u64 = 1 << 9;
pub(crate) const BTRFS_BLOCK_GROUP_RAID1C4: u64 = 1 << 10;

/// One item found by a tree search: its key and its bytes (on-disk, little-endian).
#[derive(Clone, Debug)]
pub(crate) struct BtrfsItem {
    pub(crate) offset: u64,
    pub(crate) data: Vec<u8>,
}

/// Every item of type `item_type` in tree `tree` (objectids `objectids`), in key order,
/// through BTRFS_IOC_TREE_SEARCH_V2 on any open file of the filesystem (a read of the
/// tree in memory: it works while frozen).
pub(crate) fn btrfs_tree_search(
    fd: BorrowedFd<'_>,
    tree: u64,
    objectids: (u64, u64),
    item_type: u32,
) -> nix::Result<Vec<BtrfsItem>> {
    let mut out = Vec::new();
    let (mut objectid, mut offset) = (objectids.0, 0u64);
    loop {
        let mut a = Box::new(BtrfsSearchV2::<BTRFS_SEARCH_WORDS> {
            key: BtrfsSearchKey {
                tree_id: tree,
                min_objectid: objectid,
                max_objectid: objectids.1,
                min_offset: offset,
                max_offset: u64::MAX,
                max_transid: u64::MAX,
                min_type: item_type,
                max_type: item_type,
                nr_items: u32::MAX,
                ..BtrfsSearchKey::default()
            },
            buf_size: (BTRFS_SEARCH_WORDS * 8) as u64,
            buf: [0; BTRFS_SEARCH_WORDS],
        });
        // SAFETY: TREE_SEARCH_V2 reads the key and buf_size, and writes at most buf_size
        // bytes of headers and items after them and the key's nr_items (fs/btrfs/ioctl.c,
        // btrfs_ioctl_tree_search_v2 / copy_to_sk); `a` is a live allocation of exactly
        // that size.
        let rc = unsafe {
            libc::ioctl(
                fd.as_raw_fd(),
                BTRFS_IOC_TREE_SEARCH_V2 as _,
                &mut *a as *mut BtrfsSearchV2<BTRFS_SEARCH_WORDS>,
            )
        };
        Errno::result(rc)?;
        let n = a.key.nr_items as usize;
        if n == 0 {
            return Ok(out);
        }
        // SAFETY: the buffer is BTRFS_SEARCH_WORDS u64s, viewed as bytes.
        let bytes = unsafe { std::slice::from_raw_parts(a.buf.as_ptr().cast::<u8>(), BTRFS_SEARCH_WORDS * 8) };
        let (last_obj, last_off) = search_items(bytes, n, item_type, &mut out)?;
        // The next search starts after the last key found.
        match last_off.checked_add(1) {
            Some(o) => (objectid, offset) = (last_obj, o),
            None if last_obj < objectids.1 => (objectid, offset) = (last_obj + 1, 0),
            None => return Ok(out),
        }
    }
}

/// The `n` items of a search buffer (a header, then the item, each), those of
/// `item_type` into `out`; returns the last key's objectid and offset.
fn search_items(bytes: &[u8], n: usize, item_type: u32, out: &mut Vec<BtrfsItem>) -> nix::Result<(u64, u64)> {
    let (mut at, mut last) = (0, (0, 0));
    for _ in 0..n {
        let head = bytes.get(at..at + BTRFS_SEARCH_HEADER).ok_or(Errno::EOVERFLOW)?;
        let word = |i: usize| u64::from_ne_bytes(head[i..i + 8].try_into().unwrap_or_default());
        let t = u32::from_ne_bytes(head[24..28].try_into().unwrap_or_default());
        let len = u32::from_ne_bytes(head[28..32].try_into().unwrap_or_default()) as usize;
        let data = bytes.get(at + BTRFS_SEARCH_HEADER..at + BTRFS_SEARCH_HEADER + len).ok_or(Errno::EOVERFLOW)?;
        if t == item_type {
            out.push(BtrfsItem { offset: word(16), data: data.to_vec() });
        }
        last = (word(8), word(16));
        at += BTRFS_SEARCH_HEADER + len;
    }
    Ok(last)
}

/// Whether `path` is on a btrfs (statfs f_type `BTRFS_SUPER_MAGIC`).
pub(crate) fn on_btrfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::BTRFS_SUPER_MAGIC)
}

/// `struct btrfs_ioctl_fs_info_args` (1024 bytes).
#[repr(C)]
struct BtrfsFsInfo {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    nodesize: u32,
    sectorsize: u32,
    clone_alignment: u32,
    csum_type: u16,
    csum_size: u16,
    flags: u64,
    generation: u64,
    metadata_uuid: [u8; 16],
    reserved: [u8; 944],
}
const _: () = assert!(size_of::<BtrfsFsInfo>() == 1024);
/// `BTRFS_IOC_FS_INFO _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)`.
const BTRFS_IOC_FS_INFO: libc::c_ulong = nix::request_code_read!(BTRFS_IOCTL_MAGIC, 31, size_of::<BtrfsFsInfo>());

/// `struct btrfs_ioctl_dev_info_args` (4096 bytes).
#[repr(C)]
struct BtrfsDevInfo {
    devid: u64,
    uuid: [u8; 16],
    bytes_used: u64,
    total_bytes: u64,
    fsid: [u8; 16],
    unused: [u64; 377],
    path: [u8; 1024],
}
const _: () = assert!(size_of::<BtrfsDevInfo>() == 4096);
/// `BTRFS_IOC_DEV_INFO _IOWR(0x94, 30, struct btrfs_ioctl_dev_info_args)`.
const BTRFS_IOC_DEV_INFO: libc::c_ulong =
    nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 30, size_of::<BtrfsDevInfo>());

/// (devid, the path btrfs opened it by, its size in bytes, its device uuid).
pub(crate) type BtrfsDevice = (u64, std::path::PathBuf, u64, [u8; 16]);

/// A btrfs's member devices: (devid, the path btrfs opened it by, its size in bytes,
/// its uuid), the filesystem's fsid, and FS_INFO's num_devices.
pub(crate) fn btrfs_devices(fd: BorrowedFd<'_>) -> nix::Result<(Vec<BtrfsDevice>, [u8; 16], u64)> {
    // SAFETY: all-zero bytes are a valid BtrfsFsInfo (integers and byte arrays).
    let mut info: Box<BtrfsFsInfo> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: FS_INFO writes one struct btrfs_ioctl_fs_info_args (fs/btrfs/ioctl.c,
    // btrfs_ioctl_fs_info) to a live allocation of that exact layout (size checked).
    Errno::result(unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_FS_INFO as _, &mut *info as *mut BtrfsFsInfo) })?;
    let mut out = Vec::new();
    for devid in 1..=info.max_id {
        // SAFETY: as above, for BtrfsDevInfo.
        let mut d: Box<BtrfsDevInfo> = Box::new(unsafe { std::mem::zeroed() });
        d.devid = devid;
        // SAFETY: DEV_INFO reads devid and uuid and writes one struct
        // btrfs_ioctl_dev_info_args (fs/btrfs/ioctl.c, btrfs_ioctl_dev_info) to a live
        // allocation of that exact layout (size checked).
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_DEV_INFO as _, &mut *d as *mut BtrfsDevInfo) };
        match Errno::result(rc) {
            // A devid not in use (a device removed earlier).
            Err(Errno::ENODEV) => continue,
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let len = d.path.iter().position(|&b| b == 0).unwrap_or(d.path.len());
        let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&d.path[..len]));
        out.push((devid, path, d.total_bytes, d.uuid));
    }
    Ok((out, info.fsid, info.num_devices))
}

/// Where a btrfs member keeps its primary superblock (`BTRFS_SUPER_INFO_OFFSET`,
/// fs/btrfs/disk-io.h), and how much of it to read.
pub(crate) const BTRFS_SUPER_INFO_OFFSET: u64 = 65536;
pub(crate) const BTRFS_SUPER_INFO_SIZE: usize = 4096;

/// A btrfs superblock's (fsid, dev_item.devid, dev_item.uuid); None when `sb` holds
/// none. `struct btrfs_super_block` (include/uapi/linux/btrfs_tree.h): fsid at 32,
/// magic "_BHRfS_M" at 64, dev_item at 201 (devid at +0, uuid at +66).
pub(crate) fn btrfs_super_identity(sb: &[u8]) -> Option<([u8; 16], u64, [u8; 16])> {
    if sb.get(64..72)? != b"_BHRfS_M" {
        return None;
    }
    let fsid: [u8; 16] = sb.get(32..48)?.try_into().ok()?;
    let devid = u64::from_le_bytes(sb.get(201..209)?.try_into().ok()?);
    let uuid: [u8; 16] = sb.get(267..283)?.try_into().ok()?;
    Some((fsid, devid, uuid))
}

/// `BTRFS_IOC_SCRUB_PROGRESS _IOWR(0x94, 29, struct btrfs_ioctl_scrub_args)` (1024 bytes).
const BTRFS_IOC_SCRUB_PROGRESS: libc::c_ulong = nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 29, 1024);
/// `BTRFS_IOC_BALANCE_PROGRESS _IOR(0x94, 34, struct btrfs_ioctl_balance_args)` (1024 bytes).
const BTRFS_IOC_BALANCE_PROGRESS: libc::c_ulong = nix::request_code_read!(BTRFS_IOCTL_MAGIC, 34, 1024);
/// `BTRFS_IOC_DEV_REPLACE _IOWR(0x94, 53, struct btrfs_ioctl_dev_replace_args)` (2600 bytes).
const BTRFS_IOC_DEV_REPLACE: libc::c_ulong = nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 53, 2600);
/// `BTRFS_IOCTL_DEV_REPLACE_CMD_STATUS`.
const BTRFS_DEV_REPLACE_CMD_STATUS: u64 = 1;

/// Whether a scrub runs on device `devid` (SCRUB_PROGRESS: ENOTCONN when none does).
pub(crate) fn btrfs_scrub_running(fd: BorrowedFd<'_>, devid: u64) -> nix::Result<bool> {
    let mut args = [0u64; 128];
    args[0] = devid;
    // SAFETY: SCRUB_PROGRESS reads devid and writes one 1024-byte struct
    // btrfs_ioctl_scrub_args (fs/btrfs/ioctl.c, btrfs_ioctl_scrub_progress) to a live
    // local of that size.
    match Errno::result(unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_SCRUB_PROGRESS as _, args.as_mut_ptr()) }) {
        Err(Errno::ENOTCONN) | Err(Errno::ENODEV) => Ok(false),
        Err(e) => Err(e),
        Ok(_) => Ok(true),
    }
}

/// The state of the filesystem's balance (`BTRFS_BALANCE_STATE_*`: 1 running, 2 pause
/// requested, 4 cancel requested; 0 paused), None when there is none (ENOTCONN).
pub(crate) fn btrfs_balance_state(fd: BorrowedFd<'_>) -> nix::Result<Option<u64>> {
    let mut args = [0u64; 128];
    // SAFETY: BALANCE_PROGRESS writes one 1024-byte struct btrfs_ioctl_balance_args
    // (fs/btrfs/ioctl.c, btrfs_ioctl_balance_progress) to a live local of that size.
    match Errno::result(unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_BALANCE_PROGRESS as _, args.as_mut_ptr()) }) {
        Err(Errno::ENOTCONN) => Ok(None),
        Err(e) => Err(e),
        Ok(_) => Ok(Some(args[1])),
    }
}

/// The state of the filesystem's device replace (`BTRFS_IOCTL_DEV_REPLACE_STATE_*`: 0
/// never started, 1 started, 2 finished, 3 canceled, 4 suspended).
pub(crate) fn btrfs_replace_state(fd: BorrowedFd<'_>) -> nix::Result<u64> {
    let mut args = [0u64; 325];
    args[0] = BTRFS_DEV_REPLACE_CMD_STATUS;
    // SAFETY: DEV_REPLACE reads cmd and, for STATUS, writes the result and the status
    // parameters into one 2600-byte struct btrfs_ioctl_dev_replace_args
    // (fs/btrfs/ioctl.c, btrfs_ioctl_dev_replace; fs/btrfs/dev-replace.c,
    // btrfs_dev_replace_status) in a live local of that size.
    Errno::result(unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_DEV_REPLACE as _, args.as_mut_ptr()) })?;
    Ok(args[2])
}
