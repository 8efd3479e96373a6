//! The screen a person reads (issue 51): every command's default output against a
//! mounted ext4 loop device, checked for its shape: no line over 100 columns, the
//! common runs within their line counts, the answer first. `-v` keeps the rest.

use crate::common::*;

const MIB: u64 = 1 << 20;
const WIDTH: usize = 100;

/// stdout and stderr, as a terminal or a mail shows them.
fn screen(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(out))
}

/// Asserts the widths and at most `max_lines` lines; returns the text.
fn shaped(what: &str, cmd: &mut std::process::Command, max_lines: usize) -> String {
    // Without a terminal clap wraps at 100 columns, unless COLUMNS says otherwise.
    let out = output(cmd.env_remove("COLUMNS").env_remove("RUST_LOG"));
    let text = screen(&out);
    assert_eq!(out.status.code(), Some(0), "{what}:\n{text}");
    for line in text.lines() {
        assert!(line.chars().count() <= WIDTH, "{what}: a line of {}:\n{line}", line.chars().count());
    }
    let n = text.lines().count();
    assert!(n <= max_lines, "{what}: {n} lines, at most {max_lines}:\n{text}");
    assert!(!text.contains(" INFO ") && !text.contains("Z WARN"), "{what}: plain log lines:\n{text}");
    text
}

#[test]
fn every_command_fits_the_screen() {
    if !require(&["losetup", "mkfs.ext4", "script", "stty"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("screen", 128 * MIB, "ext4");
    let dir = mnt.dir.join("d");
    std::fs::create_dir(&dir).unwrap();
    fill_files(&dir, 4, 4 << 20, 51);
    let file = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
    let state = env.state_dir();

    shaped("reseq -h", env.reseq().arg("-h"), 40);
    shaped("rewrite -h", env.reseq().args(["rewrite", "-h"]), 70);
    for c in ["bench", "scan", "estimate", "status", "demo", "run", "thaw", "restore"] {
        shaped(&format!("{c} -h"), env.reseq().args([c, "-h"]), 40);
    }
    let help = shaped("rewrite --help", env.reseq().args(["rewrite", "--help"]), 400);
    assert!(help.contains("auto: tried") && help.contains("auto: probed"), "{help}");

    let dry = shaped("rewrite DIR --dry-run", env.reseq().args(["rewrite", "--dry-run"]).arg(&dir), 12);
    assert!(dry.starts_with("dry run: about "), "the answer first:\n{dry}");
    assert!(!dry.contains("prediction rests on"), "the model is behind -v:\n{dry}");
    let dry = shaped("rewrite DEV --dry-run", env.reseq().args(["rewrite", "--dry-run"]).arg(&lo.path), 15);
    assert!(dry.starts_with("dry run: about "), "the answer first:\n{dry}");
    let all = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    let all = String::from_utf8_lossy(&all.stdout).to_string();
    for kept in ["prediction rests on model: ", "other writers: none", "guardian: ", "depth: ", "memory: "] {
        assert!(all.contains(kept), "-v keeps {kept:?}:\n{all}");
    }

    let est = shaped("estimate FILE", env.reseq().arg("estimate").arg(&file), 4);
    assert!(est.lines().any(|l| l.contains("estimate: median ")), "{est}");
    shaped("estimate DIR", env.reseq().arg("estimate").arg(&dir), 12);
    shaped("bench DEV", env.reseq().arg("bench").arg(&lo.path), 12);
    shaped("scan DEV", env.reseq().args(["scan", "--regions", "8"]).arg(&lo.path), 20);
    let run = shaped("rewrite DIR", env.reseq().arg("rewrite").arg(&dir), 15);
    assert!(run.contains("outcome: success"), "{run}");
    // After the run, which made the state directory.
    shaped("status", env.reseq().arg("status").arg("--state-dir").arg(&state), 5);

    // A run killed mid-way, as `status` shows it, and the refusal of a plain run after it,
    // at an 80-column terminal (a pty from script(1)): wrapped to it, under itself.
    let killed = ["rewrite", "--chunk-size", "1M", "--max-freeze", "300ms", "--pause", "50ms", "--include-free"];
    let out = output(env.reseq().args(killed).arg(&lo.path).env("RESEQ_FAULTS", "kill@after-write#2"));
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    let st = shaped("status, a run unfinished", env.reseq().arg("status").arg("--state-dir").arg(&state), 8);
    assert!(st.contains("unfinished device run") && st.contains("--include-free"), "{st}");
    let bin = env!("CARGO_BIN_EXE_reseq");
    let line = format!("stty cols 80 rows 24; exec '{bin}' rewrite '{}'", lo.path.display());
    let mut script = std::process::Command::new("script");
    script.env("RESEQ_STATE_DIR", env.state_dir()).env("RESEQ_RUN_DIR", env.run_dir()).env_remove("RUST_LOG");
    let tty = output(script.args(["-qec", &line, "/dev/null"]));
    let text = String::from_utf8_lossy(&tty.stdout).replace('\r', "");
    assert!(text.contains("reseq: refused: ") && text.contains("--resume"), "{text}");
    for l in text.lines() {
        assert!(l.chars().count() <= 80, "a line of {} at an 80-column terminal:\n{l}", l.chars().count());
    }
    let message = text.lines().skip_while(|l| !l.starts_with("reseq: refused: ")).count();
    assert!(message >= 3, "the refusal wrapped under itself:\n{text}");
}
