//! Reading a device and judging what was read: O_DIRECT read passes and the cache check
//! (`bench`), the regions of a scan (`scan`), the verdict (`verdict`), the before/after
//! measurements and write cost of a rewrite
//! (`passes`), the cost of a trim (`trim_impact`), and the dry run's probe of the chunks
//! a rewrite will read (`plan_probe`), and of how many reads in flight its device wants
//! (`depth_probe`).

pub(crate) mod bench;
pub(crate) mod byfile;
pub(crate) mod cold_estimate;
pub(crate) mod depth_probe;
pub(crate) mod estimate;
pub(crate) mod noise;
pub(crate) mod passes;
pub(crate) mod plan_probe;
pub(crate) mod probe;
pub(crate) mod readbench;
pub(crate) mod scan;
pub(crate) mod trim_impact;
pub(crate) mod verdict;
