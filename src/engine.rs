//! The rewrite engine: chunks in ascending order, one writer, reads overlapped.
//!
//! Why this shape: an FTL places data in the order writes arrive, so the only order that
//! re-linearizes is ascending offsets from a single writer, in large chunks (see
//! `../shared/ftl-model/SPEC.md`: interleaved writers or descending order leave reads
//! 15-50 % slower). Parallel writes would be faster to issue and worse for the drive.
//!
//! Per window: freeze, then a reader thread reads chunks ahead into a bounded pool of
//! aligned buffers and hashes them (blake3) while this thread, for each chunk in order:
//! asks the guardian for permission, writes it back to the same offset, flushes, reads
//! it back into its own buffer, compares hashes, tells the guardian, and journals the
//! chunk as done. When the window's budget is spent the window ends; chunks read ahead
//! are dropped, never written after a thaw, and read again in the next window.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::error::{Error, Result};
use crate::freeze::WindowGuard;
use crate::hooks;
use crate::journal::Journal;
use crate::output::{self, Progress};
use crate::signals::StopFlag;
use crate::sys::AlignedBuf;
use crate::target::BlockTarget;

/// What to rewrite and how.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Bytes per chunk; a multiple of the target's offset alignment.
    pub chunk_size: u64,
    /// First byte of the range (aligned).
    pub range_start: u64,
    /// One past the last byte of the range (aligned).
    pub range_end: u64,
    /// Index of the first chunk to do (after a resume).
    pub first_chunk: u64,
    /// Read back and compare every chunk after writing it.
    pub verify: bool,
    /// Chunks read ahead of the writer (the pool holds this many plus one).
    pub read_ahead: usize,
    /// Gap between windows (thawed).
    pub pause: Duration,
    /// Hold the journal in memory during windows (its filesystem is frozen).
    pub journal_on_frozen_fs: bool,
}

impl EngineConfig {
    pub fn chunks_total(&self) -> u64 {
        (self.range_end - self.range_start).div_ceil(self.chunk_size)
    }

    /// (offset, length) of chunk `i`.
    pub fn chunk(&self, i: u64) -> (u64, usize) {
        let off = self.range_start + i * self.chunk_size;
        (off, (self.range_end - off).min(self.chunk_size) as usize)
    }

    /// Bytes of aligned buffers the engine allocates.
    pub fn memory_bytes(&self) -> u64 {
        let buffers = self.read_ahead as u64 + 1 + u64::from(self.verify);
        buffers * self.chunk_size
    }
}

/// What a run did, also when it stopped early.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct EngineStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub bytes_verified: u64,
    pub chunks_written: u64,
    /// Chunks that a previous run had finished (skipped on resume).
    pub chunks_already_done: u64,
    /// Bytes read ahead and dropped at window ends (read again later, never written).
    pub bytes_read_ahead_dropped: u64,
    pub windows: u64,
    pub windows_overrun: u64,
    pub longest_freeze_seconds: f64,
    pub total_frozen_seconds: f64,
    /// Next chunk to do (== chunks_total when complete).
    pub next_chunk: u64,
}

enum ReadMsg {
    Chunk { index: u64, buf: AlignedBuf, hash: blake3::Hash },
    Failed { offset: u64, error: std::io::Error },
}

/// Why a window stopped.
enum WindowFlow {
    /// All chunks done.
    Complete,
    /// Budget spent; more windows to go.
    BudgetSpent,
    /// The guardian refused a write: the deadline passed.
    Overrun,
}

/// Rewrites the configured range of `target`, window by window. Returns the stats in
/// every case, with the error that stopped the run, if any.
pub fn run(
    target: &dyn BlockTarget,
    cfg: &EngineConfig,
    guard: &mut dyn WindowGuard,
    journal: &mut Journal,
    progress: &mut Progress,
    stop: &StopFlag,
) -> (EngineStats, Result<()>) {
    let mut stats = EngineStats { next_chunk: cfg.first_chunk, chunks_already_done: cfg.first_chunk, ..Default::default() };
    let result = run_windows(target, cfg, guard, journal, progress, stop, &mut stats);
    (stats, result)
}

#[allow(clippy::too_many_arguments)]
fn run_windows(
    target: &dyn BlockTarget,
    cfg: &EngineConfig,
    guard: &mut dyn WindowGuard,
    journal: &mut Journal,
    progress: &mut Progress,
    stop: &StopFlag,
    stats: &mut EngineStats,
) -> Result<()> {
    let total = cfg.chunks_total();
    let align = target.mem_align();
    let pool_size = cfg.read_ahead.max(1) + 1;
    let (free_tx, free_rx) = bounded::<AlignedBuf>(pool_size);
    for _ in 0..pool_size {
        free_tx.send(AlignedBuf::new(cfg.chunk_size as usize, align)).expect("pool has room");
    }
    let mut verify_buf = cfg.verify.then(|| AlignedBuf::new(cfg.chunk_size as usize, align));
    // Soft budget: stop starting chunks at 3/4 of the guardian's deadline, leaving room
    // for one slow chunk and the thaw.
    let budget = guard.deadline().map(|d| d.mul_f64(0.75));
    let mut chunk_estimate = Duration::ZERO;
    let done_before = stats.next_chunk * cfg.chunk_size;

    while stats.next_chunk < total {
        if let Some(sig) = stop.signal() {
            return Err(interrupted(cfg, stats, sig));
        }
        if stats.windows > 0 && !cfg.pause.is_zero() {
            stop.sleep(cfg.pause);
            continue_if_stopped(cfg, stats, stop)?;
        }
        let freezes = guard.freezes();
        if freezes {
            output::hold();
            journal.set_hold(cfg.journal_on_frozen_fs)?;
        }
        if let Err(e) = guard.begin() {
            output::release();
            journal.set_hold(false)?;
            return Err(e);
        }
        let window_start = Instant::now();
        hooks::point("window-start");
        stats.windows += 1;

        let stop_reader = AtomicBool::new(false);
        let (full_tx, full_rx) = bounded::<ReadMsg>(cfg.read_ahead.max(1));
        let from = stats.next_chunk;
        let mut window_result: Result<WindowFlow> = Ok(WindowFlow::Complete);
        let mut end_result: Result<crate::freeze::WindowEnd> = Ok(Default::default());
        std::thread::scope(|s| {
            let reader = s.spawn(|| read_ahead(target, cfg, from, total, &free_rx, full_tx, &stop_reader));
            window_result = write_window(
                target,
                cfg,
                guard,
                journal,
                progress,
                stop,
                stats,
                &full_rx,
                &free_tx,
                verify_buf.as_mut(),
                window_start,
                budget,
                &mut chunk_estimate,
                done_before,
            );
            // Thaw first, then collect the reader: chunks still in flight are dropped.
            stop_reader.store(true, Ordering::SeqCst);
            hooks::point("window-end");
            end_result = guard.end();
            for m in full_rx.iter() {
                if let ReadMsg::Chunk { index, buf, .. } = m {
                    let len = cfg.chunk(index).1 as u64;
                    stats.bytes_read += len;
                    stats.bytes_read_ahead_dropped += len;
                    let _ = free_tx.send(buf);
                }
            }
            let unsent = reader.join().unwrap_or(0);
            stats.bytes_read_ahead_dropped += unsent;
            stats.bytes_read += unsent;
        });
        output::release();
        journal.set_hold(false)?;
        hooks::point("after-thaw");

        let end = end_result?;
        let frozen = end.frozen.as_secs_f64();
        stats.total_frozen_seconds += frozen;
        stats.longest_freeze_seconds = stats.longest_freeze_seconds.max(frozen);
        if freezes {
            log::debug!("window {} froze for {:.3} s; next chunk {}", stats.windows, frozen, stats.next_chunk);
        }
        let flow = window_result?;
        if end.overran || matches!(flow, WindowFlow::Overrun) {
            stats.windows_overrun += 1;
            return Err(Error::WindowOverrun {
                window: stats.windows,
                deadline_ms: guard.deadline().unwrap_or_default().as_millis() as u64,
            });
        }
        if let WindowFlow::Complete = flow {
            break;
        }
    }
    progress.finish();
    journal.finished()?;
    Ok(())
}

fn interrupted(cfg: &EngineConfig, stats: &EngineStats, signal: &'static str) -> Error {
    let done = (stats.next_chunk * cfg.chunk_size).min(cfg.range_end - cfg.range_start);
    Error::Interrupted { signal: signal.into(), done_bytes: done, total_bytes: cfg.range_end - cfg.range_start }
}

fn continue_if_stopped(cfg: &EngineConfig, stats: &EngineStats, stop: &StopFlag) -> Result<()> {
    match stop.signal() {
        Some(sig) => Err(interrupted(cfg, stats, sig)),
        None => Ok(()),
    }
}

/// The reader thread: reads and hashes chunks ahead. Returns the bytes it read that the
/// writer never took (counted as dropped by the caller).
fn read_ahead(
    target: &dyn BlockTarget,
    cfg: &EngineConfig,
    from: u64,
    total: u64,
    free_rx: &Receiver<AlignedBuf>,
    full_tx: Sender<ReadMsg>,
    stop: &AtomicBool,
) -> u64 {
    let mut unsent = 0;
    for i in from..total {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(mut buf) = free_rx.recv() else { break };
        let (offset, len) = cfg.chunk(i);
        match target.read_at(&mut buf[..len], offset) {
            Ok(()) => {
                let hash = blake3::hash(&buf[..len]);
                if full_tx.send(ReadMsg::Chunk { index: i, buf, hash }).is_err() {
                    unsent += len as u64;
                    break;
                }
            }
            Err(error) => {
                let _ = full_tx.send(ReadMsg::Failed { offset, error });
                break;
            }
        }
    }
    unsent
}

#[allow(clippy::too_many_arguments)]
fn write_window(
    target: &dyn BlockTarget,
    cfg: &EngineConfig,
    guard: &mut dyn WindowGuard,
    journal: &mut Journal,
    progress: &mut Progress,
    stop: &StopFlag,
    stats: &mut EngineStats,
    full_rx: &Receiver<ReadMsg>,
    free_tx: &Sender<AlignedBuf>,
    mut verify_buf: Option<&mut AlignedBuf>,
    window_start: Instant,
    budget: Option<Duration>,
    chunk_estimate: &mut Duration,
    done_before: u64,
) -> Result<WindowFlow> {
    let mut in_window = 0u64;
    for m in full_rx.iter() {
        let (index, buf, hash) = match m {
            ReadMsg::Chunk { index, buf, hash } => (index, buf, hash),
            ReadMsg::Failed { offset, error } => return Err(Error::io_at("reading the device", offset, error)),
        };
        let (offset, len) = cfg.chunk(index);
        stats.bytes_read += len as u64;
        if index != stats.next_chunk {
            return Err(Error::Internal(format!("chunk {index} arrived, expected {}", stats.next_chunk)));
        }
        if let Some(b) = budget
            && in_window > 0 && window_start.elapsed() + *chunk_estimate > b {
                stats.bytes_read_ahead_dropped += len as u64;
                let _ = free_tx.send(buf);
                return Ok(WindowFlow::BudgetSpent);
            }
        if let Some(sig) = stop.signal() {
            stats.bytes_read_ahead_dropped += len as u64;
            let _ = free_tx.send(buf);
            return Err(interrupted(cfg, stats, sig));
        }
        hooks::point("before-write");
        journal.begin(index, &hash)?;
        let t0 = Instant::now();
        if !guard.may_write()? {
            stats.bytes_read_ahead_dropped += len as u64;
            let _ = free_tx.send(buf);
            return Ok(WindowFlow::Overrun);
        }
        hooks::point("after-permit");
        let written = write_and_verify(target, &buf[..len], offset, &hash, verify_buf.as_deref_mut(), stats);
        // The guardian must hear "written" even on failure: the write is over either way.
        guard.wrote()?;
        written?;
        hooks::point("after-verify");
        journal.done(index, &hash)?;
        hooks::point("after-journal");
        let took = t0.elapsed();
        // Estimate from the slower of the last chunk and a decaying average, so one
        // fast chunk does not make the next window overrun.
        *chunk_estimate = took.max(chunk_estimate.mul_f64(0.8));
        stats.chunks_written += 1;
        stats.next_chunk = index + 1;
        in_window += 1;
        progress.advance(len as u64, done_before);
        let _ = free_tx.send(buf);
    }
    Ok(WindowFlow::Complete)
}

fn write_and_verify(
    target: &dyn BlockTarget,
    data: &[u8],
    offset: u64,
    hash: &blake3::Hash,
    verify_buf: Option<&mut AlignedBuf>,
    stats: &mut EngineStats,
) -> Result<()> {
    target.write_at(data, offset).map_err(|e| Error::io_at("writing the device", offset, e))?;
    stats.bytes_written += data.len() as u64;
    hooks::point("after-write");
    target.flush().map_err(|e| Error::io_at("flushing the device after writing", offset, e))?;
    if let Some(vbuf) = verify_buf {
        let back = &mut vbuf[..data.len()];
        target.read_at(back, offset).map_err(|e| Error::io_at("reading back", offset, e))?;
        let after = blake3::hash(back);
        stats.bytes_verified += data.len() as u64;
        if after != *hash {
            // Still inside the freeze and the write permit: put the bytes we read back
            // once more, so the device holds what it held before reseq touched it, then
            // stop with the original error whatever the repair gives.
            let repaired = target
                .write_at(data, offset)
                .and_then(|()| target.flush())
                .and_then(|()| target.read_at(back, offset))
                .map(|()| blake3::hash(back) == *hash);
            let repair = match repaired {
                Ok(true) => "the original bytes were written again and now read back correctly".to_string(),
                Ok(false) => "the original bytes were written again and STILL read back differently: the device is failing".to_string(),
                Err(e) => format!("writing the original bytes again failed: {e}"),
            };
            log::error!("checksum mismatch at offset {offset}: {repair}");
            return Err(Error::ChecksumMismatch {
                offset,
                len: data.len() as u64,
                before: hash.to_hex().to_string(),
                after: after.to_hex().to_string(),
            });
        }
    }
    Ok(())
}
