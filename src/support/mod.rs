//! What every layer uses: the error type and exit codes, units, output while frozen,
//! stop signals, test-only hooks, scratch devices for the demo and tests.

pub mod error;
pub mod exit_codes;
pub mod hooks;
pub mod output;
pub mod scratch;
pub mod signals;
pub mod units;
pub mod walk;
