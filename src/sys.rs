//! Every `unsafe` block and every ioctl of the crate lives here.
//!
//! Why one module: the rest of the crate is `#![deny(unsafe_code)]`, so a reviewer
//! checking memory safety or the exact kernel ABI we rely on reads this file and nothing
//! else. Each call cites the kernel header that defines it. The wrappers return
//! `nix::Result` (an errno) so callers can tell `EBUSY` from `EOPNOTSUPP`: for freezes
//! those errnos are the only signal the kernel gives (docs/SAFETY.md).
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::libc;

// include/uapi/linux/fs.h: `#define FIFREEZE _IOWR('X', 119, int)` and
// `#define FITHAW _IOWR('X', 120, int)`. The int argument is unused by the kernel
// (fs/ioctl.c, ioctl_fsfreeze / ioctl_fsthaw), so we pass 0.
const FIFREEZE: libc::c_ulong = nix::request_code_readwrite!(b'X', 119, size_of::<libc::c_int>());
const FITHAW: libc::c_ulong = nix::request_code_readwrite!(b'X', 120, size_of::<libc::c_int>());

// include/uapi/linux/fs.h: `#define BLKGETSIZE64 _IOR(0x12,114,size_t)`.
nix::ioctl_read!(ioctl_blkgetsize64, 0x12, 114, u64);
// include/uapi/linux/fs.h: `#define BLKROGET _IO(0x12,94)` (writes an int, despite _IO).
nix::ioctl_read_bad!(ioctl_blkroget, nix::request_code_none!(0x12, 94), libc::c_int);
// include/uapi/linux/fs.h: `#define BLKSSZGET _IO(0x12,104)` (writes an int).
nix::ioctl_read_bad!(ioctl_blksszget, nix::request_code_none!(0x12, 104), libc::c_int);

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

const PAGE: usize = 4096;

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

/// A buffer whose address is aligned for O_DIRECT.
///
/// We never fall back to buffered I/O when an aligned transfer is refused (unlike
/// uutils `dd`): the buffer is aligned from the start, and an `EINVAL` is an error.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

/// Where an [`AlignedBuf`]'s memory comes from.
enum Backing {
    Heap(Layout),
    /// An anonymous mapping of exactly the buffer's length (whole huge pages).
    Mapped,
}

/// A transparent huge page on x86-64 and arm64 with 4 KiB base pages. Elsewhere (64 KiB
/// base pages) such buffers are still correct, only without huge pages.
const HUGE_PAGE: usize = 2 << 20;

// SAFETY: AlignedBuf owns its allocation exclusively (like Vec<u8>); nothing is shared.
unsafe impl Send for AlignedBuf {}
// SAFETY: &AlignedBuf only gives &[u8]; no interior mutability.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to `align` (a power of two), and at least to
    /// a page: a buffer that is only sector-aligned straddles one more page than its
    /// length needs, so a 1 MiB direct read needs 257 segments, one more than many
    /// queues take, and the block layer splits it.
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        assert!(len > 0, "empty aligned buffer");
        let layout = Layout::from_size_align(len, align.max(PAGE)).expect("alignment is a power of two");
        // SAFETY: layout has a non-zero size (asserted above).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, backing: Backing::Heap(layout) }
    }

    /// A zeroed buffer for the rewrite's own transfers: from 2 MiB on, on transparent
    /// huge pages where the kernel has them (`madvise`, the default policy, gives them
    /// only to memory that asks). A direct transfer takes one segment per physically
    /// contiguous run of its buffer: on 4 KiB pages a request holds at most
    /// `max_segments` pages (254 on a virtio disk: 1 MiB), on huge pages up to
    /// `max_sectors_kb` (4 MiB there), and 64 MiB reads and writes in place on that disk
    /// took 0.4-0.6 s a GiB against 0.8-1.5 s. Every page is touched here, so the
    /// faults (and any compaction they wait for) happen now, never inside a window:
    /// make these before a window starts. Without huge pages these are the faults
    /// [`AlignedBuf::new`] takes, made earlier. Only whole huge pages: another length
    /// would map more than the plan's memory figure counts.
    pub(crate) fn for_transfers(len: usize, align: usize) -> AlignedBuf {
        if len == 0 || !len.is_multiple_of(HUGE_PAGE) || !align.is_power_of_two() || align > HUGE_PAGE {
            return AlignedBuf::new(len, align);
        }
        match map_huge(len) {
            Some(ptr) => AlignedBuf { ptr, len, backing: Backing::Mapped },
            None => AlignedBuf::new(len, align),
        }
    }
}

/// `len` bytes (whole huge pages) of anonymous memory at a huge page's address, advised
/// to be huge pages and not to be copied into a forked child, every page touched. None
/// if the kernel refuses the mapping.
fn map_huge(len: usize) -> Option<NonNull<u8>> {
    use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap_anonymous, munmap};
    let over = len.checked_add(HUGE_PAGE)?;
    let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
    // SAFETY: a fresh private anonymous mapping at an address the kernel picks aliases
    // nothing; `over` is non-zero.
    let raw = unsafe { mmap_anonymous(None, std::num::NonZeroUsize::new(over)?, prot, MapFlags::MAP_PRIVATE) }.ok()?;
    let base = raw.as_ptr() as usize;
    let start = base.next_multiple_of(HUGE_PAGE);
    let (head, tail) = (start - base, base + over - (start + len));
    // SAFETY: [base, base + over) is the mapping just made: the head before `start` and
    // the tail after `start + len` are parts of it no one else has seen.
    // A failure there leaves those bytes mapped, unused: wasted, not wrong.
    unsafe {
        if head > 0 {
            let _ = munmap(raw, head);
        }
        if let Some(after) = NonNull::new((start + len) as *mut libc::c_void).filter(|_| tail > 0) {
            let _ = munmap(after, tail);
        }
    }
    let ptr = NonNull::new(start as *mut u8)?;
    // SAFETY: [start, start + len) is mapped and ours. Without THP in the kernel the
    // advice fails (EINVAL) and the pages are small: still correct.
    let _ = unsafe { madvise(ptr.cast(), len, MmapAdvise::MADV_HUGEPAGE) };
    // A child forked while these exist (the guardian is forked before them) never uses
    // them: shared copy-on-write, the parent's next read into one would copy it, page by
    // page, inside a window.
    // SAFETY: as above; only this process's own use of the range follows.
    let _ = unsafe { madvise(ptr.cast(), len, MmapAdvise::MADV_DONTFORK) };
    for page in (0..len).step_by(PAGE) {
        // SAFETY: inside the mapping; writing the zero it holds faults the page in.
        unsafe { std::ptr::write_volatile(ptr.as_ptr().add(page), 0) };
    }
    Some(ptr)
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of at least len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated in `new` with exactly this layout, freed once.
            Backing::Heap(layout) => unsafe { dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: mapped in `map_huge` with exactly this length, unmapped once.
            Backing::Mapped => {
                let _ = unsafe { nix::sys::mman::munmap(self.ptr.cast(), self.len) };
            }
        }
    }
}

/// fork(2), only from a single-threaded process.
///
/// After fork in a multi-threaded process the child may only call async-signal-safe
/// functions (a lock held by another thread stays locked forever). The guardian
/// allocates and uses std, so we refuse to fork unless this is the only thread.
pub(crate) fn fork_single_threaded() -> std::io::Result<nix::unistd::ForkResult> {
    // Threads that were just joined may linger in /proc for a moment after join returns.
    let mut threads = std::fs::read_dir("/proc/self/task")?.count();
    for _ in 0..100 {
        if threads == 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        threads = std::fs::read_dir("/proc/self/task")?.count();
    }
    if threads != 1 {
        return Err(std::io::Error::other(format!(
            "refusing to fork the guardian from a process with {threads} threads"
        )));
    }
    // SAFETY: the process has exactly one thread (checked just above, and nothing in
    // between starts one), so the child inherits no lock held by another thread.
    Ok(unsafe { nix::unistd::fork() }?)
}

/// Ignore the signals that a terminal or a service manager sends to a whole process
/// group, so that the guardian outlives a Ctrl-C aimed at reseq and thaws after it; and
/// the job-control stops (Ctrl-Z, a background read or write on the terminal), which
/// would otherwise stop the guardian while it holds a freeze.
pub(crate) fn ignore_group_signals() -> nix::Result<()> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGPIPE,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ] {
        // SAFETY: SigIgn installs no handler code, so no async-signal-safety concern.
        unsafe { signal(sig, SigHandler::SigIgn) }?;
    }
    Ok(())
}

/// setsid(2): a new session and process group, without a controlling terminal, so that
/// signals aimed at reseq's group (a terminal's Ctrl-Z, `timeout`, `kill -- -PGID`) do
/// not reach the caller.
pub(crate) fn new_session() -> nix::Result<()> {
    nix::unistd::setsid().map(drop)
}

/// pidfd_open(2): a descriptor that names process `pid` for as long as it is held, so a
/// later signal can never reach another process that reused the number.
pub(crate) fn pidfd_open(pid: i32) -> nix::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = Errno::result(rc)?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// SIGKILL through a pidfd (pidfd_send_signal(2)). SIGKILL also ends a stopped process.
pub(crate) fn pidfd_kill(pidfd: BorrowedFd<'_>) -> nix::Result<()> {
    // SAFETY: pidfd_send_signal(pidfd, sig, NULL info, 0 flags): integers and a null
    // pointer, which the kernel reads as "like kill(2)".
    let rc = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), libc::SIGKILL, std::ptr::null::<u8>(), 0)
    };
    Errno::result(rc).map(drop)
}

/// Sets the process name (`comm`, what `ps -o comm`, `pkill` and `killall` match, at
/// most 15 bytes) and overwrites the command line (`/proc/PID/cmdline`, what `ps -f`
/// and `pkill -f` match) with `title`. The guardian uses it to carry a name that
/// `pkill reseq` cannot reach. The title is cut to fit the original arguments.
pub(crate) fn set_process_title(title: &str) -> std::io::Result<()> {
    let comm = CString::new(&title.as_bytes()[..title.len().min(15)]).map_err(std::io::Error::other)?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from the
    // pointer (kernel/sys.c); `comm` is one, alive for the call.
    let rc = unsafe { libc::prctl(libc::PR_SET_NAME, comm.as_ptr() as libc::c_ulong, 0, 0, 0) };
    Errno::result(rc)?;
    // /proc/self/stat fields 48 and 49 (proc(5)): the argument block's addresses.
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_comm = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<usize>().ok());
    let (Some(start), Some(end)) = (field(48), field(49)) else {
        return Err(std::io::Error::other("no argument block in /proc/self/stat"));
    };
    if start == 0 || end <= start + 1 {
        return Ok(());
    }
    let len = end - start;
    let n = title.len().min(len - 1);
    // SAFETY: [start, end) is this process's argument block, which the kernel copied
    // onto the stack at exec and which stays mapped and writable for the process's
    // life (setproctitle(3) implementations write it the same way). We stay inside it
    // and leave its last byte NUL, so argv stays a list of C strings.
    unsafe {
        std::ptr::write_bytes(start as *mut u8, 0, len);
        std::ptr::copy_nonoverlapping(title.as_ptr(), start as *mut u8, n);
    }
    Ok(())
}

/// Set while a freeze window is open: a job-control stop then waits for its end.
static IN_WINDOW: AtomicBool = AtomicBool::new(false);
/// A job-control stop arrived during a window and is still to be taken.
static STOP_PENDING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_job_control_stop(_sig: libc::c_int) {
    if IN_WINDOW.load(Ordering::SeqCst) {
        STOP_PENDING.store(true, Ordering::SeqCst);
        // The window may have ended (on another thread) since the check above, after
        // `leave_window` looked for a pending stop: then take it here. The swap makes
        // sure exactly one of the two takes it.
        if !IN_WINDOW.load(Ordering::SeqCst) && STOP_PENDING.swap(false, Ordering::SeqCst) {
            // SAFETY: raise(3) is async-signal-safe.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    } else {
        // SAFETY: raise(3) is async-signal-safe; SIGSTOP stops every thread at once.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
}

/// Catches SIGTSTP (Ctrl-Z): outside a freeze window it stops the process at once, as
/// by default; inside one the stop waits until [`leave_window`], after the thaw. A
/// stopped process keeps the freezes it asked for, so a Ctrl-Z that stopped reseq
/// mid-window would stall the host until `fg`. SIGTTIN and SIGTTOU (a background job
/// touching the terminal) are ignored: then a terminal write just proceeds, even with
/// `stty tostop`, where a caught SIGTTOU would make the write restart forever.
pub(crate) fn defer_job_control_stops() -> nix::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction, signal};
    let action = SigAction::new(SigHandler::Handler(on_job_control_stop), SaFlags::SA_RESTART, SigSet::empty());
    // SAFETY: the handler only touches atomics and calls raise(3), both
    // async-signal-safe.
    unsafe { sigaction(Signal::SIGTSTP, &action) }?;
    for sig in [Signal::SIGTTIN, Signal::SIGTTOU] {
        // SAFETY: SigIgn installs no handler code.
        unsafe { signal(sig, SigHandler::SigIgn) }?;
    }
    Ok(())
}

/// A freeze window begins: job-control stops are deferred until [`leave_window`].
pub(crate) fn enter_window() {
    IN_WINDOW.store(true, Ordering::SeqCst);
}

/// The window is over and thawed: take a job-control stop that arrived during it.
/// Returns whether the process was stopped (and has been continued since).
pub(crate) fn leave_window() -> bool {
    IN_WINDOW.store(false, Ordering::SeqCst);
    if STOP_PENDING.swap(false, Ordering::SeqCst) {
        // SAFETY: raise(3) with a valid signal number; it returns after SIGCONT.
        unsafe { libc::raise(libc::SIGSTOP) };
        return true;
    }
    false
}

/// Reads `buf.len()` bytes at `offset` of `fd` (one pread; for O_DIRECT sentinels).
pub(crate) fn pread_exact(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> nix::Result<()> {
    let n = nix::sys::uio::pread(fd, buf, offset as libc::off_t)?;
    if n == buf.len() { Ok(()) } else { Err(Errno::EIO) }
}

/// Leave the process at once, without running atexit handlers or flushing stdio buffers
/// that were copied from the parent at fork (they would be printed twice).
pub(crate) fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit(2) is always safe to call; it does not return.
    unsafe { libc::_exit(code) }
}

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

/// lseek(2) with `SEEK_DATA`: the first offset at or after `at` that holds data. None
/// (ENXIO): nothing but holes from `at` to the end of the file. A filesystem without
/// hole tracking calls the whole file data (fs/read_write.c, generic_file_llseek_size).
pub(crate) fn seek_data(fd: BorrowedFd<'_>, at: u64) -> nix::Result<Option<u64>> {
    seek(fd, at, nix::unistd::Whence::SeekData)
}

/// lseek(2) with `SEEK_HOLE`: the first offset at or after `at` in a hole (the end of the
/// file counts as one). None (ENXIO): `at` is at or past the end of the file.
pub(crate) fn seek_hole(fd: BorrowedFd<'_>, at: u64) -> nix::Result<Option<u64>> {
    seek(fd, at, nix::unistd::Whence::SeekHole)
}

fn seek(fd: BorrowedFd<'_>, at: u64, whence: nix::unistd::Whence) -> nix::Result<Option<u64>> {
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

/// `STATX_ATTR_ENCRYPTED` (include/uapi/linux/stat.h): the file is fscrypt-encrypted.
pub(crate) fn statx_encrypted(path: &Path) -> nix::Result<bool> {
    let stx = statx(path, libc::STATX_BASIC_STATS)?;
    let bit = libc::STATX_ATTR_ENCRYPTED as u64;
    Ok(stx.stx_attributes_mask & bit != 0 && stx.stx_attributes & bit != 0)
}

/// Lowers this thread's I/O priority to best-effort level 7, the lowest of the normal
/// class (what `ionice -c2 -n7` does); threads started afterwards inherit it.
/// include/uapi/linux/ioprio.h: IOPRIO_WHO_PROCESS = 1, IOPRIO_CLASS_BE = 2,
/// value = class << 13 | level.
pub(crate) fn lower_io_priority() -> nix::Result<()> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_BE: libc::c_long = 2;
    // SAFETY: ioprio_set(2) takes three integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, (IOPRIO_CLASS_BE << 13) | 7) };
    Errno::result(rc).map(drop)
}

/// This thread's I/O priority (ioprio_get(2)), to give back with [`set_io_priority`].
pub(crate) fn io_priority() -> nix::Result<libc::c_long> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    // SAFETY: ioprio_get(2) takes two integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    Errno::result(rc)
}

/// Sets this thread's I/O priority to a value [`io_priority`] returned.
pub(crate) fn set_io_priority(value: libc::c_long) -> nix::Result<()> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    // SAFETY: ioprio_set(2) takes three integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, value) };
    Errno::result(rc).map(drop)
}

/// This process's peak resident set (getrusage's `ru_maxrss`, kept by the kernel in KiB).
pub(crate) fn peak_resident_bytes() -> nix::Result<u64> {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)?;
    Ok(usage.max_rss() as u64 * 1024)
}

/// Ends the process with SIGABRT and no core dump. A core is written where the process
/// runs, which may be the filesystem reseq froze: the dump would wait for the thaw, and
/// the guardian, which thaws when reseq is gone, would wait for the dump.
pub(crate) fn abort_without_core() -> ! {
    let _ = nix::sys::prctl::set_dumpable(false);
    std::process::abort()
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

/// Whether a task's flags (`/proc/PID/stat` field 9) hold PF_KTHREAD
/// (include/linux/sched.h): a kernel thread.
pub(crate) fn is_kernel_thread(flags: u64) -> bool {
    flags & 0x0020_0000 != 0
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

/// CAP_SYS_ADMIN is bit 21 of the capability sets (include/uapi/linux/capability.h):
/// FIFREEZE, FITHAW and FITRIM need it.
pub(crate) const CAP_SYS_ADMIN: u32 = 21;
/// CAP_IPC_LOCK (bit 14): mlock beyond RLIMIT_MEMLOCK.
pub(crate) const CAP_IPC_LOCK: u32 = 14;
/// CAP_SYS_RESOURCE (bit 24): lowering oom_score_adj.
pub(crate) const CAP_SYS_RESOURCE: u32 = 24;

/// The inode of the initial cgroup namespace (include/linux/proc_ns.h:
/// `PROC_CGROUP_INIT_INO = 0xEFFFFFFB`): `/proc/self/ns/cgroup` names another one inside
/// a container's cgroup namespace, where the groups above reseq's own are out of sight.
pub(crate) const CGROUP_NS_INIT_INO: u64 = 0xEFFF_FFFB;

/// The inode of the initial PID namespace (`PROC_PID_INIT_INO = 0xEFFFFFFC`): in another,
/// the death of the namespace's first process kills every process in it.
pub(crate) const PID_NS_INIT_INO: u64 = 0xEFFF_FFFC;

/// The scheduling of a thread: real-time FIFO at a priority, or the normal class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheduling {
    Fifo(i32),
    Normal,
    /// A policy and priority as `sched_getscheduler` gave them.
    Raw(i32, i32),
}

/// The highest SCHED_FIFO priority (99 on Linux).
pub(crate) fn fifo_max_priority() -> i32 {
    // SAFETY: sched_get_priority_max(2) takes an integer and touches no memory.
    unsafe { libc::sched_get_priority_max(libc::SCHED_FIFO) }
}

/// sched_setscheduler(2) on thread `tid` (0: the caller): SCHED_FIFO at a priority, or
/// back to SCHED_OTHER. EPERM where the host allows no real-time scheduling (no
/// CAP_SYS_NICE and RLIMIT_RTPRIO 0, systemd's RestrictRealtime=, an RT group budget of 0).
pub(crate) fn set_scheduling_of(tid: i32, s: Scheduling) -> nix::Result<()> {
    let (policy, priority) = match s {
        Scheduling::Fifo(p) => (libc::SCHED_FIFO, p),
        Scheduling::Normal => (libc::SCHED_OTHER, 0),
        Scheduling::Raw(policy, p) => (policy, p),
    };
    let param = libc::sched_param { sched_priority: priority };
    // SAFETY: `param` is a valid sched_param that lives for the call.
    let rc = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    Errno::result(rc).map(drop)
}

/// The calling thread's policy and priority as they are, to be given back with
/// [`set_scheduling_of`] (SCHED_IDLE or SCHED_BATCH stay so; the nice value is kept).
pub(crate) fn thread_scheduling() -> Scheduling {
    // SAFETY: sched_getscheduler(2) takes an integer; pid 0 is the caller.
    let policy = unsafe { libc::sched_getscheduler(0) };
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, writable sched_param for the call.
    let rc = unsafe { libc::sched_getparam(0, &mut param) };
    if policy < 0 || rc != 0 { Scheduling::Normal } else { Scheduling::Raw(policy, param.sched_priority) }
}

/// mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT): every page the process has touched
/// stays in memory, and so does every page it touches later, without faulting in the
/// rest of a copied address space (a forked guardian would otherwise duplicate reseq's
/// untouched heap). EPERM/ENOMEM without CAP_IPC_LOCK beyond RLIMIT_MEMLOCK.
pub(crate) fn lock_touched_memory() -> nix::Result<()> {
    // SAFETY: mlockall(2) takes flags and touches no memory of ours.
    let rc = unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE | libc::MCL_ONFAULT) };
    Errno::result(rc).map(drop)
}

/// mlock(2) of `len` bytes at `addr`, faulting them in: for the executable's own code,
/// so that a deadline path never waits for a page of it to be read from disk.
pub(crate) fn lock_range(addr: usize, len: usize) -> nix::Result<()> {
    // SAFETY: mlock(2) only changes the residency of the pages of [addr, addr+len); an
    // unmapped range gives ENOMEM, it reads and writes no memory of ours.
    let rc = unsafe { libc::mlock(addr as *const libc::c_void, len) };
    Errno::result(rc).map(drop)
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

/// `KCMP_FILES` (include/uapi/linux/kcmp.h): do two tasks share one file table?
const KCMP_FILES: libc::c_int = 2;

/// Whether tasks `a` and `b` share one file table (`kcmp(2)`, `KCMP_FILES`): Some(true)
/// if so; None where the kernel cannot say (no CONFIG_KCMP, a task gone, EPERM).
pub(crate) fn same_file_table(a: i32, b: i32) -> Option<bool> {
    // SAFETY: kcmp takes two pids, a type and two unused integers; it touches no memory
    // of ours (kernel/kcmp.c). Returns 0 equal, 1 or 2 ordered, 3 not comparable.
    let rc = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FILES, 0usize, 0usize) };
    (rc >= 0).then_some(rc == 0)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_device_numbers_like_the_kernel() {
        assert_eq!(encode_dev((7, 0)), 0x700);
        assert_eq!(encode_dev((259, 300)), (300 & 0xff) | (259 << 8) | ((300 & !0xff) << 12));
        assert_eq!(decode_dev(u64::from(encode_dev((259, 300)))), (259, 300));
    }

    /// A transfer buffer of whole huge pages is mapped at a huge page's address, zeroed
    /// and writable to its last byte, and unmapped when dropped (the address range is
    /// free again); another length, or a larger alignment, comes from the heap.
    #[test]
    fn transfer_buffers_are_whole_huge_pages_or_from_the_heap() {
        for len in [HUGE_PAGE, 3 * HUGE_PAGE, 32 * HUGE_PAGE] {
            let mut b = AlignedBuf::for_transfers(len, 4096);
            assert!(matches!(b.backing, Backing::Mapped), "{len}");
            assert_eq!((b.len(), b.as_ptr() as usize % HUGE_PAGE), (len, 0));
            assert!(b.iter().all(|&x| x == 0));
            b[len - 1] = 7;
            b[0] = 9;
            assert_eq!((b[0], b[len - 1]), (9, 7));
        }
        // Dropped, each is unmapped: 2 GiB made and dropped leave the resident set as it
        // was (less than 1 GiB of growth, whatever the tests beside this one allocate).
        let rss = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_string();
            line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
        };
        let before = rss();
        for _ in 0..32 {
            drop(AlignedBuf::for_transfers(32 * HUGE_PAGE, 4096));
        }
        assert!(rss() < before + (1 << 30), "{} bytes resident after, {before} before", rss());
        for (len, align) in [(HUGE_PAGE + 4096, 4096), (4096, 4096), (4 * HUGE_PAGE, 2 * HUGE_PAGE)] {
            let b = AlignedBuf::for_transfers(len, align);
            assert!(matches!(b.backing, Backing::Heap(_)), "{len} aligned to {align}");
            assert_eq!((b.len(), b.as_ptr() as usize % align), (len, 0));
        }
    }
}
