//! The command line, and nothing else: clap definitions, parsed into typed values (sizes,
//! rates and durations are checked by their value parsers, so a bad value's error names
//! its flag, and a job file turned into argv gets the same check). [`hiargs`] turns
//! them into the options the layers below take.

pub(crate) mod config;
pub(crate) mod generate;
pub(crate) mod hiargs;
pub(crate) mod lower;
pub mod run;

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser as _};
use clap::{Args, Parser, Subcommand};

pub(crate) use crate::options::rewrite::{
    DEFAULT_CHUNK_SIZE, DEFAULT_MAX_OVERRUNS, DEFAULT_READ_AHEAD, DEFAULT_SCAN_REGIONS, DEFAULT_SLOW_THRESHOLD,
    DEFAULT_STATE_DIR,
};
use crate::report::render::Format;
use crate::support::units::{Rate, Size, parse_duration};

/// `--max-freeze`: a duration from 10 ms to 1 h (a freeze is a stall of every writer).
fn window_length(v: &str) -> Result<Duration, String> {
    let d = parse_duration(v)?;
    if d < Duration::from_millis(10) || d > Duration::from_secs(3600) {
        return Err(format!("{v} is outside 10ms..1h"));
    }
    Ok(d)
}

/// `sim age --days`: a finite, non-negative number of days, at most a century.
fn age_days(v: &str) -> Result<f64, String> {
    let d: f64 = v.trim().parse().map_err(|_| format!("{v} is not a number of days"))?;
    if !d.is_finite() {
        return Err(format!("{v} is not a finite number of days"));
    }
    if d < 0.0 {
        return Err(format!("{v}: the clock only goes forward (0 or more days)"));
    }
    if d > crate::sim::ftl::MAX_AGE_DAYS {
        return Err(format!("{v} days is more than a century: a typo, not an age"));
    }
    Ok(d)
}

/// Pauses and settle times: up to a day (a longer one is a typo, not a plan).
fn pause_length(v: &str) -> Result<Duration, String> {
    let d = parse_duration(v)?;
    if d > Duration::from_secs(86_400) {
        return Err(format!("{v} is longer than a day"));
    }
    Ok(d)
}

/// A size of `min` bytes to `max`; outside, an error that says it `must be {rule}`.
fn size_within(v: &str, min: u64, max: Size, rule: &str) -> Result<Size, String> {
    let s: Size = v.parse()?;
    if s.bytes() < min || s > max {
        return Err(format!("must be {rule}, not {v}"));
    }
    Ok(s)
}

/// `rewrite --chunk-size`: at least a sector, at most 1 GiB (buffers are several chunks),
/// in device and file mode alike; the device's alignment is checked once it is open.
fn chunk_size(v: &str) -> Result<Size, String> {
    size_within(v, 1, crate::options::rewrite::MAX_CHUNK_SIZE, "between 1 sector and 1 GiB")
}

/// `estimate --sample`: something to read (a 0 would predict from nothing).
fn sample_size(v: &str) -> Result<Size, String> {
    size_within(v, 1, Size(u64::MAX), "more than 0")
}

/// `bench --trim-size`: at least one trim slice's alignment.
fn trim_size(v: &str) -> Result<Size, String> {
    size_within(v, crate::host::trim::SLICE_ALIGN, Size(u64::MAX), "at least 1M")
}

/// A fraction in (0, 1], e.g. 0.7.
fn fraction(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        Ok(_) => Err(format!("{v} is not in (0, 1]; e.g. 0.7")),
        Err(e) => Err(format!("{v} is not a number ({e})")),
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "reseq",
    version,
    about = "Re-sequence SSD data in place so sequential reads are fast again, without losing a byte",
    long_about = "reseq rewrites a device's blocks to the same addresses, in ascending order and large \
chunks, so that the SSD's flash translation layer lays them out in order again. Mounted filesystems \
are frozen (FIFREEZE) in bounded windows, a guardian process thaws them whatever happens to reseq, \
every chunk is read back and compared with what was written, and a journal lets an interrupted run \
resume."
)]
pub(crate) struct Cli {
    /// More detail: reasons, rules, debug log (-vv trace)
    ///
    /// A dry run's whole plan (what is checked, the prediction's model and the host it
    /// rests on), a run's depth, trial and rules, every file of a file-mode run; and the
    /// log with timestamps and module paths (-v debug, -vv trace). RUST_LOG overrides the
    /// log's level.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = "Output")]
    pub(crate) verbose: u8,
    /// Only warnings and errors
    #[arg(short, long, global = true, conflicts_with = "verbose", help_heading = "Output")]
    pub(crate) quiet: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

impl Cli {
    /// Parses `argv`; a rewrite's [`RewriteArgs::given`] names the options given on it
    /// (an option given with its default value is given: `--resume --pause 0s` means it).
    pub(crate) fn try_parse_given<I, T>(argv: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let m = Cli::command().try_get_matches_from(argv)?;
        let mut cli = Cli::from_arg_matches(&m)?;
        if let (Command::Rewrite(a), Some(("rewrite", sub))) = (&mut cli.command, m.subcommand()) {
            a.given = hiargs::given(sub);
        }
        Ok(cli)
    }
}

impl Command {
    /// How the command's report is printed, for the commands that print one.
    pub(crate) fn output(&self) -> Option<&OutputArgs> {
        match self {
            Command::Rewrite(a) => Some(&a.output),
            Command::Bench(a) => Some(&a.output),
            Command::Scan(a) => Some(&a.output),
            Command::Estimate(a) => Some(&a.output),
            _ => None,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Re-sequence a device, or files on mounted ext4/xfs/btrfs, in place
    ///
    /// A block device (a partition or a whole disk), or files and directories on mounted
    /// ext4/xfs/btrfs (file mode).
    Rewrite(RewriteArgs),
    /// Re-sequence a throwaway ext4 image, to see how it goes (touches no real disk)
    ///
    /// Makes a throwaway ext4 image on a loop device, fragments a file on it, re-sequence it
    /// while mounted, print the report and clean up. Touches no real disk. Without root it
    /// runs `reseq simulate` instead.
    Demo(DemoArgs),
    /// Reproduce the degradation experiment on a simulated SSD
    ///
    /// Writes a file, degrades it
    /// with four stages of random 4 KiB writes, re-sequence it with reseq's own engine,
    /// and print sequential read times (virtual) after each step.
    Simulate(SimulateArgs),
    /// Measure sequential read throughput of a device, file or directory
    ///
    /// O_DIRECT reads of a device, file, directory or simulated SSD: each pass and the
    /// median, min and max.
    Bench(BenchArgs),
    /// Time a target region by region and flag the slow regions
    ///
    /// Each region
    /// once, then twice more those slow so far and the fastest quarter; a region is slow
    /// only if slow at every reading.
    Scan(ScanArgs),
    /// Is it worth it? Read a sample in seconds and predict the gain (writes nothing)
    ///
    /// Reads a sample of the target (on a device with mounted ext4/xfs,
    /// of the ranges in use) spread over it, each place three times, in seconds rather
    /// than a full pass, and predicts how much faster a sequential read would be if no
    /// place read slower than the drive at its best (a file: also measured on the device
    /// around it). Says "worth it xN", "looks flat" or "cannot tell: why" (a busy host, a
    /// cache). Writes nothing. For a directory: its files by age band (as scan
    /// --by-file), sampled, and how much of it is cold and slow, with a full read
    /// predicted now and refreshed.
    Estimate(EstimateArgs),
    /// Re-render a report saved with --json
    Report(ReportArgs),
    /// Run a rewrite job from a TOML file (as cron or reseq@NAME.service do)
    ///
    /// The reseq@NAME.service unit runs /etc/reseq/NAME.toml; its keys are `reseq rewrite`
    /// options.
    Run {
        /// The job's TOML file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Print the plan only.
        #[arg(long, short = 'n')]
        dry_run: bool,
    },
    /// Thaw the filesystems a killed reseq left frozen
    ///
    /// Nothing else: only those
    /// in a freeze record (under /run/reseq, or RESEQ_RUN_DIR) whose guardian is gone.
    /// Refuses, naming the PID, while that guardian still runs. The reseq@.service unit
    /// runs it after every stop.
    Thaw {
        /// Print what was done as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List unfinished runs and rescue copies (reads only)
    ///
    /// Unfinished runs (device and file mode) with the options `--resume` would continue
    /// them with, and rescue copies waiting for `reseq restore`.
    Status {
        /// Where journals are kept.
        #[arg(long, default_value = DEFAULT_STATE_DIR, value_name = "DIR", env = "RESEQ_STATE_DIR")]
        state_dir: PathBuf,
        /// Print it as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put back a rescue copy that a failed write left
    ///
    /// A rescue copy holds the original bytes of a chunk whose write failed, tore or
    /// read back different, which a run saved in the state directory. The write is
    /// frozen like any write (when filesystems on the device are mounted), read back and
    /// checked; the copy is removed only after that. Refuses when the device is not the
    /// one the copy came from, or when something else wrote there since reseq stopped.
    Restore(RestoreArgs),
    /// Write the man page and shell completions (for packagers)
    ///
    /// Generated from these definitions: `reseq generate DIR`.
    Generate {
        /// Directory to write reseq.1, reseq.bash, _reseq and reseq.fish into.
        dir: PathBuf,
    },
    /// A simulated SSD kept in a state file, one step at a time
    Sim {
        #[command(subcommand)]
        command: SimCommand,
    },
}

#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    /// The rescue file (rescue-DEVICE-OFFSET-BLAKE3-ID.bin)
    ///
    /// rescue-DEVICE-OFFSET-BLAKE3-ID.bin in the state directory.
    #[arg(value_name = "RESCUE_FILE")]
    pub(crate) rescue: PathBuf,
    /// Restore even if the bytes there changed since reseq stopped
    ///
    /// Something else wrote there: restoring overwrites that.
    #[arg(long)]
    pub(crate) force: bool,
    /// Remove the rescue copy without writing anything
    ///
    /// The data was restored another way, or is not wanted.
    #[arg(long, conflicts_with = "force")]
    pub(crate) forget: bool,
    /// The device, if its name changed since the copy was made
    ///
    /// Loop and NVMe numbers can change between boots. It must be the same device: same
    /// size, and the same backing file, serial or WWN.
    #[arg(long, value_name = "DEVICE")]
    pub(crate) device: Option<PathBuf>,
    /// Longest freeze for the write
    #[arg(long, default_value = "2s", value_name = "DURATION", value_parser = window_length)]
    pub(crate) max_freeze: Duration,
    /// Freeze even where the guardian cannot leave reseq's cgroup
    ///
    /// Inside a container's cgroup namespace, on a cgroup v1 host, a read-only cgroupfs: a kill or
    /// freeze of reseq's whole unit then also hits the guardian, and a freeze in progress
    /// stays until `reseq thaw` runs (the shipped unit's ExecStopPost= runs it).
    #[arg(long)]
    pub(crate) accept_cgroup_risk: bool,
    /// Print what was done as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    /// Drive model (--help lists them)
    ///
    /// consumer-nvme (Toshiba XG5-like), consumer-nvme-mild (Samsung
    /// PM981-like), datacenter-sata (Intel S3510-like) or consumer-tlc-aging (Samsung
    /// 840 EVO-like: old data reads slowly, see `reseq sim age`).
    #[arg(long, default_value = "consumer-nvme")]
    pub(crate) preset: String,
    /// Simulated device size.
    #[arg(long, default_value = "8G", value_name = "SIZE")]
    pub(crate) device_size: Size,
    /// Size of the file at the start of the device [default: half of it]
    #[arg(long, value_name = "SIZE")]
    pub(crate) file_size: Option<Size>,
    /// Random 4 KiB write stages in MiB
    ///
    /// As for a 4 GiB file, scaled to --file-size.
    #[arg(long, value_delimiter = ',', default_value = "50,200,800,4000", value_name = "MIB,...")]
    pub(crate) stages: Vec<f64>,
    /// Chunk size of reseq's rewrite.
    #[arg(long, default_value_t = DEFAULT_CHUNK_SIZE, value_name = "SIZE")]
    pub(crate) chunk_size: Size,
    /// Seed of the random writes.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Override a model parameter (repeatable)
    ///
    /// E.g. --set t_read_us=50 --set readahead=none.
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) set: Vec<String>,
    /// Print the results as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A range of a simulated device.
#[derive(Debug, Args, Clone)]
pub(crate) struct SimRangeArgs {
    /// Start of the range.
    #[arg(long, default_value = "0", value_name = "SIZE")]
    pub(crate) offset: Size,
    /// Length of the range (default: to the end of the device).
    #[arg(long, value_name = "SIZE")]
    pub(crate) length: Option<Size>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SimCommand {
    /// Create a fresh (empty, all trimmed) simulated SSD.
    Create {
        /// The state file to make (the model's state)
        state: PathBuf,
        /// Drive model: consumer-nvme, consumer-nvme-mild, datacenter-sata, consumer-tlc-aging
        #[arg(long, default_value = "consumer-nvme")]
        preset: String,
        /// Simulated device size.
        #[arg(long, default_value = "8G", value_name = "SIZE")]
        device_size: Size,
        /// Override a model parameter (repeatable).
        #[arg(long, value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Write a range sequentially, as writing a file does.
    Write {
        /// The simulated SSD: a state file made by `reseq sim create`
        state: PathBuf,
        #[command(flatten)]
        range: SimRangeArgs,
    },
    /// Random 4 KiB writes into a range
    ///
    /// As `fio --rw=randwrite --bs=4k` makes them.
    Fragment {
        /// The simulated SSD: a state file made by `reseq sim create`
        state: PathBuf,
        #[command(flatten)]
        range: SimRangeArgs,
        /// How much to write in random 4 KiB blocks.
        #[arg(long, value_name = "SIZE")]
        random_writes: Size,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Sequential read of a range: virtual time and throughput.
    Read {
        /// The simulated SSD: a state file made by `reseq sim create`
        state: PathBuf,
        #[command(flatten)]
        range: SimRangeArgs,
        #[arg(long, default_value = "1M", value_name = "SIZE")]
        block_size: Size,
        #[arg(long, default_value_t = 1)]
        queue_depth: usize,
    },
    /// Re-sequence a range with reseq's engine.
    Rewrite {
        /// The simulated SSD: a state file made by `reseq sim create`
        state: PathBuf,
        #[command(flatten)]
        range: SimRangeArgs,
        #[arg(long, default_value_t = DEFAULT_CHUNK_SIZE, value_name = "SIZE")]
        chunk_size: Size,
        #[arg(long)]
        no_verify: bool,
        /// Rewrite only the regions a scan finds slow
        #[arg(long)]
        only_slow: bool,
        #[arg(long, default_value_t = 64, value_name = "N")]
        scan_regions: usize,
        #[arg(long, default_value_t = 0.7, value_name = "FRACTION")]
        slow_threshold: f64,
    },
    /// Parameters, counters and age of a simulated SSD
    Info {
        /// The simulated SSD: a state file made by `reseq sim create`
        state: PathBuf,
    },
    /// Let the drive's data age by N days
    ///
    /// Advance its retention clock by N days (fractions too).
    /// Reads of pages not rewritten since get slower on a drive with retention on
    /// (consumer-tlc-aging, or --set retention_max_factor=...). Reaches a drive being
    /// served by `reseq sim serve` through the server.
    Age {
        /// The simulated SSD: a state file made by `reseq sim create`
        state: PathBuf,
        /// Days to add to the clock, e.g. 90 or 0.5.
        #[arg(long, value_name = "N", value_parser = age_days)]
        days: f64,
    },
    /// Serve the simulated SSD as the file MOUNTDIR/disk through FUSE
    ///
    /// Put a loop device on it. In the foreground until SIGINT/SIGTERM or `umount MOUNTDIR`; saves the
    /// drive's state on exit. The data lives in STATE.data (sparse, created if missing).
    Serve {
        /// The simulated SSD: a state file made by `reseq sim create`
        state: PathBuf,
        /// An empty directory to mount on.
        mount_dir: PathBuf,
        /// Wall-clock µs per µs of model time
        ///
        /// Every request is answered when its
        /// modelled completion, times this, has come.
        #[arg(long, default_value_t = crate::sim::serve::DEFAULT_TIME_SCALE, value_name = "X")]
        time_scale: f64,
    },
}

#[derive(Debug, Args, Clone)]
pub(crate) struct RewriteArgs {
    /// A block device, or files and directories on mounted ext4/xfs/btrfs, or sim:STATE
    ///
    /// E.g. /dev/nvme0n1p3, /dev/sdb; several files and directories are one file-mode run.
    #[arg(required = true, num_args = 1.., value_name = "TARGET")]
    pub(crate) targets: Vec<PathBuf>,
    /// Which options with a default were given (on the command line or in a job file),
    /// filled by [`Cli::try_parse_given`].
    #[arg(skip)]
    pub(crate) given: crate::options::rewrite::Given,
    /// Print the plan and the time frozen to expect; write nothing
    ///
    /// Exits without writing or freezing anything: the bytes the run reads and writes, its
    /// windows, time frozen and duration to expect, from a probe (1 s at most) that reads
    /// some of the run's own chunks as the run will. -v prints the whole plan: what is
    /// checked, and what the prediction rests on.
    #[arg(long, short = 'n')]
    pub(crate) dry_run: bool,
    /// Continue an interrupted run from its journal
    ///
    /// Starts afresh if there is none.
    #[arg(long, conflicts_with = "restart")]
    pub(crate) resume: bool,
    /// Discard an unfinished run's journal and start again
    ///
    /// From the beginning.
    #[arg(long)]
    pub(crate) restart: bool,
    /// Where journals are kept
    #[arg(long, default_value = DEFAULT_STATE_DIR, value_name = "DIR", env = "RESEQ_STATE_DIR")]
    pub(crate) state_dir: PathBuf,
    /// File mode: skip paths matching this glob (repeatable)
    ///
    /// E.g. --exclude '*.tmp'.
    #[arg(long, value_name = "GLOB", help_heading = "What to rewrite")]
    pub(crate) exclude: Vec<String>,
    /// Rewrite free space too (default: only the space in use)
    ///
    /// By default, free space of mounted ext4/xfs filesystems is left out (GETFSMAP), which saves endurance and keeps what TRIM achieved.
    #[arg(long, help_heading = "What to rewrite")]
    pub(crate) include_free: bool,
    /// Rewrite only what reads slowly (scanned first)
    ///
    /// Scans the device first (reads only,
    /// with the --bench-* block size and queue depth) and rewrite the flagged regions. In
    /// file mode: read each file (as `scan --by-file`) and rewrite the files flagged slow
    /// against the youngest files.
    #[arg(long, help_heading = "What to rewrite")]
    pub(crate) only_slow: bool,
    /// File mode: only files whose data is older than this (e.g. 90d)
    ///
    /// Age is the newest of mtime and ctime; e.g. 90d, 6months. With --only-slow, only files both old and slow.
    /// A file-mode rewrite keeps mtime and ctime: the run records what it refreshed in the
    /// state directory, and later runs with the same --state-dir count age from then.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help_heading = "What to rewrite")]
    pub(crate) older_than: Option<Duration>,
    /// Like --only-slow, from a saved `reseq scan --json`
    ///
    /// The slow regions of a scan saved earlier with `reseq scan --json`.
    #[arg(long, value_name = "SCAN.json", conflicts_with = "only_slow", help_heading = "What to rewrite")]
    pub(crate) from_scan: Option<PathBuf>,
    /// Regions of the scan for --only-slow
    #[arg(long, default_value_t = DEFAULT_SCAN_REGIONS, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000), allow_negative_numbers = true, help_heading = "What to rewrite")]
    pub(crate) scan_regions: usize,
    /// Slow: below this share of the fastest quarter
    ///
    /// A region is slow below this fraction of the median of the fastest quarter.
    #[arg(long, default_value_t = DEFAULT_SLOW_THRESHOLD, value_name = "FRACTION", value_parser = fraction, allow_negative_numbers = true, help_heading = "What to rewrite")]
    pub(crate) slow_threshold: f64,
    /// Longest freeze of one window [default: 5s device, 1s files]
    ///
    /// The deadline of one freeze window (e.g. 2s, 500ms): no new write starts after it, and
    /// the guardian thaws once the writes under way are done; one still outstanding a
    /// grace later (as long as the deadline, 0.25-1 s) gets reseq killed and the
    /// filesystems thawed, so no freeze lasts beyond deadline plus grace (2 s for 1s).
    /// [default: 5s for a device, 1s for files]
    #[arg(long, value_name = "DURATION", value_parser = window_length, help_heading = "Freeze windows")]
    pub(crate) max_freeze: Option<Duration>,
    /// Stop after this many windows overrun their deadline
    ///
    /// Each overrun is thawed by the guardian; until this limit the run continues with
    /// shorter windows.
    #[arg(long, default_value_t = DEFAULT_MAX_OVERRUNS, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1_000_000), allow_negative_numbers = true, help_heading = "Freeze windows")]
    pub(crate) max_overruns: u32,
    /// Average write rate limit, e.g. 50M (per second)
    ///
    /// For the whole run, in bytes per second (50M = 50 MiB/s), kept by pausing between windows. A rate at which the bytes alone take more
    /// than a year is refused (exit 3) unless --force.
    #[arg(long, value_name = "SIZE", help_heading = "Pace")]
    pub(crate) rate: Option<Rate>,
    /// Pause between windows, thawed [default: 0s device, 1s files]
    ///
    /// So applications catch up. File mode, for a live
    /// server, pauses 1s unless given (writers then run at least half the time).
    #[arg(long, default_value = "0s", hide_default_value = true, value_name = "DURATION", value_parser = pause_length, help_heading = "Pace")]
    pub(crate) pause: Duration,
    /// Bytes per chunk [default: auto: tried, else 4M]
    ///
    /// K, M, G suffixes; a multiple of the device's direct-I/O alignment. Not given: a long run that freezes nothing tries 4M and larger chunks
    /// on its first stretches and keeps the faster (docs/CHUNK-SIZE.md); else 4M.
    /// [default: auto: tried, else 4M]
    #[arg(long, default_value_t = DEFAULT_CHUNK_SIZE, hide_default_value = true, value_name = "SIZE", value_parser = chunk_size, help_heading = "Pace")]
    pub(crate) chunk_size: Size,
    /// Chunks read ahead of the writer [default: auto: probed, else 2]
    ///
    /// The pipeline's depth: chunks read ahead of the writer, N/2 of them read at once
    /// and N/2 written ones queued for their read-back; 0: serial. Not given: chosen by a
    /// short probe of the device (memory: (N + 4) x chunk size with verification).
    /// [default: auto: probed, else 2]
    #[arg(long, default_value_t = DEFAULT_READ_AHEAD, hide_default_value = true, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=64), allow_negative_numbers = true, help_heading = "Pace")]
    pub(crate) read_ahead: usize,
    /// Do not run FITRIM on the filesystems after the run
    #[arg(long, help_heading = "Pace")]
    pub(crate) no_trim: bool,
    /// Pace of the FITRIM after the run, e.g. 2G (per second)
    ///
    /// In bytes discarded per second. By default reseq trims in slices and idles 4 x each slice's time between them (the
    /// device busy at most 20 % of the time); --pause also spaces the slices.
    #[arg(long, value_name = "SIZE", conflicts_with = "no_trim", help_heading = "Pace")]
    pub(crate) trim_rate: Option<Rate>,
    /// Benchmark reads before and after, and give a verdict
    ///
    /// Sequential reads of the range, before and after the rewrite.
    #[arg(long, help_heading = "Benchmark")]
    pub(crate) bench: bool,
    #[command(flatten)]
    pub(crate) bench_opts: BenchOpts,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
    /// Skip the read-back check after each write
    ///
    /// Faster; the pre-write hash is still journaled.
    #[arg(long, help_heading = "Overrides")]
    pub(crate) no_verify: bool,
    /// Go on despite rotational disks, long windows, slow --rate or unseen PIDs
    ///
    /// A window longer than half the hung-task timeout, a --rate that keeps the run from
    /// finishing within a year, or processes whose open files reseq may not read for lack
    /// of CAP_SYS_PTRACE (a writer among them would not be refused).
    #[arg(long, help_heading = "Overrides")]
    pub(crate) force: bool,
    /// Freeze even where the guardian cannot leave reseq's cgroup
    ///
    /// Inside a container's cgroup namespace, on a cgroup v1 host, a read-only cgroupfs: a kill or
    /// freeze of reseq's whole unit then also hits the guardian, and a freeze in progress
    /// stays until `reseq thaw` runs (the shipped unit's ExecStopPost= runs it).
    #[arg(long, help_heading = "Overrides")]
    pub(crate) accept_cgroup_risk: bool,
}

/// How reports are printed and where metrics go.
#[derive(Debug, Args, Clone, Default)]
#[command(next_help_heading = "Output")]
pub(crate) struct OutputArgs {
    /// Print the report as JSON on stdout (--format json)
    #[arg(long)]
    pub(crate) json: bool,
    /// Report format
    #[arg(long, value_name = "FORMAT", value_parser = PossibleValuesParser::new(Format::NAMES).map(|f| f.parse::<Format>().expect("a listed format")))]
    pub(crate) format: Option<Format>,
    /// Also write Prometheus textfile metrics here
    ///
    /// Atomically, e.g. in node_exporter's textfile collector directory
    /// (/var/lib/node_exporter/textfile_collector/reseq.prom).
    #[arg(long, value_name = "PATH.prom")]
    pub(crate) metrics_file: Option<PathBuf>,
}

impl OutputArgs {
    /// A metrics file goes in a directory that must be there: a host without
    /// node_exporter's textfile collector would otherwise lose every run's metrics, each
    /// with only a line on stderr. Checked before the command runs.
    pub(crate) fn check_metrics_file(&self) -> crate::support::error::Result<()> {
        let Some(path) = &self.metrics_file else { return Ok(()) };
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        let why = match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => return Ok(()),
            Ok(_) => "is not a directory".to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist (on a host without node_exporter's textfile collector, create it, or leave metrics_file out of the job)".to_string(),
            // Not "does not exist": a directory a non-root user may not look into is there.
            Err(e) => format!("cannot be looked into ({e}; reseq runs as root)"),
        };
        Err(crate::support::error::Error::Usage(format!(
            "--metrics-file {}: the directory {} {why}",
            path.display(),
            dir.display()
        )))
    }

    pub(crate) fn format(&self) -> Format {
        if self.json { Format::Json } else { self.format.unwrap_or(Format::Text) }
    }
}

/// Read benchmark parameters (for `bench`, and `rewrite --bench` with the `bench-` prefix).
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Benchmark")]
pub(crate) struct BenchOpts {
    /// Bytes per read command
    #[arg(long = "bench-block-size", default_value = "1M", value_name = "SIZE")]
    pub(crate) block_size: Size,
    /// Reads in flight at once
    #[arg(long = "bench-queue-depth", default_value_t = 1, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256), allow_negative_numbers = true)]
    pub(crate) queue_depth: usize,
    /// Timed passes over the range, before and after each
    #[arg(long = "bench-passes", default_value_t = 3, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000), allow_negative_numbers = true)]
    pub(crate) passes: usize,
    /// Pause between passes
    ///
    /// In case the drive reorganises itself in the background.
    #[arg(long = "bench-settle", default_value = "0s", value_name = "DURATION", value_parser = pause_length)]
    pub(crate) settle: Duration,
    /// Regions of the before/after throughput map
    #[arg(long = "bench-regions", default_value_t = 32, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000), allow_negative_numbers = true)]
    pub(crate) regions: usize,
    /// Benchmark only this much of the range [default: all]
    ///
    /// From the start of the range.
    #[arg(long = "bench-length", value_name = "SIZE")]
    pub(crate) length: Option<Size>,
    /// Read again this long later if the speed changed
    ///
    /// When the reads after the rewrite differ from those before: the verdict stands only if the change lasts (re-sequencing lasts; a cache
    /// below the device, as under a VM, fades). 0s: no re-check.
    #[arg(long = "bench-recheck", default_value = "30s", value_name = "DURATION", value_parser = pause_length)]
    pub(crate) recheck: Duration,
}

/// What to read and how, for `bench` and `scan`.
#[derive(Debug, Args)]
pub(crate) struct ReadArgs {
    /// A block device, a file, a directory of files, or sim:STATE (a simulated SSD).
    pub(crate) target: PathBuf,
    /// Bytes per read command.
    #[arg(long, default_value = "1M", value_name = "SIZE")]
    pub(crate) block_size: Size,
    /// Reads in flight at once
    ///
    /// That many threads issuing O_DIRECT reads.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=256), allow_negative_numbers = true)]
    pub(crate) queue_depth: usize,
    /// Start of the range.
    #[arg(long, default_value = "0", value_name = "SIZE")]
    pub(crate) offset: Size,
    /// Length of the range (default: to the end).
    #[arg(long, value_name = "SIZE")]
    pub(crate) length: Option<Size>,
    /// Measure free space too (default: the ranges in use)
    ///
    /// A device with mounted ext4/xfs: by default only the ranges in use are read (offsets and lengths then count in-use bytes): free space,
    /// trimmed or not, says nothing about the data.
    #[arg(long)]
    pub(crate) include_free: bool,
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) read: ReadArgs,
    /// Measure what TRIM costs readers on TARGET's filesystem
    ///
    /// TARGET is a file or directory on mounted ext4/xfs: write a scratch file there, delete it and FITRIM
    /// its range in slices while a light probe reads; report the trim rate and the read
    /// latency during the trim against before it. The scratch file is always removed.
    /// Refused (exit 3) where the device has no discard.
    #[arg(long)]
    pub(crate) trim_impact: bool,
    /// --trim-impact: bytes of the scratch file
    ///
    /// What is deleted and trimmed.
    #[arg(long, default_value = "1G", value_name = "SIZE", requires = "trim_impact", value_parser = trim_size)]
    pub(crate) trim_size: Size,
    /// --trim-impact: pace of the trim, per second [default: unpaced]
    ///
    /// Bytes discarded per second (default: unpaced slices, the drive's worst case).
    #[arg(long, value_name = "SIZE", requires = "trim_impact")]
    pub(crate) trim_rate: Option<Rate>,
    /// Timed passes.
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000), allow_negative_numbers = true)]
    pub(crate) passes: usize,
    /// Pause between passes
    ///
    /// 10 s lets a drive that reorganises itself in the background do so.
    #[arg(long, default_value = "0s", value_name = "DURATION", value_parser = pause_length)]
    pub(crate) settle: Duration,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ScanArgs {
    #[command(flatten)]
    pub(crate) read: ReadArgs,
    /// How many regions to time.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000), allow_negative_numbers = true)]
    pub(crate) regions: usize,
    /// Slow: below this share of the fastest quarter
    ///
    /// A region is flagged slow when at every reading below this fraction of the median of
    /// the fastest quarter of the regions, each at its slowest reading (with --by-file: a file, below this fraction of the youngest files,
    /// or of the fastest quarter when fewer than 3 reads are younger than a week).
    #[arg(long, default_value_t = 0.7, value_name = "FRACTION", value_parser = fraction, allow_negative_numbers = true)]
    pub(crate) threshold: f64,
    /// Time each file and relate its speed to its age
    ///
    /// Files and directories of files: read each file once (O_DIRECT) and relate its
    /// throughput to its age (the newest of mtime and ctime), by age band (< 1 week,
    /// < 1 month, < 6 months, older). Files under 4 read blocks are timed together with
    /// the other small files of their band. Flags the files that read slowly: the cold
    /// data `rewrite --only-slow` refreshes.
    #[arg(long, conflicts_with_all = ["offset", "length", "include_free", "regions"])]
    pub(crate) by_file: bool,
    /// --by-file: list oldest or slowest first
    #[arg(long, value_enum, default_value = "age", value_name = "ORDER", requires = "by_file")]
    pub(crate) sort: FileOrder,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

/// `scan --by-file --sort`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum FileOrder {
    /// Oldest first.
    Age,
    /// Slowest first.
    Throughput,
}

#[derive(Debug, Args)]
pub(crate) struct EstimateArgs {
    /// A block device, a file, a directory of files, or sim:STATE.
    pub(crate) target: PathBuf,
    /// Bytes to read in all, spread over the target.
    #[arg(long, default_value = "256M", value_name = "SIZE", value_parser = sample_size)]
    pub(crate) sample: Size,
    /// Places to read from.
    #[arg(long, default_value_t = 32, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(4..=4096), allow_negative_numbers = true)]
    pub(crate) regions: usize,
    #[command(flatten)]
    pub(crate) output: OutputArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// A report saved with --json.
    pub(crate) report: PathBuf,
    #[arg(long, default_value = "text", value_parser = PossibleValuesParser::new(Format::NAMES).map(|f| f.parse::<Format>().expect("a listed format")))]
    pub(crate) format: Format,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Size of the throwaway image.
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub(crate) size: Size,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// A plain loop device (no FTL) instead of an emulated SSD
    ///
    /// The plain demo: a loop device over an image file, which has no FTL (nothing to
    /// speed up), instead of an emulated SSD served through FUSE.
    #[arg(long)]
    pub(crate) no_fuse: bool,
}

impl RewriteArgs {
    /// The device of device mode (the first target).
    pub(crate) fn device(&self) -> &std::path::Path {
        &self.targets[0]
    }
}
