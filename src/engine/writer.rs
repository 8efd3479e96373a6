//! The writer, on the window's own thread: lets the reader read the chunks it expects to
//! write in this window, takes hashed chunks in order and, for each, checks the budget
//! and the guard, journals its `begin`, asks the guardian's permit, writes it and hands it
//! to the verifier; settles read-backs as they come, and commits (flush, then journal)
//! what was verified.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::Engine;
use super::policy::{self, COMMIT_INTERVAL_BYTES};
use super::stages::{Chunk, Staged, Verified};
use crate::engine::guard::WindowGuard;
use crate::support::error::{Error, Result};
use crate::support::hooks;

/// Why the writer stopped.
pub(super) enum WindowFlow {
    /// All chunks done.
    Complete,
    /// Budget spent; more windows to go.
    BudgetSpent,
    /// The guardian refused a write: the deadline passed.
    Overrun,
}

/// The channels the writer works between.
pub(super) struct Pipes<'a> {
    pub(super) hashed: &'a Receiver<Staged>,
    pub(super) written: &'a Sender<Chunk>,
    pub(super) verified: &'a Receiver<Verified>,
    /// One token per chunk the reader may read, in order.
    pub(super) grants: &'a Sender<()>,
    /// The window's chunks, as the reader was given them: its channel closing before the
    /// last of them is not the end of the window.
    pub(super) chunks: &'a [(u64, usize)],
}

/// The writer's counts within one window.
#[derive(Default)]
pub(super) struct Tally {
    /// Written, read-back not yet settled.
    pub(super) outstanding: u32,
    /// Chunks written in this window.
    pub(super) in_window: u64,
    /// Chunks taken from the hasher (the next one's index).
    pub(super) taken_chunks: u64,
    /// Chunks the reader was let read.
    pub(super) granted: u64,
    /// A chunk let through only when the writer needed it (its read not overlapped: the
    /// step to it does not measure the writer's pace).
    pub(super) late: Option<u64>,
    /// The last chunk's permit (when it was asked for) and length.
    pub(super) last_step: Option<(Instant, u64)>,
    pub(super) since_commit: u64,
}

/// Whether a chunk may be written.
pub(super) enum Start {
    /// Yes; the permit was asked for at this instant.
    Go(Instant),
    /// No: the window ends here.
    Stop(WindowFlow),
}

impl Engine<'_> {
    /// The writer's loop: takes hashed chunks in order and writes each with the
    /// guardian's permit, until the chunks, the budget or the permits run out, or an
    /// error. Every outstanding read-back is settled before it returns.
    pub(super) fn write_window(
        &mut self,
        guard: &mut dyn WindowGuard,
        pipes: &Pipes,
        window_start: Instant,
        budget: Option<Duration>,
        taken: &mut u64,
    ) -> Result<WindowFlow> {
        let mut w = Tally::default();
        let mut write = || loop {
            // Settle read-backs that have finished, without waiting; serial
            // (`--read-ahead 0`): all of them, before the next chunk is even read.
            match self.cfg.serial() {
                true => self.settle_all(guard, pipes.verified, &mut w.outstanding)?,
                false => self.settle_ready(guard, pipes.verified, &mut w.outstanding)?,
            }
            if !self.grant(pipes, &mut w, window_start, budget) {
                return Ok(WindowFlow::BudgetSpent);
            }
            let until = self.wait_until(pipes, &w, window_start, budget);
            let Some(chunk) = self.next_chunk(pipes, w.taken_chunks, until)? else {
                // All taken, or the next one came too late to fit.
                return Ok(match w.taken_chunks < pipes.chunks.len() as u64 {
                    true => WindowFlow::BudgetSpent,
                    false => WindowFlow::Complete,
                });
            };
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

    /// Lets the reader read the chunks this window should still write, as far ahead of
    /// the writer as the pool has buffers (the pool, not this, bounds the read-ahead): a
    /// chunk read and not written is dropped at the thaw and read again in the next
    /// window. Each is put to the writer's own test ([`Engine::expects`]) as it should be
    /// when the writer comes to it. Returns whether the writer's next chunk was let
    /// through: if not, the window's writes are over.
    pub(super) fn grant(
        &mut self,
        pipes: &Pipes,
        w: &mut Tally,
        window_start: Instant,
        budget: Option<Duration>,
    ) -> bool {
        let all = pipes.chunks.len() as u64;
        let limit = all.min(w.taken_chunks + self.cfg.pool_size() as u64);
        // Serial (a pool of one buffer): the next chunk only, once the one before is
        // written and read back.
        while w.granted < limit && self.expects(pipes.chunks, w, window_start, budget) {
            if pipes.grants.send(()).is_err() {
                return true; // the reader is gone: `next_chunk` says why
            }
            if w.granted == w.taken_chunks {
                w.late = Some(w.granted);
            }
            w.granted += 1;
        }
        w.granted > w.taken_chunks || w.taken_chunks >= all
    }

    /// Whether the writer should still start chunk `w.granted` of `chunks` when it comes
    /// to it, after the chunks it has not yet taken before it (`Pace::start_in`): the
    /// budget's test of `start_chunk`, with the read-backs that will then be waiting (at
    /// least the previous chunk's), and `--rate`'s. A window's first chunk always starts.
    fn expects(&self, chunks: &[(u64, usize)], w: &Tally, window_start: Instant, budget: Option<Duration>) -> bool {
        let (next, j) = (w.taken_chunks as usize, w.granted as usize);
        if j == 0 {
            return true;
        }
        let len = chunks[j].1 as u64;
        let lens = || chunks[next..j].iter().map(|c| c.1 as u64);
        let read_backs = match self.cfg.verify {
            true => w.outstanding.max(u32::from(j > next)) + 1,
            false => 0,
        };
        // The writer's next chunk, let through only now, is read before it is written.
        let wait = match w.late == Some(next as u64) {
            true => self.pace.ready_in(chunks[next].1 as u64),
            false => Duration::ZERO,
        };
        let fits = budget.is_none_or(|b| {
            let at = window_start.elapsed().saturating_add(wait).saturating_add(self.pace.start_in(lens(), len));
            match j > next {
                true => self.pace.fits_ahead(at, b, len, read_backs),
                // Wanted now: the writer's own test, as `start_chunk` will put it.
                false => self.pace.fits(at, b, len, read_backs),
            }
        });
        fits && !self.ahead_of_rate(lens().sum::<u64>() + len)
    }

    /// Until when the writer waits for its next chunk: past that instant the chunk could
    /// not pass `start_chunk`'s test of the budget (with the read-backs now waiting), so
    /// a read that is late (a busy host, where the reader is not real-time) ends the
    /// window instead of holding the freeze open. None: no budget, or the window's first
    /// chunk, which always starts.
    fn wait_until(&self, pipes: &Pipes, w: &Tally, window_start: Instant, budget: Option<Duration>) -> Option<Instant> {
        let b = budget.filter(|_| w.in_window > 0)?;
        let len = pipes.chunks.get(w.taken_chunks as usize)?.1 as u64;
        let read_backs = if self.cfg.verify { w.outstanding + 1 } else { 0 };
        Some(window_start + b.saturating_sub(self.pace.need(len, read_backs, b)))
    }

    /// The next hashed chunk, in order. None: the window's chunks are all taken, or it did
    /// not come `until` then.
    pub(super) fn next_chunk(&mut self, pipes: &Pipes, expected: u64, until: Option<Instant>) -> Result<Option<Chunk>> {
        let waiting = Instant::now();
        let received = match until {
            Some(t) => pipes.hashed.recv_deadline(t),
            None => pipes.hashed.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        self.stats.stages.writer_waiting += waiting.elapsed().as_secs_f64();
        let staged = match received {
            Ok(staged) => staged,
            Err(RecvTimeoutError::Timeout) => return Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                let all = pipes.chunks.len();
                return match expected < all as u64 {
                    true => Err(Error::Internal(format!("the reader stopped after {expected} of {all} chunks"))),
                    false => Ok(None),
                };
            }
        };
        match staged {
            Staged::Hashed(c) if c.index == expected => {
                self.pace.ready.learn(c.len as u64, c.ready, self.chunk_size);
                Ok(Some(c))
            }
            Staged::Hashed(c) => Err(Error::Internal(format!("chunk {} arrived, expected {expected}", c.index))),
            Staged::Failed { offset, error, .. } => Err(Error::io_at("reading the device", offset, error)),
            Staged::Read { .. } => Err(Error::Internal("an unhashed chunk reached the writer".into())),
        }
    }

    /// Everything before a chunk's write: room in the budget, no stop asked for, the
    /// guard's checks, the chunk's `begin` in the journal, then the guardian's permit.
    pub(super) fn start_chunk(
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
        w.taken_chunks += 1;
        hooks::point("before-write");
        self.journal.begin(chunk.offset, chunk.len as u64, &chunk.hash)?;
        let t0 = Instant::now();
        // Another program's buffered writes to this range, still in the page cache, go
        // to the device now, where the checks of the permit count them; inside reseq's
        // direct write they would land first and be written over.
        self.target
            .write_back(chunk.offset, chunk.len as u64)
            .map_err(|e| Error::io_at("writing back the device's cached pages", chunk.offset, e))?;
        let permit = self.ask(guard, chunk);
        self.stats.stages.permit += t0.elapsed().as_secs_f64();
        if !permit? {
            return Ok(Start::Stop(WindowFlow::Overrun));
        }
        // Taken for writing: a chunk denied its permit was read in vain, as those read
        // ahead are (`bytes_read_ahead_dropped`).
        *taken += chunk.len as u64;
        hooks::point("after-permit");
        Ok(Start::Go(t0))
    }

    /// Writes a permitted chunk and hands it to the verifier (or settles it at once
    /// without verification); a failed write goes to [`Engine::recover`].
    pub(super) fn write_chunk(
        &mut self,
        guard: &mut dyn WindowGuard,
        chunk: Chunk,
        pipes: &Pipes,
        w: &mut Tally,
        t0: Instant,
    ) -> Result<()> {
        let (offset, len, index) = (chunk.offset, chunk.len as u64, chunk.index);
        // Counted before the write: a failed or torn write may have touched them.
        let at = self.target.device_offset(offset, len).unwrap_or(offset);
        match self.window_written.last_mut() {
            Some(last) if last.1 == at => last.1 = at + len,
            _ => self.window_written.push((at, at + len)),
        }
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
        self.learn_pace(w, t0, len, index);
        w.in_window += 1;
        w.since_commit += len;
        if w.since_commit >= COMMIT_INTERVAL_BYTES {
            w.since_commit = 0;
            self.settle_all(guard, pipes.verified, &mut w.outstanding)?;
            self.commit()?;
        }
        Ok(())
    }

    /// What a written chunk (`index`, `len` bytes, its permit asked for at `t0`) tells of
    /// the writer's pace.
    fn learn_pace(&mut self, w: &mut Tally, t0: Instant, len: u64, index: u64) {
        // Its permit and write (and the wait for the verifier to take it): what starting
        // one more chunk costs a window that must end (see `pace`).
        self.pace.write.learn(len, t0.elapsed(), self.chunk_size);
        // From the previous chunk's permit to this one's: what the reader's grants count
        // on, unless this chunk's read waited for its grant.
        if let Some((prev, prev_len)) = w.last_step
            && w.late != Some(index)
        {
            self.pace.step.learn(prev_len, t0.duration_since(prev), self.chunk_size);
        }
        // For the chunk size, a chunk costs the writer the longer of its own write and the
        // interval since the previous one (which includes waiting on the reader and the
        // verifier); the slower of that and a decaying estimate.
        let step = w.last_step.map_or(t0.elapsed(), |(t, _)| t.elapsed()).max(t0.elapsed());
        w.last_step = Some((t0, len));
        self.chunk_estimate = policy::chunk_time(self.chunk_estimate, step);
    }

    pub(super) fn settle_ready(
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
    pub(super) fn settle_all(
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

    /// Accounts for one chunk whose write (and read-back) is over. With verification the
    /// verifier has already told the guardian; without, the writer tells it here.
    pub(super) fn settle(&mut self, guard: &mut dyn WindowGuard, v: Verified) -> Result<()> {
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
    pub(super) fn accept(&mut self, offset: u64, len: u64, hash: blake3::Hash) {
        self.verified.push((offset, len, hash));
        self.progress.advance(len);
    }

    /// Asks the guardian to write `chunk`, naming it (device offset, length, blake3), so
    /// that a guardian that must kill reseq mid-write can check what the write left.
    pub(super) fn ask(&self, guard: &mut dyn WindowGuard, chunk: &Chunk) -> Result<bool> {
        if let Some(at) = self.target.device_offset(chunk.offset, chunk.len as u64) {
            guard.announce(at, chunk.len as u64, &chunk.hash);
        }
        guard.may_write()
    }

    /// Makes verified chunks durable (device flush), then records them as done (in the
    /// journal's memory only while it is held).
    pub(super) fn commit(&mut self) -> Result<()> {
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
}
