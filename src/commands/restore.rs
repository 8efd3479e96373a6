//! `reseq restore RESCUE_FILE`: puts a rescue copy's bytes back where they came from.
//!
//! The same care as any rewrite: the device must be the one the copy came from, nobody
//! else may be writing it, mounted filesystems on it are frozen around the write (by a
//! guardian, with the same bound), the write is read back and checked, and the copy is
//! removed only then. It writes only over what reseq left there, unless `--force`:
//! anything else means another writer has been there since, and restoring would
//! overwrite its data.

use std::path::Path;

use serde::Serialize;

use crate::engine::guard::{NoFreeze, WindowGuard};
use crate::engine::rescue::{self, RescueHeader};
use crate::engine::target::BlockTarget;
use crate::host::device::{self, BlockDeviceInfo, Sysfs};
use crate::host::freeze::GuardedFreeze;
use crate::host::mounts::{self, MountedFs};
use crate::options::restore::RestoreOptions;
use crate::support::error::{Error, LeftState, Result};
use crate::sys::memory::AlignedBuf;

/// What `reseq restore` did.
#[derive(Debug, Serialize)]
pub(crate) struct RestoreSummary {
    pub(crate) rescue_file: String,
    pub(crate) device: String,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// `restored`, `already_intact` or `forgotten`.
    pub(crate) outcome: String,
    pub(crate) frozen_filesystems: Vec<String>,
}

impl RestoreSummary {
    pub(crate) fn to_text(&self) -> String {
        let frozen = (!self.frozen_filesystems.is_empty())
            .then(|| format!(", with {} frozen for the write", self.frozen_filesystems.join(", ")));
        let what = match self.outcome.as_str() {
            "restored" => format!(
                "restored {} bytes at offset {} of {} (read back and checked){}",
                self.len,
                self.offset,
                self.device,
                frozen.unwrap_or_default()
            ),
            "already_intact" => format!(
                "{} already holds these {} bytes at offset {} (checked): nothing to write",
                self.device, self.len, self.offset
            ),
            _ => "dropped the rescue copy without writing anything".into(),
        };
        format!("{what}; removed {}\n", self.rescue_file)
    }
}

pub(crate) fn run(o: &RestoreOptions) -> Result<RestoreSummary> {
    let (h, data) = rescue::load(&o.rescue)?;
    let mut summary = RestoreSummary {
        rescue_file: o.rescue.display().to_string(),
        device: h.device_path.clone(),
        offset: h.offset,
        len: h.len,
        outcome: "forgotten".into(),
        frozen_filesystems: Vec::new(),
    };
    if o.forget {
        rescue::remove(&o.rescue)?;
        return Ok(summary);
    }
    crate::host::privileges::check()?;
    let sysfs = Sysfs::default();
    let path = o.device.clone().unwrap_or_else(|| h.device_path.clone().into());
    summary.device = path.display().to_string();
    let dev = device::inspect(&path, &sysfs)?;
    // No rewrite (nor another restore) of this device meanwhile.
    let dir = o.rescue.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let _lock = check_device(&dev, &h, &sysfs, dir, &path)?;
    let entries = mounts::read_mounts().map_err(|e| Error::io("reading /proc/self/mountinfo", e))?;
    let filesystems = mounts::filesystems_on(&entries, &dev.devices_to_freeze());
    let target = crate::rewrite::sequence::open_device(&dev, !filesystems.is_empty())?;
    if rescue::device_holds(&target, h.offset, h.len, &h.blake3)? {
        rescue::remove(&o.rescue)?;
        summary.outcome = "already_intact".into();
        return Ok(summary);
    }
    refuse_if_changed(&target, &h, o.force)?;
    summary.frozen_filesystems = filesystems.iter().map(|f| f.mount_point.display().to_string()).collect();
    write_guarded(filesystems, &target, &h, &data, o)?;
    rescue::remove(&o.rescue)?;
    summary.outcome = "restored".into();
    Ok(summary)
}

/// The device must be the one the copy came from, writable, and not written by anyone
/// else; the lock returned keeps other runs of reseq off it.
fn check_device(
    dev: &BlockDeviceInfo,
    h: &RescueHeader,
    sysfs: &Sysfs,
    dir: &Path,
    path: &Path,
) -> Result<crate::host::state_dir::DeviceLock> {
    if !dev.identity.same_device(&h.identity) {
        return Err(Error::refused(
            format!(
                "{} is not the device this copy came from: {}",
                h.device_path,
                dev.identity.changes_since(&h.identity)
            ),
            "name the same device where it is now with --device (loop and NVMe numbers can change between boots)",
        ));
    }
    let lock = crate::host::state_dir::lock_device(dir, &dev.identity.name, &path.display().to_string())?;
    if dev.read_only {
        return Err(Error::refused(format!("{} is read-only", h.device_path), "make it writable (blockdev --setrw)"));
    }
    crate::host::writers::refuse_other_writers(&dev.path, &dev.devices_sharing_bytes(sysfs))?;
    // A recovery is not refused for what the scan cannot see, only told of it.
    if let Some(blind) = crate::host::writers::refuse_uninspected(true)? {
        log::warn!("{blind}");
    }
    Ok(lock)
}

/// The write, with the filesystems on the device (if any) frozen by a guardian.
fn write_guarded(
    filesystems: Vec<MountedFs>,
    target: &dyn BlockTarget,
    h: &RescueHeader,
    data: &[u8],
    o: &RestoreOptions,
) -> Result<()> {
    let mut guard: Box<dyn WindowGuard> = if filesystems.is_empty() {
        Box::new(NoFreeze)
    } else {
        let placement = crate::host::cgroup::plan_or_refuse(o.accept_cgroup_risk)?;
        Box::new(GuardedFreeze::start(filesystems, o.max_freeze, &placement)?)
    };
    let mut buf = AlignedBuf::new(h.len as usize, target.mem_align());
    buf[..h.len as usize].copy_from_slice(data);
    write_frozen(guard.as_mut(), target, h, &buf, o)
}

/// Refuses unless the device holds what reseq left there (or `force`).
fn refuse_if_changed(target: &dyn BlockTarget, h: &RescueHeader, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    let now = rescue::range_hash(target, h.offset, h.len)?.to_hex().to_string();
    if h.left_blake3.as_deref() == Some(now.as_str()) {
        return Ok(());
    }
    let (end, left) = (h.offset + h.len, h.left_blake3.as_deref().unwrap_or("an unreadable range"));
    Err(Error::refused(
        format!(
            "device bytes {}..{end} of {} changed since reseq stopped (blake3 now {now}, reseq left {left}): something else wrote there, and restoring would overwrite it",
            h.offset, h.device_path
        ),
        "find out what wrote there (the filesystem's own check, the application's); restore with --force if the copy is still what belongs there, or drop it with --forget",
    ))
}

/// The restored bytes read back as the rescue copy's hash says.
fn read_back_matches(h: &RescueHeader, back: &[u8], kept: String) -> Result<()> {
    let after = blake3::hash(back);
    if after.to_hex().as_str() == h.blake3 {
        return Ok(());
    }
    Err(Error::ChecksumMismatch {
        offset: h.offset,
        len: h.len,
        before: h.blake3.clone(),
        after: after.to_hex().to_string(),
        differ: "the restored bytes did not read back as written".into(),
        rescue: Some(kept),
        at_risk: None,
    })
}

/// One window: freeze, check again, write, read back, thaw, flush.
fn write_frozen(
    guard: &mut dyn WindowGuard,
    target: &dyn BlockTarget,
    h: &RescueHeader,
    buf: &AlignedBuf,
    o: &RestoreOptions,
) -> Result<()> {
    let force = o.force;
    let len = h.len as usize;
    guard.begin()?;
    // Frozen now: what is there cannot change under us any more; check it again.
    let outcome = refuse_if_changed(target, h, force).and_then(|()| {
        if !guard.may_write()? {
            return Err(Error::refused(
                "the freeze window ended before the restore could write (was reseq restore stopped or stalled?): nothing was written, the rescue copy is kept",
                "run reseq restore again",
            ));
        }
        let wrote = target.write_at(&buf[..len], h.offset);
        let mut back = AlignedBuf::new(len, target.mem_align());
        let read = target.read_at(&mut back[..len], h.offset);
        guard.wrote()?;
        let kept =
            format!("The rescue copy {} is kept; run restore again once the device works", o.rescue.display());
        match (wrote, read) {
            (Err(e), r) => {
                let original = blake3::Hash::from_hex(&h.blake3).map_err(|e| Error::Internal(e.to_string()))?;
                let left = LeftState::of(r.ok().map(|()| blake3::hash(&back[..len])), &original);
                Err(Error::WriteFailed {
                    offset: h.offset,
                    len: h.len,
                    attempts: 1,
                    cause: e,
                    left,
                    rescue: Some(kept),
                })
            }
            (Ok(()), Err(e)) => Err(Error::io_at("reading back the restored bytes", h.offset, e)),
            (Ok(()), Ok(())) => read_back_matches(h, &back[..len], kept),
        }
    });
    let end = guard.end();
    outcome?;
    end?;
    target.flush().map_err(|e| Error::io_at("flushing the device's write cache", h.offset, e))
}
