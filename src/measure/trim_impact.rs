//! `reseq bench --trim-impact PATH`: does this drive stall readers while it trims?
//!
//! On the filesystem holding PATH: write a scratch file (random bytes, fsync), delete it,
//! commit the delete (syncfs: ext4 frees blocks only when its journal commits), then
//! FITRIM the range the file occupied in slices while a light probe reads a second,
//! small file; the same probe just before the trim is the reference. Both files are
//! removed whatever happens (errors, SIGINT/SIGTERM: a second signal does not cut the
//! cleanup short). Refused where the device has no discard: there is nothing to measure,
//! and nothing is written.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::host::freeze::Thawed;
use crate::host::mounts::MountEntry;
use crate::host::trim::{self, Pace, TrimReport, TrimTarget};
use crate::measure::probe::{self, Probe};
use crate::options::bench::TrimImpactOptions;
use crate::support::error::{Error, Result};
use crate::support::signals::StopFlag;
use crate::support::units::human_bytes;

/// A p99 read latency during the trim this many times the one before it is a stall.
pub(crate) const STALL_RATIO: f64 = 4.0;
/// Probe reads during the trim needed before the text judges the drive.
pub(crate) const MIN_READS_FOR_VERDICT: u64 = 20;

/// Size of the file the probe reads (kept during the trim).
pub(crate) const PROBE_FILE_BYTES: u64 = 16 << 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct TrimImpact {
    /// The filesystem measured (its mount point) and its type.
    pub(crate) mount_point: String,
    pub(crate) fs_type: String,
    /// Its block device (major:minor) and that device's `queue/discard_max_bytes`.
    pub(crate) device: String,
    pub(crate) discard_max_bytes: Option<u64>,
    /// Bytes written to the scratch file, deleted and trimmed.
    pub(crate) scratch_bytes: u64,
    pub(crate) write_seconds: f64,
    /// The trim of the range the scratch file held, with the probe before and during.
    pub(crate) trim: TrimReport,
}

impl TrimImpact {
    pub(crate) fn text(&self) -> String {
        let written = human_bytes(self.scratch_bytes);
        let mut s = format!(
            "  trim impact on {} ({}, device {}): {written} written in {:.1} s, deleted and trimmed\n",
            self.mount_point, self.fs_type, self.device, self.write_seconds
        );
        s += &self.trim.text();
        let probe = self.trim.probe.as_ref();
        if let Some(p) = probe.filter(|p| p.during.reads < MIN_READS_FOR_VERDICT) {
            s += &format!(
                "  only {} probe read(s) during the trim: too few to judge; a larger --trim-size makes the trim last longer\n",
                p.during.reads
            );
        } else if let Some(r) = probe.and_then(|p| p.p99_ratio).filter(|r| *r >= STALL_RATIO) {
            s += &format!(
                "  this drive stalls readers while it trims (p99 x{r:.1}): pace the trim (--trim-rate) on busy hosts\n"
            );
        } else if let Some(r) = probe.and_then(|p| p.p99_ratio) {
            s += &format!("  reads barely noticed the trim (p99 x{r:.1})\n");
        }
        s
    }
}

/// The device's `queue/discard_max_bytes` (a partition's is its disk's).
pub(crate) fn discard_max_bytes(dev: (u32, u32)) -> Option<u64> {
    let base = PathBuf::from(format!("/sys/dev/block/{}:{}", dev.0, dev.1));
    [base.join("queue/discard_max_bytes"), base.join("../queue/discard_max_bytes")]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| t.trim().parse().ok())
}

/// Files removed on drop, and the filesystem synced so the removal is durable.
struct Scratch {
    dir: PathBuf,
    paths: Vec<PathBuf>,
}

impl Scratch {
    fn create(&mut self, name: &str) -> Result<File> {
        let path = self.dir.join(name);
        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(&path);
        let f = f.map_err(|e| Error::io(format!("creating the scratch file {}", path.display()), e))?;
        self.paths.push(path);
        Ok(f)
    }

    fn remove(&mut self, path: &Path) -> Result<()> {
        std::fs::remove_file(path).map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
        self.paths.retain(|p| p != path);
        Ok(())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in &self.paths {
            if let Err(e) = std::fs::remove_file(p) {
                log::warn!("could not remove the scratch file {}: {e}", p.display());
            }
        }
    }
}

/// Writes `len` pseudo-random bytes (incompressible: a drive that compresses must not
/// get away with writing nothing), checking `stop` every MiB; then fsync.
fn fill(f: &mut File, len: u64, seed: u64, stop: &StopFlag) -> Result<()> {
    let mut rng = crate::support::scratch::XorShift::new(seed);
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        stop.check("bench --trim-impact stopped while writing its scratch file, which is removed")?;
        rng.fill(&mut buf);
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n]).map_err(|e| Error::io("writing the scratch file", e))?;
        left -= n as u64;
    }
    f.sync_all().map_err(|e| Error::io("fsync of the scratch file", e))
}

/// The filesystem byte range a file occupies (first extent's start to last's end, in
/// MiB), from FIEMAP.
fn occupied_range(f: &File) -> Result<(u64, u64)> {
    let exts = crate::sys::extents::fiemap(f.as_fd(), 0, crate::sys::extents::FIEMAP_FLAG_SYNC)
        .map_err(|e| Error::io("FIEMAP of the scratch file", e.into()))?;
    let lo = exts.iter().map(|e| e.physical).min();
    let hi = exts.iter().map(|e| e.physical + e.length).max();
    match (lo, hi) {
        (Some(lo), Some(hi)) if hi > lo => {
            let a = trim::SLICE_ALIGN;
            Ok((lo / a * a, hi.div_ceil(a) * a))
        }
        _ => Err(Error::Internal("the scratch file has no extents after fsync".into())),
    }
}

/// Refuses before anything is written where a trim cannot be measured.
fn check_discard(dir: &Path, fs: &MountEntry, dir_fd: &File) -> Result<Option<u64>> {
    if !crate::host::usedspace::SUPPORTED.contains(&fs.fs_type.as_str()) {
        return Err(Error::refused(
            format!("{} is on {} ({}), not ext4 or xfs", dir.display(), fs.mount_point.display(), fs.fs_type),
            "give a directory on a mounted ext4 or xfs filesystem",
        ));
    }
    if fs.read_only {
        return Err(Error::refused(
            format!("{} is mounted read-only: no scratch file can be written", fs.mount_point.display()),
            "give a directory on a filesystem mounted read-write",
        ));
    }
    let max = discard_max_bytes(fs.dev);
    let no_discard = |why: String| {
        Error::refused(
            format!("{} ({}) cannot discard: {why}; there is no trim to measure", fs.mount_point.display(), fs.source),
            "measure a filesystem on a device with discard (TRIM/UNMAP) support",
        )
    };
    if max == Some(0) {
        return Err(no_discard(format!("/sys/dev/block/{}:{}/queue/discard_max_bytes is 0", fs.dev.0, fs.dev.1)));
    }
    // The filesystem's own answer: one block-sized FITRIM at the start (the superblock
    // lives there, so it discards nothing, or a few free blocks).
    match crate::sys::extents::fitrim_range(dir_fd.as_fd(), 0, trim::SLICE_ALIGN) {
        Ok(_) => Ok(max),
        Err(nix::errno::Errno::EOPNOTSUPP) => Err(no_discard("FITRIM gave EOPNOTSUPP".into())),
        Err(nix::errno::Errno::EPERM) => {
            Err(Error::refused("FITRIM needs CAP_SYS_ADMIN", "run reseq bench --trim-impact as root"))
        }
        Err(e) => Err(Error::io(format!("FITRIM on {}", fs.mount_point.display()), e.into())),
    }
}

/// The directory to write in (TARGET, or the one holding it), opened, and the mounted
/// filesystem it is on.
fn locate(given: &Path) -> Result<(PathBuf, File, MountEntry)> {
    let md = std::fs::metadata(given).map_err(|e| Error::cannot_use(given, e))?;
    let dir = if md.is_dir() { given.to_path_buf() } else { given.parent().map(Path::to_path_buf).unwrap_or_default() };
    let dir = std::fs::canonicalize(&dir).map_err(|e| Error::Usage(format!("cannot use {}: {e}", dir.display())))?;
    let dir_fd = File::open(&dir).map_err(|e| Error::io(format!("opening {}", dir.display()), e))?;
    let mounts = crate::host::mounts::read_mounts().map_err(|e| Error::io("reading /proc/self/mountinfo", e))?;
    let dev = dir_fd.metadata().map_err(|e| Error::io("stat", e))?.dev();
    let dev = (nix::sys::stat::major(dev) as u32, nix::sys::stat::minor(dev) as u32);
    let fs = crate::host::mounts::mount_containing(&mounts, &dir)
        .filter(|m| m.dev == dev)
        .ok_or_else(|| Error::Usage(format!("{} is not on a mounted block-device filesystem", dir.display())))?
        .clone();
    Ok((dir, dir_fd, fs))
}

/// Writes the probe's file and the scratch file, deletes the scratch file and commits
/// the delete: (the probe, seconds the write took, the range the scratch file held).
fn write_and_delete(
    scratch: &mut Scratch,
    dir_fd: &File,
    size: u64,
    stop: &StopFlag,
) -> Result<(Arc<Probe>, f64, (u64, u64))> {
    let pid = std::process::id();
    let probe_name = format!(".reseq-trim-impact-{pid}.probe");
    let mut probe_file = scratch.create(&probe_name)?;
    fill(&mut probe_file, PROBE_FILE_BYTES, 1, stop)?;
    let data_name = format!(".reseq-trim-impact-{pid}.data");
    let mut data = scratch.create(&data_name)?;
    log::info!("writing {} to {}", human_bytes(size), scratch.dir.join(&data_name).display());
    let t0 = Instant::now();
    fill(&mut data, size, 2, stop)?;
    let write_seconds = t0.elapsed().as_secs_f64();
    let range = occupied_range(&data)?;
    drop(data);
    let probe = Arc::new(Probe::open(&scratch.dir.join(&probe_name), None)?);
    let data_path = scratch.dir.join(&data_name);
    scratch.remove(&data_path)?;
    // ext4 and xfs free a deleted file's blocks when the transaction commits.
    nix::unistd::syncfs(dir_fd.as_fd()).map_err(|e| Error::io("syncfs", e.into()))?;
    Ok((probe, write_seconds, range))
}

/// `reseq bench --trim-impact`: what was measured (also when the trim was stopped or
/// failed part way: the slices done), and how it ended.
pub(crate) fn run(o: &TrimImpactOptions) -> (Option<TrimImpact>, Result<()>) {
    let mut impact = None;
    let result = measure(o, &mut impact);
    (impact, result)
}

fn measure(o: &TrimImpactOptions, impact: &mut Option<TrimImpact>) -> Result<()> {
    let (dir, dir_fd, fs) = locate(&o.target)?;
    crate::host::privileges::check()?;
    let discard_max = check_discard(&dir, &fs, &dir_fd)?;
    let stop = StopFlag::install_with(false).map_err(|e| Error::io("installing signal handlers", e))?;
    let mut scratch = Scratch { dir: dir.clone(), paths: Vec::new() };
    let (probe, write_seconds, (start, end)) = write_and_delete(&mut scratch, &dir_fd, o.size, &stop)?;
    log::info!("deleted; trimming bytes {start}..{end} of {} while probing reads", fs.mount_point.display());
    let pace =
        if o.rate.is_some() { Pace::Fixed { rate: o.rate, pause: std::time::Duration::ZERO } } else { Pace::Unpaced };
    let targets = [TrimTarget { name: fs.mount_point.display().to_string(), fd: dir_fd.as_fd(), start, end }];
    let t = probe::run_probed(&targets, pace, &stop, &Thawed::never_froze(), probe);
    let stopped = t.stopped_by.clone();
    let failed = t.filesystems.iter().find_map(|f| f.error.clone());
    *impact = Some(TrimImpact {
        mount_point: fs.mount_point.display().to_string(),
        fs_type: fs.fs_type.clone(),
        device: format!("{}:{} ({})", fs.dev.0, fs.dev.1, fs.source),
        discard_max_bytes: discard_max,
        scratch_bytes: o.size,
        write_seconds,
        trim: t,
    });
    drop(scratch);
    if let Some(sig) = stopped {
        return Err(Error::Stopped {
            signal: sig,
            what: "bench --trim-impact stopped between trim slices; the report holds the slices done, the scratch files are removed".into(),
        });
    }
    match failed {
        Some(e) => Err(Error::io(format!("trimming {}", dir.display()), std::io::Error::other(e))),
        None => Ok(()),
    }
}
