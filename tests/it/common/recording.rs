//! The recording writer's two ends, shared by the suites that set it on a device or a
//! backing file (hidden_writers, backing_writers): the running process, stopped and
//! reaped on drop, and the check from outside that no fsync'd block went back to an older
//! write. Each suite's script writes 4 KiB blocks that start with `HIDDENBK`, the block's
//! index and its sequence number, and records the last acknowledged sequence of each.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

const BLOCK: u64 = 4096;

/// A running writer; stopped (and reaped) on drop.
pub struct Recorder {
    pub child: Option<Child>,
    pub stop: PathBuf,
    pub out: PathBuf,
}

impl Recorder {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Stops it; the last acknowledged sequence number of each block.
    pub fn finish(mut self) -> Vec<u64> {
        self.end();
        let text = std::fs::read_to_string(&self.out).expect("the writer's record");
        text.split_whitespace().map(|n| n.parse().unwrap()).collect()
    }

    fn end(&mut self) {
        let _ = std::fs::write(&self.stop, b"");
        if let Some(mut c) = self.child.take() {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) && c.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.end();
    }
}

/// The blocks (read with O_DIRECT at `first` of `path`) holding an older write than the
/// last acknowledged one, and how many blocks were acknowledged.
pub fn reverted(path: &Path, first: u64, last: &[u64]) -> (usize, usize) {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_DIRECT).open(path).unwrap();
    let mut buf = reseq::testing::AlignedBuf::new(BLOCK as usize, BLOCK as usize);
    let mut lost = 0;
    for (i, &want) in last.iter().enumerate().filter(|(_, w)| **w > 0) {
        f.read_exact_at(&mut buf, first + i as u64 * BLOCK).unwrap();
        let seq = if &buf[..8] == b"HIDDENBK" { u64::from_le_bytes(buf[16..24].try_into().unwrap()) } else { 0 };
        lost += usize::from(seq < want);
    }
    (lost, last.iter().filter(|&&s| s > 0).count())
}
