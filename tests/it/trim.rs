//! The FITRIM after a used-space rewrite, in paced slices, and `bench --trim-impact`.
//! Loop devices over sparse images turn discards into hole punches, so what was trimmed
//! shows in the image's allocated size. Every test mounts afresh: ext4 remembers which
//! block groups it trimmed since mount (EXT4_GROUP_INFO_WAS_TRIMMED) and skips them.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

const MIB: u64 = 1 << 20;

fn du_bytes(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// Free bytes of the filesystem at `dir` (statvfs f_bfree: reserved blocks included,
/// as FITRIM trims them).
fn free_bytes(dir: &std::path::Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).unwrap();
    s.blocks_free() * s.fragment_size()
}

/// An ext4 of `size` whose freed blocks are still allocated in the image: filled with
/// files, most of them deleted (ext4 does not discard on delete without -o discard).
fn with_freed_blocks(env: &TestEnv, name: &str, size: u64) -> (LoopDevice, Mount) {
    let (lo, mnt) = env.mounted(name, size, "ext4");
    let n = (size * 7 / 10 / (16 * MIB)) as usize;
    let files = fill_files(&mnt.dir, n, 16 << 20, 5);
    for (p, _) in &files[1..] {
        std::fs::remove_file(p).unwrap();
    }
    run_cmd(&mut Command::new("sync")).unwrap();
    (lo, mnt)
}

/// The slices of the report's only filesystem: (at_seconds, start, length, trimmed).
fn slices(r: &serde_json::Value) -> Vec<(f64, u64, u64, u64)> {
    let fs = &r["space"]["trim"]["filesystems"][0];
    fs["slices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["at_seconds"].as_f64().unwrap(),
                s["start_bytes"].as_u64().unwrap(),
                s["length_bytes"].as_u64().unwrap(),
                s["trimmed_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn slices_ascend_cover_the_filesystem_once_and_trim_its_free_space() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let size = 256 * MIB;
    let (lo, mnt) = with_freed_blocks(&env, "slices", size);
    let du_before = du_bytes(&lo.image);
    assert!(du_before > 150 * MIB, "freed blocks should still be allocated in the image ({du_before})");
    let out = output(env.reseq().args(["rewrite", "--json"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    // What FITRIM finds free is what the filesystem counts free (nothing else wrote since).
    let free = free_bytes(&mnt.dir);
    let t = &r["space"]["trim"];
    let trimmed = t["bytes_trimmed"].as_u64().unwrap();
    assert_eq!(r["space"]["bytes_trimmed"].as_u64(), Some(trimmed));
    assert_eq!(trimmed, free, "trimmed {trimmed}, free {free}");
    let s = slices(&r);
    assert_eq!(t["slices"].as_u64(), Some(s.len() as u64));
    assert!(!s.is_empty());
    assert_eq!(s[0].1, 0, "the first slice starts at the filesystem's start");
    for w in s.windows(2) {
        assert_eq!(w[0].1 + w[0].2, w[1].1, "contiguous and ascending: {w:?}");
        assert!(w[0].0 <= w[1].0, "in time order too: {w:?}");
    }
    let last = s.last().unwrap();
    assert_eq!(last.1 + last.2, size, "the slices end at the filesystem's end");
    assert_eq!(s.iter().map(|x| x.3).sum::<u64>(), trimmed, "the slices add up to the total");
    let slowest = t["slowest_slice_seconds"].as_f64().unwrap();
    assert!(slowest > 0.0 && slowest <= t["seconds"].as_f64().unwrap() + 1e-9, "{slowest}");
    // The discards reached the image: what is left allocated is what is in use (data
    // rewritten, and ranges mkfs zeroed, allocated but read as holes and left out).
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    let holes = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
    let du_after = du_bytes(&lo.image);
    assert!(du_after < written + holes + 8 * MIB, "the image holds {du_after} bytes, {written} + {holes} in use");
    // The text report says it too.
    let text = env.path("r.json");
    std::fs::write(&text, &out.stdout).unwrap();
    let shown = output(env.reseq().arg("report").arg(&text));
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("trim: ") && shown.contains("of free space discarded in"), "{shown}");
    let all = output(env.reseq().args(["report", "-v"]).arg(&text));
    let all = String::from_utf8_lossy(&all.stdout).into_owned();
    assert!(all.contains("slowest slice"), "-v keeps the slices: {all}");
    for format in ["md", "html", "prom"] {
        let o = output(env.reseq().arg("report").arg(&text).args(["--format", format]));
        let o = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.contains("trim"), "{format}: {o}");
    }
}

#[test]
fn trim_rate_holds_and_bench_probes_latency_during_the_trim() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    // A fresh ext4, almost all free: ~490 MiB to discard at 128 MiB/s, about 4 s.
    let (lo, _mnt) = env.mounted("rate", 512 * MIB, "ext4");
    let rate = 128 * MIB;
    let started = Instant::now();
    let out = output(
        env.reseq()
            .args(["rewrite", "--json", "--trim-rate", "128M/s", "--bench", "--bench-passes", "1"])
            .arg(&lo.path),
    );
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    let t = &r["space"]["trim"];
    let (trimmed, secs) = (t["bytes_trimmed"].as_u64().unwrap(), t["seconds"].as_f64().unwrap());
    assert!(trimmed > 400 * MIB, "{trimmed}");
    assert_eq!(t["rate_limit_bytes_per_second"].as_u64(), Some(rate));
    let got = trimmed as f64 / secs;
    eprintln!("trimmed {trimmed} in {secs:.2} s: {:.1} MiB/s (limit 128), wall {wall:.1} s", got / MIB as f64);
    assert!(secs >= 2.5, "several seconds: {secs}");
    assert!(got <= rate as f64 * 1.2 && got >= rate as f64 * 0.8, "rate {got} against {rate}");
    // Our own clock agrees: the run cannot have been shorter than the paced trim.
    assert!(wall >= trimmed as f64 / rate as f64 * 0.8, "wall {wall}");
    // Slices of a quarter second's worth; the pace counts what ext4 discarded, which can
    // run to the end of a block group past a slice: the busy time is a small share.
    let s = slices(&r);
    assert!(s.iter().all(|x| x.2 <= 32 * MIB), "{s:?}");
    assert!(t["busy_seconds"].as_f64().unwrap() < secs / 2.0);
    // --bench: the probe read before and during the trim.
    let p = &t["probe"];
    eprintln!("probe reads: {} before, {} during", p["before"]["reads"], p["during"]["reads"]);
    // The reference reads on past its 2 s until it has 100 reads (10 s at most).
    assert!(p["before"]["reads"].as_u64().unwrap() >= 100, "{p}");
    assert!(p["during"]["reads"].as_u64().unwrap() >= 50, "a 4 s trim is probed all along: {p}");
    for side in ["before", "during"] {
        assert!(p[side]["p50_seconds"].as_f64().unwrap() > 0.0);
        assert!(p[side]["p99_seconds"].as_f64().unwrap() >= p[side]["p50_seconds"].as_f64().unwrap());
    }
    assert!(p["p99_ratio"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_stop_signal_ends_the_trim_between_slices_and_a_stopped_process_does_not_burst() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("stop", 256 * MIB, "ext4");
    // Free space in 1 MiB pieces (every other file of 160 deleted), so that slices discard
    // about what they cover: ext4 discards a free extent to its end, which on a fresh
    // filesystem is a whole block group in one slice. At 16 MiB/s, 4 MiB slices.
    let files = fill_files(&mnt.dir, 160, 1 << 20, 9);
    for (p, _) in files.iter().step_by(2) {
        std::fs::remove_file(p).unwrap();
    }
    run_cmd(&mut Command::new("sync")).unwrap();
    let mut child = Running::captured(env.reseq().args(["rewrite", "--json", "--trim-rate", "16M"]).arg(&lo.path));
    // Wait for the trim to start (its log line), without blocking on the pipe.
    let err = child.child().stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("trimming the free space") {
                let _ = tx.send(());
            }
            all += &line;
            all += "\n";
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(60)).expect("the trim starts");
    std::thread::sleep(Duration::from_millis(1500));
    // Stopped for 3 s, then continued: the pace must not catch up in a burst.
    use nix::sys::signal::Signal;
    child.signal(Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    child.signal(Signal::SIGCONT).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let sent = Instant::now();
    child.signal(Signal::SIGINT).unwrap();
    let out = child.wait();
    let took = sent.elapsed();
    let log = reader.join().unwrap();
    eprintln!("{log}");
    assert!(took < Duration::from_secs(2), "stopped {took:?} after SIGINT");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.code(), Some(6), "interrupted (signal {:?})", out.status.signal());
    let r = json_report(&out);
    let t = &r["space"]["trim"];
    assert_eq!(t["stopped_by"], "SIGINT");
    let trimmed = t["bytes_trimmed"].as_u64().unwrap();
    assert!(trimmed > 0 && trimmed < free_bytes(&mnt.dir), "part of the free space: {trimmed}");
    assert!(r["outcome"]["message"].as_str().unwrap().contains("stopped by SIGINT"), "{}", r["outcome"]);
    assert_eq!(r["verification"], "incomplete");
    // After the 3 s gap the pace does not catch up in a burst: each slice after the
    // resume is followed by its own discard time at the rate before the next one starts
    // (0.2 s of slack for a loaded host; a catch-up would start them back to back).
    let s = slices(&r);
    let gap = s.windows(2).position(|w| w[1].0 - w[0].0 > 2.5).expect("the stop shows as a gap");
    let rate = 16.0 * MIB as f64;
    let after: Vec<_> = s[gap + 1..].windows(2).take(3).collect();
    assert!(!after.is_empty(), "slices ran after SIGCONT: {s:?}");
    for w in after {
        let paid = w[0].3 as f64 / rate;
        assert!(
            w[1].0 - w[0].0 >= paid - 0.2,
            "slice at {} discarded {} and the next began {} s later: {s:?}",
            w[0].0,
            w[0].3,
            w[1].0 - w[0].0
        );
    }
    // The data is untouched and the filesystem not frozen.
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files[1..].iter().step_by(2).cloned().collect::<Vec<_>>());
}

#[test]
fn a_refused_run_never_trims() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = with_freed_blocks(&env, "refused", 128 * MIB);
    let du_before = du_bytes(&lo.image);
    // Someone else's freeze: reseq refuses at its first window and must not trim after.
    run_cmd(Command::new("fsfreeze").arg("-f").arg(&mnt.dir)).unwrap();
    let out = output(env.reseq().args(["rewrite", "--json"]).arg(&lo.path));
    run_cmd(Command::new("fsfreeze").arg("-u").arg(&mnt.dir)).unwrap();
    assert_eq!(out.status.code(), Some(3));
    let r = json_report(&out);
    assert!(r["space"]["bytes_trimmed"].is_null() && r["space"]["trim"].is_null(), "{}", r["space"]);
    assert_eq!(du_bytes(&lo.image), du_before, "nothing was discarded");
}

#[test]
fn bench_trim_impact_measures_cleans_up_and_refuses_without_discard() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("impact", 256 * MIB, "ext4");
    let scratch_left = || {
        std::fs::read_dir(&mnt.dir)
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with(".reseq-trim-impact"))
    };
    let out = output(env.reseq().args(["bench", "--json", "--trim-impact", "--trim-size", "96M"]).arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(0));
    assert!(!scratch_left(), "the scratch files are removed");
    let r = json_report(&out);
    let ti = &r["trim_impact"];
    assert_eq!(ti["scratch_bytes"].as_u64(), Some(96 * MIB));
    assert_eq!(ti["fs_type"], "ext4");
    let t = &ti["trim"];
    assert!(t["bytes_trimmed"].as_u64().unwrap() >= 96 * MIB, "the deleted file's blocks are discarded: {t}");
    assert!(t["slices"].as_u64().unwrap() >= 6, "16 MiB slices over 96 MiB: {t}");
    assert!(t["bytes_per_second"].as_f64().unwrap() > 0.0);
    assert!(t["probe"]["before"]["reads"].as_u64().unwrap() >= 50, "{t}");
    assert!(t["probe"]["during"]["reads"].as_u64().unwrap() >= 1, "{t}");
    // Every JSON reseq prints reads back through `reseq report`.
    let saved = env.path("impact.json");
    std::fs::write(&saved, &out.stdout).unwrap();
    let again = output(env.reseq().arg("report").arg(&saved));
    assert_eq!(again.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&again.stdout).contains("trim impact on"));

    // SIGTERM while the scratch file is being written: stopped, and nothing left behind.
    let child = Running::captured(env.reseq().args(["bench", "--trim-impact", "--trim-size", "180M"]).arg(&mnt.dir));
    let t0 = Instant::now();
    while !scratch_left() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    child.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait();
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("stopped by SIGTERM"));
    assert!(!scratch_left(), "the scratch files are removed after a signal");

    drop(mnt);
    drop(lo);

    // A device without discard: a loop device over a file on ramfs, which cannot punch
    // holes (no fallocate), so the loop driver offers no discard. (Writing 0 to a loop
    // device's queue/discard_max_bytes would do too, but the kernel keeps that limit for
    // whoever attaches that loop device next, and no other value can be written back.)
    let ram = env.path("ram");
    std::fs::create_dir_all(&ram).unwrap();
    run_cmd(Command::new("mount").args(["-t", "ramfs", "reseq-test"]).arg(&ram)).unwrap();
    let ram = Mount { dir: ram };
    // Without direct I/O, which ramfs does not do (the helper's loop devices use it).
    let img = ram.dir.join("img");
    std::fs::File::create(&img).unwrap().set_len(64 * MIB).unwrap();
    let dev = run_cmd(Command::new("losetup").args(["--find", "--show"]).arg(&img)).unwrap();
    let lo = LoopDevice { path: dev.trim().into(), image: img };
    let knob = format!("/sys/block/{}/queue/discard_max_bytes", lo.name());
    assert_eq!(std::fs::read_to_string(&knob).unwrap().trim(), "0", "no discard over ramfs");
    mkfs_ext4(&lo.path).unwrap();
    let mnt = Mount::new(&lo.path, &env.path("nodiscard-mnt"), &[]).unwrap();
    let bytes_before = bytes_written_to(&lo.path);
    let out = output(env.reseq().args(["bench", "--trim-impact", "--trim-size", "16M"]).arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("cannot discard"), "{}", stderr(&out));
    let left = std::fs::read_dir(&mnt.dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with(".reseq"));
    assert!(!left);
    assert_eq!(bytes_written_to(&lo.path), bytes_before, "refused before writing anything");
    drop(mnt);
    drop(lo);
    drop(ram);
}
