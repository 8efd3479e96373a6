//! The guardian's FIFREEZE calls, off its deadline path.
//!
//! FIFREEZE syncs the filesystem before it returns, and that sync can wait on another
//! freeze: a filesystem whose external journal (or whole device) is a loop device over a
//! file on a filesystem already frozen sleeps in D state in `jbd2_log_wait_commit` until
//! that one thaws (docs/SAFETY.md, "Freezes that wait on each other"). A guardian whose
//! only thread made that call could thaw nothing: the first filesystem stayed frozen 76 s.
//! So each filesystem's FIFREEZE runs on a thread of its own, and the guardian waits for
//! it at most a given time. A call not back by then is abandoned: the guardian thaws what
//! it holds, and when the call returns at last (the filesystem it waited on thawed), the
//! thread thaws the freeze it got at once, since no one else would.
//!
//! Only FIFREEZE is sent here. FITHAW does not sync and does not wait on another
//! filesystem, so the guardian calls it directly.

use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::errno::Errno;

/// One filesystem's call, as its thread and the guardian share it.
#[derive(Default)]
struct Slot {
    /// A call was sent and has not returned.
    busy: bool,
    /// The sequence number of a call the guardian stopped waiting for.
    abandoned: Option<u64>,
    /// The answer to a call the guardian still waits for.
    answer: Option<(u64, Result<(), Errno>)>,
}

type Shared = Arc<(Mutex<Slot>, Condvar)>;

struct Worker {
    requests: Sender<u64>,
    slot: Shared,
    next: u64,
}

/// One thread per filesystem, each making that filesystem's FIFREEZE calls.
pub(crate) struct Freezers {
    workers: Vec<Worker>,
}

impl Freezers {
    /// Starts `n` threads; thread `i` freezes with `freeze(i)` and thaws an abandoned
    /// freeze that succeeded late with `thaw(i)`.
    pub(crate) fn start(
        n: usize,
        freeze: impl Fn(usize) -> Result<(), Errno> + Send + Sync + 'static,
        thaw: impl Fn(usize) + Send + Sync + 'static,
    ) -> std::io::Result<Freezers> {
        let (freeze, thaw) = (Arc::new(freeze), Arc::new(thaw));
        let mut workers = Vec::with_capacity(n);
        for i in 0..n {
            let (requests, rx) = channel::<u64>();
            let slot: Shared = Arc::default();
            let (shared, freeze, thaw) = (slot.clone(), freeze.clone(), thaw.clone());
            std::thread::Builder::new().name(format!("freeze-{i}")).stack_size(64 << 10).spawn(move || {
                for seq in rx {
                    let r = freeze(i);
                    let (lock, cv) = &*shared;
                    let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
                    s.busy = false;
                    if s.abandoned == Some(seq) {
                        s.abandoned = None;
                        if r.is_ok() {
                            thaw(i);
                        }
                    } else {
                        s.answer = Some((seq, r));
                    }
                    cv.notify_all();
                }
            })?;
            workers.push(Worker { requests, slot, next: 0 });
        }
        Ok(Freezers { workers })
    }

    /// FIFREEZE on filesystem `i`, waiting at most `limit`. `ETIMEDOUT`: the call did not
    /// return in time and is abandoned (a late success is thawed by its thread);
    /// `EDEADLK`: an earlier abandoned call on it has still not returned.
    pub(crate) fn freeze(&mut self, i: usize, limit: Duration) -> Result<(), Errno> {
        let w = &mut self.workers[i];
        let (lock, cv) = &*w.slot;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        if s.busy {
            return Err(Errno::EDEADLK);
        }
        w.next += 1;
        let seq = w.next;
        s.busy = true;
        s.answer = None;
        if w.requests.send(seq).is_err() {
            s.busy = false;
            return Err(Errno::EIO);
        }
        let (mut s, _) = cv
            .wait_timeout_while(s, limit, |s| s.answer.is_none_or(|(q, _)| q != seq))
            .unwrap_or_else(|p| p.into_inner());
        match s.answer.take() {
            Some((q, r)) if q == seq => r,
            _ => {
                s.abandoned = Some(seq);
                Err(Errno::ETIMEDOUT)
            }
        }
    }

    /// Waits up to `limit` until no call is pending; whether none is.
    pub(crate) fn settle(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        for w in &self.workers {
            let (lock, cv) = &*w.slot;
            let s = lock.lock().unwrap_or_else(|p| p.into_inner());
            let left = until.saturating_duration_since(Instant::now());
            let (s, _) = cv.wait_timeout_while(s, left, |s| s.busy).unwrap_or_else(|p| p.into_inner());
            if s.busy {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Filesystem 1's freeze waits until `release` is set, as one whose journal lives on
    /// a frozen filesystem waits for that one's thaw.
    fn stuck_on_one(release: Arc<Mutex<bool>>, thaws: Arc<AtomicU32>) -> Freezers {
        Freezers::start(
            2,
            move |i| {
                while i == 1 && !*release.lock().unwrap() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            },
            move |_| {
                thaws.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap()
    }

    #[test]
    fn a_stuck_freeze_is_abandoned_in_time_and_thawed_when_it_returns() {
        let (release, thaws) = (Arc::new(Mutex::new(false)), Arc::new(AtomicU32::new(0)));
        let mut f = stuck_on_one(release.clone(), thaws.clone());
        assert_eq!(f.freeze(0, Duration::from_secs(5)), Ok(()));
        let t = Instant::now();
        assert_eq!(f.freeze(1, Duration::from_millis(100)), Err(Errno::ETIMEDOUT));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert!(!f.settle(Duration::ZERO));
        assert_eq!(f.freeze(1, Duration::from_millis(100)), Err(Errno::EDEADLK), "never a second call behind it");
        assert_eq!(f.freeze(0, Duration::from_secs(5)), Ok(()), "the other filesystems still answer");
        assert!(!f.settle(Duration::from_millis(50)));
        *release.lock().unwrap() = true;
        assert!(f.settle(Duration::from_secs(5)));
        assert_eq!(thaws.load(Ordering::SeqCst), 1, "the late freeze was thawed by its thread");
        assert_eq!(f.freeze(1, Duration::from_secs(5)), Ok(()), "and the filesystem can be frozen again");
    }

    #[test]
    fn a_late_failure_needs_no_thaw() {
        let thaws = Arc::new(AtomicU32::new(0));
        let t2 = thaws.clone();
        let mut f = Freezers::start(
            1,
            |_| {
                std::thread::sleep(Duration::from_millis(200));
                Err(Errno::EBUSY)
            },
            move |_| {
                t2.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        assert_eq!(f.freeze(0, Duration::from_millis(10)), Err(Errno::ETIMEDOUT));
        assert!(f.settle(Duration::from_secs(5)));
        assert_eq!(thaws.load(Ordering::SeqCst), 0, "a freeze that failed is nobody's to thaw");
        assert_eq!(f.freeze(0, Duration::from_secs(5)), Err(Errno::EBUSY), "its answer is not taken for this one");
    }
}
