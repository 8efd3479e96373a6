//! What every layer uses: the error type and exit codes, units, output while frozen,
//! stop signals, test-only hooks, scratch devices for the demo and tests.

pub(crate) mod atomic;
pub(crate) mod error;
pub(crate) mod exit_codes;
pub(crate) mod hooks;
pub(crate) mod output;
pub mod scratch;
pub(crate) mod signals;
pub(crate) mod tool;
pub(crate) mod units;
pub(crate) mod walk;
