//! Never-written space: the ranges of a device that hold no data below any filesystem,
//! left alone.
//!
//! A loop device over a sparse file reads its holes as zeros, and a write there
//! allocates: rewriting a 4 TiB image's never-written ext4 inode tables (GETFSMAP calls
//! them in use) grew it by 34 GiB for nothing. So where the device's bytes are a file's
//! (a loop device over a regular file, or a partition of one), the backing file's data
//! map (`SEEK_DATA`/`SEEK_HOLE`, through the loop's offset) says which ranges hold data,
//! and only those are rewritten ([`SkipHoles`]). A thin LV's map is its pool's metadata
//! ([`crate::host::thin`]): its unprovisioned blocks are holes, and the blocks the kernel
//! would copy on write (older than its last snapshot) are left out as well.
//!
//! Skipping never loses data: a range left out is not written at all. A map can be
//! stale only in one direction that matters: a hole that became data after it was read
//! is not rewritten in this run (never written with stale bytes either: nothing is
//! read or written there). So the map is read in every window, frozen, with what the
//! window writes; an unmounted device (one long window) maps at most
//! [`UNFROZEN_DATA`] of data at a time, so no map is older than that much writing.
//!
//! Other devices (decided, docs/ARCHITECTURE.md "Never-written space"): an SSD's
//! deallocated blocks may read as zeros, but no sysfs attribute says so
//! (`discard_zeroes_data` is 0 since Linux 4.12), and a chunk of zeros there can be
//! written data as stale as any: every range is rewritten.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use nix::unistd::Whence;

use crate::engine::{Planner, intersect, push_merged};
use crate::host::aliases::loop_of;
use crate::host::device::{BlockDeviceInfo, Sysfs};
use crate::host::devnum::dev_num;
use crate::host::thin::{Thin, ThinMap};
use crate::support::error::{Error, Result};
use crate::support::units::human_bytes;
use crate::sys;

/// An unmounted device's map covers at most this much data ahead of the writer.
pub(crate) const UNFROZEN_DATA: u64 = 1 << 30;
/// A frozen window's map covers at most this much data: mapped inside the freeze, it
/// need not reach far past what one window writes (2 s at 2 GB/s); a window that writes
/// all of its map ends there, and the next one maps on.
pub(crate) const FROZEN_DATA: u64 = 4 << 30;
/// A window's map holds at most this many data extents: what a frozen window spends on
/// it stays a few milliseconds (two lseeks each) whatever the backing file's
/// fragmentation. The plan maps all of them, unfrozen ([`Backing::all_data_ranges`]).
const MAX_EXTENTS: usize = 2_048;

/// What holds a device's bytes, where that says which of them hold data.
pub(crate) struct Backing {
    below: Below,
    /// In words: "the backing file /tmp/x.img of /dev/loop3 (SEEK_DATA/SEEK_HOLE)".
    pub(crate) described: String,
}

enum Below {
    /// A regular file's bytes: device offset `d` is byte `d + shift` of the file (the
    /// loop's offset, plus a partition's start).
    File { file: File, shift: u64 },
    /// A thin volume's: its own provisioned blocks, read again when the pool's
    /// transaction id moves.
    Thin { thin: Thin, map: Mutex<ThinMap> },
}

impl Backing {
    /// What holds the bytes of `dev`: a loop device's backing file (a regular file,
    /// opened read-only and checked to be the file the loop holds, not one put at its
    /// path since), or a thin volume's pool (its map read now). Err: why there is no map
    /// (in words, for the plan).
    pub(crate) fn of(dev: &BlockDeviceInfo, sysfs: &Sysfs) -> std::result::Result<Backing, String> {
        match Thin::of(dev, sysfs) {
            Ok(Some(thin)) => {
                let map = thin.map().map_err(|e| format!("{}: no map", crate::support::error::error_chain(&e)))?;
                let described = thin.described.clone();
                Ok(Backing { below: Below::Thin { thin, map: Mutex::new(map) }, described })
            }
            Err(why) => Err(format!("{why}: no map")),
            Ok(None) => Backing::file_of(dev, sysfs),
        }
    }

    pub(crate) fn is_thin(&self) -> bool {
        matches!(self.below, Below::Thin { .. })
    }

    /// The ranges of a thin volume the kernel would copy on write, left out (none for a
    /// file).
    pub(crate) fn shared(&self) -> Vec<(u64, u64)> {
        match &self.below {
            Below::Thin { map, .. } => map.lock().unwrap_or_else(|p| p.into_inner()).shared.clone(),
            Below::File { .. } => Vec::new(),
        }
    }

    fn file_of(dev: &BlockDeviceInfo, sysfs: &Sysfs) -> std::result::Result<Backing, String> {
        let no_map = |why: String| Err(format!("{why}: no hole map"));
        let Some((name, parent)) = sysfs.name_of(dev.dev_num) else {
            return no_map(format!("{} is not in sysfs", dev.path.display()));
        };
        let disk = parent.clone().unwrap_or_else(|| name.clone());
        let Some(found) = loop_of(sysfs, &disk) else {
            return no_map(format!("{} is not a loop device over a file", dev.path.display()));
        };
        let l = found.map_err(|e| format!("the loop's backing file cannot be identified ({e}): no hole map"))?;
        if l.backing_dev.is_some() {
            return no_map(format!("/dev/{disk} is backed by the block device {}", l.path));
        }
        let start = match parent {
            Some(_) => sysfs.read(&name, "start").and_then(|s| s.parse::<u64>().ok()).map(|s| s * 512),
            None => Some(0),
        };
        let Some(start) = start else { return no_map(format!("the start of {name} on /dev/{disk} is unknown")) };
        let file = File::open(&l.path).map_err(|e| format!("opening the backing file {}: {e}: no hole map", l.path))?;
        let md = file.metadata().map_err(|e| format!("{}: {e}: no hole map", l.path))?;
        if !md.is_file() || (dev_num(md.dev()), md.ino()) != (l.file.dev, l.file.ino) {
            return no_map(format!("{} is not the file /dev/{disk} holds (replaced or deleted)", l.path));
        }
        let described =
            format!("the backing file {} of /dev/{disk} (SEEK_DATA/SEEK_HOLE, mapped again in each window)", l.path);
        Ok(Backing { below: Below::File { file, shift: l.offset + start }, described })
    }

    /// The ranges of `[from, to)` (device offsets) that hold data, widened to whole
    /// `align` blocks, ascending, and where the map stops: `to`, or earlier once
    /// `max_data` bytes of data or [`MAX_EXTENTS`] extents are mapped.
    pub(crate) fn data_ranges(
        &self,
        span: (u64, u64),
        align: u64,
        max_data: Option<u64>,
    ) -> Result<(Vec<(u64, u64)>, u64)> {
        if let Below::Thin { thin, map } = &self.below {
            let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
            let now = thin.transaction()?;
            if now != map.transaction {
                log::info!(
                    "the thin pool's transaction id moved ({} to {now}): a thin device was made or removed; its map is read again",
                    map.transaction
                );
                *map = thin.map()?;
            }
        }
        self.mapped(span, align, max_data)
    }

    /// As [`Backing::data_ranges`], from the map as it stands (a thin volume's, as last
    /// read).
    fn mapped(&self, span: (u64, u64), align: u64, max_data: Option<u64>) -> Result<(Vec<(u64, u64)>, u64)> {
        match &self.below {
            Below::File { file, shift } => self.file_ranges((file, *shift), span, align, max_data),
            Below::Thin { map, .. } => {
                Ok(cut(&map.lock().unwrap_or_else(|p| p.into_inner()).own, span, align, max_data))
            }
        }
    }

    fn file_ranges(
        &self,
        (file, shift): (&File, u64),
        (from, to): (u64, u64),
        align: u64,
        max_data: Option<u64>,
    ) -> Result<(Vec<(u64, u64)>, u64)> {
        let what = || format!("mapping the holes of {}", self.described);
        let seek = |at, whence| sys::extents::seek(file.as_fd(), at, whence).map_err(|e| Error::io(what(), e.into()));
        let (mut pos, end) = (from + shift, to + shift);
        let (mut out, mut data): (Vec<(u64, u64)>, u64) = (Vec::new(), 0);
        while pos < end {
            let Some(d) = seek(pos, Whence::SeekData)? else {
                break;
            };
            if d >= end {
                break;
            }
            let h = seek(d, Whence::SeekHole)?.unwrap_or(end);
            let a = ((d - shift) / align * align).max(from);
            let b = (h.min(end) - shift).div_ceil(align).saturating_mul(align).min(to);
            push_merged(&mut out, (a, b - a));
            data += b - a;
            pos = h.max(d + 1);
            if max_data.is_some_and(|m| data >= m) || out.len() >= MAX_EXTENTS {
                return Ok((out, b.max(from)));
            }
        }
        Ok((out, to))
    }

    /// As [`Backing::data_ranges`], all of `[from, to)`, however many extents: for the
    /// plan, whose figures (bytes to rewrite, the prediction, progress) are of all of it.
    pub(crate) fn all_data_ranges(&self, (from, to): (u64, u64), align: u64) -> Result<Vec<(u64, u64)>> {
        let (mut out, mut at): (Vec<(u64, u64)>, u64) = (Vec::new(), from);
        while at < to {
            let (part, until) = self.mapped((at, to), align, None)?;
            part.into_iter().for_each(|r| push_merged(&mut out, r));
            at = until.max(at + 1);
        }
        Ok(out)
    }
}

/// The parts of `ranges` (ascending, apart) in `[from, to)`, widened to whole `align`
/// blocks, and where they stop: as [`Backing::data_ranges`].
fn cut(ranges: &[(u64, u64)], (from, to): (u64, u64), align: u64, max_data: Option<u64>) -> (Vec<(u64, u64)>, u64) {
    let (mut out, mut data): (Vec<(u64, u64)>, u64) = (Vec::new(), 0);
    let first = ranges.partition_point(|r| r.0 + r.1 <= from);
    for &(o, l) in ranges[first..].iter().take_while(|r| r.0 < to) {
        let a = (o / align * align).max(from);
        let b = (o + l).div_ceil(align).saturating_mul(align).min(to);
        push_merged(&mut out, (a, b - a));
        data += b - a;
        if max_data.is_some_and(|m| data >= m) || out.len() >= MAX_EXTENTS {
            return (out, b.max(from));
        }
    }
    (out, to)
}

/// The parts of `ranges` (ascending) outside `kept` (ascending, each inside one of them).
fn outside(ranges: &[(u64, u64)], kept: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut k = kept.iter().peekable();
    for &(o, l) in ranges {
        let mut at = o;
        while let Some(&&(ko, kl)) = k.peek() {
            if ko >= o + l {
                break;
            }
            if ko > at {
                out.push((at, ko - at));
            }
            at = at.max(ko + kl);
            k.next();
        }
        if at < o + l {
            out.push((at, o + l - at));
        }
    }
    out
}

/// What another planner plans, less the ranges the backing file holds no data in,
/// mapped in every window (while frozen, when the run freezes).
pub(crate) struct SkipHoles<'a> {
    pub(crate) inner: &'a mut dyn Planner,
    pub(crate) backing: &'a Backing,
    pub(crate) align: u64,
    /// Data mapped per window at most (None: to the end; see [`UNFROZEN_DATA`]).
    pub(crate) max_data: Option<u64>,
    /// Left out of the last plan, not yet passed by the cursor.
    left_out: Vec<(u64, u64)>,
    /// Bytes passed over as holes.
    skipped: u64,
    until: u64,
}

impl<'a> SkipHoles<'a> {
    pub(crate) fn new(inner: &'a mut dyn Planner, backing: &'a Backing, align: u64, max_data: Option<u64>) -> Self {
        SkipHoles { inner, backing, align: align.max(1), max_data, left_out: Vec::new(), skipped: 0, until: 0 }
    }

    /// The bytes passed over as holes once the run stands at `cursor` (its last window's
    /// left-out ranges count up to there: the rest was never passed).
    pub(crate) fn skipped(&mut self, cursor: u64) -> u64 {
        let below = |&(o, l): &(u64, u64)| (o + l).min(cursor).saturating_sub(o);
        self.skipped += self.left_out.iter().map(below).sum::<u64>();
        self.left_out.clear();
        self.skipped
    }
}

impl Planner for SkipHoles<'_> {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        self.skipped(cursor);
        let planned = self.inner.ranges(cursor, end)?;
        let (data, until) = self.backing.data_ranges((cursor, end), self.align, self.max_data)?;
        let planned = intersect(&planned, &[(cursor, until.saturating_sub(cursor))]);
        let kept = intersect(&planned, &data);
        self.left_out = outside(&planned, &kept);
        self.until = until;
        if !self.left_out.is_empty() {
            let holes: u64 = self.left_out.iter().map(|r| r.1).sum();
            log::debug!("{} left out as holes of {}", human_bytes(holes), self.backing.described);
        }
        Ok(kept)
    }

    fn planned_until(&self, end: u64) -> u64 {
        self.until.min(self.inner.planned_until(end))
    }
}

/// What a plan says of never-written space (the plan's and the report's `holes`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct HolesPlanned {
    /// Whether a hole map is read (a loop device over a regular file, a thin volume).
    pub(crate) mapped: bool,
    /// Where the map comes from, or why there is none, in words.
    pub(crate) source: String,
    /// Bytes of the run's range (in use, or all of it) that held no data when planned:
    /// left out (the run maps again in each window).
    pub(crate) bytes_in_holes: u64,
    /// The bytes this run rewrites, as planned: in use (or all) and holding data.
    pub(crate) bytes_to_rewrite: u64,
    /// Of `bytes_in_holes`, a thin volume's blocks the kernel would copy on write when
    /// planned (older than its last snapshot, there or since removed): they hold data,
    /// but a write would take a new block of the pool and move them.
    #[serde(default)]
    pub(crate) bytes_shared: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_out_is_outside_what_is_kept() {
        let ranges = [(0, 100), (200, 100)];
        assert_eq!(outside(&ranges, &[(10, 20), (250, 50)]), vec![(0, 10), (30, 70), (200, 50)]);
        assert_eq!(outside(&ranges, &[]), ranges.to_vec());
        assert_eq!(outside(&ranges, &ranges), vec![]);
    }

    /// A sparse file in a temporary directory: its data map, through a shift, widened
    /// to alignment, capped by data.
    #[test]
    fn maps_a_sparse_files_data() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let f = File::create(&path).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(&[1u8; 4096], 1 << 20).unwrap();
        f.write_all_at(&[2u8; 8192], 32 << 20).unwrap();
        f.sync_all().unwrap();
        let file =
            |shift| Backing { below: Below::File { file: File::open(&path).unwrap(), shift }, described: "t".into() };
        let b = file(0);
        let (data, until) = b.data_ranges((0, 64 << 20), 4096, None).unwrap();
        if data.len() == 1 && data[0] == (0, 64 << 20) {
            return; // a filesystem without holes: nothing to test here
        }
        assert_eq!(data, vec![(1 << 20, 4096), (32 << 20, 8192)]);
        assert_eq!(until, 64 << 20);
        let (data, until) = b.data_ranges((0, 64 << 20), 4096, Some(4096)).unwrap();
        assert_eq!((data, until), (vec![(1 << 20, 4096)], (1 << 20) + 4096), "stops after the data asked for");
        let shifted = file(1 << 20);
        let (data, _) = shifted.data_ranges((0, 63 << 20), 4096, None).unwrap();
        assert_eq!(data, vec![(0, 4096), (31 << 20, 8192)], "device offsets are the file's less the shift");
    }

    /// More extents than a window maps: a window's map stops early, the plan's does not.
    #[test]
    fn the_plan_maps_every_extent() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fragmented");
        let f = File::create(&path).unwrap();
        let n = MAX_EXTENTS as u64 + 500;
        f.set_len(n * 16384).unwrap();
        for i in 0..n {
            f.write_all_at(&[1u8; 4096], i * 16384).unwrap();
        }
        f.sync_all().unwrap();
        let b = Backing { below: Below::File { file: File::open(&path).unwrap(), shift: 0 }, described: "t".into() };
        let (window, until) = b.data_ranges((0, n * 16384), 4096, None).unwrap();
        if window.len() == 1 {
            return; // a filesystem without holes: nothing to test here
        }
        assert_eq!(window.len(), MAX_EXTENTS, "a window's map is bounded");
        assert!(until < n * 16384, "and says where it stops: {until}");
        let all = b.all_data_ranges((0, n * 16384), 4096).unwrap();
        assert_eq!(all.len() as u64, n, "every extent, once");
        assert_eq!(all.iter().map(|r| r.1).sum::<u64>(), n * 4096);
        assert!(all.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0), "ascending, apart");
    }
}
