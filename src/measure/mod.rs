//! Reading a device and judging what was read: O_DIRECT read passes, the cache check,
//! the verdict (`bench`), and the cost of a trim (`trim_impact`).

pub mod bench;
pub mod readbench;
pub mod trim_impact;
