//! The reference's experiments (`reference/degrade_and_rewrite.py`), on the Rust model:
//! degrading a file with random 4 KiB writes, and rewriting it with a given strategy.
//! These are harness strategies, used to show what reseq's own engine must beat; reseq's
//! engine itself runs through [`super::SimDevice`].

use super::ftl::{Ftl, SLOT, Stuck, Writer, seq_read_time};
use super::pyrandom::PyRandom;

const MIB: u64 = 1 << 20;

/// Writes a file of `file_lpns` LBAs from LBA 0, then each stage of random 4 KiB writes
/// into it (MiB each), reading the file after each step. Returns the read times
/// (seconds, 1 MiB QD1): fresh, then after each stage.
pub fn degrade(ftl: &mut Ftl, file_lpns: u64, seed: u64, stages_mib: &[f64]) -> Result<Vec<f64>, Stuck> {
    ftl.write_lpns(0..file_lpns)?;
    let mut res = vec![seq_read_time(ftl, 0, file_lpns, MIB, 1)];
    let mut rng = PyRandom::new(seed);
    for &mb in stages_mib {
        let count = (mb * MIB as f64) as u64 / SLOT;
        let lpns: Vec<u64> = (0..count).map(|_| rng.randrange(0, file_lpns)).collect();
        ftl.write_lpns(lpns)?;
        res.push(seq_read_time(ftl, 0, file_lpns, MIB, 1));
    }
    Ok(res)
}

/// The order chunks are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Ascending,
    /// Chunks from the end; inside a chunk ascending.
    #[cfg(test)]
    Descending,
    /// Every 4 KiB in descending LBA order, chunk by chunk from the end.
    #[cfg(test)]
    Descending4k,
}

/// A way of rewriting a file (possibly a bad one, to compare against).
#[derive(Clone, Copy, Debug)]
pub struct Strategy {
    pub(crate) chunk_bytes: u64,
    /// Streams that each own a contiguous share; their commands alternate.
    pub(crate) writers: u64,
    pub(crate) order: Order,
    /// One 4 KiB noise write outside the file every this many µs (0: none).
    pub(crate) noise_interval_us: f64,
}

impl Default for Strategy {
    fn default() -> Self {
        Strategy { chunk_bytes: MIB, writers: 1, order: Order::Ascending, noise_interval_us: 0.0 }
    }
}

/// Result of a rewrite: read time after it (s), its virtual duration (s), noise writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RewriteResult {
    pub read_seconds: f64,
    pub(crate) rewrite_seconds: f64,
    pub(crate) noise_writes: u64,
}

/// Rewrites the file `[0, file_lpns)` of `ftl` with `s` (the reference's `rewrite`).
pub fn rewrite(ftl: &mut Ftl, file_lpns: u64, s: Strategy) -> Result<RewriteResult, Stuck> {
    let n_lpn = ftl.n_lpn;
    let mut w = Writer::new(ftl, s.noise_interval_us, file_lpns, n_lpn, 7);
    let per = s.chunk_bytes / SLOT;
    let nf = file_lpns;
    if s.writers == 1 {
        let starts: Vec<u64> = (0..nf).step_by(per as usize).collect();
        match s.order {
            Order::Ascending => {
                for &st in &starts {
                    w.write(ftl, st..(st + per).min(nf))?;
                }
            }
            #[cfg(test)]
            Order::Descending => {
                for &st in starts.iter().rev() {
                    w.write(ftl, st..(st + per).min(nf))?;
                }
            }
            #[cfg(test)]
            Order::Descending4k => {
                for &st in starts.iter().rev() {
                    w.write(ftl, (st..(st + per).min(nf)).rev())?;
                }
            }
        }
    } else {
        let share = nf / s.writers;
        let mut pos: Vec<u64> = (0..s.writers).map(|i| i * share).collect();
        let ends: Vec<u64> = (0..s.writers).map(|i| if i < s.writers - 1 { (i + 1) * share } else { nf }).collect();
        let mut active = true;
        while active {
            active = false;
            for i in 0..s.writers as usize {
                if pos[i] < ends[i] {
                    let k = per.min(ends[i] - pos[i]);
                    w.write(ftl, pos[i]..pos[i] + k)?;
                    pos[i] += k;
                    active = true;
                }
            }
        }
    }
    Ok(RewriteResult {
        read_seconds: seq_read_time(ftl, 0, nf, MIB, 1),
        rewrite_seconds: w.t / 1e6,
        noise_writes: w.noise_count,
    })
}
