//! `reseq scan DIR --by-file` and `reseq estimate DIR`: read speed per file, related to
//! the file's age.
//!
//! Data left unwritten for months reads slowly on many TLC/QLC drives (the cells' charge
//! drifts and reads need retries); rewriting it restores the speed. So each file is read
//! once through the filesystem (O_DIRECT, as `bench` reads a file) and placed in an age
//! band by the newest of its mtime and ctime: the last time its bytes (or its inode) were
//! written. A file is slow below `threshold` x a reference: the median of the youngest
//! files, which are fresh by definition, or, with too few of those, of the fastest
//! quarter (as a region scan's reference). The same honesty rules as `bench` apply: the
//! cache check before, the host's load (or an emulated drive's punctuality) during; a
//! read below its limit is read again and the faster reading counts (a busy host only
//! slows reads), as `estimate` reads its regions twice.

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::measure::bench::{EmulatedDrive, HostPressure, LATE_SHARE, Watch};
use crate::measure::noise::{Place, ROUNDS, Sureness, fastest_quarter, median, stopped};
use crate::measure::readbench::{CacheCheck, Source, Target, cache_check, read_span};
use crate::options::bench::FileSort;
use crate::support::error::{Error, Result};
use crate::support::units::human_bytes;

/// Age bands, by their upper bound in seconds (the last has none).
pub(crate) const BANDS: [(&str, Option<f64>); 4] = [
    ("< 1 week", Some(7.0 * DAY)),
    ("< 1 month", Some(30.0 * DAY)),
    ("< 6 months", Some(182.0 * DAY)),
    ("older", None),
];
const DAY: f64 = 86_400.0;

/// A file of fewer than this many read commands is timed with the other small files of
/// its band: its time would be mostly the first command's latency (4 MiB at 1 MiB blocks
/// is 8 ms at 500 MB/s, within a busy host's scheduling noise).
pub(crate) const SMALL_FILE_BLOCKS: u64 = 4;

/// The youngest band is the reference when it has at least this many timed reads (files
/// timed alone, or its group of small files): one fresh file alone could be an outlier.
pub(crate) const MIN_YOUNG_READS: usize = 3;

/// One file's read.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct FileSpeed {
    pub(crate) path: String,
    pub(crate) size_bytes: u64,
    /// FIEMAP extents (unwritten ones too).
    pub(crate) extents: usize,
    /// Seconds since the newest of mtime and ctime.
    pub(crate) age_seconds: f64,
    /// Its age band's name.
    pub(crate) band: String,
    /// Its own read's throughput, or its group's (`timed_alone` false).
    pub(crate) bytes_per_second: f64,
    pub(crate) seconds: f64,
    /// False: a small file, timed with the other small files of its band.
    pub(crate) timed_alone: bool,
    /// Below `threshold` x the reference.
    pub(crate) slow: bool,
}

/// One age band of a per-file scan.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct AgeBand {
    pub(crate) band: String,
    /// Files of this band are younger than this (null: the oldest band).
    pub(crate) max_age_seconds: Option<f64>,
    pub(crate) files: usize,
    pub(crate) bytes: u64,
    /// Median of its timed reads (each file timed alone, and its small files' group as
    /// one); null: no file in the band.
    pub(crate) median_bytes_per_second: Option<f64>,
    /// Small files timed together, and their group's throughput (null: none).
    pub(crate) small_files: usize,
    pub(crate) small_files_bytes_per_second: Option<f64>,
    pub(crate) slow_files: usize,
    pub(crate) slow_bytes: u64,
}

/// `reseq scan DIR --by-file`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct FileScan {
    pub(crate) target: String,
    pub(crate) block_size_bytes: u64,
    pub(crate) queue_depth: usize,
    /// `age` (oldest first) or `throughput` (slowest first): the order of `files`.
    pub(crate) sorted_by: String,
    /// Files smaller than this are timed together, per age band.
    pub(crate) small_file_bytes: u64,
    pub(crate) threshold: f64,
    pub(crate) reference_bytes_per_second: f64,
    /// Which reads the reference is the median of, in words: the youngest band's, or the
    /// fastest quarter's.
    pub(crate) reference: String,
    /// The reference of the bands' groups of small files: the youngest band's group, else
    /// the fastest group (null: no small files).
    pub(crate) small_files_reference_bytes_per_second: Option<f64>,
    pub(crate) small_files_reference: Option<String>,
    pub(crate) bands: Vec<AgeBand>,
    pub(crate) files: Vec<FileSpeed>,
    pub(crate) bytes_total: u64,
    pub(crate) slow_files: usize,
    pub(crate) slow_bytes: u64,
    /// False when a cache below O_DIRECT or a late emulated drive could explain the
    /// differences (`unreliable_because` says which).
    pub(crate) reliable: bool,
    pub(crate) unreliable_because: Option<String>,
    pub(crate) cache: Option<CacheCheck>,
    /// The host's load over the whole scan (null: no PSI).
    pub(crate) host_pressure: Option<HostPressure>,
    /// The largest difference between two timed reads' shares of time some task waited
    /// for a CPU (/proc/pressure), for information: a busy host only slows a read, and
    /// a read below its limit is read again, the faster reading counting.
    pub(crate) cpu_pressure_spread: Option<f64>,
    pub(crate) emulated: Option<EmulatedDrive>,
}

/// A file found under the target, not yet read.
pub(crate) struct Found {
    pub(crate) path: PathBuf,
    pub(crate) size: u64,
    /// Bytes of written extents: holes and preallocated (unwritten) space read as zeros
    /// without the device, so a rate counts only these.
    pub(crate) data: u64,
    pub(crate) extents: usize,
    pub(crate) age_seconds: f64,
    pub(crate) band: usize,
}

impl Found {
    /// Written to (nearly) its end: a part of it read is a part of its data read.
    pub(crate) fn dense(&self) -> bool {
        self.data * 100 >= self.size * 99
    }
}

/// The band of an age.
pub(crate) fn band_of(age_seconds: f64) -> usize {
    BANDS.iter().position(|(_, max)| max.is_none_or(|m| age_seconds < m)).unwrap_or(BANDS.len() - 1)
}

/// Seconds since the newest of a file's mtime and ctime (0 for one in the future).
pub(crate) fn age_of(md: &std::fs::Metadata) -> f64 {
    let t = |s: i64, ns: i64| s as f64 + ns as f64 * 1e-9;
    let newest = t(md.mtime(), md.mtime_nsec()).max(t(md.ctime(), md.ctime_nsec()));
    (unix_now() - newest).max(0.0)
}

/// Now, in seconds since the Unix epoch.
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The regular, non-empty files under `target` (a directory, recursively on its
/// filesystem, or one file), with their ages, in path order. A block device or a
/// simulated SSD has no files: refused.
pub(crate) fn find(target: &Path) -> Result<Vec<Found>> {
    use std::os::unix::fs::FileTypeExt;
    if crate::options::sim::sim_state(target).is_some() {
        return Err(Error::Usage(format!(
            "{}: a simulated SSD has no files; per-file reads and ages need a directory on mounted ext4/xfs",
            target.display()
        )));
    }
    let md = std::fs::metadata(target).map_err(|e| Error::cannot_use(target, e))?;
    let mut paths = Vec::new();
    if md.is_dir() {
        crate::support::walk::regular_files(target, md.dev(), &|_| false, &mut paths)?;
    } else if md.is_file() {
        paths.push(target.to_path_buf());
    } else {
        let what = if md.file_type().is_block_device() { "a block device" } else { "not a regular file" };
        return Err(Error::Usage(format!(
            "{} is {what}: per-file reads and ages need files or a directory of files (scan a device by region, without --by-file)",
            target.display()
        )));
    }
    paths.sort();
    let out = found_of(&paths)?;
    if out.is_empty() {
        return Err(Error::Usage(format!("{} holds no regular files with data", target.display())));
    }
    Ok(out)
}

/// The files of `paths` with data on the device, with their ages, each once (a hard
/// link to a file listed already is the same data). A file gone since it was listed (a
/// live directory rotates its logs) is left out, not an error.
pub(crate) fn found_of(paths: &[PathBuf]) -> Result<Vec<Found>> {
    let (mut out, mut seen) = (Vec::new(), std::collections::HashSet::new());
    for path in paths.iter().cloned() {
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let (md, map) = match std::fs::File::open(&path).and_then(|f| Ok((f.metadata()?, data_of(&f)))) {
            Err(e) if gone(&e) => {
                log::info!("{} is gone since it was listed: left out", path.display());
                continue;
            }
            r => r.map_err(|e| Error::io(format!("stat {}", path.display()), e))?,
        };
        let (data, extents) = map.map_err(|e| Error::io(format!("FIEMAP of {}", path.display()), e.into()))?;
        if data > 0 && seen.insert((md.dev(), md.ino())) {
            let age_seconds = age_of(&md);
            out.push(Found {
                path,
                size: md.len(),
                data: data.min(md.len()),
                extents,
                age_seconds,
                band: band_of(age_seconds),
            });
        }
    }
    Ok(out)
}

/// A file's written bytes and extents (FIEMAP, without syncing: the scan reads, it does
/// not flush; data not yet written back counts as written).
fn data_of(f: &std::fs::File) -> nix::Result<(u64, usize)> {
    let extents = crate::sys::extents::fiemap(f.as_fd(), 0, 0)?;
    Ok((extents.iter().filter(|e| !e.is_unwritten()).map(|e| e.length).sum(), extents.len()))
}

/// One timed read: of a file alone, or of a band's small files together.
pub(crate) struct Timed {
    /// Indexes into the found files.
    pub(crate) files: Vec<usize>,
    pub(crate) band: usize,
    pub(crate) bytes: u64,
    pub(crate) seconds: f64,
    pub(crate) cpu_some: Option<f64>,
    /// A band's small files, timed together.
    pub(crate) group: bool,
}

impl Timed {
    pub(crate) fn rate(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }
}

/// Reads `files` (indexes into `found`) one after another, timed as one; sources are
/// opened in batches, so that thousands of small files do not exhaust descriptors.
pub(crate) fn time_files(found: &[Found], files: &[usize], block: u64, qd: usize) -> Result<(u64, f64, Option<f64>)> {
    let (mut bytes, mut seconds, mut cpu) = (0, 0.0, Vec::new());
    for batch in files.chunks(256) {
        stopped()?;
        // Gone since it was found: not read, not counted.
        let here: Vec<usize> = batch.iter().copied().filter(|&i| found[i].path.exists()).collect();
        if here.is_empty() {
            continue;
        }
        let sources: Vec<Source> = here.iter().map(|&i| Source::open(&found[i].path)).collect::<Result<_>>()?;
        let target = Target::Real(sources);
        let watch = Watch::start(&target);
        let t = read_span(&target, block, qd, 0, target.len())?;
        // The device read the files' data; their holes it did not.
        let data: u64 = here.iter().map(|&i| found[i].data).sum();
        (bytes, seconds) = (bytes + data.min(t.bytes), seconds + t.seconds);
        cpu.extend(watch.host_pressure(&target).map(|p| p.cpu_some));
    }
    Ok((bytes, seconds, (!cpu.is_empty()).then(|| median(&cpu))))
}

/// Reads every file: each large one alone, the small ones of each band together.
fn time_all(found: &[Found], block: u64, qd: usize) -> Result<Vec<Timed>> {
    let small = SMALL_FILE_BLOCKS * block;
    let mut out = Vec::new();
    for (i, f) in found.iter().enumerate().filter(|(_, f)| f.size >= small) {
        let (bytes, seconds, cpu_some) = time_files(found, &[i], block, qd)?;
        log::debug!("{}: {} in {seconds:.3} s", f.path.display(), human_bytes(bytes));
        out.push(Timed { files: vec![i], band: f.band, bytes, seconds, cpu_some, group: false });
    }
    for band in 0..BANDS.len() {
        let files: Vec<usize> = (0..found.len()).filter(|&i| found[i].band == band && found[i].size < small).collect();
        if !files.is_empty() {
            let (bytes, seconds, cpu_some) = time_files(found, &files, block, qd)?;
            out.push(Timed { files, band, bytes, seconds, cpu_some, group: true });
        }
    }
    Ok(out)
}

/// The reference throughput and which reads it is the median of: the youngest band's,
/// with at least [`MIN_YOUNG_READS`] timed reads, else the fastest quarter of all.
fn reference(rates_by_band: &[Vec<f64>]) -> (f64, String) {
    let young = &rates_by_band[0];
    if young.len() >= MIN_YOUNG_READS {
        return (median(young), format!("the youngest files ({}, {} timed reads)", BANDS[0].0, young.len()));
    }
    let all: Vec<f64> = rates_by_band.iter().flatten().copied().collect();
    let top = all.len().div_ceil(4);
    (
        fastest_quarter(&all),
        format!(
            "the fastest quarter of the files ({top} of {} timed reads: fewer than {MIN_YOUNG_READS} are {})",
            all.len(),
            BANDS[0].0
        ),
    )
}

/// Scans the files under `target` one by one: see the module's comment.
pub(crate) fn scan(target: &Path, block: u64, qd: usize, threshold: f64, sort: FileSort) -> Result<FileScan> {
    scan_found(&target.display().to_string(), &find(target)?, (block, qd), threshold, sort)
}

/// Scans `found` (not empty), `read` = (block size, queue depth).
pub(crate) fn scan_found(
    name: &str,
    found: &[Found],
    read: (u64, usize),
    threshold: f64,
    sort: FileSort,
) -> Result<FileScan> {
    let (block, qd) = read;
    let cache = check_cache(found, block, qd)?;
    let whole = Target::Real(vec![Source::open(&found[0].path)?]);
    let watch = Watch::start(&whole);
    let mut timed = time_all(found, block, qd)?;
    let ((reference_bps, reference_words), group_ref) = references(&timed);
    let limits = (threshold * reference_bps, group_ref.map(|g| threshold * g.0));
    let (again, reread) = read_slow_again(found, &mut timed, limits, (block, qd))?;
    let read_seconds: f64 = timed.iter().map(|t| t.seconds).sum::<f64>() + again;
    let (host_pressure, emulated) = (watch.host_pressure(&whole), watch.emulated(&whole, read_seconds));
    let rates_by_band = rates_by(&timed, None);
    let files = speeds(found, &timed, limits)?;
    let spread = pressure_spread(&timed);
    let sureness = Sureness::of(&reread);
    let noisy = sureness.noisy().then(|| format!("of the files read again, {}", sureness.words));
    let unreliable_because = unreliable(cache.as_ref(), emulated.as_ref()).or(noisy);
    if let Some(why) = &unreliable_because {
        log::warn!("per-file throughput unreliable: {why}");
    }
    let mut out = FileScan {
        target: name.to_string(),
        block_size_bytes: block,
        queue_depth: qd,
        sorted_by: match sort {
            FileSort::Age => "age",
            FileSort::Throughput => "throughput",
        }
        .into(),
        small_file_bytes: SMALL_FILE_BLOCKS * block,
        threshold,
        reference_bytes_per_second: reference_bps,
        reference: reference_words,
        small_files_reference_bytes_per_second: group_ref.map(|g| g.0),
        small_files_reference: group_ref.map(|g| g.1.into()),
        bands: bands(&files, &timed, &rates_by_band),
        bytes_total: files.iter().map(|f| f.size_bytes).sum(),
        slow_files: files.iter().filter(|f| f.slow).count(),
        slow_bytes: files.iter().filter(|f| f.slow).map(|f| f.size_bytes).sum(),
        files,
        reliable: unreliable_because.is_none(),
        unreliable_because,
        cache,
        host_pressure,
        cpu_pressure_spread: spread,
        emulated,
    };
    sort_files(&mut out.files, sort);
    Ok(out)
}

/// The rates of the timed reads by band: all of them, or only groups (Some(true)) or
/// only files timed alone (Some(false)).
pub(crate) fn rates_by(timed: &[Timed], group: Option<bool>) -> Vec<Vec<f64>> {
    let of = |t: &&Timed, b: usize| t.band == b && group.is_none_or(|g| t.group == g);
    (0..BANDS.len()).map(|b| timed.iter().filter(|t| of(t, b)).map(Timed::rate).collect()).collect()
}

/// The reference of files timed alone, and of the groups of small files. Files timed
/// alone are compared with files timed alone, groups with groups: many small reads are
/// slower than a few large ones whatever the data's age.
pub(crate) fn references(timed: &[Timed]) -> ((f64, String), Option<(f64, &'static str)>) {
    let alone = rates_by(timed, Some(false));
    let files =
        if alone.iter().any(|r| !r.is_empty()) { reference(&alone) } else { reference(&rates_by(timed, Some(true))) };
    (files, group_reference(timed))
}

/// Reads each read below its limit again, up to [`ROUNDS`] readings in all, keeping the
/// fastest and stopping at the first that is not slow: a file is slow only if it is slow
/// every time it is read (a busy host only ever slows a read; see
/// [`crate::measure::noise`]). Returns the seconds the later readings took, and the
/// readings of the reads read again (for their spread).
fn read_slow_again(
    found: &[Found],
    timed: &mut [Timed],
    limits: (f64, Option<f64>),
    read: (u64, usize),
) -> Result<(f64, Vec<Place>)> {
    let (mut seconds, mut places) = (0.0, Vec::new());
    for t in timed.iter_mut() {
        let limit = if t.group { limits.1.unwrap_or(0.0) } else { limits.0 };
        let mut place = Place { rates: vec![t.rate()], zeros: false };
        for _ in 1..ROUNDS {
            if t.rate() >= limit {
                break;
            }
            let (bytes, secs, _) = time_files(found, &t.files, read.0, read.1)?;
            seconds += secs;
            place.rates.push(bytes as f64 / secs.max(f64::MIN_POSITIVE));
            if bytes == t.bytes && secs < t.seconds {
                t.seconds = secs;
            }
        }
        if place.rates.len() > 1 {
            places.push(place);
        }
    }
    Ok((seconds, places))
}

/// The cache check of `bench`, on the largest files (up to 64 of them, in path order),
/// those without holes first: a hole reads fast from no cache and would hide one.
pub(crate) fn check_cache(found: &[Found], block: u64, qd: usize) -> Result<Option<CacheCheck>> {
    let mut largest: Vec<usize> = (0..found.len()).collect();
    largest.sort_by_key(|&i| (!found[i].dense(), std::cmp::Reverse(found[i].size)));
    largest.truncate(64);
    largest.sort();
    let sources: Vec<Source> = largest.iter().map(|&i| Source::open(&found[i].path)).collect::<Result<_>>()?;
    let target = Target::Real(sources);
    let align = target.offset_align();
    if block == 0 || !block.is_multiple_of(align) {
        return Err(Error::Usage(format!("--block-size must be a non-zero multiple of {align} bytes for these files")));
    }
    cache_check(&target, block.min(target.len() / 2 / align * align).max(align), qd)
}

/// The reference of the small files' groups: the youngest band's group, or the fastest.
fn group_reference(timed: &[Timed]) -> Option<(f64, &'static str)> {
    let groups: Vec<&Timed> = timed.iter().filter(|t| t.group).collect();
    let youngest = groups.iter().min_by_key(|t| t.band)?;
    if youngest.band == 0 {
        return Some((youngest.rate(), "the youngest band's small files"));
    }
    Some((groups.iter().map(|t| t.rate()).fold(0.0, f64::max), "the fastest band's small files"))
}

/// Every file's line, flagged slow below `limits`: files timed alone, and groups (with
/// no group reference, a group is not flagged).
fn speeds(found: &[Found], timed: &[Timed], limits: (f64, Option<f64>)) -> Result<Vec<FileSpeed>> {
    let mut out = Vec::new();
    for t in timed {
        for &i in &t.files {
            let f = &found[i];
            out.push(FileSpeed {
                path: f.path.display().to_string(),
                size_bytes: f.size,
                extents: f.extents,
                age_seconds: f.age_seconds,
                band: BANDS[f.band].0.into(),
                bytes_per_second: t.rate(),
                seconds: t.seconds,
                timed_alone: !t.group,
                slow: t.rate() < if t.group { limits.1.unwrap_or(0.0) } else { limits.0 },
            });
        }
    }
    Ok(out)
}

/// The largest difference of the CPU pressure between two reads of at least 50 ms
/// (shorter ones are within PSI's own granularity).
fn pressure_spread(timed: &[Timed]) -> Option<f64> {
    let cpu: Vec<f64> = timed.iter().filter(|t| t.seconds >= 0.05).filter_map(|t| t.cpu_some).collect();
    let (lo, hi) = cpu.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &c| (lo.min(c), hi.max(c)));
    (!cpu.is_empty()).then_some(hi - lo)
}

/// Why the files' speeds do not compare, if they do not: bench's rules. A cache below
/// O_DIRECT; an emulated drive that answered late (its time is its model's, so the host's
/// load does not count there).
pub(crate) fn unreliable(cache: Option<&CacheCheck>, emulated: Option<&EmulatedDrive>) -> Option<String> {
    if let Some(c) = cache.filter(|c| c.cache_suspected) {
        return Some(c.finding.clone());
    }
    if let Some(e) = emulated.filter(|e| e.late_share > LATE_SHARE) {
        let late = e.late_share * 100.0;
        return Some(format!(
            "the emulated drive (reseq sim serve) answered {} of {} requests late, by {late:.0} % of the reads' time: this host did not keep up with its time scale {}",
            e.late_replies, e.replies, e.time_scale
        ));
    }
    // The host's load only slows a read, and a slow read is read again (the faster
    // reading counts): a changing load is reported (`cpu_pressure_spread`), not a reason.
    None
}

/// The bands' figures.
fn bands(files: &[FileSpeed], timed: &[Timed], rates_by_band: &[Vec<f64>]) -> Vec<AgeBand> {
    BANDS
        .iter()
        .enumerate()
        .map(|(b, (name, max))| {
            let in_band: Vec<&FileSpeed> = files.iter().filter(|f| f.band == *name).collect();
            let group = timed.iter().find(|t| t.band == b && t.group);
            AgeBand {
                band: (*name).into(),
                max_age_seconds: *max,
                files: in_band.len(),
                bytes: in_band.iter().map(|f| f.size_bytes).sum(),
                median_bytes_per_second: (!rates_by_band[b].is_empty()).then(|| median(&rates_by_band[b])),
                small_files: in_band.iter().filter(|f| !f.timed_alone).count(),
                small_files_bytes_per_second: group.map(Timed::rate),
                slow_files: in_band.iter().filter(|f| f.slow).count(),
                slow_bytes: in_band.iter().filter(|f| f.slow).map(|f| f.size_bytes).sum(),
            }
        })
        .collect()
}

fn sort_files(files: &mut [FileSpeed], sort: FileSort) {
    match sort {
        FileSort::Age => files.sort_by(|a, b| b.age_seconds.total_cmp(&a.age_seconds).then(a.path.cmp(&b.path))),
        FileSort::Throughput => {
            files.sort_by(|a, b| a.bytes_per_second.total_cmp(&b.bytes_per_second).then(a.path.cmp(&b.path)))
        }
    }
}

/// "3.2 d", "5 h", "14 months": an age for people.
pub(crate) fn human_age(seconds: f64) -> String {
    match seconds {
        s if s < 3600.0 => format!("{:.0} min", s / 60.0),
        s if s < DAY => format!("{:.1} h", s / 3600.0),
        s if s < 60.0 * DAY => format!("{:.1} d", s / DAY),
        s => format!("{:.1} months", s / (30.44 * DAY)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_fall_into_their_bands() {
        assert_eq!(band_of(0.0), 0);
        assert_eq!(band_of(7.0 * DAY - 1.0), 0);
        assert_eq!(band_of(7.0 * DAY), 1);
        assert_eq!(band_of(30.0 * DAY), 2);
        assert_eq!(band_of(182.0 * DAY), 3);
        assert_eq!(band_of(10_000.0 * DAY), 3);
    }

    #[test]
    fn the_reference_is_the_youngest_files_when_there_are_enough() {
        let (r, why) = reference(&[vec![100.0, 110.0, 90.0], vec![], vec![], vec![20.0, 30.0]]);
        assert_eq!(r, 100.0);
        assert!(why.contains("youngest"), "{why}");
        // Two young reads are too few: the fastest quarter of all eight (two reads).
        let (r, why) = reference(&[vec![100.0, 10.0], vec![], vec![50.0, 60.0], vec![20.0, 30.0, 200.0, 40.0]]);
        assert_eq!(r, 150.0);
        assert!(why.contains("fastest quarter") && why.contains("2 of 8"), "{why}");
    }

    fn timed(band: usize, bytes: u64, seconds: f64, group: bool) -> Timed {
        Timed { files: vec![0], band, bytes, seconds, cpu_some: None, group }
    }

    #[test]
    fn groups_of_small_files_are_compared_with_groups() {
        // Large files at 100 B/s, small ones at 10 B/s in the youngest band: a group of
        // old small files at 9 B/s is not slow against the large files' 100.
        let t = [timed(0, 100, 1.0, false), timed(0, 10, 1.0, true), timed(3, 9, 1.0, true)];
        let ((files, _), group) = references(&t);
        assert_eq!(files, 100.0);
        assert_eq!(group.map(|g| g.0), Some(10.0));
        assert_eq!(human_age(3.0 * DAY), "3.0 d");
    }
}
