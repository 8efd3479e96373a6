//! `reseq demo`: the main job on a throwaway device, for a newcomer.
//!
//! Where FUSE is available it runs on an emulated SSD ([`emulated`]): the FTL model
//! served through FUSE under a loop device, so the before and after are a real speed-up
//! by the clock. Otherwise (or with `--no-fuse`) it makes a sparse image in a temporary directory, attaches a loop device, puts ext4
//! on it, writes a database-like file (8 KiB pages) and overwrites pages at random the
//! way a database does, then re-sequences the device *while it is mounted* with the real
//! code path (freeze windows, guardian, verification, journal), checks the file is
//! byte-identical, runs e2fsck, and cleans everything up, on failure too.

use std::io::{Seek, SeekFrom, Write};

use crate::options::rewrite::{Mode, RewriteOptions, RunOptions};
use crate::report::Report;
use crate::support::error::{Error, Result};
use crate::support::output::{WIDTH, fit};
use crate::support::scratch::{LoopDevice, Mount, XorShift, hash_path, mkfs_ext4};
use crate::support::tool::Tool;
use crate::support::units::{Size, human_bytes};

const PAGE: usize = 8192;

fn io(ctx: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(ctx.to_string(), e)
}

/// Runs the demo; returns the rewrite's report.
/// `size`: of the throwaway image; `no_fuse`: the plain demo on a loop device.
pub(crate) fn run(size: Size, no_fuse: bool, quiet: bool) -> (Option<Report>, Result<()>) {
    if !nix::unistd::geteuid().is_root() {
        let e = Error::refused(
            "the demo attaches a loop device and mounts ext4 on it, which needs root",
            "run `sudo reseq demo` (it touches only a temporary image file)",
        );
        return (None, Err(e));
    }
    let size = size.bytes();
    if size < 64 << 20 {
        return (None, Err(Error::Usage("--size must be at least 64M".into())));
    }
    let mut report = None;
    if !no_fuse {
        if std::path::Path::new("/dev/fuse").exists() {
            let r = emulated(size, quiet, &mut report);
            return (report, r);
        }
        say(
            quiet,
            "no /dev/fuse (FUSE is missing): running the plain demo on a loop device, which has no FTL and so nothing to speed up".into(),
        );
    }
    let r = demo(size, quiet, &mut report);
    (report, r)
}

/// The demo's rewrite: the defaults, with 1 s windows, a pause of 100 ms between them,
/// the benchmark re-checked 5 s later, and the state in the demo's directory.
fn rewrite_options(target: &std::path::Path, state_dir: std::path::PathBuf, bench: bool) -> RewriteOptions {
    RewriteOptions {
        mode: if bench { Mode::Files } else { Mode::Device },
        targets: vec![target.to_path_buf()],
        run: RunOptions {
            max_freeze: Some(std::time::Duration::from_secs(1)),
            pause: std::time::Duration::from_millis(100),
            bench,
            ..Default::default()
        },
        state_dir,
        // The emulated drive's speed-up lasts: 5 s later is enough to show it does.
        bench_opts: crate::options::bench::BenchOptions {
            recheck: std::time::Duration::from_secs(5),
            ..Default::default()
        },
        ..RewriteOptions::default()
    }
}

/// A database-like file: `pages` 8 KiB pages written in order, then `updates` random page
/// overwrites with an fsync every 256, as a database's checkpoints do.
fn database_file(path: &std::path::Path, pages: usize, updates: usize) -> Result<blake3::Hash> {
    let mut rng = XorShift::new(0x5eed);
    let mut db = std::fs::File::create(path).map_err(io("creating the database file"))?;
    let mut page = vec![0u8; PAGE];
    for p in 0..pages {
        rng.fill(&mut page);
        page[..8].copy_from_slice(&(p as u64).to_le_bytes());
        db.write_all(&page).map_err(io("writing the database file"))?;
    }
    db.sync_all().map_err(io("syncing"))?;
    for i in 0..updates {
        let p = (rng.next_u64() % pages as u64) as usize;
        rng.fill(&mut page);
        page[..8].copy_from_slice(&(p as u64).to_le_bytes());
        db.seek(SeekFrom::Start((p * PAGE) as u64)).map_err(io("seeking"))?;
        db.write_all(&page).map_err(io("updating a page"))?;
        if i % 256 == 255 {
            db.sync_data().map_err(io("syncing"))?;
        }
    }
    db.sync_all().map_err(io("syncing"))?;
    drop(db);
    hash_path(path).map_err(io("hashing the database file"))
}

/// The demo on an emulated consumer SSD: `reseq sim serve` in this process, a loop device
/// on its file, ext4, a database-like file degraded by random page writes through the
/// filesystem, then `reseq rewrite FILE --bench` (file mode, live, in 1 s freeze windows,
/// with a benchmark before and after), all by the wall clock.
fn emulated(size: u64, quiet: bool, report_out: &mut Option<Report>) -> Result<()> {
    let started = std::time::Instant::now();
    let dir = tempfile::Builder::new().prefix("reseq-demo-").tempdir().map_err(io("creating a temporary directory"))?;
    // Declared in this order, dropped in the other: the loop device before its server.
    let served = emulated_drive(dir.path())?;
    let lo = loop_on(&served, quiet)?;
    mkfs_ext4(&lo.path).map_err(io("making ext4"))?;
    let mnt = Mount::new(&lo.path, &dir.path().join("mnt"), &[]).map_err(io("mounting"))?;
    let db_path = mnt.dir.join("table.db");
    let file = (size / 2).clamp(32 << 20, 256 << 20);
    let pages = (file / PAGE as u64) as usize;
    let before = database_file(&db_path, pages, pages / 2)?;
    say(
        quiet,
        format!(
            "ext4 at {}: {} of 8 KiB pages written in order, then {} random updates with fsync",
            mnt.dir.display(),
            human_bytes(file),
            pages / 2
        ),
    );
    say(
        quiet,
        format!("reseq rewrite {} --bench: reads timed, rewritten live in 1 s windows, timed again", db_path.display()),
    );
    let (report, result) = crate::rewrite::run(&rewrite_options(&db_path, dir.path().join("state"), true), quiet);
    let verdict = report.verdict.as_ref().map(|v| format!("{} (x{:.2})", v.verdict, v.speedup));
    *report_out = Some(report);
    result?;
    unchanged_and_clean(&db_path, before, mnt, &lo)?;
    drop(lo);
    served.stop()?;
    say(
        quiet,
        format!(
            "verdict: {}; the file byte-identical, e2fsck -fn clean; {:.0} s by the clock; cleaned up",
            verdict.unwrap_or_else(|| "none".into()),
            started.elapsed().as_secs_f64()
        ),
    );
    Ok(())
}

/// 2 GiB: the smallest emulated drive of the preset whose garbage collection works; sparse.
const EMULATED_DRIVE: u64 = 2 << 30;

/// The emulated drive: `reseq sim serve` of a fresh consumer NVMe model, in a child process.
fn emulated_drive(dir: &std::path::Path) -> Result<ServeChild> {
    let params = crate::sim::ftl::Params {
        logical_bytes: EMULATED_DRIVE,
        ..crate::sim::ftl::Params::preset("consumer-nvme").expect("a preset")
    };
    let state_path = dir.join("drive.sim");
    crate::sim::SimState::new(params).save(&state_path).map_err(io("creating the emulated drive"))?;
    let fuse_dir = dir.join("fuse");
    std::fs::create_dir(&fuse_dir).map_err(io("creating the mount directory"))?;
    // A child process: the rewrite forks a guardian, which a process with threads (the
    // FUSE session's) must not do.
    ServeChild::start(&state_path, &fuse_dir)
}

/// A loop device (4096-byte sectors) on the emulated drive's file.
fn loop_on(served: &ServeChild, quiet: bool) -> Result<LoopDevice> {
    let lo = LoopDevice::attach(&served.disk(), &["--sector-size", "4096"]).map_err(io("attaching a loop device"))?;
    say(
        quiet,
        format!(
            "an emulated consumer NVMe SSD ({}, time x{}) served by FUSE as {}, loop device {}",
            human_bytes(EMULATED_DRIVE),
            crate::sim::serve::DEFAULT_TIME_SCALE,
            served.disk().display(),
            lo.path.display()
        ),
    );
    Ok(lo)
}

/// A step of the demo, for a person at a terminal or reading a CI log: fitted to
/// [`WIDTH`] columns either way (its paths are a temporary directory's).
fn say(quiet: bool, msg: String) {
    if !quiet {
        eprint!("{}", fit(&format!("demo: {msg}\n"), WIDTH));
    }
}

fn demo(size: u64, quiet: bool, report_out: &mut Option<Report>) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("reseq-demo-").tempdir().map_err(io("creating a temporary directory"))?;
    let image = dir.path().join("disk.img");
    let lo = LoopDevice::create(&image, size).map_err(io("attaching a loop device"))?;
    say(quiet, format!("attached {} over a sparse {} image {}", lo.path.display(), human_bytes(size), image.display()));
    mkfs_ext4(&lo.path).map_err(io("making ext4"))?;
    let mnt = Mount::new(&lo.path, &dir.path().join("mnt"), &[]).map_err(io("mounting"))?;
    say(quiet, format!("mounted ext4 at {}", mnt.dir.display()));

    // A database-like file: pages written in order, then overwritten at random.
    let db_path = mnt.dir.join("table.db");
    let pages = (size / 4 / PAGE as u64) as usize;
    let updates = pages * 2;
    let before = database_file(&db_path, pages, updates)?;
    say(
        quiet,
        format!(
            "wrote {} of 8 KiB pages, then {updates} random page updates (blake3 {})",
            human_bytes((pages * PAGE) as u64),
            &before.to_hex()[..16]
        ),
    );

    say(
        quiet,
        format!(
            "re-sequencing {} while mounted: reseq rewrite {} --max-freeze 1s",
            lo.path.display(),
            lo.path.display()
        ),
    );
    let (report, result) = crate::rewrite::run(&rewrite_options(&lo.path, dir.path().join("state"), false), quiet);
    *report_out = Some(report);
    result?;
    std::fs::write(mnt.dir.join("after.txt"), b"the filesystem takes writes: it is thawed\n")
        .map_err(io("writing after the run"))?;
    unchanged_and_clean(&db_path, before, mnt, &lo)?;
    say(quiet, "database file byte-identical, filesystem thawed and writable, e2fsck -fn clean".into());
    drop(lo);
    say(quiet, "cleaned up the loop device and the image".into());
    Ok(())
}

/// After the run: the database file byte-identical, and the filesystem, unmounted,
/// clean by e2fsck.
fn unchanged_and_clean(db: &std::path::Path, before: blake3::Hash, mnt: Mount, lo: &LoopDevice) -> Result<()> {
    let after = hash_path(db).map_err(io("hashing the database file again"))?;
    if after != before {
        return Err(Error::Internal(format!("the database file changed: {before} -> {after}")));
    }
    mnt.unmount().map_err(io("unmounting"))?;
    let fsck = Tool::new("e2fsck").args(["-f", "-n"]).arg(&lo.path).run();
    fsck.map(drop).map_err(|e| io("e2fsck after the run")(e.into()))
}

/// `reseq sim serve` as a child process; stopped (SIGTERM, then unmount and SIGKILL) on
/// drop, so drop what is on its file first.
struct ServeChild {
    child: Option<std::process::Child>,
    dir: std::path::PathBuf,
}

impl ServeChild {
    fn start(state: &std::path::Path, dir: &std::path::Path) -> Result<ServeChild> {
        let exe = std::env::current_exe().map_err(io("finding this program"))?;
        let child = Tool::at(exe)
            .args(["--quiet", "sim", "serve"])
            .arg(state)
            .arg(dir)
            .spawn()
            .map_err(|e| io("starting reseq sim serve")(e.into()))?;
        let mut s = ServeChild { child: Some(child), dir: dir.to_path_buf() };
        let t = std::time::Instant::now();
        while !s.disk().exists() {
            if let Some(st) = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                return Err(Error::Internal(format!("reseq sim serve exited {st} before serving")));
            }
            if t.elapsed() > std::time::Duration::from_secs(10) {
                return Err(Error::Internal("reseq sim serve did not mount within 10 s".into()));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(s)
    }

    fn disk(&self) -> std::path::PathBuf {
        self.dir.join(crate::sim::onefile::DISK_NAME)
    }

    /// SIGTERM and wait: the server unmounts and saves.
    fn stop(mut self) -> Result<()> {
        match self.terminate(std::time::Duration::from_secs(30)) {
            Some(st) if st.success() => Ok(()),
            st => Err(Error::Internal(format!("reseq sim serve ended with {st:?}"))),
        }
    }

    fn terminate(&mut self, wait: std::time::Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let t = std::time::Instant::now();
        while t.elapsed() < wait {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = Tool::new("umount").arg("-l").arg(&self.dir).output();
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        self.terminate(std::time::Duration::from_secs(10));
    }
}
