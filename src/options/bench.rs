//! What the measuring commands (`bench`, `scan`, `estimate`) and a rewrite's `--bench`
//! read and how: typed values, checked where the command line is read (`cli::lower`).

use std::path::PathBuf;
use std::time::Duration;

/// The `--bench-*` options of a rewrite.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BenchOptions {
    /// Bytes per read command.
    pub(crate) block_size: u64,
    /// Reads in flight at once.
    pub(crate) queue_depth: usize,
    /// Timed passes over the range.
    pub(crate) passes: usize,
    /// Pause between passes.
    pub(crate) settle: Duration,
    /// Regions of the before/after throughput map.
    pub(crate) regions: usize,
    /// Measure only this much from the start of the range (None: all of it).
    pub(crate) length: Option<u64>,
    /// How long after the after-benchmark a change it found is measured again, to tell
    /// re-sequencing (it lasts) from a cache below the device (it fades). Zero: never.
    pub(crate) recheck: Duration,
}

/// The default of [`BenchOptions::recheck`]: a cache below a VM's disk was seen to
/// fade within 18 s of the rewrite.
pub(crate) const RECHECK_AFTER: Duration = Duration::from_secs(30);

impl Default for BenchOptions {
    fn default() -> BenchOptions {
        BenchOptions {
            block_size: 1 << 20,
            queue_depth: 1,
            passes: 3,
            settle: Duration::ZERO,
            regions: 32,
            length: None,
            recheck: RECHECK_AFTER,
        }
    }
}

/// What `bench` and `scan` read, and how.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ReadOptions {
    /// A block device, a file, a directory of files, or `sim:STATE`.
    pub(crate) target: PathBuf,
    /// Bytes per read command.
    pub(crate) block_size: u64,
    /// Reads in flight at once.
    pub(crate) queue_depth: usize,
    /// Start of the range.
    pub(crate) offset: u64,
    /// Length of the range (None: to the end).
    pub(crate) length: Option<u64>,
    /// Measure a device's free space too, not only the ranges in use.
    pub(crate) include_free: bool,
}

/// `reseq bench`: timed passes, or the cost of a trim.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum BenchCommand {
    Passes { read: ReadOptions, passes: usize, settle: Duration },
    TrimImpact(TrimImpactOptions),
}

/// `reseq bench --trim-impact`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TrimImpactOptions {
    /// A file or directory on the filesystem to measure.
    pub(crate) target: PathBuf,
    /// Bytes of the scratch file that is deleted and trimmed (at least 1 MiB).
    pub(crate) size: u64,
    /// Pace of the trim in bytes per second (None: unpaced slices).
    pub(crate) rate: Option<u64>,
}

/// `reseq scan`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ScanOptions {
    pub(crate) read: ReadOptions,
    /// Regions to time (1 to 100 000).
    pub(crate) regions: usize,
    /// A region (or file) is slow below this fraction, in (0, 1].
    pub(crate) threshold: f64,
    /// `--by-file`: one read per file, listed in this order (None: by region).
    pub(crate) by_file: Option<FileSort>,
}

/// How `scan --by-file` lists the files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileSort {
    /// Oldest first.
    Age,
    /// Slowest first.
    Throughput,
}

/// `reseq estimate`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EstimateOptions {
    pub(crate) target: PathBuf,
    /// Bytes to read in all.
    pub(crate) sample: u64,
    /// Places to read from.
    pub(crate) regions: usize,
}
