//! The nightly job an admin reads in a mail: `reseq run --config` as the shipped unit
//! and the documented cron line run it, with no terminal.

use std::time::{Duration, Instant};

use crate::common::*;

const MIB: u64 = 1 << 20;

/// A job of over 90 s with its benchmarks before and after (`bench = true`), run as the
/// unit's `ExecStart=` runs it (no terminal, stdin from /dev/null), prints at most 15
/// lines in all: a start, a progress line per quarter at most, warnings once, the
/// summary with a line per benchmark and the verdict. With `quiet = true`, no log line
/// but warnings.
#[test]
fn a_nightly_job_prints_at_most_fifteen_lines() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("nightly", 128 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 12, 4 << 20, 31);
    let metrics = env.path("reseq.prom");
    // Windows of 1 s, not shorter: what is tested is the mail. In a whole-suite run a 300 ms
    // window lasted 773 ms against its 600 ms bound (exit 7): a thaw queued behind the
    // others' writes (up to 307 ms measured under bench/load.sh; docs/OPERATIONS.md).
    let job = |name: &str, extra: &str| {
        let path = env.path(name);
        let text = format!(
            "targets = [\"{}\"]\nstate_dir = \"{}\"\nmax_freeze = \"1s\"\nmetrics_file = \"{}\"\n{extra}",
            mnt.dir.display(),
            env.state_dir().display(),
            metrics.display()
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let run = |config: &std::path::Path| {
        let start = Instant::now();
        // As the unit runs it: no RUST_LOG (it would set the level over `quiet`).
        let mut cmd = env.reseq();
        cmd.env_remove("RUST_LOG").args(["run", "--config"]).arg(config).stdin(std::process::Stdio::null());
        let out = output(&mut cmd);
        (out, start.elapsed())
    };
    let (out, took) = run(&job("nightly.toml", "rate = \"512K\"\nbench = true\n"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    eprintln!("{took:?}, {} lines:\n{text}", text.lines().count());
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(took >= Duration::from_secs(90), "the job must run long enough to test: {took:?}");
    assert!(text.lines().count() <= 15, "a mail of {} lines:\n{text}", text.lines().count());
    let progress: Vec<&str> = text.lines().filter(|l| l.contains("progress: ")).collect();
    assert!(!progress.is_empty(), "a long job says how far it is: {text}");
    // Of the whole run (12 files, each an engine run of its own), not of one file.
    for l in progress {
        assert!(l.contains(" of 48.0 MiB (") && l.contains(" of 12 files, "), "{l}");
    }
    assert!(text.contains("outcome: success"), "{text}");
    for said in ["  before: median ", "  after: median ", "  verdict: "] {
        assert_eq!(text.lines().filter(|l| l.starts_with(said)).count(), 1, "one {said:?} line: {text}");
    }
    assert!(std::fs::read_to_string(&metrics).unwrap().contains("reseq_"), "the metrics tell the rest");
    assert_files_intact(&files);

    let (out, _) = run(&job("quiet.toml", "quiet = true\n"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains(" INFO "), "quiet = true: {text}");
    assert!(text.contains("outcome: success"), "quiet keeps the summary: {text}");
}
