//! The crash journal: what a run set out to do and which chunks are finished.
//!
//! One append-only text file per device in the state directory. Each line is
//! `<blake3 of the JSON, hex> <JSON>`, so a torn last line (power cut mid-append) is
//! recognised and ignored on replay, and a damaged line in the middle stops the replay
//! there rather than trusting what follows (as bupstash does with its checksummed log).
//!
//! Records: `run` (identity, chunk size, range: the plan), `begin` (the chunk about to
//! be written, as offset and length, and the blake3 it was read with; not fsynced:
//! advisory), `done` (chunk finished: written, flushed, verified; fsynced in batches, at
//! each commit), `finished`. Chunks are recorded by offset, not index, because a plan
//! that skips ranges (free space, holes) chunks differently from window to window.
//!
//! When the state directory lies on a filesystem that reseq freezes, records are kept
//! in memory during the window and written after the thaw: writing there while frozen
//! would block reseq forever.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::identity::DeviceIdentity;
use crate::support::atomic;
use crate::support::error::{Error, Result};

pub(crate) const JOURNAL_VERSION: u32 = 2;

/// What a run set out to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    pub(crate) version: u32,
    pub(crate) identity: DeviceIdentity,
    pub(crate) chunk_size_bytes: u64,
    pub(crate) range_start_bytes: u64,
    pub(crate) range_end_bytes: u64,
    pub(crate) chunks_total: u64,
    pub(crate) started_at: String,
    /// File mode: the files of the run, where each lies in its virtual address space.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) files: Vec<Placed>,
    /// Device mode: the options the run was started with (`--resume` keeps them).
    #[serde(default)]
    pub(crate) options: Option<crate::options::rewrite::RunOptions>,
}

/// A file of a file-mode run: `[base, base + span)` of the run's virtual addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Placed {
    pub(crate) base: u64,
    pub(crate) span: u64,
    pub(crate) file: FileIdentity,
}

/// A file of a file-mode run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    /// "major:minor" of the filesystem's device.
    pub(crate) dev: String,
    pub(crate) ino: u64,
    /// Creation time in ns (statx btime), where the filesystem records it: tells a new
    /// file from an old one that reused the inode number.
    pub(crate) birth_time: Option<u64>,
    pub path: String,
    /// The inode's change time in ns when recorded (for the reader: a live database
    /// moves it constantly, so it does not decide whether the file is the same).
    #[serde(default)]
    pub(crate) changed_ns: Option<u64>,
    /// blake3 of the file's extents (logical, physical, length) when recorded: while it
    /// holds, the bytes reseq laid out are where they were, whatever was written into
    /// them in place since; when the extents moved (a file rewritten elsewhere,
    /// extended, truncated) a resume does the file again. Null: not read.
    #[serde(default)]
    pub(crate) extents: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Record {
    Run(Box<RunRecord>),
    Begin {
        offset: u64,
        len: u64,
        blake3: String,
    },
    Done {
        offset: u64,
        len: u64,
        blake3: String,
    },
    Finished,
    /// Written by the guardian, not by reseq: it killed reseq because a write was still
    /// outstanding past the window's deadline plus grace (reseq stopped or stalled).
    GuardianKilled(GuardianKill),
    /// The run stopped on an error that names device ranges to check (another writer's
    /// bytes may have been overwritten there): `status` names them until the device's
    /// next run replaces the journal.
    AtRisk(AtRiskNote),
}

/// The first line of a journal that did not check out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damage {
    /// 1-based line number.
    pub(crate) line: u64,
    /// Byte offset of the line's start.
    pub(crate) byte_offset: u64,
    /// It is the last line (an append cut short by a crash), not one in the middle.
    pub(crate) last: bool,
}

impl Damage {
    pub(crate) fn describe(&self, path: &Path) -> String {
        let (path, line, byte) = (path.display(), self.line, self.byte_offset);
        if self.last {
            format!(
                "the last line of {path} (line {line}, byte {byte}) is incomplete or damaged (an append cut short): ignored"
            )
        } else {
            format!(
                "line {line} (byte {byte}) of {path} is damaged (its checksum does not match, or its chunk goes backwards): the records from there on are not trusted, and the chunks they finished are done again"
            )
        }
    }
}

/// What the guardian notes when it had to kill reseq.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuardianKill {
    /// The window's number in the guardian's count (1-based).
    pub(crate) window: u64,
    pub(crate) frozen_ms: u64,
    pub(crate) max_freeze_ms: u64,
    pub(crate) grace_ms: u64,
    /// The writes it had granted and not heard back about, as it found them after
    /// reseq was gone and before it thawed.
    #[serde(default)]
    pub in_flight: Vec<InFlightCheck>,
}

/// Where a stopped run may have overwritten another writer's bytes, as its error said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AtRiskNote {
    /// The exit status the run ended with (5: a read-back differed, 8: its freeze was
    /// lost, 9: a foreign write).
    pub(crate) exit: u8,
    /// Device ranges [start, end) to check.
    pub(crate) ranges: Vec<(u64, u64)>,
    /// Why, in a few words.
    pub(crate) why: String,
    /// Where the original bytes of a chunk that did not read back right were saved, and
    /// how to put them back (the error's own words), if a rescue copy was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rescue: Option<String>,
}

impl AtRiskNote {
    /// One line for `status` and a resumed run's warnings.
    pub(crate) fn describe(&self) -> String {
        let total: u64 = self.ranges.iter().map(|(a, b)| b - a).sum();
        format!(
            "stopped with exit {} ({}): check device bytes {} ({} in all) with fsck -n and the application's own checks",
            self.exit,
            self.why,
            crate::support::error::list_ranges(&self.ranges),
            crate::support::units::human_bytes(total)
        ) + &self.rescue.as_ref().map(|r| format!(". {r}")).unwrap_or_default()
    }
}

/// One granted write, read back by the guardian after the kill, still frozen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlightCheck {
    /// Device offset and length.
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// The device held the bytes the write was to write (None: could not read).
    pub(crate) intact: Option<bool>,
}

/// What a replay found.
#[derive(Clone, Debug, Default)]
pub struct Replay {
    pub(crate) run: Option<RunRecord>,
    /// Chunks finished.
    pub done: u64,
    /// Everything before this offset is done (the end of the last finished chunk).
    pub done_offset: u64,
    /// Chunks begun but not finished: (offset, length, blake3 it was read with),
    /// ascending. Usually one; more when a read-back failed while later chunks were
    /// already written.
    pub in_flight: Vec<(u64, u64, String)>,
    pub finished: bool,
    /// Lines ignored because their checksum or JSON did not match, or a chunk went
    /// backwards.
    pub(crate) bad_lines: u64,
    /// The first such line.
    pub damage: Option<Damage>,
    /// Where the records before the damage end (bytes): they can be kept as they are.
    pub(crate) valid_bytes: u64,
    /// Records after the damage that still count: the chunk in flight, the guardian's
    /// notes, the end of the run (a compacted journal carries them over).
    carried: Vec<Record>,
    /// Times the guardian killed reseq in this run (a window outlasted its bound).
    pub guardian_kills: Vec<GuardianKill>,
    /// The last record is the guardian's kill: the run ended with a write outstanding.
    pub(crate) killed_last: bool,
    /// Ranges the run's stops left at risk (each stop's note).
    pub at_risk: Vec<AtRiskNote>,
}

pub(crate) fn encode(rec: &Record) -> String {
    let json = serde_json::to_string(rec).expect("records serialize");
    format!("{} {}\n", blake3::hash(json.as_bytes()).to_hex(), json)
}

/// Replays journal text. Progress (`done`, `done_offset`) stops at the first line that
/// does not check out; later lines that do are still read for the chunk in flight, the
/// guardian's notes and the end of the run, which do not depend on what came before.
pub fn replay(text: &str) -> Replay {
    let mut r = Replay::default();
    // Begun and not yet done: with read-backs overlapping writes, several may be; each
    // is finished only by its own `done`.
    let mut begun: Vec<(u64, u64, String)> = Vec::new();
    let mut at = 0u64;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    for (i, line) in lines.iter().enumerate() {
        let start = at;
        at += line.len() as u64;
        let rec = decode(line).filter(|rec| match rec {
            // Chunks finish in ascending order; anything else means a foreign or mixed
            // file.
            Record::Done { offset, len, .. } => r.damage.is_some() || (*offset >= r.done_offset && *len > 0),
            Record::Run(_) => r.damage.is_none(),
            _ => true,
        });
        let Some(rec) = rec else {
            r.bad_lines += 1;
            r.damage.get_or_insert(Damage { line: i as u64 + 1, byte_offset: start, last: i + 1 == lines.len() });
            continue;
        };
        let trusted = r.damage.is_none();
        r.killed_last = matches!(rec, Record::GuardianKilled(_));
        if !trusted && matches!(rec, Record::Finished | Record::GuardianKilled(_) | Record::AtRisk(_)) {
            r.carried.push(rec.clone());
        }
        r.apply(rec, trusted, &mut begun);
        if trusted {
            r.valid_bytes = at;
        }
    }
    r.settle_in_flight(begun);
    r
}

impl Replay {
    /// One record that checked out; `trusted`: no damage before it (progress counts).
    fn apply(&mut self, rec: Record, trusted: bool, begun: &mut Vec<(u64, u64, String)>) {
        match rec {
            Record::Run(run) => {
                let start = run.range_start_bytes;
                *self = Replay { run: Some(*run), done_offset: start, ..Replay::default() };
                begun.clear();
            }
            Record::Begin { offset, len, blake3 } => begun.push((offset, len, blake3)),
            Record::Done { offset, len, .. } => {
                begun.retain(|b| b.0 != offset);
                if trusted {
                    self.done += 1;
                    self.done_offset = offset + len;
                }
            }
            Record::Finished => self.finished = true,
            Record::GuardianKilled(k) => self.guardian_kills.push(k),
            Record::AtRisk(n) => self.at_risk.push(n),
        }
    }

    /// Every chunk begun and not done past the progress: the one being written when the
    /// run stopped, and any written whose read-back had not been recorded.
    fn settle_in_flight(&mut self, mut begun: Vec<(u64, u64, String)>) {
        begun.retain(|b| b.0 >= self.done_offset);
        begun.sort();
        begun.dedup_by_key(|b| b.0);
        self.in_flight = begun;
        if self.damage.is_some() {
            let begins = self.in_flight.iter().map(|(offset, len, blake3)| Record::Begin {
                offset: *offset,
                len: *len,
                blake3: blake3.clone(),
            });
            self.carried.splice(0..0, begins);
        }
    }
}

/// Rewrites a damaged journal as what its replay trusts: the records before the damage,
/// then the chunk in flight, the guardian's notes and the end of the run, if any came
/// after it. Atomic (a new file renamed over the old), so that appending goes on after
/// whole lines and a finished run reads as finished. Returns what was wrong.
pub(crate) fn repair(path: &Path) -> Result<Option<String>> {
    let ctx = |e| Error::io(format!("repairing journal {}", path.display()), e);
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ctx(e)),
    };
    let r = replay(&text);
    let Some(damage) = r.damage else { return Ok(None) };
    let clean = text[..r.valid_bytes as usize].to_string() + &r.carried.iter().map(encode).collect::<String>();
    replace_atomically(path, &clean).map_err(ctx)?;
    Ok(Some(format!(
        "{}; the journal was rewritten without it ({} damaged line(s) dropped)",
        damage.describe(path),
        r.bad_lines
    )))
}

fn decode(line: &str) -> Option<Record> {
    let json = checked(line)?;
    // A run's record lists every file of a file-mode run (20 MiB for 100,000 files):
    // parsed straight into its type rather than through serde's buffer for internally
    // tagged enums, which takes several times its size.
    match kind(json)? {
        "run" => serde_json::from_str::<RunRecord>(json).ok().map(|r| Record::Run(Box::new(r))),
        _ => serde_json::from_str(json).ok(),
    }
}

/// A whole line's JSON, if its checksum holds.
fn checked(line: &str) -> Option<&str> {
    let (sum, json) = line.strip_suffix('\n')?.split_once(' ')?;
    (blake3::hash(json.as_bytes()).to_hex().as_str() == sum).then_some(json)
}

/// A record's `type`, read without building the rest of it.
fn kind(json: &str) -> Option<&str> {
    #[derive(Deserialize)]
    struct Tagged<'a> {
        #[serde(rename = "type", borrow)]
        kind: &'a str,
    }
    serde_json::from_str::<Tagged>(json).ok().map(|t| t.kind)
}

/// Appends the guardian's note that it killed reseq. reseq is gone (the guardian saw
/// its socket close), so nothing else appends. A line reseq left half-written is cut
/// first: it never completed, and replay would stop at it and miss the note.
pub(crate) fn note_guardian_kill(path: &Path, kill: &GuardianKill) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut f = OpenOptions::new().read(true).append(true).open(path)?;
    // Only the tail: a journal has a line per chunk, and no line is near 64 KiB.
    let len = f.metadata()?.len();
    let from = len.saturating_sub(64 << 10);
    let mut tail = vec![0u8; (len - from) as usize];
    f.read_exact_at(&mut tail, from)?;
    if tail.last().is_some_and(|&b| b != b'\n') {
        let keep = tail.iter().rposition(|&b| b == b'\n').map_or(from, |i| from + i as u64 + 1);
        f.set_len(keep)?;
    }
    f.write_all(encode(&Record::GuardianKilled(kill.clone())).as_bytes())?;
    f.sync_data()
}

/// What a resumed run says about the guardian's kills in the run it continues.
pub(crate) fn describe_guardian_kills(kills: &[GuardianKill]) -> Vec<String> {
    kills
        .iter()
        .map(|k| {
            format!(
                "the run being resumed was killed by its guardian: in its window {} a write was still outstanding at the end of --max-freeze {} ms + {} ms grace (reseq stopped or stalled), so the guardian killed reseq and thawed after {} ms frozen",
                k.window, k.max_freeze_ms, k.grace_ms, k.frozen_ms
            )
        })
        .collect()
}

pub(crate) fn journal_path(state_dir: &Path, identity: &DeviceIdentity) -> PathBuf {
    state_dir.join(format!("device-{}.journal", identity.name))
}

pub fn read(path: &Path) -> Result<Option<Replay>> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(replay(&t))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("reading journal {}", path.display()), e)),
    }
}

/// Replaces `path` with `text`, whole (see [`atomic::replace`]), readable by root only.
pub(crate) fn replace_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    atomic::replace(path, 0o600, |f| f.write_all(text.as_bytes()))
}

/// An open journal, appending.
pub(crate) struct Journal {
    file: Option<File>,
    path: PathBuf,
    /// Records held back while the state directory's filesystem is frozen.
    held: Vec<String>,
    hold: bool,
    /// A new run's journal not yet on disk (see [`Journal::deferred`]).
    pending: Option<Pending>,
    /// This journal was created by this run (not continued).
    created: bool,
}

/// What a deferred journal writes when the run first needs it: first `before` (file
/// mode's run record), then the run record, replacing any old journal.
struct Pending {
    run: RunRecord,
    before: Option<Box<dyn FnOnce() -> Result<()> + Send>>,
}

impl Journal {
    /// Starts a new journal for `run` (replacing an old one).
    pub(crate) fn create(path: &Path, run: RunRecord) -> Result<Journal> {
        let ctx = |e| Error::io(format!("creating journal {}", path.display()), e);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(ctx)?;
        }
        // An unfinished run's notes of ranges to check outlive it (`--restart`, file
        // mode's resume, which starts its journals again): nobody has checked them yet.
        let carried = unfinished_notes(path);
        // Write the new run to a temporary file and rename it over the old journal, so
        // a crash here leaves either the old journal or the new one, whole.
        replace_atomically(path, &(encode(&Record::Run(Box::new(run))) + &carried)).map_err(ctx)?;
        let mut j = Journal::append_to(path)?;
        j.created = true;
        Ok(j)
    }

    /// A new journal for `run` that is written only when the run first needs it: its
    /// first record (a chunk's `begin`, the end of the run), or a hold (which comes
    /// before a freeze: afterwards the journal's filesystem may be frozen). Until then
    /// the state directory is as it was, so a run refused before its first write (a
    /// foreign freeze, another writer) leaves the run `--resume` would continue, or a
    /// finished run's journal, untouched. `before` runs first (file mode writes its
    /// run's record there).
    pub(crate) fn deferred(
        path: &Path,
        run: RunRecord,
        before: Option<Box<dyn FnOnce() -> Result<()> + Send>>,
    ) -> Journal {
        let mut j = Journal::none();
        j.path = path.to_path_buf();
        j.pending = Some(Pending { run, before });
        j
    }

    /// Whether this run wrote this journal (a deferred one, once it was needed).
    pub(crate) fn created(&self) -> bool {
        self.created
    }

    /// Writes a deferred journal (see [`Journal::deferred`]); nothing once written.
    fn materialize(&mut self) -> Result<()> {
        let Some(p) = self.pending.take() else { return Ok(()) };
        if let Some(before) = p.before {
            before()?;
        }
        let (hold, held) = (self.hold, std::mem::take(&mut self.held));
        *self = Journal::create(&self.path, p.run)?;
        (self.hold, self.held) = (hold, held);
        Ok(())
    }

    /// Opens an existing journal to continue it, repairing it first if a line is damaged
    /// (appending after a damaged line would leave every new record unread).
    pub(crate) fn append_to(path: &Path) -> Result<Journal> {
        if let Some(what) = repair(path)? {
            log::warn!("{what}");
        }
        let file = OpenOptions::new().append(true).open(path);
        let file = file.map_err(|e| Error::io(format!("opening journal {}", path.display()), e))?;
        Ok(Journal {
            file: Some(file),
            path: path.to_path_buf(),
            held: Vec::new(),
            hold: false,
            pending: None,
            created: false,
        })
    }

    /// A journal that records nothing (dry runs, simulations without state).
    pub(crate) fn none() -> Journal {
        Journal { file: None, path: PathBuf::new(), held: Vec::new(), hold: false, pending: None, created: false }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// While held, records stay in memory (the journal's filesystem is frozen).
    pub(crate) fn set_hold(&mut self, hold: bool) -> Result<()> {
        if hold {
            self.materialize()?;
        }
        self.hold = hold;
        if !hold && !self.held.is_empty() {
            let text = std::mem::take(&mut self.held).concat();
            self.write(&text, true)?;
        }
        Ok(())
    }

    fn write(&mut self, text: &str, durable: bool) -> Result<()> {
        let Some(f) = self.file.as_mut() else { return Ok(()) };
        let ctx = |e| Error::io(format!("appending to journal {}", self.path.display()), e);
        f.write_all(text.as_bytes()).map_err(ctx)?;
        if durable {
            f.sync_data().map_err(ctx)?;
        }
        Ok(())
    }

    fn append(&mut self, rec: &Record, durable: bool) -> Result<()> {
        self.materialize()?;
        let line = encode(rec);
        if self.hold {
            self.held.push(line);
            Ok(())
        } else {
            self.write(&line, durable)
        }
    }

    /// The chunk about to be written (advisory: not fsynced).
    pub(crate) fn begin(&mut self, offset: u64, len: u64, hash: &blake3::Hash) -> Result<()> {
        self.append(&Record::Begin { offset, len, blake3: hash.to_hex().to_string() }, false)
    }

    /// The chunk is written, flushed and verified. Durable at the next [`Journal::commit`].
    pub fn done(&mut self, offset: u64, len: u64, hash: &blake3::Hash) -> Result<()> {
        self.append(&Record::Done { offset, len, blake3: hash.to_hex().to_string() }, false)
    }

    /// Notes, durably, the ranges a stop left at risk (for `status`).
    pub(crate) fn at_risk(&mut self, note: AtRiskNote) -> Result<()> {
        self.append(&Record::AtRisk(note), true)
    }

    /// Makes every record so far durable (one fsync for a batch of chunks). While held,
    /// this happens when the hold is released.
    pub(crate) fn commit(&mut self) -> Result<()> {
        if self.hold { Ok(()) } else { self.write("", true) }
    }

    /// Ends the run, and compacts the journal when it is on disk (see [`compact`]).
    pub fn finished(&mut self) -> Result<()> {
        self.append(&Record::Finished, true)?;
        if self.file.is_some() && !self.hold {
            // Housekeeping after a finished run: its failure (a full state directory)
            // must not fail the run, whose end is already durable.
            if let Err(e) = compact(&self.path) {
                log::warn!("the run finished, but its journal {} was not compacted: {e}", self.path.display());
            }
            // The handle may be on the old file, which the rename replaced.
            match OpenOptions::new().append(true).open(&self.path) {
                Ok(f) => self.file = Some(f),
                Err(e) => log::warn!("reopening journal {}: {e}", self.path.display()),
            }
        }
        Ok(())
    }
}

/// The `at_risk` lines of an unfinished journal at `path`, as they are (none from a
/// finished one, or none there). By each line's type, as [`compact`] reads it: the run's
/// record (tens of MiB for a file-mode run of 100,000 files) is not built.
fn unfinished_notes(path: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(path) else { return String::new() };
    let typed: Vec<(&str, Option<&str>)> = text.split_inclusive('\n').map(|l| (l, checked(l).and_then(kind))).collect();
    if typed.iter().any(|(_, k)| *k == Some("finished")) {
        return String::new();
    }
    typed.into_iter().filter(|(_, k)| *k == Some("at_risk")).map(|(l, _)| l).collect()
}

/// Rewrites a finished run's journal without its `begin` records, atomically. They say
/// which chunk was being written, which only matters while a run may resume; a finished
/// journal keeps its plan, the verified chunks with their hashes (the evidence of what
/// was written) and the guardian's notes, until the next run of the device replaces it.
/// Half the size: a 1 TiB device at 4 MiB chunks leaves 37 MiB rather than 74 MiB.
pub(crate) fn compact(path: &Path) -> std::io::Result<()> {
    let text = std::fs::read_to_string(path)?;
    // Every line's type, the run's record not built (tens of MiB for a file-mode run of
    // 100,000 files): a line that does not check out leaves the journal as it is.
    let Some(kinds) = text.split_inclusive('\n').map(|l| checked(l).and_then(kind)).collect::<Option<Vec<_>>>() else {
        return Ok(());
    };
    if !kinds.contains(&"finished") {
        return Ok(());
    }
    let kept: String = text.split_inclusive('\n').zip(&kinds).filter(|(_, k)| **k != "begin").map(|(l, _)| l).collect();
    if kept.len() < text.len() { replace_atomically(path, &kept) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunRecord {
        RunRecord {
            version: JOURNAL_VERSION,
            identity: DeviceIdentity {
                name: "loop9".into(),
                dev: "7:9".into(),
                size_bytes: 1 << 20,
                loop_backing_file: Some("/tmp/x.img".into()),
                ..DeviceIdentity::default()
            },
            chunk_size_bytes: 4096,
            range_start_bytes: 0,
            range_end_bytes: 1 << 20,
            chunks_total: 256,
            started_at: "2026-11-22T00:00:00Z".into(),
            files: Vec::new(),
            options: None,
        }
    }

    fn done(offset: u64, h: &str) -> Record {
        Record::Done { offset, len: 4096, blake3: h.to_string() }
    }

    #[test]
    fn replays_and_ignores_torn_tail() {
        let h = blake3::hash(b"x").to_hex().to_string();
        let mut text = encode(&Record::Run(Box::new(run())));
        text += &encode(&done(0, &h));
        text += &encode(&done(4096, &h));
        text += &encode(&Record::Begin { offset: 8192, len: 4096, blake3: h.clone() });
        let full = replay(&text);
        assert_eq!((full.done, full.done_offset), (2, 8192));
        assert_eq!(full.in_flight, vec![(8192, 4096, h.clone())]);
        assert_eq!(full.bad_lines, 0);
        // A torn append: half a line.
        let torn = encode(&done(8192, &h));
        let t2 = format!("{text}{}", &torn[..torn.len() / 2]);
        let r = replay(&t2);
        assert_eq!((r.done, r.done_offset), (2, 8192));
        assert_eq!(r.bad_lines, 1);
    }

    /// The verifier reads chunk A back while chunk B is written: A's `done` must not
    /// clear B, which is still in flight (a torn write of B would otherwise be forgotten).
    #[test]
    fn a_chunk_stays_in_flight_until_its_own_done() {
        let (a, b) = (blake3::hash(b"a").to_hex().to_string(), blake3::hash(b"b").to_hex().to_string());
        let mut text = encode(&Record::Run(Box::new(run())));
        text += &encode(&Record::Begin { offset: 0, len: 4096, blake3: a.clone() });
        text += &encode(&Record::Begin { offset: 4096, len: 4096, blake3: b.clone() });
        text += &encode(&done(0, &a));
        let r = replay(&text);
        assert_eq!((r.done, r.done_offset), (1, 4096));
        assert_eq!(r.in_flight, vec![(4096, 4096, b.clone())]);
        text += &encode(&done(4096, &b));
        assert!(replay(&text).in_flight.is_empty());
        let k = GuardianKill { window: 3, frozen_ms: 900, max_freeze_ms: 500, grace_ms: 500, in_flight: Vec::new() };
        text += &encode(&Record::GuardianKilled(k.clone()));
        assert_eq!(replay(&text).guardian_kills, vec![k]);
    }

    /// The guardian's note after a kill cuts a half-written last line first, so replay
    /// reaches the note.
    #[test]
    fn a_stops_ranges_at_risk_are_read_back_after_damage_and_a_resume() {
        let h = blake3::hash(b"x").to_hex().to_string();
        let note = AtRiskNote {
            exit: 9,
            ranges: vec![(0, 4096), (1 << 20, 2 << 20)],
            why: "another writer wrote".into(),
            rescue: None,
        };
        // A damaged line before it: the note still counts, as the guardian's do.
        let text = encode(&Record::Run(Box::new(run())))
            + &encode(&done(0, &h))
            + "0000 {\"type\":\"done\"}\n"
            + &encode(&Record::AtRisk(note.clone()))
            + &encode(&done(4096, &h));
        let r = replay(&text);
        assert_eq!((r.done, r.at_risk.clone()), (1, vec![note.clone()]));
        assert!(r.carried.contains(&Record::AtRisk(note.clone())), "a repair keeps it");
        let said = note.describe();
        assert!(
            said.contains(
                "exit 9 (another writer wrote): check device bytes 0..4096, 1048576..2097152 (1.0 MiB in all)"
            ),
            "{said}"
        );
        // A read-back that differed names the rescue copy of its chunk; a note written
        // before the field existed still reads.
        let saved = "The original bytes are saved in /var/lib/reseq/x.rescue: once the device is fixed, put them back with `reseq restore /var/lib/reseq/x.rescue`";
        let kept = AtRiskNote {
            exit: 5,
            ranges: vec![(0, 4096)],
            why: "a read-back differed".into(),
            rescue: Some(saved.into()),
        };
        let r = replay(&(encode(&Record::Run(Box::new(run()))) + &encode(&Record::AtRisk(kept.clone()))));
        assert_eq!(r.at_risk, vec![kept.clone()]);
        assert!(kept.describe().ends_with(&format!("application's own checks. {saved}")), "{}", kept.describe());
        let old = serde_json::json!({"exit": 9, "ranges": [[0, 4096]], "why": "another writer wrote"});
        assert_eq!(serde_json::from_value::<AtRiskNote>(old).unwrap().rescue, None);
    }

    #[test]
    fn a_new_journal_carries_an_unfinished_ones_notes_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.journal");
        let note = AtRiskNote { exit: 5, ranges: vec![(0, 4096)], why: "a read-back differed".into(), rescue: None };
        Journal::create(&path, run()).unwrap().at_risk(note.clone()).unwrap();
        // Started again over the unfinished run (--restart, file mode's resume): kept.
        let mut j = Journal::create(&path, run()).unwrap();
        assert_eq!(read(&path).unwrap().unwrap().at_risk, vec![note.clone()]);
        j.finished().unwrap();
        assert_eq!(read(&path).unwrap().unwrap().at_risk, vec![note], "a finished journal keeps it");
        // The device's next run: gone.
        Journal::create(&path, run()).unwrap();
        assert!(read(&path).unwrap().unwrap().at_risk.is_empty());
    }

    #[test]
    fn a_guardian_note_after_a_torn_line_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.journal");
        let h = blake3::hash(b"x").to_hex().to_string();
        let torn = encode(&done(4096, &h));
        let text = encode(&Record::Run(Box::new(run()))) + &encode(&done(0, &h)) + &torn[..torn.len() / 2];
        std::fs::write(&path, text).unwrap();
        let k = GuardianKill { window: 1, frozen_ms: 950, max_freeze_ms: 500, grace_ms: 500, in_flight: Vec::new() };
        note_guardian_kill(&path, &k).unwrap();
        let r = read(&path).unwrap().unwrap();
        assert_eq!((r.done, r.bad_lines), (1, 0));
        assert_eq!(r.guardian_kills, vec![k]);
    }

    #[test]
    fn a_flipped_bit_or_a_backward_chunk_stops_the_replay() {
        let h = blake3::hash(b"x").to_hex().to_string();
        let mut text = encode(&Record::Run(Box::new(run())));
        text += &encode(&done(0, &h)).replace("\"offset\":0", "\"offset\":5");
        text += &encode(&done(4096, &h));
        let r = replay(&text);
        assert_eq!((r.done, r.bad_lines), (0, 1), "progress stops at the damaged line");
        assert_eq!(r.damage.map(|d| (d.line, d.last)), Some((2, false)));
        let mut text = encode(&Record::Run(Box::new(run())));
        text += &encode(&done(8192, &h));
        text += &encode(&done(0, &h));
        let r = replay(&text);
        assert_eq!((r.done, r.done_offset, r.bad_lines), (1, 12288, 1));
    }

    /// A flipped byte mid-journal: named by line and offset; repaired to what is trusted
    /// plus the chunk in flight and the end of the run; appending then reads back.
    #[test]
    fn a_damaged_middle_line_is_named_and_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.journal");
        let h = blake3::hash(b"x").to_hex().to_string();
        let first = encode(&Record::Run(Box::new(run()))) + &encode(&done(0, &h));
        let bad = encode(&done(4096, &h)).replacen('1', "2", 1);
        let text = first.clone()
            + &bad
            + &encode(&done(8192, &h))
            + &encode(&Record::Begin { offset: 12288, len: 4096, blake3: h.clone() });
        std::fs::write(&path, &text).unwrap();
        let r = replay(&text);
        assert_eq!((r.done, r.done_offset), (1, 4096), "chunks after the damage are redone");
        assert_eq!(r.damage, Some(Damage { line: 3, byte_offset: first.len() as u64, last: false }));
        assert_eq!(r.in_flight, vec![(12288, 4096, h.clone())], "the chunk in flight is still known");
        let what = repair(&path).unwrap().unwrap();
        assert!(what.contains(&format!("line 3 (byte {})", first.len())), "{what}");
        let mut j = Journal::append_to(&path).unwrap();
        j.done(4096, 4096, &blake3::hash(b"x")).unwrap();
        j.finished().unwrap();
        let r = read(&path).unwrap().unwrap();
        assert_eq!((r.done, r.done_offset, r.finished, r.bad_lines), (2, 8192, true, 0));
        assert!(repair(&path).unwrap().is_none(), "clean now");
    }

    #[test]
    fn file_round_trip_with_hold() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        let mut j = Journal::create(&p, run()).unwrap();
        let h = blake3::hash(b"y");
        j.set_hold(true).unwrap();
        j.done(0, 4096, &h).unwrap();
        assert_eq!(read(&p).unwrap().unwrap().done, 0, "held records are not on disk yet");
        j.set_hold(false).unwrap();
        j.done(4096, 4096, &h).unwrap();
        j.commit().unwrap();
        j.finished().unwrap();
        let r = read(&p).unwrap().unwrap();
        assert_eq!((r.done, r.done_offset, r.finished, r.run.unwrap()), (2, 8192, true, run()));
    }

    #[test]
    fn a_finished_journal_is_compacted_to_its_plan_and_verified_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        let mut j = Journal::create(&p, run()).unwrap();
        let h = blake3::hash(b"z");
        for i in 0..4 {
            j.begin(i * 4096, 4096, &h).unwrap();
            j.done(i * 4096, 4096, &h).unwrap();
        }
        j.commit().unwrap();
        let full = std::fs::read_to_string(&p).unwrap();
        assert_eq!(full.lines().count(), 9);
        j.finished().unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.lines().count(), 6, "run, 4 done, finished: {text}");
        assert!(!text.contains("\"begin\""), "{text}");
        let r = read(&p).unwrap().unwrap();
        assert_eq!((r.done, r.done_offset, r.finished, r.in_flight.len()), (4, 16384, true, 0));
    }

    #[test]
    fn an_unfinished_or_damaged_journal_is_not_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        let h = blake3::hash(b"z").to_hex().to_string();
        let begin = encode(&Record::Begin { offset: 0, len: 4096, blake3: h });
        let text = encode(&Record::Run(Box::new(run()))) + &begin;
        std::fs::write(&p, &text).unwrap();
        compact(&p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), text, "the chunk in flight is kept");
        let damaged = text.clone() + "0000 {\"type\":\"done\"}\n" + &encode(&Record::Finished);
        std::fs::write(&p, &damaged).unwrap();
        compact(&p).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), damaged, "left for repair() to judge");
    }
}
