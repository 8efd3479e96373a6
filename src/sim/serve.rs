//! `reseq sim serve`: the simulated SSD as a file in the kernel's I/O path.
//!
//! A FUSE filesystem serves one file, `MOUNTDIR/disk`, the size of the simulated drive. A
//! loop device on it is a block device whose every read and write request is applied to
//! the FTL model and answered when the model says it completes, scaled to the wall clock,
//! so that everything a user runs (a filesystem, FIEMAP, freezes, O_DIRECT reads timed by
//! the wall clock) meets a drive whose reads depend on the layout its writes left.
//!
//! - Clock: virtual time (µs) is wall time since the start divided by the time scale. A
//!   request is stamped with the virtual time it arrives at, the model gives its completion,
//!   and the reply is sent at `start + completion × scale` by a timer thread, so requests
//!   in flight together overlap as the model's die, channel and link timelines let them.
//! - Queue depth: whatever the kernel has in flight is the queue depth. Read commands go
//!   to the model as they arrive, each at its arrival time (as `sim read` issues them at
//!   depth k); read-ahead follows the model's rule (a command starting where the last
//!   ended). Writes are modelled one after the other (the model's write timing is QD1):
//!   a write arriving while another is in flight starts when that one completes.
//! - Data: a sparse file `STATE.data` beside the state file holds the bytes; it is
//!   written through before a write is answered. Trims (FUSE fallocate punch-hole or
//!   zero-range, which a loop device sends for discards) unmap whole 4 KiB slots in the
//!   model and punch the data file; a partial slot at an edge is a write.
//! - Age: `reseq sim age` reaches the served model through a control channel
//!   (`control.rs`); reads are timed with the ages it sets, as `sim read`'s are.
//! - The file is opened `FOPEN_DIRECT_IO`: no FUSE page cache sits between the loop
//!   device and the model, so a loop device with `--direct-io=on` has no cache at all.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use fuser::{KernelConfig, ReplyData, ReplyWrite};
use serde::Serialize;

use super::SimState;
use super::control::{Channel, data_path};
use super::ftl::SLOT;
use super::onefile::{Backend, DISK_NAME, OneFileFs};
use crate::support::error::{Error, Result};

/// The default `--time-scale`: one µs of model time takes this many µs of wall time.
/// A fresh sequential read of the consumer-nvme preset then runs at about 2.2 GB/s ÷ 10 =
/// 220 MB/s, well inside what this path sustains (docs/FTL-MODEL.md, "Serving it").
pub(crate) const DEFAULT_TIME_SCALE: f64 = 10.0;

/// `MOUNTDIR/stats`: the session's counters as JSON, read by `reseq bench` to tell
/// whether the drive kept up with its time scale (see [`ServedStats`]).
pub(crate) const STATS_NAME: &str = "stats";
/// Wall time of the FUSE and loop path a request may have spent since the last reply
/// that is not counted as the host's (see [`Drive::arrival_us`]).
pub(crate) const PATH_ALLOWANCE: Duration = Duration::from_millis(2);

/// Counters of a serve session, kept by its threads as they go and printed when it ends
/// (the fields skipped are for `MOUNTDIR/stats`, [`ServedStats`]).
#[derive(Debug, Default, Serialize)]
pub(crate) struct ServeStats {
    read_requests: AtomicU64,
    read_bytes: AtomicU64,
    write_requests: AtomicU64,
    write_bytes: AtomicU64,
    trim_requests: AtomicU64,
    trimmed_bytes: AtomicU64,
    fsyncs: AtomicU64,
    /// The largest read and write requests seen, bytes.
    max_read_request_bytes: AtomicU64,
    max_write_request_bytes: AtomicU64,
    /// The largest number of requests waiting for their modelled completion at once.
    max_in_flight: AtomicU64,
    /// Requests answered later than their modelled completion by more than 1 ms of wall
    /// time: the host could not keep up with this time scale.
    late_replies: AtomicU64,
    /// Sum of how late the replies were, µs (a reply sent within 100 µs counts as on time).
    #[serde(skip)]
    late_us: AtomicU64,
    #[serde(skip)]
    replies: AtomicU64,
}

/// A reply sent this much after its modelled completion is late: the host did not keep
/// up with the time scale.
const LATE: Duration = Duration::from_millis(1);
/// Timer wake-up jitter below this is not counted in [`ServedStats::late_seconds`].
const ON_TIME: Duration = Duration::from_micros(100);

/// What `MOUNTDIR/stats` holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub(crate) struct ServedStats {
    /// Always true: tells this file from any other named `stats`.
    pub(crate) reseq_sim_serve: bool,
    pub(crate) replies: u64,
    pub(crate) late_replies: u64,
    /// Sum of the delays of the replies sent late, seconds: what the host added to the
    /// model's time.
    pub(crate) late_seconds: f64,
    pub(crate) time_scale: f64,
}

/// The counters of the drive served under `path` (a loop device on `MOUNTDIR/disk`, or a
/// file on a filesystem on one), or None when it is not an emulated drive.
pub(crate) fn served_stats_of(path: &Path) -> Option<ServedStats> {
    let dev = crate::sys::block::block_device_under(path)?;
    let (major, minor) = (nix::sys::stat::major(dev), nix::sys::stat::minor(dev));
    let sys = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let backing = std::fs::read_to_string(sys.join("loop/backing_file")).ok()?;
    let backing = Path::new(backing.trim());
    if backing.file_name()? != DISK_NAME {
        return None;
    }
    let text = std::fs::read_to_string(backing.parent()?.join(STATS_NAME)).ok()?;
    serde_json::from_str::<ServedStats>(&text).ok().filter(|s| s.reseq_sim_serve)
}

/// A reply held until its modelled completion.
struct Pending {
    at: Instant,
    /// The virtual time of `at`, µs.
    t_us: f64,
    seq: u64,
    send: Box<dyn FnOnce() + Send>,
}

/// Sends each reply at its time, in deadline order.
fn timer_thread(rx: crossbeam_channel::Receiver<Pending>, counters: Arc<ServeStats>, last_reply: Arc<AtomicU64>) {
    // By deadline, then in the order they were scheduled.
    let mut heap = std::collections::BTreeMap::<(Instant, u64), Pending>::new();
    let mut open = true;
    while open || !heap.is_empty() {
        let now = Instant::now();
        while heap.first_key_value().is_some_and(|(k, _)| k.0 <= now) {
            let (_, p) = heap.pop_first().expect("looked at");
            let late = now.duration_since(p.at);
            if late > LATE {
                counters.late_replies.fetch_add(1, Ordering::Relaxed);
            }
            if late > ON_TIME {
                counters.late_us.fetch_add(late.as_micros() as u64, Ordering::Relaxed);
            }
            counters.replies.fetch_add(1, Ordering::Relaxed);
            (p.send)();
            // Non-negative f64s order as their bits do.
            last_reply.fetch_max(p.t_us.max(0.0).to_bits(), Ordering::Relaxed);
        }
        let wait = heap.first_key_value().map(|(k, _)| k.0.saturating_duration_since(Instant::now()));
        let got = match wait {
            Some(w) if !open => {
                std::thread::sleep(w);
                continue;
            }
            Some(w) => rx.recv_timeout(w).map_err(|e| e.is_disconnected()),
            None => rx.recv().map_err(|_| true),
        };
        match got {
            Ok(p) => {
                heap.insert((p.at, p.seq), p);
                counters.max_in_flight.fetch_max(heap.len() as u64, Ordering::Relaxed);
            }
            Err(disconnected) => open &= !disconnected,
        }
    }
}

/// A read request waiting to be modelled.
struct ReadPart {
    off: u64,
    end: u64,
    arrival_us: f64,
    reply: Box<dyn FnOnce() + Send>,
}

/// How long a read waits for the rest of the host read it may be a piece of.
const MERGE_WINDOW: Duration = Duration::from_micros(200);
/// The largest read modelled as one command: the model's calibrated read size (and
/// reseq's default block size).
const MERGE_MAX: u64 = 1 << 20;

/// Models reads in arrival order, one command per host read. The block layer splits a
/// 1 MiB O_DIRECT read into requests of at most `max_segments` (128 here) pages, and the
/// loop device submits them together: contiguous pieces that arrive within
/// [`MERGE_WINDOW`] of the first, up to [`MERGE_MAX`], are one command of the model, as
/// the host's read was in the measurements the model was fitted to (1 MiB reads at
/// QD1). Without this, served reads of degraded data ran 15 % faster than `sim read`
/// (two half-size commands in flight at once).
fn read_thread(rx: crossbeam_channel::Receiver<ReadPart>, state: Arc<Mutex<SimState>>, replies: Replies) {
    use crossbeam_channel::RecvTimeoutError;
    let mut next: Option<ReadPart> = None;
    loop {
        let Some(first) = next.take().or_else(|| rx.recv().ok()) else { return };
        let deadline = Instant::now() + MERGE_WINDOW;
        let (lo, mut end, mut arrival) = (first.off, first.end, first.arrival_us);
        let mut batch = vec![first.reply];
        while end - lo < MERGE_MAX {
            match rx.recv_deadline(deadline) {
                Ok(p) if p.off == end && p.end - lo <= MERGE_MAX => {
                    end = p.end;
                    arrival = arrival.min(p.arrival_us);
                    batch.push(p.reply);
                }
                Ok(p) => {
                    next = Some(p);
                    break;
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        let (s_lo, s_hi) = slots(lo, end);
        let done = state.lock().unwrap_or_else(|p| p.into_inner()).ftl.read(s_lo, s_hi - s_lo, arrival);
        for send in batch {
            replies.at(done, send);
        }
    }
}

/// The slots `[first, end)` a byte range touches.
fn slots(off: u64, end: u64) -> (u64, u64) {
    (off / SLOT, end.div_ceil(SLOT))
}

/// Virtual time (µs) against the wall clock, and the timer that sends replies on it.
#[derive(Clone)]
struct Replies {
    start: Instant,
    scale: f64,
    timer: crossbeam_channel::Sender<Pending>,
    seq: Arc<AtomicU64>,
}

impl Replies {
    /// Virtual time now, µs.
    fn now_us(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1e6 / self.scale
    }

    /// Sends `send` at virtual time `t_us` (at once if the timer is gone).
    fn at(&self, t_us: f64, send: Box<dyn FnOnce() + Send>) {
        let at = self.start + Duration::from_secs_f64((t_us.max(0.0) * self.scale) / 1e6);
        let p = Pending { at, t_us, seq: self.seq.fetch_add(1, Ordering::Relaxed), send };
        if let Err(e) = self.timer.send(p) {
            (e.into_inner().send)();
        }
    }
}

/// The served drive: model, data, clock.
struct Drive {
    state: Arc<Mutex<SimState>>,
    data: File,
    replies: Replies,
    reads: crossbeam_channel::Sender<ReadPart>,
    /// The virtual time of the last reply sent (f64 bits).
    last_reply: Arc<AtomicU64>,
    host_gap_us: f64,
    counters: Arc<ServeStats>,
}

impl Drive {
    fn model(&self) -> MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The virtual time a request that arrives now is given, µs: the last reply plus the
    /// model's host gap if it comes within [`PATH_ALLOWANCE`] of it (the time it spent on
    /// the way through the kernel and this process is forgiven), else now. A real
    /// host's path costs no such time; with the FUSE round trip counted, a sequential read
    /// at QD1 would run slower than the model by its overhead per command (measured here:
    /// about 0.35 ms, +16 % at the default scale).
    fn arrival_us(&self) -> f64 {
        let now = self.replies.now_us();
        let floor = f64::from_bits(self.last_reply.load(Ordering::Relaxed)) + self.host_gap_us;
        // After a longer pause the host was idle: that time is real, nothing is forgiven.
        if now - floor <= PATH_ALLOWANCE.as_secs_f64() * 1e6 / self.replies.scale { floor.min(now) } else { now }
    }

    fn stats_json(&self) -> Vec<u8> {
        let c = &self.counters;
        let s = ServedStats {
            reseq_sim_serve: true,
            replies: c.replies.load(Ordering::Relaxed),
            late_replies: c.late_replies.load(Ordering::Relaxed),
            late_seconds: c.late_us.load(Ordering::Relaxed) as f64 / 1e6,
            time_scale: self.replies.scale,
        };
        let mut v = serde_json::to_vec(&s).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

impl Backend for Drive {
    const SIDE_FILE: Option<&'static str> = Some(STATS_NAME);

    fn init(&self, config: &mut KernelConfig) {
        // Requests up to 1 MiB (the kernel's limit), so that a 1 MiB read is one command
        // of the model, as in `sim read --block-size 1M`.
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        // Several direct-I/O requests of one file in flight at once (a loop device with
        // direct I/O submits asynchronously): the model's queue depth.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(64);
    }

    fn side_file(&self) -> Vec<u8> {
        self.stats_json()
    }

    fn read(&self, offset: u64, end: u64, reply: ReplyData) {
        let arrival_us = self.arrival_us();
        self.counters.max_read_request_bytes.fetch_max(end - offset, Ordering::Relaxed);
        let mut buf = vec![0u8; (end - offset) as usize];
        if let Err(e) = self.data.read_exact_at(&mut buf, offset) {
            return reply.error(e.into());
        }
        self.counters.read_requests.fetch_add(1, Ordering::Relaxed);
        self.counters.read_bytes.fetch_add(end - offset, Ordering::Relaxed);
        let part = ReadPart { off: offset, end, arrival_us, reply: Box::new(move || reply.data(&buf)) };
        if let Err(e) = self.reads.send(part) {
            (e.into_inner().reply)();
        }
    }

    fn write(&self, offset: u64, data: &[u8], reply: ReplyWrite) {
        if let Err(e) = self.data.write_all_at(data, offset) {
            return reply.error(e.into());
        }
        let now = self.arrival_us();
        self.counters.max_write_request_bytes.fetch_max(data.len() as u64, Ordering::Relaxed);
        let (lo, hi) = slots(offset, offset + data.len() as u64);
        let done = self.model().write_from(now, lo..hi);
        let Ok(done) = done.inspect_err(|e| log::error!("{e}")) else { return reply.error(fuser::Errno::EIO) };
        self.counters.write_requests.fetch_add(1, Ordering::Relaxed);
        self.counters.write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        let n = data.len() as u32;
        self.replies.at(done, Box::new(move || reply.written(n)));
    }

    fn fsync(&self) -> std::io::Result<()> {
        self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.data.sync_data()
    }

    /// Unmaps the whole slots of `[off, end)`; partial slots at the edges are writes (their
    /// other bytes stay). Zeroes the range in the data file.
    fn trim(&self, off: u64, end: u64) -> std::io::Result<()> {
        self.counters.trim_requests.fetch_add(1, Ordering::Relaxed);
        self.counters.trimmed_bytes.fetch_add(end - off, Ordering::Relaxed);
        use nix::fcntl::{FallocateFlags, fallocate};
        fallocate(
            &self.data,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            off as i64,
            (end - off) as i64,
        )?;
        let (whole_lo, whole_hi) = (off.div_ceil(SLOT), end / SLOT);
        let (lo, hi) = slots(off, end);
        let now = self.arrival_us();
        let mut st = self.model();
        if whole_lo < whole_hi {
            st.ftl.trim(whole_lo..whole_hi);
        }
        let partial: Vec<u64> = (lo..hi).filter(|&s| s < whole_lo || s >= whole_hi.max(whole_lo)).collect();
        if !partial.is_empty() {
            st.write_from(now, partial.into_iter())?;
        }
        Ok(())
    }
}

/// What a serve session did, printed when it ends.
#[derive(Debug, Serialize)]
pub(crate) struct ServeSummary {
    pub(crate) state: PathBuf,
    pub(crate) data: PathBuf,
    pub(crate) time_scale: f64,
    pub(crate) saved: bool,
    /// The retention age clock as saved (`reseq sim age` may move it while served).
    pub(crate) age_clock_days: f64,
    #[serde(flatten)]
    pub(crate) stats: ServeStats,
    /// Virtual seconds the session lasted.
    pub(crate) virtual_seconds: f64,
}

/// Checks the mount directory: it must exist, be a directory, not be a mount point
/// already and be empty.
fn check_mount_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(dir).map_err(|e| Error::input(format!("mount directory {}", dir.display()), e))?;
    if !md.is_dir() {
        return Err(Error::Usage(format!("{} is not a directory", dir.display())));
    }
    let parent = dir.canonicalize().ok().and_then(|d| d.parent().map(Path::to_path_buf));
    if let Some(p) = parent
        && std::fs::metadata(&p).is_ok_and(|pm| pm.dev() != md.dev())
    {
        return Err(Error::Usage(format!(
            "{} is a mount point already (another `reseq sim serve`?): unmount it or choose an empty directory",
            dir.display()
        )));
    }
    let mut entries =
        std::fs::read_dir(dir).map_err(|e| Error::input(format!("mount directory {}", dir.display()), e))?;
    if entries.next().is_some() {
        return Err(Error::Usage(format!("{} is not empty: serve into an empty directory", dir.display())));
    }
    Ok(())
}

/// Opens (creating if missing) the data file of a drive of `len` bytes and locks it, so
/// that one drive is served once.
fn open_data(path: &Path, len: u64) -> Result<File> {
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path);
    let f = f.map_err(|e| Error::input(format!("opening the drive's data file {}", path.display()), e))?;
    nix::fcntl::Flock::lock(
        f.try_clone().map_err(|e| Error::io("dup", e))?,
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .map(std::mem::forget)
    .map_err(|(_, e)| {
        Error::refused(
            format!("{} is locked by another process ({e}): this drive is being served already", path.display()),
            "stop the other `reseq sim serve` of this state file first",
        )
    })?;
    let size = f.metadata().map_err(|e| Error::io(format!("stat {}", path.display()), e))?.len();
    if size == 0 {
        f.set_len(len).map_err(|e| Error::io(format!("sizing {}", path.display()), e))?;
    } else if size != len {
        return Err(Error::Usage(format!(
            "{} holds {size} bytes but the drive has {len}: it belongs to another drive",
            path.display()
        )));
    }
    Ok(f)
}

/// The state file's drive, once the time scale, the mount directory and /dev/fuse are
/// checked.
fn checked_state(state_path: &Path, mount_dir: &Path, scale: f64) -> Result<SimState> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::Usage(format!("--time-scale must be a positive number, not {scale}")));
    }
    let state = super::load(state_path)?;
    check_mount_dir(mount_dir)?;
    if !Path::new("/dev/fuse").exists() {
        return Err(Error::refused(
            "no /dev/fuse: this kernel has no FUSE (or it is not loaded)",
            "modprobe fuse, or use `reseq sim …` and `sim:STATE` targets, which need no kernel support",
        ));
    }
    Ok(state)
}

/// The state file's inode: every save replaces the file, so a new one means a new state.
fn state_file_id(path: &Path) -> Option<u64> {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).ok()?).into()
}

fn spawn(name: &str, doing: &str, f: impl FnOnce() + Send + 'static) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| Error::io(doing, e))
}

/// A drive being served, in this process: [`Served::start`] mounts, [`Served::stop`]
/// unmounts and saves. Dropping it without `stop` detaches the mount lazily and does not
/// save.
pub(crate) struct Served {
    /// Where `reseq sim age` reaches the model (None: it cannot).
    control: Option<Channel>,
    session: fuser::BackgroundSession,
    timer: std::thread::JoinHandle<()>,
    reader: std::thread::JoinHandle<()>,
    state: Arc<Mutex<SimState>>,
    counters: Arc<ServeStats>,
    start: Instant,
    scale: f64,
    state_path: PathBuf,
    data_path: PathBuf,
    mount_dir: PathBuf,
}

impl Served {
    /// Checks everything (time scale, state file, mount dir, /dev/fuse, that nobody
    /// serves this drive already), then mounts `mount_dir/disk`.
    pub(crate) fn start(state_path: &Path, mount_dir: &Path, scale: f64) -> Result<Served> {
        let id = state_file_id(state_path);
        let state = checked_state(state_path, mount_dir, scale)?;
        let data_path = data_path(state_path);
        let len = state.len_bytes();
        let data = open_data(&data_path, len)?;
        // Saved (by `sim age`) between the load and the lock: the saved state is the one.
        let state = if state_file_id(state_path) == id { state } else { checked_state(state_path, mount_dir, scale)? };
        let host_gap_us = state.ftl.p.host_gap_us;
        let state = Arc::new(Mutex::new(state));
        let control = Channel::open(&data, state.clone(), state_path);
        let counters = Arc::new(ServeStats::default());
        let last_reply = Arc::new(AtomicU64::new(0f64.to_bits()));
        let (tx, rx) = crossbeam_channel::unbounded();
        let timer = {
            let (c, l) = (counters.clone(), last_reply.clone());
            spawn("serve-timer", "starting the reply timer", move || timer_thread(rx, c, l))?
        };
        let start = Instant::now();
        let replies = Replies { start, scale, timer: tx, seq: Arc::new(AtomicU64::new(0)) };
        let (reads_tx, reads_rx) = crossbeam_channel::unbounded();
        let reader = {
            let (st, r) = (state.clone(), replies.clone());
            spawn("serve-reads", "starting the read modeller", move || read_thread(reads_rx, st, r))?
        };
        let drive = Drive {
            state: state.clone(),
            data,
            replies,
            reads: reads_tx,
            last_reply,
            host_gap_us,
            counters: counters.clone(),
        };
        let session = OneFileFs::mount(drive, len, mount_dir, "reseq-sim").map_err(|e| mount_error(mount_dir, e))?;
        Ok(Served {
            control,
            session,
            timer,
            reader,
            state,
            counters,
            start,
            scale,
            state_path: state_path.to_path_buf(),
            data_path,
            mount_dir: mount_dir.to_path_buf(),
        })
    }

    /// The served file.
    pub(crate) fn disk(&self) -> PathBuf {
        self.mount_dir.join(DISK_NAME)
    }

    /// False once the filesystem was unmounted (`umount`, `fusermount -u`) or the
    /// connection aborted.
    pub(crate) fn is_mounted(&self) -> bool {
        !self.session.guard.is_finished()
    }

    /// Unmounts (not lazily: while a loop device holds the file this fails with EBUSY,
    /// and serving goes on), waits for the session to end, and saves the drive's state
    /// and data.
    pub(crate) fn stop(mut self) -> Result<ServeSummary> {
        if self.is_mounted() {
            match nix::mount::umount2(&self.mount_dir, nix::mount::MntFlags::empty()) {
                Ok(()) | Err(nix::errno::Errno::EINVAL) => {}
                Err(nix::errno::Errno::EBUSY) => {
                    return Err(Error::refused(
                        format!("{} is in use: cannot stop serving it", self.disk().display()),
                        "detach the loop device on it (losetup -d) and unmount what is mounted from it first",
                    ));
                }
                Err(e) => return Err(Error::io(format!("unmounting {}", self.mount_dir.display()), e.into())),
            }
        }
        let run = self.session.join();
        // The session's end dropped the drive and with it the read modeller's and the
        // timer's senders: each sends what it still holds, then ends.
        let _ = self.reader.join();
        let _ = self.timer.join();
        // No age request may change the model after it is saved.
        if let Some(c) = self.control.take() {
            c.close();
        }
        let virtual_seconds = self.start.elapsed().as_secs_f64() / self.scale;
        let path = &self.data_path;
        File::open(path).and_then(|f| f.sync_all()).map_err(|e| Error::io(format!("syncing {}", path.display()), e))?;
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        super::save(&state, &self.state_path)?;
        let age_clock_days = state.ftl.age_days;
        run.map_err(|e| Error::io("serving the FUSE session", e))?;
        Ok(ServeSummary {
            state: self.state_path.clone(),
            data: self.data_path.clone(),
            time_scale: self.scale,
            saved: true,
            age_clock_days,
            // Every other holder (the drive, the timer) has ended.
            stats: Arc::into_inner(self.counters).unwrap_or_default(),
            virtual_seconds,
        })
    }
}

/// `reseq sim serve STATE MOUNTDIR`: serves in the foreground until unmounted from
/// outside or signalled (SIGINT/SIGTERM: unmount, refused while a loop device holds the
/// file), then saves the state.
pub(crate) fn serve(state_path: &Path, mount_dir: &Path, scale: f64, quiet: bool) -> Result<ServeSummary> {
    use std::sync::atomic::AtomicUsize;
    let signalled = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_usize(sig, signalled.clone(), sig as usize)
            .map_err(|e| Error::io("installing signal handlers", e))?;
    }
    let served = Served::start(state_path, mount_dir, scale)?;
    if !quiet {
        eprintln!(
            "reseq sim serve: {} ({}) served as {} at time scale {scale}; stop with Ctrl-C, SIGTERM or `umount {}`",
            state_path.display(),
            crate::support::units::human_bytes(served.state.lock().map(|s| s.len_bytes()).unwrap_or(0)),
            served.disk().display(),
            mount_dir.display()
        );
    }
    while served.is_mounted() {
        let sig = signalled.swap(0, Ordering::SeqCst);
        if sig != 0 {
            match nix::mount::umount2(mount_dir, nix::mount::MntFlags::empty()) {
                Ok(()) => {}
                Err(nix::errno::Errno::EBUSY) => eprintln!(
                    "reseq sim serve: signal {sig}: {} is in use (a loop device on it?): still serving. Detach it (losetup -d) and signal again",
                    served.disk().display()
                ),
                Err(e) => eprintln!("reseq sim serve: signal {sig}: unmounting {}: {e}", mount_dir.display()),
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    served.stop()
}

fn mount_error(dir: &Path, e: std::io::Error) -> Error {
    let what = format!("mounting FUSE at {}: {e}", dir.display());
    match e.kind() {
        std::io::ErrorKind::PermissionDenied => Error::refused(what, "run as root"),
        _ if !nix::unistd::geteuid().is_root() => {
            Error::refused(what, "run as root (a non-root mount needs fusermount3 and /etc/fuse.conf)")
        }
        _ => Error::io(what, e),
    }
}
