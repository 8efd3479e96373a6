//! What reseq and its guardian say to each other: fixed 16-byte messages, strictly
//! request and reply (the list is in [the module doc](super)), the answers decoded, the
//! guardian's exit statuses, and the bounds both ends keep.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

use nix::errno::Errno;

pub(super) const OP_FREEZE: u8 = 1;
pub(super) const OP_PERMIT: u8 = 2;
pub(super) const OP_WRITTEN: u8 = 3;
pub(super) const OP_THAW: u8 = 4;
pub(super) const OP_EXIT: u8 = 5;
pub(super) const OP_JOURNAL: u8 = 6;
/// The device whose writes PERMIT names (a path follows); the guardian opens it to
/// check, after a kill, what the writes it had granted left there.
pub(super) const OP_TARGET: u8 = 7;

pub(super) const ST_OK: u8 = 0;
pub(super) const ST_ERR: u8 = 1;
pub(super) const ST_DENIED: u8 = 2;

pub(super) const DENY_DEADLINE: u32 = 1;
pub(super) const DENY_FREEZE_LOST: u32 = 2;

/// THAW reply flags (low byte of the reply's `a`; the lost filesystem's index above).
pub(super) const THAW_OVERRAN: u32 = 1;
pub(super) const THAW_LOST: u32 = 2;
pub(super) const THAW_FOREIGN: u32 = 4;

/// The guardian's first message, unasked: what
/// [`Hardening::get`](crate::host::hardening::Hardening::get) could arrange.
pub(super) const OP_HELLO: u8 = 8;
/// Is the window's freeze still ours, and has it been since the window began? Asked
/// when the written-sectors counters grew by more than reseq wrote: growth only means
/// another writer if the filesystem was frozen all the while (it writes once thawed).
pub(super) const OP_HELD: u8 = 9;
/// Sent during FREEZE, before its reply, after each filesystem it froze (index in `a`):
/// if the guardian dies while a later freeze waits, reseq knows which to thaw.
pub(super) const OP_FROZE: u8 = 10;

/// A FREEZE failure index meaning "could not write the freeze record".
pub(super) const RECORD_FAILED: u32 = u32::MAX;

/// How long the first FIFREEZE of a window may sync before it is abandoned.
pub(super) const FIRST_FREEZE_LIMIT: Duration = Duration::from_secs(10);

/// How long a probe of a freeze we hold may take. It answers EBUSY at once; only a probe
/// that finds our freeze gone makes a fresh one and syncs. A limit taken from the
/// deadline (1 ms once it has passed) could give up on an EBUSY that a busy host merely
/// delivered late, and the freeze, taken for lost, would then never be thawed.
pub(super) const PROBE_LIMIT: Duration = Duration::from_secs(10);

/// The longest journal path the guardian accepts.
pub(super) const MAX_PATH: u32 = 4096;

/// The answer to a request to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Write now, then report `WRITTEN`.
    Granted,
    /// The window's deadline passed; the guardian has thawed. Do not write.
    DeadlinePassed,
    /// Our freeze of filesystem `index` was lost to another program during the window.
    /// `foreign`: a freeze that is not ours is in place now (thaw and re-freeze), left
    /// alone. Do not write.
    FreezeLost { index: usize, foreign: bool },
}

/// The reply to HELD.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Held {
    /// Whether the window's freeze is still ours (false: thawed at its deadline).
    Frozen(bool),
    /// As [`Permit::FreezeLost`].
    Lost { index: usize, foreign: bool },
}

pub(super) type Msg = [u8; 16];

pub(super) fn msg(op: u8, a: u32, b: u64) -> Msg {
    let mut m = [0u8; 16];
    m[0] = op;
    m[4..8].copy_from_slice(&a.to_le_bytes());
    m[8..16].copy_from_slice(&b.to_le_bytes());
    m
}

pub(super) fn fields(m: &Msg) -> (u8, u32, u64) {
    (m[0], u32::from_le_bytes(m[4..8].try_into().unwrap()), u64::from_le_bytes(m[8..16].try_into().unwrap()))
}

/// The answer to PERMIT, from its reply's fields.
pub(super) fn permit_of(st: u8, why: u32, lost: u64) -> Permit {
    match (st, why) {
        (ST_OK, _) => Permit::Granted,
        (_, DENY_FREEZE_LOST) => Permit::FreezeLost { index: (lost >> 1) as usize, foreign: lost & 1 != 0 },
        _ => Permit::DeadlinePassed,
    }
}

/// The reply to PERMIT when a freeze was lost: which filesystem, and whether the freeze
/// in place is someone else's.
pub(super) fn freeze_lost_reply((i, foreign): (usize, bool)) -> Msg {
    msg(ST_DENIED, DENY_FREEZE_LOST, ((i as u64) << 1) | u64::from(foreign))
}

/// The end of a window, from THAW's reply (`a`: flags and lost index; `micros` frozen).
pub(super) fn thaw_report_of(a: u32, micros: u64) -> ThawReport {
    let flags = a & 0xff;
    ThawReport {
        overran: flags & THAW_OVERRAN != 0,
        lost: (flags & THAW_LOST != 0).then_some(((a >> 8) as usize, flags & THAW_FOREIGN != 0)),
        frozen: Duration::from_micros(micros),
    }
}

/// The guardian's exit statuses besides 0 (read by no one but a person with `ps` or a
/// core file; none is reseq's own exit code).
pub(super) mod exit {
    /// It could not start serving: its hello or its freeze setup failed.
    pub(in crate::host::guardian) const NO_START: i32 = 70;
    /// Its socket's read timeout could not be set: it thawed and left.
    pub(in crate::host::guardian) const NO_TIMEOUT: i32 = 71;
    /// A request it does not know: it thawed and left.
    pub(in crate::host::guardian) const UNKNOWN_REQUEST: i32 = 72;
    /// It panicked and thawed.
    pub(in crate::host::guardian) const PANICKED: i32 = 73;
    /// It panicked and its thaw panicked too (`reseq thaw` acts on its record).
    pub(in crate::host::guardian) const THAW_PANICKED: i32 = 74;
}

/// Why a freeze request failed.
#[derive(Debug)]
pub(crate) enum FreezeFailure {
    /// FIFREEZE failed on filesystem `index`.
    Fifreeze { index: usize, errno: Errno },
    /// The freeze record could not be written, so nothing was frozen.
    Record { errno: Errno },
}

/// What the end of a window reports.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThawReport {
    /// The filesystems were frozen longer than the window allowed (`--max-freeze`).
    pub(crate) overran: bool,
    /// How long the filesystems were frozen (from the first FIFREEZE call to the thaw).
    pub(crate) frozen: Duration,
    /// Our freeze of filesystem `.0` was lost to another program; `.1`: a freeze that
    /// is not ours is in place and was left alone.
    pub(crate) lost: Option<(usize, bool)>,
}

/// One filesystem the guardian freezes.
pub(crate) struct Watched {
    /// Any descriptor on the filesystem (its mount point), for FIFREEZE/FITHAW.
    pub(crate) mount: OwnedFd,
    /// The mount point, for messages and the freeze record.
    pub(crate) name: String,
    /// "major:minor".
    pub(crate) dev: String,
    /// The block device (path, opened with O_DIRECT) and the offset of the 4 KiB holding
    /// the superblock; None where a freeze leaves no trace there (see module docs).
    pub(crate) sentinel: Option<(PathBuf, OwnedFd, u64)>,
}

/// Timing rules of the windows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// `--max-freeze`.
    pub(crate) window: Duration,
    /// How long past `window` an outstanding write may hold the freeze before the
    /// guardian kills reseq.
    pub(crate) grace: Duration,
}

impl Bounds {
    /// When, after the deadline, the guardian kills reseq: early enough in the grace that
    /// the kill, the wait for reseq's exit, the read-back of the granted writes and the
    /// thaw still end inside it on a busy host. Half the grace: a margin of 100 ms was
    /// not enough (6 busy loops on 2 cores: killed at 1,951 ms, thawed at 2,001 ms of a
    /// 2,000 ms bound; under a load of 12-13, a window of 2,293 ms).
    pub(crate) fn kill_after(&self) -> Duration {
        self.grace / 2
    }
}

/// A message from reseq, with what follows it.
#[derive(Debug)]
pub(super) enum Request {
    Journal(PathBuf),
    Freeze(Duration),
    Target(PathBuf),
    /// The write to be granted: device offset, length, blake3 (None: not named).
    Permit(Option<(u64, u64, [u8; 32])>),
    Held,
    Written,
    Thaw,
    Exit,
    Unknown,
}

/// Decodes a message, reading the path or hash that follows it (None: reseq is gone).
pub(super) fn read_request(stream: &mut impl Read, m: Msg) -> Option<Request> {
    let (op, a, b) = fields(&m);
    Some(match op {
        OP_JOURNAL => Request::Journal(read_path(stream, a)?),
        OP_FREEZE => Request::Freeze(Duration::from_millis(b)),
        OP_TARGET => Request::Target(read_path(stream, a)?),
        OP_PERMIT if a > 0 => {
            let mut hash = [0u8; 32];
            stream.read_exact(&mut hash).ok()?;
            Request::Permit(Some((b, u64::from(a), hash)))
        }
        OP_PERMIT => Request::Permit(None),
        OP_HELD => Request::Held,
        OP_WRITTEN => Request::Written,
        OP_THAW => Request::Thaw,
        OP_EXIT => Request::Exit,
        _ => Request::Unknown,
    })
}

/// The path of `len` bytes that follows a message.
pub(super) fn read_path(stream: &mut impl Read, len: u32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let mut path = vec![0u8; len.min(MAX_PATH) as usize];
    stream.read_exact(&mut path).ok()?;
    Some(PathBuf::from(std::ffi::OsString::from_vec(path)))
}
