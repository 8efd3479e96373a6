//! One module per subcommand that is not a rewrite: each turns typed options into work
//! done by the layers below and a report.

pub mod demo;
pub mod measure;
pub mod restore;
pub mod simulate;
pub mod status;
