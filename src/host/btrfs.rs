//! A mounted btrfs as reseq sees it: its chunk tree (which logical range lies where, on
//! which devices, in how many copies), its member devices, the space allocated on each
//! (the device tree), and its own writers (scrub, balance, device replace).
//!
//! Why: FIEMAP on btrfs gives btrfs *logical* addresses. A logical range lives in one
//! chunk, whose profile says where its bytes are: one place (single), two on one device
//! (DUP), N on N devices (RAID1, RAID1C3/4), striped in `stripe_len` pieces over the
//! devices (RAID0) or over mirrored pairs (RAID10). Every copy is rewritten, each on its
//! own device. RAID5/6 are refused: their parity is computed over several devices'
//! stripes, and a chunk of one stripe rewritten alone is only safe if the parity
//! matches, which reseq cannot check (and a partial stripe write is btrfs's write hole).
//!
//! Everything here is read through read-only ioctls on an open directory of the
//! filesystem, and works while it is frozen (the tree search reads the trees in memory).

use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use crate::support::error::{Error, Result};
use crate::sys;

/// One stripe of a chunk: a device and where the stripe starts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stripe {
    pub(crate) devid: u64,
    pub(crate) offset: u64,
}

/// One chunk: `length` bytes of the logical address space from `logical`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) logical: u64,
    pub(crate) length: u64,
    pub(crate) stripe_len: u64,
    /// `BTRFS_BLOCK_GROUP_*`: its type (data, metadata, system) and profile.
    pub(crate) flags: u64,
    pub(crate) sub_stripes: u16,
    pub(crate) stripes: Vec<Stripe>,
}

/// A chunk's profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Profile {
    Single,
    Dup,
    Raid0,
    Raid1,
    Raid1c3,
    Raid1c4,
    Raid10,
    Raid5,
    Raid6,
}

impl Profile {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Profile::Single => "single",
            Profile::Dup => "DUP",
            Profile::Raid0 => "RAID0",
            Profile::Raid1 => "RAID1",
            Profile::Raid1c3 => "RAID1C3",
            Profile::Raid1c4 => "RAID1C4",
            Profile::Raid10 => "RAID10",
            Profile::Raid5 => "RAID5",
            Profile::Raid6 => "RAID6",
        }
    }

    /// Why the profile is not rewritten, if it is not.
    pub(crate) fn refused(self) -> Option<String> {
        matches!(self, Profile::Raid5 | Profile::Raid6).then(|| {
            format!(
                "{}: its parity is computed over the stripes of several devices, and a rewrite of one stripe is only safe while the parity matches it, which reseq cannot check",
                self.name()
            )
        })
    }
}

/// One copy of a piece of the logical address space: `len` bytes at `logical` lie on
/// device `devid` at `physical`; `copy` numbers the copies of that piece (0..copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub(crate) logical: u64,
    pub(crate) len: u64,
    pub(crate) copy: usize,
    pub(crate) devid: u64,
    pub(crate) physical: u64,
}

impl Chunk {
    /// Parses a chunk item (`struct btrfs_chunk`, little-endian, 48 bytes and 32 per
    /// stripe) whose key offset is `logical`.
    pub(crate) fn parse(logical: u64, d: &[u8]) -> Option<Chunk> {
        let u64_at = |i: usize| Some(u64::from_le_bytes(d.get(i..i + 8)?.try_into().ok()?));
        let u16_at = |i: usize| Some(u16::from_le_bytes(d.get(i..i + 2)?.try_into().ok()?));
        let num_stripes = u16_at(44)?;
        let stripes = (0..usize::from(num_stripes))
            .map(|i| Some(Stripe { devid: u64_at(48 + 32 * i)?, offset: u64_at(56 + 32 * i)? }))
            .collect::<Option<Vec<_>>>()?;
        Some(Chunk {
            logical,
            length: u64_at(0)?,
            stripe_len: u64_at(16)?.max(1),
            flags: u64_at(24)?,
            sub_stripes: u16_at(46)?.max(1),
            stripes,
        })
    }

    pub(crate) fn profile(&self) -> Profile {
        let f = self.flags;
        match () {
            _ if f & sys::btrfs::BTRFS_BLOCK_GROUP_RAID5 != 0 => Profile::Raid5,
            _ if f & sys::btrfs::BTRFS_BLOCK_GROUP_RAID6 != 0 => Profile::Raid6,
            _ if f & sys::btrfs::BTRFS_BLOCK_GROUP_RAID10 != 0 => Profile::Raid10,
            _ if f & sys::btrfs::BTRFS_BLOCK_GROUP_RAID0 != 0 => Profile::Raid0,
            _ if f & sys::btrfs::BTRFS_BLOCK_GROUP_RAID1C4 != 0 => Profile::Raid1c4,
            _ if f & sys::btrfs::BTRFS_BLOCK_GROUP_RAID1C3 != 0 => Profile::Raid1c3,
            _ if f & sys::btrfs::BTRFS_BLOCK_GROUP_RAID1 != 0 => Profile::Raid1,
            _ if f & sys::btrfs::BTRFS_BLOCK_GROUP_DUP != 0 => Profile::Dup,
            _ => Profile::Single,
        }
    }

    pub(crate) fn is_data(&self) -> bool {
        self.flags & sys::btrfs::BTRFS_BLOCK_GROUP_DATA != 0
    }

    /// What the chunk holds: "data", "metadata", "system" (or several).
    pub(crate) fn kind(&self) -> String {
        let names = [
            (sys::btrfs::BTRFS_BLOCK_GROUP_DATA, "data"),
            (sys::btrfs::BTRFS_BLOCK_GROUP_METADATA, "metadata"),
            (sys::btrfs::BTRFS_BLOCK_GROUP_SYSTEM, "system"),
        ];
        names.iter().filter(|(f, _)| self.flags & f != 0).map(|(_, n)| *n).collect::<Vec<_>>().join("+")
    }

    /// How many copies of each byte the chunk keeps.
    pub(crate) fn copies(&self) -> usize {
        match self.profile() {
            Profile::Single | Profile::Raid0 => 1,
            Profile::Raid10 => usize::from(self.sub_stripes),
            Profile::Raid5 | Profile::Raid6 => 1,
            _ => self.stripes.len(),
        }
    }

    /// Every copy of `[logical, logical + len)` (inside this chunk), in logical order,
    /// each piece within one stripe. Err for a profile that is not rewritten.
    pub(crate) fn map(&self, logical: u64, len: u64) -> std::result::Result<Vec<Piece>, String> {
        let profile = self.profile();
        if let Some(why) = profile.refused() {
            return Err(why);
        }
        if logical < self.logical || logical + len > self.logical + self.length {
            return Err(format!("{logical}+{len} is not inside the chunk at {}", self.logical));
        }
        let n = self.stripes.len() as u64;
        let mut out = Vec::new();
        let (mut at, end) = (logical - self.logical, logical - self.logical + len);
        while at < end {
            // Mirrored and single profiles keep each copy contiguous: one piece each.
            let (stripe_nr, in_stripe, step) = match profile {
                Profile::Raid0 | Profile::Raid10 => {
                    (at / self.stripe_len, at % self.stripe_len, (self.stripe_len - at % self.stripe_len).min(end - at))
                }
                _ => (0, at, end - at),
            };
            let targets: Vec<(usize, u64)> = match profile {
                Profile::Raid0 => vec![((stripe_nr % n) as usize, stripe_nr / n)],
                Profile::Raid10 => {
                    let sub = u64::from(self.sub_stripes);
                    let factor = (n / sub).max(1);
                    let first = (stripe_nr % factor) * sub;
                    (0..sub).map(|j| ((first + j) as usize, stripe_nr / factor)).collect()
                }
                _ => (0..self.stripes.len()).map(|i| (i, 0)).collect(),
            };
            for (copy, (index, row)) in targets.into_iter().enumerate() {
                let s =
                    self.stripes.get(index).ok_or_else(|| format!("chunk at {} lacks stripe {index}", self.logical))?;
                out.push(Piece {
                    logical: self.logical + at,
                    len: step,
                    copy,
                    devid: s.devid,
                    physical: s.offset + row * self.stripe_len + in_stripe,
                });
            }
            at += step;
        }
        Ok(out)
    }
}

/// A member device of the filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) devid: u64,
    /// The path btrfs opened it by.
    pub(crate) path: PathBuf,
    /// Its block device number.
    pub(crate) dev: (u32, u32),
    pub(crate) size: u64,
    /// Its device uuid (DEV_INFO; its superblock's dev_item.uuid).
    pub(crate) uuid: [u8; 16],
}

/// The chunk tree and the members of a mounted btrfs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Layout {
    /// Ascending by logical address.
    pub(crate) chunks: Vec<Chunk>,
    pub(crate) members: Vec<Member>,
    /// The fsid, as `/sys/fs/btrfs/` names it.
    pub(crate) fsid: String,
    /// FS_INFO's num_devices.
    pub(crate) num_devices: u64,
}

fn ioctl_error(what: &str, e: nix::Error) -> Error {
    Error::io(format!("btrfs {what}"), e.into())
}

impl Layout {
    /// Reads the chunk tree and the members through `fd` (any open file or directory of
    /// the filesystem).
    pub(crate) fn read(fd: BorrowedFd<'_>) -> Result<Layout> {
        let items = sys::btrfs::btrfs_tree_search(
            fd,
            sys::btrfs::BTRFS_CHUNK_TREE,
            (sys::btrfs::BTRFS_FIRST_CHUNK_TREE_OBJECTID, sys::btrfs::BTRFS_FIRST_CHUNK_TREE_OBJECTID),
            sys::btrfs::BTRFS_CHUNK_ITEM_KEY,
        )
        .map_err(|e| ioctl_error("TREE_SEARCH_V2 of the chunk tree", e))?;
        let chunks = items
            .iter()
            .map(|i| Chunk::parse(i.offset, &i.data))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::Internal("a btrfs chunk item shorter than its stripes".into()))?;
        let (devices, fsid, num_devices) =
            sys::btrfs::btrfs_devices(fd).map_err(|e| ioctl_error("FS_INFO / DEV_INFO", e))?;
        let mut members = Vec::new();
        for (devid, path, size, uuid) in devices {
            let dev = crate::host::mounts::block_rdev(&path).ok_or_else(|| {
                Error::refused(
                    format!("btrfs device {devid} ({}) is no block device reseq can open", path.display()),
                    "make sure every member's device node exists (no udev?)",
                )
            })?;
            members.push(Member { devid, path, dev, size, uuid });
        }
        Ok(Layout { chunks, members, fsid: uuid(&fsid), num_devices })
    }

    /// The member set, to compare with the plan's: num_devices and each (devid, uuid).
    pub(crate) fn member_set(&self) -> (u64, Vec<(u64, [u8; 16])>) {
        let mut ids: Vec<(u64, [u8; 16])> = self.members.iter().map(|m| (m.devid, m.uuid)).collect();
        ids.sort();
        (self.num_devices, ids)
    }

    /// The members in words: "devid 1 (/dev/loop0), devid 2 (/dev/loop1)".
    pub(crate) fn member_names(&self) -> String {
        let names: Vec<String> =
            self.members.iter().map(|m| format!("devid {} ({})", m.devid, m.path.display())).collect();
        names.join(", ")
    }

    /// Every copy of `[logical, logical + len)`, across the chunks it spans. Err when
    /// any of it is outside the data chunks, or in a profile that is not rewritten.
    pub(crate) fn map(&self, logical: u64, len: u64) -> std::result::Result<Vec<Piece>, String> {
        let mut out = Vec::new();
        let (mut at, end) = (logical, logical + len);
        while at < end {
            let i = self.chunks.partition_point(|c| c.logical + c.length <= at);
            let c = self
                .chunks
                .get(i)
                .filter(|c| c.logical <= at)
                .ok_or_else(|| format!("btrfs logical address {at} is in no chunk (the chunk tree changed?)"))?;
            if !c.is_data() {
                return Err(format!("btrfs logical address {at} is in a {} chunk, not a data chunk", c.kind()));
            }
            let step = (c.logical + c.length - at).min(end - at);
            out.extend(c.map(at, step)?);
            at += step;
        }
        Ok(out)
    }

    /// The copies among `pieces` (one range's, from [`Layout::map`]) that lie on member
    /// `devid`, each with its rank on that device: 0, and 1 for DUP's second copy.
    pub(crate) fn ranked_on(pieces: &[Piece], devid: u64) -> Vec<(u64, &Piece)> {
        let mut rank: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        pieces
            .iter()
            .filter(|p| p.devid == devid)
            .map(|p| {
                let here = rank.entry(p.logical).or_insert(0);
                *here += 1;
                (*here - 1, p)
            })
            .collect()
    }

    pub(crate) fn member(&self, devid: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.devid == devid)
    }

    /// The data chunks' profiles, each with its count: "RAID1 (3 chunks)".
    pub(crate) fn data_profiles(&self) -> Vec<(Profile, usize)> {
        let mut out: Vec<(Profile, usize)> = Vec::new();
        for c in self.chunks.iter().filter(|c| c.is_data()) {
            match out.iter_mut().find(|(p, _)| *p == c.profile()) {
                Some((_, n)) => *n += 1,
                None => out.push((c.profile(), 1)),
            }
        }
        out.sort();
        out
    }

    /// The most copies any data chunk keeps on one device (DUP: 2).
    pub(crate) fn copies_on_one_device(&self) -> usize {
        let on = |c: &Chunk, d: u64| c.stripes.iter().filter(|s| s.devid == d).count();
        let chunks = self.chunks.iter().filter(|c| c.is_data());
        chunks.flat_map(|c| c.stripes.iter().map(move |s| on(c, s.devid))).max().unwrap_or(1).max(1)
    }

    /// How the data is kept, for the plan: "RAID1 (2 copies of each byte)".
    pub(crate) fn describe(&self) -> String {
        let profiles: Vec<String> = self
            .data_profiles()
            .iter()
            .map(|(p, n)| {
                let copies = self.chunks.iter().find(|c| c.is_data() && c.profile() == *p).map_or(1, Chunk::copies);
                format!(
                    "{} ({n} data chunk(s), {copies} cop{} of each byte)",
                    p.name(),
                    if copies == 1 { "y" } else { "ies" }
                )
            })
            .collect();
        let devices: Vec<String> =
            self.members.iter().map(|m| format!("devid {} {}", m.devid, m.path.display())).collect();
        format!("btrfs data {} on {}", profiles.join(", "), devices.join(", "))
    }
}

/// Whether `a` and `b` are on one btrfs (a subvolume has an st_dev of its own).
pub(crate) fn same_filesystem(a: &Path, b: &Path) -> bool {
    let fsid = |p: &Path| {
        let dir = if p.is_dir() { p } else { p.parent()? };
        let f = std::fs::File::open(dir).ok()?;
        sys::btrfs::btrfs_devices(std::os::fd::AsFd::as_fd(&f)).ok().map(|(_, fsid, _)| fsid)
    };
    fsid(a).is_some_and(|x| Some(x) == fsid(b))
}

fn uuid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// The ranges allocated to chunks on device `devid` (its device extents, tree 4), as
/// (physical offset, length), ascending.
pub(crate) fn dev_extents(fd: BorrowedFd<'_>, devid: u64) -> Result<Vec<(u64, u64)>> {
    let items =
        sys::btrfs::btrfs_tree_search(fd, sys::btrfs::BTRFS_DEV_TREE, (devid, devid), sys::btrfs::BTRFS_DEV_EXTENT_KEY)
            .map_err(|e| ioctl_error("TREE_SEARCH_V2 of the device tree", e))?;
    let len = |d: &[u8]| Some(u64::from_le_bytes(d.get(24..32)?.try_into().ok()?));
    items
        .iter()
        .map(|i| len(&i.data).map(|l| (i.offset, l)))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::Internal("a btrfs device extent item too short".into()))
}

/// What of btrfs's own is writing the filesystem, in words (None: nothing): a scrub on
/// any member, a balance (running, or paused: it resumes by itself at the next mount),
/// a device replace, or another exclusive operation (device add or remove, resize: they
/// relocate chunks through a freeze). Each writes behind the freeze and could move or
/// rewrite the very bytes reseq is rewriting.
pub(crate) fn own_writers(fd: BorrowedFd<'_>, layout: &Layout, sys_root: &Path) -> Result<Option<String>> {
    let mut found = Vec::new();
    for m in &layout.members {
        if sys::btrfs::btrfs_scrub_running(fd, m.devid).map_err(|e| ioctl_error("SCRUB_PROGRESS", e))? {
            found.push(format!("a scrub runs on devid {} ({})", m.devid, m.path.display()));
        }
    }
    match sys::btrfs::btrfs_balance_state(fd).map_err(|e| ioctl_error("BALANCE_PROGRESS", e))? {
        None => {}
        Some(s) if s & sys::btrfs::BTRFS_BALANCE_STATE_RUNNING != 0 => found.push("a balance runs".into()),
        Some(_) => found.push("a balance is paused (it resumes at the next mount or `btrfs balance resume`)".into()),
    }
    match sys::btrfs::btrfs_replace_state(fd).map_err(|e| ioctl_error("DEV_REPLACE status", e))? {
        sys::btrfs::BTRFS_DEV_REPLACE_STATE_STARTED => found.push("a device replace runs".into()),
        sys::btrfs::BTRFS_DEV_REPLACE_STATE_SUSPENDED => {
            found.push("a device replace is suspended (it resumes at the next mount)".into())
        }
        _ => {}
    }
    let op = std::fs::read_to_string(sys_root.join("fs/btrfs").join(&layout.fsid).join("exclusive_operation"));
    if let Ok(op) = op.map(|s| s.trim().to_string())
        && op != "none"
        && !op.starts_with("balance")
        && !op.contains("replace")
    {
        found.push(format!("an exclusive operation is in progress ({op})"));
    }
    Ok((!found.is_empty()).then(|| found.join("; ")))
}

/// Checks that `dev` (opened from member `m`'s path, the very descriptor reseq reads
/// or writes) is that member: a path is only a name, and may point elsewhere now than
/// when btrfs opened it (a symlink changed, a loop device re-attached). Its superblock
/// must name this filesystem, devid and device uuid, and its device number must be one
/// the filesystem holds (`/sys/fs/btrfs/<fsid>/devices/`; a byte copy of a member has
/// its superblock but not its device number). Refused with what it really is.
pub(crate) fn check_member<T>(layout: &Layout, m: &Member, dev: &T) -> Result<()>
where
    T: crate::engine::target::ReadTarget + std::os::fd::AsFd,
{
    let rdev = nix::sys::stat::fstat(dev.as_fd()).map(|s| crate::host::devnum::dev_num(s.st_rdev));
    let mut sb = sys::memory::AlignedBuf::new(sys::btrfs::BTRFS_SUPER_INFO_SIZE, dev.mem_align().max(4096));
    let found =
        match dev.read_at(&mut sb, sys::btrfs::BTRFS_SUPER_INFO_OFFSET) {
            Err(e) => Some(format!("its superblock cannot be read ({e})")),
            Ok(()) => match sys::btrfs::btrfs_super_identity(&sb) {
                None => Some("it holds no btrfs superblock".into()),
                Some((fsid, devid, u)) if uuid(&fsid) != layout.fsid || devid != m.devid || u != m.uuid => Some(
                    format!("its superblock is that of btrfs {} devid {devid} (device uuid {})", uuid(&fsid), uuid(&u)),
                ),
                Some(_) => None,
            },
        };
    let held = held_devices(&layout.fsid);
    let found = found.or_else(|| match rdev {
        Err(e) => Some(format!("its device number cannot be read ({e})")),
        Ok(r) if !held.contains(&r) => Some(format!(
            "it is device {}:{}, which the filesystem does not hold (/sys/fs/btrfs/{}/devices/ lists {})",
            r.0,
            r.1,
            layout.fsid,
            held.iter().map(|(a, b)| format!("{a}:{b}")).collect::<Vec<_>>().join(", ")
        )),
        Ok(_) => None,
    });
    let Some(what) = found else { return Ok(()) };
    Err(Error::refused(
        format!(
            "btrfs devid {} of {} is not the device at {} that reseq opened: {what}. The path no longer leads to the device btrfs has open (a symlink or loop device changed since the mount), and writing it would write another device",
            m.devid,
            layout.fsid,
            m.path.display()
        ),
        "make the path btrfs reports (btrfs filesystem show) lead to the member again, or remount by the member's own device node, then run reseq again",
    ))
}

/// The device numbers the kernel's btrfs `fsid` holds open.
fn held_devices(fsid: &str) -> Vec<(u32, u32)> {
    let dir = Path::new("/sys/fs/btrfs").join(fsid).join("devices");
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let parse = |s: String| {
        let (a, b) = s.trim().split_once(':')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    };
    let mut out: Vec<(u32, u32)> =
        entries.flatten().filter_map(|e| std::fs::read_to_string(e.path().join("dev")).ok().and_then(parse)).collect();
    out.sort();
    out
}

/// Refuses while btrfs's own writers run ([`own_writers`]).
pub(crate) fn refuse_own_writers(fd: BorrowedFd<'_>, layout: &Layout, mount: &Path) -> Result<()> {
    let Some(what) = own_writers(fd, layout, Path::new("/sys"))? else { return Ok(()) };
    Err(Error::refused(
        format!(
            "the btrfs at {}: {what}. It writes the filesystem outside reseq's view (a freeze waits for it to end, stalling every writer meanwhile), and a rewrite could put back bytes it moved or changed",
            mount.display()
        ),
        "let it finish (btrfs scrub status, btrfs balance status, btrfs replace status) or cancel it, then run reseq again (with --resume if a run was stopped by it)",
    ))
}

/// The check of btrfs's own writers, just before each window's freeze is
/// asked for, unfrozen: a scrub, balance or device operation holds a write reference
/// on the mount, so FIFREEZE waits for it to end and every new writer of the
/// filesystem waits meanwhile. One running stops the run instead of freezing. (One
/// that starts between this check and FIFREEZE still stalls that window: docs/SAFETY.md.)
pub(crate) struct OwnWritersCheck {
    /// The mount point, open.
    pub(crate) fd: std::os::fd::OwnedFd,
    pub(crate) mount: PathBuf,
}

impl crate::host::window_checks::WindowCheck for OwnWritersCheck {
    fn before_window(&mut self, _freezes: bool) -> Result<()> {
        use std::os::fd::AsFd;
        let layout = Layout::read(self.fd.as_fd())?;
        refuse_own_writers(self.fd.as_fd(), &layout, &self.mount)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1 << 16; // a 64 KiB stripe

    fn chunk(flags: u64, stripes: &[(u64, u64)], sub: u16, length: u64) -> Chunk {
        let stripes = stripes.iter().map(|&(devid, offset)| Stripe { devid, offset }).collect();
        Chunk {
            logical: 1 << 30,
            length,
            stripe_len: K,
            flags: sys::btrfs::BTRFS_BLOCK_GROUP_DATA | flags,
            sub_stripes: sub,
            stripes,
        }
    }

    fn places(p: &[Piece]) -> Vec<(u64, u64, usize, u64, u64)> {
        p.iter().map(|p| (p.logical - (1 << 30), p.len, p.copy, p.devid, p.physical)).collect()
    }

    #[test]
    fn parses_a_chunk_item() {
        let mut d = vec![0u8; 48 + 64];
        d[0..8].copy_from_slice(&(8u64 << 20).to_le_bytes());
        d[16..24].copy_from_slice(&K.to_le_bytes());
        d[24..32]
            .copy_from_slice(&(sys::btrfs::BTRFS_BLOCK_GROUP_DATA | sys::btrfs::BTRFS_BLOCK_GROUP_RAID1).to_le_bytes());
        d[44..46].copy_from_slice(&2u16.to_le_bytes());
        d[46..48].copy_from_slice(&1u16.to_le_bytes());
        for (i, (devid, off)) in [(1u64, 5u64 << 20), (2, 7 << 20)].iter().enumerate() {
            d[48 + 32 * i..56 + 32 * i].copy_from_slice(&devid.to_le_bytes());
            d[56 + 32 * i..64 + 32 * i].copy_from_slice(&off.to_le_bytes());
        }
        let c = Chunk::parse(1 << 30, &d).unwrap();
        assert_eq!((c.length, c.profile(), c.copies(), c.kind()), (8 << 20, Profile::Raid1, 2, "data".to_string()));
        assert_eq!(c.stripes[1], Stripe { devid: 2, offset: 7 << 20 });
        assert!(Chunk::parse(0, &d[..90]).is_none(), "a stripe cut short");
    }

    #[test]
    fn single_dup_and_mirrors_keep_each_copy_contiguous() {
        let single = chunk(0, &[(1, 1 << 20)], 1, 8 << 20);
        assert_eq!(places(&single.map((1 << 30) + 5000, 3 * K).unwrap()), vec![(5000, 3 * K, 0, 1, (1 << 20) + 5000)]);
        let dup = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_DUP, &[(1, 1 << 20), (1, 9 << 20)], 1, 8 << 20);
        assert_eq!(
            places(&dup.map((1 << 30) + K, 2 * K).unwrap()),
            vec![(K, 2 * K, 0, 1, (1 << 20) + K), (K, 2 * K, 1, 1, (9 << 20) + K)]
        );
        let c3 = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_RAID1C3, &[(1, 0), (2, 100 * K), (3, 7 * K)], 1, 8 << 20);
        let got = places(&c3.map(1 << 30, K).unwrap());
        assert_eq!(got, vec![(0, K, 0, 1, 0), (0, K, 1, 2, 100 * K), (0, K, 2, 3, 7 * K)]);
    }

    #[test]
    fn raid0_stripes_round_robin_over_the_devices() {
        // Stripe n is on device n % 3, row n / 3 of it.
        let c = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_RAID0, &[(1, 10 * K), (2, 20 * K), (3, 30 * K)], 1, 30 * K);
        let got = places(&c.map((1 << 30) + K / 2, 4 * K).unwrap());
        assert_eq!(
            got,
            vec![
                (K / 2, K / 2, 0, 1, 10 * K + K / 2),
                (K, K, 0, 2, 20 * K),
                (2 * K, K, 0, 3, 30 * K),
                (3 * K, K, 0, 1, 11 * K),
                (4 * K, K / 2, 0, 2, 21 * K),
            ]
        );
        let total: u64 = got.iter().map(|p| p.1).sum();
        assert_eq!(total, 4 * K, "every byte once");
    }

    #[test]
    fn raid10_stripes_over_mirrored_pairs() {
        // Four devices, pairs (0,1) and (2,3): stripe n is on pair n % 2, row n / 2.
        let c = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_RAID10, &[(1, 0), (2, 0), (3, 8 * K), (4, 8 * K)], 2, 16 * K);
        assert_eq!(c.copies(), 2);
        let got = places(&c.map(1 << 30, 3 * K).unwrap());
        assert_eq!(
            got,
            vec![
                (0, K, 0, 1, 0),
                (0, K, 1, 2, 0),
                (K, K, 0, 3, 8 * K),
                (K, K, 1, 4, 8 * K),
                (2 * K, K, 0, 1, K),
                (2 * K, K, 1, 2, K),
            ]
        );
        // Six devices: three pairs.
        let six: Vec<(u64, u64)> = (1..=6).map(|d| (d, 0)).collect();
        let c = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_RAID10, &six, 2, 30 * K);
        let got = places(&c.map((1 << 30) + 4 * K + 7, 10).unwrap());
        assert_eq!(got, vec![(4 * K + 7, 10, 0, 3, K + 7), (4 * K + 7, 10, 1, 4, K + 7)]);
    }

    #[test]
    fn parity_and_ranges_outside_the_data_chunks_are_refused() {
        let r5 = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_RAID5, &[(1, 0), (2, 0), (3, 0)], 1, 8 << 20);
        assert!(r5.map(1 << 30, 4096).unwrap_err().contains("parity"));
        let meta =
            Chunk { flags: sys::btrfs::BTRFS_BLOCK_GROUP_METADATA, logical: 0, ..chunk(0, &[(1, 0)], 1, 1 << 20) };
        let data = chunk(0, &[(1, 2 << 20)], 1, 1 << 20);
        let layout = Layout { chunks: vec![meta, data], ..Layout::default() };
        assert!(layout.map(4096, 4096).unwrap_err().contains("metadata"));
        assert!(layout.map(2 << 30, 4096).unwrap_err().contains("no chunk"));
        // Across the end of a chunk: an error, not a silent wrap.
        assert!(layout.map((1 << 30) + (1 << 20) - 4096, 8192).is_err());
        let got = layout.map((1 << 30) + 4096, 4096).unwrap();
        assert_eq!(got[0].physical, (2 << 20) + 4096);
    }

    #[test]
    fn counts_copies_on_one_device() {
        let dup = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_DUP, &[(1, 0), (1, 1 << 20)], 1, 1 << 20);
        let r1 = chunk(sys::btrfs::BTRFS_BLOCK_GROUP_RAID1, &[(1, 0), (2, 0)], 1, 1 << 20);
        assert_eq!(Layout { chunks: vec![r1.clone()], ..Layout::default() }.copies_on_one_device(), 1);
        assert_eq!(Layout { chunks: vec![r1, dup], ..Layout::default() }.copies_on_one_device(), 2);
    }
}
