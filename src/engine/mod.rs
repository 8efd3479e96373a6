//! The rewrite engine: chunks in ascending order, one writer, reads overlapped.
//!
//! Why this shape: an FTL places data in the order writes arrive, so the only order that
//! re-linearizes is ascending offsets from a single writer, in large chunks (see
//! docs/FTL-MODEL.md: interleaved writers or descending order leave reads
//! 15-50 % slower). Parallel writes would be faster to issue and worse for the drive.
//!
//! This module holds the run: windows one after another, their pause, their pacing and
//! what each came to. `window.rs` holds one window, top to bottom; `stages.rs` the
//! threads around the writer, `writer.rs` the writer, `failures.rs` what a failed write
//! or read-back leaves (retries, rescue copies); `planner.rs` what each window rewrites.
//!
//! Per window, after the freeze, four stages run as threads joined by bounded channels:
//!
//! ```text
//!  reader ──raw──▶ hasher ──hashed──▶ writer (this thread) ──written──▶ verifier
//!    ▲  O_DIRECT read   blake3          permit, O_DIRECT write           read back, compare
//!    └──────────────── pool of aligned buffers ◀─────────────────────── with the bytes ─┘
//! ```
//!
//! Only the writer writes, one chunk at a time, in ascending order; the stages around it
//! only keep it busy (measured on the CI VM: hashing in the reader thread and a read-back
//! between writes cost 35-50 % of throughput, see docs/CHUNK-SIZE.md). Before each write
//! the writer asks the guardian for permission; the verifier reports each read-back, and
//! the guardian does not thaw while a write or its read-back is outstanding.
//! When the window's budget is spent the writer stops, waits for the verifier, and the
//! window thaws. Chunks read ahead are dropped, never written after a thaw, and read again
//! in the next window; so the reader reads only the chunks the writer lets through, those
//! it expects to write in this window (`writer.rs`, `Engine::grant`; `pace.rs`). Then the
//! device is flushed and the verified chunks are journaled as done (one journal fsync per
//! commit, not per chunk).

mod failures;
pub(crate) mod guard;
pub(crate) mod identity;
pub mod journal;
pub(crate) mod pace;
mod planner;
pub(crate) mod policy;
pub mod rescue;
mod stages;
pub(crate) mod target;
pub(crate) mod trial;
mod window;
mod writer;

pub(crate) use planner::{Everything, Planner, Selected, intersect, push_merged};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::engine::guard::WindowGuard;
use crate::engine::journal::Journal;
use crate::engine::pace::Pace;
use crate::engine::rescue::RescueTo;
use crate::engine::target::BlockTarget;
use crate::support::error::{Error, Result};
use crate::support::output::Progress;
use crate::support::signals::StopFlag;
use crate::sys::memory::AlignedBuf;
use window::WindowOutcome;
use writer::WindowFlow;

/// What to rewrite and how.
#[derive(Clone, Debug, Default)]
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
    /// The pipeline's depth: chunks read ahead of the writer (the pool holds this many
    /// plus two, plus one with verification), with [`EngineConfig::readers`] of them read
    /// at once and as many written chunks waiting for their read-back. 0: serial, each
    /// chunk read, written and read back before the next is read (a baseline).
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
    /// Other chunk sizes and depths to try on the run's first stretches, the fastest kept
    /// for the rest (`trial.rs`; None: this config's throughout).
    pub(crate) trial: Option<trial::Trial>,
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

    /// Bytes of aligned buffers the engine allocates with this shape: its pool, and with
    /// verification the buffer a read-back lands in.
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.pool_size() as u64 + u64::from(self.verify)) * self.buffer_bytes()
    }

    /// What the engine allocates at most: during a trial, every shape's buffers (each
    /// shape keeps its own while another is in use).
    pub(crate) fn peak_memory_bytes(&self) -> u64 {
        self.shaped().iter().map(EngineConfig::memory_bytes).sum()
    }

    /// This config, then one per other shape its trial tries.
    fn shaped(&self) -> Vec<EngineConfig> {
        let shapes = self.trial.iter().flat_map(|t| t.shapes.iter().skip(1));
        let own = EngineConfig { trial: None, ..self.clone() };
        let others = shapes.map(|s| EngineConfig { chunk_size: s.chunk_size, read_ahead: s.read_ahead, ..own.clone() });
        std::iter::once(own.clone()).chain(others).collect()
    }

    /// Buffers in the pool: the read-ahead, the one being written, the one being read by
    /// the reader, and with verification the one awaiting its read-back. Serial: one.
    fn pool_size(&self) -> usize {
        match self.read_ahead {
            0 => 1,
            n => n + 2 + usize::from(self.verify),
        }
    }

    /// Reads in flight at once: half the read-ahead (the other half is chunks read and
    /// waiting for the writer), at least one. `--read-ahead 2`, the old default, is one
    /// reader, as before. As many written chunks may wait for their read-back (the
    /// writer goes on meanwhile; the pacer counts each against the window's budget).
    pub(crate) fn readers(&self) -> usize {
        (self.read_ahead / 2).max(1)
    }

    /// No overlap at all (`--read-ahead 0`).
    pub(crate) fn serial(&self) -> bool {
        self.read_ahead == 0
    }
}

/// What a run did, also when it stopped early.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct EngineStats {
    pub(crate) bytes_read: u64,
    pub(crate) bytes_written: u64,
    pub(crate) bytes_verified: u64,
    /// Writes made, each chunk one whatever its size (a chunk trial's larger chunks too).
    pub(crate) chunks_written: u64,
    /// Chunks that a previous run had finished (skipped on resume), counted the same way.
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
    /// The chunk-size trial: each shape's stretches and the one kept (null: none ran, or
    /// the run stopped inside its first stretch).
    #[serde(default)]
    pub(crate) chunk_trial: Option<trial::TrialOutcome>,
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
    let shapes = cfg.shaped();
    let mut engine = Engine {
        target,
        cfg: &shapes[0],
        shapes: &shapes,
        trying: cfg.trial.clone().map(trial::Trying::new),
        shape: 0,
        parked: shapes.iter().map(|_| Vec::new()).collect(),
        read_backs: shapes.iter().map(|_| None).collect(),
        journal,
        progress,
        stop,
        stats: &mut stats,
        pool: bounded(shapes.iter().map(EngineConfig::pool_size).max().unwrap_or(1)),
        verified: Vec::new(),
        chunk_estimate: Duration::ZERO,
        pace: Pace::default(),
        failed: false,
        chunk_size: cfg.chunk_size,
        window_written: Vec::new(),
        rescued: Vec::new(),
        started: Instant::now(),
        plan_end: cfg.range_end,
        noted: Vec::new(),
    };
    let result = engine.run_windows(planner, guard);
    let result = result.inspect_err(|e| engine.note_at_risk(e));
    let cut_short = engine.trying.as_ref().and_then(trial::Trying::cut_short);
    stats.rewrite_seconds = engine.started.elapsed().as_secs_f64();
    stats.chunk_trial = stats.chunk_trial.take().or(cut_short);
    (stats, result)
}

struct Engine<'a> {
    target: &'a dyn BlockTarget,
    /// The configuration in use: one of `shapes`.
    cfg: &'a EngineConfig,
    /// The run's configuration, then one per other shape its trial tries.
    shapes: &'a [EngineConfig],
    /// The chunk-size trial, while it runs.
    trying: Option<trial::Trying>,
    /// The index of the shape in use, and each shape's buffers while another is.
    shape: usize,
    parked: Vec<Vec<AlignedBuf>>,
    /// Each shape's buffer for read-backs, between windows.
    read_backs: Vec<Option<AlignedBuf>>,
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
    /// Device ranges written in the current window (file mode's mapped from the files'
    /// offsets), merged where they touch.
    window_written: Vec<(u64, u64)>,
    /// Rescue copies saved in this window: where (or why not), and whether the cause was
    /// a differing read-back.
    rescued: Vec<(std::result::Result<PathBuf, String>, bool)>,
    /// When the run began: `--rate` counts from here.
    started: Instant,
    /// Where this window's plan ends ([`Planner::planned_until`]).
    plan_end: u64,
    /// The notes of ranges at risk written to the journal in this run.
    noted: Vec<journal::AtRiskNote>,
}

impl Engine<'_> {
    fn run_windows(&mut self, planner: &mut dyn Planner, guard: &mut dyn WindowGuard) -> Result<()> {
        self.fill_pool();
        // The writer starts a chunk only when it, the read-backs and the thaw fit in the
        // budget as measured (see `pace`); each overrun halves the share of the deadline
        // the budget is, and clean windows double it back.
        let mut share = pace::Share::default();
        while self.stats.next_offset_bytes < self.cfg.range_end {
            let budget = guard.deadline().map(|d| d.mul_f64(share.get()));
            self.pause_between_windows()?;
            self.pace.fade();
            let stretch = self.trial_step();
            let (started, written) = (Instant::now(), self.stats.bytes_written);
            let outcome = self.window(planner, guard, budget, stretch)?;
            let complete = self.account_window(guard, outcome, budget, &mut share)?;
            self.trial_record(stretch, self.stats.bytes_written - written, started.elapsed());
            if complete {
                break;
            }
        }
        self.progress.finish();
        self.journal.finished()
    }

    /// [`Engine::note_at_risk`] of a writer's error another error replaces.
    fn note_dropped(&mut self, flow: &Result<WindowFlow>) {
        if let Err(e) = flow {
            self.note_at_risk(e);
        }
    }

    /// Notes in the journal the ranges a stop left at risk, so that `status` names them
    /// (a failure to note them is logged: the error names them too).
    fn note_at_risk(&mut self, e: &Error) {
        let Some((ranges, why)) = e.ranges_at_risk() else { return };
        let rescue = e.rescue().map(str::to_string);
        let note = journal::AtRiskNote { exit: e.exit_code().code() as u8, ranges, why: why.into(), rescue };
        // The thaw and the writer may both report the same stop.
        if self.noted.contains(&note) {
            return;
        }
        self.noted.push(note.clone());
        if let Err(err) = self.journal.set_hold(false).and_then(|()| self.journal.at_risk(note)) {
            log::warn!("the ranges at risk were not noted in the journal {}: {err}", self.journal.path().display());
        }
    }

    /// The pool's buffers, for the configuration in use (between windows every buffer is
    /// home: the stages that borrow them are joined at each window's end).
    /// Each shape's buffers are allocated once, when it is first used, and kept aside
    /// while another is in use: allocating and zeroing 256 MiB at every switch cost a
    /// trial on a memory-backed device a fifth of the run.
    fn fill_pool(&mut self) {
        let mut bufs = std::mem::take(&mut self.parked[self.shape]);
        if bufs.is_empty() {
            let (n, len) = (self.cfg.pool_size(), self.cfg.buffer_bytes() as usize);
            bufs = (0..n).map(|_| AlignedBuf::for_transfers(len, self.target.mem_align())).collect();
            let back = self.cfg.verify.then(|| AlignedBuf::for_transfers(len, self.target.mem_align()));
            self.read_backs[self.shape] = back;
        }
        for b in bufs {
            self.pool.0.send(b).expect("pool has room");
        }
    }

    /// The configuration of shape `i` (its chunk size, depth and pool) from the next
    /// window on. `keep_others`: false once the trial is over (their buffers are freed).
    fn use_shape(&mut self, i: usize, keep_others: bool) {
        if i != self.shape {
            self.parked[self.shape] = self.pool.1.try_iter().collect();
            self.shape = i;
            self.cfg = &self.shapes[i];
            self.chunk_size = self.cfg.chunk_size;
            self.chunk_estimate = Duration::ZERO;
            self.fill_pool();
        }
        if !keep_others {
            self.parked.iter_mut().for_each(Vec::clear);
            let keep = self.shape;
            self.read_backs.iter_mut().enumerate().filter(|(j, _)| *j != keep).for_each(|(_, b)| *b = None);
        }
    }

    /// The shape in use's buffer for read-backs (None without verification), made by
    /// `fill_pool` before any window and handed back at each window's end. Taken inside
    /// a window: one made here would be from the heap, since huge pages may wait on
    /// compaction.
    fn read_back_buffer(&mut self) -> Option<AlignedBuf> {
        let len = self.cfg.buffer_bytes() as usize;
        let kept = self.read_backs[self.shape].take();
        self.cfg.verify.then(|| kept.unwrap_or_else(|| AlignedBuf::new(len, self.target.mem_align())))
    }

    /// While the chunk-size trial runs: the next stretch's shape is put in use, and its
    /// bytes are the window's limit.
    fn trial_step(&mut self) -> Option<u64> {
        let (i, bytes) = self.trying.as_ref()?.step()?;
        self.use_shape(i, true);
        Some(bytes)
    }

    /// A trial stretch wrote `bytes` in `took`, its whole window: every chunk read, written
    /// and read back, its flush and commit. A stretch's first read and last read-back are
    /// not overlapped with anything, which the rest of the run pays only once and every
    /// 256 MiB: on a device whose reads and writes side by side are no faster than one
    /// after the other (the disk-backed loop device) that costs nothing, elsewhere it
    /// counts the larger chunks slower than they are, which keeps the run's own shape.
    /// (Timed from the first write, the large shape's first read fell outside its span
    /// and counted it up to x1.19 too fast.) Each shape's buffers are allocated before
    /// its first stretch, outside its time. After the last stretch, the shape the rest of
    /// the run uses.
    fn trial_record(&mut self, stretch: Option<u64>, bytes: u64, took: Duration) {
        let Some(t) = self.trying.as_mut().filter(|_| stretch.is_some()) else { return };
        t.record(bytes, took);
        if t.done() {
            let (i, outcome) = t.outcome();
            log::info!("chunk trial: {}", outcome.why);
            self.stats.chunk_trial = Some(outcome);
            self.trying = None;
            self.use_shape(i, false);
        }
    }

    /// Before a window: a stop asked for ends the run; after the first window, the
    /// pause (`--pause`, or longer if the run is ahead of `--rate`), which a stop cuts
    /// short.
    fn pause_between_windows(&mut self) -> Result<()> {
        if let Some(sig) = self.stop.signal() {
            return Err(self.interrupted(sig));
        }
        let pause =
            policy::pause_before_window(self.cfg.pause, self.rate(), self.stats.bytes_written, self.started.elapsed());
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
        WindowOutcome { end, flow }: WindowOutcome,
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
            // The bound's error wins; what the writer's named stays in the journal.
            if let Err(e) = &flow {
                self.note_at_risk(e);
            }
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

    /// The next windows' chunk size, by [`policy::adapt_chunk`].
    fn adapt_chunk_size(&mut self, budget: Option<Duration>, overran: bool) {
        let Some(budget) = budget else { return };
        let before = (self.chunk_size, self.chunk_estimate);
        let align = self.target.offset_align();
        (self.chunk_size, self.chunk_estimate) =
            policy::adapt_chunk(before.0, before.1, budget, overran, self.cfg.chunk_size, align);
        if self.chunk_size != before.0 {
            log::debug!("chunk size {} -> {} (last chunk took {:?})", before.0, self.chunk_size, before.1);
        }
    }

    /// Whether writing `more` bytes now would put the run ahead of `--rate`
    /// ([`policy::ahead_of_rate`]).
    fn ahead_of_rate(&self, more: u64) -> bool {
        policy::ahead_of_rate(self.rate(), self.stats.bytes_written, more, self.started.elapsed())
    }

    /// `--rate` in bytes per second (None: no limit).
    fn rate(&self) -> Option<f64> {
        self.cfg.rate_bytes_per_second.filter(|&r| r > 0).map(|r| r as f64)
    }

    /// A stop asked for: the error names what the progress counts (the bytes to rewrite,
    /// not the range's, which holds free space and, in file mode, holes).
    fn interrupted(&self, signal: &'static str) -> Error {
        Error::Interrupted {
            signal: signal.into(),
            done_bytes: self.progress.done(),
            total_bytes: self.progress.total(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_the_ranges() {
        let cfg = EngineConfig {
            chunk_size: 100,
            range_start: 0,
            range_end: 1000,
            start_offset: 0,
            verify: true,
            read_ahead: 2,
            max_overruns: 1,
            ..EngineConfig::default()
        };
        assert_eq!(cfg.chunks_of(&[(50, 230), (900, 200)], 100), vec![(50, 100), (150, 100), (250, 30), (900, 100)]);
    }
}
