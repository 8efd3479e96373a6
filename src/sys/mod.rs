//! Every `unsafe` block and every ioctl of the crate lives here, one module per kernel
//! subsystem, as rustix lays them out.
//!
//! Why here: the rest of the crate is `#![deny(unsafe_code)]`, so a reviewer checking
//! memory safety or the exact kernel ABI we rely on reads these files and nothing else.
//! Each call cites the kernel header that defines it. The wrappers return `nix::Result`
//! (an errno) so callers can tell `EBUSY` from `EOPNOTSUPP`: for freezes those errnos are
//! the only signal the kernel gives (docs/SAFETY.md).
#![allow(unsafe_code)]

pub(crate) mod block;
pub(crate) mod btrfs;
pub(crate) mod extents;
pub(crate) mod fanotify;
pub(crate) mod freeze;
pub(crate) mod memory;
pub(crate) mod process;
