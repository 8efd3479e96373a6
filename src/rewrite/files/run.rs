//! File mode's run: each filesystem of the plan in turn, through the steps of
//! [`crate::rewrite::sequence`], and each file's report.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use crate::engine::journal::{FileIdentity, Journal, Placed};
use crate::engine::{self, EngineConfig, EngineStats};
use crate::host::device::Sysfs;
use crate::report::{FileReport, Report, Verification};
use crate::rewrite::sequence;
use crate::support::error::{Error, Result};
use crate::support::output::Progress;
use crate::support::signals::StopFlag;
use crate::support::units::human_bytes;

use super::plan::{EMPTY, FilesPlan, FsGroup, file_identity, mapped, on_devid};
use super::planner::{FileTarget, FilesPlanner, Map, Member};
use super::record;

/// What a file-mode run shares across its filesystems.
pub(super) struct FileRun<'a> {
    pub(super) plan: &'a FilesPlan,
    pub(super) stop: &'a StopFlag,
    /// What the record says, written with the first journal this run writes.
    pub(super) record_header: (record::RunHeader, Vec<FileIdentity>),
    /// Whether this run wrote the record.
    pub(super) record_written: Arc<std::sync::atomic::AtomicBool>,
    /// One progress over all files: bytes and files done, rate and ETA.
    pub(super) progress: Progress,
    pub(super) files_done: usize,
    pub(super) files_total: usize,
    /// `files_done`, and more as the engine passes files: what the progress shows.
    pub(super) finished: Arc<std::sync::atomic::AtomicUsize>,
    pub(super) totals: EngineStats,
    /// Files' reports, by their index in the run.
    pub(super) reports: Vec<(usize, FileReport)>,
    /// What the host wrote to the filesystems' devices, and the drive it was (its
    /// SMART counters are only told for runs on one drive).
    pub(super) cost: Option<(crate::measure::passes::WriteCost, String)>,
    /// btrfs copies that differ from their mirrors (or could not be read to compare).
    pub(super) findings: Vec<String>,
}

/// What the engine runs came to, reported with the files' reports either way. (An `Err`
/// beside it is a stop before a run: nothing more is reported.)
#[must_use]
pub(super) enum Ran {
    Finished,
    Ended(Error),
}

impl Ran {
    pub(super) fn into_result(self) -> Result<()> {
        match self {
            Ran::Finished => Ok(()),
            Ran::Ended(e) => Err(e),
        }
    }
}

impl<'a> FileRun<'a> {
    /// Each filesystem in turn, until one ends short.
    pub(super) fn groups(&mut self) -> Result<Ran> {
        for (gi, g) in self.plan.groups.iter().enumerate() {
            if let Ran::Ended(e) = self.group(gi, g)? {
                return Ok(Ran::Ended(e));
            }
        }
        Ok(Ran::Finished)
    }

    /// One filesystem, steps 2-7 of [`crate::rewrite::sequence`]: one engine run over
    /// its files, or on btrfs, one for each member device (each rewrites the copies on
    /// its device; a file is finished with the last).
    fn group(&mut self, gi: usize, g: &FsGroup) -> Result<Ran> {
        let todo = self.todo(gi);
        let goal = self.progress.done() + todo.iter().map(|&fi| self.plan.to_rewrite[fi]).sum::<u64>();
        let Some(b) = &g.btrfs else {
            return self.device_run(
                g,
                &todo,
                Device { info: &g.device, shape: &g.shape, devid: None, goal: Some(goal) },
            );
        };
        for (i, (devid, info, shape)) in b.members.iter().enumerate() {
            let goal = (i + 1 == b.members.len()).then_some(goal);
            if let Ran::Ended(e) = self.device_run(g, &todo, Device { info, shape, devid: Some(*devid), goal })? {
                return Ok(Ran::Ended(e));
            }
        }
        Ok(Ran::Finished)
    }

    /// One engine run over the files `todo` of `g`, on one device: taken and checked,
    /// its record, one guardian.
    fn device_run(&mut self, g: &FsGroup, todo: &[usize], d: Device) -> Result<Ran> {
        let sequence::Taken { _lock, device } = sequence::take_device(&sequence::Taking {
            state_dir: &self.plan.state.path,
            device: d.info,
            shown: format!("{} ({})", d.info.path.display(), g.fs.mount_point.display()),
            mounted: true,
            unfinished: self.plan.unfinished.as_ref(),
        })?;
        if todo.is_empty() {
            return Ok(Ran::Finished);
        }
        let device = Arc::new(device);
        let on = d.devid.map(|devid| self.on_device(g, devid, Arc::clone(&device))).transpose()?;
        let (members, table, start) = self.members(d.info, todo, on.as_ref());
        let map: Map = Arc::default();
        let o = &self.plan.options;
        let mirrors = on.as_ref().map(|on| self.mirrors(g, d.info, on)).transpose()?;
        let findings = mirrors.as_ref().map(|m| Arc::clone(&m.findings));
        let mut planner = FilesPlanner::new(members, Arc::clone(&map), o.max_freeze() / 10);
        planner.btrfs = on;
        let end = planner.end();
        let mut run = sequence::run_record(&d.info.identity, o.run.chunk_size.bytes(), (0, end), None);
        run.files = table;
        let journal_path = record::journal_path(&self.plan.record_path, &d.info.identity.name);
        let mut journal = Journal::deferred(&journal_path, run, Some(self.write_record()));
        let name = format!("{} file(s) on {}", planner.members.len(), g.fs.mount_point.display());
        let target = FileTarget { dev: device, map, name, mirrors };
        let cfg = self.config(g, d.info, &planner.members, start, end);
        planner.count_finished(Arc::clone(&self.finished), self.files_done);
        let guarded = self.guarded(g, &d, &planner.members);
        let journal_path = journal.path().to_path_buf();
        let (progress, stop) = (&mut self.progress, self.stop);
        let w = sequence::windows(
            d.info,
            || sequence::guardian(&guarded, &journal_path),
            || Ok(()),
            |(), guard| engine::run(&target, &cfg, &mut planner, guard, &mut journal, progress, stop),
        )?;
        let (stats, result) = w.ran;
        self.add_cost(w.cost.end(), d.info);
        planner.credit(stats.next_offset_bytes);
        self.findings.extend(
            findings.map(|f| std::mem::take(&mut *f.lock().unwrap_or_else(|p| p.into_inner()))).unwrap_or_default(),
        );
        // Holes, unwritten and shared ranges are not rewritten, yet done; so is the start
        // of a resumed file.
        if let (true, Some(goal)) = (result.is_ok(), d.goal) {
            self.progress.advance(goal.saturating_sub(self.progress.done()));
        }
        let interleaved = planner.btrfs.as_ref().is_some_and(|b| b.copies > 1);
        self.settle(&planner.members, start, &stats, result.is_ok(), d.goal.is_some());
        if interleaved {
            // Spans interleave copies there: they say nothing of the file's holes.
            let mine: std::collections::HashSet<usize> = planner.members.iter().map(|m| m.index).collect();
            self.reports.iter_mut().filter(|(i, _)| mine.contains(i)).for_each(|(_, r)| r.bytes_skipped_holes = 0);
        }
        Ok(result.map_or_else(Ran::Ended, |()| Ran::Finished))
    }

    /// A btrfs member's run: its devid, the copies it holds, the chunk map.
    fn on_device(
        &self,
        g: &FsGroup,
        devid: u64,
        device: Arc<crate::engine::target::DirectDevice>,
    ) -> Result<super::mirrors::OnDevice> {
        let layout = g.btrfs.as_ref().map(|b| b.layout.clone()).unwrap_or_default();
        Ok(super::mirrors::OnDevice {
            device: Some(device),
            planned: layout.member_set(),
            fd: crate::host::freeze::open_mount_point(&g.fs.mount_point)?,
            mount: g.fs.mount_point.clone(),
            devid,
            copies: layout.copies_on_one_device() as u64,
            unit: self.plan.options.run.chunk_size.bytes(),
            layout: Arc::new(std::sync::Mutex::new(layout)),
        })
    }

    /// The other members of a btrfs, opened read-only, to compare each write with.
    fn mirrors(
        &self,
        g: &FsGroup,
        dev: &crate::host::device::BlockDeviceInfo,
        on: &super::mirrors::OnDevice,
    ) -> Result<super::mirrors::Mirrors> {
        let mut readers = std::collections::HashMap::new();
        for (devid, info, _) in g.btrfs.iter().flat_map(|b| &b.members).filter(|(id, ..)| *id != on.devid) {
            let r = crate::engine::target::DirectReader::open(&info.path)
                .map_err(|e| Error::io(format!("opening {} to compare copies", info.path.display()), e))?;
            if let Some(b) = &g.btrfs
                && let Some(m) = b.layout.member(*devid)
            {
                crate::host::btrfs::check_member(&b.layout, m, &r)?;
            }
            readers.insert(*devid, r.aligned(info.dio_mem_align as usize, u64::from(info.dio_offset_align)));
        }
        Ok(super::mirrors::Mirrors {
            devid: on.devid,
            layout: Arc::clone(&on.layout),
            readers,
            mem_align: dev.dio_mem_align as usize,
            findings: Arc::default(),
        })
    }

    /// The files to rewrite, in the order of their first block on the device (path order
    /// says nothing about where files lie; this order lets files that lie one after
    /// another share I/Os, and writes the device ascending), the file the interrupted
    /// run stopped in first; their table for the journal; and where that file resumes.
    fn members(
        &mut self,
        dev: &crate::host::device::BlockDeviceInfo,
        todo: &[usize],
        on: Option<&super::mirrors::OnDevice>,
    ) -> (Vec<Member>, Vec<Placed>, u64) {
        let align = u64::from(dev.dio_offset_align);
        let mut files: Vec<(u64, Member, FileIdentity)> = Vec::new();
        let mut start = 0;
        for &fi in todo {
            let path = &self.plan.planned[fi].path;
            let Ok(md) = std::fs::metadata(path) else {
                self.reports.push((fi, skipped_report(path, "deleted before its turn")));
                continue;
            };
            let exts = mapped(path);
            let id = on_devid(file_identity(path, &md, exts.as_deref()), on.map(|o| o.devid));
            // A btrfs member's run the interrupted run finished this file in.
            if on.is_some() && self.plan.earlier.as_ref().is_some_and(|e| e.done.contains_key(&record::key(&id))) {
                continue;
            }
            // A file ends at its last filesystem block, so that the next file's first
            // block can follow it in one I/O (the slack after the end of the file is the
            // file's own block, written back as read).
            let unit = md.blksize().max(align);
            let span = md.len().div_ceil(unit) * unit;
            let mut m = Member::new(fi, path.clone(), md.len(), on.map_or(span, |o| o.span(span)));
            m.inode = Some(super::planner::Inode::of(&md));
            let resumed =
                self.plan.earlier.as_ref().and_then(|e| e.partial.get(&record::key(&id))).filter(|&&at| at < m.span);
            let first = match resumed {
                Some(&at) if start == 0 => {
                    start = at;
                    0
                }
                _ => exts.as_deref().and_then(|e| e.first()).map_or(u64::MAX, |e| e.physical.max(1)),
            };
            files.push((first, m, id));
        }
        files.sort_by_key(|f| f.0);
        let (mut base, mut table) = (0, Vec::new());
        let mut members: Vec<Member> = files
            .into_iter()
            .map(|(_, m, file)| {
                table.push(Placed { base, span: m.span, file });
                base += m.span;
                m
            })
            .collect();
        // The collect reused the larger tuples' allocation: give back the difference
        // (tens of MiB at 100,000 files).
        members.shrink_to_fit();
        (members, table, start)
    }

    /// Writes the run's record, once: what a deferred journal does first.
    fn write_record(&self) -> Box<dyn FnOnce() -> Result<()> + Send> {
        let (path, (header, done)) = (self.plan.record_path.clone(), self.record_header.clone());
        let written = Arc::clone(&self.record_written);
        Box::new(move || {
            if written.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            record::write(&path, &header, done.iter())?;
            written.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
    }

    /// One device's cost added to the run's.
    fn add_cost(&mut self, w: crate::measure::passes::WriteCost, dev: &crate::host::device::BlockDeviceInfo) {
        let drive = dev.parent_disk.clone().unwrap_or_else(|| dev.identity.name.clone());
        let (total, same) = match self.cost.take() {
            Some((t, d)) => (Some(t), d == drive),
            None => (None, true),
        };
        self.cost = Some((crate::measure::passes::add_cost(total, w, same), drive));
    }

    /// What one filesystem's guardian freezes and every window checks: nothing else may
    /// write its device (a raw writer bypasses the freeze).
    fn guarded<'g>(&self, g: &'g FsGroup, d: &Device<'g>, members: &[Member]) -> sequence::Guarded<'g>
    where
        'a: 'g,
    {
        let plan: &'a FilesPlan = self.plan;
        sequence::Guarded {
            device: d.info,
            filesystems: std::slice::from_ref(&g.fs),
            max_freeze: plan.options.max_freeze(),
            placement: Some(&plan.placement),
            writer_devices: d.info.devices_sharing_bytes(&Sysfs::default()),
            shape: d.shape,
            // As the members were stat'ed: no second pass over every file.
            swap_among: Some(members.iter().filter_map(|m| m.inode.as_ref()).map(|i| i.id()).collect()),
            wrote_before: self.record_written.load(std::sync::atomic::Ordering::Relaxed),
            btrfs_mount: d.devid.map(|_| g.fs.mount_point.as_path()),
        }
    }

    /// The engine's configuration for the files of one filesystem, laid end to end in
    /// `[0, range_end)`.
    fn config(
        &self,
        g: &FsGroup,
        dev: &crate::host::device::BlockDeviceInfo,
        members: &[Member],
        start: u64,
        range_end: u64,
    ) -> EngineConfig {
        if start > 0 {
            log::info!(
                "{}: resuming at {} of {}",
                members[0].path.display(),
                human_bytes(start),
                human_bytes(members[0].span)
            );
        }
        let state_dir = &self.plan.state.path;
        let span = sequence::Span {
            chunk_size: self.plan.options.run.chunk_size.bytes(),
            range: (0, range_end),
            start_offset: start,
            journal_on_frozen_fs: crate::host::state_dir::on_frozen(state_dir, std::slice::from_ref(&g.fs)),
        };
        let files = members.iter().map(|m| (m.base, m.span, m.path.display().to_string())).collect();
        sequence::engine_config(&self.plan.options, span, Some(sequence::rescue_to(state_dir.clone(), dev, files)))
    }

    /// After a filesystem's run: its figures into the totals, and each file's report
    /// (done when the run finished, or its cursor went past the whole file).
    /// A btrfs member's run before the last (`last` false) merges into the reports and
    /// counts no file finished.
    fn settle(&mut self, members: &[Member], start: u64, stats: &EngineStats, finished: bool, last: bool) {
        add(&mut self.totals, stats);
        // Where each file's report is, if it has one (a btrfs member's run before):
        // looked up, not searched, for a run of a hundred thousand files.
        let mut at: HashMap<usize, usize> = self.reports.iter().enumerate().map(|(k, (i, _))| (*i, k)).collect();
        for m in members {
            let done = finished || m.base + m.span <= stats.next_offset_bytes;
            let mut r = member_report(m, start, done, !self.plan.options.run.no_verify);
            if let Some((first, last)) = m.windows {
                let own = stats.window_seconds.get(first as usize - 1..last as usize).unwrap_or(&[]);
                r.windows = last + 1 - first;
                r.longest_freeze_seconds = own.iter().copied().fold(0.0, f64::max);
            }
            if let Some(why) = &m.skipped {
                log::warn!("{}: skipped: {why}", m.path.display());
            }
            self.files_done += usize::from(done && last);
            match at.get(&m.index) {
                Some(&k) => merge(&mut self.reports[k].1, r),
                None => {
                    at.insert(m.index, self.reports.len());
                    self.reports.push((m.index, r));
                }
            }
        }
        self.finished.store(self.files_done, std::sync::atomic::Ordering::SeqCst);
        self.progress.set_message(format!("{} of {} files", self.files_done, self.files_total));
    }

    /// The files of filesystem `gi` to rewrite; those left alone (`--only-slow`) and
    /// those the resumed run finished get their report here.
    fn todo(&mut self, gi: usize) -> Vec<usize> {
        let planned = &self.plan.planned;
        let mut todo = Vec::new();
        for fi in (0..planned.len()).filter(|&fi| planned[fi].fs == gi) {
            let size = std::fs::metadata(&planned[fi].path).map(|m| m.len()).ok();
            let why = if size == Some(0) { Some(EMPTY.to_string()) } else { self.plan.left_alone.get(&fi).cloned() };
            let Some(why) = why else {
                todo.push(fi);
                continue;
            };
            let mut fr = skipped_report(&planned[fi].path, "");
            (fr.skipped_reason, fr.left_alone, fr.size_bytes) = (None, Some(why), size.unwrap_or(0));
            self.reports.push((fi, fr));
        }
        todo.retain(|&fi| match self.plan.done_before.get(&fi) {
            Some(&size) => {
                let mut fr = skipped_report(&planned[fi].path, "");
                (fr.skipped_reason, fr.size_bytes, fr.done_earlier) = (None, size, true);
                fr.verification =
                    if self.plan.options.run.no_verify { Verification::Off } else { Verification::Passed };
                self.reports.push((fi, fr));
                false
            }
            None => true,
        });
        todo
    }

    /// After the last filesystem: the record removed when nothing is left unfinished,
    /// the benchmark after, and the report's figures.
    pub(super) fn finish(self, mut outcome: Result<()>, measured: &[&Path], report: &mut Report) -> Result<()> {
        // Finished, or refused before anything was written: no unfinished run to leave
        // behind (a resumed run's record stays: it still lists what was done). Only a
        // record this run wrote goes: one it did not write is another run's.
        let wrote_record = self.record_written.load(std::sync::atomic::Ordering::SeqCst);
        let refused_untouched = matches!(outcome, Err(Error::Refused { .. }))
            && self.totals.bytes_written == 0
            && self.plan.earlier.is_none()
            && wrote_record;
        if outcome.is_ok() || refused_untouched {
            record::remove(&self.plan.record_path);
        }
        if self.plan.options.run.bench && outcome.is_ok() {
            outcome = super::bench_after(&self.plan.options, self.stop, measured, report);
        }
        report.warnings.extend(self.findings);
        report.results = Some(self.totals);
        report.write_cost = self.cost.map(|c| c.0);
        // In path order, whatever order the runs took.
        let mut reports = self.reports;
        reports.sort_by_key(|(fi, _)| *fi);
        report.files = Some(reports.into_iter().map(|(_, r)| r).collect());
        outcome
    }
}

/// What one device would be to the run: its info and shape, its btrfs devid, and the
/// progress to reach when it is the filesystem's last.
struct Device<'a> {
    info: &'a crate::host::device::BlockDeviceInfo,
    shape: &'a crate::host::shape::Shape,
    devid: Option<u64>,
    goal: Option<u64>,
}

/// A file's report from a btrfs member's run, merged into the one from the member
/// before: the bytes of both, and finished only when both are.
fn merge(earlier: &mut FileReport, r: FileReport) {
    earlier.bytes_rewritten += r.bytes_rewritten;
    earlier.windows += r.windows;
    earlier.longest_freeze_seconds = earlier.longest_freeze_seconds.max(r.longest_freeze_seconds);
    earlier.bytes_skipped_holes = 0;
    if earlier.skipped_reason.is_none() {
        earlier.skipped_reason = r.skipped_reason;
    }
    if r.verification == Verification::Incomplete {
        earlier.verification = Verification::Incomplete;
    }
}

/// Sums the figures of the filesystems' runs.
fn add(t: &mut EngineStats, s: &EngineStats) {
    t.rewrite_seconds += s.rewrite_seconds;
    t.bytes_read += s.bytes_read;
    t.bytes_written += s.bytes_written;
    t.bytes_verified += s.bytes_verified;
    t.chunks_written += s.chunks_written;
    t.bytes_read_ahead_dropped += s.bytes_read_ahead_dropped;
    t.windows += s.windows;
    t.windows_overrun += s.windows_overrun;
    t.longest_freeze_seconds = t.longest_freeze_seconds.max(s.longest_freeze_seconds);
    t.total_frozen_seconds += s.total_frozen_seconds;
    let (a, b) = (&mut t.stages, &s.stages);
    a.read += b.read;
    a.hash += b.hash;
    a.permit += b.permit;
    a.write += b.write;
    a.read_back += b.read_back;
    a.writer_waiting += b.writer_waiting;
}

/// What the run did to one file. `start` is where the first file resumed from.
fn member_report(m: &Member, start: u64, done: bool, verify: bool) -> FileReport {
    let resumed_from = start.saturating_sub(m.base).min(m.span);
    let accounted = resumed_from + m.bytes_rewritten + m.bytes_unwritten + m.bytes_shared_elsewhere;
    FileReport {
        path: m.path.display().to_string(),
        size_bytes: m.size,
        extents: m.extents,
        bytes_rewritten: m.bytes_rewritten,
        bytes_skipped_unwritten: m.bytes_unwritten,
        bytes_skipped_shared: m.bytes_shared_elsewhere,
        // Whatever of a finished file is neither rewritten nor otherwise skipped is a hole.
        bytes_skipped_holes: if done && m.skipped.is_none() { m.span.saturating_sub(accounted) } else { 0 },
        skipped_reason: m.skipped.clone(),
        resumed_from_bytes: resumed_from,
        verification: match (done, verify) {
            (true, true) => Verification::Passed,
            (true, false) => Verification::Off,
            (false, _) => Verification::Incomplete,
        },
        ..FileReport::default()
    }
}

pub(super) fn skipped_report(path: &Path, why: &str) -> FileReport {
    FileReport {
        path: path.display().to_string(),
        skipped_reason: Some(why.into()),
        verification: Verification::Off,
        ..FileReport::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(base: u64, span: u64) -> Member {
        let mut m = Member::new(0, "/f".into(), span - 100, span);
        m.base = base;
        m
    }

    #[test]
    fn a_finished_file_accounts_for_every_byte_the_rest_is_holes() {
        let mut m = member(1 << 20, 1 << 20);
        (m.bytes_rewritten, m.bytes_unwritten, m.bytes_shared_elsewhere) = (600 << 10, 100 << 10, 100 << 10);
        let r = member_report(&m, 0, true, true);
        assert_eq!(r.bytes_skipped_holes, 224 << 10);
        assert_eq!(r.verification, Verification::Passed);
        // Resumed 64 KiB into this file: those bytes were the last run's.
        let r = member_report(&m, (1 << 20) + (64 << 10), true, false);
        assert_eq!(
            (r.resumed_from_bytes, r.bytes_skipped_holes, r.verification),
            (64 << 10, 160 << 10, Verification::Off)
        );
        // Not done: no holes claimed, and not verified yet.
        let r = member_report(&m, 0, false, true);
        assert_eq!((r.bytes_skipped_holes, r.verification), (0, Verification::Incomplete));
    }

    #[test]
    fn the_totals_add_every_figure_and_keep_the_longest_freeze() {
        let one = EngineStats {
            bytes_written: 10,
            windows: 2,
            longest_freeze_seconds: 0.5,
            total_frozen_seconds: 0.7,
            ..EngineStats::default()
        };
        let two = EngineStats { longest_freeze_seconds: 0.3, total_frozen_seconds: 0.3, ..one.clone() };
        let mut t = EngineStats::default();
        add(&mut t, &one);
        add(&mut t, &two);
        assert_eq!((t.bytes_written, t.windows), (20, 4));
        assert_eq!((t.longest_freeze_seconds, t.total_frozen_seconds), (0.5, 1.0));
    }
}
