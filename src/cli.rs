//! The command line, and nothing else: clap definitions, parsed into raw values.
//! Checking them and turning them into a plan happens in `plan.rs`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Default chunk size, chosen by measurement (docs/CHUNK-SIZE.md, `bench/chunk-size.sh`):
/// 2-4 MiB was at or near the best on both a disk-backed and a memory-backed loop device,
/// it is well above the 1 MiB the FTL model needs to re-linearize, and it keeps memory
/// (6 buffers) and the granularity of freeze windows small.
pub const DEFAULT_CHUNK_SIZE: &str = "4M";
/// Default bound of one freeze window.
pub const DEFAULT_MAX_FREEZE: &str = "5s";
pub const DEFAULT_STATE_DIR: &str = "/var/lib/reseq";

#[derive(Debug, Parser)]
#[command(
    name = "reseq",
    version,
    about = "Re-sequence SSD data in place so sequential reads are fast again, without losing a byte",
    long_about = "reseq rewrites a device's blocks to the same addresses, in ascending order and large \
chunks, so that the SSD's flash translation layer lays them out in order again. Mounted filesystems \
are frozen (FIFREEZE) in bounded windows, a guardian process thaws them whatever happens to reseq, \
every chunk is verified with blake3 after a read-back, and a journal lets an interrupted run resume."
)]
pub struct Cli {
    /// More log output (-v debug, -vv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Only warnings and errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Re-sequence a block device (a partition or a whole disk) in place.
    Rewrite(RewriteArgs),
    /// Make a throwaway ext4 image on a loop device, fragment a file on it, re-sequence it
    /// while mounted, print the report and clean up. Needs root; touches no real disk.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub struct RewriteArgs {
    /// The block device, e.g. /dev/nvme0n1p3 or /dev/sdb.
    pub device: PathBuf,
    /// Bytes per chunk (K, M, G suffixes; a multiple of the device's direct-I/O alignment).
    #[arg(long, default_value = DEFAULT_CHUNK_SIZE, value_name = "SIZE")]
    pub chunk_size: String,
    /// Longest time filesystems stay frozen in one window (e.g. 2s, 500ms). The guardian
    /// thaws at this deadline.
    #[arg(long, default_value = DEFAULT_MAX_FREEZE, value_name = "DURATION")]
    pub max_freeze: String,
    /// Pause between windows, thawed, so applications catch up.
    #[arg(long, default_value = "0s", value_name = "DURATION")]
    pub pause: String,
    /// Stop after this many freeze windows overrun their deadline (each overrun is thawed
    /// by the guardian; until this limit the run continues with shorter windows).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub max_overruns: u32,
    /// Chunks read ahead of the writer (memory: (N + 4) x chunk size with verification).
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub read_ahead: usize,
    /// Skip the read-back check after each write (faster; the pre-write hash is still journaled).
    #[arg(long)]
    pub no_verify: bool,
    /// Go on despite a rotational device or a window longer than half the hung-task timeout.
    #[arg(long)]
    pub force: bool,
    /// Print the plan and exit without writing or freezing anything.
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Continue an interrupted run from its journal (starts afresh if there is none).
    #[arg(long, conflicts_with = "restart")]
    pub resume: bool,
    /// Discard an unfinished run's journal and start from the beginning.
    #[arg(long)]
    pub restart: bool,
    /// Where journals are kept.
    #[arg(long, default_value = DEFAULT_STATE_DIR, value_name = "DIR", env = "RESEQ_STATE_DIR")]
    pub state_dir: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Size of the throwaway image.
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub size: String,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}
