//! From parsed arguments to typed options, for the commands that are not a rewrite of a
//! device or files: every bound and cross-flag rule of those commands is here, so the
//! layers below take values that are already checked.

use crate::cli::BenchOpts;
use crate::options::bench::BenchOptions;

/// The `--bench-*` options of a rewrite (their values typed and bounded by clap).
pub fn bench_options(o: &BenchOpts) -> BenchOptions {
    BenchOptions {
        block_size: o.block_size.bytes(),
        queue_depth: o.queue_depth,
        passes: o.passes.max(1),
        settle: o.settle,
        regions: o.regions.max(1),
        length: o.length.map(|l| l.bytes()),
    }
}
