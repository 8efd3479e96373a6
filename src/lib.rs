//! reseq: re-sequence SSD data in place so that sequential reads are fast again.
//!
//! An SSD's FTL places data in write-arrival order; years of random writes scatter a
//! logically contiguous file over the flash dies. Rewriting the same bytes to the same
//! addresses, ascending, in large chunks, lets the FTL lay them out in order again.
//! This crate does that without risking the data: filesystems are frozen in bounded
//! windows, a guardian process guarantees the thaw, every chunk is verified, and a
//! journal makes runs resumable. See docs/ARCHITECTURE.md for the data flow.
#![deny(unsafe_code)]

pub mod cli;
pub mod commands;
pub mod engine;
pub mod host;
pub mod measure;
pub mod options;
pub mod report;
pub mod rewrite;
pub mod sim;
pub mod support;
pub mod sys;

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
