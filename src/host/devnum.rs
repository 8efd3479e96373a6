//! Device numbers as (major, minor): from sysfs's text and from stat.

/// "major:minor", as sysfs writes a device number.
pub(crate) fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// A device number as (major, minor).
pub(crate) fn dev_num(d: u64) -> (u32, u32) {
    (nix::sys::stat::major(d) as u32, nix::sys::stat::minor(d) as u32)
}
