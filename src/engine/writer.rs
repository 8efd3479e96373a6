//! The writer, on the window's own thread: takes hashed chunks in order and, for each,
//! checks the budget and the guard, journals its `begin`, asks the guardian's permit,
//! writes it and hands it to the verifier; settles read-backs as they come, and commits
//! (flush, then journal) what was verified.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::stages::{Chunk, Staged, Verified};
use super::window::WindowFlow;
use super::{COMMIT_INTERVAL_BYTES, Engine};
use crate::engine::guard::WindowGuard;
use crate::support::error::{Error, Result};
use crate::support::hooks;

/// The channels the writer works between.
pub(super) struct Pipes<'a> {
    pub(super) hashed: &'a Receiver<Staged>,
    pub(super) written: &'a Sender<Chunk>,
    pub(super) verified: &'a Receiver<Verified>,
    /// How many chunks the reader was given: its channel closing before the last of them
    /// is not the end of the window.
    pub(super) chunks: usize,
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
    pub(super) last_step: Option<Instant>,
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
    pub(super) fn next_chunk(&mut self, pipes: &Pipes, expected: u64) -> Result<Option<Chunk>> {
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
    pub(super) fn write_chunk(
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
