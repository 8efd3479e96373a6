//! A simulated SSD: the FTL model behind the same [`BlockTarget`] the real engine uses.
//!
//! Nobody can see a real drive's FTL, and most people trying reseq have no degraded drive
//! at hand. [`SimDevice`] is a block device whose sequential read time (virtual, µs)
//! depends on the physical layout earlier writes left, as a page-mapped FTL's does, so a
//! test can degrade it, run reseq's real engine on it, and measure the result.
//!
//! Data: the simulated device stores no bytes. Every 4 KiB block reads as a fixed
//! pattern derived from its address, and a write must carry exactly that pattern, so an
//! engine that wrote a chunk to the wrong place, or different bytes, fails loudly.

pub(crate) mod control;
pub(crate) mod experiment;
pub(crate) mod ftl;
pub mod onefile;
pub(crate) mod pyrandom;
pub(crate) mod serve;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Mutex;

use ftl::{Ftl, Params, SLOT, Writer};

use crate::engine::target::{BlockTarget, ReadTarget};

/// The 4 KiB pattern of LBA `lpn`: its number, then zeros.
pub(crate) fn fill_pattern(buf: &mut [u8], first_lpn: u64) {
    buf.fill(0);
    for (i, block) in buf.chunks_mut(SLOT as usize).enumerate() {
        block[..8].copy_from_slice(&(first_lpn + i as u64).to_le_bytes());
    }
}

fn check_pattern(buf: &[u8], first_lpn: u64) -> std::io::Result<()> {
    for (i, block) in buf.chunks(SLOT as usize).enumerate() {
        let lpn = first_lpn + i as u64;
        if block[..8] != lpn.to_le_bytes() || block[8..].iter().any(|&b| b != 0) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("simulated device: the data written to LBA {lpn} is not the data that was there"),
            ));
        }
    }
    Ok(())
}

/// FTL state plus the write clock (and its noise writer).
#[derive(Clone, Debug)]
pub(crate) struct SimState {
    pub(crate) ftl: Ftl,
    pub(crate) writer: Writer,
}

impl SimState {
    pub(crate) fn new(params: Params) -> SimState {
        let ftl = Ftl::new(params);
        let writer = Writer::new(&ftl, 0.0, 0, 1, 7);
        SimState { ftl, writer }
    }

    /// Turns the background noise writer on: one 4 KiB write to a random LBA in
    /// `[lo, hi)` every `interval_us` of virtual time.
    #[cfg(test)]
    pub(crate) fn set_noise(&mut self, interval_us: f64, lo: u64, hi: u64, seed: u64) {
        let t = self.writer.t;
        self.writer = Writer::new(&self.ftl, interval_us, lo, hi, seed);
        self.writer.t = t;
    }

    pub(crate) fn len_bytes(&self) -> u64 {
        self.ftl.n_lpn * SLOT
    }

    /// Writes `lpns` as one command that arrives at virtual time `now`, or when the
    /// write before it is done: when it completes, µs.
    pub(crate) fn write_from(&mut self, now: f64, lpns: impl Iterator<Item = u64>) -> Result<f64, ftl::Stuck> {
        self.writer.t = self.writer.t.max(now);
        self.writer.write(&mut self.ftl, lpns)
    }
}

/// Version 2 adds the page write times (retention); version 1 files load with none.
const MAGIC: &[u8] = b"reseq-sim 2\n";
const MAGIC_V1: &[u8] = b"reseq-sim 1\n";

/// The JSON line of a state file: everything but the tables (mapping, reverse mapping,
/// page write times), which follow it as little-endian u32 arrays. Saved from borrowed
/// `F` and `W` (`&Ftl`, `&Writer`), loaded as owned ones.
#[derive(serde::Serialize, serde::Deserialize)]
struct Header<F, W> {
    ftl: F,
    writer: W,
    l2p_len: u64,
    p2l_len: u64,
    /// Absent in version 1.
    #[serde(default)]
    written_len: u64,
    /// blake3 of the tables, as stored.
    tables_blake3: String,
}

/// Table bytes handled at a time when saving and loading: the tables are streamed, so
/// a `sim` command holds little more than the model state itself.
const STREAM_WORDS: usize = 256 << 10;

/// Feeds `words` to `out` as little-endian bytes, a bounded piece at a time.
fn for_each_le_piece(words: &[u32], mut out: impl FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(STREAM_WORDS * 4);
    for piece in words.chunks(STREAM_WORDS) {
        buf.clear();
        for v in piece {
            buf.extend_from_slice(&v.to_le_bytes());
        }
        out(&buf)?;
    }
    Ok(())
}

/// Reads `n` little-endian words from `r`, hashing the bytes as they come.
fn read_words(r: &mut impl Read, n: u64, hasher: &mut blake3::Hasher) -> std::io::Result<Vec<u32>> {
    let mut words = Vec::with_capacity(n as usize);
    let mut buf = vec![0u8; STREAM_WORDS * 4];
    let mut left = n as usize;
    while left > 0 {
        let k = left.min(STREAM_WORDS);
        r.read_exact(&mut buf[..k * 4])?;
        hasher.update(&buf[..k * 4]);
        words.extend(buf[..k * 4].chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        left -= k;
    }
    Ok(words)
}

impl SimState {
    /// Saves to `path` whole (see [`crate::support::atomic::replace`]), streaming the
    /// tables. Through a symlink, the file it names is replaced, not the link.
    pub(crate) fn save(&self, path: &Path) -> std::io::Result<()> {
        let path = &path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let tables = self.ftl.tables();
        let [l2p, p2l, written] = tables;
        let mut hasher = blake3::Hasher::new();
        for t in tables {
            for_each_le_piece(t, |b| {
                hasher.update(b);
                Ok(())
            })?;
        }
        let header = Header {
            ftl: &self.ftl,
            writer: &self.writer,
            l2p_len: l2p.len() as u64,
            p2l_len: p2l.len() as u64,
            written_len: written.len() as u64,
            tables_blake3: hasher.finalize().to_hex().to_string(),
        };
        crate::support::atomic::replace(path, 0o644, |f| {
            let mut f = std::io::BufWriter::new(f);
            f.write_all(MAGIC)?;
            serde_json::to_writer(&mut f, &header)?;
            f.write_all(b"\n")?;
            for t in tables {
                for_each_le_piece(t, |b| f.write_all(b))?;
            }
            f.flush()
        })
    }

    pub(crate) fn load(path: &Path) -> std::io::Result<SimState> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {m}", path.display()));
        let file = std::fs::File::open(path)?;
        let size = file.metadata()?.len();
        let mut r = std::io::BufReader::new(file);
        let mut magic = vec![0u8; MAGIC.len()];
        if r.read_exact(&mut magic).is_err() || (magic != MAGIC && magic != MAGIC_V1) {
            return Err(bad("not a reseq simulated-SSD state file"));
        }
        let v1 = magic == MAGIC_V1;
        let mut line = Vec::new();
        std::io::BufRead::read_until(&mut r, b'\n', &mut line)?;
        if line.last() != Some(&b'\n') {
            return Err(bad("truncated header"));
        }
        let header: Header<Ftl, Writer> =
            serde_json::from_slice(&line).map_err(|e| bad(&format!("bad header: {e}")))?;
        if v1 && header.written_len != 0 {
            return Err(bad("a version 1 state file with page write times"));
        }
        let tables = (header.l2p_len + header.p2l_len + header.written_len) * 4;
        if size != (MAGIC.len() + line.len()) as u64 + tables {
            return Err(bad("truncated tables"));
        }
        let mut hasher = blake3::Hasher::new();
        let l2p = read_words(&mut r, header.l2p_len, &mut hasher).map_err(|_| bad("truncated tables"))?;
        let p2l = read_words(&mut r, header.p2l_len, &mut hasher).map_err(|_| bad("truncated tables"))?;
        let written = read_words(&mut r, header.written_len, &mut hasher).map_err(|_| bad("truncated tables"))?;
        if hasher.finalize().to_hex().as_str() != header.tables_blake3 {
            return Err(bad("checksum mismatch: the file is damaged"));
        }
        header.ftl.p.check_gc().map_err(|e| bad(&format!("this simulated drive cannot work: {e}")))?;
        header.ftl.p.check_retention().map_err(|e| bad(&e))?;
        let mut ftl = header.ftl;
        ftl.set_tables(l2p, p2l, (!v1).then_some(written)).map_err(|e| bad(&e))?;
        Ok(SimState { ftl, writer: header.writer })
    }
}

/// [`SimState::load`] for a command: its error says which file.
pub(crate) fn load(path: &Path) -> crate::support::error::Result<SimState> {
    use crate::support::error::Error;
    SimState::load(path).map_err(|e| Error::input(format!("loading simulated device {}", path.display()), e))
}

/// [`SimState::save`] for a command: its error says which file.
pub(crate) fn save(state: &SimState, path: &Path) -> crate::support::error::Result<()> {
    use crate::support::error::Error;
    state.save(path).map_err(|e| Error::io(format!("saving simulated device {}", path.display()), e))
}

/// A simulated SSD as a [`BlockTarget`]. Writes go through the FTL model in arrival
/// order, one command per call, on the write clock; reads return the address pattern
/// and cost nothing on the clock (measure reads with [`ftl::seq_read_time`]).
pub(crate) struct SimDevice {
    state: Mutex<SimState>,
    len: u64,
}

impl SimDevice {
    pub(crate) fn new(state: SimState) -> SimDevice {
        let len = state.len_bytes();
        SimDevice { state: Mutex::new(state), len }
    }

    pub(crate) fn into_state(self) -> SimState {
        self.state.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    fn lpns(&self, offset: u64, len: usize) -> std::io::Result<(u64, u64)> {
        if !offset.is_multiple_of(SLOT) || !(len as u64).is_multiple_of(SLOT) || offset + len as u64 > self.len {
            return Err(std::io::Error::from_raw_os_error(nix::libc::EINVAL));
        }
        Ok((offset / SLOT, len as u64 / SLOT))
    }
}

impl ReadTarget for SimDevice {
    fn mem_align(&self) -> usize {
        512
    }
    fn offset_align(&self) -> u64 {
        SLOT
    }
    fn read_some_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let (first, _) = self.lpns(offset, buf.len())?;
        fill_pattern(buf, first);
        Ok(buf.len())
    }
}

impl BlockTarget for SimDevice {
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let (first, n) = self.lpns(offset, buf.len())?;
        check_pattern(buf, first)?;
        self.state.lock().unwrap_or_else(|p| p.into_inner()).write_from(0.0, first..first + n)?;
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}
