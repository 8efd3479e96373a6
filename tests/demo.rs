//! `reseq demo` end to end: it must succeed, verify, and leave nothing behind.

mod common;

use common::*;

#[test]
fn demo_runs_and_cleans_up() {
    if !require(&["losetup", "mkfs.ext4", "e2fsck"]) {
        return;
    }
    let env = TestEnv::new();
    let out = output(env.reseq().args(["demo", "--json", "--size", "128M"]));
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    assert_eq!(r["verification"], "passed");
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    let skipped = r["space"]["bytes_skipped_as_free"].as_u64().unwrap();
    assert_eq!(written + skipped, 128u64 << 20, "every byte rewritten or skipped as free");
    assert!(written >= 32 << 20, "the 32 MiB database file at least is rewritten");
    assert_eq!(r["plan"]["filesystems_frozen"][0]["fs_type"], "ext4");
    assert!(stderr(&out).contains("e2fsck -fn clean"));
    let loops = run_cmd(std::process::Command::new("losetup").arg("-a")).unwrap();
    assert!(!loops.contains("reseq-demo-"), "the demo left a loop device: {loops}");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains("reseq-demo-"), "the demo left a mount");
}

#[test]
fn demo_without_root_runs_the_simulation() {
    if !require(&["setpriv"]) {
        return;
    }
    let out = output(std::process::Command::new("setpriv").args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        env!("CARGO_BIN_EXE_reseq"),
        "demo",
        "--json",
    ]));
    assert_eq!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("running the simulated SSD instead"));
    let r = json_report(&out);
    assert_eq!(r["steps"].as_array().unwrap().len(), 6);
}
