//! Rescue copies: the original bytes of a chunk whose write failed, tore, or read back
//! different, kept so that nothing is lost whatever the device did.
//!
//! The engine holds a chunk's bytes (read and hashed in the same window) until its write
//! is verified. When that does not happen, the bytes go into a rescue file in the state
//! directory, written after the thaw (the state directory may be on a frozen filesystem),
//! fsynced, and named after the device, the offset and the blake3. A run on that device
//! refuses to go on while the device differs from a rescue copy (it would read the torn
//! bytes and bless them as the data), and `reseq restore FILE` puts the copy back.
//!
//! Format: one JSON header line padded with spaces to `HEADER_BYTES`, then the bytes.
//! The padding keeps the data aligned for direct I/O and the header readable with `head`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::identity::DeviceIdentity;
use crate::support::error::{Error, Result};

pub(crate) const DEFAULT_RUN_DIR: &str = "/run/reseq";

/// The record directory: `RESEQ_RUN_DIR`, or `/run/reseq`.
pub(crate) fn run_dir() -> PathBuf {
    std::env::var_os("RESEQ_RUN_DIR").filter(|v| !v.is_empty()).map_or_else(|| DEFAULT_RUN_DIR.into(), PathBuf::from)
}

/// A panic of reseq `pid` while frozen: the text goes to the run directory (never on a
/// frozen filesystem, see `check_run_dir`) instead of stderr (which may be), and the
/// guardian prints it after the thaw. Appends; best effort, as a panic report is.
pub(crate) fn save_panic_note(pid: u32, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let path = run_dir().join(format!("reseq-{pid}.panic"));
    let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path);
    if let Ok(mut f) = file {
        let _ = writeln!(f, "{text}");
    }
}

/// The panic note of reseq `pid` in `dir`, removed as it is read.
pub(crate) fn take_panic_note(dir: &Path, pid: i32) -> Option<String> {
    let path = dir.join(format!("reseq-{pid}.panic"));
    let text = std::fs::read_to_string(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    Some(text)
}

pub(crate) const HEADER_BYTES: usize = 4096;
const MAGIC: &str = "reseq-rescue-1";

/// What a rescue file says about its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescueHeader {
    pub(crate) magic: String,
    /// The device the bytes belong to, and where.
    pub(crate) device_path: String,
    pub(crate) identity: DeviceIdentity,
    pub offset: u64,
    pub len: u64,
    /// blake3 of the original bytes (as the journal's `begin` record has it).
    pub blake3: String,
    /// blake3 of what the device held there when reseq stopped (None: unreadable).
    /// `reseq restore` writes only over that, or with --force.
    pub(crate) left_blake3: Option<String>,
    /// What happened: "write failed", "torn write", "read-back differs"...
    pub(crate) reason: String,
    /// File mode: the file and its offset the bytes belonged to.
    pub file: Option<String>,
    pub(crate) created_at: String,
}

/// A rescue copy not yet on disk (its filesystem may be frozen).
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) header: RescueHeader,
    pub(crate) data: Vec<u8>,
}

/// Where rescue copies go and what they belong to.
#[derive(Clone, Debug)]
pub(crate) struct RescueTo {
    pub(crate) dir: PathBuf,
    pub(crate) device_path: PathBuf,
    pub(crate) identity: DeviceIdentity,
    /// File mode: the files of the run, as (start, length, path) in the run's offsets,
    /// ascending (device offsets come from the target).
    pub(crate) files: Vec<(u64, u64, String)>,
}

impl RescueTo {
    pub(crate) fn pending(
        &self,
        device_offset: u64,
        data: &[u8],
        blake3: &blake3::Hash,
        left: Option<blake3::Hash>,
        reason: &str,
        file_offset: u64,
    ) -> Pending {
        Pending {
            header: RescueHeader {
                magic: MAGIC.into(),
                device_path: self.device_path.display().to_string(),
                identity: self.identity.clone(),
                offset: device_offset,
                len: data.len() as u64,
                blake3: blake3.to_hex().to_string(),
                left_blake3: left.map(|h| h.to_hex().to_string()),
                reason: reason.into(),
                file: self.files_at(file_offset, data.len() as u64),
                created_at: crate::support::units::now_rfc3339(),
            },
            data: data.to_vec(),
        }
    }

    /// The files whose bytes lie in `len` bytes at `offset` (a chunk of a batch of small
    /// files can hold many).
    fn files_at(&self, offset: u64, len: u64) -> Option<String> {
        let hit: Vec<&(u64, u64, String)> =
            self.files.iter().filter(|(at, n, _)| *at < offset + len && offset < at + n).collect();
        let (first, last) = (hit.first()?, hit.last()?);
        let head = format!("{} at file offset {}", first.2, offset.saturating_sub(first.0));
        Some(match hit.len() {
            1 => head,
            n => format!("{head}, then {} more file(s) through {}", n - 1, last.2),
        })
    }
}

pub(crate) fn file_name(identity: &DeviceIdentity, offset: u64, blake3: &str) -> String {
    // The identity's hash tells apart two devices that had the same name.
    let id = blake3::hash(serde_json::to_string(identity).unwrap_or_default().as_bytes()).to_hex();
    format!("rescue-{}-{offset}-{}-{}.bin", identity.name, &blake3[..16.min(blake3.len())], &id[..8])
}

/// Where rescue copies are looked for: the state directory, and the run directory that
/// takes them when the state directory cannot (full, read-only, frozen).
pub(crate) fn dirs(state_dir: &Path) -> Vec<PathBuf> {
    vec![state_dir.to_path_buf(), run_dir()]
}

/// Writes `p` into `dir` (whole, see [`crate::support::atomic::replace`]). Returns the
/// path.
pub(crate) fn save(dir: &Path, p: &Pending) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(file_name(&p.header.identity, p.header.offset, &p.header.blake3));
    let mut head = serde_json::to_string(&p.header).map_err(std::io::Error::other)?;
    if head.len() >= HEADER_BYTES {
        return Err(std::io::Error::other("rescue header too long"));
    }
    head.push_str(&" ".repeat(HEADER_BYTES - 1 - head.len()));
    head.push('\n');
    crate::support::atomic::replace(&path, 0o600, |f| {
        f.write_all(head.as_bytes()).and_then(|()| f.write_all(&p.data))
    })?;
    Ok(path)
}

/// Saves a copy into the first of `dirs` that takes it. Returns the path, or a sentence
/// saying it could not be saved anywhere.
pub(crate) fn save_first(dirs: &[PathBuf], p: &Pending) -> std::result::Result<PathBuf, String> {
    let mut errors = Vec::new();
    for dir in dirs {
        match save(dir, p) {
            Ok(path) => {
                if !errors.is_empty() {
                    log::error!(
                        "the rescue copy could not be saved in {} ({}): saved in {} instead",
                        dirs[0].display(),
                        errors.join("; "),
                        path.display()
                    );
                }
                return Ok(path);
            }
            Err(e) => errors.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(format!(
        "the rescue copy of device bytes {}..{} (blake3 {}) could not be saved ({}): restore those bytes from a backup",
        p.header.offset,
        p.header.offset + p.header.len,
        p.header.blake3,
        errors.join("; ")
    ))
}

/// Moves a copy saved in the run directory (a tmpfs, lost at reboot) into the state
/// directory, once that can be written. Returns where it is now.
pub(crate) fn settle_in(state_dir: &Path, path: &Path) -> PathBuf {
    if path.parent() == Some(state_dir) {
        return path.to_path_buf();
    }
    let Ok((header, data)) = load(path) else { return path.to_path_buf() };
    match save(state_dir, &Pending { header, data }) {
        Ok(new) => {
            let _ = remove(path);
            new
        }
        Err(e) => {
            log::warn!("the rescue copy stays in {} (a tmpfs: copy it before a reboot): {e}", path.display());
            path.to_path_buf()
        }
    }
}

/// Reads a rescue file and checks its bytes against the blake3 its header names.
pub fn load(path: &Path) -> Result<(RescueHeader, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::IsADirectory => {
            Error::Usage(format!("{}: {e}; name a rescue-*.bin file from the state directory", path.display()))
        }
        _ => Error::io(format!("reading rescue file {}", path.display()), e),
    })?;
    let bad = |why: &str| {
        Error::Usage(format!(
            "{} is not a reseq rescue file ({why}); name a rescue-*.bin file from the state directory",
            path.display()
        ))
    };
    if bytes.len() < HEADER_BYTES {
        return Err(bad("too short"));
    }
    let head = std::str::from_utf8(&bytes[..HEADER_BYTES]).map_err(|_| bad("its header is not text"))?;
    let header: RescueHeader = serde_json::from_str(head.trim_end()).map_err(|e| bad(&format!("header: {e}")))?;
    if header.magic != MAGIC {
        return Err(bad("wrong magic"));
    }
    let data = bytes[HEADER_BYTES..].to_vec();
    if data.len() as u64 != header.len || header.len == 0 || header.len > 1 << 30 || !header.offset.is_multiple_of(512)
    {
        return Err(bad(&format!(
            "{} bytes of data at offset {}, the header says {}",
            data.len(),
            header.offset,
            header.len
        )));
    }
    if blake3::hash(&data).to_hex().as_str() != header.blake3 {
        return Err(Error::refused(
            format!(
                "the rescue file {} is damaged: its bytes do not match the blake3 in its header ({})",
                path.display(),
                header.blake3
            ),
            "restore these device bytes from a backup; the journal records their blake3 too",
        ));
    }
    Ok((header, data))
}

/// The rescue files in `dirs` that belong to the device `identity`, under whatever name
/// it had when they were made.
pub(crate) fn list_for(dirs: &[PathBuf], identity: &DeviceIdentity) -> Vec<(PathBuf, RescueHeader)> {
    let mut out: Vec<(PathBuf, RescueHeader)> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .filter(|p| named(p, "rescue-", ".bin"))
        .filter_map(|p| read_header(&p).map(|h| (p, h)))
        .filter(|(_, h)| h.identity.same_device(identity) && h.len > 0)
        .collect();
    out.sort_by_key(|(_, h)| h.offset);
    out
}

/// Whether the file at `path` is named `{prefix}...{suffix}`.
fn named(path: &Path, prefix: &str, suffix: &str) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix))
}

/// A rescue copy or a torn-write note, by its name: each stops later runs on its device.
pub(crate) fn is_rescue_record(path: &Path) -> bool {
    named(path, "rescue-", ".bin") || named(path, "torn-", ".json")
}

fn read_header(path: &Path) -> Option<RescueHeader> {
    use std::io::Read;
    let mut head = vec![0u8; HEADER_BYTES];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    serde_json::from_str(std::str::from_utf8(&head).ok()?.trim_end()).ok()
}

/// Before any run on a device: each rescue copy of it must be back on the device. A
/// copy whose bytes the device holds again is removed; any other stops the run, since
/// reading the device there would take the torn bytes for the data.
///
/// Under a mounted filesystem, a range that holds neither the copy nor what the failed
/// write left has been written since by the filesystem, as it may: the copy is older
/// than that data, so it is kept for reference, with a warning, and does not stop the run.
pub(crate) fn check_device(
    dirs: &[PathBuf],
    identity: &DeviceIdentity,
    target: &dyn crate::engine::target::BlockTarget,
    mounted: bool,
) -> Result<()> {
    for (path, h) in list_for(dirs, identity) {
        let now = range_hash(target, h.offset, h.len)?.to_hex().to_string();
        let (end, shown) = (h.offset + h.len, path.display());
        if mounted && now != h.blake3 && h.left_blake3.as_ref().is_some_and(|l| *l != now) {
            log::warn!(
                "device bytes {}..{end} changed since a failed write left them ({}): the mounted filesystem wrote there since, so the rescue copy {shown} is older than that data and is not needed to go on; check the filesystem (fsck -n) and drop the copy with `reseq restore --forget {shown}`",
                h.offset,
                h.created_at
            );
            continue;
        }
        if now == h.blake3 {
            dropped_as_restored(&path, h.offset, h.len)?;
            continue;
        }
        return Err(Error::refused(
            format!(
                "device bytes {}..{end} of {} are not the data reseq read there before a failed write ({}, {}): their original bytes are in the rescue copy {shown}. Going on would take what is there now for the data",
                h.offset, h.device_path, h.reason, h.created_at
            ),
            format!(
                "once the device works, run `{}` (it checks that nothing else wrote there since); `reseq restore --forget` drops the copy if you restored the data another way",
                restore_command(&path)
            ),
        ));
    }
    Ok(())
}

/// What to tell about the device's first rescue copy, if there is one.
pub(crate) fn pending(dirs: &[PathBuf], identity: &DeviceIdentity) -> Option<String> {
    let (path, h) = list_for(dirs, identity).into_iter().next()?;
    let (end, command) = (h.offset + h.len, restore_command(&path));
    Some(format!("device bytes {}..{end} ({}) have a rescue copy; `{command}` puts it back", h.offset, h.reason))
}

/// Whether the device holds bytes with this blake3 at `offset`.
pub(crate) fn device_holds(
    target: &dyn crate::engine::target::BlockTarget,
    offset: u64,
    len: u64,
    blake3: &str,
) -> Result<bool> {
    Ok(range_hash(target, offset, len)?.to_hex().as_str() == blake3)
}

pub(crate) fn range_hash(
    target: &dyn crate::engine::target::BlockTarget,
    offset: u64,
    len: u64,
) -> Result<blake3::Hash> {
    let mut buf = crate::sys::memory::AlignedBuf::new(len as usize, target.mem_align());
    target
        .read_at(&mut buf[..len as usize], offset)
        .map_err(|e| Error::io_at(format!("reading the {len} bytes of a rescue copy's range"), offset, e))?;
    Ok(blake3::hash(&buf[..len as usize]))
}

/// The device holds the bytes a record (rescue copy, torn note) is about again: it goes.
fn dropped_as_restored(path: &Path, offset: u64, len: u64) -> Result<()> {
    log::info!("device bytes {offset}..{} hold their data again: removing {}", offset + len, path.display());
    remove(path)
}

/// Removes a rescue file, durably.
pub(crate) fn remove(path: &Path) -> Result<()> {
    std::fs::remove_file(path).map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

/// What a guardian found when it killed reseq mid-write and read the write back before
/// thawing: the bytes there were not the ones being written (torn), or could not be read.
/// Nothing kept the original bytes (reseq died before the write returned), so every later
/// run on the device refuses until they are back or the note is removed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TornNote {
    pub(crate) magic: String,
    pub(crate) device_path: String,
    pub offset: u64,
    pub len: u64,
    /// blake3 of the bytes the write was to write (the data that belongs there).
    pub blake3: String,
    /// What the guardian found: false (other bytes) or None (unreadable).
    pub(crate) intact: Option<bool>,
    pub(crate) created_at: String,
}

const TORN_MAGIC: &str = "reseq-torn-1";

impl TornNote {
    pub(crate) fn new(
        device_path: &Path,
        offset: u64,
        len: u64,
        blake3: &blake3::Hash,
        intact: Option<bool>,
    ) -> TornNote {
        TornNote {
            magic: TORN_MAGIC.into(),
            device_path: device_path.display().to_string(),
            offset,
            len,
            blake3: blake3.to_hex().to_string(),
            intact,
            created_at: crate::support::units::now_rfc3339(),
        }
    }

    /// Writes the note into `dir` (the run directory, never on a frozen filesystem).
    pub(crate) fn save(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let name: String = self.device_path.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let path = dir.join(format!("torn-{name}-{}.json", self.offset));
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        crate::support::atomic::replace(&path, 0o644, |f| f.write_all(text.as_bytes()))?;
        Ok(path)
    }
}

/// Before any run on the device at `device_path`: the guardian's notes of torn writes.
/// A range that holds the right bytes again drops its note; any other refuses the run.
pub(crate) fn check_torn_notes(device_path: &Path, target: &dyn crate::engine::target::BlockTarget) -> Result<()> {
    let dir = run_dir();
    let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let me = canonical(device_path);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Ok(()) };
    for path in entries.flatten().map(|e| e.path()) {
        if !named(&path, "torn-", ".json") {
            continue;
        }
        let Some(note) = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<TornNote>(&b).ok()) else {
            continue;
        };
        if note.magic != TORN_MAGIC || canonical(Path::new(&note.device_path)) != me || note.len == 0 {
            continue;
        }
        if device_holds(target, note.offset, note.len, &note.blake3)? {
            dropped_as_restored(&path, note.offset, note.len)?;
            continue;
        }
        let end = note.offset + note.len;
        let found = if note.intact == Some(false) { "found torn" } else { "unreadable" };
        return Err(Error::refused(
            format!(
                "device bytes {}..{end} of {} were {found} when the guardian killed reseq mid-write ({}; the write stalled past the freeze bound, often a failing device), and they still are not the data reseq read there (blake3 {}). No copy of those bytes was kept: reseq died before the write returned",
                note.offset, note.device_path, note.created_at, note.blake3
            ),
            format!(
                "check the device (dmesg, smartctl) and restore what lives in that range from a backup (for a file: filefrag -v, or debugfs icheck, tells which); then remove {} and run again",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// The command that puts a rescue copy back.
pub(crate) fn restore_command(path: &Path) -> String {
    format!("reseq restore {}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> DeviceIdentity {
        DeviceIdentity {
            name: "loop9".into(),
            dev: "7:9".into(),
            size_bytes: 1 << 20,
            loop_backing_file: Some("/tmp/x".into()),
            ..DeviceIdentity::default()
        }
    }

    #[test]
    fn saves_loads_and_lists() {
        let dir = tempfile::tempdir().unwrap();
        let to = RescueTo {
            dir: dir.path().into(),
            device_path: "/dev/loop9".into(),
            identity: identity(),
            files: Vec::new(),
        };
        let data = vec![7u8; 8192];
        let h = blake3::hash(&data);
        let p = to.pending(65536, &data, &h, None, "torn write", 65536);
        let path = save(dir.path(), &p).unwrap();
        assert!(path.file_name().unwrap().to_str().unwrap().starts_with("rescue-loop9-65536-"));
        let (header, back) = load(&path).unwrap();
        assert_eq!(back, data);
        assert_eq!(header.offset, 65536);
        let dirs = [dir.path().to_path_buf()];
        assert_eq!(list_for(&dirs, &identity()).len(), 1);
        let mut renamed = identity();
        (renamed.name, renamed.dev) = ("loop3".into(), "7:3".into());
        assert_eq!(list_for(&dirs, &renamed).len(), 1, "the same backing file under another loop number");
        let mut other = identity();
        other.size_bytes += 1;
        assert!(list_for(&dirs, &other).is_empty(), "another device's copies are not listed");
        // A crafted header with no bytes is not a rescue file (and no panic).
        let mut empty = p.header.clone();
        empty.len = 0;
        let empty_path = dir.path().join("rescue-empty.bin");
        let head = serde_json::to_string(&empty).unwrap();
        std::fs::write(&empty_path, format!("{head}{}\n", " ".repeat(HEADER_BYTES - 1 - head.len()))).unwrap();
        assert!(matches!(load(&empty_path), Err(Error::Usage(_))));
        assert_eq!(list_for(&dirs, &identity()).len(), 1, "not listed either");
        // A flipped data byte is caught.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_BYTES + 5] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(load(&path).is_err());
    }
}
