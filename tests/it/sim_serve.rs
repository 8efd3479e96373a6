//! `reseq sim serve`: the simulated SSD in the kernel's I/O path (FUSE file, loop device
//! with direct I/O, ext4), degraded by random writes through the filesystem and restored
//! by reseq's real code paths, measured by the wall clock.
//!
//! Sizes: the 2 GiB drive, with a 128 MiB file and 64 MiB of random 4 KiB
//! overwrites in the main test (a quarter of the issue's: the same effect, reads x2.4-2.7
//! slower, in 59 s instead of 101); the datacenter-sata test a 128 MiB file on a 4 GiB
//! drive (the smallest that preset's garbage collection works on; its reads are
//! link-bound and flat whatever the layout, so size adds nothing but time). Time scale 6 (model µs × 6 = wall µs): a
//! fresh read of the consumer drive then runs at about 370 MiB/s, a third of what this
//! FUSE path sustains (about 1.1 GB/s at 1 MiB, QD1, on the 2-core VM), so the model's
//! time, not the host, sets the durations. The host can only make a served read slower
//! than the model, never faster (no reply leaves before its modelled completion), so
//! rates are compared on each benchmark's fastest pass, the one a busy host disturbed
//! least.
//!
//! The tests of this file take one lock: two served drives at once would share the CPUs
//! and blur each other's clocks.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const MIB: u64 = 1 << 20;
const SCALE: f64 = 6.0;
/// The main test's file: 128 MiB (256 MiB measured the same effect in twice the time).
const DB: u64 = 128 * MIB;

/// A running `reseq sim serve`; stopped (SIGTERM, then unmount and SIGKILL) on drop, so
/// drop the loop device and mounts on it first.
pub(crate) struct Server {
    child: Option<Child>,
    dir: PathBuf,
    out: PathBuf,
    err: PathBuf,
}

impl Server {
    pub(crate) fn start(env: &TestEnv, state: &Path, scale: f64) -> Server {
        let dir = env.path("served");
        std::fs::create_dir_all(&dir).unwrap();
        let (out, err) = (env.path("serve.out"), env.path("serve.err"));
        let child = env
            .reseq()
            .args(["sim", "serve"])
            .arg(state)
            .arg(&dir)
            .arg("--time-scale")
            .arg(scale.to_string())
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .expect("start reseq sim serve");
        let mut s = Server { child: Some(child), dir, out, err };
        let t = Instant::now();
        while !s.disk().exists() {
            if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("sim serve exited {st}: {}", std::fs::read_to_string(&s.err).unwrap_or_default());
            }
            assert!(t.elapsed() < Duration::from_secs(10), "sim serve did not mount in 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub(crate) fn disk(&self) -> PathBuf {
        self.dir.join("disk")
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// SIGTERM; the server unmounts, saves and prints its summary. Returns it.
    pub(crate) fn stop(mut self) -> serde_json::Value {
        let mut child = self.child.take().unwrap();
        signal(child.id() as i32, nix::sys::signal::Signal::SIGTERM);
        let status = wait_for(&mut child, Duration::from_secs(30)).expect("sim serve stops on SIGTERM");
        let err = std::fs::read_to_string(&self.err).unwrap_or_default();
        eprintln!("--- sim serve stderr:\n{err}");
        assert_eq!(status.code(), Some(0), "sim serve: {err}");
        serde_json::from_str(&std::fs::read_to_string(&self.out).unwrap()).expect("serve summary")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        signal(child.id() as i32, nix::sys::signal::Signal::SIGTERM);
        if wait_for(&mut child, Duration::from_secs(20)).is_none() {
            sigkill(child.id() as i32);
            let _ = child.wait();
        }
        // A killed server leaves its mount behind ("transport endpoint is not connected").
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if mounts.contains(self.dir.to_str().unwrap()) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).output();
        }
    }
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A new drive of `preset` and `size` (its state file in the test's directory), served
/// at `scale`, and a loop device of 4 KiB sectors over it. Drop the loop device first.
fn served(env: &TestEnv, preset: &str, size: &str, scale: f64) -> (PathBuf, Server, LoopDevice) {
    let state = env.path("drive");
    sim(env, &["create", state.to_str().unwrap(), "--preset", preset, "--device-size", size]);
    let server = Server::start(env, &state, scale);
    let lo = LoopDevice::attach(&server.disk(), &["--sector-size", "4096"]).unwrap();
    (state, server, lo)
}

pub(crate) fn sim(env: &TestEnv, args: &[&str]) -> serde_json::Value {
    let out = output(env.reseq().arg("sim").args(args));
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Writes `len` deterministic random bytes to a new file, sequentially, then fsyncs.
pub(crate) fn write_file(path: &Path, len: u64, seed: u64) {
    let f = File::create(path).unwrap();
    let mut rng = XorShift::new(seed);
    let mut buf = vec![0u8; MIB as usize];
    for off in (0..len).step_by(buf.len()) {
        rng.fill(&mut buf);
        f.write_all_at(&buf, off).unwrap();
    }
    f.sync_all().unwrap();
}

/// `bytes` of random 4 KiB overwrites in place, through the filesystem, fsync every 256.
pub(crate) fn degrade(path: &Path, bytes: u64, seed: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let pages = f.metadata().unwrap().len() / 4096;
    let mut rng = XorShift::new(seed);
    let mut page = vec![0u8; 4096];
    for i in 0..bytes / 4096 {
        rng.fill(&mut page);
        f.write_all_at(&page, rng.next_u64() % pages * 4096).unwrap();
        if i % 256 == 255 {
            f.sync_data().unwrap();
        }
    }
    f.sync_all().unwrap();
}

/// `reseq bench PATH`: the fastest pass's rate, bytes/s, and the report.
/// Where the drive answered late for over a fifth of the passes' time (reseq's own bar
/// for a verdict: the host, not the model, set the speed), waits 2 s and measures again,
/// at most twice; then fails, naming the lateness.
fn bench(env: &TestEnv, path: &Path, extra: &[&str]) -> (f64, serde_json::Value) {
    for n in 0..3 {
        let r = json_ok(env.reseq().arg("bench").arg(path).args(extra).arg("--json"));
        let b = &r["bench"];
        assert_eq!(b["cache"]["cache_suspected"], false, "a cache under the served drive: {}", b["cache"]);
        // Unknown where reseq does not find the drive under the target (btrfs).
        let late = b["emulated"]["late_share"].as_f64().unwrap_or(0.0);
        if late <= 0.20 {
            return (b["max_bytes_per_second"].as_f64().unwrap(), r);
        }
        assert!(n < 2, "the host did not keep up with the emulated drive in 3 benchmarks: {}", b["emulated"]);
        eprintln!("the host did not keep up with the emulated drive ({}): measured again", b["emulated"]);
        std::thread::sleep(Duration::from_secs(2));
    }
    unreachable!()
}

/// Physical extents of a file on its device: (offset, length).
fn extents(path: &Path) -> Vec<(u64, u64)> {
    let f = File::open(path).unwrap();
    reseq::testing::fiemap(std::os::fd::AsFd::as_fd(&f), 0, reseq::testing::FIEMAP_FLAG_SYNC)
        .unwrap()
        .iter()
        .map(|e| (e.physical, e.length))
        .collect()
}

fn overlap(a: &[(u64, u64)], b: &[(u64, u64)]) -> u64 {
    let mut n = 0;
    for &(ao, al) in a {
        for &(bo, bl) in b {
            n += (ao + al).min(bo + bl).saturating_sub(ao.max(bo));
        }
    }
    n
}

fn within(a: f64, b: f64, tolerance: f64) -> bool {
    (a / b - 1.0).abs() <= tolerance
}

/// A rewrite with `--bench` whose verdict must decide. Where the emulated drive answered
/// late (this host did not keep up with the time scale) or the host's load changed
/// between the benchmarks (reseq says "unreliable" and why), the drive is degraded again
/// and the rewrite repeated, by `attempt(n)` for n = 1 and 2; the third report is
/// returned whatever it says, for the caller to fail on.
/// `attempt` returns the report and the target's hash before that rewrite.
fn until_decided<H>(what: &str, mut attempt: impl FnMut(u32) -> (serde_json::Value, H)) -> (serde_json::Value, H) {
    for n in 0..3 {
        let (r, hash) = attempt(n);
        let v = &r["verdict"];
        let rule = v["rule"].as_str().unwrap_or_default();
        // The host did not hold still: it answered late for the drive, or its load changed
        // between the benchmarks (seen under bench/load.sh's looping dd). No verdict on the
        // drive either way.
        let late = rule.contains("answered") && rule.contains("late");
        let unsteady = late || rule.contains("the host's load changed");
        if v["verdict"] != "unreliable" || !unsteady || n == 2 {
            return (r, hash);
        }
        eprintln!("{what}: the host did not hold still for the emulated drive: degraded and run again: {rule}");
    }
    unreachable!()
}

/// The setup, by the clock: a 2 GiB emulated consumer NVMe, ext4, a file written
/// sequentially then overwritten at random (half its size in 4 KiB writes with fsync);
/// file mode restores it, then device mode with --only-slow restores it again and leaves
/// a file nobody degraded alone.
#[test]
fn consumer_nvme_degrades_and_file_and_device_mode_restore_it() {
    if !require(&["losetup", "mkfs.ext4", "e2fsck", "fstrim"]) || !require_fuse() {
        return;
    }
    let _one = exclusive();
    let env = TestEnv::new();
    let (state, server, lo) = served(&env, "consumer-nvme", "2G", SCALE);
    // A small journal and few inodes: the data in use is the files, as on a database's
    // drive, and device mode's benchmark over it is not diluted by fresh metadata.
    run_cmd(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-J", "size=16", "-N", "8192"])
            .args(["-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&lo.path),
    )
    .unwrap();
    let mnt = Mount::new(&lo.path, &env.path("mnt"), &[]).unwrap();
    let (db, cold) = (mnt.dir.join("table.db"), mnt.dir.join("cold.bin"));
    write_file(&db, DB, 1);
    write_file(&cold, DB / 2, 2);
    let cold_hash = hash_path(&cold).unwrap();

    let (fresh, _) = bench(&env, &db, &[]);
    degrade(&db, DB / 2, 3);
    let (degraded, _) = bench(&env, &db, &[]);
    eprintln!("fresh {:.0} MiB/s, degraded {:.0} MiB/s", fresh / MIB as f64, degraded / MIB as f64);
    assert!(fresh >= 2.0 * degraded, "random writes must make it at least x2 slower: {fresh} -> {degraded}");
    estimates_find_slowness(&env, &mnt.dir, &db);

    // File mode, live, in freeze windows.
    let (r, db_hash) = until_decided("file mode", |n| {
        if n > 0 {
            degrade(&db, DB / 2, 30 + n as u64);
        }
        let db_hash = hash_path(&db).unwrap();
        let args = ["--bench", "--bench-recheck", "5s", "--json", "--state-dir"];
        (json_ok(env.reseq().arg("rewrite").arg(&db).args(args).arg(env.state_dir())), db_hash)
    });
    assert_eq!(r["verdict"]["verdict"], "faster", "{}", r["verdict"]);
    // Re-sequencing lasts (a cache's speed-up would fade: bench_reports::a_speed_up_that_fades_is_not_called_faster).
    assert_eq!(r["verdict"]["recheck"]["verdict"], "faster", "{}", r["verdict"]);
    assert!(r["verdict"]["recheck"]["after_seconds"].as_f64().unwrap() >= 5.0);
    let after = r["bench_after"]["max_bytes_per_second"].as_f64().unwrap();
    assert!(within(after, fresh, 0.10), "file mode: after {after} vs fresh {fresh}: not within 10 %");
    assert_eq!(hash_path(&db).unwrap(), db_hash, "file contents changed");

    // Device mode, --only-slow: the degraded file's regions, not the cold file's.
    let (r, db_hash) = until_decided("device mode", |n| {
        degrade(&db, DB / 2, 4 + 10 * n as u64);
        let db_hash = hash_path(&db).unwrap();
        let (degraded2, _) = bench(&env, &db, &[]);
        assert!(fresh >= 2.0 * degraded2, "degraded again: {fresh} -> {degraded2}");
        let args = ["--only-slow", "--bench", "--bench-passes", "2", "--bench-recheck", "2s", "--json", "--state-dir"];
        (json_ok(env.reseq().arg("rewrite").arg(&lo.path).args(args).arg(env.state_dir())), db_hash)
    });
    assert_eq!(r["verdict"]["verdict"], "faster", "{}", r["verdict"]);
    let ranges = |reg: &serde_json::Value| -> Vec<(u64, u64)> {
        reg["device_ranges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap()))
            .collect()
    };
    let regions = r["selection"]["chosen"].as_array().unwrap();
    let chosen: Vec<(u64, u64)> = regions.iter().flat_map(ranges).collect();
    let (db_ext, cold_ext) = (extents(&db), extents(&cold));
    let (on_db, on_cold) = (overlap(&chosen, &db_ext), overlap(&chosen, &cold_ext));
    eprintln!("--only-slow chose {on_db} bytes of the degraded file, {on_cold} of the cold one");
    assert!(on_db >= DB * 9 / 10, "--only-slow missed degraded regions: {on_db} of {DB}");
    // A region straddling the cold file's ends and degraded data may be chosen; one that
    // holds only the cold file must not be.
    for reg in regions {
        let rs = ranges(reg);
        let len: u64 = rs.iter().map(|r| r.1).sum();
        assert!(overlap(&rs, &cold_ext) < len, "--only-slow picked a region of the file nobody degraded: {reg}");
    }
    assert!(on_cold < DB / 2 / 4, "--only-slow picked {on_cold} bytes of the file nobody degraded");
    let (restored, _) = bench(&env, &db, &[]);
    assert!(within(restored, fresh, 0.10), "device mode: {restored} vs fresh {fresh}: not within 10 %");
    assert_eq!(hash_path(&db).unwrap(), db_hash, "file contents changed");
    assert_eq!(hash_path(&cold).unwrap(), cold_hash, "cold file changed");

    // Discards reach the model as trims: the cold file deleted and FITRIM, its 128 MiB
    // are unmapped in the model.
    std::fs::remove_file(&cold).unwrap();
    // ext4 frees a deleted file's blocks when the deletion's transaction commits.
    run_cmd(Command::new("sync").arg("-f").arg(&mnt.dir)).expect("sync");
    run_cmd(Command::new("fstrim").arg(&mnt.dir)).expect("fstrim");
    mnt.unmount().unwrap();
    run_cmd(Command::new("e2fsck").args(["-f", "-n"]).arg(&lo.path)).expect("e2fsck -fn clean");
    drop(lo);
    let summary = server.stop();
    assert_eq!(summary["saved"], true);
    assert!(summary["write_requests"].as_u64().unwrap() > 0 && summary["read_requests"].as_u64().unwrap() > 0);
    // What stays mapped: the file and ext4's metadata (a 16 MiB journal, a few MiB of
    // tables); the cold file's would pass the bound.
    let mapped = sim(&env, &["info", state.to_str().unwrap()])["mapped_bytes"].as_u64().unwrap();
    eprintln!("mapped after fstrim: {} MiB", mapped / MIB);
    assert!(mapped < DB + DB / 2 - 16 * MIB, "the deleted file's blocks are still mapped: {mapped}");
}

/// `estimate` of a file degraded all over (every place equally slow: only the drive
/// around it shows what it reads at its best) and of one degraded in its first half says
/// "worth it", with the slow places slow at each of their three readings; a file nobody
/// degraded does not.
fn estimates_find_slowness(env: &TestEnv, dir: &Path, all_over: &Path) {
    let part = dir.join("part.db");
    write_file(&part, DB / 2, 5);
    degrade_part(&part, DB / 4, DB / 4, 6);
    for (file, worth) in [(all_over, true), (part.as_path(), true), (&dir.join("cold.bin"), false)] {
        let r = json_ok(env.reseq().arg("estimate").arg(file).arg("--json"));
        let e = &r["estimate"];
        let advice = e["advice"].as_str().unwrap();
        eprintln!("estimate {}: {advice}", file.display());
        assert_eq!(advice.starts_with("worth it"), worth, "{}: {e}", file.display());
        if worth {
            assert!(e["slow_regions"].as_u64().unwrap() >= 2, "{e}");
            let slow = e["regions"].as_array().unwrap().iter().filter(|r| r["slow"] == true);
            for r in slow {
                assert_eq!(r["readings_bytes_per_second"].as_array().unwrap().len(), 3, "{r}");
            }
        }
    }
    std::fs::remove_file(&part).unwrap();
}

/// `bytes` of random 4 KiB overwrites into the first `span` bytes of a file.
fn degrade_part(path: &Path, span: u64, bytes: u64, seed: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut rng = XorShift::new(seed);
    let mut page = vec![0u8; 4096];
    for i in 0..bytes / 4096 {
        rng.fill(&mut page);
        f.write_all_at(&page, rng.next_u64() % (span / 4096) * 4096).unwrap();
        if i % 256 == 255 {
            f.sync_data().unwrap();
        }
    }
    f.sync_all().unwrap();
}

/// The wall-clock time of reads through FUSE and the loop device is the model's time
/// (`sim read` of the same state) times the scale, within 10 %, fresh and degraded. At the
/// default scale (10), which this test uses.
#[test]
fn served_read_time_matches_sim_read() {
    if !require(&["losetup"]) || !require_fuse() {
        return;
    }
    let _one = exclusive();
    let env = TestEnv::new();
    let state = env.path("drive");
    let st = state.to_str().unwrap();
    sim(&env, &["create", st, "--preset", "consumer-nvme", "--device-size", "2G"]);
    sim(&env, &["write", st, "--length", "512M"]);
    sim(&env, &["fragment", st, "--length", "256M", "--random-writes", "128M"]);
    let model = |off: &str| {
        sim(&env, &["read", st, "--offset", off, "--length", "128M"])["virtual_seconds"].as_f64().unwrap() * 10.0
    };
    let (degraded_model, fresh_model) = (model("64M"), model("384M"));
    assert!(degraded_model > 1.5 * fresh_model, "the model must see the degradation");

    let server = Server::start(&env, &state, 10.0);
    let lo = LoopDevice::attach(&server.disk(), &["--sector-size", "4096"]).unwrap();
    assert_eq!(std::fs::read_to_string(format!("/sys/block/{}/loop/dio", lo.name())).unwrap().trim(), "1");
    // The wall time, and the share of the passes' time the drive's replies were late (the
    // host, not the model, slowed them by that much at most: 0.05-0.15 on a quiet 2-core
    // VM).
    let wall = |off: &str| {
        let (rate, r) = bench(&env, &lo.path, &["--offset", off, "--length", "128M"]);
        ((128 * MIB) as f64 / rate, r["bench"]["emulated"]["late_share"].as_f64().expect("the drive's replies"))
    };
    let ((degraded_wall, d_late), (fresh_wall, f_late)) = (wall("64M"), wall("384M"));
    eprintln!(
        "degraded: model x10 {degraded_model:.3} s, wall {degraded_wall:.3} s (late {d_late:.2}); fresh: {fresh_model:.3} s, {fresh_wall:.3} s (late {f_late:.2})"
    );
    // Never faster than the model (a drive that skipped its model's time would read these
    // 128 MiB in a fifth of it, as fast as FUSE goes); slower by what the lateness
    // accounts for and 25 %: the kernel's FUSE path adds time per request before the
    // drive sees it, which no reply's lateness counts (fresh reads at x1.18-1.20 the
    // model with 0.05-0.15 late, on the same VM on a slower day; x1.1 had held before).
    let holds = |wall: f64, model: f64, late: f64| wall >= 0.9 * model && wall <= model * (1.25 + late);
    assert!(holds(degraded_wall, degraded_model, d_late), "degraded: {degraded_wall} s vs {degraded_model} s");
    assert!(holds(fresh_wall, fresh_model, f_late), "fresh: {fresh_wall} s vs {fresh_model} s");
    drop(lo);
    server.stop();
}

/// A drive whose reads are bound by its link, not its layout: the same degradation and
/// rewrite through ext4 give "no measurable change".
#[test]
fn datacenter_sata_shows_no_measurable_change() {
    if !require(&["losetup", "mkfs.ext4"]) || !require_fuse() {
        return;
    }
    let _one = exclusive();
    let env = TestEnv::new();
    let (_, server, lo) = served(&env, "datacenter-sata", "1G", 3.0);
    mkfs_ext4(&lo.path).unwrap();
    let mnt = Mount::new(&lo.path, &env.path("mnt"), &[]).unwrap();
    let db = mnt.dir.join("table.db");
    write_file(&db, 128 * MIB, 1);
    let (r, db_hash) = until_decided("datacenter", |n| {
        degrade(&db, 64 * MIB, 3 + 10 * n as u64);
        let db_hash = hash_path(&db).unwrap();
        let args = ["--bench", "--json", "--state-dir"];
        (json_ok(env.reseq().arg("rewrite").arg(&db).args(args).arg(env.state_dir())), db_hash)
    });
    assert_eq!(r["verdict"]["verdict"], "no_measurable_change", "{}", r["verdict"]);
    assert_eq!(hash_path(&db).unwrap(), db_hash);
    mnt.unmount().unwrap();
    drop(lo);
    assert_eq!(server.stop()["saved"], true);
}

/// The server killed (SIGKILL) while reseq rewrites a file on the drive: the loop
/// device's requests fail (the FUSE connection is gone, EIO), reseq stops with an I/O
/// error within a bound, and the filesystem is not left frozen.
#[test]
fn server_killed_mid_rewrite_reseq_stops_and_thaws() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) || !require_fuse() {
        return;
    }
    let _one = exclusive();
    let env = TestEnv::new();
    let (_, server, lo) = served(&env, "consumer-nvme", "2G", SCALE);
    mkfs_ext4(&lo.path).unwrap();
    let mnt = Mount::new(&lo.path, &env.path("mnt"), &[]).unwrap();
    let db = mnt.dir.join("table.db");
    write_file(&db, 256 * MIB, 1);
    let child = Running::captured(
        env.reseq()
            .arg("rewrite")
            .arg(&db)
            .args(["--max-freeze", "1s", "--rate", "64M", "--json", "--state-dir"])
            .arg(env.state_dir()),
    );
    std::thread::sleep(Duration::from_millis(1500));
    sigkill(server.pid());
    let t = Instant::now();
    let out = child.wait();
    eprintln!("reseq stopped {:.1} s after the server was killed", t.elapsed().as_secs_f64());
    assert!(t.elapsed() < Duration::from_secs(30), "reseq did not stop within 30 s");
    assert_eq!(out.status.code(), Some(4), "an I/O error (exit 4)");
    assert!(stderr(&out).contains("thaw") || !stderr(&out).is_empty());
    // FIFREEZE fails with EBUSY only on a frozen filesystem; on one shut down by the
    // errors it fails otherwise, and that is not frozen either.
    let f = Command::new("fsfreeze").arg("-f").arg(&mnt.dir).output().unwrap();
    let e = String::from_utf8_lossy(&f.stderr).to_string();
    if f.status.success() {
        run_cmd(Command::new("fsfreeze").arg("-u").arg(&mnt.dir)).unwrap();
    }
    assert!(!e.contains("busy"), "the filesystem was left frozen: {e}");
    drop(mnt);
    drop(lo);
}

/// Bad input: each a clear error and its exit code, before anything is mounted.
#[test]
fn bad_input_is_refused_with_its_exit_code() {
    if !require(&["losetup"]) || !require_fuse() {
        return;
    }
    // Nothing here is timed: it shares the machine.
    let env = TestEnv::new();
    let state = env.path("drive");
    sim(&env, &["create", state.to_str().unwrap(), "--preset", "consumer-nvme", "--device-size", "256M"]);
    let serve = |state: &Path, dir: &Path| output(env.reseq().args(["sim", "serve"]).arg(state).arg(dir));
    let empty = env.path("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = serve(&env.path("nope"), &empty);
    assert_eq!(out.status.code(), Some(2), "missing state file");
    assert!(stderr(&out).contains("No such file"));
    // A flipped byte in the tables: the checksum catches it.
    let damaged = env.path("damaged");
    let mut bytes = std::fs::read(&state).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&damaged, &bytes).unwrap();
    let out = serve(&damaged, &empty);
    assert_eq!(out.status.code(), Some(2), "damaged state file");
    assert!(stderr(&out).contains("damaged"), "{}", stderr(&out));
    let full = env.path("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), b"x").unwrap();
    let out = serve(&state, &full);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not empty"));
    let out = serve(&state, &env.path("missing-dir"));
    assert_eq!(out.status.code(), Some(2));
    // A second serve: of the same mount dir (a mount point now), of the same drive.
    let server = Server::start(&env, &state, SCALE);
    let other = env.path("drive2");
    sim(&env, &["create", other.to_str().unwrap(), "--device-size", "256M"]);
    let out = serve(&other, &server.dir);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("mount point already"), "{}", stderr(&out));
    let out = serve(&state, &empty);
    assert_eq!(out.status.code(), Some(3), "the same drive served twice");
    assert!(stderr(&out).contains("served already"));
    assert_eq!(server.stop()["saved"], true);
    // Nothing half-written: no temporary files left beside the state.
    let leftovers: Vec<_> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// Retention through the kernel's I/O path: a consumer-tlc-aging drive with ext4 on a
/// loop device, aged 90 days by `reseq sim age` while served (loop device and mount
/// stay), reads its old files several times slower; `reseq rewrite FILE` makes one fast
/// again, the other stays slow; the server's state file keeps the clock after it stops.
#[test]
fn a_drive_aged_while_served_reads_old_files_slowly_until_rewritten() {
    if !require(&["losetup", "mkfs.ext4"]) || !require_fuse() {
        return;
    }
    let _one = exclusive();
    let env = TestEnv::new();
    let state = env.path("drive");
    let st = state.to_str().unwrap();
    sim(&env, &["create", st, "--preset", "consumer-tlc-aging", "--device-size", "1G"]);
    // Scale 2: fresh reads at about 250 MB/s of wall time, aged ones at about 25.
    let server = Server::start(&env, &state, 2.0);
    let lo = LoopDevice::attach(&server.disk(), &["--sector-size", "4096"]).unwrap();
    mkfs_ext4(&lo.path).unwrap();
    let mnt = Mount::new(&lo.path, &env.path("mnt"), &[]).unwrap();
    let (old, other) = (mnt.dir.join("old.bin"), mnt.dir.join("other.bin"));
    write_file(&old, 32 * MIB, 1);
    write_file(&other, 32 * MIB, 2);
    let (fresh, _) = bench(&env, &old, &[]);
    // Named through a symlink: the same drive, so the server, not the state file, ages.
    let link = env.path("drive-link");
    std::os::unix::fs::symlink(&state, &link).unwrap();
    let aged = sim(&env, &["age", link.to_str().unwrap(), "--days", "90"]);
    assert_eq!(aged["served"], true, "{aged}");
    assert_eq!(aged["age_days"], 90.0);
    let (slow, _) = bench(&env, &old, &[]);
    let (other_slow, _) = bench(&env, &other, &[]);
    eprintln!(
        "fresh {:.1} MiB/s, 90 days {:.1} MiB/s (other file {:.1})",
        fresh / MIB as f64,
        slow / MIB as f64,
        other_slow / MIB as f64
    );
    assert!(slow * 4.0 < fresh && other_slow * 4.0 < fresh, "90 days old: {fresh} -> {slow}, {other_slow}");
    let hash = hash_path(&old).unwrap();
    let out = output(env.reseq().arg("rewrite").arg(&old).args(["--json", "--state-dir"]).arg(env.state_dir()));
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(hash_path(&old).unwrap(), hash, "file contents changed");
    let (after, _) = bench(&env, &old, &[]);
    let (other_after, _) = bench(&env, &other, &[]);
    eprintln!("after the rewrite {:.1} MiB/s, other file {:.1}", after / MIB as f64, other_after / MIB as f64);
    // Fresh again, give or take where ext4's own writes fell between the rewrite's
    // windows (one run of the 2-core VM: 184 MiB/s after, 233 fresh; most: within 3 %),
    // far from the aged rate.
    assert!(after >= 0.7 * fresh && after > 3.0 * other_after, "rewritten: {after} vs fresh {fresh}");
    assert!(other_after * 4.0 < fresh, "the other file is still old: {other_after} vs {fresh}");
    mnt.unmount().unwrap();
    drop(lo);
    let summary = server.stop();
    assert_eq!((summary["saved"].as_bool(), summary["age_clock_days"].as_f64()), (Some(true), Some(90.0)));
    let info = sim(&env, &["info", st]);
    assert_eq!(info["age_clock_days"], 90.0, "the clock was lost on exit");
    let old_bytes: u64 = info["data_by_age"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["age_days"] == 90)
        .map(|a| a["bytes"].as_u64().unwrap())
        .sum();
    assert!(old_bytes >= 32 * MIB, "the other file is 90 days old in the saved state: {info}");
}

/// btrfs on the emulated consumer NVMe: a `nodatacow` file (a database's, overwritten in
/// place) degraded by random writes reads at least twice slower; file mode, through the
/// chunk tree, rewrites it in place and it reads within 10 % of fresh again; the bytes,
/// `btrfs scrub` and `btrfs check --readonly` stay clean.
#[test]
fn btrfs_nodatacow_file_degrades_and_file_mode_restores_it() {
    if !require(&["losetup", "mkfs.btrfs", "btrfs", "chattr"]) || !require_fuse() {
        return;
    }
    let _one = exclusive();
    let env = TestEnv::new();
    let (_, server, lo) = served(&env, "consumer-nvme", "1G", SCALE);
    run_cmd(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&lo.path)).unwrap();
    let mnt = Mount::new(&lo.path, &env.path("mnt"), &[]).unwrap();
    let db = mnt.dir.join("table.db");
    File::create(&db).unwrap();
    run_cmd(Command::new("chattr").arg("+C").arg(&db)).unwrap();
    write_file(&db, 128 * MIB, 1);
    let (fresh, _) = bench(&env, &db, &[]);
    degrade(&db, 64 * MIB, 3);
    let (degraded, _) = bench(&env, &db, &[]);
    eprintln!("btrfs: fresh {:.0} MiB/s, degraded {:.0} MiB/s", fresh / MIB as f64, degraded / MIB as f64);
    assert!(fresh >= 2.0 * degraded, "random writes must make it at least x2 slower: {fresh} -> {degraded}");
    let mut written = 0;
    let (r, db_hash) = until_decided("btrfs", |n| {
        if n > 0 {
            degrade(&db, 64 * MIB, 3 + 10 * n as u64);
        }
        let db_hash = hash_path(&db).unwrap();
        written = bytes_written_to(&lo.path);
        let args = ["--bench", "--bench-recheck", "0s", "--json", "--state-dir"];
        (json_ok(env.reseq().arg("rewrite").arg(&db).args(args).arg(env.state_dir())), db_hash)
    });
    assert_eq!(r["results"]["bytes_written"], 128 * MIB, "{}", r["results"]);
    let written = bytes_written_to(&lo.path) - written;
    assert!((128 * MIB..=192 * MIB).contains(&written), "the device took {written} bytes for the 128 MiB file");
    assert_eq!(r["verdict"]["verdict"], "faster", "{}", r["verdict"]);
    let after = r["bench_after"]["max_bytes_per_second"].as_f64().unwrap();
    eprintln!("btrfs: after the rewrite {:.0} MiB/s", after / MIB as f64);
    assert!(within(after, fresh, 0.10), "file mode: after {after} vs fresh {fresh}: not within 10 %");
    assert_eq!(hash_path(&db).unwrap(), db_hash, "file contents changed");
    let scrub = Command::new("btrfs").args(["scrub", "start", "-B"]).arg(&mnt.dir).output().unwrap();
    let text = String::from_utf8_lossy(&scrub.stdout).into_owned() + &String::from_utf8_lossy(&scrub.stderr);
    assert!(scrub.status.success() && text.contains("no errors found"), "btrfs scrub: {text}");
    mnt.unmount().unwrap();
    run_cmd(Command::new("btrfs").args(["check", "--readonly"]).arg(&lo.path)).expect("btrfs check clean");
    drop(lo);
    assert_eq!(server.stop()["saved"], true);
}
