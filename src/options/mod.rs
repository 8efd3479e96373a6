//! Typed options: what the command line (or a config file) asked for, as values the
//! layers below use without ever seeing a flag string.

pub(crate) mod bench;
pub(crate) mod restore;
pub(crate) mod resume;
pub(crate) mod rewrite;
pub(crate) mod sim;
