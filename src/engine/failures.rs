//! What a failed write or a differing read-back leaves: retries with the guardian's
//! permit, and the chunk's original bytes kept in a rescue copy before anything else
//! can lose them.

use super::stages::Chunk;
use super::writer::{Pipes, Tally};
use super::{Engine, WRITE_ATTEMPTS, rescue};
use crate::engine::guard::WindowGuard;
use crate::support::error::{Error, LeftState, Result};

impl Engine<'_> {
    /// A chunk's write failed. Retried in order: what the verifier holds settles first,
    /// and only then is this write reported over, so that the guardian's list of granted
    /// writes loses them in the order they were granted. If settling failed, no retry,
    /// but this chunk's bytes are kept all the same.
    pub(super) fn recover(
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

    /// A chunk's write failed: try again, each time with the guardian's permission and a
    /// read-back, up to [`WRITE_ATTEMPTS`] in all. Accepted only when a read-back
    /// matches the blake3 the chunk was read with; otherwise its original bytes are kept
    /// for a rescue file and the error says what the device holds there now.
    pub(super) fn retry_write(
        &mut self,
        guard: &mut dyn WindowGuard,
        chunk: &Chunk,
        first: std::io::Error,
    ) -> Result<()> {
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
    pub(super) fn read_back(&self, offset: u64, len: usize) -> Option<blake3::Hash> {
        rescue::range_hash(self.target, offset, len as u64).ok()
    }

    /// Saves a copy of a chunk's original bytes at once: a kill before the thaw (the
    /// guardian's, or anyone's) must not take them along. While the state directory's
    /// filesystem is frozen, into the run directory (moved after the thaw). Saving the
    /// same chunk again (a retry changed what the device holds) replaces the copy.
    pub(super) fn keep(&mut self, chunk: &Chunk, left: Option<blake3::Hash>, mismatch: bool) {
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
    pub(super) fn unkeep(&mut self) {
        if let Some((Ok(path), _)) = self.rescued.pop() {
            let _ = rescue::remove(&path);
        }
    }

    /// After the window: copies in the run directory move to the state directory (once
    /// thawed), and the error gets a sentence per copy. When the freeze was lost, a
    /// differing read-back was the filesystem's own write (its pre-read bytes are older
    /// than what it wrote): that copy is dropped, and the error names the range instead.
    pub(super) fn settle_rescues(&mut self, freeze_lost: bool) -> Option<String> {
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
}
