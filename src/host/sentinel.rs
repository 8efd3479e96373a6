//! The guardian's sentinel reads, off its deadline path.
//!
//! Before every thaw the guardian reads each filesystem's sentinel (the block holding
//! its superblock) to tell its own freeze from someone else's. That is an O_DIRECT read
//! of the device, and a device that stalls (a failing disk, a FUSE server stopped under a
//! loop device, a queue behind reseq's read-ahead) would hold the thaw for as long. So
//! the reads run on a thread of their own, and the guardian waits for each at most a
//! given time: a read not done by then counts as unreadable, which proves nothing (the
//! freeze stays ours and is thawed), exactly as a read that failed.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use crate::sys::{self, memory::AlignedBuf};

/// One request: which filesystem, and a sequence number so that a late answer to an
/// earlier request (its wait timed out) is never taken for this one's.
type Request = (usize, u64);
type Answer = (u64, Option<Vec<u8>>);

/// Reads sentinels on a thread of its own.
pub(crate) struct SentinelReader {
    requests: Sender<Request>,
    answers: Receiver<Answer>,
    next: u64,
    /// How long one read may take before it counts as unreadable.
    limit: Duration,
}

impl SentinelReader {
    /// `sentinels[i]`: the device (O_DIRECT) and offset of filesystem `i`'s sentinel, if it
    /// has one. Starts the thread (in the guardian, before anything is frozen).
    pub(crate) fn start(sentinels: Vec<Option<(OwnedFd, u64)>>, limit: Duration) -> std::io::Result<SentinelReader> {
        let mut bufs: Vec<AlignedBuf> = sentinels.iter().map(|_| AlignedBuf::new(4096, 4096)).collect();
        Self::spawn(limit, move |i| {
            let (fd, offset) = sentinels.get(i)?.as_ref()?;
            let buf = &mut bufs[i];
            sys::block::pread_exact(fd.as_fd(), buf, *offset).ok().map(|()| buf.to_vec())
        })
    }

    /// The thread, reading with `read`.
    fn spawn(
        limit: Duration,
        mut read: impl FnMut(usize) -> Option<Vec<u8>> + Send + 'static,
    ) -> std::io::Result<SentinelReader> {
        let (requests, rx) = channel::<Request>();
        let (tx, answers) = channel::<Answer>();
        std::thread::Builder::new().name("sentinels".into()).spawn(move || {
            for (i, seq) in rx {
                if tx.send((seq, read(i))).is_err() {
                    return;
                }
            }
        })?;
        Ok(SentinelReader { requests, answers, next: 0, limit })
    }

    /// Filesystem `i`'s sentinel, or None: no sentinel, the read failed, or it did not
    /// finish within the reader's limit or `limit`, the shorter (the thread may still be
    /// stuck on it; later reads then time out too, which is what they would do on that
    /// device anyway). A zero limit reads nothing.
    pub(crate) fn read(&mut self, i: usize, limit: Duration) -> Option<Vec<u8>> {
        if limit.is_zero() {
            return None;
        }
        self.next += 1;
        let seq = self.next;
        self.requests.send((i, seq)).ok()?;
        let until = std::time::Instant::now() + self.limit.min(limit);
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match self.answers.recv_timeout(left) {
                Ok((s, block)) if s == seq => return block,
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }
}

/// The 4 KiB at `offset` of an O_DIRECT descriptor.
pub(crate) fn read_block(fd: std::os::fd::BorrowedFd<'_>, offset: u64) -> Option<Vec<u8>> {
    let mut buf = crate::sys::memory::AlignedBuf::new(4096, 4096);
    crate::sys::block::pread_exact(fd, &mut buf, offset).ok()?;
    Some(buf.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_block_and_answers_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev");
        let mut block = vec![0u8; 8192];
        block[4096..].fill(7);
        std::fs::write(&path, &block).unwrap();
        // Not O_DIRECT: tmpfs has none, and the thread reads whatever descriptor it gets.
        let fd: OwnedFd = std::fs::File::open(&path).unwrap().into();
        let mut r = SentinelReader::start(vec![Some((fd, 4096)), None], Duration::from_secs(5)).unwrap();
        assert_eq!(r.read(0, Duration::MAX), Some(vec![7u8; 4096]));
        assert_eq!(r.read(1, Duration::MAX), None, "no sentinel");
        assert_eq!(r.read(9, Duration::MAX), None, "no such filesystem");
    }

    #[test]
    fn the_callers_limit_cuts_a_slow_read_short() {
        // A thaw after a kill has little time left before the bound: less than the reader's.
        let mut r = SentinelReader::spawn(Duration::from_secs(5), |_| {
            std::thread::sleep(Duration::from_millis(300));
            Some(vec![1])
        })
        .unwrap();
        let t = std::time::Instant::now();
        assert_eq!(r.read(0, Duration::from_millis(30)), None);
        assert_eq!(r.read(0, Duration::ZERO), None, "no time left: not read at all");
        assert!(t.elapsed() < Duration::from_millis(200), "{:?}", t.elapsed());
    }

    #[test]
    fn a_read_that_blocks_counts_as_unreadable_within_the_limit() {
        // Filesystem 0's device stalls for 2 s, as a failing disk or a stopped FUSE server.
        let mut r = SentinelReader::spawn(Duration::from_millis(100), |i| {
            if i == 0 {
                std::thread::sleep(Duration::from_secs(2));
            }
            Some(vec![i as u8])
        })
        .unwrap();
        let t = std::time::Instant::now();
        assert_eq!(r.read(0, Duration::MAX), None);
        assert_eq!(r.read(1, Duration::MAX), None, "behind the stuck read, the next one times out too");
        assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(
            r.read(1, Duration::MAX),
            Some(vec![1]),
            "late answers to earlier requests are not taken for this one"
        );
    }
}
