//! From parsed arguments to typed options, for the commands that are not a rewrite of a
//! device or files: every bound and cross-flag rule of those commands is here, so the
//! layers below take values that are already checked.

use crate::cli::BenchOpts;
use crate::options::bench::BenchOptions;
use crate::support::error::{Error, Result};
use crate::support::units::{parse_duration, parse_size};

fn size(flag: &str, v: &str) -> Result<u64> {
    parse_size(v).map_err(|e| Error::Usage(format!("{flag}: {e}")))
}

/// The `--bench-*` options of a rewrite.
pub fn bench_options(o: &BenchOpts) -> Result<BenchOptions> {
    Ok(BenchOptions {
        block_size: size("--bench-block-size", &o.block_size)?,
        queue_depth: o.queue_depth,
        passes: o.passes.max(1),
        settle: parse_duration(&o.settle).map_err(|e| Error::Usage(format!("--bench-settle: {e}")))?,
        regions: o.regions.max(1),
        length: o.length.as_deref().map(|l| size("--bench-length", l)).transpose()?,
    })
}
