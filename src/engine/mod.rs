//! The rewrite engine: chunks in ascending order, one writer, reads overlapped.
//!
//! Why this shape: an FTL places data in the order writes arrive, so the only order that
//! re-linearizes is ascending offsets from a single writer, in large chunks (see
//! docs/FTL-MODEL.md: interleaved writers or descending order leave reads
//! 15-50 % slower). Parallel writes would be faster to issue and worse for the drive.
//!
//! Per window, after the freeze, four stages run as threads joined by bounded channels:
//!
//! ```text
//!  reader ──raw──▶ hasher ──hashed──▶ writer (this thread) ──written──▶ verifier
//!    ▲  O_DIRECT read   blake3          permit, O_DIRECT write           read back, blake3,
//!    └──────────────── pool of aligned buffers ◀─────────────────────── compare ─┘
//! ```
//!
//! Only the writer writes, one chunk at a time, in ascending order; the stages around it
//! only keep it busy (measured on the CI VM: hashing in the reader thread and a read-back
//! between writes cost 35-50 % of throughput, see docs/CHUNK-SIZE.md). Before each write
//! the writer asks the guardian for permission; the verifier reports each read-back, and
//! the guardian does not thaw while a write or its read-back is outstanding.
//! When the window's budget is spent the writer stops, waits for the verifier, and the
//! window thaws. Chunks read ahead are dropped, never written after a thaw, and read again
//! in the next window. Then the device is flushed and the verified chunks are journaled
//! as done (one journal fsync per commit, not per chunk).

pub(crate) mod guard;
pub(crate) mod identity;
pub mod journal;
pub(crate) mod pace;
pub mod rescue;
pub(crate) mod target;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError, bounded};

use crate::engine::guard::{Reporter, WindowEnd, WindowGuard};
use crate::engine::journal::Journal;
use crate::engine::pace::Pace;
use crate::engine::rescue::RescueTo;
use crate::engine::target::BlockTarget;
use crate::support::error::{Error, LeftState, Result};
use crate::support::hooks;
use crate::support::output::{self, Progress};
use crate::support::signals::StopFlag;
use crate::sys::{self, AlignedBuf};

/// What to rewrite and how.
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    /// Bytes per chunk; a multiple of the target's offset alignment.
    pub(crate) chunk_size: u64,
    /// First byte of the range (aligned).
    pub(crate) range_start: u64,
    /// One past the last byte of the range (aligned).
    pub(crate) range_end: u64,
    /// Where to start (after a resume: where the journal says the last run stopped).
    pub(crate) start_offset: u64,
    /// Read back and compare every chunk after writing it.
    pub(crate) verify: bool,
    /// Chunks read ahead of the writer (the pool holds this many plus one).
    pub(crate) read_ahead: usize,
    /// Gap between windows (thawed).
    pub(crate) pause: Duration,
    /// Hold the journal in memory during windows (its filesystem is frozen).
    pub(crate) journal_on_frozen_fs: bool,
    /// Stop (exit "window overrun") when this many windows have overrun their deadline.
    /// Before that, each overrun halves the share of the deadline the writer uses.
    pub(crate) max_overruns: u32,
    /// Average write rate to stay under, in bytes per second (None: as fast as it goes).
    /// Enforced by lengthening the pause *between* windows: sleeping inside a window
    /// would lengthen the freeze.
    pub(crate) rate_bytes_per_second: Option<u64>,
    /// Where the original bytes of a chunk go when its write fails, tears or reads back
    /// different (None: nowhere, e.g. a simulation; the error still names the range).
    pub(crate) rescue: Option<RescueTo>,
}

/// Attempts at writing one chunk, the first included: a failed write is retried (and
/// each retry read back) this many times in all before the run stops.
pub(crate) const WRITE_ATTEMPTS: u32 = 3;

impl EngineConfig {
    pub(crate) fn chunks_total(&self) -> u64 {
        (self.range_end - self.range_start).div_ceil(self.chunk_size)
    }

    /// Splits ascending `(offset, length)` ranges, clipped to the range, into chunks of
    /// at most `chunk_size` (the engine's current size, which adapts per window).
    pub(crate) fn chunks_of(&self, ranges: &[(u64, u64)], chunk_size: u64) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        for &(off, len) in ranges {
            let end = (off + len).min(self.range_end);
            let mut at = off.max(self.range_start);
            while at < end {
                let n = (end - at).min(chunk_size);
                out.push((at, n as usize));
                at += n;
            }
        }
        out
    }

    /// Bytes per buffer: a chunk, or the whole range when that is smaller (a small
    /// file's run should not allocate, and zero, megabytes it never uses).
    fn buffer_bytes(&self) -> u64 {
        self.chunk_size.min((self.range_end - self.range_start).max(1))
    }

    /// Bytes of aligned buffers the engine allocates.
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.pool_size() as u64 + u64::from(self.verify)) * self.buffer_bytes()
    }

    /// Buffers in the pool: the read-ahead, the one being written, the one being read by
    /// the reader, and with verification the one awaiting its read-back.
    fn pool_size(&self) -> usize {
        self.read_ahead.max(1) + 2 + usize::from(self.verify)
    }
}

/// Within one long window (an unmounted device is a single window), finished chunks
/// are flushed and journaled at least this often, so a crash loses little progress.
pub(crate) const COMMIT_INTERVAL_BYTES: u64 = 256 << 20;

/// What a run did, also when it stopped early.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct EngineStats {
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
    pub(crate) bytes_verified: u64,
    pub(crate) chunks_written: u64,
    /// Chunks that a previous run had finished (skipped on resume).
    pub(crate) chunks_already_done: u64,
    /// Bytes read ahead and dropped at window ends (read again later, never written).
    pub(crate) bytes_read_ahead_dropped: u64,
    pub(crate) windows: u64,
    pub(crate) windows_overrun: u64,
    pub(crate) longest_freeze_seconds: f64,
    pub(crate) total_frozen_seconds: f64,
    /// Everything before this offset is done (rewritten and journaled, or left out by
    /// the plan); `range_end` when complete.
    pub(crate) next_offset_bytes: u64,
    /// Where the time went, stage by stage (the stages overlap; see the module docs).
    #[serde(default)]
    pub(crate) stages: StageSeconds,
    /// Wall time of the rewrite itself (a benchmark before or after is not in it).
    #[serde(default)]
    pub(crate) rewrite_seconds: f64,
    /// Seconds frozen, window by window (file mode reports each file's windows).
    #[serde(skip)]
    pub(crate) window_seconds: Vec<f64>,
}

/// Busy time of each stage, in seconds, summed over the run. The reader, hasher and
/// verifier run beside the writer, so these add up to more than the wall time; the
/// writer's own time is `permit` + `write` + `writer_waiting` (for the next hashed chunk).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct StageSeconds {
    pub(crate) read: f64,
    pub(crate) hash: f64,
    pub(crate) permit: f64,
    pub(crate) write: f64,
    /// Read back and compare (the verifier).
    pub(crate) read_back: f64,
    pub(crate) writer_waiting: f64,
}

/// Decides what to rewrite next. Called at the start of every window, *while frozen*,
/// with the offset where the previous window stopped: it returns the ranges at or after
/// it to rewrite, ascending. Re-planning in every window is what lets the layout change
/// between windows (a filesystem allocates, frees, moves), and planning while frozen is
/// what makes the plan true for the whole window.
pub(crate) trait Planner {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>>;
    /// Where the last plan ends: a window that does all of it has done everything
    /// before this offset (file mode maps a window's worth of files at a time).
    fn planned_until(&self, end: u64) -> u64 {
        end
    }
}

/// Rewrites everything: the whole range.
pub(crate) struct Everything;

impl Planner for Everything {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        Ok(if cursor < end { vec![(cursor, end - cursor)] } else { Vec::new() })
    }
}

/// An aligned buffer on loan from the engine's pool: it goes back when dropped, however
/// the chunk holding it ends (written, dropped at a window's end, failed), so no path
/// can forget to return it and starve the reader.
struct Pooled {
    buf: Option<AlignedBuf>,
    home: Sender<AlignedBuf>,
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
struct Chunk {
    /// Position in this window's chunk list.
    index: u64,
    offset: u64,
    len: usize,
    buf: Pooled,
    hash: blake3::Hash,
}

enum Staged {
    /// A chunk read, not yet hashed.
    Read {
        index: u64,
        offset: u64,
        len: usize,
        buf: Pooled,
    },
    Hashed(Chunk),
    Failed {
        offset: u64,
        error: std::io::Error,
    },
}

/// A verifier's answer for one written chunk.
struct Verified {
    chunk: Chunk,
    result: Result<()>,
    /// How long the read-back took.
    took: Duration,
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

/// What the stages of one window came to.
struct Ran {
    /// How the window ended (thawed), or why it could not end cleanly.
    end: Result<WindowEnd>,
    /// What stopped the writer.
    flow: Result<WindowFlow>,
    /// Bytes the reader read, and bytes the writer took of them.
    read: u64,
    taken: u64,
}

/// The channels the writer works between.
struct Pipes<'a> {
    hashed: &'a Receiver<Staged>,
    written: &'a Sender<Chunk>,
    verified: &'a Receiver<Verified>,
    /// How many chunks the reader was given: its channel closing before the last of them
    /// is not the end of the window.
    chunks: usize,
}

/// The writer's counts within one window.
#[derive(Default)]
struct Tally {
    /// Written, read-back not yet settled.
    outstanding: u32,
    /// Chunks written in this window.
    in_window: u64,
    /// Chunks taken from the hasher (the next one's index).
    taken_chunks: u64,
    last_step: Option<Instant>,
    since_commit: u64,
}

/// Whether a chunk may be written.
enum Start {
    /// Yes; the permit was asked for at this instant.
    Go(Instant),
    /// No: the window ends here.
    Stop(WindowFlow),
}

/// Rewrites the configured range of `target`, window by window. Returns the stats in
/// every case, with the error that stopped the run, if any.
pub(crate) fn run(
    target: &dyn BlockTarget,
    cfg: &EngineConfig,
    planner: &mut dyn Planner,
    guard: &mut dyn WindowGuard,
    journal: &mut Journal,
    progress: &mut Progress,
    stop: &StopFlag,
) -> (EngineStats, Result<()>) {
    let mut stats = EngineStats { next_offset_bytes: cfg.start_offset.max(cfg.range_start), ..Default::default() };
    let mut engine = Engine {
        target,
        cfg,
        journal,
        progress,
        stop,
        stats: &mut stats,
        pool: bounded(cfg.pool_size()),
        verified: Vec::new(),
        chunk_estimate: Duration::ZERO,
        pace: Pace::default(),
        failed: false,
        chunk_size: cfg.chunk_size,
        window_written: None,
        rescued: Vec::new(),
        started: Instant::now(),
        plan_end: cfg.range_end,
    };
    let result = engine.run_windows(planner, guard);
    stats.rewrite_seconds = engine.started.elapsed().as_secs_f64();
    (stats, result)
}

struct Engine<'a> {
    target: &'a dyn BlockTarget,
    cfg: &'a EngineConfig,
    journal: &'a mut Journal,
    progress: &'a mut Progress,
    stop: &'a StopFlag,
    stats: &'a mut EngineStats,
    /// Free aligned buffers.
    pool: (Sender<AlignedBuf>, Receiver<AlignedBuf>),
    /// Written and verified, not yet flushed and journaled: (offset, length, blake3).
    verified: Vec<(u64, u64, blake3::Hash)>,
    /// How long one chunk takes the writer (decaying maximum): sets the chunk size.
    chunk_estimate: Duration,
    /// What the end of a window costs: when to stop starting chunks.
    pace: Pace,
    /// A chunk failed: later chunks are not recorded as done.
    failed: bool,
    /// The chunk size of the next window (adapts; at most `cfg.chunk_size`).
    chunk_size: u64,
    /// Device bytes written in the current window (first offset, end).
    window_written: Option<(u64, u64)>,
    /// Rescue copies saved in this window: where (or why not), and whether the cause was
    /// a differing read-back.
    rescued: Vec<(std::result::Result<PathBuf, String>, bool)>,
    /// When the run began: `--rate` counts from here.
    started: Instant,
    /// Where this window's plan ends ([`Planner::planned_until`]).
    plan_end: u64,
}

/// How far ahead of `--rate` a window may write before it ends and a pause makes up
/// the time.
const RATE_BURST: Duration = Duration::from_millis(250);

impl Engine<'_> {
    fn run_windows(&mut self, planner: &mut dyn Planner, guard: &mut dyn WindowGuard) -> Result<()> {
        for _ in 0..self.cfg.pool_size() {
            self.pool
                .0
                .send(AlignedBuf::new(self.cfg.buffer_bytes() as usize, self.target.mem_align()))
                .expect("pool has room");
        }
        // The writer starts a chunk only when it, the read-backs and the thaw fit in the
        // budget as measured (see `pace`); each overrun halves the share of the deadline
        // the budget is, and clean windows double it back.
        let mut share = pace::Share::default();
        while self.stats.next_offset_bytes < self.cfg.range_end {
            let budget = guard.deadline().map(|d| d.mul_f64(share.get()));
            self.pause_between_windows()?;
            self.pace.fade();
            let (end, flow) = self.window(planner, guard, budget)?;
            if self.account_window(guard, end, flow, budget, &mut share)? {
                break;
            }
        }
        self.progress.finish();
        self.journal.finished()
    }

    /// Before a window: a stop asked for ends the run; after the first window, the
    /// pause (`--pause`, or longer if the run is ahead of `--rate`), which a stop cuts
    /// short.
    fn pause_between_windows(&mut self) -> Result<()> {
        if let Some(sig) = self.stop.signal() {
            return Err(self.interrupted(sig));
        }
        let ahead = self.cfg.rate_bytes_per_second.filter(|&r| r > 0).map_or(Duration::ZERO, |rate| {
            let due = Duration::from_secs_f64(self.stats.bytes_written as f64 / rate as f64);
            due.saturating_sub(self.started.elapsed())
        });
        let pause = self.cfg.pause.max(ahead);
        if self.stats.windows > 0 && !pause.is_zero() {
            self.stop.sleep(pause);
            if let Some(sig) = self.stop.signal() {
                return Err(self.interrupted(sig));
            }
        }
        Ok(())
    }

    /// Counts a window's freeze and decides what follows it: `Ok(true)` when the run is
    /// complete, `Ok(false)` for another window, an error when the bound was broken,
    /// the writer failed, or too many windows overran. An overrun halves `share`; clean
    /// windows grow it back.
    fn account_window(
        &mut self,
        guard: &mut dyn WindowGuard,
        end: WindowEnd,
        flow: Result<WindowFlow>,
        full: Option<Duration>,
        share: &mut pace::Share,
    ) -> Result<bool> {
        let frozen = end.frozen.as_secs_f64();
        self.stats.total_frozen_seconds += frozen;
        self.stats.window_seconds.push(frozen);
        self.stats.longest_freeze_seconds = self.stats.longest_freeze_seconds.max(frozen);
        if guard.freezes() {
            log::debug!(
                "window {} froze for {frozen:.3} s; next chunk {}",
                self.stats.windows,
                self.stats.next_offset_bytes
            );
        }
        if let Some(bound) = end.beyond_bound {
            self.stats.windows_overrun += 1;
            return Err(Error::BoundBroken {
                window: self.stats.windows,
                frozen_ms: end.frozen.as_millis() as u64,
                bound_ms: bound.as_millis() as u64,
            });
        }
        let flow = flow?;
        let overran = end.overran || matches!(flow, WindowFlow::Overrun);
        self.adapt_chunk_size(full, overran);
        if overran {
            self.overran(guard.deadline().unwrap_or_default(), share)?;
            // The writer stopped short of the end: not complete.
            return Ok(false);
        }
        if guard.freezes() && share.clean() {
            let deadline = guard.deadline().unwrap_or_default();
            log::info!(
                "{} clean windows: new chunks now stop at {} ms again",
                pace::GROW_AFTER,
                deadline.mul_f64(share.get()).as_millis()
            );
        }
        Ok(matches!(flow, WindowFlow::Complete) && self.stats.next_offset_bytes >= self.cfg.range_end)
    }

    /// A window overran its deadline: an error once `--max-overruns` have, else the
    /// next windows use a smaller share of it.
    fn overran(&mut self, deadline: Duration, share: &mut pace::Share) -> Result<()> {
        self.stats.windows_overrun += 1;
        if self.stats.windows_overrun >= u64::from(self.cfg.max_overruns) {
            return Err(Error::WindowOverrun {
                window: self.stats.windows,
                overruns: self.stats.windows_overrun,
                deadline_ms: deadline.as_millis() as u64,
            });
        }
        share.overran();
        log::warn!(
            "freeze window {} overran its {} ms deadline; the guardian thawed, nothing was written after it. Continuing with windows that stop new chunks at {} ms (doubling back after {} clean windows)",
            self.stats.windows,
            deadline.as_millis(),
            deadline.mul_f64(share.get()).as_millis(),
            pace::GROW_AFTER
        );
        Ok(())
    }

    /// One freeze window. The outer error is about the window machinery (freeze, thaw,
    /// journal); the inner one is what stopped the writer.
    fn window(
        &mut self,
        planner: &mut dyn Planner,
        guard: &mut dyn WindowGuard,
        budget: Option<Duration>,
    ) -> Result<(WindowEnd, Result<WindowFlow>)> {
        if !guard.freezes() {
            return self.frozen_window(planner, guard, budget);
        }
        // A Ctrl-Z during the window waits for its end: a stopped reseq would hold the
        // freeze until the guardian's bound, and fail the run.
        sys::enter_window();
        self.window_written = None;
        let r = self.frozen_window(planner, guard, budget);
        let r = r.map(|(end, flow)| (end, flow.map_err(|e| self.locate(e)))).map_err(|e| self.locate(e));
        if sys::leave_window() {
            log::info!("continued after a stop (SIGTSTP) that waited for the window to end");
        }
        r
    }

    /// Names the window and the bytes it wrote in an error about a lost freeze.
    fn locate(&self, e: Error) -> Error {
        match e {
            Error::FreezeLost { filesystem, foreign, .. } => {
                Error::FreezeLost { filesystem, foreign, window: self.stats.windows, written: self.window_written }
            }
            e => e,
        }
    }

    /// One window: open it (freeze), plan while frozen, run the stages, close it (thaw,
    /// then flush and journal what was verified).
    fn frozen_window(
        &mut self,
        planner: &mut dyn Planner,
        guard: &mut dyn WindowGuard,
        budget: Option<Duration>,
    ) -> Result<(WindowEnd, Result<WindowFlow>)> {
        let window_start = self.open_window(guard)?;
        // Plan while frozen. If planning fails, the window still ends (thaws) here.
        let chunks = match planner.ranges(self.stats.next_offset_bytes, self.cfg.range_end) {
            Ok(ranges) => {
                self.plan_end = planner.planned_until(self.cfg.range_end);
                self.cfg.chunks_of(&ranges, self.chunk_size)
            }
            Err(e) => {
                let _ = guard.end();
                self.release_hold()?;
                return Err(e);
            }
        };
        let ran = self.run_stages(guard, &chunks, window_start, budget);
        self.close_window(ran)
    }

    /// Holds output and (if asked) journal records, and starts the window (freezes).
    /// Returns when the window's clock started.
    fn open_window(&mut self, guard: &mut dyn WindowGuard) -> Result<Instant> {
        if guard.freezes() {
            output::hold();
            self.journal.set_hold(self.cfg.journal_on_frozen_fs)?;
        }
        // The guardian's deadline starts before the first FIFREEZE; so does our clock.
        let window_start = Instant::now();
        if let Err(e) = guard.begin() {
            self.release_hold()?;
            if let (Error::Interrupted { .. }, Some(sig)) = (&e, self.stop.signal()) {
                return Err(self.interrupted(sig));
            }
            return Err(e);
        }
        hooks::point("window-start");
        self.stats.windows += 1;
        Ok(window_start)
    }

    /// A window that never ran lets go of held output and journal records. Releasing the
    /// journal's can fail (they are written then), so it is a call with a result, not a
    /// destructor.
    fn release_hold(&mut self) -> Result<()> {
        output::release();
        self.journal.set_hold(false)
    }

    /// Runs the four stages over `chunks` until the writer stops, then ends the window
    /// (thaws) once every write and read-back has been reported.
    fn run_stages(
        &mut self,
        guard: &mut dyn WindowGuard,
        chunks: &[(u64, usize)],
        window_start: Instant,
        budget: Option<Duration>,
    ) -> Ran {
        let stop_reader = AtomicBool::new(false);
        let (raw_tx, raw_rx) = bounded::<Staged>(1);
        let (hashed_tx, hashed_rx) = bounded::<Staged>(self.cfg.read_ahead.max(1));
        let (written_tx, written_rx) = bounded::<Chunk>(1);
        let (verified_tx, verified_rx) = bounded::<Verified>(2);
        let (target, cfg) = (self.target, self.cfg);
        let pool = self.pool.clone();
        let urgent = guard.freezes();
        let mut ran = Ran { end: Ok(WindowEnd::default()), flow: Ok(WindowFlow::Complete), read: 0, taken: 0 };
        ran.flow = std::thread::scope(|s| {
            let reader = s.spawn(|| or_abort("reader", || read_stage(target, chunks, &pool, raw_tx, &stop_reader)));
            let hasher = s.spawn(move || or_abort("hasher", || hash_stage(raw_rx, hashed_tx)));
            let verifier = if cfg.verify {
                let reporter = guard.reporter();
                let verify = move || {
                    let _rt = Urgent::raise(urgent);
                    verify_stage(target, cfg, written_rx, verified_tx, reporter)
                };
                Some(s.spawn(move || or_abort("verifier", verify)))
            } else {
                drop((written_rx, verified_tx));
                None
            };
            or_abort("writer", || {
                let _rt = Urgent::raise(urgent);
                let pipes =
                    Pipes { hashed: &hashed_rx, written: &written_tx, verified: &verified_rx, chunks: chunks.len() };
                let flow = self.write_window(guard, &pipes, window_start, budget, &mut ran.taken);
                // Every write and read-back has been reported: thaw, then let the stages wind
                // down. What they still hold was read in this window and is dropped (its
                // buffers go back to the pool as they drop).
                let stopped = Instant::now();
                stop_reader.store(true, Ordering::SeqCst);
                drop(written_tx);
                hooks::point("window-end");
                ran.end = guard.end();
                self.pace.thawed(stopped.elapsed());
                hashed_rx.iter().for_each(drop);
                let (read, read_time) = reader.join().unwrap_or_default();
                ran.read = read;
                self.stats.stages.read += read_time.as_secs_f64();
                self.stats.stages.hash += hasher.join().unwrap_or_default().as_secs_f64();
                if let Some(v) = verifier {
                    self.stats.stages.read_back += v.join().unwrap_or_default().as_secs_f64();
                }
                flow
            })
        });
        ran
    }

    /// After the thaw: rescue copies settle, held output and journal records go out,
    /// and what the window verified is flushed and journaled.
    fn close_window(&mut self, ran: Ran) -> Result<(WindowEnd, Result<WindowFlow>)> {
        let Ran { end, flow, read, taken } = ran;
        output::release();
        let lost = matches!(end, Err(Error::FreezeLost { .. })) || matches!(flow, Err(Error::FreezeLost { .. }));
        // Named in whatever error ends the run, the journal's own included.
        let rescued = self.settle_rescues(lost);
        let attach = |e: Error| match &rescued {
            Some(text) => e.with_rescue(text.clone()),
            None => e,
        };
        self.journal.set_hold(false).map_err(attach)?;
        hooks::point("after-thaw");
        self.stats.bytes_read += read;
        self.stats.bytes_read_ahead_dropped += read.saturating_sub(taken);
        let flow = flow.map_err(attach);
        let end = end.map_err(attach)?;
        // Flushed and journaled after the thaw: nothing here needs the freeze, and the
        // filesystem should not wait for the device's cache flush.
        self.commit().map_err(attach)?;
        if matches!(flow, Ok(WindowFlow::Complete)) {
            // Everything the plan asked for is done; what it left out needs nothing.
            self.stats.next_offset_bytes = self.plan_end;
        }
        Ok((end, flow))
    }

    /// Chunks adapt to the window: when one chunk takes more than a quarter of the budget
    /// (a slow device, a busy host), or a window overran, the next windows use chunks
    /// half the size, down to 64 KiB; when chunks are quick again they grow back towards
    /// `--chunk-size`. Smaller chunks let a window end closer to its budget.
    fn adapt_chunk_size(&mut self, budget: Option<Duration>, overran: bool) {
        let Some(budget) = budget else { return };
        let floor = (64 << 10u64).max(self.target.offset_align());
        let before = self.chunk_size;
        if overran || self.chunk_estimate > budget / 4 {
            self.chunk_size = (self.chunk_size / 2).max(floor);
        } else if self.chunk_estimate < budget / 16 {
            self.chunk_size = (self.chunk_size * 2).min(self.cfg.chunk_size);
        }
        // Keep offsets aligned for direct I/O.
        self.chunk_size = self.chunk_size / self.target.offset_align() * self.target.offset_align();
        if self.chunk_size != before {
            log::debug!("chunk size {} -> {} (last chunk took {:?})", before, self.chunk_size, self.chunk_estimate);
            self.chunk_estimate = self.chunk_estimate.mul_f64(self.chunk_size as f64 / before as f64);
        }
    }

    /// Whether writing `more` bytes now would put the run ahead of `--rate` by more than
    /// [`RATE_BURST`] of it (a window of its own at most four times a second: each
    /// freeze costs the filesystem a commit).
    fn ahead_of_rate(&self, more: u64) -> bool {
        self.cfg.rate_bytes_per_second.filter(|&r| r > 0).is_some_and(|rate| {
            let allowed = rate as f64 * (self.started.elapsed() + RATE_BURST).as_secs_f64();
            (self.stats.bytes_written + more) as f64 > allowed
        })
    }

    fn interrupted(&self, signal: &'static str) -> Error {
        let done = self.stats.next_offset_bytes - self.cfg.range_start;
        Error::Interrupted {
            signal: signal.into(),
            done_bytes: done,
            total_bytes: self.cfg.range_end - self.cfg.range_start,
        }
    }

    /// Makes verified chunks durable (device flush), then records them as done (in the
    /// journal's memory only while it is held).
    fn commit(&mut self) -> Result<()> {
        let Some(&(first, ..)) = self.verified.first() else { return Ok(()) };
        self.target.flush().map_err(|e| Error::io_at("flushing the device's write cache", first, e))?;
        for (offset, len, hash) in std::mem::take(&mut self.verified) {
            self.journal.done(offset, len, &hash)?;
            self.stats.next_offset_bytes = offset + len;
        }
        self.journal.commit()?;
        hooks::point("after-journal");
        Ok(())
    }

    /// Accounts for one chunk whose write (and read-back) is over. With verification the
    /// verifier has already told the guardian; without, the writer tells it here.
    fn settle(&mut self, guard: &mut dyn WindowGuard, v: Verified) -> Result<()> {
        // The guardian must hear "written" even on failure: the write is over either way.
        let told = if self.cfg.verify { Ok(()) } else { guard.wrote() };
        let len = v.chunk.len as u64;
        if self.cfg.verify {
            self.stats.bytes_verified += len;
            self.pace.read_back.learn(len, v.took, self.chunk_size);
        }
        let (offset, hash) = (v.chunk.offset, v.chunk.hash);
        if let Err(e) = &v.result {
            // Written but not read back as written: keep the original bytes.
            let left = match e {
                Error::ChecksumMismatch { after, .. } => Some(blake3::Hash::from_hex(after).ok()),
                Error::Io { .. } => Some(None),
                _ => None,
            };
            if let Some(left) = left {
                self.keep(&v.chunk, left, true);
            }
        }
        drop(v.chunk);
        if let Err(e) = told.and(v.result) {
            // Chunks after a failed one may verify fine, but the journal's cursor must
            // not pass the failed chunk: nothing more is recorded as done this run.
            self.failed = true;
            return Err(e);
        }
        if self.failed {
            return Ok(());
        }
        hooks::point("after-verify");
        self.accept(offset, len, hash);
        Ok(())
    }

    /// A chunk written and read back as written: journaled as done at the next commit.
    fn accept(&mut self, offset: u64, len: u64, hash: blake3::Hash) {
        self.verified.push((offset, len, hash));
        self.progress.advance(len);
    }

    /// A chunk's write failed: try again, each time with the guardian's permission and a
    /// read-back, up to [`WRITE_ATTEMPTS`] in all. Accepted only when a read-back
    /// matches the blake3 the chunk was read with; otherwise its original bytes are kept
    /// for a rescue file and the error says what the device holds there now.
    fn retry_write(&mut self, guard: &mut dyn WindowGuard, chunk: &Chunk, first: std::io::Error) -> Result<()> {
        let (offset, len) = (chunk.offset, chunk.len);
        let first_left = self.read_back(offset, len);
        let mut left = first_left;
        // Kept before any retry: a kill while retrying must not lose the bytes.
        self.keep(chunk, left, false);
        let mut last = first;
        let mut attempts = 1;
        while attempts < WRITE_ATTEMPTS && self.stop.signal().is_none() {
            log::warn!(
                "writing {len} bytes at offset {offset} failed ({last}); retrying ({} of {})",
                attempts + 1,
                WRITE_ATTEMPTS
            );
            // No permission (the window's deadline passed): no more attempts here.
            if !self.ask(guard, chunk)? {
                break;
            }
            attempts += 1;
            let wrote = self.target.write_at(&chunk.buf[..len], offset);
            left = self.read_back(offset, len);
            guard.wrote()?;
            match wrote {
                Ok(()) if left == Some(chunk.hash) => {
                    log::warn!("the write at offset {offset} succeeded on attempt {attempts} and read back as written");
                    self.unkeep();
                    return Ok(());
                }
                Ok(()) => last = std::io::Error::other("the retried write completed but read back different"),
                Err(e) => last = e,
            }
        }
        if left != first_left {
            // What the device holds now is what restore must find there.
            self.keep(chunk, left, false);
        }
        let state = LeftState::of(left, &chunk.hash);
        Err(Error::WriteFailed { offset, len: len as u64, attempts, cause: last, left: state, rescue: None })
    }

    /// The blake3 of what the device holds at a chunk's place (None: unreadable).
    fn read_back(&self, offset: u64, len: usize) -> Option<blake3::Hash> {
        rescue::range_hash(self.target, offset, len as u64).ok()
    }

    /// Asks the guardian to write `chunk`, naming it (device offset, length, blake3), so
    /// that a guardian that must kill reseq mid-write can check what the write left.
    fn ask(&self, guard: &mut dyn WindowGuard, chunk: &Chunk) -> Result<bool> {
        if let Some(at) = self.target.device_offset(chunk.offset, chunk.len as u64) {
            guard.announce(at, chunk.len as u64, &chunk.hash);
        }
        guard.may_write()
    }

    /// Saves a copy of a chunk's original bytes at once: a kill before the thaw (the
    /// guardian's, or anyone's) must not take them along. While the state directory's
    /// filesystem is frozen, into the run directory (moved after the thaw). Saving the
    /// same chunk again (a retry changed what the device holds) replaces the copy.
    fn keep(&mut self, chunk: &Chunk, left: Option<blake3::Hash>, mismatch: bool) {
        let data = &chunk.buf[..chunk.len];
        let Some(to) = &self.cfg.rescue else {
            log::error!("no rescue directory: the original bytes at offset {} are not kept", chunk.offset);
            return;
        };
        let at = self.target.device_offset(chunk.offset, chunk.len as u64).unwrap_or(chunk.offset);
        let reason = if mismatch {
            "read back different from what was written"
        } else {
            LeftState::of(left, &chunk.hash).reason()
        };
        let p = to.pending(at, data, &chunk.hash, left, reason, chunk.offset);
        let dirs = if self.cfg.journal_on_frozen_fs { vec![rescue::run_dir()] } else { rescue::dirs(&to.dir) };
        let saved = rescue::save_first(&dirs, &p);
        self.rescued.retain(|(r, _)| !matches!((r, &saved), (Ok(a), Ok(b)) if a == b));
        self.rescued.push((saved, mismatch));
    }

    /// A retried write verified after all: its copy is not needed.
    fn unkeep(&mut self) {
        if let Some((Ok(path), _)) = self.rescued.pop() {
            let _ = rescue::remove(&path);
        }
    }

    /// After the window: copies in the run directory move to the state directory (once
    /// thawed), and the error gets a sentence per copy. When the freeze was lost, a
    /// differing read-back was the filesystem's own write (its pre-read bytes are older
    /// than what it wrote): that copy is dropped, and the error names the range instead.
    fn settle_rescues(&mut self, freeze_lost: bool) -> Option<String> {
        let to = self.cfg.rescue.as_ref()?;
        let rescued = std::mem::take(&mut self.rescued);
        let mut lines = Vec::new();
        for (saved, mismatch) in rescued {
            match saved.map(|p| p.to_path_buf()) {
                Ok(path) if freeze_lost && mismatch => {
                    log::warn!(
                        "the freeze was lost in this window: the differing read-back is the filesystem's own write; no rescue copy kept"
                    );
                    let _ = rescue::remove(&path);
                }
                Ok(path) => {
                    let path = rescue::settle_in(&to.dir, &path);
                    lines.push(format!(
                        "The original bytes are saved in {}: once the device is fixed, put them back with `{}`",
                        path.display(),
                        rescue::restore_command(&path)
                    ));
                }
                Err(e) => lines.push(e),
            }
        }
        (!lines.is_empty()).then(|| lines.join("; "))
    }

    /// The writer's loop: takes hashed chunks in order and writes each with the
    /// guardian's permit, until the chunks, the budget or the permits run out, or an
    /// error. Every outstanding read-back is settled before it returns.
    fn write_window(
        &mut self,
        guard: &mut dyn WindowGuard,
        pipes: &Pipes,
        window_start: Instant,
        budget: Option<Duration>,
        taken: &mut u64,
    ) -> Result<WindowFlow> {
        let mut w = Tally::default();
        let mut write = || loop {
            // Settle read-backs that have finished, without waiting.
            self.settle_ready(guard, pipes.verified, &mut w.outstanding)?;
            let Some(chunk) = self.next_chunk(pipes, w.taken_chunks)? else { return Ok(WindowFlow::Complete) };
            // Again after waiting for the reader: the read-backs still queued decide
            // whether this chunk fits.
            self.settle_ready(guard, pipes.verified, &mut w.outstanding)?;
            match self.start_chunk(guard, &chunk, &mut w, window_start, budget, taken)? {
                Start::Go(t0) => self.write_chunk(guard, chunk, pipes, &mut w, t0)?,
                Start::Stop(flow) => return Ok(flow),
            }
        };
        let flow = write();
        // Every outstanding read-back finishes inside the window, whatever stopped it.
        let settled = self.settle_all(guard, pipes.verified, &mut w.outstanding);
        flow.and_then(|f| settled.map(|()| f))
    }

    /// The next hashed chunk, in order (None: the window's chunks are all taken).
    fn next_chunk(&mut self, pipes: &Pipes, expected: u64) -> Result<Option<Chunk>> {
        let waiting = Instant::now();
        let received = pipes.hashed.recv();
        self.stats.stages.writer_waiting += waiting.elapsed().as_secs_f64();
        let Ok(staged) = received else {
            return match expected < pipes.chunks as u64 {
                true => Err(Error::Internal(format!("the reader stopped after {expected} of {} chunks", pipes.chunks))),
                false => Ok(None),
            };
        };
        match staged {
            Staged::Hashed(c) if c.index == expected => Ok(Some(c)),
            Staged::Hashed(c) => Err(Error::Internal(format!("chunk {} arrived, expected {expected}", c.index))),
            Staged::Failed { offset, error } => Err(Error::io_at("reading the device", offset, error)),
            Staged::Read { .. } => Err(Error::Internal("an unhashed chunk reached the writer".into())),
        }
    }

    /// Everything before a chunk's write: room in the budget, no stop asked for, the
    /// guard's checks, the chunk's `begin` in the journal, then the guardian's permit.
    fn start_chunk(
        &mut self,
        guard: &mut dyn WindowGuard,
        chunk: &Chunk,
        w: &mut Tally,
        window_start: Instant,
        budget: Option<Duration>,
        taken: &mut u64,
    ) -> Result<Start> {
        // One more chunk, the read-backs up to its own and the thaw must fit in the budget
        // (the first chunk of a window always starts: a window must make progress).
        let read_backs = if self.cfg.verify { w.outstanding + 1 } else { 0 };
        if let Some(b) = budget
            && w.in_window > 0
            && !self.pace.fits(window_start.elapsed(), b, chunk.len as u64, read_backs)
        {
            return Ok(Start::Stop(WindowFlow::BudgetSpent));
        }
        // --rate: a chunk that would put the run ahead of its rate ends the window (the
        // pause before the next makes up the time), whether or not the run fits one window.
        if *taken > 0 && self.ahead_of_rate(chunk.len as u64) {
            return Ok(Start::Stop(WindowFlow::BudgetSpent));
        }
        if let Some(sig) = self.stop.signal() {
            return Err(self.interrupted(sig));
        }
        guard.recheck()?;
        *taken += chunk.len as u64;
        w.taken_chunks += 1;
        hooks::point("before-write");
        self.journal.begin(chunk.offset, chunk.len as u64, &chunk.hash)?;
        let t0 = Instant::now();
        let permit = self.ask(guard, chunk);
        self.stats.stages.permit += t0.elapsed().as_secs_f64();
        if !permit? {
            return Ok(Start::Stop(WindowFlow::Overrun));
        }
        hooks::point("after-permit");
        Ok(Start::Go(t0))
    }

    /// Writes a permitted chunk and hands it to the verifier (or settles it at once
    /// without verification); a failed write goes to [`Engine::recover`].
    fn write_chunk(
        &mut self,
        guard: &mut dyn WindowGuard,
        chunk: Chunk,
        pipes: &Pipes,
        w: &mut Tally,
        t0: Instant,
    ) -> Result<()> {
        let (offset, len) = (chunk.offset, chunk.len as u64);
        // Counted before the write: a failed or torn write may have touched them.
        let (lo, hi) = self.window_written.unwrap_or((offset, offset));
        self.window_written = Some((lo.min(offset), hi.max(offset + len)));
        let t_write = Instant::now();
        let wrote = self.target.write_at(&chunk.buf[..chunk.len], offset);
        self.stats.stages.write += t_write.elapsed().as_secs_f64();
        hooks::point("after-write");
        if let Err(e) = wrote {
            return self.recover(guard, chunk, e, pipes, w);
        }
        self.stats.bytes_written += len;
        self.stats.chunks_written += 1;
        if self.cfg.verify {
            w.outstanding += 1;
            if pipes.written.send(chunk).is_err() {
                return Err(Error::Internal("the verifier stopped".into()));
            }
        } else {
            self.settle(guard, Verified { chunk, result: Ok(()), took: Duration::ZERO })?;
        }
        // Its permit and write (and the wait for the verifier to take it): what starting
        // one more chunk costs a window that must end (see `pace`).
        self.pace.write.learn(len, t0.elapsed(), self.chunk_size);
        // For the chunk size, a chunk costs the writer the longer of its own write and the
        // interval since the previous one (which includes waiting on the reader and the
        // verifier); the slower of that and a decaying estimate.
        let step = w.last_step.map_or(t0.elapsed(), |t: Instant| t.elapsed()).max(t0.elapsed());
        w.last_step = Some(t0);
        self.chunk_estimate = step.max(self.chunk_estimate.mul_f64(0.8));
        w.in_window += 1;
        w.since_commit += len;
        if w.since_commit >= COMMIT_INTERVAL_BYTES {
            w.since_commit = 0;
            self.settle_all(guard, pipes.verified, &mut w.outstanding)?;
            self.commit()?;
        }
        Ok(())
    }

    /// A chunk's write failed. Retried in order: what the verifier holds settles first,
    /// and only then is this write reported over, so that the guardian's list of granted
    /// writes loses them in the order they were granted. If settling failed, no retry,
    /// but this chunk's bytes are kept all the same.
    fn recover(
        &mut self,
        guard: &mut dyn WindowGuard,
        chunk: Chunk,
        e: std::io::Error,
        pipes: &Pipes,
        w: &mut Tally,
    ) -> Result<()> {
        let (offset, len) = (chunk.offset, chunk.len as u64);
        let settled = self.settle_all(guard, pipes.verified, &mut w.outstanding);
        // The guardian must hear "written" even on failure: the write is over either way.
        let told = guard.wrote();
        let recovered = match settled {
            Ok(()) => told.and_then(|()| self.retry_write(guard, &chunk, e)),
            Err(earlier) => {
                log::error!("writing {len} bytes at offset {offset} failed too: {e}");
                self.keep(&chunk, self.read_back(offset, chunk.len), false);
                Err(earlier)
            }
        };
        let hash = chunk.hash;
        drop(chunk); // its buffer back to the pool before the next chunk is read
        recovered?;
        self.stats.bytes_written += len;
        self.stats.chunks_written += 1;
        self.stats.bytes_verified += len;
        self.accept(offset, len, hash);
        w.in_window += 1;
        w.since_commit += len;
        Ok(())
    }

    fn settle_ready(
        &mut self,
        guard: &mut dyn WindowGuard,
        rx: &Receiver<Verified>,
        outstanding: &mut u32,
    ) -> Result<()> {
        while *outstanding > 0 {
            match rx.try_recv() {
                Ok(v) => {
                    *outstanding -= 1;
                    self.settle(guard, v)?;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return Err(Error::Internal("the verifier stopped".into())),
            }
        }
        Ok(())
    }

    /// Waits for every outstanding read-back; returns the first error but settles all.
    fn settle_all(
        &mut self,
        guard: &mut dyn WindowGuard,
        rx: &Receiver<Verified>,
        outstanding: &mut u32,
    ) -> Result<()> {
        let mut first_err = None;
        while *outstanding > 0 {
            let Ok(v) = rx.recv() else {
                return Err(Error::Internal("the verifier stopped with read-backs outstanding".into()));
            };
            *outstanding -= 1;
            if let Err(e) = self.settle(guard, v) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// While a window is frozen, the writer and the verifier run at real-time priority, one
/// below the guardian: on a saturated CPU the writes and read-backs that hold the freeze
/// open then finish on time instead of waiting behind busy loops. The reader and the
/// hasher stay normal: they only decide how much a window gets done, not when it ends.
/// Back to normal when dropped. Where the host allows no real-time class, nothing changes
/// (the guardian still ends the window at its deadline).
struct Urgent(Option<sys::Scheduling>);

impl Urgent {
    fn raise(on: bool) -> Urgent {
        let before = sys::thread_scheduling();
        let rt = sys::Scheduling::Fifo(sys::fifo_max_priority() - 1);
        Urgent((on && sys::set_scheduling_of(0, rt).is_ok()).then_some(before))
    }
}

impl Drop for Urgent {
    fn drop(&mut self) {
        if let Some(before) = self.0 {
            let _ = sys::set_scheduling_of(0, before);
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
fn or_abort<T>(stage: &str, f: impl FnOnce() -> T) -> T {
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
            crate::sys::abort_without_core()
        }
    }
}

/// Reader stage: reads this window's chunks ahead into pool buffers. Returns the bytes
/// it read.
fn read_stage(
    target: &dyn BlockTarget,
    chunks: &[(u64, usize)],
    pool: &(Sender<AlignedBuf>, Receiver<AlignedBuf>),
    out: Sender<Staged>,
    stop: &AtomicBool,
) -> (u64, Duration) {
    let mut read = 0;
    let mut busy = Duration::ZERO;
    for (i, &(offset, len)) in chunks.iter().enumerate() {
        let index = i as u64;
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(buf) = pool.1.recv() else { break };
        let mut buf = Pooled { buf: Some(buf), home: pool.0.clone() };
        if stop.load(Ordering::SeqCst) {
            break; // the buffer goes back to the pool as it drops
        }
        let t = Instant::now();
        let r = target.read_at(&mut buf[..len], offset);
        busy += t.elapsed();
        match r {
            Ok(()) => {
                read += len as u64;
                hooks::point("after-read");
                if out.send(Staged::Read { index, offset, len, buf }).is_err() {
                    break;
                }
            }
            Err(error) => {
                let _ = out.send(Staged::Failed { offset, error });
                break; // a read error ends the run
            }
        }
    }
    (read, busy)
}

/// Hasher stage: blake3 of each chunk as read, off the reader's and writer's threads.
fn hash_stage(input: Receiver<Staged>, out: Sender<Staged>) -> Duration {
    let mut busy = Duration::ZERO;
    for m in input {
        let m = match m {
            Staged::Read { index, offset, len, buf } => {
                let t = Instant::now();
                let hash = blake3::hash(&buf[..len]);
                busy += t.elapsed();
                Staged::Hashed(Chunk { index, offset, len, buf, hash })
            }
            other => other,
        };
        if out.send(m).is_err() {
            break;
        }
    }
    busy
}

/// Verifier stage: reads each written chunk back and compares its blake3.
/// It reports each finished read-back to the guardian itself.
fn verify_stage(
    target: &dyn BlockTarget,
    cfg: &EngineConfig,
    input: Receiver<Chunk>,
    out: Sender<Verified>,
    reporter: Result<Reporter>,
) -> Duration {
    let mut back = AlignedBuf::new(cfg.buffer_bytes() as usize, target.mem_align());
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

fn verify_chunk(
    target: &dyn BlockTarget,
    data: &[u8],
    offset: u64,
    hash: &blake3::Hash,
    back: &mut [u8],
) -> Result<()> {
    target.read_at(back, offset).map_err(|e| Error::io_at("reading back", offset, e))?;
    let after = blake3::hash(back);
    if after == *hash {
        return Ok(());
    }
    // Never written again here: a differing read-back is a failing device or another
    // writer, and writing the pre-read bytes again could overwrite that writer's newer
    // data. Say exactly which sectors differ, and stop.
    let differ = differing_sectors(data, back, offset);
    log::error!("checksum mismatch at offset {offset}: {differ}");
    Err(Error::ChecksumMismatch {
        offset,
        len: data.len() as u64,
        before: hash.to_hex().to_string(),
        after: after.to_hex().to_string(),
        differ,
        rescue: None,
    })
}

/// The 512-byte sectors (device offsets) where `back` differs from `data`, as ranges.
fn differing_sectors(data: &[u8], back: &[u8], offset: u64) -> String {
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
    format!(
        "{total} bytes differ in {} range(s) (device bytes {}{})",
        ranges.len(),
        shown.join(", "),
        if ranges.len() > 8 { ", ..." } else { "" }
    )
}

/// Only the `selected` ranges (ascending, non-overlapping) of what `inner` plans: for
/// selective re-sequencing of the regions a scan found slow.
pub(crate) struct Selected<'a> {
    pub(crate) inner: &'a mut dyn Planner,
    pub(crate) selected: Vec<(u64, u64)>,
}

/// The intersection of two ascending lists of non-overlapping ranges.
pub(crate) fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (a0, a1) = (a[i].0, a[i].0 + a[i].1);
        let (b0, b1) = (b[j].0, b[j].0 + b[j].1);
        let (lo, hi) = (a0.max(b0), a1.min(b1));
        if lo < hi {
            out.push((lo, hi - lo));
        }
        if a1 < b1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

impl Planner for Selected<'_> {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        let planned = self.inner.ranges(cursor, end)?;
        Ok(intersect(&planned, &self.selected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intersects_range_lists() {
        let a = [(0, 100), (200, 100)];
        let b = [(50, 200), (290, 5)];
        assert_eq!(intersect(&a, &b), vec![(50, 50), (200, 50), (290, 5)]);
        assert_eq!(intersect(&a, &[]), vec![]);
    }

    #[test]
    fn chunks_follow_the_ranges() {
        let cfg = EngineConfig {
            chunk_size: 100,
            range_start: 0,
            range_end: 1000,
            start_offset: 0,
            verify: true,
            read_ahead: 2,
            pause: Duration::ZERO,
            journal_on_frozen_fs: false,
            max_overruns: 1,
            rate_bytes_per_second: None,
            rescue: None,
        };
        assert_eq!(cfg.chunks_of(&[(50, 230), (900, 200)], 100), vec![(50, 100), (150, 100), (250, 30), (900, 100)]);
    }
}
