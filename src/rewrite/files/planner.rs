//! The two adapters that make files look like one device to the engine.
//!
//! One engine run rewrites the files of one filesystem, in the order of their first
//! block on the device, so that their reads, writes and read-backs overlap as a
//! device's do, and files laid out one after another share I/Os. The files are laid
//! end to end in a *virtual* address space: file `k` occupies
//! `[base_k, base_k + span_k)`, where its span is its size when the run started, rounded
//! up to whole blocks. The engine's cursor and journal are in that space.
//! - [`FilesPlanner`] maps the files with FIEMAP at the start of every window (as many
//!   as a tenth of the window has time for), *while
//!   frozen* (only then is the map true for the whole window; a file seen in delayed
//!   allocation before the freeze has its real extents once frozen), and plans each
//!   file's ranges in file-offset order, files in their order: the order in which a
//!   sequential scan reads them. A piece that continues the previous one both in the
//!   virtual space and on the device joins it, so small files laid out one after another
//!   are rewritten in large chunks. Unwritten extents and holes are never written; shared
//!   (reflinked) extents are rewritten once per physical range across the whole run; a
//!   file with extents flagged UNKNOWN, DELALLOC, ENCODED, DATA_INLINE, DATA_TAIL,
//!   NOT_ALIGNED or DATA_ENCRYPTED is skipped with the reason, and the others go on.
//! - [`FileTarget`] turns virtual offsets into device offsets through that map, so every
//!   chunk is read from and written back to the device blocks the files occupy, and
//!   never to any other block.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::engine::Planner;
use crate::engine::target::{BlockTarget, DirectDevice, ReadTarget};
use crate::support::error::{Error, Result};
use crate::sys;

use super::extents::{Extent, plan_extents, push_merged};
use super::lock;

/// This window's map, ascending by virtual offset.
pub(crate) type Map = Arc<Mutex<Vec<Extent>>>;

/// One file of the run, and what happened to it.
#[derive(Default)]
pub(crate) struct Member {
    /// This file's index in the whole run (for its report).
    pub(crate) index: usize,
    pub(crate) path: PathBuf,
    /// The file the run set out to rewrite: its device, inode and birth time, checked
    /// each time it is opened. A file is open only while a window maps it, so that a run
    /// holds one descriptor however many files it rewrites (a file seen again under its
    /// path is the same file, or skipped as replaced).
    pub(crate) inode: Option<Inode>,
    /// Size when the run started.
    pub(crate) size: u64,
    /// Where the file starts in the run's virtual address space.
    pub(crate) base: u64,
    /// Bytes of virtual space it occupies (its size rounded up to whole blocks).
    pub(crate) span: u64,
    /// Why the file is skipped, if it is.
    pub(crate) skipped: Option<String>,
    /// Extents in the first map.
    pub(crate) extents: Option<usize>,
    pub(crate) bytes_unwritten: u64,
    pub(crate) bytes_shared_elsewhere: u64,
    /// Bytes written and verified (credited as the cursor passes them).
    pub(crate) bytes_rewritten: u64,
    /// The first and last window (of this engine run) that rewrote some of it.
    pub(crate) windows: Option<(u64, u64)>,
}

impl Member {
    pub(crate) fn new(index: usize, path: PathBuf, size: u64, span: u64) -> Member {
        Member { index, path, size, span, ..Member::default() }
    }

    /// Opens the file for a window's map: `None` (and skipped, with the reason) when it
    /// is gone or another file now has its path.
    fn open(&mut self) -> Result<Option<(std::fs::File, std::fs::Metadata)>> {
        let why = match std::fs::File::open(&self.path) {
            Ok(f) => {
                let md = f.metadata().map_err(|e| Error::io(format!("fstat {}", self.path.display()), e))?;
                match self.inode {
                    Some(i) if i != Inode::of(&md) => "replaced during the run (another file has its path)",
                    _ => return Ok(Some((f, md))),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && self.extents.is_some() => "deleted during the run",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "deleted before its turn",
            Err(e) => return Err(Error::io(format!("opening {}", self.path.display()), e)),
        };
        self.skipped = Some(why.into());
        Ok(None)
    }
}

/// Which file a path named: device, inode and birth time (an inode number a deleted
/// file freed may be given to a new one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Inode {
    dev: u64,
    ino: u64,
    born: Option<std::time::SystemTime>,
}

impl Inode {
    pub(crate) fn of(md: &std::fs::Metadata) -> Inode {
        Inode { dev: md.dev(), ino: md.ino(), born: md.created().ok() }
    }

    /// (device, inode), as stat gives them.
    pub(crate) fn id(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// Plans the files of one filesystem from FIEMAP, in every window.
pub(crate) struct FilesPlanner {
    pub(crate) members: Vec<Member>,
    map: Map,
    /// Physical ranges of shared extents, and which file claimed each.
    shared: HashMap<(u64, u64), usize>,
    /// Pieces of the last plan not yet credited to their file: (member, virtual offset,
    /// length).
    planned: Vec<(usize, u64, u64)>,
    /// Windows planned so far (the current one's number).
    window: u64,
    /// Mapping stops at the first file past this much time in a window (a tree of
    /// many files is mapped a window's worth at a time); the plan then ends there.
    plan_time: Duration,
    /// Where the last plan ends.
    horizon: u64,
    /// Files of the whole run finished: those before this planner's, and those its
    /// cursor has passed (the progress shows it).
    finished: Option<(Arc<std::sync::atomic::AtomicUsize>, usize)>,
    /// On btrfs: the device this run rewrites, and the filesystem's chunk map.
    pub(crate) btrfs: Option<super::mirrors::OnDevice>,
}

impl FilesPlanner {
    /// Lays `members` end to end from virtual offset 0.
    pub(crate) fn new(mut members: Vec<Member>, map: Map, plan_time: Duration) -> FilesPlanner {
        let mut base = 0;
        for m in &mut members {
            m.base = base;
            base += m.span;
        }
        FilesPlanner {
            members,
            map,
            shared: HashMap::new(),
            planned: Vec::new(),
            window: 0,
            plan_time,
            horizon: 0,
            finished: None,
            btrfs: None,
        }
    }

    /// Counts into `finished` the files this planner's cursor passes, after `before`.
    pub(crate) fn count_finished(&mut self, finished: Arc<std::sync::atomic::AtomicUsize>, before: usize) {
        self.finished = Some((finished, before));
    }

    /// The end of the virtual address space.
    pub(crate) fn end(&self) -> u64 {
        self.members.last().map_or(0, |m| m.base + m.span)
    }

    /// Credits the planned bytes below `cursor` to their files: the engine has written,
    /// verified and recorded everything before its cursor. Call it with the run's last
    /// cursor when the run ends.
    pub(crate) fn credit(&mut self, cursor: u64) {
        for (mi, at, len) in self.planned.drain(..) {
            let (m, n) = (&mut self.members[mi], cursor.clamp(at, at + len) - at);
            m.bytes_rewritten += n;
            if n > 0 {
                m.windows = Some((m.windows.map_or(self.window, |w| w.0), self.window));
            }
        }
    }

    /// Maps one file from `cursor` (a virtual offset inside it) and appends its pieces to
    /// `runs`.
    fn plan_member(&mut self, mi: usize, cursor: u64, runs: &mut Vec<Extent>) -> Result<()> {
        let m = &mut self.members[mi];
        if m.skipped.is_some() {
            return Ok(());
        }
        // Closed when this returns: the window's map is true while it is frozen, and the
        // next window opens the file again.
        let Some((file, md)) = m.open()? else {
            shared_skip(&mut self.shared, m.index);
            return Ok(());
        };
        if md.nlink() == 0 {
            skip(m, &mut self.shared, "deleted during the run".into());
            return Ok(());
        }
        let local = cursor.saturating_sub(m.base);
        // On btrfs the virtual space interleaves copies: map from the file offset of
        // the group the cursor is in.
        let from = self.btrfs.as_ref().map_or(local, |b| b.file_offset(local));
        // FIEMAP_FLAG_SYNC returns at once on a frozen filesystem (nothing can be dirty).
        let exts = sys::extents::fiemap(file.as_fd(), from, sys::extents::FIEMAP_FLAG_SYNC)
            .map_err(|e| Error::io(format!("FIEMAP {}", m.path.display()), e.into()))?;
        // Skipped bytes are counted from the file's first map only: every later window
        // maps the rest of it again.
        let first = m.extents.is_none();
        // An xfs realtime file's FIEMAP addresses are on the realtime device, not the
        // device reseq writes.
        if first && sys::extents::fs_xflags(file.as_fd()).is_ok_and(|f| f & sys::extents::FS_XFLAG_REALTIME != 0) {
            let why = "an xfs realtime file: its blocks are on the realtime device, not this one";
            skip(m, &mut self.shared, why.into());
            return Ok(());
        }
        m.extents.get_or_insert(exts.len());
        let (index, shared) = (m.index, &mut self.shared);
        let claim = |p: u64, l: u64| *shared.entry((p, l)).or_insert(index) == index;
        let (mut unwritten, mut shared_elsewhere) = (0, 0);
        // On btrfs the span is virtual: the file ends at its last block.
        let block = md.blksize().max(1);
        let file_end = self.btrfs.as_ref().map_or(m.span, |_| m.size.div_ceil(block) * block);
        let planned = plan_extents(&exts, from, file_end, claim, &mut unwritten, &mut shared_elsewhere);
        let planned = match (&self.btrfs, planned) {
            (Some(b), Ok(pieces)) => b.on_device(&pieces, local),
            (_, planned) => planned,
        };
        match planned {
            Ok(pieces) => {
                if first {
                    (m.bytes_unwritten, m.bytes_shared_elsewhere) = (unwritten, shared_elsewhere);
                }
                for p in pieces {
                    let at = m.base + p.logical;
                    self.planned.push((mi, at, p.len));
                    push_merged(runs, Extent { logical: at, ..p });
                }
            }
            Err(reason) => skip(m, &mut self.shared, reason),
        }
        Ok(())
    }
}

/// A skipped file gives up the shared ranges it claimed: another file holding them
/// rewrites them instead of counting them as done by this one.
fn skip(m: &mut Member, shared: &mut HashMap<(u64, u64), usize>, why: String) {
    m.skipped = Some(why);
    shared_skip(shared, m.index);
}

fn shared_skip(shared: &mut HashMap<(u64, u64), usize>, index: usize) {
    shared.retain(|_, claimer| *claimer != index);
}

impl Planner for FilesPlanner {
    fn ranges(&mut self, cursor: u64, end: u64) -> Result<Vec<(u64, u64)>> {
        self.credit(cursor);
        self.window += 1;
        // Frozen: btrfs's own writers are checked, and its chunk map read again.
        if let Some(b) = &self.btrfs
            && let Err(e) = b.window()
        {
            lock(&self.map).clear();
            self.planned.clear();
            return Err(e);
        }
        let started = std::time::Instant::now();
        let first = self.members.partition_point(|m| m.base + m.span <= cursor);
        if let Some((finished, before)) = &self.finished {
            finished.store(before + first, std::sync::atomic::Ordering::SeqCst);
        }
        let mut runs = Vec::new();
        let mut mi = first;
        while mi < self.members.len()
            && self.members[mi].base < end
            && (mi == first || started.elapsed() < self.plan_time)
        {
            if let Err(e) = self.plan_member(mi, cursor, &mut runs) {
                lock(&self.map).clear();
                self.planned.clear();
                return Err(e);
            }
            mi += 1;
        }
        self.horizon = self.members.get(mi).map_or(end, |m| m.base.min(end));
        let ranges = runs.iter().map(|e| (e.logical, e.len)).collect();
        *lock(&self.map) = runs;
        Ok(ranges)
    }

    fn planned_until(&self, end: u64) -> u64 {
        self.horizon.min(end)
    }
}

/// Files seen as a block device: virtual offsets in, device offsets out.
pub(crate) struct FileTarget {
    pub(crate) dev: Arc<DirectDevice>,
    pub(crate) map: Map,
    pub(crate) name: String,
    /// On btrfs: each write's bytes compared with the other copies of them.
    pub(crate) mirrors: Option<super::mirrors::Mirrors>,
}

impl FileTarget {
    /// Where `len` bytes at virtual `offset` lie on the device, and (btrfs) their
    /// logical address.
    fn locate(&self, offset: u64, len: u64) -> std::io::Result<(u64, Option<u64>)> {
        let map = lock(&self.map);
        let i = map.partition_point(|e| e.logical + e.len <= offset);
        map.get(i)
            .filter(|e| e.logical <= offset && offset + len <= e.logical + e.len)
            .map(|e| (e.physical + (offset - e.logical), e.source.map(|s| s + (offset - e.logical))))
            .ok_or_else(|| {
                std::io::Error::other(format!("offset {offset}+{len} of {} is not in this window's map", self.name))
            })
    }

    fn device_offset(&self, offset: u64, len: u64) -> std::io::Result<u64> {
        self.locate(offset, len).map(|(at, _)| at)
    }
}

impl ReadTarget for FileTarget {
    fn mem_align(&self) -> usize {
        self.dev.mem_align()
    }
    fn offset_align(&self) -> u64 {
        self.dev.offset_align()
    }
    fn read_some_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let at = self.device_offset(offset, buf.len() as u64)?;
        self.dev.read_some_at(buf, at)
    }
}

impl BlockTarget for FileTarget {
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let (at, source) = self.locate(offset, buf.len() as u64)?;
        if let (Some(m), Some(source)) = (&self.mirrors, source) {
            m.compare(&self.dev, buf, source, at);
        }
        self.dev.write_at(buf, at)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.dev.flush()
    }
    fn device_offset(&self, offset: u64, len: u64) -> Option<u64> {
        FileTarget::device_offset(self, offset, len).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(logical: u64, physical: u64, length: u64, flags: u32) -> sys::extents::FiemapExtent {
        sys::extents::FiemapExtent { logical, physical, length, flags, ..Default::default() }
    }

    #[test]
    fn plans_in_file_order_merging_physically_adjacent_pieces() {
        let (mut u, mut s) = (0, 0);
        let exts = [
            ext(0, 8192, 4096, 0),
            ext(4096, 12288, 4096, 0), // adjacent in file and on disk: merged
            ext(8192, 4096, 4096, 0),  // behind on disk: its own piece, in file order
            ext(12288, 40960, 8192, sys::extents::FIEMAP_EXTENT_UNWRITTEN), // never written
            ext(24576, 81920, 4096, sys::extents::FIEMAP_EXTENT_SHARED),
        ];
        let got = plan_extents(&exts, 0, 1 << 20, |_, _| true, &mut u, &mut s).unwrap();
        assert_eq!(
            got,
            vec![
                Extent { logical: 0, physical: 8192, len: 8192, source: None },
                Extent { logical: 8192, physical: 4096, len: 4096, source: None },
                Extent { logical: 24576, physical: 81920, len: 4096, source: None },
            ]
        );
        assert_eq!(u, 8192);
        // From a cursor inside an extent, and a shared range claimed by another file.
        let got = plan_extents(&exts, 6144, 1 << 20, |_, _| false, &mut u, &mut s).unwrap();
        assert_eq!(
            got,
            vec![
                Extent { logical: 6144, physical: 14336, len: 2048, source: None },
                Extent { logical: 8192, physical: 4096, len: 4096, source: None }
            ]
        );
        assert_eq!(s, 4096);
        let bad = [ext(0, 0, 4096, 0x200 | 0x100)];
        assert!(plan_extents(&bad, 0, 4096, |_, _| true, &mut u, &mut s).unwrap_err().contains("DATA_INLINE"));
    }

    #[test]
    fn files_laid_end_to_end_and_on_the_device_merge_into_one_run() {
        let mut runs = Vec::new();
        push_merged(&mut runs, Extent { logical: 0, physical: 1 << 20, len: 8192, source: None });
        push_merged(&mut runs, Extent { logical: 8192, physical: (1 << 20) + 8192, len: 4096, source: None });
        // The next file is elsewhere on the device: a run of its own.
        push_merged(&mut runs, Extent { logical: 12288, physical: 4096, len: 4096, source: None });
        assert_eq!(
            runs,
            vec![
                Extent { logical: 0, physical: 1 << 20, len: 12288, source: None },
                Extent { logical: 12288, physical: 4096, len: 4096, source: None }
            ]
        );
    }

    #[test]
    fn files_the_cursor_passes_are_counted_finished_as_the_run_goes() {
        let dir = tempfile::tempdir().unwrap();
        let members = (0..3)
            .map(|i| {
                let path = dir.path().join(format!("f{i}"));
                std::fs::write(&path, []).unwrap();
                Member::new(i, path, 4096, 4096)
            })
            .collect();
        let mut p = FilesPlanner::new(members, Map::default(), Duration::from_secs(1));
        let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        p.count_finished(Arc::clone(&finished), 5);
        let count = || finished.load(std::sync::atomic::Ordering::SeqCst);
        p.ranges(0, p.end()).unwrap();
        assert_eq!(count(), 5, "nothing passed yet: those finished before this planner");
        p.ranges(8192, p.end()).unwrap();
        assert_eq!(count(), 7, "the cursor is past two files");
    }
}
