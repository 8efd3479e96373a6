//! A fault-injecting FUSE filesystem for the tests: it serves one image file as
//! `<mount>/disk` (through reseq's `OneFileFs`), and a loop device attached to that file
//! turns every read and write of the device into a request here, where it can fail
//! (EIO), be torn (part of it zeroed, then EIO) or be altered (stored wrong, reported
//! fine). The faults come through the real kernel paths (bio -> loop -> vfs -> FUSE) and
//! reach reseq as the I/O errors and bad data a failing disk would give it, not through
//! reseq's own hooks.
//!
//! The loop device's own page cache is still there: tests go through it with O_DIRECT
//! (as reseq does), see [`direct_read`] and [`direct_write`].
#![allow(dead_code)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, Errno, ReplyData, ReplyWrite};
use reseq::testing::AlignedBuf;
use reseq::testing::onefile::{Backend, DISK_NAME, OneFileFs};

use crate::common::{LoopDevice, TestEnv, XorShift, run_cmd};

/// What happens to a request that overlaps a fault's range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Reads overlapping the range fail with EIO; no data is returned.
    FailRead,
    /// Writes overlapping the range fail with EIO; nothing of them is stored.
    FailWrite,
    /// Writes overlapping the range: the overlap is stored as zeros, the rest of the
    /// request normally, and the reply is EIO (a write torn by a failing device).
    TearWrite,
    /// Writes overlapping the range are stored with every byte of the overlap XOR 0xFF
    /// and reported successful: a read-back then differs (silent corruption).
    AlterWrite,
}

impl FaultKind {
    fn on_write(self) -> bool {
        self != FaultKind::FailRead
    }
}

/// A fault on the byte range `start..start + len` of the image.
#[derive(Clone, Debug)]
pub struct Fault {
    pub kind: FaultKind,
    pub start: u64,
    pub len: u64,
    /// `None`: every matching request; `Some(n)`: only the first `n` matching requests.
    pub times: Option<u32>,
}

impl Fault {
    /// A fault on every matching request.
    pub fn new(kind: FaultKind, start: u64, len: u64) -> Fault {
        Fault { kind, start, len, times: None }
    }

    /// The same fault on the first `n` matching requests only.
    pub fn times(self, n: u32) -> Fault {
        Fault { times: Some(n), ..self }
    }
}

/// An emulated read cache below the device (a controller's DRAM): 1 MiB blocks, the
/// least recently read one goes first; a read of a block not in it waits `cold`.
struct DeviceCache {
    blocks: usize,
    cold: Duration,
    lru: std::collections::VecDeque<u64>,
}

impl DeviceCache {
    /// Reads `off..end` through the cache: what it waits.
    fn read(&mut self, off: u64, end: u64) -> Duration {
        let mut wait = Duration::ZERO;
        for b in off >> 20..=(end - 1) >> 20 {
            match self.lru.iter().position(|&x| x == b) {
                Some(i) => {
                    self.lru.remove(i);
                }
                None => wait += self.cold,
            }
            self.lru.push_back(b);
            if self.lru.len() > self.blocks {
                self.lru.pop_front();
            }
        }
        wait
    }
}

/// An emulated write-back cache below the device (a VM host's, a cloud volume's): a
/// 1 MiB block written within `hold` reads at once; any other read waits `cold` a MiB.
/// Unlike an FTL's re-sequencing, its effect fades.
struct RecentWrites {
    hold: Duration,
    cold: Duration,
    written: std::collections::HashMap<u64, Instant>,
}

impl RecentWrites {
    fn read(&self, off: u64, end: u64) -> Duration {
        let fresh = |b: &u64| self.written.get(b).is_some_and(|t| t.elapsed() < self.hold);
        (off >> 20..=(end - 1) >> 20).filter(|b| !fresh(b)).map(|_| self.cold).sum()
    }

    fn write(&mut self, off: u64, end: u64) {
        for b in off >> 20..=(end - 1) >> 20 {
            self.written.insert(b, Instant::now());
        }
    }
}

/// An emulated page cache of a VM host under the guest's disk, as measured in the
/// project's VM (its disks are files under qemu's write-back cache): a 4 KiB page the
/// host never saw waits `cold` a MiB, one it read before `warm`, one it was written
/// `written_wait`; nothing leaves it, so nothing fades. (By page: the loop device splits
/// a read into several requests here.)
struct HostPageCache {
    cold: Duration,
    warm: Duration,
    written_wait: Duration,
    read: std::collections::HashSet<u64>,
    written: std::collections::HashSet<u64>,
}

impl HostPageCache {
    fn read(&mut self, off: u64, end: u64) -> Duration {
        let mut wait = Duration::ZERO;
        for p in off >> 12..end.div_ceil(4096) {
            wait += if self.written.contains(&p) {
                self.written_wait
            } else if self.read.insert(p) {
                self.cold
            } else {
                self.warm
            } / 256;
        }
        wait
    }

    fn write(&mut self, off: u64, end: u64) {
        self.written.extend(off >> 12..end.div_ceil(4096));
    }
}

#[derive(Default)]
struct State {
    /// Faults in the order added, each with how many requests it was applied to.
    faults: Vec<(Fault, u32)>,
    cache: Option<DeviceCache>,
    recent: Option<RecentWrites>,
    host: Option<HostPageCache>,
    hits: u64,
    writes: Vec<(u64, u64)>,
    reads: Vec<(u64, u64)>,
    fsyncs: u64,
}

impl State {
    /// The first fault still active that applies to this request (a read or a write of
    /// `off..end`): its kind and the overlap, counted as applied.
    fn take(&mut self, write: bool, off: u64, end: u64) -> Option<(FaultKind, u64, u64)> {
        for (f, used) in &mut self.faults {
            if f.kind.on_write() != write || f.times.is_some_and(|n| *used >= n) {
                continue;
            }
            let (s, e) = (f.start.max(off), f.start.saturating_add(f.len).min(end));
            if s < e {
                *used += 1;
                self.hits += 1;
                return Some((f.kind, s, e));
            }
        }
        None
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The image behind the filesystem, with the faults and caches it applies.
struct Image {
    file: File,
    state: Arc<Mutex<State>>,
}

impl Backend for Image {
    fn read(&self, offset: u64, end: u64, reply: ReplyData) {
        let (fault, wait) = {
            let mut st = lock(&self.state);
            st.reads.push((offset, end - offset));
            let wait = st.cache.as_mut().map_or(Duration::ZERO, |c| c.read(offset, end))
                + st.recent.as_ref().map_or(Duration::ZERO, |r| r.read(offset, end))
                + st.host.as_mut().map_or(Duration::ZERO, |h| h.read(offset, end));
            (st.take(false, offset, end), wait)
        };
        if fault.is_some() {
            return reply.error(Errno::EIO);
        }
        std::thread::sleep(wait);
        let mut buf = vec![0u8; (end - offset) as usize];
        match self.file.read_exact_at(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(e.into()),
        }
    }

    fn write(&self, offset: u64, data: &[u8], reply: ReplyWrite) {
        let end = offset.saturating_add(data.len() as u64);
        let fault = {
            let mut st = lock(&self.state);
            st.writes.push((offset, data.len() as u64));
            if let Some(r) = st.recent.as_mut() {
                r.write(offset, end);
            }
            if let Some(h) = st.host.as_mut() {
                h.write(offset, end);
            }
            st.take(true, offset, end)
        };
        let mut stored = std::borrow::Cow::Borrowed(data);
        let mut result = Ok(());
        if let Some((kind, s, e)) = fault {
            let overlap = (s - offset) as usize..(e - offset) as usize;
            match kind {
                FaultKind::FailWrite => return reply.error(Errno::EIO),
                FaultKind::TearWrite => {
                    stored.to_mut()[overlap].fill(0);
                    result = Err(Errno::EIO);
                }
                FaultKind::AlterWrite => stored.to_mut()[overlap].iter_mut().for_each(|b| *b ^= 0xff),
                FaultKind::FailRead => unreachable!("read faults are not taken for writes"),
            }
        }
        match self.file.write_all_at(&stored, offset).map_err(Errno::from).and(result) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self) -> std::io::Result<()> {
        lock(&self.state).fsyncs += 1;
        self.file.sync_data()
    }
}

/// A mounted fault-injecting filesystem serving one image file as `disk()`. Dropping it
/// unmounts it (lazily if something still holds the file: detach loop devices on it
/// first) and joins the session thread.
pub struct FaultFs {
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    mount_dir: PathBuf,
}

impl FaultFs {
    /// Serves `image` (an existing file; its size is the file's size, fixed) read-write as
    /// `mount_dir/disk`. `mount_dir` is created if missing.
    pub fn serve(image: &Path, mount_dir: &Path) -> std::io::Result<FaultFs> {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(image)?;
        let size = file.metadata()?.len();
        std::fs::create_dir_all(mount_dir)?;
        let state = Arc::new(Mutex::new(State::default()));
        let image = Image { file, state: state.clone() };
        let session = OneFileFs::mount(image, size, mount_dir, "reseq-faultfs")?;
        Ok(FaultFs { state, session: Some(session), mount_dir: mount_dir.to_path_buf() })
    }

    /// The served file.
    pub fn disk(&self) -> PathBuf {
        self.mount_dir.join(DISK_NAME)
    }

    pub fn mount_dir(&self) -> &Path {
        &self.mount_dir
    }

    /// Adds a fault; it applies from the next request on. Faults are checked in the order
    /// added and the first active one overlapping a request applies to it.
    pub fn add(&self, f: Fault) {
        lock(&self.state).faults.push((f, 0));
    }

    /// From now on, reads go through an emulated cache of `bytes` (whole MiB, emptied
    /// now): a read of a MiB block not in it waits `cold`.
    /// Bytes written within `hold` read at once, any other read waits `cold` a MiB
    /// (see [`RecentWrites`]).
    pub fn set_write_cache(&self, hold: Duration, cold: Duration) {
        lock(&self.state).recent = Some(RecentWrites { hold, cold, written: Default::default() });
    }

    /// From now on, reads go through an emulated VM host's page cache, empty now (see
    /// [`HostPageCache`]).
    pub fn set_host_cache(&self, cold: Duration, warm: Duration, written_wait: Duration) {
        let (read, written) = Default::default();
        lock(&self.state).host = Some(HostPageCache { cold, warm, written_wait, read, written });
    }

    pub fn set_cache(&self, bytes: u64, cold: Duration) {
        let blocks = (bytes >> 20) as usize;
        lock(&self.state).cache = Some(DeviceCache { blocks, cold, lru: Default::default() });
    }

    /// Removes all faults (the counters and logs stay).
    pub fn clear(&self) {
        lock(&self.state).faults.clear();
    }

    /// How many requests a fault was applied to so far.
    pub fn hits(&self) -> u64 {
        lock(&self.state).hits
    }

    /// (offset, length) of every WRITE request received, in order, failed ones included.
    pub fn writes_seen(&self) -> Vec<(u64, u64)> {
        lock(&self.state).writes.clone()
    }

    /// (offset, length) of every READ request received (within the file), in order.
    pub fn reads_seen(&self) -> Vec<(u64, u64)> {
        lock(&self.state).reads.clone()
    }

    /// How many FSYNC requests arrived (a flush of the loop device sends one).
    pub fn fsyncs(&self) -> u64 {
        lock(&self.state).fsyncs
    }
}

impl Drop for FaultFs {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else { return };
        // A plain unmount ends the connection and with it the session thread. It is busy
        // while something holds the file open (a loop device not yet detached, a process
        // forked elsewhere in the test binary holding a copy of an fd for a moment).
        let mut unmounted = false;
        for _ in 0..30 {
            if Command::new("umount").arg(&self.mount_dir).output().is_ok_and(|o| o.status.success()) {
                unmounted = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mount_dir).output();
            eprintln!("warning: lazily unmounted {} (still in use)", self.mount_dir.display());
        }
        // After a lazy unmount the thread ends only when the file's last user lets go.
        let wait = if unmounted { Duration::from_secs(5) } else { Duration::from_secs(1) };
        let start = Instant::now();
        while !session.guard.is_finished() && start.elapsed() < wait {
            std::thread::sleep(Duration::from_millis(10));
        }
        if session.guard.is_finished() {
            if let Err(e) = session.join() {
                eprintln!("warning: the faultfs session on {} ended with {e}", self.mount_dir.display());
            }
        } else {
            // Still serving whoever holds the file; the connection ends with that user or
            // with this process. Dropping the session would unmount the path again.
            eprintln!("warning: the faultfs session on {} is still in use; left running", self.mount_dir.display());
            std::mem::forget(session);
        }
    }
}

/// A loop device over a fault-injecting filesystem's file. The fields drop in order: the
/// loop device is detached before the filesystem is unmounted (the other way round, the
/// unmount is busy and must be lazy).
pub struct FaultDevice {
    pub lo: LoopDevice,
    pub fs: FaultFs,
    /// The image file behind the filesystem: read it to see what was really stored.
    pub image: PathBuf,
}

impl FaultDevice {
    /// The image's bytes `off..off + len`, as stored (not through FUSE or the loop device).
    pub fn image_bytes(&self, off: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        File::open(&self.image).unwrap().read_exact_at(&mut buf, off).unwrap();
        buf
    }
}

/// A loop device over `size` deterministic random bytes (XorShift `seed`, the same bytes
/// as `TestEnv::random_loop_device`) served by a `FaultFs`: image `<name>` and mount
/// `<name>-fuse` in the test's directory. The loop device does buffered I/O on the FUSE
/// file (`--direct-io=off`), with the given logical sector size if any.
pub fn fault_loop_device(env: &TestEnv, name: &str, size: u64, seed: u64, sector_size: Option<u32>) -> FaultDevice {
    let image = env.path(name);
    {
        let f = File::create(&image).unwrap();
        let mut rng = XorShift::new(seed);
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0;
        while off < size {
            rng.fill(&mut buf);
            let n = (size - off).min(buf.len() as u64) as usize;
            f.write_all_at(&buf[..n], off).unwrap();
            off += n as u64;
        }
        f.sync_all().unwrap();
    }
    let fs = FaultFs::serve(&image, &env.path(&format!("{name}-fuse"))).expect("mount faultfs");
    // Not `LoopDevice::attach`: it passes `--direct-io=on`, and losetup keeps that even
    // with a later `--direct-io=off`.
    let mut cmd = Command::new("losetup");
    cmd.args(["--direct-io=off", "--find", "--show"]);
    if let Some(s) = sector_size {
        cmd.arg("--sector-size").arg(s.to_string());
    }
    let out = run_cmd(cmd.arg(fs.disk())).expect("loop device on faultfs");
    let lo = LoopDevice { path: PathBuf::from(out.trim()), image: fs.disk() };
    FaultDevice { lo, fs, image }
}

/// Reads `len` bytes at `off` of `dev` with O_DIRECT (both multiples of its sector size).
pub fn direct_read(dev: &Path, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = AlignedBuf::new(len, 4096);
    File::from(reseq::testing::open_direct_read(dev)?).read_exact_at(&mut buf, off)?;
    Ok(buf.to_vec())
}

/// Writes `data` at `off` of `dev` with O_DIRECT (offset and length multiples of its
/// sector size); the error of a failed write, as the application sees it.
pub fn direct_write(dev: &Path, off: u64, data: &[u8]) -> std::io::Result<()> {
    let mut buf = AlignedBuf::new(data.len(), 4096);
    buf.copy_from_slice(data);
    reseq::testing::open_direct_rw(dev, false)?.write_all_at(&buf, off)
}
