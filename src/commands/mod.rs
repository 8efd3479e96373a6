//! One module per subcommand that is not a rewrite: each turns typed options into work
//! done by the layers below and a report.

pub(crate) mod demo;
pub(crate) mod measure;
pub(crate) mod restore;
pub(crate) mod simulate;
pub(crate) mod status;
