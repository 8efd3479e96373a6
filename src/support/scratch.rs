//! Throwaway block devices for the demo and the tests: loop devices over sparse image
//! files, filesystems on them, and mounts, each released by `Drop` even on a panic.
//!
//! Loop devices are attached with `--direct-io=on` so that O_DIRECT reaches the backing
//! file's disk rather than its page cache (without it, the host's page cache answers).

use std::path::{Path, PathBuf};

use crate::support::tool::Tool;
/// Runs a command the tests built, failing with its command line, status and stderr.
pub use crate::support::tool::run_command as run_cmd;

/// A loop device over a sparse image file; detached on drop.
pub struct LoopDevice {
    pub path: PathBuf,
    pub image: PathBuf,
}

impl LoopDevice {
    /// Creates a sparse image of `size` bytes at `image` and attaches it.
    pub fn create(image: &Path, size: u64) -> std::io::Result<LoopDevice> {
        std::fs::File::create(image)?.set_len(size)?;
        LoopDevice::attach(image, &[])
    }

    /// Attaches an existing image, with extra `losetup` arguments (e.g. `--sector-size`).
    pub fn attach(image: &Path, extra: &[&str]) -> std::io::Result<LoopDevice> {
        let out = Tool::new("losetup").args(["--direct-io=on", "--find", "--show"]).args(extra).arg(image).run()?;
        Ok(LoopDevice { path: PathBuf::from(out.trim()), image: image.to_path_buf() })
    }

    pub fn name(&self) -> String {
        self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if retried(|| Tool::new("losetup").arg("-d").arg(&self.path).run()).is_err() {
            eprintln!("warning: could not detach {}", self.path.display());
        }
    }
}

/// Runs `f` until it succeeds, up to 50 times 100 ms apart: a device or mount can be
/// busy for a moment (a udev probe, a forked process not yet exec'd).
fn retried<E>(mut f: impl FnMut() -> Result<String, E>) -> Result<(), E> {
    for _ in 1..50 {
        if f().is_ok() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    f().map(drop)
}

/// A mounted filesystem; thawed (if frozen) and unmounted on drop.
pub struct Mount {
    pub dir: PathBuf,
}

impl Mount {
    pub fn new(device: &Path, dir: &Path, options: &[&str]) -> std::io::Result<Mount> {
        std::fs::create_dir_all(dir)?;
        let mut mount = Tool::new("mount");
        if !options.is_empty() {
            mount.arg("-o").arg(options.join(","));
        }
        mount.arg(device).arg(dir).run()?;
        Ok(Mount { dir: dir.to_path_buf() })
    }

    /// Unmounts now (for an fsck afterwards), reporting failure. Retries for a few
    /// seconds: a process forked elsewhere in the test harness can hold a copy of an fd
    /// for a moment before its exec closes it, and umount then says "target is busy".
    /// On failure the `Drop` cleanup still runs (thaw, retries, lazy unmount), so a failed
    /// test leaves no mount behind.
    pub fn unmount(self) -> std::io::Result<()> {
        let source = Tool::new("findmnt").args(["-n", "-o", "SOURCE", "--mountpoint"]).arg(&self.dir).run();
        retried(|| Tool::new("umount").arg(&self.dir).run())?;
        std::mem::forget(self);
        if let Some(dev) = source.ok().map(|s| PathBuf::from(s.trim())).filter(|d| d.starts_with("/dev/")) {
            released(&dev);
        }
        Ok(())
    }
}

/// Waits (up to 30 s) until no mount holds `dev` (an exclusive open succeeds). A mount
/// namespace made while it was mounted (`unshare --mount`, by a test running beside)
/// keeps a copy: the filesystem then lives on after the umount here, and debugfs or fsck
/// on the device would meet a live filesystem, a mount again the old one.
fn released(dev: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(30) {
        if std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_EXCL).open(dev).is_ok() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    eprintln!("warning: {} still held 30 s after its umount", dev.display());
}

impl Drop for Mount {
    fn drop(&mut self) {
        // A failed test may leave it frozen: thaw (EINVAL if it was not) before umount.
        let _ = Tool::new("fsfreeze").arg("-u").arg(&self.dir).output();
        if retried(|| Tool::new("umount").arg(&self.dir).run()).is_ok() {
            return;
        }
        let _ = Tool::new("umount").arg("-l").arg(&self.dir).output();
        eprintln!("warning: lazily unmounted {} after umount kept failing", self.dir.display());
    }
}

/// `mkfs.ext4` with the lazy initialisation off: otherwise ext4lazyinit keeps writing
/// inode tables after mount, which blurs "bytes written" in tests and demos.
pub fn mkfs_ext4(device: &Path) -> std::io::Result<()> {
    let mkfs =
        Tool::new("mkfs.ext4").args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]).arg(device).run();
    Ok(mkfs.map(drop)?)
}

pub fn mkfs_xfs(device: &Path) -> std::io::Result<()> {
    Ok(Tool::new("mkfs.xfs").args(["-q", "-f"]).arg(device).run().map(drop)?)
}

/// A small deterministic PRNG (xorshift64*): demo and tests need reproducible
/// "random" offsets, not cryptographic randomness.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed.max(1))
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// blake3 of a whole file or device, read through the page cache-free path where it
/// matters: callers hash devices only while nothing writes them.
pub fn hash_path(path: &Path) -> std::io::Result<blake3::Hash> {
    let mut f = std::fs::File::open(path)?;
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(h.finalize())
}
