//! The host the rewrite runs on: block devices, mounts, processes and other writers,
//! the freeze and its guardian, free space and TRIM, the state directory.

pub mod aliases;
pub mod cgroup;
pub mod companions;
pub mod device;
pub mod freeze;
pub mod freeze_record;
pub mod guardian;
pub mod hardening;
pub mod in_use;
pub mod mounts;
pub mod privileges;
pub mod procs;
pub mod sentinel;
pub mod state_dir;
pub mod thaw;
pub mod trim;
pub mod usedspace;
pub mod writers;
