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

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::engine::target::{DirectReader, ReadTarget};
use crate::sim::SimState;
use crate::sim::ftl::{SLOT, seq_read_time};
use crate::support::error::{Error, Result};
use crate::sys::{self, memory::AlignedBuf};

/// One readable source: a block device or a regular file, opened O_DIRECT read-only.
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    pub(crate) reader: DirectReader,
    /// Bytes to measure: the whole source, or the sum of its in-use ranges.
    pub(crate) len: u64,
    /// Only these ranges of a device, laid end to end: (offset in the measured span,
    /// device offset, length), ascending. None: all of it.
    pub(crate) in_use: Option<Vec<(u64, u64, u64)>>,
    /// The device's whole size, when only its in-use ranges are measured.
    pub(crate) device_len: u64,
}

impl Source {
    pub(crate) fn open(path: &Path) -> Result<Source> {
        let md = std::fs::metadata(path).map_err(|e| Error::cannot_use(path, e))?;
        let reader = DirectReader::open(path).map_err(|e| match e.raw_os_error() {
            Some(nix::libc::EINVAL) => Error::refused(
                format!("{} does not support direct I/O (O_DIRECT gave EINVAL)", path.display()),
                "reseq never falls back to buffered reads, which would measure the page cache; use a filesystem that supports O_DIRECT",
            ),
            _ => Error::input(format!("opening {} for direct reads", path.display()), e),
        })?;
        let (len, (mem, off)) = if md.file_type().is_block_device() {
            let len = sys::block::blk_size_bytes(reader.as_fd()).map_err(|e| Error::io("BLKGETSIZE64", e.into()))?;
            let (mem, off, _) =
                sys::block::blk_dio_align(path, reader.as_fd()).map_err(|e| Error::io("BLKSSZGET", e.into()))?;
            (len, (mem, off))
        } else if md.is_file() {
            // statx reports 0/0 where the file cannot do direct I/O (fscrypt, some
            // filesystems). btrfs reports nothing here on this kernel, yet reads its
            // files directly at its sector size (fs/btrfs/direct-io.c, check_direct_IO:
            // offsets and buffers aligned to it); st_blksize is that size.
            let btrfs = || sys::btrfs::on_btrfs(path).then(|| (md.blksize() as u32, md.blksize() as u32));
            let align = sys::block::statx_dio_align(path).ok().flatten().or_else(btrfs).ok_or_else(|| {
                Error::refused(
                    format!("{} cannot be read with direct I/O (statx reports no DIO alignment)", path.display()),
                    "reseq does not fall back to buffered reads",
                )
            })?;
            (md.len(), align)
        } else {
            return Err(Error::Usage(format!("{} is neither a block device nor a regular file", path.display())));
        };
        let reader = reader.aligned(mem as usize, u64::from(off));
        Ok(Source { path: path.to_path_buf(), reader, len, in_use: None, device_len: len })
    }

    /// Measures only `ranges` (ascending device ranges) of this source from now on.
    pub(crate) fn restrict(&mut self, ranges: &[(u64, u64)]) {
        let mut at = 0;
        let mut map = Vec::new();
        for &(off, len) in ranges {
            let len = len.min(self.device_len.saturating_sub(off));
            if len > 0 {
                map.push((at, off, len));
                at += len;
            }
        }
        self.len = at;
        self.in_use = Some(map);
    }

    /// A regular file's ranges that hold written data (FIEMAP: holes and unwritten
    /// extents read as zeros at memory speed and say nothing about the drive).
    pub(crate) fn written_ranges(&self) -> Result<Ranges> {
        let exts = sys::extents::fiemap(self.reader.as_fd(), 0, sys::extents::FIEMAP_FLAG_SYNC)
            .map_err(|e| Error::io(format!("FIEMAP {}", self.path.display()), e.into()))?;
        let align = self.reader.offset_align().max(1);
        let mut out: Ranges = Vec::new();
        for e in exts.iter().filter(|e| !e.is_unwritten()) {
            let lo = e.logical / align * align;
            let hi = (e.logical + e.length).min(self.device_len.div_ceil(align) * align);
            if lo >= hi {
                continue;
            }
            match out.last_mut() {
                Some(l) if l.0 + l.1 >= lo => l.1 = l.1.max(hi - l.0),
                _ => out.push((lo, hi - lo)),
            }
        }
        Ok(out)
    }

    /// The device range under `[at, at + len)` of the measured span, up to the end of
    /// the in-use range that holds `at`: (device offset, bytes).
    pub(crate) fn locate(&self, at: u64, len: u64) -> (u64, u64) {
        let Some(map) = &self.in_use else { return (at, len) };
        let i = map.partition_point(|&(s, _, l)| s + l <= at);
        match map.get(i) {
            Some(&(s, d, l)) => (d + (at - s), len.min(s + l - at)),
            None => (at, 0),
        }
    }

    /// Device ranges under `[at, at + len)` of the measured span.
    pub(crate) fn device_ranges(&self, mut at: u64, len: u64) -> Vec<(u64, u64)> {
        let (end, mut out) = (at + len, Vec::new());
        while at < end {
            let (d, n) = self.locate(at, end - at);
            if n == 0 {
                break;
            }
            match out.last_mut() {
                Some((o, l)) if *o + *l == d => *l += n,
                _ => out.push((d, n)),
            }
            at += n;
        }
        out
    }
}

/// Device ranges, `(offset, length)`, ascending.
pub(crate) type Ranges = Vec<(u64, u64)>;

/// What to measure.
pub(crate) enum Target {
    /// Real sources, read one after the other (a device, a file, or files of a directory).
    Real(Vec<Source>),
    /// A simulated SSD (`sim:STATE`), measured on its virtual clock.
    Sim { path: PathBuf, state: Box<Mutex<SimState>> },
}

impl Target {
    /// Opens a target: `sim:PATH`, a block device, a file, or a directory (its regular
    /// files, recursively, on the same filesystem, in path order).
    pub(crate) fn open(spec: &Path) -> Result<Target> {
        if let Some(p) = crate::options::sim::sim_state(spec) {
            let state = Box::new(Mutex::new(crate::sim::load(&p)?));
            return Ok(Target::Sim { path: p, state });
        }
        let md = std::fs::metadata(spec).map_err(|e| Error::cannot_use(spec, e))?;
        if md.is_dir() {
            let mut files = Vec::new();
            let dev = std::os::unix::fs::MetadataExt::dev(&md);
            crate::support::walk::regular_files(spec, dev, &|_| false, &mut files)?;
            // Empty files have nothing to read.
            files.retain(|f| std::fs::metadata(f).is_ok_and(|m| m.len() > 0));
            files.sort();
            if files.is_empty() {
                return Err(Error::Usage(format!("{} holds no regular files", spec.display())));
            }
            return Ok(Target::Real(files.iter().map(|f| Source::open(f)).collect::<Result<_>>()?));
        }
        Ok(Target::Real(vec![Source::open(spec)?]))
    }

    /// As [`Target::open`], but a block device carrying mounted ext4/xfs is measured on
    /// the ranges its filesystems use only (`in_use`: taken now if None), so that free
    /// space, fast when trimmed, never enters a result. Returns the ranges used.
    pub(crate) fn open_in_use(spec: &Path, in_use: Option<&[(u64, u64)]>) -> Result<(Target, Option<Ranges>)> {
        let mut target = Target::open(spec)?;
        let Target::Real(sources) = &mut target else { return Ok((target, None)) };
        let is_device = std::fs::metadata(spec).map(|m| m.file_type().is_block_device()).unwrap_or(false);
        if sources.len() != 1 || !is_device {
            return Ok((target, None));
        }
        let ranges = match in_use {
            Some(r) => Some(r.to_vec()),
            None => crate::host::in_use::in_use_ranges(spec).unwrap_or_else(|e| {
                log::warn!("cannot map the ranges in use on {} ({e}): measuring all of it", spec.display());
                None
            }),
        };
        if let Some(r) = &ranges {
            sources[0].restrict(r);
            if sources[0].len == 0 {
                return Err(Error::Usage(format!("{} has no bytes in use to measure", spec.display())));
            }
        }
        Ok((target, ranges))
    }

    pub(crate) fn len(&self) -> u64 {
        match self {
            Target::Real(s) => s.iter().map(|s| s.len).sum(),
            Target::Sim { state, .. } => state.lock().map(|s| s.len_bytes()).unwrap_or(0),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Target::Real(s) if s.len() == 1 && s[0].in_use.is_some() => format!(
                "{} (in-use ranges: {} of {})",
                s[0].path.display(),
                crate::support::units::human_bytes(s[0].len),
                crate::support::units::human_bytes(s[0].device_len)
            ),
            Target::Real(s) if s.len() == 1 => s[0].path.display().to_string(),
            Target::Real(s) => format!("{} files", s.len()),
            Target::Sim { path, .. } => format!("sim:{}", path.display()),
        }
    }

    pub(crate) fn is_virtual(&self) -> bool {
        matches!(self, Target::Sim { .. })
    }

    /// The alignment every offset and block size must respect.
    pub(crate) fn offset_align(&self) -> u64 {
        match self {
            Target::Real(s) => s.iter().map(|s| s.reader.offset_align()).max().unwrap_or(512),
            Target::Sim { .. } => SLOT,
        }
    }
}

/// How to read.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct ReadParams {
    pub(crate) block_size_bytes: u64,
    pub(crate) queue_depth: usize,
    /// Offset into the target (for several files: into their concatenation).
    pub(crate) offset_bytes: u64,
    pub(crate) length_bytes: u64,
}

/// One timed read of a span.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Timed {
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    /// Each read command's latency, in seconds (none on a simulated SSD).
    #[serde(skip)]
    pub(crate) latencies: Vec<f64>,
    /// Some read command returned only zeros: unwritten or trimmed blocks, or a hole of
    /// the file under a loop device, which read from nowhere (never on a simulated SSD).
    #[serde(skip)]
    pub(crate) zeros: bool,
}

impl Timed {
    pub(crate) fn rate(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds } else { 0.0 }
    }
}

/// Reads `[offset, offset + length)` of the target once, sequentially.
pub(crate) fn read_span(target: &Target, block: u64, qd: usize, offset: u64, length: u64) -> Result<Timed> {
    match target {
        Target::Sim { state, .. } => {
            let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
            let secs = seq_read_time(&mut st.ftl, offset / SLOT, length / SLOT, block, qd);
            Ok(Timed { bytes: length, seconds: secs, latencies: Vec::new(), zeros: false })
        }
        Target::Real(sources) => {
            let start = Instant::now();
            let mut base = 0u64;
            let mut bytes = 0u64;
            let mut latencies = Vec::new();
            let mut zeros = false;
            for s in sources {
                let (lo, hi) = (offset.max(base), (offset + length).min(base + s.len));
                if lo < hi {
                    // A span of several files is aligned as a whole, not inside each file
                    // (their sizes are arbitrary): start a file's part at an aligned offset,
                    // reading at most one alignment unit twice.
                    let align = s.reader.offset_align();
                    let from = (lo - base) / align * align;
                    let (n, lat, z) = read_source(s, block, qd, from, hi - base)?;
                    bytes += n;
                    latencies.extend(lat);
                    zeros |= z;
                }
                base += s.len;
            }
            Ok(Timed { bytes, seconds: start.elapsed().as_secs_f64(), latencies, zeros })
        }
    }
}

/// Reads `[from, to)` of one source with `qd` threads; returns the bytes read, each
/// read command's latency, and whether some read command returned only zeros.
fn read_source(s: &Source, block: u64, qd: usize, from: u64, to: u64) -> Result<(u64, Vec<f64>, bool)> {
    let cursor = AtomicU64::new(from);
    let zeros = std::sync::atomic::AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let all_latencies: Mutex<Vec<f64>> = Mutex::new(Vec::new());
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..qd.max(1) {
            scope.spawn(|| {
                let mut buf = AlignedBuf::new(block as usize, s.reader.mem_align());
                let mut latencies = Vec::new();
                loop {
                    let off = cursor.fetch_add(block, Ordering::SeqCst);
                    if off >= to || first_error.lock().map(|e| e.is_some()).unwrap_or(true) {
                        break;
                    }
                    // A Ctrl-C does not wait out a pass over a large device.
                    let read = crate::support::signals::StopFlag::installed()
                        .check("the benchmark")
                        .and_then(|()| read_block(s, &mut buf, (off, (off + block).min(to)), &mut latencies));
                    match read {
                        Ok(n) => {
                            total.fetch_add(n, Ordering::SeqCst);
                            // Stops at the first byte that is not zero: data costs nothing.
                            if n > 0 && buf[..n as usize].iter().all(|&b| b == 0) {
                                zeros.store(true, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                            break;
                        }
                    }
                }
                all_latencies.lock().unwrap_or_else(|p| p.into_inner()).extend(latencies);
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => {
            Ok((total.into_inner(), all_latencies.into_inner().unwrap_or_else(|p| p.into_inner()), zeros.into_inner()))
        }
    }
}

/// Reads `[span.0, span.1)` of a source, timing each read command: the bytes read. The
/// tail of a file may be shorter; the read length stays aligned and the kernel returns
/// what exists. A block that spans two in-use ranges is read in two pieces.
fn read_block(s: &Source, buf: &mut AlignedBuf, span: (u64, u64), latencies: &mut Vec<f64>) -> Result<u64> {
    let (mut at, end) = span;
    let mut bytes = 0;
    while at < end {
        let (dev_at, want) = s.locate(at, end - at);
        if want == 0 {
            break;
        }
        let align = s.reader.offset_align();
        let len = want.div_ceil(align) * align;
        let t = Instant::now();
        let r = s.reader.read_some_at(&mut buf[..len as usize], dev_at);
        crate::support::hooks::read_delay(&s.path, dev_at, len);
        latencies.push(t.elapsed().as_secs_f64());
        let n = r.map_err(|e| Error::io_at(format!("reading {}", s.path.display()), dev_at, e))?;
        bytes += (n as u64).min(want);
        at += want;
    }
    Ok(bytes)
}

/// Checks and completes read parameters against the target.
pub(crate) fn resolve_params(
    target: &Target,
    block: u64,
    qd: usize,
    offset: u64,
    length: Option<u64>,
) -> Result<ReadParams> {
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

/// Whether a cache below O_DIRECT could make reads look fast: a loop device whose
/// backing file is read through the page cache (`loop/dio` is 0), or a second read of
/// the same bytes much faster than the first (a host's or controller's cache). Such a
/// benchmark cannot show what the flash does, and a verdict from it would credit the
/// cache.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct CacheCheck {
    /// For a loop device: whether it reads its backing file with direct I/O.
    pub(crate) loop_direct_io: Option<bool>,
    /// Bytes read twice for the re-read test.
    pub(crate) sample_bytes: u64,
    pub(crate) first_read_bytes_per_second: f64,
    pub(crate) second_read_bytes_per_second: f64,
    /// A first read of other bytes, before the sample's: if it is as fast as the second,
    /// the first read was slow for another reason (a busy host), not for want of a cache.
    #[serde(default)]
    pub(crate) other_first_read_bytes_per_second: f64,
    /// The same sample read again after the first pass, when a cache was seen and a pass
    /// is much larger than the sample (null: not read). As slow as a first read, the pass
    /// evicted it: the cache is smaller than a pass, and passes read the device.
    #[serde(default)]
    pub(crate) after_pass_bytes_per_second: Option<f64>,
    /// A cache below the device is likely: results are unreliable.
    pub(crate) cache_suspected: bool,
    /// Why, or how a cache was ruled out, in words.
    pub(crate) finding: String,
    /// Why the device is, or stands on, a disk a hypervisor emulates (null: it is not):
    /// its host's page cache can make a rewrite's bytes read faster for good.
    #[serde(default)]
    pub(crate) emulated_disk: Option<String>,
}

impl CacheCheck {
    /// How much faster the second read of the sample was than the first reads, above 1
    /// and not ruled out (a cache smaller than a pass, evicted by it): what a cache's
    /// state could add to a change between two benchmarks.
    pub(crate) fn reread_gain(&self) -> Option<f64> {
        let ruled_out = !self.cache_suspected && self.after_pass_bytes_per_second.is_some();
        let cold = self.first_read_bytes_per_second.max(self.other_first_read_bytes_per_second);
        let gain = self.second_read_bytes_per_second / cold.max(f64::MIN_POSITIVE);
        (!ruled_out && gain > 1.0).then_some(gain)
    }
}

/// A second read this much faster than the first suggests a cache. A page cache reads
/// several times faster; a loop device over a disk file measured x1.38 on a noisy VM,
/// which must not count.
pub(crate) const RE_READ_RATIO: f64 = 2.0;
/// Bytes read twice by the re-read test.
pub(crate) const RE_READ_SAMPLE: u64 = 32 << 20;

/// The block device under a file or directory (`/dev/NAME`), for reading around it;
/// None for a device, a simulated SSD, or a filesystem on no block device (tmpfs).
pub(crate) fn device_around(path: &Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let md = std::fs::metadata(path).ok()?;
    if md.file_type().is_block_device() {
        return None;
    }
    let dev = sys::block::block_device_under(path)?;
    let uevent = std::fs::read_to_string(format!(
        "/sys/dev/block/{}:{}/uevent",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    ))
    .ok()?;
    let name = uevent.lines().find_map(|l| l.strip_prefix("DEVNAME="))?;
    Some(Path::new("/dev").join(name))
}

/// `loop/dio` of block device `dev` (or of the loop device it is a partition of).
fn loop_direct_io(dev: u64) -> Option<bool> {
    let sys = format!("/sys/dev/block/{}:{}", nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let name = std::fs::canonicalize(sys).ok()?.file_name()?.to_str()?.to_string();
    let disk = name.strip_prefix("loop")?.split('p').next()?.to_string();
    let dio = std::fs::read_to_string(format!("/sys/block/loop{disk}/loop/dio")).ok()?;
    Some(dio.trim() == "1")
}

/// Of several sources: without direct I/O if any is, with it if all are. (Thousands of
/// files sit on a device or two: each device is looked up once.)
fn loop_direct_io_of(sources: &[Source]) -> Option<bool> {
    let devs: std::collections::BTreeSet<Option<u64>> =
        sources.iter().map(|s| sys::block::block_device_under(&s.path)).collect();
    let all: Vec<Option<bool>> = devs.into_iter().map(|d| d.and_then(loop_direct_io)).collect();
    if all.contains(&Some(false)) {
        return Some(false);
    }
    all.iter().all(|d| *d == Some(true)).then_some(true)
}

/// The change a cache below the device can make on a disk a hypervisor emulates.
/// Measured in this project's VM (its disks are files under qemu's write-back cache):
/// after rewrites that changed nothing on the disk, reads were x1.29, x1.48 and x1.58
/// faster here, x1.60 to x1.86 on CI, and stayed so; the FTL effect this tool exists
/// for is x1.9 to x3.6 on the drives that have it.
pub(crate) const EMULATED_DISK_EFFECT: f64 = 2.0;

/// Why the disk under any of `sources` is one a hypervisor emulates, if it is.
fn emulated_disk_of(sources: &[Source]) -> Option<String> {
    let sysfs = crate::host::device::Sysfs::default();
    let devs: std::collections::BTreeSet<u64> =
        sources.iter().filter_map(|s| sys::block::block_device_under(&s.path)).collect();
    devs.into_iter().find_map(|d| sysfs.emulated_disk(&sysfs.name_of(crate::host::devnum::dev_num(d))?.0, 0))
}

/// Checks `target` for a cache below O_DIRECT (nothing to check on a simulated SSD).
pub(crate) fn cache_check(target: &Target, block: u64, qd: usize) -> Result<Option<CacheCheck>> {
    let Target::Real(sources) = target else { return Ok(None) };
    let loop_dio = loop_direct_io_of(sources);
    let align = target.offset_align();
    let sample = (target.len() / 2).min(RE_READ_SAMPLE) / align * align;
    if sample == 0 {
        return Ok(None);
    }
    let block = block.min(sample);
    // Other bytes first, from the end: cold if a cache is what makes the second read
    // fast, and read before the sample (readahead runs forward, so they warm nothing of
    // it) they take any wake-up's cost. Of several files, the start of a later one
    // (offsets inside a file must stay aligned).
    let other_at = match &sources[..] {
        [_] => (target.len() - sample) / align * align,
        many => {
            let bases = many.iter().scan(0, |b, s| Some(std::mem::replace(b, *b + s.len)));
            bases.filter(|&b| b >= sample && b + sample <= target.len()).last().unwrap_or(0)
        }
    };
    let other = read_span(target, block, qd, other_at, sample)?;
    let first = read_span(target, block, qd, 0, sample)?;
    let second = read_span(target, block, qd, 0, sample)?;
    let emulated = emulated_disk_of(sources);
    let (suspected, finding) = judge_reread(loop_dio, sample, [&other, &first, &second]);
    Ok(Some(CacheCheck {
        loop_direct_io: loop_dio,
        sample_bytes: sample,
        first_read_bytes_per_second: first.rate(),
        second_read_bytes_per_second: second.rate(),
        other_first_read_bytes_per_second: other.rate(),
        after_pass_bytes_per_second: None,
        cache_suspected: suspected,
        finding: match &emulated {
            Some(e) => format!("{finding}; {e}, whose host may cache it: a verdict needs x{EMULATED_DISK_EFFECT:.1}"),
            None => finding,
        },
        emulated_disk: emulated,
    }))
}

/// Whether the re-read test saw a cache below the device, and the finding in words:
/// `reads` are the first read of other bytes, the first of the sample and its second.
fn judge_reread(loop_dio: Option<bool>, sample: u64, [other, first, second]: [&Timed; 3]) -> (bool, String) {
    let ratio = second.rate() / first.rate().max(other.rate()).max(f64::MIN_POSITIVE);
    let typical = typical_ratio(first, other, second);
    let size = crate::support::units::human_bytes(sample);
    if loop_dio == Some(false) {
        (true, "a loop device without direct I/O (loop/dio = 0): reads come from its backing file's page cache".into())
    } else if let Some(t) = typical.filter(|t| ratio > RE_READ_RATIO && *t <= RE_READ_RATIO) {
        (
            false,
            format!(
                "no cache seen: a second read of the same {size} ran at x{ratio:.2} the first, its typical read at x{t:.2}: a busy host's stalls in the first, not a cache"
            ),
        )
    } else if ratio > RE_READ_RATIO {
        (
            true,
            format!(
                "a second read of the same {size} was x{ratio:.2} faster than the first reads of it and of other bytes: a cache below the device"
            ),
        )
    } else {
        let dio = if loop_dio == Some(true) { "; loop device with direct I/O" } else { "" };
        (false, format!("no cache seen: a second read of the same {size} ran at x{ratio:.2} the first{dio}"))
    }
}

/// How much faster the second read's typical (median) read command was than the faster
/// first read's: a cache shortens every read of the sample, a busy host's stall a few (a
/// first read of 16 MiB at 1 GB/s takes 16 ms, and one 10 ms stall halves its rate).
/// None without latencies (a simulated SSD's reads).
fn typical_ratio(first: &Timed, other: &Timed, second: &Timed) -> Option<f64> {
    let median = |t: &Timed| crate::support::units::percentile(&t.latencies, 0.5).filter(|m| *m > 0.0);
    let cold = median(first)?.min(median(other)?);
    Some(cold / median(second)?)
}

/// A pass must be this many times the re-read sample for [`recheck_after_pass`]: the
/// sample, cached when the pass starts, is then a small part of the pass's time.
pub(crate) const PASS_OVER_SAMPLE: u64 = 8;

/// After the first pass: whether a cache the re-read test saw still holds the sample.
/// A cache smaller than a pass cannot serve a sequential pass (a scan larger than a
/// least-recently-used cache evicts each block before it comes round again), so when
/// the sample reads as slowly as a first read again, the cache is ruled out for the
/// passes. Only a cache whose cold and warm speeds were both measured qualifies: a page
/// cache already warm for every byte reads evenly fast, and evicts nothing visible.
pub(crate) fn recheck_after_pass(
    c: &mut CacheCheck,
    target: &Target,
    block: u64,
    qd: usize,
    pass: (u64, u64),
) -> Result<()> {
    let cold = c.first_read_bytes_per_second.max(c.other_first_read_bytes_per_second);
    let seen = c.second_read_bytes_per_second > RE_READ_RATIO * cold;
    // A loop device reading its backing file through the page cache is a fact from
    // sysfs, not a measurement: one slow re-read must not overrule it.
    let page_cache = c.loop_direct_io == Some(false);
    if !c.cache_suspected || !seen || page_cache || pass.0 > 0 || pass.1 < PASS_OVER_SAMPLE * c.sample_bytes {
        return Ok(());
    }
    let again = read_span(target, block.min(c.sample_bytes), qd, 0, c.sample_bytes)?.rate();
    c.after_pass_bytes_per_second = Some(again);
    // Nearer a first read than a cached one (geometric middle: cached reads vary by x3
    // from run to run on a shared host, first reads much less).
    let (warm, now) = (c.second_read_bytes_per_second / cold, again / cold);
    let (sample, pass) =
        (crate::support::units::human_bytes(c.sample_bytes), crate::support::units::human_bytes(pass.1));
    let how = format!(
        "after a pass of {pass}, the same {sample} read at x{now:.2} a first read (from the cache: x{warm:.2})"
    );
    if now * now <= warm {
        c.cache_suspected = false;
        c.finding = format!(
            "{}; ruled out: it is smaller than a pass ({how}: evicted), so the passes read the device",
            c.finding
        );
    } else {
        c.finding = format!("{}; it still held those bytes: {how}", c.finding);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(latencies: &[f64]) -> Timed {
        Timed {
            bytes: (latencies.len() as u64) << 20,
            seconds: latencies.iter().sum(),
            latencies: latencies.to_vec(),
            zeros: false,
        }
    }

    /// One stall doubles a short first read's time but not its typical read; a cache
    /// shortens every read.
    #[test]
    fn a_stall_in_the_first_read_is_not_a_cache_and_a_cache_is() {
        let (fast, stalled) = (timed(&[0.0005; 16]), timed(&[[0.0005; 15].as_slice(), &[0.009]].concat()));
        assert!(fast.rate() / stalled.rate() > RE_READ_RATIO, "the throughput alone would say cache");
        assert!(typical_ratio(&stalled, &stalled, &fast).unwrap() <= RE_READ_RATIO);
        let cold = timed(&[0.02; 16]);
        assert!(typical_ratio(&cold, &cold, &fast).unwrap() > RE_READ_RATIO);
        assert_eq!(typical_ratio(&timed(&[]), &cold, &fast), None, "no latencies: throughput decides");
    }
}
