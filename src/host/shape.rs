//! The shape of the target device, checked at every window, and the written-sectors
//! counters, checked before every write.
//!
//! Why: partitions, holders, loop devices and mounts are worked out when the run is
//! planned, and they can change under it. `BLKPG_ADD_PARTITION` (`partx -a`, `addpart`)
//! succeeds on a disk reseq holds `O_EXCL`: a new partition, with its own node, over bytes
//! being rewritten; a loop device's offset or size can be changed while it is open
//! (`LOOP_SET_STATUS64`, `losetup -c`), and then every offset reseq computed points at
//! other bytes. A [`Shape`] is a snapshot of all of that, taken at plan time and compared
//! before each window and, where windows do not freeze, every 250 ms within one (on the
//! writer's thread: it reads a few sysfs files, not all of /proc as the writers' scan
//! does, which runs beside it: [`crate::host::writers_check`]). The counters
//! ([`crate::host::written`]) are compared before every write and at the window's end.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::engine::guard::WindowGuard;
use crate::host::backing_watch::BackingWatch;
use crate::host::device::Sysfs;
use crate::host::window_checks::WindowCheck;
use crate::host::written::{self, Counters, Reading};
use crate::host::{aliases, mounts};
use crate::support::error::{Error, Result};

/// What the target looks like: "what" -> its value, each a line a person can read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shape(BTreeMap<String, String>);

impl Shape {
    /// The target `dev` as sysfs, the loop driver and mountinfo show it now: its size
    /// (and start, for a partition); its disk's size and partitions; the holders of each;
    /// a loop's backing file, offset and size limit, and the other loops over that file or
    /// stacked on any of these devices; the filesystems mounted from any of them.
    pub(crate) fn take(dev: (u32, u32), sysfs: &Sysfs) -> Shape {
        let mut s = BTreeMap::new();
        let Some((name, parent)) = sysfs.name_of(dev) else {
            s.insert("the device".into(), "gone".into());
            return Shape(s);
        };
        let disk = parent.clone().unwrap_or_else(|| name.clone());
        let parts = sysfs.partitions_of(&disk);
        let attr = |n: &str, a: &str| sysfs.read(n, a).unwrap_or_else(|| "-".into());
        s.insert(format!("{name}: size (sectors)"), attr(&name, "size"));
        if parent.is_some() {
            s.insert(format!("{name}: start (sector)"), attr(&name, "start"));
            s.insert(format!("{disk}: size (sectors)"), attr(&disk, "size"));
        }
        let list = parts.iter().map(|(p, _)| format!("{p} at {}+{}", attr(p, "start"), attr(p, "size")));
        s.insert(format!("{disk}: partitions"), list.collect::<Vec<_>>().join(", "));
        for n in std::iter::once(disk.clone()).chain(parts.iter().map(|p| p.0.clone())) {
            s.insert(format!("{n}: holders"), sysfs.holders_of(&n).join(", "));
        }
        let devs: Vec<(u32, u32)> = sysfs.dev_of(&disk).into_iter().chain(parts.iter().map(|p| p.1)).collect();
        loops(&mut s, sysfs, &disk, &devs);
        s.insert("mounted".into(), mounted(&devs));
        Shape(s)
    }

    /// What differs from `before`, one phrase per change.
    pub(crate) fn changes_since(&self, before: &Shape) -> Vec<String> {
        let keys: std::collections::BTreeSet<&String> = self.0.keys().chain(before.0.keys()).collect();
        let show = |v: Option<&String>| match v.map(String::as_str) {
            None | Some("") => "none".to_string(),
            Some(v) => v.to_string(),
        };
        keys.into_iter()
            .filter(|k| self.0.get(*k) != before.0.get(*k))
            .map(|k| format!("{k} was {}, now {}", show(before.0.get(k)), show(self.0.get(k))))
            .collect()
    }
}

/// The target's own loop (if `disk` is one): what backs it and where; every other loop
/// over the same file or stacked on `devs`.
fn loops(s: &mut BTreeMap<String, String>, sysfs: &Sysfs, disk: &str, devs: &[(u32, u32)]) {
    let (all, unknown) = aliases::loops(sysfs);
    let own = all.iter().find(|l| l.name == disk);
    if let Some(l) = own {
        s.insert(
            format!("{disk}: loop"),
            format!("backed by {} (inode {}), offset {}, size limit {}", l.path, l.file.ino, l.offset, l.size_limit),
        );
    }
    let others = all
        .iter()
        .filter(|l| l.name != disk)
        .filter(|l| own.is_some_and(|o| o.file == l.file) || l.backing_dev.is_some_and(|d| devs.contains(&d)));
    let mut names: Vec<String> = others.map(|l| format!("/dev/{} (backed by {})", l.name, l.path)).collect();
    names.extend(unknown);
    s.insert("loop devices over the same bytes".into(), names.join(", "));
}

/// The filesystems mounted from `devs`: device, type and source, each superblock once.
fn mounted(devs: &[(u32, u32)]) -> String {
    let m = mounts::read_mounts().unwrap_or_default();
    let mut found: Vec<String> = m
        .iter()
        .filter(|e| e.devices.iter().any(|d| devs.contains(d)))
        .map(|e| format!("{}:{} {} from {}", e.dev.0, e.dev.1, e.fs_type, e.source))
        .collect();
    found.sort();
    found.dedup();
    found.join(", ")
}

/// What changes the meaning of every offset, cheap enough to read before each write (a
/// few sysfs attributes): the target's size and start, and a loop's offset and size
/// limit, of the target and of its disk.
fn quick_look(sysfs: &Sysfs, dev: (u32, u32)) -> String {
    let Some((name, parent)) = sysfs.name_of(dev) else { return "gone".into() };
    let mut look = String::new();
    for n in std::iter::once(&name).chain(parent.as_ref()) {
        for a in ["size", "start", "loop/offset", "loop/sizelimit"] {
            look += &format!("{n}/{a}={} ", sysfs.read(n, a).unwrap_or_default());
        }
    }
    look
}

/// What a frozen filesystem may write of its own within one window, in bytes.
const FROZEN_SLACK: u64 = 4096;

/// The counters over one stretch of writes: the reading it started from, what reseq
/// wrote since (whole pages), and where.
struct Stretch {
    from: Reading,
    ours: u64,
    /// Device bytes reseq wrote since the last clean look.
    written: Vec<(u64, u64)>,
    /// A write whose place reseq could not name: this stretch cannot be judged.
    unknown: bool,
}

/// The check of the target's shape, compared to the plan's at every window, and of the
/// counters, before every write and at each window's end.
pub(crate) struct ShapeCheck {
    /// Whether windows freeze (a frozen filesystem may write a block of its own).
    freezes: bool,
    dev: (u32, u32),
    planned: Shape,
    sysfs: Sysfs,
    checked: Option<Instant>,
    counters: Option<Counters>,
    stretch: Option<Stretch>,
    windows: u64,
    /// [`quick_look`] when the run started.
    quick: String,
    /// Device bytes written since the last look found the same shape.
    unlooked: Option<(u64, u64)>,
    /// The next permit's write, announced (device offset, length).
    announced: Option<(u64, u64)>,
    /// The kernel's record of writes to the target's backing files, if it has any.
    watch: Option<BackingWatch>,
    /// Device bytes written since the watch was last read with no event.
    watch_risk: Vec<(u64, u64)>,
    /// The writers the watch reported: the run stops, and stays stopped.
    watch_seen: Vec<String>,
    /// The counters' ranges at risk as the last window's end left them.
    end_risk: Vec<(u64, u64)>,
}

/// Adds `at..at + len` to ascending ranges, joined to the last where they touch.
fn add_range(ranges: &mut Vec<(u64, u64)>, at: u64, len: u64) {
    match ranges.last_mut() {
        Some(last) if at <= last.1 && at + len >= last.0 => *last = (last.0.min(at), last.1.max(at + len)),
        _ => ranges.push((at, at + len)),
    }
}

impl ShapeCheck {
    /// Counters that grew by more than reseq wrote mean another writer only if the window's
    /// freeze held all the while: a filesystem writes once thawed, whether by another
    /// program (the guardian's verdict, exit 8, wins) or by the guardian itself at the
    /// deadline while reseq was stopped or slow (then the growth cannot be told from the
    /// filesystem's own, and is not judged). Asked only when they grew; grants nothing.
    /// Ok(false): the window is over, thawed by the guardian.
    fn judged(&mut self, counted: Result<()>, guard: &mut dyn WindowGuard) -> Result<bool> {
        let Err(e) = counted else { return Ok(true) };
        if !matches!(e, Error::ForeignWrite { .. }) {
            return Err(e);
        }
        if guard.held()? {
            return Err(e);
        }
        log::info!(
            "the written-sectors counters grew by more than reseq wrote after the guardian had thawed window {} at its deadline: the filesystem's own writes, not judged",
            self.windows
        );
        self.stretch = None;
        Ok(false)
    }

    /// `planned` is the shape the plan was made for; `devs` are the devices sharing the
    /// target's bytes, whose loops' backing files are watched from here on (refused when
    /// one cannot be); `freezes`: whether the run's windows freeze. Made before the first
    /// write.
    pub(crate) fn new(freezes: bool, dev: (u32, u32), devs: &[(u32, u32)], planned: Shape) -> Result<ShapeCheck> {
        let sysfs = Sysfs::default();
        let counters = Counters::new(sysfs.clone(), dev);
        let quick = quick_look(&sysfs, dev);
        let watch = BackingWatch::start(devs, &sysfs)?;
        Ok(ShapeCheck {
            freezes,
            dev,
            planned,
            sysfs,
            checked: None,
            counters,
            stretch: None,
            windows: 0,
            quick,
            unlooked: None,
            announced: None,
            watch,
            watch_risk: Vec::new(),
            watch_seen: Vec::new(),
            end_risk: Vec::new(),
        })
    }

    /// Stops the run if the kernel reported a write to a backing file since the last
    /// look (any: the loop driver's own raise none); otherwise the bytes written so far
    /// are no longer at risk from that side. Never judged away by a thaw: a filesystem's
    /// writes reach its backing file through the loop device, unreported.
    fn check_watch(&mut self) -> Result<()> {
        let Some(w) = &self.watch else { return Ok(()) };
        let who = w.writers()?;
        if who.is_empty() && self.watch_seen.is_empty() {
            self.watch_risk.clear();
            return Ok(());
        }
        for p in who {
            if !self.watch_seen.contains(&p) {
                self.watch_seen.push(p);
            }
        }
        Err(Error::ForeignWrite {
            device: w.names(),
            window: self.windows,
            seen: format!(
                "the kernel reported writes to it (fanotify FAN_MODIFY on its inode) by {}; the loop device's own writes raise none, so these are another writer's",
                self.watch_seen.join(", ")
            ),
            written: self.watch_risk.clone(),
        })
    }

    /// A change before the first write is a refusal (exit 3); later it stops the run
    /// before reseq writes more (exit 4, resumable).
    fn check_shape(&mut self) -> Result<()> {
        let first = self.checked.is_none();
        self.checked = Some(Instant::now());
        let changes = Shape::take(self.dev, &self.sysfs).changes_since(&self.planned);
        if changes.is_empty() {
            return Ok(());
        }
        let what = format!(
            "the device changed shape since the run was planned: {}. The plan's offsets may no longer name the bytes they named, and a new partition or loop device is a way to write them that no freeze stops",
            changes.join("; ")
        );
        if first {
            return Err(Error::refused(
                what,
                "find out what changed the device (partx, losetup, mount), undo it, then run reseq again",
            ));
        }
        // A write the engine had started when the change came may have gone through the
        // new shape: the loop driver holds it while it changes, then sends it on.
        let moved = quick_look(&self.sysfs, self.dev) != self.quick;
        let risk = match self.unlooked.filter(|_| moved) {
            Some((lo, hi)) => format!(
                "; a write in flight during the change may have landed where the new shape puts it: device bytes {lo}..{hi} as the plan counted them (the chunks written since the last look) may now hold bytes that belong elsewhere, and what they landed on is lost; check the data"
            ),
            None => " (every chunk it wrote was verified)".into(),
        };
        Err(Error::io(
            format!(
                "{what}; reseq stopped before writing more{risk}. Undo the change, then run again with --resume (a resume checks the device's identity)"
            ),
            std::io::Error::from_raw_os_error(nix::libc::EBUSY),
        ))
    }

    fn start_stretch(&mut self) {
        self.stretch =
            self.counters.as_ref().map(|c| Stretch { from: c.read(), ours: 0, written: Vec::new(), unknown: false });
    }

    /// Stops the run if the counters grew by more than reseq wrote since the stretch
    /// began; otherwise the bytes written so far are no longer at risk.
    fn check_counters(&mut self) -> Result<()> {
        let (Some(c), Some(st)) = (&self.counters, &mut self.stretch) else { return Ok(()) };
        if st.unknown {
            // Judged from here on; what was written so far stays at risk until then.
            let written = std::mem::take(&mut st.written);
            self.start_stretch();
            if let Some(st) = &mut self.stretch {
                st.written = written;
            }
            return Ok(());
        }
        let total = written::bytes_between(&st.from, &c.read());
        let Some(total) = total else {
            return Err(Error::io(
                format!("the written-sectors counter of {} can no longer be read (the device is gone?)", c.name()),
                std::io::Error::from_raw_os_error(nix::libc::ENODEV),
            ));
        };
        // A frozen ext4 was seen to write one block of its own (1 KiB) in a window, once,
        // with a process appending and fsyncing between windows: up to a page is taken
        // for the filesystem's, and said (docs/SAFETY.md says what that leaves unseen).
        let slack = if self.freezes { FROZEN_SLACK } else { 0 };
        if total > st.ours && total <= st.ours + slack {
            log::info!(
                "the written-sectors counters of /dev/{} grew {} bytes beyond reseq's writes in a frozen window: taken for the filesystem's own",
                c.name(),
                total - st.ours
            );
        }
        if total > st.ours + slack {
            let device = format!("/dev/{}", c.name());
            return Err(Error::ForeignWrite {
                device,
                window: self.windows,
                seen: format!(
                    "its written-sectors counter grew by {} bytes more than reseq wrote (a writer no scan of /proc can see: an fd passed over a socket, a writer that opened, wrote and closed between two looks, a kernel user)",
                    total - st.ours
                ),
                written: st.written.clone(),
            });
        }
        st.written.clear();
        Ok(())
    }
}

impl WindowCheck for ShapeCheck {
    /// The shape before each window (before it freezes); the counters from once it has.
    fn before_window(&mut self, _freezes: bool) -> Result<()> {
        self.check_shape()
    }
    fn window_began(&mut self) {
        self.windows += 1;
        self.end_risk.clear();
        self.start_stretch();
    }
    /// After the other writers' (their message names the process or the alias and its
    /// use): the list puts this check after theirs.
    fn recheck(&mut self, freezes: bool) -> Result<()> {
        if !freezes && crate::host::freeze::rescan_due(self.checked) {
            self.check_shape()?;
        }
        Ok(())
    }
    fn announce(&mut self, offset: u64, len: u64) {
        self.announced = Some((offset, len));
    }
    /// The last look before a write, before the permit (a permit granted must be
    /// followed by its write): the target's size and place, then the counters.
    fn before_permit(&mut self, guard: &mut dyn WindowGuard) -> Result<bool> {
        if quick_look(&self.sysfs, self.dev) != self.quick {
            self.check_shape()?;
            self.quick = quick_look(&self.sysfs, self.dev);
        }
        self.unlooked = None;
        // The kernel's record of the backing files first: never judged away.
        self.check_watch()?;
        let counted = self.check_counters();
        self.judged(counted, guard)
    }
    fn permitted(&mut self, granted: bool) {
        let announced = self.announced.take();
        if let (true, Some((at, len))) = (granted, announced) {
            self.unlooked = Some((at, at + len));
            if self.watch.is_some() {
                add_range(&mut self.watch_risk, at, len);
            }
        }
        if let Some(st) = &mut self.stretch {
            match announced {
                Some((at, len)) if granted => {
                    // Exactly: a write that falls back to the page cache (ext4's cached
                    // pages) is written back in the filesystem's blocks, which chunks are
                    // aligned to; rounding each write up to pages would hide a block of
                    // someone else's per write.
                    st.ours += len;
                    add_range(&mut st.written, at, len);
                }
                None if granted => st.unknown = true,
                _ => {}
            }
        }
    }
    /// The counters once more before the thaw (a thaw writes: ext4 commits its
    /// superblock); the window ends whatever they say.
    fn before_thaw(&mut self, guard: &mut dyn WindowGuard) -> Result<()> {
        let watched = self.check_watch();
        let before = self.stretch.as_ref().map(|s| s.written.clone()).unwrap_or_default();
        let counted = self.check_counters();
        // Before the thaw: whether the freeze held until the reading above.
        let counted = self.judged(counted, guard);
        // Cleared by a clean look; kept where not judged.
        self.end_risk = match (&counted, &self.stretch) {
            (Ok(true), Some(st)) => st.written.clone(),
            _ => before,
        };
        self.stretch = None;
        watched.and(counted.map(drop))
    }
    /// A read-back that differed because the device changed under it is named as that
    /// change (the rescue copy is named too).
    fn after_thaw(&mut self) -> Result<()> {
        if quick_look(&self.sysfs, self.dev) != self.quick {
            self.check_shape()?;
        }
        Ok(())
    }
    fn at_risk(&self) -> Option<Vec<(u64, u64)>> {
        if self.counters.is_none() && self.watch.is_none() {
            return None;
        }
        let counted = self.stretch.as_ref().map_or(&self.end_risk, |s| &s.written);
        Some(crate::support::error::merged(counted.iter().chain(&self.watch_risk).copied().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_named_with_what_it_was() {
        let mut before = Shape::default();
        before.0.insert("loop5: loop".into(), "backed by /x (inode 3), offset 0, size limit 0".into());
        before.0.insert("loop5: partitions".into(), String::new());
        let mut after = before.clone();
        assert!(after.changes_since(&before).is_empty());
        after.0.insert("loop5: loop".into(), "backed by /x (inode 3), offset 4096, size limit 0".into());
        after.0.insert("loop5: partitions".into(), "loop5p1 at 2048+2048".into());
        let c = after.changes_since(&before);
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(c.contains(&"loop5: partitions was none, now loop5p1 at 2048+2048".to_string()), "{c:?}");
        assert!(c.iter().any(|l| l.contains("offset 0, size limit 0, now") && l.contains("offset 4096")), "{c:?}");
    }

    #[test]
    fn this_hosts_root_device_has_a_shape() {
        let root =
            std::fs::metadata("/").map(|m| crate::host::devnum::dev_num(std::os::unix::fs::MetadataExt::dev(&m)));
        let sysfs = Sysfs::default();
        if let Ok(dev) = root
            && sysfs.name_of(dev).is_some()
        {
            let t = Instant::now();
            let s = Shape::take(dev, &sysfs);
            let take = t.elapsed();
            assert!(s.changes_since(&Shape::take(dev, &sysfs)).is_empty(), "{s:?}");
            // What each write pays: the quick look and the counters (figures in SAFETY.md).
            let c = Counters::new(sysfs.clone(), dev).unwrap();
            let t = Instant::now();
            for _ in 0..100 {
                assert_eq!(quick_look(&sysfs, dev), quick_look(&sysfs, dev));
                let r = c.read();
                assert!(written::bytes_between(&r, &c.read()).is_some());
            }
            eprintln!("a shape: {take:?}; a look before a write: {:?}", t.elapsed() / 200);
        }
    }
}
