//! Sequential read measurement: the core of `bench`, `scan` and `rewrite --bench`.
//!
//! Reads always use O_DIRECT into aligned buffers: a benchmark served from the page
//! cache measures memory, not the drive, and one that silently fell back to buffered I/O
//! would lie. A file is read *through the filesystem* (O_DIRECT on the file), not at its
//! FIEMAP ranges: that is the path a backup or a sequential scan takes, so it is the
//! number a user cares about, and it needs no freeze or mapping.
//!
//! Queue depth N means N threads issuing positioned reads, each taking the next block
//! from a shared cursor, so N reads are really in flight. A simulated SSD is measured on
//! its virtual clock instead (`sim:STATE` targets).

use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sim::SimState;
use crate::sim::ftl::{SLOT, seq_read_time};
use crate::sys::{self, AlignedBuf};

/// One readable source: a block device or a regular file, opened O_DIRECT read-only.
pub struct Source {
    pub path: PathBuf,
    file: File,
    pub len: u64,
    pub mem_align: usize,
    pub offset_align: u64,
}

impl Source {
    pub fn open(path: &Path) -> Result<Source> {
        let md = std::fs::metadata(path).map_err(|e| Error::Usage(format!("cannot use {}: {e}", path.display())))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_DIRECT)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(nix::libc::EINVAL) => Error::refused(
                    format!("{} does not support direct I/O (O_DIRECT gave EINVAL)", path.display()),
                    "reseq never falls back to buffered reads, which would measure the page cache; use a filesystem that supports O_DIRECT",
                ),
                _ => Error::io(format!("opening {} for direct reads", path.display()), e),
            })?;
        let (len, (mem, off)) = if md.file_type().is_block_device() {
            let len = sys::blk_size_bytes(std::os::fd::AsFd::as_fd(&file))
                .map_err(|e| Error::io("BLKGETSIZE64", e.into()))?;
            let align = match sys::statx_dio_align(path) {
                Ok(Some(a)) => a,
                _ => {
                    let s = sys::blk_logical_sector_size(std::os::fd::AsFd::as_fd(&file))
                        .map_err(|e| Error::io("BLKSSZGET", e.into()))?;
                    (s, s)
                }
            };
            (len, align)
        } else if md.is_file() {
            // statx reports 0/0 where the file cannot do direct I/O (fscrypt, some filesystems).
            let align = sys::statx_dio_align(path).ok().flatten().ok_or_else(|| {
                Error::refused(
                    format!("{} cannot be read with direct I/O (statx reports no DIO alignment)", path.display()),
                    "reseq does not fall back to buffered reads",
                )
            })?;
            (md.len(), align)
        } else {
            return Err(Error::Usage(format!("{} is neither a block device nor a regular file", path.display())));
        };
        Ok(Source { path: path.to_path_buf(), file, len, mem_align: mem as usize, offset_align: u64::from(off) })
    }
}

/// What to measure.
pub enum Target {
    /// Real sources, read one after the other (a device, a file, or files of a directory).
    Real(Vec<Source>),
    /// A simulated SSD (`sim:STATE`), measured on its virtual clock.
    Sim { path: PathBuf, state: Box<Mutex<SimState>> },
}

impl Target {
    /// Opens a target: `sim:PATH`, a block device, a file, or a directory (its regular
    /// files, recursively, on the same filesystem, in path order).
    pub fn open(spec: &Path) -> Result<Target> {
        if let Some(p) = spec.to_str().and_then(|s| s.strip_prefix("sim:")) {
            let state =
                SimState::load(Path::new(p)).map_err(|e| Error::io(format!("loading simulated device {p}"), e))?;
            return Ok(Target::Sim { path: PathBuf::from(p), state: Box::new(Mutex::new(state)) });
        }
        let md = std::fs::metadata(spec).map_err(|e| Error::Usage(format!("cannot use {}: {e}", spec.display())))?;
        if md.is_dir() {
            let mut files = Vec::new();
            collect_files(spec, std::os::unix::fs::MetadataExt::dev(&md), &mut files)?;
            files.sort();
            if files.is_empty() {
                return Err(Error::Usage(format!("{} holds no regular files", spec.display())));
            }
            return Ok(Target::Real(files.iter().map(|f| Source::open(f)).collect::<Result<_>>()?));
        }
        Ok(Target::Real(vec![Source::open(spec)?]))
    }

    pub fn len(&self) -> u64 {
        match self {
            Target::Real(s) => s.iter().map(|s| s.len).sum(),
            Target::Sim { state, .. } => state.lock().map(|s| s.len_bytes()).unwrap_or(0),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn describe(&self) -> String {
        match self {
            Target::Real(s) if s.len() == 1 => s[0].path.display().to_string(),
            Target::Real(s) => format!("{} files", s.len()),
            Target::Sim { path, .. } => format!("sim:{}", path.display()),
        }
    }

    pub fn is_virtual(&self) -> bool {
        matches!(self, Target::Sim { .. })
    }

    /// The alignment every offset and block size must respect.
    pub fn offset_align(&self) -> u64 {
        match self {
            Target::Real(s) => s.iter().map(|s| s.offset_align).max().unwrap_or(512),
            Target::Sim { .. } => SLOT,
        }
    }
}

fn collect_files(dir: &Path, dev: u64, out: &mut Vec<PathBuf>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        let md = entry.metadata().map_err(|e| Error::io(format!("stat {}", entry.path().display()), e))?;
        if std::os::unix::fs::MetadataExt::dev(&md) != dev {
            continue; // stay on one filesystem
        }
        if md.is_dir() {
            collect_files(&entry.path(), dev, out)?;
        } else if md.is_file() && md.len() > 0 {
            out.push(entry.path());
        }
    }
    Ok(())
}

/// How to read.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct ReadParams {
    pub block_size_bytes: u64,
    pub queue_depth: usize,
    /// Offset into the target (for several files: into their concatenation).
    pub offset_bytes: u64,
    pub length_bytes: u64,
}

/// One timed read of a span.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Timed {
    pub bytes: u64,
    pub seconds: f64,
}

impl Timed {
    pub fn rate(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds } else { 0.0 }
    }
}

/// Reads `[offset, offset + length)` of the target once, sequentially.
pub fn read_span(target: &Target, block: u64, qd: usize, offset: u64, length: u64) -> Result<Timed> {
    match target {
        Target::Sim { state, .. } => {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let secs = seq_read_time(&mut st.ftl, offset / SLOT, length / SLOT, block, qd);
            Ok(Timed { bytes: length, seconds: secs })
        }
        Target::Real(sources) => {
            let start = Instant::now();
            let mut base = 0u64;
            let mut bytes = 0u64;
            for s in sources {
                let (lo, hi) = (offset.max(base), (offset + length).min(base + s.len));
                if lo < hi {
                    bytes += read_source(s, block, qd, lo - base, hi - base)?;
                }
                base += s.len;
            }
            Ok(Timed { bytes, seconds: start.elapsed().as_secs_f64() })
        }
    }
}

/// Reads `[from, to)` of one source with `qd` threads; returns the bytes read.
fn read_source(s: &Source, block: u64, qd: usize, from: u64, to: u64) -> Result<u64> {
    let cursor = AtomicU64::new(from);
    let total = AtomicU64::new(0);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..qd.max(1) {
            scope.spawn(|| {
                let mut buf = AlignedBuf::new(block as usize, s.mem_align);
                loop {
                    let off = cursor.fetch_add(block, Ordering::SeqCst);
                    if off >= to || first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                        break;
                    }
                    // The tail of a file may be shorter; the read length stays aligned and
                    // the kernel returns what exists.
                    let want = (to - off).min(block);
                    let len = want.div_ceil(s.offset_align) * s.offset_align;
                    let r = crate::hooks::io_fault(crate::hooks::IoOp::Read, off, len)
                        .and_then(|()| s.file.read_at(&mut buf[..len as usize], off));
                    crate::hooks::read_delay(&s.path, off, len);
                    match r {
                        Ok(n) => {
                            total.fetch_add((n as u64).min(want), Ordering::SeqCst);
                        }
                        Err(e) => {
                            let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                            slot.get_or_insert(Error::io_at(format!("reading {}", s.path.display()), off, e));
                            break;
                        }
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(total.into_inner()),
    }
}

/// Checks and completes read parameters against the target.
pub fn resolve_params(target: &Target, block: u64, qd: usize, offset: u64, length: Option<u64>) -> Result<ReadParams> {
    let align = target.offset_align();
    if block == 0 || !block.is_multiple_of(align) {
        return Err(Error::Usage(format!("--block-size must be a non-zero multiple of {align} bytes for this target")));
    }
    if qd == 0 || qd > 256 {
        return Err(Error::Usage("--queue-depth must be between 1 and 256".into()));
    }
    if !offset.is_multiple_of(align) {
        return Err(Error::Usage(format!("--offset must be a multiple of {align} bytes")));
    }
    let len = target.len();
    if offset >= len {
        return Err(Error::Usage(format!("--offset {offset} is past the end of the target ({len} bytes)")));
    }
    let length = length.unwrap_or(len - offset).min(len - offset);
    if length == 0 {
        return Err(Error::Usage("--length must be positive".into()));
    }
    if target.is_virtual() && !length.is_multiple_of(SLOT) {
        return Err(Error::Usage("on a simulated SSD --length must be whole 4 KiB blocks".into()));
    }
    Ok(ReadParams { block_size_bytes: block, queue_depth: qd, offset_bytes: offset, length_bytes: length })
}

/// Sleeps between passes, so a drive that reorganises itself in the background can.
pub fn settle(d: Duration) {
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}
