//! reseq: re-sequence SSD data in place so that sequential reads are fast again.
//!
//! An SSD's FTL places data in write-arrival order; years of random writes scatter a
//! logically contiguous file over the flash dies. Rewriting the same bytes to the same
//! addresses, ascending, in large chunks, lets the FTL lay them out in order again.
//! This crate does that without risking the data: filesystems are frozen in bounded
//! windows, a guardian process guarantees the thaw, every chunk is verified, and a
//! journal makes runs resumable. See docs/ARCHITECTURE.md for the data flow.
#![deny(unsafe_code)]

mod cli;
mod commands;
mod engine;
mod host;
mod measure;
mod options;
mod report;
mod rewrite;
mod sim;
mod support;
mod sys;
#[cfg(test)]
mod tests;

pub use cli::run::main;

/// What the integration tests (`tests/it/`) and the model benchmark
/// (`examples/ftl_experiment.rs`) use of the library, and nothing else: the ioctls they
/// drive a filesystem with, the journal and rescue files they inspect, the loop devices
/// and mounts they make, the report's shape, and the FTL model's reference experiment.
pub mod testing {
    pub use crate::engine::{journal, rescue};
    pub use crate::host::{mounts, procs};
    pub use crate::report::{Report, SCHEMA_VERSION};
    pub use crate::rewrite::files::record;
    pub use crate::sim::experiment::{Strategy, degrade, rewrite};
    pub use crate::sim::ftl::{Ftl, Params, SLOT};
    pub use crate::sim::onefile;
    pub use crate::support::exit_codes::ExitCode;
    pub use crate::support::scratch;
    pub use crate::support::units::human_bytes;
    pub use crate::sys::{
        block::open_direct_read, block::open_direct_rw, extents::FIEMAP_FLAG_SYNC, extents::FS_XFLAG_REALTIME,
        extents::fiemap, extents::fs_xflags, freeze::fifreeze, freeze::fithaw, memory::AlignedBuf,
    };
}
