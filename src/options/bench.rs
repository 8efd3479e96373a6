//! How to measure sequential reads before and after a rewrite (`rewrite --bench`, and
//! `--bench` on a simulated SSD): typed, with the defaults the command line has.

use std::time::Duration;

/// The `--bench-*` options of a rewrite.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchOptions {
    /// Bytes per read command.
    pub block_size: u64,
    /// Reads in flight at once.
    pub queue_depth: usize,
    /// Timed passes over the range.
    pub passes: usize,
    /// Pause between passes.
    pub settle: Duration,
    /// Regions of the before/after throughput map.
    pub regions: usize,
    /// Measure only this much from the start of the range (None: all of it).
    pub length: Option<u64>,
}

impl Default for BenchOptions {
    fn default() -> BenchOptions {
        BenchOptions {
            block_size: 1 << 20,
            queue_depth: 1,
            passes: 3,
            settle: Duration::ZERO,
            regions: 32,
            length: None,
        }
    }
}
