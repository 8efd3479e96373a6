//! `reseq scan` on a loop device with a region made slow on purpose.

use crate::common::*;

const MIB: u64 = 1 << 20;

#[test]
fn scan_covers_the_target_and_flags_a_slow_region() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("s.img", 128 * MIB, 7);
    // Every read takes 50 ms longer, so that a hiccup of this shared VM (seen up to
    // 90 ms in a region) cannot decide; reads in [64 MiB, 80 MiB) take 120 ms more:
    // a slow region made on purpose. (A test binary of its own: only these
    // mostly sleeping tests run alongside.)
    let out = output(
        env.reseq()
            .args(["scan", "--json", "--regions", "8", "--block-size", "2M"])
            .arg(&lo.path)
            .env("RESEQ_FAULTS", "slow@0-128M=50,slow@64M-80M=120"),
    );
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    let regions = r["scan"]["regions"].as_array().unwrap();
    assert_eq!(regions.len(), 8);
    let mut at = 0;
    for g in regions {
        assert_eq!(g["offset_bytes"], at, "regions must be contiguous");
        at += g["length_bytes"].as_u64().unwrap();
    }
    assert_eq!(at, 128 * MIB, "regions must cover the whole target");
    let slow: Vec<u64> = regions.iter().filter(|g| g["slow"] == true).map(|g| g["index"].as_u64().unwrap()).collect();
    assert_eq!(slow, vec![4], "exactly the region [64, 80) MiB is slow");
    let saved = env.path("scan.json");
    std::fs::write(&saved, &out.stdout).unwrap();
    let text = String::from_utf8_lossy(&output(env.reseq().arg("report").arg(&saved)).stdout).into_owned();
    assert!(text.contains("SLOW"), "{text}");
    // Column headers, and the slow region's device offset (64 MiB) on its line.
    assert!(text.contains("device offset") && text.contains("throughput"), "{text}");
    let line = text.lines().find(|l| l.contains("SLOW")).unwrap();
    assert!(line.contains(&(64 * MIB).to_string()) && line.contains("16.0 MiB"), "{line}");
}

/// `rewrite --only-slow` until its scan decides (`until_decided`), which it must.
fn only_slow_decided(run: impl Fn() -> std::process::Command) -> serde_json::Value {
    let out = until_decided(|| output(&mut run()));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    json_report(&out)
}

/// --only-slow on a device: the scan in the run flags [64, 80) MiB, and only that is
/// rewritten; --from-scan does the same from a saved scan.
#[test]
fn only_slow_rewrites_just_the_flagged_regions() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("sel.img", 128 * MIB, 9);
    let before = hash_path(&lo.path).unwrap();
    let faults = "slow@0-128M=50,slow@64M-80M=120";
    let r = only_slow_decided(|| {
        let mut c = env.reseq();
        c.args(["rewrite", "--json", "--only-slow", "--scan-regions", "8", "--bench-block-size", "2M"])
            .arg(&lo.path)
            .env("RESEQ_FAULTS", faults);
        c
    });
    let sel = &r["selection"];
    assert_eq!(sel["chosen"].as_array().unwrap().len(), 1);
    assert_eq!(sel["chosen"][0]["offset_bytes"], 64 * MIB);
    assert_eq!(sel["bytes_left_alone"], 112 * MIB);
    assert_eq!(sel["regions_left_alone"], 7);
    assert_eq!(r["results"]["bytes_written"], 16 * MIB, "only the slow region is rewritten");
    assert_eq!(hash_path(&lo.path).unwrap(), before);

    // The same from a saved scan, scanned again while too noisy to tell.
    let saved = env.path("scan.json");
    let out = until_decided(|| {
        let scan = output(
            env.reseq()
                .args(["scan", "--json", "--regions", "8", "--block-size", "2M"])
                .arg(&lo.path)
                .env("RESEQ_FAULTS", faults),
        );
        std::fs::write(&saved, &scan.stdout).unwrap();
        output(env.reseq().args(["rewrite", "--json", "--from-scan"]).arg(&saved).arg(&lo.path))
    });
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_report(&out)["results"]["bytes_written"], 16 * MIB);
    // What was chosen shows in the plan, the progress and the text report.
    let plan =
        output(env.reseq().args(["rewrite", "--dry-run", "-v", "--only-slow", "--scan-regions", "8"]).arg(&lo.path));
    let plan = String::from_utf8_lossy(&plan.stdout).to_string();
    assert!(plan.contains("selection: --only-slow: a scan of 8 regions"), "{plan}");
    let out = output(env.reseq().args(["rewrite", "--from-scan"]).arg(&saved).arg(&lo.path));
    // Its words, however the line was wrapped to fit 100 columns.
    let text = String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains("1 slow region(s), 16.0 MiB of 128.0 MiB (12 % of a full rewrite)"), "{text}");
    assert!(stderr(&out).contains("rewriting the 1 slow region(s) chosen: 16.0 MiB of 128.0 MiB"), "{}", stderr(&out));
    // A scan of something else is refused.
    let other = env.random_loop_device("other.img", 64 * MIB, 1);
    let out = output(env.reseq().args(["rewrite", "--from-scan"]).arg(&saved).arg(&other.path));
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("not this whole device"));
}

/// --only-slow on a device with a mounted ext4 whose free space was trimmed (and reads
/// fast): regions are cut from the ranges in use only, so the used data is not all
/// "slow" next to trimmed space; only the region of the one slow file is rewritten.
#[test]
fn only_slow_on_a_used_space_device_picks_slow_used_regions_only() {
    if !require(&["losetup", "mkfs.ext4", "fstrim"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("used.img", 256 * MIB, 12);
    run_cmd(
        std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&lo.path),
    )
    .unwrap();
    let mnt = Mount::new(&lo.path, &env.path("used-mnt"), &[]).unwrap();
    // Three quarters full, as a database's filesystem is: the metadata mkfs zeroed (which
    // reads as fast as trimmed space) is then too little to set the reference.
    let files = fill_files(&mnt.dir, 12, 16 << 20, 13);
    run_cmd(std::process::Command::new("fstrim").arg(&mnt.dir)).unwrap();
    let f = std::fs::File::open(&files[6].0).unwrap();
    let ext = reseq::testing::fiemap(std::os::fd::AsFd::as_fd(&f), 0, 0).unwrap();
    drop(f);
    let (lo_b, hi_b) = (ext[0].physical, ext.iter().map(|e| e.physical + e.length).max().unwrap());
    // Every read slowed (this VM's host cache makes recently written ranges read up to
    // x2 faster, by chance, and a busy disk some ranges slower: 20 ms a MiB left a plain
    // region at 0.69 of the reference under bench/load.sh, past the 0.7 bar), the slow
    // file's much more: 60 ms a MiB against 200.
    let faults = format!("slow@0-256M=60,slow@{lo_b}-{hi_b}=200");
    let r = only_slow_decided(|| {
        let mut c = env.reseq();
        c.args(["rewrite", "--json", "--only-slow", "--scan-regions", "16", "--bench-block-size", "1M"])
            .arg(&lo.path)
            .env("RESEQ_FAULTS", &faults);
        c
    });
    let chosen = r["selection"]["chosen"].as_array().unwrap();
    assert!(!chosen.is_empty() && chosen.len() <= 4, "the slow file's regions: {}", r["selection"]);
    for c in chosen {
        let on_file = c["device_ranges"].as_array().unwrap().iter().any(|p| {
            let (o, l) = (p[0].as_u64().unwrap(), p[1].as_u64().unwrap());
            o < hi_b && lo_b < o + l
        });
        assert!(on_file, "a chosen region lies on the slow file: {c}");
    }
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    assert!(written > 0 && written <= 48 * MIB, "only the slow regions: {written}");
    assert_files_intact(&files);
}

/// A CPU busy loop, killed on drop.
struct Busy(std::process::Child);

impl Busy {
    fn start() -> Busy {
        Busy(std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("busy loop"))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sectors_written(dev: &std::path::Path) -> u64 {
    let name = dev.file_name().unwrap().to_str().unwrap();
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
    stat.split_whitespace().nth(6).unwrap().parse().unwrap()
}

/// A loop device has no FTL: nothing on it can read faster re-sequenced. Under a CPU
/// busy loop, `estimate` of the device, a directory and a file never says "worth it" in
/// repeated runs (it may say "cannot tell"), every place is read three times, and
/// `--only-slow` writes at most a tenth of the bytes in use (or refuses, writing nothing),
/// by the device's own counter.
#[test]
fn a_device_without_an_ftl_is_never_worth_it_under_load() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    // The busy loop would slow other tests' clocks.
    let _one = exclusive();
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("noise", 256 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 6, 24 * MIB as usize, 5);
    let _busy = Busy::start();
    let file = files[3].0.clone();
    let mut calls = Vec::new();
    for _ in 0..3 {
        for target in [&lo.path, &mnt.dir, &file] {
            let r = json_ok(env.reseq().args(["estimate", "--json", "--sample", "64M"]).arg(target));
            let e = if r["estimate"].is_null() { &r["estimate_files"] } else { &r["estimate"] };
            let advice = e["advice"].as_str().unwrap().to_string();
            assert!(!advice.starts_with("worth it"), "{}: {advice}", target.display());
            assert_eq!(e["sureness"]["readings_per_place"], 3, "{e}");
            calls.push(advice.split(':').next().unwrap().to_string());
        }
    }
    eprintln!("calls under load: {calls:?}");
    // Two scans back to back: each flags at most a tenth of the regions, or says the host
    // is too busy to tell (before, 41 of 64 were flagged, and two scans agreed on 28).
    for _ in 0..2 {
        let r = json_ok(env.reseq().args(["scan", "--json", "--regions", "32"]).arg(&lo.path));
        let (slow, spread) =
            (r["scan"]["slow_regions"].as_u64().unwrap(), r["scan"]["sureness"]["spread"].as_f64().unwrap());
        eprintln!("scan under load: {slow} of 32 slow, spread x{spread:.2}");
        assert!(slow <= 3 || spread >= 1.0 / 0.7, "{slow} of 32 flagged slow, spread x{spread}");
    }
    let used =
        nix::sys::statvfs::statvfs(&mnt.dir).map(|s| (s.blocks() - s.blocks_free()) * s.fragment_size()).unwrap();
    let before = sectors_written(&lo.path);
    let out = output(env.reseq().args(["rewrite", "--json", "--only-slow"]).arg(&lo.path));
    let written = (sectors_written(&lo.path) - before) * 512;
    eprintln!("--only-slow: exit {:?}, {written} bytes written of {used} in use", out.status.code());
    match out.status.code() {
        Some(0) => assert!(written <= used / 10, "--only-slow wrote {written} of {used} bytes in use"),
        Some(3) => {
            assert!(stderr(&out).contains("cannot tell which regions read slowly"), "{}", stderr(&out));
            assert!(written < MIB, "a refused run wrote {written} bytes");
        }
        c => panic!("--only-slow exit {c:?}: {}", stderr(&out)),
    }
    drop(_busy);
    assert_files_intact(&files);
}
