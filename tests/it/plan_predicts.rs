//! A dry run's prediction held against the run it predicts (issue 37): the windows and
//! the time frozen of a real run on ext4 over a loop device, in device mode and in file
//! mode (many small files; a few large ones), fall in the plan's range, widened x1.5
//! each way: the tests share two busy cores with whatever else runs, and the run may
//! meet a load the probe did not see. The loop devices' images are in memory: what is
//! held to account is the model against the engine, on a device that keeps its speed.
//! A dry run writes nothing and cannot see a disk whose writes stall now and then (this
//! VM's virtual disk, as its host flushed: 12-21 windows of 0.13 s where 3 of 0.17 s
//! were planned, 2-3 s where 0.6 s; the same run over memory took 4 windows, 0.85 s). A plan made on a quiet host has a range of
//! its own to be held to, so that the check has teeth: at most x5 from end to end (the
//! model's own x0.8-x1.25, and writes from as fast as the reads, up to x4 here where a
//! virtual disk reads data just written from its host's cache, down to the cap). A plan
//! that would take years says so, and its run is refused.
//!
//! Each run holds the machine (`common::exclusive()`): a run's time is what is measured,
//! and another test's I/O on the same disk would slow it as no probe before it could
//! see (measured: x1.3-x2.1 with the three suites side by side). A load from outside the
//! tests that comes or goes between the plan and the run (CPU or I/O pressure changed by
//! more than 0.15) gets one more plan and run, which must hold. What the expected
//! figures came to is printed (`--nocapture`): on a quiet host they were within x1.5
//! (docs/OPERATIONS.md, "What the dry run predicts").

use std::io::Write;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::*;

const MIB: u64 = 1 << 20;

/// The share of the time between two readings that some task waited for a CPU and for
/// I/O (/proc/pressure/cpu and io), None without PSI.
struct Pressure([Option<u64>; 2], std::time::Instant);

impl Pressure {
    fn start() -> Pressure {
        Pressure([some_total("cpu"), some_total("io")], std::time::Instant::now())
    }
    /// (CPU, I/O) since the start.
    fn shares(&self) -> (Option<f64>, Option<f64>) {
        let us = self.1.elapsed().as_micros().max(1) as f64;
        let share = |i: usize, kind| Some(some_total(kind)?.saturating_sub(self.0[i]?) as f64 / us);
        (share(0, "cpu"), share(1, "io"))
    }
}

fn some_total(kind: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/pressure/{kind}")).ok()?;
    let some = text.lines().find(|l| l.starts_with("some"))?;
    some.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
}

/// A change of pressure (CPU or I/O, as a share of the time) between the plan's probe
/// and the run larger than this is a load the plan could not see.
const LOAD_CHANGE: f64 = 0.15;

/// The dry run's prediction, then the run: the run's windows and time frozen in the
/// plan's range (x1.5 each way), its bytes the plan's; a plan made on a quiet host, with
/// a range narrow enough to mean something. Each run holds the machine against the other
/// tests, but not against other programs: a run that misses its plan while the host's
/// load (CPU or I/O pressure) changed from the plan's is planned and run once more, and
/// that second pair must hold (a plan that is wrong on a steady host fails at once).
fn plan_then_run(env: &TestEnv, what: &str, args: &[&str], target: &[&Path]) {
    let _alone = exclusive();
    match planned_run(env, what, args, target) {
        Ok(()) => {}
        Err((miss, true)) => {
            eprintln!("{what}: {miss}, while the load changed from the plan's: planned and run again");
            planned_run(env, what, args, target).unwrap_or_else(|(miss, _)| panic!("{what}, again: {miss}"));
        }
        Err((miss, false)) => panic!("{miss}"),
    }
}

/// One plan and its run: Err with what missed, and whether the load changed between the
/// probe and the run.
fn planned_run(env: &TestEnv, what: &str, args: &[&str], target: &[&Path]) -> Result<(), (String, bool)> {
    let plan = json_ok(env.reseq().args(["rewrite", "--dry-run", "--json"]).args(args).args(target));
    let p = &plan["prediction"];
    let during = Pressure::start();
    let run = json_ok(env.reseq().args(["rewrite", "--json"]).args(args).args(target));
    let (r, (run_cpu, run_io)) = (&run["results"], during.shares());
    let probe = &p["probes"][0];
    let (probe_cpu, probe_io) =
        (probe["host_pressure"]["cpu_some"].as_f64(), probe["host_pressure"]["io_some"].as_f64());
    // Quiet as the plan saw it: nothing waited for a CPU or for I/O (another job's I/O
    // widens the plan's high end), one CPU was idle, and a normal thread read as fast as
    // a real-time one.
    let quiet = probe_cpu.is_some_and(|x| x < 0.05)
        && probe_io.is_some_and(|x| x < 0.05)
        && probe["cpus_idle"].as_f64().is_some_and(|x| x >= 1.0)
        && probe["normal_priority_penalty_seconds"].as_f64().is_some_and(|x| x < 0.0005);
    let changed = |a: Option<f64>, b: Option<f64>| a.zip(b).is_some_and(|(a, b)| (a - b).abs() > LOAD_CHANGE);
    let load_changed = changed(probe_cpu, run_cpu) || changed(probe_io, run_io);
    eprintln!(
        "{what}: planned {} windows ({}-{}), {:.2} s frozen ({:.2}-{:.2}), {:.2} s ({:.2}-{:.2}); ran {} windows, {:.2} s frozen, {:.2} s; pressure before the probe CPU {probe_cpu:.2?} I/O {probe_io:.2?} (quiet: {quiet}), during the run CPU {run_cpu:.2?} I/O {run_io:.2?}; depth {}",
        p["windows"]["expected"],
        p["windows"]["low"],
        p["windows"]["high"],
        num(&p["frozen_seconds"]["expected"]),
        num(&p["frozen_seconds"]["low"]),
        num(&p["frozen_seconds"]["high"]),
        num(&p["duration_seconds"]["expected"]),
        num(&p["duration_seconds"]["low"]),
        num(&p["duration_seconds"]["high"]),
        r["windows"],
        num(&r["total_frozen_seconds"]),
        num(&r["rewrite_seconds"]),
        run["pipeline_depth"]["depth"],
    );
    let written = num(&r["bytes_written"]);
    assert!((written - num(&p["bytes_written"])).abs() <= 0.02 * written + 2.0 * MIB as f64, "{what}: bytes {p} {r}");
    for (name, planned, ran) in
        [("windows", "windows", "windows"), ("frozen", "frozen_seconds", "total_frozen_seconds")]
    {
        let (low, high, actual) = (num(&p[planned]["low"]), num(&p[planned]["high"]), num(&r[ran]));
        if quiet && name == "frozen" {
            // What one window freezes is known closely; how many windows a small run
            // takes may be one to three (each the same at both ends), one more where a
            // window's worth falls across the range's ends (1-4 seen). The low end lifts
            // the write cap (1 GiB/s), so where the probe reads far past it (this loop
            // device from the page cache, into huge pages) the ends are x2.6 apart.
            let (w_low, w_high) = (num(&p["windows"]["low"]).max(1.0), num(&p["windows"]["high"]).max(1.0));
            assert!(
                high / w_high <= 3.0 * low / w_low && w_high <= 3.0 * w_low + 1.0,
                "{what}: a quiet host's range is narrow: [{low}, {high}] s frozen in [{w_low}, {w_high}] windows"
            );
        }
        if !(actual >= low / 1.5 && actual <= high * 1.5) {
            return Err((format!("{what}: {name} {actual} outside [{low}, {high}] x1.5"), load_changed));
        }
    }
    Ok(())
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn device_mode_runs_as_planned() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("dev", 384 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 48, 4 << 20, 37);
    plan_then_run(&env, "device mode", &["--max-freeze", "300ms"], &[&lo.path]);
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// 1600 files of 4-96 KiB in 16 directories (ext4 spreads them over its block groups),
/// a third deleted and 500 more written into the holes: pieces all over the device.
fn small_files(dir: &Path) {
    let mut rng = XorShift::new(41);
    let sizes = [4096, 8192, 16 << 10, 40 << 10, 96 << 10];
    let path = |i: usize| dir.join(format!("d{}/f{i}", i % 16));
    (0..16).for_each(|d| std::fs::create_dir_all(dir.join(format!("d{d}"))).unwrap());
    let mut data = vec![0u8; 96 << 10];
    for i in 0..2100 {
        let n = sizes[(rng.next_u64() % sizes.len() as u64) as usize];
        rng.fill(&mut data[..n]);
        std::fs::write(path(i), &data[..n]).unwrap();
        if i == 1599 {
            run_cmd(&mut Command::new("sync")).unwrap();
            (0..1600).step_by(3).for_each(|i| std::fs::remove_file(path(i)).unwrap());
            run_cmd(&mut Command::new("sync")).unwrap();
        }
    }
    run_cmd(&mut Command::new("sync")).unwrap();
}

#[test]
fn file_mode_many_small_files_run_as_planned() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("small", 256 * MIB, "ext4");
    small_files(&mnt.dir.join("db"));
    plan_then_run(&env, "many small files", &["--max-freeze", "300ms", "--pause", "50ms"], &[&mnt.dir.join("db")]);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// Three 48 MiB files grown in turns of 256 KiB with an fsync each: their extents
/// interleave on the device.
fn large_files(dir: &Path) {
    let mut rng = XorShift::new(43);
    let mut files: Vec<std::fs::File> =
        (0..3).map(|i| std::fs::File::create(dir.join(format!("table{i}.ibd"))).unwrap()).collect();
    let mut piece = vec![0u8; 256 << 10];
    for _ in 0..(48 * MIB / (256 << 10)) {
        for f in &mut files {
            rng.fill(&mut piece);
            f.write_all(&piece).unwrap();
            f.sync_data().unwrap();
        }
    }
}

#[test]
fn file_mode_a_few_large_files_run_as_planned() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("large", 256 * MIB, "ext4");
    large_files(&mnt.dir);
    plan_then_run(&env, "a few large files", &["--max-freeze", "300ms", "--pause", "50ms"], &[&mnt.dir]);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// `--rate 1` is one byte a second: the plan says how many years that is, in device and
/// file mode, and the run is refused (exit 3) having written nothing.
#[test]
fn a_plan_that_would_take_years_says_so_and_its_run_is_refused() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    // 48 MiB at a byte a second: a year and a half.
    let (lo, mnt) = env.mounted("years", 96 * MIB, "ext4");
    fill_files(&mnt.dir, 12, 4 << 20, 47);
    for target in [mnt.dir.as_path(), lo.path.as_path()] {
        let out = output(env.reseq().args(["rewrite", "--dry-run", "-v", "--rate", "1"]).arg(target));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        let said = text
            .lines()
            .find(|l| l.contains("warning: this run would take about "))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(said.contains(" years") && said.contains("--rate 1 B/s"), "{said}");
        assert!(text.contains("the run itself is refused (exit 3)"), "{text}");
        let r = json_ok(env.reseq().args(["rewrite", "--dry-run", "--json", "--rate", "1"]).arg(target));
        assert!(num(&r["prediction"]["duration_seconds"]["expected"]) > 365.0 * 86_400.0, "{r}");
    }
    // The dry runs' reads updated atimes: ext4 commits them within 5 s, a write of its
    // own, not the refused run's (seen once: 6 KiB during it). Committed now.
    run_cmd(std::process::Command::new("sync").arg("-f").arg(&mnt.dir)).unwrap();
    let before = bytes_written_to(&lo.path);
    let out = output(env.reseq().args(["rewrite", "--rate", "1"]).arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("more than a year"), "{}", stderr(&out));
    assert_eq!(bytes_written_to(&lo.path), before, "a refused run wrote");
    // A rate that is merely slow plans on without a word about years.
    let out = output(env.reseq().args(["rewrite", "--dry-run", "-v", "--rate", "10M"]).arg(&mnt.dir));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("would take about"));
}

/// Sectors read from a device so far (/sys/class/block/X/stat), in bytes.
fn bytes_read_from(dev: &Path) -> u64 {
    let name = dev.file_name().unwrap().to_string_lossy();
    let stat = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).unwrap();
    stat.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap() * 512
}

/// The pipeline's depth (issue 40): on a run of 4 GiB or more it is probed, with reads
/// only, and the plan says the rates and the depth; `--read-ahead N` overrides it, 0 (a
/// serial baseline) and 16 included, and a run at each rewrites every byte as it was.
#[test]
fn the_depth_is_probed_or_given_and_every_depth_rewrites_as_it_was() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    // 4 GiB of data, in memory: holes are not bytes to rewrite, and a probe reads data.
    let big = LoopDevice::create(&env.run_dir().join("big.img"), 4 << 30).unwrap();
    fill_holes(&big.image);
    let (read, written) = (bytes_read_from(&big.path), bytes_written_to(&big.path));
    let plan = json_ok(env.reseq().args(["rewrite", "--dry-run", "--json"]).arg(&big.path));
    let d = &plan["pipeline_depth"];
    assert_eq!(d["source"], "probed", "{d}");
    let depth = d["depth"].as_u64().unwrap();
    assert!([2, 4, 8, 16].contains(&depth), "{d}");
    let rates: Vec<(u64, f64)> = d["measured"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["reads_in_flight"].as_u64().unwrap(), num(&m["bytes_per_second"])))
        .collect();
    assert_eq!(rates.iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2, 4, 8], "{d}");
    assert!(rates.iter().all(|r| r.1 > 0.0), "{d}");
    // The depth is twice the fewest reads in flight within 5 % of the best; 4 halved to 2
    // where 4 in flight read slower than 2 (below 97 %: depth 4 has 4 in flight).
    let best = rates.iter().map(|r| r.1).fold(0.0, f64::max);
    let fewest = rates.iter().find(|r| r.1 >= 0.95 * best).unwrap().0;
    let halved = fewest == 2 && rates[2].1 < 0.97 * rates[1].1;
    assert_eq!(depth, if halved { 2 } else { 2 * fewest }, "{d}");
    assert_eq!(d["why"].as_str().unwrap().contains("halved"), halved, "{d}");
    assert!(bytes_read_from(&big.path) > read + (16 << 20), "the probes read the device");
    assert_eq!(bytes_written_to(&big.path), written, "a dry run wrote");
    assert!(
        plan["prediction"]["basis"].as_array().unwrap().iter().any(|b| b.as_str().unwrap().starts_with("depth ")),
        "{}",
        plan["prediction"]["basis"]
    );
    drop(big);
    let lo = env.random_loop_device("small", 24 << 20, 40);
    // Read around the page cache: what the device holds.
    let direct = |dev: &Path| {
        let out = output(Command::new("dd").arg(format!("if={}", dev.display())).args([
            "bs=1M",
            "iflag=direct",
            "status=none",
        ]));
        assert!(out.status.success() && out.stdout.len() == 24 << 20, "{}", stderr(&out));
        blake3::hash(&out.stdout)
    };
    let before = direct(&lo.path);
    for n in ["0", "16"] {
        let written = bytes_written_to(&lo.path);
        let state = env.path(&format!("state{n}"));
        let r = json_ok(
            env.reseq().args(["rewrite", "--json", "--read-ahead", n, "--state-dir"]).arg(&state).arg(&lo.path),
        );
        assert_eq!(r["pipeline_depth"]["source"], "given");
        assert_eq!(r["pipeline_depth"]["depth"].as_u64(), n.parse().ok());
        assert!(bytes_written_to(&lo.path) >= written + (24 << 20), "depth {n}: every byte written");
        assert_eq!(direct(&lo.path), before, "depth {n}: the bytes as they were");
    }
}

/// The chunk-size trial (issue 40), on a real loop device with its floor lowered (a
/// fault-injection rule; the real floor is 16 GiB): the plan names it, a given
/// `--chunk-size` or `--rate` has none, a run killed inside a stretch of 64 MiB chunks
/// resumes and checks that chunk, and a whole run writes every byte once, each shape on
/// two 128 MiB stretches, the bytes as they were (checked by the device's own counter and
/// a direct read, not the report).
#[test]
fn a_chunk_trial_tries_two_shapes_and_every_byte_is_written_once() {
    if !require(&["losetup"]) {
        return;
    }
    const SIZE: u64 = 1024 * MIB;
    let env = TestEnv::new();
    let lo = env.random_loop_device("trial", SIZE, 41);
    // Read around the page cache, in pieces (a pipe from dd takes seconds for 1 GiB).
    let direct = || {
        let mut h = blake3::Hasher::new();
        for off in (0..SIZE).step_by(16 << 20) {
            h.update(&crate::faultfs::direct_read(&lo.path, off, 16 << 20).unwrap());
        }
        h.finalize()
    };
    let before = direct();
    let rewrite = |state: &str, extra: &[&str], faults: &str| {
        let mut c = env.reseq();
        c.args(["rewrite", "--state-dir"]).arg(env.path(state)).args(extra).arg(&lo.path).env("RESEQ_FAULTS", faults);
        c
    };
    let plan = json_ok(&mut rewrite("s1", &["--dry-run", "--json"], "trial-from=256M,trial-stretch=128M"));
    let t = &plan["plan"]["chunk_trial"];
    assert_eq!(t["stretch_bytes"].as_u64(), Some(128 * MIB), "{t}");
    let shapes: Vec<(u64, u64)> = t["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["chunk_size"].as_u64().unwrap(), s["read_ahead"].as_u64().unwrap()))
        .collect();
    assert_eq!(shapes, vec![(4 * MIB, 2), (64 * MIB, 1)], "{t}");
    let windows = &plan["prediction"]["windows"];
    assert_eq!(windows["expected"].as_u64(), Some(5), "four stretches and the rest: {windows}");
    // 256 chunks of 4 MiB, less 30 in each 64 MiB stretch (two chunks where 4 MiB takes 32).
    assert_eq!(plan["prediction"]["chunks"].as_u64(), Some(196), "{}", plan["prediction"]);
    let text = output(&mut rewrite("s1", &["--dry-run", "-v"], "trial-from=256M,trial-stretch=128M"));
    let said = String::from_utf8_lossy(&text.stdout);
    assert!(said.contains("chunk trial: 4.0 MiB at depth 2 and 64.0 MiB at depth 1"), "{said}");
    for given in [&["--chunk-size", "4M"][..], &["--read-ahead", "2"], &["--rate", "1G"]] {
        let plan = json_ok(&mut rewrite(
            "s1",
            &[&["--dry-run", "--json"][..], given].concat(),
            "trial-from=256M,trial-stretch=128M",
        ));
        assert!(plan["plan"]["chunk_trial"].is_null(), "{given:?}: {}", plan["plan"]);
    }
    // Killed after the second write of 64 MiB (in the second stretch, after the first's
    // 32 writes of 4 MiB), then resumed.
    let written = bytes_written_to(&lo.path);
    let out = output(&mut rewrite("s2", &[], "trial-from=256M,trial-stretch=128M,kill@after-write#34"));
    assert_eq!(out.status.code(), None, "the run should have died by SIGKILL: {}", stderr(&out));
    let out = output(&mut rewrite("s2", &["--resume"], "trial-from=256M,trial-stretch=128M"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("in flight when the last run stopped, is intact"), "{}", stderr(&out));
    assert_eq!(direct(), before, "killed and resumed: the bytes as they were");
    assert!(bytes_written_to(&lo.path) >= written + SIZE, "every byte written");
    // A whole run.
    let written = bytes_written_to(&lo.path);
    let r = json_ok(&mut rewrite("s3", &["--json"], "trial-from=256M,trial-stretch=128M"));
    let x = &r["results"];
    assert_eq!(x["windows"].as_u64(), Some(5), "four stretches and the rest: {x}");
    let measured = x["chunk_trial"]["measured"].as_array().unwrap();
    assert_eq!(measured.iter().map(|m| m["bytes"].as_u64().unwrap()).collect::<Vec<_>>(), vec![256 * MIB, 256 * MIB]);
    assert!(measured.iter().all(|m| num(&m["bytes_per_second"]) > 0.0), "{measured:?}");
    let kept = x["chunk_trial"]["chosen"]["chunk_size"].as_u64().unwrap();
    assert!(kept == 4 * MIB || kept == 64 * MIB, "{x}");
    // As predicted when 4 MiB is kept; 64 + 4 + 8 writes when 64 MiB is.
    let writes = if kept == 4 * MIB { 196 } else { 76 };
    assert_eq!(x["chunks_written"].as_u64(), Some(writes), "{x}");
    assert_eq!(bytes_written_to(&lo.path) - written, SIZE, "every byte once, no more");
    assert_eq!(direct(), before, "the bytes as they were");
    let saved = env.path("trial.json");
    std::fs::write(&saved, r.to_string()).unwrap();
    // The trial's reasons are behind -v.
    let text = output(env.reseq().args(["-v", "report"]).arg(&saved));
    let said = String::from_utf8_lossy(&text.stdout);
    let why = x["chunk_trial"]["why"].as_str().unwrap();
    assert!(said.contains(&format!("chunk trial: {why}")), "{said}");
    // A write failing in the third stretch (its first 64 MiB chunk): the report gives
    // what the two stretches before it measured, and chose nothing.
    let out = output(&mut rewrite("s4", &["--json"], "trial-from=256M,trial-stretch=128M,write-error@256M"));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let cut = &json_report(&out)["results"]["chunk_trial"];
    let bytes: Vec<u64> = cut["measured"].as_array().unwrap().iter().map(|m| m["bytes"].as_u64().unwrap()).collect();
    assert_eq!((cut["complete"].as_bool(), bytes), (Some(false), vec![128 * MIB, 128 * MIB]), "{cut}");
    assert_eq!(cut["chosen"]["chunk_size"].as_u64(), Some(4 * MIB), "{cut}");
    assert_eq!(direct(), before, "a failed write: the bytes as they were");
}
