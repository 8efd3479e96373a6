//! Whether this process may do what reseq does: open block devices for writing and
//! freeze filesystems (FIFREEZE needs CAP_SYS_ADMIN, which root can lack in a container
//! or a restricted unit).

use crate::support::error::{Error, Result};
use crate::sys::process::CAP_SYS_ADMIN;

pub(crate) fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok()
}

/// Checks privileges: FIFREEZE needs CAP_SYS_ADMIN, raw device writes need root's access.
pub(crate) fn check() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(Error::refused(
            "reseq must run as root: it opens block devices for writing and freezes filesystems",
            "run it with sudo, or from a root cron job or systemd unit",
        ));
    }
    if effective_caps().is_some_and(|c| c & (1 << CAP_SYS_ADMIN) == 0) {
        return Err(Error::refused(
            "reseq runs as root but without CAP_SYS_ADMIN, which FIFREEZE/FITHAW need",
            "run it outside the restricted container or unit, or grant CAP_SYS_ADMIN",
        ));
    }
    Ok(())
}
