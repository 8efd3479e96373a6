//! The crate's error type: each variant maps to one documented exit code.
//!
//! Library code returns `Error`; `cli::run` prints it with its causes ([`error_chain`]).
//! A refusal always carries a hint saying what the user can do instead.

use crate::support::exit_codes::ExitCode;

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad command-line input.
    #[error("{0}")]
    Usage(String),

    /// Acting would be unsafe. Nothing has been written when this is returned.
    #[error("refused: {reason}{}", .hint.as_ref().map(|h| format!("\n  hint: {h}")).unwrap_or_default())]
    Refused { reason: String, hint: Option<String> },

    /// An I/O error. `offset` names the device offset when one was involved.
    #[error("{context}{}", .offset.map(|o| format!(" at offset {o}")).unwrap_or_default())]
    Io {
        context: String,
        offset: Option<u64>,
        #[source]
        source: std::io::Error,
    },

    /// A chunk read back with a different blake3 than it was read with.
    #[error(
        "checksum mismatch at offset {offset} (length {len}): read-back blake3 {after} differs from {before}: {differ}. reseq did not write this range again (a failing device or another writer: writing the old bytes back could overwrite newer data){}{}",
        risk_suffix(.at_risk),
        rescue_suffix(.rescue)
    )]
    ChecksumMismatch {
        offset: u64,
        len: u64,
        before: String,
        after: String,
        differ: String,
        rescue: Option<String>,
        /// What the kernel's write records (counters, backing-file watch) leave at risk:
        /// the ranges written since they last saw no foreign write; None: no record.
        /// Boxed: the error stays small.
        at_risk: Option<Box<AtRisk>>,
    },

    /// A chunk's write failed, also when retried, or its retry did not read back right.
    #[error(
        "writing {len} bytes at offset {offset} failed {attempts} time(s) (the last: {cause}). {}{}",
        left_state(*.len, .left),
        rescue_suffix(.rescue)
    )]
    WriteFailed {
        offset: u64,
        len: u64,
        attempts: u32,
        /// Not a `source`: the message names it already.
        cause: std::io::Error,
        /// What a read-back after the last attempt found.
        left: LeftState,
        rescue: Option<String>,
    },

    /// SIGINT/SIGTERM arrived; the run stopped between chunks. The bytes are the
    /// progress's: those to rewrite, and those verified (a resumed run's earlier ones
    /// included).
    #[error(
        "interrupted by {signal} with {} of {} done, every chunk written verified; run again with --resume to continue",
        crate::support::units::human_bytes(*done_bytes),
        crate::support::units::human_bytes(*total_bytes)
    )]
    Interrupted { signal: String, done_bytes: u64, total_bytes: u64 },

    /// SIGINT/SIGTERM stopped something that is not a resumable rewrite (the FITRIM after a
    /// finished one, between slices; `bench --trim-impact`).
    #[error("stopped by {signal}: {what}")]
    Stopped { signal: String, what: String },

    /// Freeze windows went past their deadline `--max-overruns` times; the guardian thawed.
    #[error(
        "{overruns} freeze window(s) overran the {deadline_ms} ms deadline (the last: window {window}); the guardian thawed each time before any further write, and reseq stopped (--max-overruns). Run again with --resume, at a quieter time or with a longer --max-freeze"
    )]
    WindowOverrun { window: u64, overruns: u64, deadline_ms: u64 },

    /// Another program thawed reseq's freeze during a window (and may have frozen again).
    #[error(
        "the freeze of {filesystem} was lost during freeze window {window}: another program thawed it{}. reseq stopped writing at once and {}. {}. Make sure nothing else freezes this filesystem during a run (VM snapshot agents such as qemu-guest-agent fsfreeze hooks, backup tools), then run again with --resume",
        if *.foreign { " and froze it again (that freeze is not reseq's and was left in place)" } else { "" },
        if *.foreign { "did not thaw it" } else { "thawed only its own freezes" },
        written_suffix(.written)
    )]
    /// `written`: the device ranges reseq wrote in that window.
    FreezeLost { filesystem: String, window: u64, foreign: bool, written: Vec<(u64, u64)> },

    /// A window stayed frozen past its hard bound: the guardian itself was held up.
    #[error(
        "freeze window {window} lasted {frozen_ms} ms, beyond its bound of {bound_ms} ms (--max-freeze plus grace): the guardian could not end it on time (was it stopped by hand, is the host too busy for the thaw to finish in time, or is the device stalled in the kernel?). reseq stopped; every chunk written was verified; run again with --resume"
    )]
    BoundBroken { window: u64, frozen_ms: u64, bound_ms: u64 },

    /// A FIFREEZE did not return within the window's bound: its sync waits on a frozen
    /// filesystem. The guardian abandoned it and thawed the others at the bound.
    #[error(
        "freezing {filesystem} did not finish within {waited_ms} ms in freeze window {window}: its sync waits on something frozen, a filesystem it depends on (its external journal or log, or its device, on a loop device over a file there) or one frozen by another program; on a btrfs, its own scrub, balance, device add, remove or replace, or resize, which the freeze waits out. The guardian thawed {}at the bound, and thaws {filesystem} itself if that freeze completes later. Nothing was written in this window. `reseq rewrite --dry-run` shows the freeze order reseq worked out; find what else it waits on (fsfreeze, a backup or snapshot tool), then run again with --resume",
        if .thawed.is_empty() { String::new() } else { format!("{} ", .thawed) }
    )]
    FreezeStuck { filesystem: String, window: u64, waited_ms: u64, thawed: String },

    /// The kernel saw a write reseq did not make, during a window: the device's
    /// written-sectors counter grew by more than reseq wrote (see `host::written`), or the
    /// fanotify watch of a backing file reported a write (see `host::backing_watch`).
    /// `written`: every range reseq wrote since the last look that saw no such write.
    #[error(
        "another writer wrote {device} during freeze window {window}: {seen}. reseq stopped before its next write. {}. Find and stop that writer (it may be a VM, a database, a backup tool or an image updater), then run again with --resume",
        foreign_suffix(.written)
    )]
    ForeignWrite { device: String, window: u64, seen: String, written: Vec<(u64, u64)> },

    /// A bug or an impossible state.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What a failed write left on the device, as a read-back after it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeftState {
    /// The original bytes, checked by blake3.
    Intact,
    /// Other bytes (a torn write).
    Changed,
    /// Could not be read.
    Unreadable,
}

impl LeftState {
    /// From the blake3 of a read-back (None: it failed) and of the original bytes.
    pub(crate) fn of(left: Option<blake3::Hash>, original: &blake3::Hash) -> LeftState {
        match left {
            Some(h) if h == *original => LeftState::Intact,
            Some(_) => LeftState::Changed,
            None => LeftState::Unreadable,
        }
    }

    /// Why a failed write's rescue copy was kept.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            LeftState::Intact => "write failed; the device still held these bytes (checked)",
            LeftState::Changed => "write failed and left other bytes (torn write)",
            LeftState::Unreadable => "write failed; the range could not be read back",
        }
    }
}

fn left_state(len: u64, left: &LeftState) -> String {
    match left {
        LeftState::Intact => "A read-back found the original bytes there (checked by blake3): data intact".into(),
        LeftState::Changed => {
            format!("A read-back found other bytes there (a torn write): those {len} bytes are uncertain on the device")
        }
        LeftState::Unreadable => format!("The range could not be read back: those {len} bytes are uncertain"),
    }
}

fn rescue_suffix(rescue: &Option<String>) -> String {
    rescue.as_ref().map(|r| format!(". {r}")).unwrap_or_default()
}

fn written_suffix(written: &[(u64, u64)]) -> String {
    if written.is_empty() {
        return "Nothing was written in that window".into();
    }
    format!(
        "Device bytes {} were rewritten in that window, each with the bytes read in the same window; if the thaw came before a write, a write the filesystem made after the thaw could have been overwritten there: check those ranges (fsck -n, the application's own checks)",
        list_ranges(written)
    )
}

/// "A..B, C..D" of device ranges.
pub(crate) fn list_ranges(ranges: &[(u64, u64)]) -> String {
    ranges.iter().map(|(a, b)| format!("{a}..{b}")).collect::<Vec<_>>().join(", ")
}

/// The ranges reseq wrote since its last clean look, where a foreign write may have
/// been overwritten; the last of them was written after that look, where no check from
/// userspace can see a write that lands between the look and reseq's own.
fn foreign_suffix(written: &[(u64, u64)]) -> String {
    let Some(&(last_at, last_end)) = written.last() else {
        return "reseq wrote nothing since its last look found no foreign write, so none of that writer's bytes were overwritten by reseq".into();
    };
    let total: u64 = written.iter().map(|(a, b)| b - a).sum();
    format!(
        "Device bytes {} ({total} bytes in all) were written by reseq since its last look found no foreign write, each with bytes read before: where that writer wrote there in between, its newer bytes were overwritten with older ones. Every write before those was followed by a look that saw no foreign write. The last write ({last_at}..{last_end}, {} bytes) went out after that look: a write landing between a look and reseq's write cannot be seen from userspace before it. Check those ranges (fsck -n, the application's own checks)",
        list_ranges(written),
        last_end - last_at
    )
}

/// Device ranges written since the kernel's write records last saw no foreign write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtRisk(pub(crate) Vec<(u64, u64)>);

/// What a differing read-back leaves at risk, as the kernel's write records say.
fn risk_suffix(at_risk: &Option<Box<AtRisk>>) -> String {
    match at_risk.as_ref().map(|r| r.0.as_slice()) {
        None => String::new(),
        Some([]) => ". The kernel's records of writes to these bytes (the device's written-sectors counters, the fanotify watch of a loop device's backing file) saw no other writer after reseq's last write: no other writer's bytes were overwritten (a store through a shared mapping of a backing file is not in those records: the scan looks for such mappings)".into(),
        Some(ranges) => {
            format!(
                ". Device bytes {} were written since the kernel's records of writes to these bytes (the device's written-sectors counters, the fanotify watch of a loop device's backing file) last saw no other writer: if another writer caused this, its overwritten writes can only be there; check those ranges",
                list_ranges(ranges)
            )
        }
    }
}

impl Error {
    pub(crate) fn exit_code(&self) -> ExitCode {
        match self {
            Error::Usage(_) => ExitCode::Usage,
            Error::Refused { .. } => ExitCode::Refused,
            Error::Io { .. } | Error::WriteFailed { .. } => ExitCode::IoError,
            Error::ChecksumMismatch { .. } => ExitCode::ChecksumMismatch,
            Error::Interrupted { .. } | Error::Stopped { .. } => ExitCode::Interrupted,
            Error::WindowOverrun { .. } | Error::BoundBroken { .. } | Error::FreezeStuck { .. } => {
                ExitCode::WindowOverrun
            }
            Error::FreezeLost { .. } => ExitCode::FreezeLost,
            Error::ForeignWrite { .. } => ExitCode::ForeignWrite,
            Error::Internal(_) => ExitCode::Internal,
        }
    }

    /// What stopped the run, where one exit code has more than one cause (exit 7: too
    /// many overruns, the hard bound broken, a freeze stuck): the report's `outcome.cause`.
    pub(crate) fn cause(&self) -> Option<&'static str> {
        match self {
            Error::WindowOverrun { .. } => Some(crate::support::exit_codes::CAUSE_OVERRUNS),
            Error::BoundBroken { .. } => Some(crate::support::exit_codes::CAUSE_BOUND_BROKEN),
            Error::FreezeStuck { .. } => Some(crate::support::exit_codes::CAUSE_FREEZE_STUCK),
            _ => None,
        }
    }

    /// The device ranges this error leaves to check, merged, and why in a few words
    /// (None: it names none; a range checked clean is not one). A differing read-back's
    /// chunk is always one (its bytes are not what reseq wrote); the ranges the kernel's
    /// records leave at risk, where another writer's bytes may have been overwritten.
    pub(crate) fn ranges_at_risk(&self) -> Option<(Vec<(u64, u64)>, &'static str)> {
        let (ranges, why) = match self {
            Error::ChecksumMismatch { offset, len, at_risk, .. } => {
                let mut r = vec![(*offset, offset + len)];
                r.extend(at_risk.iter().flat_map(|a| a.0.iter().copied()));
                let why = match at_risk.as_deref().map(|a| a.0.is_empty()) {
                    Some(true) => "a read-back differed; no other writer wrote since reseq's last write",
                    _ => "a read-back differed",
                };
                (r, why)
            }
            Error::ForeignWrite { written, .. } if !written.is_empty() => (written.clone(), "another writer wrote"),
            Error::FreezeLost { written, .. } if !written.is_empty() => (written.clone(), "its freeze was lost"),
            _ => return None,
        };
        Some((merged(ranges), why))
    }

    /// A target the user named that cannot be used; a bare device name (`nvme0n1`) that
    /// names a node in /dev gets the path it meant.
    pub(crate) fn cannot_use(path: &std::path::Path, e: std::io::Error) -> Error {
        let dev = std::path::Path::new("/dev").join(path);
        let meant = (path.is_relative() && path.components().count() == 1 && dev.exists())
            .then(|| format!("; did you mean {}?", dev.display()));
        Error::Usage(format!("cannot use {}: {e}{}", path.display(), meant.unwrap_or_default()))
    }

    pub(crate) fn refused(reason: impl Into<String>, hint: impl Into<String>) -> Error {
        Error::Refused { reason: reason.into(), hint: Some(hint.into()) }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { context: context.into(), offset: None, source }
    }

    /// Failing to open or read an input the user named (a config, a report, a simulated
    /// drive): a name that does not exist, or a file that is not what it should be, is
    /// bad input (exit 2), no permission a refusal
    /// (exit 3); only a real I/O failure is an I/O error.
    pub(crate) fn input(what: impl Into<String>, source: std::io::Error) -> Error {
        let what = what.into();
        match source.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::InvalidData => Error::Usage(format!("{what}: {source}")),
            std::io::ErrorKind::PermissionDenied => {
                Error::refused(format!("{what}: {source}"), "run as root, or fix its permissions")
            }
            _ => Error::io(what, source),
        }
    }

    /// Where a rescue copy of the error's chunk was kept, in the error's own words.
    pub(crate) fn rescue(&self) -> Option<&str> {
        match self {
            Error::ChecksumMismatch { rescue, .. } | Error::WriteFailed { rescue, .. } => rescue.as_deref(),
            _ => None,
        }
    }

    /// Adds where the original bytes of a failed chunk were saved.
    pub(crate) fn with_rescue(mut self, text: String) -> Error {
        match &mut self {
            Error::ChecksumMismatch { rescue, .. } | Error::WriteFailed { rescue, .. } => *rescue = Some(text),
            Error::Io { context, .. } => *context = format!("{context} ({text})"),
            _ => {}
        }
        self
    }

    pub(crate) fn io_at(context: impl Into<String>, offset: u64, source: std::io::Error) -> Error {
        Error::Io { context: context.into(), offset: Some(offset), source }
    }
}

/// An error with its causes after it, each after ": " (what anyhow's `{:#}` printed).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s += &format!(": {c}");
        cur = c.source();
    }
    s
}

/// Ranges `[start, end)`, sorted, those that overlap or touch joined.
pub(crate) fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_sorted_and_those_that_touch_or_overlap_joined() {
        let got = merged(vec![(40, 50), (0, 10), (10, 20), (15, 18), (30, 35), (34, 36)]);
        assert_eq!(got, vec![(0, 20), (30, 36), (40, 50)]);
        assert!(merged(Vec::new()).is_empty());
    }

    #[test]
    fn ranges_at_risk_are_merged_and_a_checked_none_is_none() {
        let e = Error::ChecksumMismatch {
            offset: 4096,
            len: 4096,
            before: String::new(),
            after: String::new(),
            differ: String::new(),
            rescue: None,
            at_risk: Some(Box::new(AtRisk(vec![(0, 4096), (8192, 12288)]))),
        };
        assert_eq!(e.ranges_at_risk(), Some((vec![(0, 12288)], "a read-back differed")));
        let none = Error::ForeignWrite { device: "d".into(), window: 1, seen: String::new(), written: Vec::new() };
        assert_eq!(none.ranges_at_risk(), None);
        let lost =
            Error::FreezeLost { filesystem: "f".into(), window: 2, foreign: true, written: vec![(9, 12), (5, 9)] };
        assert_eq!(lost.ranges_at_risk(), Some((vec![(5, 12)], "its freeze was lost")));
    }

    #[test]
    fn a_bare_device_name_gets_the_path_it_meant() {
        let gone = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let said = |p: &str| Error::cannot_use(std::path::Path::new(p), gone()).to_string();
        assert!(said("null").ends_with("; did you mean /dev/null?"), "{}", said("null"));
        assert!(!said("no-such-device-here").contains("did you mean"));
        assert!(!said("./null").contains("did you mean"), "a path the user spelt as one stays theirs");
    }
}
