//! reseq: re-sequence SSD data in place so that sequential reads are fast again.
//!
//! An SSD's FTL places data in write-arrival order; years of random writes scatter a
//! logically contiguous file over the flash dies. Rewriting the same bytes to the same
//! addresses, ascending, in large chunks, lets the FTL lay them out in order again.
//! This crate does that without risking the data: filesystems are frozen in bounded
//! windows, a guardian process guarantees the thaw, every chunk is verified, and a
//! journal makes runs resumable. See docs/ARCHITECTURE.md for the data flow.
#![deny(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod config;
pub mod demo;
pub mod device;
pub mod engine;
pub mod error;
pub mod exit_codes;
pub mod filemode;
pub mod freeze;
pub mod freeze_record;
pub mod generate;
pub mod guardian;
pub mod hooks;
pub mod journal;
pub mod measure;
pub mod mounts;
pub mod output;
pub mod plan;
pub mod procs;
pub mod readbench;
pub mod render;
pub mod report;
pub mod rescue;
pub mod restore;
pub mod rewrite;
pub mod run_options;
pub mod scratch;
pub mod signals;
pub mod sim;
pub mod simulate;
pub mod state_dir;
pub mod status;
pub mod sys;
pub mod target;
pub mod thaw;
pub mod trim;
pub mod trim_impact;
pub mod units;
pub mod usedspace;
pub mod writers;

/// An error with its causes, one per line (as anyhow's `{:#}` would, without anyhow).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s += &format!(": {c}");
        cur = c.source();
    }
    s
}
