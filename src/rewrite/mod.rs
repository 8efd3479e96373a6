//! `reseq rewrite`: device mode ([`device`]) or file mode ([`files`]), each a plan and a
//! run through the same steps ([`sequence`]).

pub(crate) mod before;
pub(crate) mod checks;
mod describe;
pub(crate) mod device;
pub(crate) mod files;
pub(crate) mod predict;
pub(crate) mod sequence;

pub(crate) use describe::{describe_guardian, dry_run_end, frozen_share};

use crate::host::in_use::Environment;
use crate::options::rewrite::{Mode, RewriteOptions};
use crate::report::Report;
use crate::support::error::{Error, Result};
use crate::support::signals::StopFlag;

/// Runs `reseq rewrite` on a device, or on files (file mode). Always returns a report,
/// also when the run failed. (A simulated SSD is the `sim` command's.)
pub(crate) fn run(o: &RewriteOptions, quiet: bool) -> (Report, Result<()>) {
    // Before the first step: a signal while planning or benchmarking stops the run with
    // its report (exit 6), not without a word.
    if !o.dry_run
        && let Err(e) = StopFlag::install()
    {
        return Report::of_run("rewrite", o.dry_run, &o.targets, |_| Err(Error::io("installing signal handlers", e)));
    }
    Report::of_run("rewrite", o.dry_run, &o.targets, |report| match o.mode {
        Mode::Files => files::plan_and_execute(o, quiet, report),
        Mode::Device => {
            let env = Environment::live()?;
            let resumed = device::plan::resumed_options(o, &env)?;
            device::plan_and_execute(resumed.as_ref().unwrap_or(o), &env, quiet, report)
        }
    })
}
