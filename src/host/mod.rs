//! The host the rewrite runs on: block devices, mounts, processes and other writers,
//! the freeze and its guardian, free space and TRIM, the state directory.

pub(crate) mod aliases;
pub(crate) mod backing_watch;
pub(crate) mod btrfs;
pub(crate) mod cgroup;
pub(crate) mod companions;
pub(crate) mod device;
pub(crate) mod devnum;
pub(crate) mod freeze;
pub(crate) mod freeze_order;
pub(crate) mod freeze_record;
pub(crate) mod freezer;
pub(crate) mod guardian;
pub(crate) mod hardening;
pub(crate) mod holes;
pub(crate) mod in_use;
pub mod mounts;
pub(crate) mod privileges;
pub mod procs;
pub(crate) mod sentinel;
pub(crate) mod shape;
pub(crate) mod state_dir;
pub(crate) mod thaw;
pub(crate) mod thin;
pub(crate) mod trim;
pub(crate) mod usedspace;
pub(crate) mod window_checks;
pub(crate) mod writers;
pub(crate) mod writers_check;
pub(crate) mod written;
