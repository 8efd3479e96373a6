//! Reading a device and judging what was read: O_DIRECT read passes, the cache check,
//! the verdict (`bench`), the before/after measurements and write cost of a rewrite
//! (`passes`), and the cost of a trim (`trim_impact`).

pub mod bench;
pub mod passes;
pub mod probe;
pub mod readbench;
pub mod trim_impact;
