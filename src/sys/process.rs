//! Processes and threads: forking while single-threaded, sessions and signals, pidfds, the
//! process title, job-control stops deferred through a window, I/O priority and scheduling,
//! resource usage, capabilities, namespaces, and kcmp.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::libc;

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

/// Leave the process at once, without running atexit handlers or flushing stdio buffers
/// that were copied from the parent at fork (they would be printed twice).
pub(crate) fn exit_immediately(code: i32) -> ! {
    // SAFETY: _exit(2) is always safe to call; it does not return.
    unsafe { libc::_exit(code) }
}

// include/uapi/linux/ioprio.h: the `which` of ioprio_get/ioprio_set for a thread.
const IOPRIO_WHO_PROCESS: libc::c_long = 1;

/// Lowers this thread's I/O priority to best-effort level 7, the lowest of the normal
/// class (what `ionice -c2 -n7` does); threads started afterwards inherit it.
/// include/uapi/linux/ioprio.h: IOPRIO_CLASS_BE = 2, value = class << 13 | level.
pub(crate) fn lower_io_priority() -> nix::Result<()> {
    const IOPRIO_CLASS_BE: libc::c_long = 2;
    set_io_priority((IOPRIO_CLASS_BE << 13) | 7)
}

/// This thread's I/O priority (ioprio_get(2)), to give back with [`set_io_priority`].
pub(crate) fn io_priority() -> nix::Result<libc::c_long> {
    // SAFETY: ioprio_get(2) takes two integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    Errno::result(rc)
}

/// Sets this thread's I/O priority to a value [`io_priority`] returned.
pub(crate) fn set_io_priority(value: libc::c_long) -> nix::Result<()> {
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

/// Whether a task's flags (`/proc/PID/stat` field 9) hold PF_KTHREAD
/// (include/linux/sched.h): a kernel thread.
pub(crate) fn is_kernel_thread(flags: u64) -> bool {
    flags & 0x0020_0000 != 0
}

/// CAP_SYS_ADMIN is bit 21 of the capability sets (include/uapi/linux/capability.h):
/// FIFREEZE, FITHAW and FITRIM need it.
pub(crate) const CAP_SYS_ADMIN: u32 = 21;
/// CAP_SYS_PTRACE (bit 19): reading the open files of another user's process, or of one
/// with capabilities the reader lacks (`/proc/PID/fd`: ptrace read access).
pub(crate) const CAP_SYS_PTRACE: u32 = 19;
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

/// An open file of a task, as `stat` through its entry in the task's `fd/` directory
/// sees it (the magic link followed: the file itself).
pub(crate) struct OpenFile {
    /// The fd number, as the entry's name.
    pub(crate) name: String,
    /// None where the stat was refused (a security module may deny it for an anonymous
    /// inode where reading the link is allowed).
    pub(crate) stat: Option<nix::sys::stat::FileStat>,
}

impl OpenFile {
    /// An anonymous inode (an eventfd, an epoll, an io_uring...), or one that may be: no
    /// file type in its mode (`alloc_anon_inode`), a regular file on a filesystem with no
    /// device of its own (where a kernel might give anonymous inodes a type), or no stat.
    /// Only its link's text (`anon_inode:[io_uring]`) tells which.
    pub(crate) fn may_be_anonymous(&self) -> bool {
        self.stat.is_none_or(|st| {
            let kind = st.st_mode & libc::S_IFMT;
            kind == 0 || (kind == libc::S_IFREG && libc::major(st.st_dev) == 0)
        })
    }
}

/// The open files in a task's `fd/` directory (`/proc/PID/fd`), each `fstatat` relative
/// to the directory: one lookup, where a path walks `/proc/PID/fd/N` from the root. A
/// scan of the host's processes makes one per open fd: beside 1,000 processes holding
/// 36,000, it took 0.48 s with a `stat` and a `readlink` by path for each, 0.30 s so.
/// Those that closed meanwhile are left out. A task the kernel does not let us inspect
/// refuses every fd alike (ptrace read access, checked for the whole task: the same check
/// guards the link of its `cwd`): it is not listed, `denied`, where a stat of each fd
/// failed one by one (42 threads of 304 fds each, 12,768 failed stats and 33 ms a scan
/// for one process here). A stat and a link of one fd refused stop the listing too.
pub(crate) fn open_files(fd_dir: &std::path::Path) -> OpenFiles {
    let mut out = OpenFiles { files: Vec::new(), denied: false };
    let cwd = fd_dir.parent().map(|task| task.join("cwd"));
    if cwd.is_some_and(|c| std::fs::read_link(c).is_err_and(|e| e.raw_os_error() == Some(libc::EACCES))) {
        out.denied = true;
        return out;
    }
    let Ok(dir) = std::fs::File::open(fd_dir) else { return out };
    for e in std::fs::read_dir(fd_dir).into_iter().flatten().flatten() {
        let Ok(name) = e.file_name().into_string() else { continue };
        let stat = nix::sys::stat::fstatat(&dir, name.as_str(), nix::fcntl::AtFlags::empty());
        match stat {
            Err(Errno::ENOENT) => continue,
            Err(Errno::EACCES) if matches!(nix::fcntl::readlinkat(&dir, name.as_str()), Err(Errno::EACCES)) => {
                out.denied = true;
                break;
            }
            stat => out.files.push(OpenFile { name, stat: stat.ok() }),
        }
    }
    out
}

/// This thread alone takes user `uid` (real, effective, saved, and so the filesystem's),
/// its capabilities dropped as the kernel drops them leaving uid 0: the raw syscall, not
/// the libc wrapper, which changes every thread of the process. For tests that look at
/// other processes as an unprivileged user would.
#[cfg(test)]
pub(crate) fn thread_become(uid: u32) -> std::io::Result<()> {
    // SAFETY: setresuid takes three integers and touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, uid) };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// What [`open_files`] found.
pub(crate) struct OpenFiles {
    pub(crate) files: Vec<OpenFile>,
    /// The kernel refused to show this task's files (see [`open_files`]).
    pub(crate) denied: bool,
}
