//! The simulated SSD from the command line: one step at a time through a state file,
//! and the whole experiment in one command.

use crate::common::{require, reseq_command};
use std::path::Path;

use serde_json::Value;

fn reseq(args: &[&str]) -> (i32, Value, String) {
    let out = reseq_command().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("reseq {args:?} -> {:?}\n{stderr}", out.status.code());
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v, stderr)
}

fn read_seconds(state: &Path) -> f64 {
    let (code, v, _) = reseq(&["sim", "read", state.to_str().unwrap(), "--length", "256M"]);
    assert_eq!(code, 0);
    v["virtual_seconds"].as_f64().unwrap()
}

#[test]
fn fragment_then_rewrite_as_separate_commands() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ssd.sim");
    let s = state.to_str().unwrap();
    assert_eq!(reseq(&["sim", "create", s, "--device-size", "1G"]).0, 0);
    assert_eq!(reseq(&["sim", "create", s]).0, 2, "create refuses to overwrite");
    assert_eq!(reseq(&["sim", "write", s, "--length", "256M"]).0, 0);
    let fresh = read_seconds(&state);
    let (code, v, _) = reseq(&["sim", "fragment", s, "--length", "256M", "--random-writes", "250M"]);
    assert_eq!(code, 0);
    assert_eq!(v["random_4k_writes"], 64000);
    let degraded = read_seconds(&state);
    assert!(degraded > fresh * 2.0, "fragmenting should slow reads: {fresh} -> {degraded}");
    let (code, v, _) = reseq(&["sim", "rewrite", s, "--length", "256M", "--chunk-size", "1M"]);
    assert_eq!(code, 0);
    assert_eq!(v["rewrite"]["bytes_written"], 256u64 << 20);
    assert_eq!(v["rewrite"]["bytes_verified"], 256u64 << 20);
    let after = read_seconds(&state);
    assert!(after <= fresh * 1.03, "rewrite should restore reads: fresh {fresh}, after {after}");
    // `reseq rewrite sim:STATE` is the same, over the whole device.
    let (code, v, _) = reseq(&["rewrite", &format!("sim:{s}"), "--only-slow", "--json"]);
    assert_eq!(code, 0);
    assert!(v["selection"]["bytes_left_alone"].as_u64().unwrap() > 0);
    // Already rewritten above: nothing reads slowly, nothing is written, and it says so.
    assert_eq!(v["results"]["bytes_written"], 0, "{v}");
    assert_eq!(v["selection"]["chosen"].as_array().unwrap().len(), 0, "{v}");
    // Its JSON is a report like any other: `reseq report` renders it.
    let saved = dir.path().join("sim-run.json");
    std::fs::write(&saved, serde_json::to_vec(&v).unwrap()).unwrap();
    let out = reseq_command().arg("report").arg(&saved).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("virtual time"));
    let (code, _, err) = reseq(&["rewrite", &format!("sim:{s}"), "--resume"]);
    assert_eq!(code, 2);
    assert!(err.contains("on a simulated SSD"));
    let (code, v, _) = reseq(&["sim", "info", s]);
    assert_eq!(code, 0);
    assert_eq!(v["mapped_bytes"], 256u64 << 20);
    // Degraded again, then rewritten with --bench: the real verdict path, on the
    // simulated drive's clock, says "faster".
    assert_eq!(reseq(&["sim", "fragment", s, "--length", "256M", "--random-writes", "250M"]).0, 0);
    let (code, v, _) = reseq(&["rewrite", &format!("sim:{s}"), "--bench", "--bench-length", "256M", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v["verdict"]["verdict"], "faster", "{}", v["verdict"]);
    assert!(v["verdict"]["speedup"].as_f64().unwrap() >= 1.5, "{}", v["verdict"]);
}

#[test]
fn simulate_prints_the_experiment() {
    let (code, v, _) = reseq(&["simulate", "--json", "--device-size", "1G", "--file-size", "512M"]);
    assert_eq!(code, 0);
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 6);
    let fresh = steps[0]["read_seconds"].as_f64().unwrap();
    let worst = steps[4]["read_seconds"].as_f64().unwrap();
    let after = steps[5]["read_seconds"].as_f64().unwrap();
    assert!(worst > 2.5 * fresh, "the default preset degrades: {fresh} -> {worst}");
    assert!(after <= fresh * 1.03, "reseq restores it: {after} vs {fresh}");
    assert!(v["model_state_bytes"].as_f64().unwrap() / ((1u64 << 30) / 4096) as f64 <= 16.0);
}

#[test]
fn bad_parameters_are_usage_errors() {
    let (code, _, err) = reseq(&["simulate", "--preset", "floppy"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown preset 'floppy'"));
    let (code, _, err) = reseq(&["simulate", "--set", "warp_factor=9"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown model parameter 'warp_factor'"));
    // A state file that is not there is bad input, not an I/O failure of a run.
    let (code, _, err) = reseq(&["sim", "read", "/nonexistent.sim"]);
    assert_eq!(code, 2);
    assert!(err.contains("loading simulated device"));
}

#[test]
fn bench_and_scan_a_simulated_ssd() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ssd.sim");
    let s = state.to_str().unwrap();
    let sim = format!("sim:{s}");
    assert_eq!(reseq(&["sim", "create", s, "--device-size", "1G"]).0, 0);
    assert_eq!(reseq(&["sim", "write", s, "--length", "512M"]).0, 0);
    // Fragment only the second quarter of the file.
    assert_eq!(reseq(&["sim", "fragment", s, "--offset", "128M", "--length", "128M", "--random-writes", "256M"]).0, 0);
    let (code, v, _) = reseq(&["bench", &sim, "--json", "--length", "512M", "--passes", "2"]);
    assert_eq!(code, 0);
    let b = &v["bench"];
    assert_eq!(b["virtual_time"], true);
    assert_eq!(b["passes"][0]["seconds"], b["passes"][1]["seconds"], "virtual time is deterministic");
    let (code, v, _) = reseq(&["scan", &sim, "--json", "--length", "512M", "--regions", "8"]);
    assert_eq!(code, 0);
    let slow: Vec<u64> = v["scan"]["regions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["slow"] == true)
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(slow, vec![2, 3], "the fragmented quarter [128M, 256M) is regions 2 and 3");
}

/// A drive whose GC can get stuck runs until it does (as far as the reference runs it),
/// then says so and names the smallest size that works; only a drive that cannot take one
/// write is refused up front. Never a hang or a panic.
#[test]
fn a_drive_runs_until_its_gc_gets_stuck() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("small.sim");
    let s = state.to_str().unwrap();
    for args in
        [&["--device-size", "512M"][..], &["--preset", "datacenter-sata", "--device-size", "3G", "--file-size", "1G"]]
    {
        let (code, _, err) = reseq(&[&["simulate", "--json"][..], args].concat());
        assert_eq!(code, 0, "{args:?}: {err}");
    }
    assert_eq!(reseq(&["sim", "create", s, "--device-size", "512M"]).0, 0);
    let (code, _, err) = reseq(&["sim", "write", s]);
    assert_eq!(code, 2);
    assert!(err.contains("garbage collection can free nothing") && err.contains("--device-size 539M"), "{err}");
    assert_eq!(reseq(&["sim", "info", s]).1["mapped_bytes"], 0, "a failed step leaves the state file as it was");
    let (code, _, err) = reseq(&["simulate", "--device-size", "64M", "--file-size", "32M"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot work") && err.contains("--device-size 90M"), "{err}");
    // The size it named works, filled to the last block, with random writes.
    std::fs::remove_file(&state).unwrap();
    assert_eq!(reseq(&["sim", "create", s, "--device-size", "539M"]).0, 0);
    assert_eq!(reseq(&["sim", "write", s]).0, 0);
    let (code, _, _) = reseq(&["sim", "fragment", s, "--random-writes", "1G"]);
    assert_eq!(code, 0);
}

/// The `sim` commands stream the state file: a command on a 64 GiB simulated drive peaks
/// at no more than 1.25x its model state (the tables are 8.3 bytes per 4 KiB).
///
/// The peak is taken by a small python3 parent: a process forked straight from this test
/// binary starts with the binary's whole resident set as its high-water mark (the kernel
/// keeps it across exec), and the binary holds every suite's memory.
#[test]
fn sim_commands_peak_near_the_model_state() {
    if !require(&["python3"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("big.sim");
    let s = state.to_str().unwrap();
    let (code, v, _) = reseq(&["sim", "create", s, "--device-size", "64G"]);
    assert_eq!(code, 0);
    let model = v["model_state_bytes"].as_u64().unwrap();
    const PEAK: &str = "import resource, subprocess, sys\n\
        code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n\
        print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)";
    for args in [&["sim", "write", s, "--length", "64M"][..], &["sim", "read", s, "--length", "64M"][..]] {
        let out = std::process::Command::new("python3")
            .args(["-c", PEAK, env!("CARGO_BIN_EXE_reseq")])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let (status, kib) = text.trim().split_once(' ').unwrap_or_else(|| panic!("python3: {text:?}"));
        assert_eq!(status, "0", "{args:?}");
        let peak = kib.parse::<u64>().unwrap() * 1024;
        eprintln!("{args:?}: peak RSS {peak} bytes, model state {model} bytes ({:.2}x)", peak as f64 / model as f64);
        assert!(peak as f64 <= 1.25 * model as f64, "{args:?} peaked at {peak} bytes for {model} bytes of model state");
    }
}

/// `reseq estimate`: a sample says "looks flat" on a fresh drive and "worth it" once
/// half of it is degraded by random writes, in seconds of reading, writing nothing.
#[test]
fn estimate_tells_a_flat_drive_from_a_degraded_one() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("est.sim");
    let s = state.to_str().unwrap();
    assert_eq!(reseq(&["sim", "create", s, "--device-size", "1G"]).0, 0);
    assert_eq!(reseq(&["sim", "write", s, "--length", "1G"]).0, 0);
    let (code, v, _) = reseq(&["estimate", &format!("sim:{s}"), "--json"]);
    assert_eq!(code, 0);
    let e = &v["estimate"];
    assert!(e["predicted_speedup"].as_f64().unwrap() < 1.3, "{e}");
    assert!(e["advice"].as_str().unwrap().starts_with("looks flat"), "{e}");
    assert_eq!(e["regions"].as_array().unwrap().len(), 32);
    assert_eq!(reseq(&["sim", "fragment", s, "--length", "512M", "--random-writes", "500M"]).0, 0);
    let (code, v, _) = reseq(&["estimate", &format!("sim:{s}"), "--json", "--sample", "64M"]);
    assert_eq!(code, 0);
    let e = &v["estimate"];
    assert!(e["predicted_speedup"].as_f64().unwrap() >= 1.3, "{e}");
    assert!(e["advice"].as_str().unwrap().starts_with("worth it"), "{e}");
    assert_eq!(e["sample_bytes"], 64u64 << 20);
    // It wrote nothing: the drive's host writes are what they were.
    let (_, info, _) = reseq(&["sim", "info", s]);
    assert_eq!(info["mapped_bytes"], 1u64 << 30);
}

/// Retention (docs/FTL-MODEL.md): `sim age` makes the data of consumer-tlc-aging read
/// slower, by the shape the preset documents (2-3 months: 1/5 to 1/10 of fresh), a
/// rewrite makes it fresh again, and a drive with retention off does not change.
#[test]
fn aged_data_reads_slowly_until_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ssd.sim");
    let s = state.to_str().unwrap();
    assert_eq!(reseq(&["sim", "create", s, "--device-size", "1G", "--preset", "consumer-tlc-aging"]).0, 0);
    assert_eq!(reseq(&["sim", "write", s, "--length", "256M"]).0, 0);
    let fresh = read_seconds(&state);
    let (code, v, _) = reseq(&["sim", "age", s, "--days", "60"]);
    assert_eq!(code, 0);
    assert_eq!((v["age_days"].as_f64(), v["served"].as_bool()), (Some(60.0), Some(false)));
    let two_months = read_seconds(&state);
    // Through a symlink: the drive it names ages, and the link stays a link.
    let link = dir.path().join("link.sim");
    std::os::unix::fs::symlink(&state, &link).unwrap();
    assert_eq!(reseq(&["sim", "age", link.to_str().unwrap(), "--days", "30.5"]).0, 0);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
    let three_months = read_seconds(&state);
    eprintln!("fresh {fresh:.3} s, 60 days {two_months:.3} s, 90.5 days {three_months:.3} s");
    assert!((5.0..=10.0).contains(&(two_months / fresh)), "60 days: x{}", two_months / fresh);
    assert!((5.0..=10.0).contains(&(three_months / fresh)), "90 days: x{}", three_months / fresh);
    assert!(three_months > two_months);
    let (code, v, _) = reseq(&["sim", "info", s]);
    assert_eq!(code, 0);
    assert_eq!(v["age_clock_days"], 90.5);
    assert_eq!(v["retention"]["on"], true);
    assert_eq!(v["data_by_age"][0]["age_days"], 90);
    assert_eq!(v["data_by_age"][0]["bytes"], 256u64 << 20);
    assert_eq!(reseq(&["sim", "rewrite", s, "--length", "256M"]).0, 0);
    let after = read_seconds(&state);
    assert!(after <= fresh * 1.03, "the rewrite makes the data fresh: {after} s vs {fresh} s");
    // Refused: a step back, a typo-sized step, a clock past a century.
    for bad in ["--days=-1", "--days=nan", "--days=1e6"] {
        let (code, _, err) = reseq(&["sim", "age", s, bad]);
        assert_eq!(code, 2, "{bad}: {err}");
    }
    let (code, _, err) = reseq(&["sim", "age", s, "--days", "36500"]);
    assert_eq!(code, 2);
    assert!(err.contains("past its limit"), "{err}");
    // A preset without retention: aging changes nothing, and says so.
    let plain = dir.path().join("plain.sim");
    let p = plain.to_str().unwrap();
    assert_eq!(reseq(&["sim", "create", p, "--device-size", "1G"]).0, 0);
    assert_eq!(reseq(&["sim", "write", p, "--length", "256M"]).0, 0);
    let before = read_seconds(&plain);
    let (code, _, err) = reseq(&["sim", "age", p, "--days", "365"]);
    assert_eq!(code, 0);
    assert!(err.contains("retention is off"), "{err}");
    assert_eq!(read_seconds(&plain), before);
}

/// A drive whose data file is locked (served) by something with no control channel:
/// `sim age` refuses rather than change a state file the server would overwrite.
#[test]
fn age_refuses_a_served_drive_it_cannot_reach() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ssd.sim");
    let s = state.to_str().unwrap();
    assert_eq!(reseq(&["sim", "create", s, "--device-size", "1G", "--preset", "consumer-tlc-aging"]).0, 0);
    let data = std::fs::File::create(dir.path().join("ssd.sim.data")).unwrap();
    let lock = nix::fcntl::Flock::lock(data, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    let before = std::fs::read(&state).unwrap();
    let (code, _, err) = reseq(&["sim", "age", s, "--days", "30"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("being served") && err.contains("no control channel"), "{err}");
    assert_eq!(std::fs::read(&state).unwrap(), before, "the state file changed");
    drop(lock);
    assert_eq!(reseq(&["sim", "age", s, "--days", "30"]).0, 0, "unlocked: aged in the state file");
}
