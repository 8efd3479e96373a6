//! The guardian: a forked process that owns every freeze reseq makes, so that no way
//! of dying or stalling leaves a filesystem frozen past a stated bound.
//!
//! Why a process and not a thread or a signal handler: SIGKILL runs no handler and kills
//! every thread, and SIGSTOP stops them all, while a freeze outlives its maker (see
//! docs/SAFETY.md). Only another process can thaw after that. Why the guardian freezes
//! (not reseq): then it knows exactly which freezes are its own. If reseq froze and died
//! before telling it, the guardian could not tell our freeze from an admin's, and must
//! never thaw the latter.
//!
//! Out of reach of what is aimed at reseq: the guardian runs in its own session and
//! process group (a terminal's Ctrl-Z, `timeout`, `kill -- -PGID` miss it), ignores
//! job-control and termination signals, and renames itself `freeze-guardian` (name and
//! command line), so `pkill reseq`, `pkill -f reseq` and `killall reseq` miss it too.
//!
//! Protocol (a Unix socket pair, fixed 16-byte messages, strictly request/reply):
//! - `JOURNAL len` + `len` bytes: the journal to note a kill in (see below).
//! - `FREEZE ms`: record the freeze (see [`crate::host::freeze_record`]), freeze every
//!   filesystem in order; undo and report the first failure. The window's clock starts
//!   *before* the first FIFREEZE: the stall applications see starts there.
//! - `PERMIT`: reseq asks before each device write. Granted only while every freeze is
//!   still ours and the deadline has not passed. A refusal after the deadline makes the
//!   guardian thaw at once. Because reseq reads a chunk before asking and writes it only
//!   after a grant, a chunk's read and write always lie inside one freeze.
//! - `WRITTEN`: one granted write finished, and its read-back too. While any is
//!   outstanding the guardian does not thaw: thawing under an in-flight write of stale
//!   bytes could let the filesystem's newer write lose. It waits for them until the
//!   deadline plus the grace; then it kills reseq (SIGKILL through a pidfd, which also
//!   ends a stopped process), waits for the socket's end of file, and thaws.
//! - `THAW`: end the window; the reply says whether it overran `--max-freeze`, how long
//!   the filesystems were frozen, and whether a freeze was lost to another program.
//! - `EXIT`: leave.
//!
//! End of file on the socket means reseq is gone. The socket closes only when the last
//! thread of reseq has exited, and a process cannot exit while its O_DIRECT I/O is in
//! flight, so at EOF nothing of reseq's can still reach the device: the guardian thaws
//! and exits. The one wait the guardian cannot bound is I/O the kernel itself cannot
//! finish (a task in D state on a failing device).
//!
//! Someone else's freeze: FIFREEZE's EBUSY means "frozen by anyone", so a program that
//! thaws our freeze and freezes again would pass that probe. The guardian also keeps a
//! sentinel: the device block holding the superblock, read with O_DIRECT after
//! freezing. ext4 and xfs write their superblock on every freeze, so a changed sentinel
//! means the freeze in place is not ours: stop granting, and never thaw it.
//!
//! The guardian never execs and writes nothing while a filesystem is frozen (its stderr
//! could be a file on that filesystem): it speaks only after thawing.
//!
//! Its files: [`protocol`] (the messages, their answers, the exit statuses, the
//! bounds), [`client`] (reseq's end) and `serve` (the guardian's: its state machine).

/// stderr without panicking: it may be a closed pipe or a hung-up terminal, and the
/// guardian must go on to thaw and exit whatever happens to it.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub(crate) mod client;
pub(crate) mod protocol;
mod serve;
