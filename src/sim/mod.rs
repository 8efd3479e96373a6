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

pub mod experiment;
pub mod ftl;
pub mod pyrandom;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Mutex;

use ftl::{Ftl, Params, SLOT, Writer};

use crate::target::BlockTarget;

/// The 4 KiB pattern of LBA `lpn`: its number, then zeros.
pub fn fill_pattern(buf: &mut [u8], first_lpn: u64) {
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
pub struct SimState {
    pub ftl: Ftl,
    pub writer: Writer,
}

impl SimState {
    pub fn new(params: Params) -> SimState {
        let ftl = Ftl::new(params);
        let writer = Writer::new(&ftl, 0.0, 0, 1, 7);
        SimState { ftl, writer }
    }

    /// Turns the background noise writer on: one 4 KiB write to a random LBA in
    /// `[lo, hi)` every `interval_us` of virtual time.
    pub fn set_noise(&mut self, interval_us: f64, lo: u64, hi: u64, seed: u64) {
        let t = self.writer.t;
        self.writer = Writer::new(&self.ftl, interval_us, lo, hi, seed);
        self.writer.t = t;
    }

    pub fn len_bytes(&self) -> u64 {
        self.ftl.n_lpn * SLOT
    }
}

const MAGIC: &[u8] = b"reseq-sim 1\n";

/// The JSON line of a state file: everything but the two mapping tables, which follow
/// it as little-endian u32 arrays.
#[derive(serde::Serialize)]
struct HeaderOut<'a> {
    ftl: &'a Ftl,
    writer: &'a Writer,
    l2p_len: u64,
    p2l_len: u64,
    /// blake3 of the two tables, as stored.
    tables_blake3: String,
}

#[derive(serde::Deserialize)]
struct Header {
    ftl: Ftl,
    writer: Writer,
    l2p_len: u64,
    p2l_len: u64,
    tables_blake3: String,
}

impl SimState {
    /// Saves to `path` atomically (temporary file in the same directory, then rename).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let (l2p, p2l) = self.ftl.tables();
        let mut tables = Vec::with_capacity((l2p.len() + p2l.len()) * 4);
        for v in l2p.iter().chain(p2l.iter()) {
            tables.extend_from_slice(&v.to_le_bytes());
        }
        let header = HeaderOut {
            ftl: &self.ftl,
            writer: &self.writer,
            l2p_len: l2p.len() as u64,
            p2l_len: p2l.len() as u64,
            tables_blake3: blake3::hash(&tables).to_hex().to_string(),
        };
        let tmp = path.with_extension("tmp");
        {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            f.write_all(MAGIC)?;
            serde_json::to_writer(&mut f, &header)?;
            f.write_all(b"\n")?;
            f.write_all(&tables)?;
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    }

    pub fn load(path: &Path) -> std::io::Result<SimState> {
        let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {m}", path.display()));
        let mut data = Vec::new();
        std::fs::File::open(path)?.read_to_end(&mut data)?;
        let rest = data.strip_prefix(MAGIC).ok_or_else(|| bad("not a reseq simulated-SSD state file"))?;
        let nl = rest.iter().position(|&b| b == b'\n').ok_or_else(|| bad("truncated header"))?;
        let header: Header = serde_json::from_slice(&rest[..nl]).map_err(|e| bad(&format!("bad header: {e}")))?;
        let tables = &rest[nl + 1..];
        if tables.len() as u64 != (header.l2p_len + header.p2l_len) * 4 {
            return Err(bad("truncated tables"));
        }
        if blake3::hash(tables).to_hex().as_str() != header.tables_blake3 {
            return Err(bad("checksum mismatch: the file is damaged"));
        }
        let words: Vec<u32> = tables.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let (l2p, p2l) = words.split_at(header.l2p_len as usize);
        let mut ftl = header.ftl;
        ftl.set_tables(l2p.to_vec(), p2l.to_vec()).map_err(|e| bad(&e))?;
        Ok(SimState { ftl, writer: header.writer })
    }
}

/// A simulated SSD as a [`BlockTarget`]. Writes go through the FTL model in arrival
/// order, one command per call, on the write clock; reads return the address pattern
/// and cost nothing on the clock (measure reads with [`ftl::seq_read_time`]).
pub struct SimDevice {
    state: Mutex<SimState>,
    len: u64,
}

impl SimDevice {
    pub fn new(state: SimState) -> SimDevice {
        let len = state.len_bytes();
        SimDevice { state: Mutex::new(state), len }
    }

    pub fn into_state(self) -> SimState {
        self.state.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    pub fn with_state<R>(&self, f: impl FnOnce(&mut SimState) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn lpns(&self, offset: u64, len: usize) -> std::io::Result<(u64, u64)> {
        if !offset.is_multiple_of(SLOT) || !(len as u64).is_multiple_of(SLOT) || offset + len as u64 > self.len {
            return Err(std::io::Error::from_raw_os_error(nix::libc::EINVAL));
        }
        Ok((offset / SLOT, len as u64 / SLOT))
    }
}

impl BlockTarget for SimDevice {
    fn describe(&self) -> String {
        self.with_state(|s| format!("simulated {} SSD", s.ftl.p.name))
    }
    fn len_bytes(&self) -> u64 {
        self.len
    }
    fn mem_align(&self) -> usize {
        512
    }
    fn offset_align(&self) -> u64 {
        SLOT
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let (first, _) = self.lpns(offset, buf.len())?;
        fill_pattern(buf, first);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let (first, n) = self.lpns(offset, buf.len())?;
        check_pattern(buf, first)?;
        self.with_state(|s| {
            let SimState { ftl, writer } = s;
            writer.write(ftl, first..first + n);
        });
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}
