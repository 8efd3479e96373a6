//! File mode on btrfs: each file extent's btrfs logical range (what FIEMAP gives) mapped
//! through the chunk tree to every copy of it, and each copy rewritten on its own device.
//!
//! One engine run rewrites the copies on one member device (each run has its own
//! device, journal, rescue copies and guardian, as on any other filesystem; the
//! filesystem is frozen in each window of each run). In that run's virtual address
//! space a file's copies on the device (two with DUP, else one) are interleaved in
//! units of one chunk: copy 0 of the file's first unit, copy 1 of it, copy 0 of the
//! second... so both copies of a unit are rewritten in the same window, and compared
//! there. Every write's bytes are compared with every other copy of them, on this device
//! or another (read, never written, by [`Mirrors`]): a difference is a finding to report,
//! never something reseq "fixes"; each copy is written back with its own bytes.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::engine::target::{DirectDevice, DirectReader, ReadTarget};
use crate::host::btrfs::{self, Layout};
use crate::support::error::{Error, Result};

use super::extents::{Extent, push_merged};
use super::lock;

/// The chunk map, read again in every window.
pub(crate) type SharedLayout = Arc<Mutex<Layout>>;

/// One engine run's device of a btrfs.
pub(crate) struct OnDevice {
    /// The mount point, open: what the tree searches and status ioctls go through.
    pub(crate) fd: OwnedFd,
    pub(crate) mount: PathBuf,
    pub(crate) devid: u64,
    /// Copies of a byte this device can hold (DUP: 2; otherwise 1).
    pub(crate) copies: u64,
    /// The interleaving unit (the chunk size).
    pub(crate) unit: u64,
    pub(crate) layout: SharedLayout,
    /// The descriptor the run writes, checked at every window to be this member.
    pub(crate) device: Option<Arc<DirectDevice>>,
    /// The plan's member set ([`Layout::member_set`]).
    pub(crate) planned: (u64, Vec<(u64, [u8; 16])>),
}

impl OnDevice {
    /// A file's span in the run's virtual space, from its span in the file.
    pub(crate) fn span(&self, file_span: u64) -> u64 {
        if self.copies == 1 { file_span } else { file_span.div_ceil(self.unit) * self.unit * self.copies }
    }

    /// Where file offset `x`, copy `c`, lies in the file's virtual span.
    fn virt(&self, x: u64, c: u64) -> u64 {
        if self.copies == 1 {
            return x;
        }
        x / self.unit * self.unit * self.copies + c * self.unit + x % self.unit
    }

    /// The file offset to map from for virtual offset `local` (the start of its unit).
    pub(crate) fn file_offset(&self, local: u64) -> u64 {
        if self.copies == 1 { local } else { local / (self.unit * self.copies) * self.unit }
    }

    /// The pieces of a file (file offsets, btrfs logical addresses) as this device's
    /// copies of them, at or after virtual offset `local`, in virtual order. Err (the
    /// file is skipped with it) where a range is in no data chunk or in RAID5/6.
    pub(crate) fn on_device(&self, pieces: &[Extent], local: u64) -> std::result::Result<Vec<Extent>, String> {
        let layout = lock(&self.layout);
        let mut out = Vec::new();
        for p in pieces {
            let copies = layout.map(p.physical, p.len)?;
            if let Some(c) = copies.iter().find(|c| layout.member(c.devid).is_none()) {
                return Err(format!(
                    "btrfs logical {} has a copy on devid {}, which is no member reseq planned",
                    c.logical, c.devid
                ));
            }
            for (copy, c) in Layout::ranked_on(&copies, self.devid) {
                if copy >= self.copies {
                    return Err(format!("more copies on devid {} than the run planned", self.devid));
                }
                self.split(p.logical + (c.logical - p.physical), c, copy, local, &mut out);
            }
        }
        out.sort_by_key(|e| e.logical);
        let mut merged = Vec::with_capacity(out.len());
        out.into_iter().for_each(|e| push_merged(&mut merged, e));
        Ok(merged)
    }

    /// One copy of a piece at file offset `x0`, split at unit boundaries, into `out`.
    fn split(&self, x0: u64, c: &btrfs::Piece, copy: u64, local: u64, out: &mut Vec<Extent>) {
        let (mut x, end) = (x0, x0 + c.len);
        while x < end {
            let step = if self.copies > 1 { (self.unit - x % self.unit).min(end - x) } else { end - x };
            let v = self.virt(x, copy);
            if v + step > local {
                let skip = local.saturating_sub(v);
                let d = x - x0 + skip;
                out.push(Extent {
                    logical: v + skip,
                    physical: c.physical + d,
                    len: step - skip,
                    source: Some(c.logical + d),
                });
            }
            x += step;
        }
    }

    /// At the start of every window, frozen: the member set must be the plan's, btrfs's
    /// own writers refuse the window, the descriptor the run writes must still be its
    /// member, and the chunk map is read again (only a balance or a device operation
    /// moves chunks, and those are refused; new chunks appear as files grow).
    pub(crate) fn window(&self) -> Result<()> {
        let layout = Layout::read(self.fd.as_fd())?;
        self.same_members(&layout)?;
        btrfs::refuse_own_writers(self.fd.as_fd(), &layout, &self.mount)?;
        let member = layout.member(self.devid).ok_or_else(|| Error::Internal("a planned member went".into()))?;
        if let Some(dev) = &self.device {
            btrfs::check_member(&layout, member, dev.as_ref())?;
        }
        *lock(&self.layout) = layout;
        Ok(())
    }

    /// A device added, removed or replaced since the plan stops the run before its next
    /// write (exit 4, as a device that changed shape): copies on a device the plan does
    /// not know would be left out, and the operation relocates chunks.
    fn same_members(&self, now: &Layout) -> Result<()> {
        if now.member_set() == self.planned {
            return Ok(());
        }
        let planned: Vec<String> = self.planned.1.iter().map(|(d, _)| d.to_string()).collect();
        Err(Error::io(
            format!(
                "the btrfs at {} changed its devices since the run was planned: {} device(s), devids {} then; {} device(s) now: {}. Copies on a device the plan does not know would not be rewritten; reseq stopped before writing more (every chunk it wrote was verified). Let the device operation finish (btrfs device usage, btrfs balance status), then run again with --resume",
                self.mount.display(),
                self.planned.0,
                planned.join(", "),
                now.num_devices,
                now.member_names()
            ),
            std::io::Error::from_raw_os_error(nix::libc::EBUSY),
        ))
    }
}

/// Compares each write's bytes with the other copies of them.
pub(crate) struct Mirrors {
    pub(crate) devid: u64,
    pub(crate) layout: SharedLayout,
    /// The other member devices, read-only.
    pub(crate) readers: HashMap<u64, DirectReader>,
    pub(crate) mem_align: usize,
    /// What differed or could not be read, in words.
    pub(crate) findings: Arc<Mutex<Vec<String>>>,
}

impl Mirrors {
    /// Reads every other copy of the bytes `buf` at btrfs logical `source` (on this
    /// device at `at`) and notes any that differs. Never writes.
    pub(crate) fn compare(&self, dev: &DirectDevice, buf: &[u8], source: u64, at: u64) {
        let Ok(pieces) = lock(&self.layout).map(source, buf.len() as u64) else { return };
        for p in pieces {
            let off = (p.logical - source) as usize;
            if p.devid == self.devid && p.physical == at + off as u64 {
                continue;
            }
            let mut copy = crate::sys::memory::AlignedBuf::new(p.len as usize, self.mem_align);
            let read = match self.readers.get(&p.devid) {
                _ if p.devid == self.devid => dev.read_at(&mut copy, p.physical),
                Some(r) => r.read_at(&mut copy, p.physical),
                None => Err(std::io::Error::other(format!("devid {} is no member the run planned", p.devid))),
            };
            let finding = match read {
                Ok(()) if copy[..] == buf[off..off + p.len as usize] => continue,
                Ok(()) => "differs from",
                Err(_) => "could not be read to compare with",
            };
            let here = at + off as u64;
            let note = format!(
                "btrfs logical {}+{}: the copy on devid {} at {} {finding} the copy on devid {} at {here} (reseq wrote each copy back as it was)",
                p.logical, p.len, p.devid, p.physical, self.devid
            );
            log::warn!("{note}");
            lock(&self.findings).push(note);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::btrfs::{Chunk, Stripe};
    use crate::sys;

    fn on(devid: u64, copies: u64, chunk: Chunk) -> OnDevice {
        let fd = std::fs::File::open("/").unwrap().into();
        let members = chunk
            .stripes
            .iter()
            .map(|s| btrfs::Member { devid: s.devid, path: "/dev/null".into(), dev: (1, 3), size: 0, uuid: [0; 16] })
            .collect();
        let layout = Arc::new(Mutex::new(Layout { chunks: vec![chunk], members, ..Layout::default() }));
        OnDevice { fd, mount: "/".into(), devid, copies, unit: 1 << 20, layout, device: None, planned: (0, Vec::new()) }
    }

    fn chunk(flags: u64, stripes: &[(u64, u64)]) -> Chunk {
        Chunk {
            logical: 1 << 30,
            length: 64 << 20,
            stripe_len: 1 << 16,
            flags: sys::btrfs::BTRFS_BLOCK_GROUP_DATA | flags,
            sub_stripes: 1,
            stripes: stripes.iter().map(|&(devid, offset)| Stripe { devid, offset }).collect(),
        }
    }

    const M: u64 = 1 << 20;

    #[test]
    fn dup_interleaves_both_copies_unit_by_unit() {
        let d = on(1, 2, chunk(sys::btrfs::BTRFS_BLOCK_GROUP_DUP, &[(1, 10 * M), (1, 100 * M)]));
        assert_eq!(d.span(3 * M / 2), 4 * M);
        // 1.5 MiB of file at btrfs logical 1 GiB + 1 MiB.
        let piece = [Extent { logical: 0, physical: (1 << 30) + M, len: 3 * M / 2, source: None }];
        let got = d.on_device(&piece, 0).unwrap();
        let want = vec![
            Extent { logical: 0, physical: 11 * M, len: M, source: Some((1 << 30) + M) },
            Extent { logical: M, physical: 101 * M, len: M, source: Some((1 << 30) + M) },
            Extent { logical: 2 * M, physical: 12 * M, len: M / 2, source: Some((1 << 30) + 2 * M) },
            Extent { logical: 3 * M, physical: 102 * M, len: M / 2, source: Some((1 << 30) + 2 * M) },
        ];
        assert_eq!(got, want);
        // From the second copy of the first unit on: that one and the rest.
        assert_eq!(d.file_offset(M + 4096), 0);
        let got = d.on_device(&piece, M + 4096).unwrap();
        assert_eq!(
            got[0],
            Extent { logical: M + 4096, physical: 101 * M + 4096, len: M - 4096, source: Some((1 << 30) + M + 4096) }
        );
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn raid1_gives_each_device_its_own_copy() {
        let c = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_RAID1, &[(1, 10 * M), (2, 30 * M)]);
        let piece = [Extent { logical: 8192, physical: (1 << 30) + 4096, len: 3 * M, source: None }];
        for (devid, at) in [(1, 10 * M), (2, 30 * M)] {
            let got = on(devid, 1, c.clone()).on_device(&piece, 0).unwrap();
            assert_eq!(
                got,
                vec![Extent { logical: 8192, physical: at + 4096, len: 3 * M, source: Some((1 << 30) + 4096) }]
            );
        }
        let r5 = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_RAID5, &[(1, 0), (2, 0), (3, 0)]);
        assert!(on(1, 1, r5).on_device(&piece, 0).unwrap_err().contains("parity"));
    }
}
