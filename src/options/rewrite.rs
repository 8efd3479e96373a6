//! What `reseq rewrite` was asked to do, as typed values: built from the command line
//! (or a job file) in one place, `cli::hiargs`, which checks every bound and cross-flag
//! rule; built from [`Default`] by the demo. Nothing below the command line sees a flag
//! string.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::support::units::{self, Rate, Size};

/// Default chunk size, chosen by measurement (docs/CHUNK-SIZE.md, `bench/chunk-size.sh`):
/// 2-4 MiB was at or near the best on both a disk-backed and a memory-backed loop device,
/// it is well above the 1 MiB the FTL model needs to re-linearize, and it keeps memory
/// (6 buffers) and the granularity of freeze windows small.
pub(crate) const DEFAULT_CHUNK_SIZE: Size = Size::mib(4);
/// Default bound of one freeze window of a device run.
pub(crate) const DEFAULT_MAX_FREEZE: Duration = Duration::from_secs(5);
/// Default bound of a freeze window in file mode: a live database should see stalls
/// of about a second at most.
pub(crate) const DEFAULT_FILE_MAX_FREEZE: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_STATE_DIR: &str = "/var/lib/reseq";
pub(crate) const DEFAULT_PAUSE: Duration = Duration::ZERO;
/// File mode's pause between windows, for a live server: writers run at least half the
/// time (a window ends within its 1 s bound, usually well before), where back-to-back
/// windows would keep them waiting nearly all the run.
pub(crate) const DEFAULT_FILE_PAUSE: Duration = Duration::from_secs(1);
pub(crate) const DEFAULT_MAX_OVERRUNS: u32 = 3;
pub(crate) const DEFAULT_READ_AHEAD: usize = 2;
pub(crate) const DEFAULT_SCAN_REGIONS: usize = 64;
pub(crate) const DEFAULT_SLOW_THRESHOLD: f64 = 0.7;
/// The largest chunk: buffers are (read-ahead + 4) chunks.
pub(crate) const MAX_CHUNK_SIZE: Size = Size(1 << 30);

/// What the targets are, which decides who runs the rewrite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// One block device (or a path that does not exist: device mode says so).
    Device,
    /// Files and directories on mounted ext4/xfs.
    Files,
}

impl Mode {
    /// The mode the targets call for: one block device, or files. A path that does not
    /// exist goes to device mode, which says so. (`sim:STATE` is told apart before, in
    /// `cli::hiargs::rewrite`.) A new kind of target is recognised here (and run in
    /// `rewrite::run`): see docs/ARCHITECTURE.md, "Extending".
    pub(crate) fn of(targets: &[PathBuf]) -> Mode {
        let first = &targets[0];
        if targets.len() > 1 || !is_block_device(first) { Mode::Files } else { Mode::Device }
    }
}

/// A block device, or anything that is neither a regular file nor a directory (a path
/// that does not exist goes to device mode, which says so).
fn is_block_device(path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).map(|m| m.file_type().is_block_device() || !(m.is_file() || m.is_dir())).unwrap_or(true)
}

/// The options of one rewrite.
#[derive(Clone, Debug)]
pub(crate) struct RewriteOptions {
    pub(crate) mode: Mode,
    pub(crate) targets: Vec<PathBuf>,
    /// What the run does and how, as its journal keeps it.
    pub(crate) run: RunOptions,
    pub(crate) force: bool,
    /// Freeze even where the guardian cannot leave reseq's cgroup.
    pub(crate) accept_cgroup_risk: bool,
    pub(crate) dry_run: bool,
    pub(crate) resume: bool,
    pub(crate) restart: bool,
    pub(crate) state_dir: PathBuf,
    /// The `--bench-*` options.
    pub(crate) bench_opts: crate::options::bench::BenchOptions,
    /// Which options with a default were given: `--resume` keeps the interrupted run's
    /// value of every other one, whatever its default.
    pub(crate) given: Given,
}

/// What a run does and how: the options its journal keeps, so that `--resume` continues
/// it as it was started (`options::resume`). Field names are the flags'. Sizes, rates and
/// durations are kept as text (`"4M"`, `"300ms"`), as journals have always had them, and
/// compared by value (`300ms` is `0.3s`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunOptions {
    #[serde(with = "units::as_text")]
    pub(crate) chunk_size: Size,
    /// As given; None: the mode's default (see [`RewriteOptions::max_freeze`]).
    #[serde(with = "units::opt_duration_as_text")]
    pub(crate) max_freeze: Option<Duration>,
    #[serde(with = "units::opt_as_text")]
    pub(crate) rate: Option<Rate>,
    #[serde(with = "units::duration_as_text")]
    pub(crate) pause: Duration,
    pub(crate) max_overruns: u32,
    pub(crate) read_ahead: usize,
    pub(crate) no_verify: bool,
    pub(crate) include_free: bool,
    pub(crate) no_trim: bool,
    /// `--trim-rate` (pacing; absent from runs recorded before it existed).
    #[serde(default, with = "units::opt_as_text")]
    pub(crate) trim_rate: Option<Rate>,
    pub(crate) only_slow: bool,
    pub(crate) from_scan: Option<PathBuf>,
    /// `--older-than`: file mode rewrites only files whose newest of mtime and ctime is
    /// older than this (absent from runs recorded before it existed).
    #[serde(default, with = "units::opt_duration_as_text")]
    pub(crate) older_than: Option<Duration>,
    pub(crate) scan_regions: usize,
    pub(crate) slow_threshold: f64,
    pub(crate) exclude: Vec<String>,
    /// `--bench` (absent from runs recorded before it was kept): a resumed run compares
    /// with the benchmark taken before the run started.
    #[serde(default)]
    pub(crate) bench: bool,
}

// slow_threshold is checked to lie in (0, 1]: never NaN.
impl Eq for RunOptions {}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            chunk_size: DEFAULT_CHUNK_SIZE,
            max_freeze: None,
            rate: None,
            pause: DEFAULT_PAUSE,
            max_overruns: DEFAULT_MAX_OVERRUNS,
            read_ahead: DEFAULT_READ_AHEAD,
            no_verify: false,
            include_free: false,
            no_trim: false,
            trim_rate: None,
            only_slow: false,
            from_scan: None,
            older_than: None,
            scan_regions: DEFAULT_SCAN_REGIONS,
            slow_threshold: DEFAULT_SLOW_THRESHOLD,
            exclude: Vec::new(),
            bench: false,
        }
    }
}

/// Which of the options that have a default value were given (on the command line or in
/// a job file; an option given with its default value is given: `--resume --pause 0s`
/// means it). The options without a default are `Option`s and say it themselves. Filled
/// by `cli::hiargs::given`; the demo gives none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Given {
    pub(crate) chunk_size: bool,
    pub(crate) pause: bool,
    pub(crate) max_overruns: bool,
    pub(crate) read_ahead: bool,
    pub(crate) scan_regions: bool,
    pub(crate) slow_threshold: bool,
}

impl Default for RewriteOptions {
    fn default() -> RewriteOptions {
        RewriteOptions {
            mode: Mode::Device,
            targets: Vec::new(),
            run: RunOptions::default(),
            force: false,
            accept_cgroup_risk: false,
            dry_run: false,
            resume: false,
            restart: false,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            bench_opts: crate::options::bench::BenchOptions::default(),
            given: Given::default(),
        }
    }
}

impl RewriteOptions {
    /// The device of device mode (the first target).
    pub(crate) fn device(&self) -> &Path {
        &self.targets[0]
    }

    /// The mode's default bound of a freeze window.
    pub(crate) fn default_max_freeze(&self) -> Duration {
        if self.mode == Mode::Files { DEFAULT_FILE_MAX_FREEZE } else { DEFAULT_MAX_FREEZE }
    }

    /// `--max-freeze`, or the mode's default.
    pub(crate) fn max_freeze(&self) -> Duration {
        self.run.max_freeze.unwrap_or(self.default_max_freeze())
    }
}
