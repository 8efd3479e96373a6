//! FIFREEZE and FITHAW (include/uapi/linux/fs.h; fs/ioctl.c): a filesystem frozen and thawed.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;
use nix::libc;

// include/uapi/linux/fs.h: `#define FIFREEZE _IOWR('X', 119, int)` and
// `#define FITHAW _IOWR('X', 120, int)`. The int argument is unused by the kernel
// (fs/ioctl.c, ioctl_fsfreeze / ioctl_fsthaw), so we pass 0.
const FIFREEZE: libc::c_ulong = nix::request_code_readwrite!(b'X', 119, size_of::<libc::c_int>());
const FITHAW: libc::c_ulong = nix::request_code_readwrite!(b'X', 120, size_of::<libc::c_int>());

/// FIFREEZE on any fd of the filesystem (we use its mountpoint directory).
/// Errors the caller must tell apart: `EBUSY` (already frozen, by anyone),
/// `EOPNOTSUPP` (the filesystem has no freeze), `EPERM` (no CAP_SYS_ADMIN).
pub fn fifreeze(fd: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: FIFREEZE takes no pointer (the int argument is ignored, fs/ioctl.c);
    // `fd` is a valid open descriptor for the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FIFREEZE as _, 0) };
    Errno::result(rc).map(drop)
}

/// FITHAW. `EINVAL` means the filesystem was not frozen.
pub fn fithaw(fd: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: as for FIFREEZE: no pointer argument, valid fd.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), FITHAW as _, 0) };
    Errno::result(rc).map(drop)
}
