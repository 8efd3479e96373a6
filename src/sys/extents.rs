//! Where a filesystem keeps its bytes: GETFSMAP, FIEMAP, SEEK_DATA/SEEK_HOLE, FITRIM,
//! FS_IOC_FSGETXATTR, encryption (statx) and fallocate modes.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;
use nix::libc;

// include/uapi/linux/fsmap.h: struct fsmap (64 bytes) and struct fsmap_head (192 bytes
// followed by the records). Laid out here with the same field order and sizes.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct FsmapRec {
    pub(crate) device: u32,
    pub flags: u32,
    pub physical: u64,
    pub(crate) owner: u64,
    pub(crate) offset: u64,
    pub length: u64,
    reserved: [u64; 3],
}

#[repr(C)]
struct FsmapHead<const N: usize> {
    iflags: u32,
    oflags: u32,
    count: u32,
    entries: u32,
    reserved: [u64; 6],
    keys: [FsmapRec; 2],
    recs: [FsmapRec; N],
}

const _: () = assert!(size_of::<FsmapRec>() == 64);
const _: () = assert!(size_of::<FsmapHead<0>>() == 192);

/// `#define FMR_OWN_FREE FMR_OWNER(0, 1)` (include/uapi/linux/fsmap.h).
pub(crate) const FMR_OWN_FREE: u64 = 1;
/// `#define FMR_OF_LAST 0x20`: the last record of the query.
const FMR_OF_LAST: u32 = 0x20;
const FSMAP_BATCH: usize = 128;

// include/uapi/linux/fsmap.h: `#define FS_IOC_GETFSMAP _IOWR('X', 59, struct fsmap_head)`.
nix::ioctl_readwrite!(ioctl_getfsmap, b'X', 59, FsmapHead<0>);

/// All GETFSMAP records of the filesystem open at `fd` that start in
/// `[from, to)` bytes of its device, in physical order.
pub(crate) fn getfsmap(fd: BorrowedFd<'_>, from: u64, to: u64) -> nix::Result<Vec<FsmapRec>> {
    let mut head = Box::new(FsmapHead::<FSMAP_BATCH> {
        iflags: 0,
        oflags: 0,
        count: FSMAP_BATCH as u32,
        entries: 0,
        reserved: [0; 6],
        keys: [FsmapRec::default(); 2],
        recs: [FsmapRec::default(); FSMAP_BATCH],
    });
    head.keys[0].physical = from;
    // The high key: everything up to `to` on every device, any owner.
    head.keys[1] = FsmapRec {
        device: u32::MAX,
        flags: u32::MAX,
        physical: to,
        owner: u64::MAX,
        offset: u64::MAX,
        ..FsmapRec::default()
    };
    let mut out = Vec::new();
    loop {
        // SAFETY: FS_IOC_GETFSMAP reads the head and keys and writes at most `count`
        // records after them (fs/ioctl.c, ioctl_getfsmap); `head` is a live allocation of
        // FsmapHead<FSMAP_BATCH>, whose first 192 bytes are the FsmapHead<0> the request
        // code names, followed by room for exactly `count` records.
        unsafe { ioctl_getfsmap(fd.as_raw_fd(), (&mut *head as *mut FsmapHead<FSMAP_BATCH>).cast()) }?;
        let n = (head.entries as usize).min(FSMAP_BATCH);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&head.recs[..n]);
        let last = head.recs[n - 1];
        if last.flags & FMR_OF_LAST != 0 {
            break;
        }
        // fsmap_advance(): continue after the last record returned.
        head.keys[0] = last;
    }
    Ok(out)
}

/// lseek(2) with `SEEK_DATA` or `SEEK_HOLE`: the first offset at or after `at` that
/// holds data, or that is in a hole (the end of the file counts as one). None (ENXIO):
/// for data, nothing but holes from `at` to the end of the file; for a hole, `at` is at
/// or past the end of the file. A filesystem without hole tracking calls the whole file
/// data (fs/read_write.c, generic_file_llseek_size).
pub(crate) fn seek(fd: BorrowedFd<'_>, at: u64, whence: nix::unistd::Whence) -> nix::Result<Option<u64>> {
    let at = libc::off_t::try_from(at).map_err(|_| Errno::EINVAL)?;
    match nix::unistd::lseek(fd, at, whence) {
        Ok(o) => Ok(Some(o as u64)),
        Err(Errno::ENXIO) => Ok(None),
        Err(e) => Err(e),
    }
}

// include/uapi/linux/fs.h: struct fstrim_range and `#define FITRIM _IOWR('X', 121, ...)`.
#[repr(C)]
pub(crate) struct FstrimRange {
    pub(crate) start: u64,
    pub(crate) len: u64,
    pub(crate) minlen: u64,
}
nix::ioctl_readwrite!(ioctl_fitrim, b'X', 121, FstrimRange);

/// FITRIM over `[start, start + len)` of the filesystem (byte offsets on its device;
/// the kernel rounds them to whole blocks and clamps the end to the filesystem's);
/// returns the bytes the filesystem trimmed in that range. EINVAL when `start` lies past
/// the filesystem's last block or `len` is under one block; EOPNOTSUPP when the device
/// below has no discard.
pub(crate) fn fitrim_range(fd: BorrowedFd<'_>, start: u64, len: u64) -> nix::Result<u64> {
    let mut r = FstrimRange { start, len, minlen: 0 };
    // SAFETY: FITRIM reads and writes one struct fstrim_range (fs/ext4/ioctl.c,
    // fs/xfs/xfs_discard.c); `r` is a live local of that layout.
    unsafe { ioctl_fitrim(fd.as_raw_fd(), &mut r) }?;
    Ok(r.len)
}

// include/uapi/linux/fiemap.h: struct fiemap_extent (56 bytes) and struct fiemap (32
// bytes, followed by the extents).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct FiemapExtent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    pub(crate) reserved64: [u64; 2],
    pub flags: u32,
    pub(crate) reserved: [u32; 3],
}

#[repr(C)]
struct Fiemap<const N: usize> {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; N],
}

const _: () = assert!(size_of::<FiemapExtent>() == 56);
const _: () = assert!(size_of::<Fiemap<0>>() == 32);

/// `#define FIEMAP_FLAG_SYNC 0x00000001`: write dirty data back before mapping
/// (returns at once on a frozen filesystem).
pub const FIEMAP_FLAG_SYNC: u32 = 0x1;
/// `#define FIEMAP_EXTENT_LAST 0x00000001`.
pub(crate) const FIEMAP_EXTENT_LAST: u32 = 0x1;
const FIEMAP_BATCH: usize = 256;
/// `FIEMAP_EXTENT_UNWRITTEN`: allocated but never written; reads as zeros.
pub(crate) const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
/// `FIEMAP_EXTENT_SHARED`: its blocks are shared with other files (reflinks, snapshots).
pub(crate) const FIEMAP_EXTENT_SHARED: u32 = 0x2000;
/// Flags under which an extent's physical address is not where its bytes lie as they
/// read (not yet allocated, encoded, encrypted, packed with others).
const FIEMAP_EXTENT_NOT_PLAIN: [(u32, &str); 7] = [
    (0x2, "UNKNOWN"),
    (0x4, "DELALLOC"),
    (0x8, "ENCODED"),
    (0x80, "DATA_ENCRYPTED"),
    (0x100, "NOT_ALIGNED"),
    (0x200, "DATA_INLINE"),
    (0x400, "DATA_TAIL"),
];

impl FiemapExtent {
    pub(crate) fn is_unwritten(&self) -> bool {
        self.flags & FIEMAP_EXTENT_UNWRITTEN != 0
    }

    pub(crate) fn is_shared(&self) -> bool {
        self.flags & FIEMAP_EXTENT_SHARED != 0
    }

    /// The names of its flags that make its physical address unusable (see
    /// [`FIEMAP_EXTENT_NOT_PLAIN`]).
    pub(crate) fn not_plain(&self) -> Vec<&'static str> {
        FIEMAP_EXTENT_NOT_PLAIN.iter().filter(|(f, _)| self.flags & f != 0).map(|(_, n)| *n).collect()
    }
}

// include/uapi/linux/fs.h: `#define FS_IOC_FIEMAP _IOWR('f', 11, struct fiemap)`.
nix::ioctl_readwrite!(ioctl_fiemap, b'f', 11, Fiemap<0>);

/// The extents of the file open at `fd` from byte `start` on, in logical order.
pub fn fiemap(fd: BorrowedFd<'_>, start: u64, flags: u32) -> nix::Result<Vec<FiemapExtent>> {
    let mut out: Vec<FiemapExtent> = Vec::new();
    let mut from = start;
    loop {
        let mut m = Box::new(Fiemap::<FIEMAP_BATCH> {
            start: from,
            length: u64::MAX - from,
            flags,
            mapped_extents: 0,
            extent_count: FIEMAP_BATCH as u32,
            reserved: 0,
            extents: [FiemapExtent::default(); FIEMAP_BATCH],
        });
        // SAFETY: FS_IOC_FIEMAP reads the 32-byte header and writes at most
        // `extent_count` extents after it (fs/ioctl.c, ioctl_fiemap / fiemap_fill_next_extent);
        // `m` is a live FiemapHead<FIEMAP_BATCH> with room for exactly that many.
        unsafe { ioctl_fiemap(fd.as_raw_fd(), (&mut *m as *mut Fiemap<FIEMAP_BATCH>).cast()) }?;
        let n = (m.mapped_extents as usize).min(FIEMAP_BATCH);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&m.extents[..n]);
        let last = m.extents[n - 1];
        if last.flags & FIEMAP_EXTENT_LAST != 0 || n < FIEMAP_BATCH {
            break;
        }
        from = last.logical + last.length;
    }
    Ok(out)
}

/// struct fsxattr (include/uapi/linux/fs.h), for FS_IOC_FSGETXATTR.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Fsxattr {
    fsx_xflags: u32,
    fsx_extsize: u32,
    fsx_nextents: u32,
    fsx_projid: u32,
    fsx_cowextsize: u32,
    fsx_pad: [u8; 8],
}

// include/uapi/linux/fs.h: `#define FS_IOC_FSGETXATTR _IOR('X', 31, struct fsxattr)`.
nix::ioctl_read!(ioctl_fsgetxattr, b'X', 31, Fsxattr);

/// FS_XFLAG_REALTIME: the file's data lives on the filesystem's realtime device (xfs).
pub const FS_XFLAG_REALTIME: u32 = 0x1;

/// The extended flags (`fsx_xflags`) of the file open at `fd`.
pub fn fs_xflags(fd: BorrowedFd<'_>) -> nix::Result<u32> {
    let mut x = Fsxattr::default();
    // SAFETY: the kernel fills a struct fsxattr we own, of the size the request encodes.
    unsafe { ioctl_fsgetxattr(fd.as_raw_fd(), &mut x) }?;
    Ok(x.fsx_xflags)
}

/// What a `fallocate` mode asks of a file (include/uapi/linux/falloc.h), whether or not
/// it keeps the size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fallocate {
    /// Allocate the range.
    Allocate,
    /// Punch a hole or zero the range: what a loop device sends for a discard.
    Discard,
    Other,
}

pub(crate) fn fallocate_mode(mode: i32) -> Fallocate {
    match mode & !libc::FALLOC_FL_KEEP_SIZE {
        0 => Fallocate::Allocate,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE => Fallocate::Discard,
        _ => Fallocate::Other,
    }
}
