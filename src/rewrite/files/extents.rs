//! A file's pieces on the device: FIEMAP's extents turned into what a run rewrites, and
//! how adjacent pieces join (the window planner's and btrfs mirrors' alike).

use crate::sys;

/// One piece of a file: `len` bytes at file offset `logical` live at device offset
/// `physical`. In a window's map, `logical` is a virtual offset. On btrfs, `source` is
/// the btrfs logical address of the piece (the same for all its copies), and FIEMAP's
/// `physical` is such an address until [`super::mirrors`] maps it to a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Extent {
    pub(crate) logical: u64,
    pub(crate) physical: u64,
    pub(crate) len: u64,
    pub(crate) source: Option<u64>,
}

/// Turns FIEMAP extents from `cursor` on into the pieces to rewrite, merging pieces that
/// are adjacent both in the file and on the device. Returns the skip reason instead if an
/// extent cannot be rewritten safely.
pub(crate) fn plan_extents(
    exts: &[sys::extents::FiemapExtent],
    cursor: u64,
    end: u64,
    mut shared_ok: impl FnMut(u64, u64) -> bool,
    unwritten: &mut u64,
    shared_elsewhere: &mut u64,
) -> std::result::Result<Vec<Extent>, String> {
    let mut out: Vec<Extent> = Vec::new();
    for e in exts {
        let bad = e.not_plain();
        if !bad.is_empty() {
            return Err(format!("an extent at file offset {} is flagged {}", e.logical, bad.join("|")));
        }
        let lo = e.logical.max(cursor);
        let hi = (e.logical + e.length).min(end);
        if lo >= hi {
            continue;
        }
        let (len, physical) = (hi - lo, e.physical + (lo - e.logical));
        if e.is_unwritten() {
            *unwritten += len;
            continue;
        }
        if e.is_shared() && !shared_ok(e.physical, e.length) {
            *shared_elsewhere += len;
            continue;
        }
        push_merged(&mut out, Extent { logical: lo, physical, len, source: None });
    }
    Ok(out)
}

/// Appends `e`, joining it to the last piece when it continues that piece both in
/// (virtual) offset and on the device (and on btrfs, in its logical addresses).
pub(super) fn push_merged(out: &mut Vec<Extent>, e: Extent) {
    let continues = |l: &Extent| match (l.source, e.source) {
        (None, None) => true,
        (Some(a), Some(b)) => a + l.len == b,
        _ => false,
    };
    match out.last_mut() {
        Some(l) if l.logical + l.len == e.logical && l.physical + l.len == e.physical && continues(l) => l.len += e.len,
        _ => out.push(e),
    }
}
