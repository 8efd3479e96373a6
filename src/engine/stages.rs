//! The threads around the writer, within one window: the reader (O_DIRECT reads ahead
//! into pooled buffers, of the chunks the writer lets through), the hasher (blake3 of
//! what was read) and the verifier (each written chunk read back and compared); each runs
//! under [`or_abort`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::rescue;
use crate::engine::guard::Reporter;
use crate::engine::target::BlockTarget;
use crate::support::error::{Error, Result};
use crate::support::{hooks, output};
use crate::sys::{self, memory::AlignedBuf};

/// An aligned buffer on loan from the engine's pool: it goes back when dropped, however
/// the chunk holding it ends (written, dropped at a window's end, failed), so no path
/// can forget to return it and starve the reader.
pub(super) struct Pooled {
    pub(super) buf: Option<AlignedBuf>,
    pub(super) home: Sender<AlignedBuf>,
}

impl std::ops::Deref for Pooled {
    type Target = AlignedBuf;
    fn deref(&self) -> &AlignedBuf {
        self.buf.as_ref().expect("a pooled buffer is present until dropped")
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut AlignedBuf {
        self.buf.as_mut().expect("a pooled buffer is present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let _ = self.home.send(buf);
        }
    }
}

/// A chunk moving through the stages. `hash` is the blake3 of what was read.
pub(super) struct Chunk {
    /// Position in this window's chunk list.
    pub(super) index: u64,
    pub(super) offset: u64,
    pub(super) len: usize,
    pub(super) buf: Pooled,
    pub(super) hash: blake3::Hash,
    /// How long its read and blake3 took.
    pub(super) ready: Duration,
}

pub(super) enum Staged {
    /// A chunk read, not yet hashed.
    Read {
        index: u64,
        offset: u64,
        len: usize,
        buf: Pooled,
        took: Duration,
    },
    Hashed(Chunk),
    Failed {
        index: u64,
        offset: u64,
        error: std::io::Error,
    },
}

impl Staged {
    /// Its position in the window's chunk list.
    fn index(&self) -> u64 {
        match self {
            Staged::Read { index, .. } | Staged::Failed { index, .. } => *index,
            Staged::Hashed(c) => c.index,
        }
    }
}

/// A verifier's answer for one written chunk.
pub(super) struct Verified {
    pub(super) chunk: Chunk,
    pub(super) result: Result<()>,
    /// How long the read-back took.
    pub(super) took: Duration,
}

/// While a window is frozen, the writer and the verifier run at real-time priority, one
/// below the guardian: on a saturated CPU the writes and read-backs that hold the freeze
/// open then finish on time instead of waiting behind busy loops. The reader and the
/// hasher stay normal: they only decide how much a window gets done, not when it ends.
/// Back to normal when dropped. Where the host allows no real-time class, nothing changes
/// (the guardian still ends the window at its deadline).
pub(super) struct Urgent(Option<sys::process::Scheduling>);

impl Urgent {
    pub(super) fn raise(on: bool) -> Urgent {
        let before = sys::process::thread_scheduling();
        let rt = sys::process::Scheduling::Fifo(sys::process::fifo_max_priority() - 1);
        Urgent((on && sys::process::set_scheduling_of(0, rt).is_ok()).then_some(before))
    }
}

impl Drop for Urgent {
    fn drop(&mut self) {
        if let Some(before) = self.0 {
            let _ = sys::process::set_scheduling_of(0, before);
        }
    }
}

/// Runs a stage of a window; a panic in it ends the process at once (SIGABRT, no core
/// dump), as a kill -9 would. Unwinding would leave the window's scope waiting for stages
/// that wait on each other (the run hung, or a dead reader looked like the window's end
/// and the run claimed success), and a half-updated engine must not write its journal.
/// The guardian thaws as soon as reseq is gone and prints what a frozen reseq could not
/// (the panic hook keeps it in the run directory), and `--resume` checks the chunks in
/// flight first, as after a kill.
pub(super) fn or_abort<T>(stage: &str, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            let text = format!(
                "reseq: internal error (a bug): the {stage} panicked during a window; aborted at once (exit status \
                 134). Only verified chunks are recorded as done: run the same command again with --resume, which \
                 checks the chunks in flight first"
            );
            match output::is_held() {
                true => rescue::save_panic_note(std::process::id(), &text),
                false => eprintln!("{text}"),
            }
            crate::sys::process::abort_without_core()
        }
    }
}

/// What the readers share within one window: the chunks, the pool, the writer's tokens
/// and the next chunk to read. A reader takes a token, a buffer and a chunk's index
/// together, under one lock: indices go out in the order buffers do, so the lowest chunk
/// not yet read always holds a buffer, and the hasher, which puts the chunks back in
/// order, never waits for a chunk that waits for a buffer it holds.
pub(super) struct Feed<'a> {
    pub(super) chunks: &'a [(u64, usize)],
    pub(super) pool: &'a (Sender<AlignedBuf>, Receiver<AlignedBuf>),
    pub(super) grants: Receiver<()>,
    pub(super) next: std::sync::Mutex<usize>,
    pub(super) stop: &'a AtomicBool,
}

impl Feed<'_> {
    /// The next chunk to read, with its buffer; None: the window's reads are over.
    fn take(&self) -> Option<(u64, u64, usize, Pooled)> {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let &(offset, len) = self.chunks.get(*next)?;
        if self.grants.recv().is_err() || self.stop.load(Ordering::SeqCst) {
            return None;
        }
        let buf = self.pool.1.recv().ok()?;
        let index = *next as u64;
        *next += 1;
        Some((index, offset, len, Pooled { buf: Some(buf), home: self.pool.0.clone() }))
    }
}

/// Reader stage (one of `EngineConfig::readers` threads): reads this window's chunks
/// ahead into pool buffers, each once the writer lets it through (a token on `grants`:
/// the writer expects to write it in this window; the tokens ending, the window's writes
/// are over). Readers run side by side, so chunks reach the hasher out of order.
/// Returns the bytes it read and its busy time.
pub(super) fn read_stage(target: &dyn BlockTarget, feed: &Feed, out: Sender<Staged>) -> (u64, Duration) {
    let mut read = 0;
    let mut busy = Duration::ZERO;
    while let Some((index, offset, len, mut buf)) = feed.take() {
        if feed.stop.load(Ordering::SeqCst) {
            break; // the buffer goes back to the pool as it drops
        }
        let t = Instant::now();
        let r = target.read_at(&mut buf[..len], offset);
        let took = t.elapsed();
        busy += took;
        match r {
            Ok(()) => {
                read += len as u64;
                hooks::point("after-read");
                if out.send(Staged::Read { index, offset, len, buf, took }).is_err() {
                    break;
                }
            }
            Err(error) => {
                let _ = out.send(Staged::Failed { index, offset, error });
                break; // a read error ends the run
            }
        }
    }
    (read, busy)
}

/// Hasher stage: blake3 of each chunk as read, off the reader's and writer's threads,
/// passed on in the chunks' order (the readers' side by side finish out of order).
pub(super) fn hash_stage(input: Receiver<Staged>, out: Sender<Staged>) -> Duration {
    let mut busy = Duration::ZERO;
    let mut early = std::collections::BTreeMap::new();
    let mut next = 0;
    for m in input {
        early.insert(m.index(), m);
        while let Some(m) = early.remove(&next) {
            next += 1;
            let m = match m {
                Staged::Read { index, offset, len, buf, took } => {
                    let t = Instant::now();
                    let hash = blake3::hash(&buf[..len]);
                    busy += t.elapsed();
                    Staged::Hashed(Chunk { index, offset, len, buf, hash, ready: took + t.elapsed() })
                }
                other => other,
            };
            if out.send(m).is_err() {
                return busy;
            }
        }
    }
    busy
}

/// Verifier stage: reads each written chunk back and compares it with what was written.
/// It reports each finished read-back to the guardian itself.
/// `back` is the buffer read-backs land in: the engine's, kept from window to window.
pub(super) fn verify_stage(
    target: &dyn BlockTarget,
    back: &mut AlignedBuf,
    input: Receiver<Chunk>,
    out: Sender<Verified>,
    reporter: Result<Reporter>,
) -> Duration {
    let mut reporter = reporter;
    let mut busy = Duration::ZERO;
    for chunk in input {
        let (offset, len) = (chunk.offset, chunk.len);
        let t = Instant::now();
        let verified = verify_chunk(target, &chunk.buf[..len], offset, &chunk.hash, &mut back[..len]);
        busy += t.elapsed();
        let told = match &mut reporter {
            Ok(r) => r.written(),
            Err(e) => Err(Error::Internal(format!("no way to report to the guardian: {e}"))),
        };
        let result = verified.and(told);
        // A writer that stopped listening drops the chunk, and its buffer goes home.
        let _ = out.send(Verified { chunk, result, took: t.elapsed() });
    }
    busy
}

pub(super) fn verify_chunk(
    target: &dyn BlockTarget,
    data: &[u8],
    offset: u64,
    hash: &blake3::Hash,
    back: &mut [u8],
) -> Result<()> {
    target.read_at(back, offset).map_err(|e| Error::io_at("reading back", offset, e))?;
    // `data` is what was hashed and written: the chunk moved from stage to stage by value
    // and has only been borrowed since its hash, so the read-back is compared with it byte
    // for byte. That is the hash's check without a second blake3: about a CPU-second less
    // per 8 GiB, the bound of a verified run on a fast device. Test builds also check the
    // premise, against the hash.
    #[cfg(feature = "fault-injection")]
    if blake3::hash(data) != *hash {
        return Err(Error::Internal(format!("the chunk at {offset} changed in memory after its hash")));
    }
    if back == data {
        return Ok(());
    }
    let after = blake3::hash(back);
    // Never written again here: a differing read-back is a failing device or another
    // writer, and writing the pre-read bytes again could overwrite that writer's newer
    // data. Say exactly which sectors differ, and stop. On the device (file mode's
    // offsets are the files' laid end to end).
    let at = target.device_offset(offset, data.len() as u64).unwrap_or(offset);
    let differ = differing_sectors(data, back, at);
    log::error!("checksum mismatch at device offset {at}: {differ}");
    Err(Error::ChecksumMismatch {
        offset: at,
        len: data.len() as u64,
        before: hash.to_hex().to_string(),
        after: after.to_hex().to_string(),
        differ,
        rescue: None,
        at_risk: None,
    })
}

/// The 512-byte sectors (device offsets) where `back` differs from `data`, as ranges.
pub(super) fn differing_sectors(data: &[u8], back: &[u8], offset: u64) -> String {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (i, (a, b)) in data.chunks(512).zip(back.chunks(512)).enumerate() {
        if a != b {
            let at = offset + i as u64 * 512;
            match ranges.last_mut() {
                Some(r) if r.1 == at => r.1 = at + 512,
                _ => ranges.push((at, at + 512)),
            }
        }
    }
    let total: u64 = ranges.iter().map(|r| r.1 - r.0).sum();
    let shown: Vec<String> = ranges.iter().take(8).map(|(a, b)| format!("{a}..{b}")).collect();
    let (shown, more) = (shown.join(", "), if ranges.len() > 8 { ", ..." } else { "" });
    format!("{total} bytes differ in {} range(s) (device bytes {shown}{more})", ranges.len())
}
