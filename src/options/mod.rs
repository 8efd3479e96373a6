//! Typed options: what the command line (or a config file) asked for, as values the
//! layers below use without ever seeing a flag string.

pub mod bench;
pub mod restore;
pub mod resume;
pub mod rewrite;
pub mod sim;
