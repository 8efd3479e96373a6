//! One freeze window, top to bottom:
//!
//! ```text
//! freeze ─▶ map ─▶ read ─▶ hash ─▶ journal ─▶ permit ─▶ write ─▶ read-back ─▶ thaw ─▶ flush, journal done
//! open_window  Planner  stages.rs (reader, hasher)   writer.rs (this thread)  verifier  thaw    close_window
//! ```
//!
//! [`Engine::window`] opens the window (the guard freezes), asks the planner what to
//! rewrite while frozen, runs the stages until the writer stops, [`Engine::thaw`]s once
//! every write and read-back has been reported, and closes the window: rescue copies
//! settle, held output and journal records go out, and what was verified is flushed and
//! journaled. Its outcome is a [`WindowOutcome`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, bounded, unbounded};

use super::stages::{Chunk, Feed, Staged, Urgent, Verified, hash_stage, or_abort, read_stage, verify_stage};
use super::writer::{Pipes, WindowFlow};
use super::{Engine, Planner};
use crate::engine::guard::{WindowEnd, WindowGuard};
use crate::support::error::{AtRisk, Error, Result};
use crate::support::{hooks, output};
use crate::sys::{self, memory::AlignedBuf};

/// How a window came out: thawed (`end`: how long it froze, whether it overran), and
/// what stopped its writer (an error: the run's).
pub(super) struct WindowOutcome {
    pub(super) end: WindowEnd,
    pub(super) flow: Result<WindowFlow>,
}

/// What the stages of one window came to, thaw included.
struct Ran {
    /// How the thaw went, or why the window could not end cleanly.
    end: Result<WindowEnd>,
    /// What stopped the writer.
    flow: Result<WindowFlow>,
    /// Bytes the reader read, and bytes the writer took of them.
    read: u64,
    taken: u64,
}

/// The stages' threads' handles the thaw winds down.
struct Stages<'s> {
    stop_reader: &'s AtomicBool,
    hashed: Receiver<Staged>,
    readers: Vec<std::thread::ScopedJoinHandle<'s, (u64, Duration)>>,
    hasher: std::thread::ScopedJoinHandle<'s, Duration>,
    verifier: Option<std::thread::ScopedJoinHandle<'s, (Duration, AlignedBuf)>>,
}

/// Names, in a differing read-back's error, the ranges the guard's write records leave at
/// risk (asked after the window ended: its last look included).
fn at_risk(e: Error, guard: &dyn WindowGuard) -> Error {
    match e {
        Error::ChecksumMismatch { offset, len, before, after, differ, rescue, .. } => Error::ChecksumMismatch {
            offset,
            len,
            before,
            after,
            differ,
            rescue,
            at_risk: guard.at_risk().map(|r| Box::new(AtRisk(r))),
        },
        e => e,
    }
}

impl Engine<'_> {
    /// One freeze window. The error is about the window machinery (freeze, thaw,
    /// journal); the outcome's `flow`, what stopped the writer.
    pub(super) fn window(
        &mut self,
        planner: &mut dyn Planner,
        guard: &mut dyn WindowGuard,
        budget: Option<Duration>,
        stretch: Option<u64>,
    ) -> Result<WindowOutcome> {
        if !guard.freezes() {
            let r = self.window_body(planner, guard, budget, stretch);
            return r.map(|o| WindowOutcome { end: o.end, flow: o.flow.map_err(|e| at_risk(e, guard)) });
        }
        // A Ctrl-Z during the window waits for its end: a stopped reseq would hold the
        // freeze until the guardian's bound, and fail the run.
        sys::process::enter_window();
        self.window_written.clear();
        let r = self.window_body(planner, guard, budget, stretch);
        let r = r
            .map(|o| WindowOutcome { end: o.end, flow: o.flow.map_err(|e| at_risk(self.locate(e), guard)) })
            .map_err(|e| self.locate(e));
        if sys::process::leave_window() {
            log::info!("continued after a stop (SIGTSTP) that waited for the window to end");
        }
        r
    }

    /// Names the window and the bytes it wrote in an error about a lost freeze.
    fn locate(&self, e: Error) -> Error {
        match e {
            Error::FreezeLost { filesystem, foreign, .. } => Error::FreezeLost {
                filesystem,
                foreign,
                window: self.stats.windows,
                written: self.window_written.clone(),
            },
            e => e,
        }
    }

    /// A window's body, whether or not its guard freezes: open (freeze), map (while
    /// frozen), run the stages (which thaw), close. A `stretch` (of the chunk-size trial)
    /// ends the window after the first whole chunks that hold as many bytes.
    fn window_body(
        &mut self,
        planner: &mut dyn Planner,
        guard: &mut dyn WindowGuard,
        budget: Option<Duration>,
        stretch: Option<u64>,
    ) -> Result<WindowOutcome> {
        let window_start = self.open_window(guard)?;
        let chunks = match planner.ranges(self.stats.next_offset_bytes, self.cfg.range_end) {
            Ok(ranges) => {
                self.plan_end = planner.planned_until(self.cfg.range_end);
                let mut chunks = self.cfg.chunks_of(&ranges, self.chunk_size);
                if let Some(cut) = stretch.and_then(|bytes| cut_after(&chunks, bytes)) {
                    chunks.truncate(cut);
                    // Complete means done up to here, not to the plan's end.
                    self.plan_end = chunks.last().map_or(self.plan_end, |&(at, len)| at + len as u64);
                }
                chunks
            }
            Err(e) => {
                // The window still ends (thaws) here.
                let _ = guard.end();
                self.release_hold()?;
                return Err(e);
            }
        };
        let ran = self.run_stages(guard, &chunks, window_start, budget);
        self.close_window(ran)
    }

    /// Freeze: holds output and (if asked) journal records, and starts the window.
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

    /// Read, hash, (journal, permit, write: the writer, on this thread), read back, over
    /// `chunks` until the writer stops; then the thaw.
    fn run_stages(
        &mut self,
        guard: &mut dyn WindowGuard,
        chunks: &[(u64, usize)],
        window_start: Instant,
        budget: Option<Duration>,
    ) -> Ran {
        let stop_reader = AtomicBool::new(false);
        // The writer's tokens: which chunks the reader may read (see `Engine::grant`).
        let (grant_tx, grant_rx) = unbounded::<()>();
        let (raw_tx, raw_rx) = bounded::<Staged>(self.cfg.readers());
        let (hashed_tx, hashed_rx) = bounded::<Staged>(self.cfg.read_ahead.max(1));
        let (written_tx, written_rx) = bounded::<Chunk>(self.cfg.readers());
        let (verified_tx, verified_rx) = bounded::<Verified>(self.cfg.readers() + 1);
        let (target, cfg) = (self.target, self.cfg);
        let pool = self.pool.clone();
        let urgent = guard.freezes();
        let back = self.read_back_buffer();
        let feed = Feed { chunks, pool: &pool, grants: grant_rx, next: Default::default(), stop: &stop_reader };
        std::thread::scope(|s| {
            let readers = (0..cfg.readers())
                .map(|_| {
                    let (feed, out) = (&feed, raw_tx.clone());
                    s.spawn(move || or_abort("reader", || read_stage(target, feed, out)))
                })
                .collect();
            drop(raw_tx);
            let hasher = s.spawn(move || or_abort("hasher", || hash_stage(raw_rx, hashed_tx)));
            let verifier = back.map(|mut back| {
                let reporter = guard.reporter();
                let verify = move || {
                    let _rt = Urgent::raise(urgent);
                    (verify_stage(target, &mut back, written_rx, verified_tx, reporter), back)
                };
                s.spawn(move || or_abort("verifier", verify))
            });
            or_abort("writer", || {
                let _rt = Urgent::raise(urgent);
                let mut taken = 0;
                let pipes = Pipes {
                    hashed: &hashed_rx,
                    written: &written_tx,
                    verified: &verified_rx,
                    grants: &grant_tx,
                    chunks,
                };
                let flow = self.write_window(guard, &pipes, window_start, budget, &mut taken);
                // The writer is done: no chunk is let through any more.
                drop((written_tx, grant_tx));
                let stages = Stages { stop_reader: &stop_reader, hashed: hashed_rx, readers, hasher, verifier };
                let (end, read) = self.thaw(guard, stages);
                Ran { end, flow, read, taken }
            })
        })
    }

    /// Thaw: every write and read-back has been reported (the writer settled them), so
    /// the window ends now; then the stages wind down. What they still hold was read in
    /// this window and is dropped (its buffers go back to the pool as they drop).
    /// Returns how the thaw went and the bytes the reader read.
    fn thaw(&mut self, guard: &mut dyn WindowGuard, stages: Stages) -> (Result<WindowEnd>, u64) {
        let stopped = Instant::now();
        stages.stop_reader.store(true, Ordering::SeqCst);
        hooks::point("window-end");
        let end = guard.end();
        self.pace.thawed(stopped.elapsed());
        stages.hashed.iter().for_each(drop);
        let mut read = 0;
        for reader in stages.readers {
            let (bytes, time) = reader.join().unwrap_or_default();
            read += bytes;
            self.stats.stages.read += time.as_secs_f64();
        }
        self.stats.stages.hash += stages.hasher.join().unwrap_or_default().as_secs_f64();
        if let Some(Ok((time, back))) = stages.verifier.map(|v| v.join()) {
            self.stats.stages.read_back += time.as_secs_f64();
            self.read_backs[self.shape] = Some(back);
        }
        (end, read)
    }

    /// After the thaw: rescue copies settle, held output and journal records go out,
    /// and what the window verified is flushed and journaled.
    fn close_window(&mut self, ran: Ran) -> Result<WindowOutcome> {
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
        // Where the thaw's or the commit's error wins, what the writer's named stays in
        // the journal.
        let end = end.map_err(attach).inspect_err(|_| self.note_dropped(&flow))?;
        // Flushed and journaled after the thaw: nothing here needs the freeze, and the
        // filesystem should not wait for the device's cache flush.
        self.commit().map_err(attach).inspect_err(|_| self.note_dropped(&flow))?;
        if matches!(flow, Ok(WindowFlow::Complete)) {
            // Everything the plan asked for is done; what it left out needs nothing.
            self.stats.next_offset_bytes = self.plan_end;
        }
        Ok(WindowOutcome { end, flow })
    }
}

/// How many of `chunks` hold at least `bytes` (None: all of them are needed).
fn cut_after(chunks: &[(u64, usize)], bytes: u64) -> Option<usize> {
    let mut sum = 0;
    for (i, &(_, len)) in chunks.iter().enumerate() {
        sum += len as u64;
        if sum >= bytes && i + 1 < chunks.len() {
            return Some(i + 1);
        }
    }
    None
}
