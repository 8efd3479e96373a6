//! `reseq restore`: which rescue copy, onto which device, and how.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RestoreOptions {
    /// The rescue file (rescue-DEVICE-OFFSET-BLAKE3-ID.bin in the state directory).
    pub(crate) rescue: PathBuf,
    /// Write even over bytes something else changed since reseq stopped.
    pub(crate) force: bool,
    /// Remove the copy without writing anything.
    pub(crate) forget: bool,
    /// The device where it is now, if its name changed.
    pub(crate) device: Option<PathBuf>,
    /// Longest freeze of a filesystem on the device for the write (at least 10 ms).
    pub(crate) max_freeze: Duration,
    /// Freeze even where the guardian cannot leave reseq's cgroup.
    pub(crate) accept_cgroup_risk: bool,
}
