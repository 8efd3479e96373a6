//! Block devices and direct I/O: the device under a path, sizes and read-only flags
//! (BLK* ioctls), direct-I/O alignment (statx), O_DIRECT and exclusive opens, positioned
//! reads, write-back of a range, and a loop device's backing file (LOOP_GET_STATUS64).

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::libc;

// include/uapi/linux/fs.h: `#define BLKGETSIZE64 _IOR(0x12,114,size_t)`.
nix::ioctl_read!(ioctl_blkgetsize64, 0x12, 114, u64);
// include/uapi/linux/fs.h: `#define BLKROGET _IO(0x12,94)` (writes an int, despite _IO).
nix::ioctl_read_bad!(ioctl_blkroget, nix::request_code_none!(0x12, 94), libc::c_int);
// include/uapi/linux/fs.h: `#define BLKSSZGET _IO(0x12,104)` (writes an int).
nix::ioctl_read_bad!(ioctl_blksszget, nix::request_code_none!(0x12, 104), libc::c_int);

/// The block device a path reads from: the device itself, or for a file, the device its
/// filesystem is on.
pub(crate) fn block_device_under(path: &Path) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::metadata(path).ok()?;
    Some(if md.file_type().is_block_device() { md.rdev() } else { md.dev() })
}

/// Size of a block device in bytes (BLKGETSIZE64).
pub(crate) fn blk_size_bytes(fd: BorrowedFd<'_>) -> nix::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 (size_t on 64-bit Linux, block/ioctl.c
    // put_u64) to the pointer, which points at a live local.
    unsafe { ioctl_blkgetsize64(fd.as_raw_fd(), &mut size) }?;
    Ok(size)
}

/// Whether the block device is read-only (BLKROGET).
pub(crate) fn blk_read_only(fd: BorrowedFd<'_>) -> nix::Result<bool> {
    let mut ro: libc::c_int = 0;
    // SAFETY: BLKROGET writes one int (block/ioctl.c put_int) to a live local.
    unsafe { ioctl_blkroget(fd.as_raw_fd(), &mut ro) }?;
    Ok(ro != 0)
}

/// Direct-I/O alignment from `statx(STATX_DIOALIGN)`: (memory, offset) in bytes.
/// `Ok(None)` when the kernel or file does not report it (older kernels, or
/// filesystems/devices without direct I/O support report 0).
pub(crate) fn statx_dio_align(path: &Path) -> nix::Result<Option<(u32, u32)>> {
    let stx = statx(path, libc::STATX_DIOALIGN)?;
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_mem_align == 0 || stx.stx_dio_offset_align == 0 {
        return Ok(None);
    }
    Ok(Some((stx.stx_dio_mem_align, stx.stx_dio_offset_align)))
}

/// statx(2) of `path`, asking for the fields in `mask`.
fn statx(path: &Path, mask: u32) -> nix::Result<libc::statx> {
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: statx is plain old data; all-zero is a valid bit pattern.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: include/uapi/linux/stat.h: statx(dirfd, path, flags, mask, *statx). The
    // path is a NUL-terminated C string alive for the call; `stx` is a live local the
    // kernel fills.
    let rc = unsafe { libc::statx(libc::AT_FDCWD, cpath.as_ptr(), 0, mask, &mut stx) };
    Errno::result(rc)?;
    Ok(stx)
}

/// A block device's direct-I/O alignment (memory, offset) and where it came from: statx
/// where the kernel tells, else the logical sector size (BLKSSZGET).
pub(crate) fn blk_dio_align(path: &Path, fd: BorrowedFd<'_>) -> nix::Result<(u32, u32, &'static str)> {
    if let Ok(Some((m, o))) = statx_dio_align(path) {
        return Ok((m, o, "statx"));
    }
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int (block/ioctl.c put_int) to a live local.
    unsafe { ioctl_blksszget(fd.as_raw_fd(), &mut size) }?;
    Ok((size as u32, size as u32, "BLKSSZGET"))
}

/// Reads `buf.len()` bytes at `offset` of `fd` (one pread; for O_DIRECT sentinels).
pub(crate) fn pread_exact(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> nix::Result<()> {
    let n = nix::sys::uio::pread(fd, buf, offset as libc::off_t)?;
    if n == buf.len() { Ok(()) } else { Err(Errno::EIO) }
}

/// `STATX_ATTR_ENCRYPTED` (include/uapi/linux/stat.h): the file is fscrypt-encrypted.
pub(crate) fn statx_encrypted(path: &Path) -> nix::Result<bool> {
    let stx = statx(path, libc::STATX_BASIC_STATS)?;
    let bit = libc::STATX_ATTR_ENCRYPTED as u64;
    Ok(stx.stx_attributes_mask & bit != 0 && stx.stx_attributes & bit != 0)
}

/// Opens a block device read-only with O_DIRECT (the page cache could hold a stale copy).
pub fn open_direct_read(node: &std::path::Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(node).map(OwnedFd::from)
}

/// Opens a device read-write with O_DIRECT, and O_EXCL when `exclusive` (an unmounted
/// device: O_EXCL fails with EBUSY while anything holds it, and keeps it unmountable).
pub fn open_direct_rw(path: &std::path::Path, exclusive: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = libc::O_DIRECT | if exclusive { libc::O_EXCL } else { 0 };
    std::fs::OpenOptions::new().read(true).write(true).custom_flags(flags).open(path)
}

/// Writes back the dirty page-cache pages of `len` bytes at `offset` of an open file or
/// block device, and waits for them (`sync_file_range` with WAIT_BEFORE, WRITE and
/// WAIT_AFTER). On a block device reseq writes with O_DIRECT, so the pages are another
/// program's buffered writes: written now, they show in the device's counters before
/// reseq writes over them, instead of inside reseq's own direct write (which writes them
/// back first, then overwrites them).
pub(crate) fn write_back_range(fd: BorrowedFd<'_>, offset: u64, len: u64) -> std::io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a plain syscall on a borrowed, open fd; it touches no memory of ours.
    let rc = unsafe { libc::sync_file_range(fd.as_raw_fd(), offset as libc::off_t, len as libc::off_t, flags) };
    Errno::result(rc).map(drop).map_err(std::io::Error::from)
}

/// Opens a device node read-only with O_NONBLOCK, which does not wait for a medium.
pub(crate) fn open_nonblocking(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)
}

/// Opens a block device read-only with O_EXCL: fails with EBUSY while anything (a mount,
/// a holder, another exclusive opener) has it, and keeps it ours while open.
pub(crate) fn open_exclusive(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(path)
}

// include/uapi/linux/loop.h: `#define LOOP_GET_STATUS64 0x4C05` (a plain number, no _IOR)
// and `struct loop_info64` (LO_NAME_SIZE 64, LO_KEY_SIZE 32).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}
const _: () = assert!(size_of::<LoopInfo64>() == 232);
nix::ioctl_read_bad!(ioctl_loop_get_status64, 0x4C05, LoopInfo64);
/// `LO_FLAGS_READ_ONLY` (include/uapi/linux/loop.h).
const LO_FLAGS_READ_ONLY: u32 = 1;

/// What a loop device is backed by, as the kernel holds it (not the path in sysfs,
/// which may be stale or from another mount namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LoopStatus {
    /// The backing file's device and inode (st_dev, st_ino): the same file whatever its
    /// path (hard links, bind mounts, a rename).
    pub(crate) file_dev: (u32, u32),
    pub(crate) file_ino: u64,
    /// The backing file's st_rdev: the device, when the loop is backed by a block device.
    pub(crate) file_rdev: (u32, u32),
    pub(crate) offset: u64,
    /// 0: up to the end of the file.
    pub(crate) size_limit: u64,
    pub(crate) read_only: bool,
}

/// `new_decode_dev` (include/linux/kdev_t.h): loop_get_status encodes the numbers with
/// `huge_encode_dev`, which is `new_encode_dev`.
fn decode_dev(d: u64) -> (u32, u32) {
    (((d & 0xfff00) >> 8) as u32, ((d & 0xff) | ((d >> 12) & 0xfff00)) as u32)
}

/// `new_encode_dev` (include/linux/kdev_t.h) of (major, minor): how GETFSMAP's
/// `fmr_device` names a device.
pub(crate) fn encode_dev((major, minor): (u32, u32)) -> u32 {
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// LOOP_GET_STATUS64 on an open loop device. `ENXIO`: no backing file attached.
pub(crate) fn loop_status(fd: BorrowedFd<'_>) -> nix::Result<LoopStatus> {
    // SAFETY: all-zero bytes are a valid LoopInfo64 (integers and byte arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: LOOP_GET_STATUS64 copies one struct loop_info64 to the pointer
    // (drivers/block/loop.c, loop_get_status64 / copy_to_user), which points at a live
    // local of that exact layout (size checked above).
    unsafe { ioctl_loop_get_status64(fd.as_raw_fd(), &mut info) }?;
    Ok(LoopStatus {
        file_dev: decode_dev(info.lo_device),
        file_ino: info.lo_inode,
        file_rdev: decode_dev(info.lo_rdevice),
        offset: info.lo_offset,
        size_limit: info.lo_sizelimit,
        read_only: info.lo_flags & LO_FLAGS_READ_ONLY != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_device_numbers_like_the_kernel() {
        assert_eq!(encode_dev((7, 0)), 0x700);
        assert_eq!(encode_dev((259, 300)), (300 & 0xff) | (259 << 8) | ((300 & !0xff) << 12));
        assert_eq!(decode_dev(u64::from(encode_dev((259, 300)))), (259, 300));
    }
}
