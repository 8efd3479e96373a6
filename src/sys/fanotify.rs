//! fanotify: a kernel-side watch of the writes to a file (a loop device's backing file).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::libc;

/// One event of a fanotify group (`struct fanotify_event_metadata`,
/// include/uapi/linux/fanotify.h): what happened and the process that did it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FanEvent {
    pub(crate) mask: u64,
    /// The process that caused it (0 for a queue overflow).
    pub(crate) pid: i32,
}

/// `FAN_Q_OVERFLOW`: events were lost; the queue itself is the event.
pub(crate) const FAN_Q_OVERFLOW: u64 = libc::FAN_Q_OVERFLOW;

/// A fanotify group that reports (and never blocks) modifications of the inodes marked
/// in it, read without blocking: `FAN_CLASS_NOTIF | FAN_NONBLOCK | FAN_CLOEXEC`. Needs
/// CAP_SYS_ADMIN (`EPERM`); `ENOSYS` without CONFIG_FANOTIFY.
pub(crate) fn fanotify_notify_group() -> nix::Result<OwnedFd> {
    let flags = libc::FAN_CLASS_NOTIF | libc::FAN_NONBLOCK | libc::FAN_CLOEXEC;
    // SAFETY: fanotify_init takes two integers and touches no memory of ours
    // (fs/notify/fanotify/fanotify_user.c); it returns a new fd or -1 with errno.
    let fd = unsafe { libc::fanotify_init(flags, (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as u32) };
    Errno::result(fd)?;
    // SAFETY: a new fd, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Marks the inode `file` is open on in `group` for `FAN_MODIFY` (an inode mark: every
/// path and hard link of it, writes through any fd or registered file).
pub(crate) fn fanotify_mark_modify(group: BorrowedFd<'_>, file: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: with a null pathname the kernel marks the inode of `file`
    // (fanotify_find_path); both fds are open for the call; nothing else is read.
    let rc = unsafe {
        libc::fanotify_mark(group.as_raw_fd(), libc::FAN_MARK_ADD, libc::FAN_MODIFY, file.as_raw_fd(), std::ptr::null())
    };
    Errno::result(rc).map(drop)
}

/// The events queued in `group` (made by [`fanotify_notify_group`]: non-blocking), each
/// event's fd closed. Empty when none is queued.
pub(crate) fn fanotify_read(group: BorrowedFd<'_>) -> nix::Result<Vec<FanEvent>> {
    const META: usize = size_of::<libc::fanotify_event_metadata>();
    let mut events = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match nix::unistd::read(group, &mut buf) {
            Ok(n) => n,
            Err(Errno::EAGAIN) => return Ok(events),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(events);
        }
        let mut at = 0;
        while at + META <= n {
            // SAFETY: `at + META <= n` bytes of `buf` were written by the kernel as a
            // struct fanotify_event_metadata (read_unaligned: the buffer has no
            // alignment), a plain struct of integers.
            let m: libc::fanotify_event_metadata = unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
            if m.vers != libc::FANOTIFY_METADATA_VERSION || (m.event_len as usize) < META {
                return Err(Errno::EPROTO);
            }
            if m.fd >= 0 {
                // SAFETY: the kernel opened this fd for us with the event; nobody else
                // owns it, and it is closed here.
                drop(unsafe { OwnedFd::from_raw_fd(m.fd) });
            }
            events.push(FanEvent { mask: m.mask, pid: m.pid });
            at += m.event_len as usize;
        }
    }
}
