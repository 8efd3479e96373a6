//! `pkill -9 reseq`, `killall -9 reseq`, `pkill -9 -f 'reseq rewrite'` and
//! `timeout -s KILL`, each at 10 random moments of a run on a mounted filesystem: the
//! guardian is out of their reach (its own session and process group, its own name and
//! command line), so the filesystem is thawed within 2 s every time and no fsync'd write
//! is lost.
//!
//! The binary runs under a name of this test's own (a symlink `reseq-XXXXXX`, the
//! process name being the name it was started by), and the kills name that: `pkill -9
//! reseq` would also kill every reseq on the machine, other tests' and a user's. What
//! kept the guardian out of reach of the real name is checked on the guardian itself.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

/// `program` with the environment `TestEnv::reseq` gives the binary.
fn with_reseq_env(env: &TestEnv, program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new(program);
    for (k, v) in env.reseq().get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

fn slow_rewrite<'a>(c: &'a mut Command, dev: &Path) -> &'a mut Command {
    c.env("RESEQ_FAULTS", "delay@after-write#*=20")
        .args(["rewrite", "--restart", "--max-freeze", "500ms", "--chunk-size", "1M"])
        .arg(dev)
}

/// The binary under a name no other process has: `reseq-` and the (unique) suffix of
/// this test's scratch directory, within the 15 bytes of a process name.
fn named_binary(env: &TestEnv) -> PathBuf {
    let dir = env.dir.path().file_name().unwrap().to_string_lossy().into_owned();
    let name = format!("reseq-{}", &dir[dir.len() - 6..]);
    let bin = env.path(&name);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_reseq"), &bin).unwrap();
    bin
}

/// This run's guardians, as (PID, process name, command line): the processes whose
/// environment names its run dir (a guardian keeps reseq's), but `reseq` itself and
/// zombies (a container's PID 1 may never reap one).
fn guardians(run_dir: &Path, reseq: Option<u32>) -> Vec<(String, String, String)> {
    let ours = format!("RESEQ_RUN_DIR={}\0", run_dir.display());
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let read = |f: &str| std::fs::read(e.path().join(f)).map(|b| String::from_utf8_lossy(&b).into_owned());
        let (Ok(stat), Ok(env)) = (read("stat"), read("environ")) else { continue };
        let dead = stat.contains(") Z ") || stat.contains(") X ");
        let is_reseq = reseq.is_some_and(|p| e.file_name() == *p.to_string());
        if env.contains(&ours)
            && !dead
            && !is_reseq
            && let (Ok(comm), Ok(cmdline)) = (read("comm"), read("cmdline"))
        {
            found.push((e.file_name().to_string_lossy().into_owned(), comm.trim().to_string(), cmdline));
        }
    }
    found
}

/// reseq itself is gone by now (reaped): only a guardian of this run can be left.
fn no_guardian_left(run_dir: &Path) {
    let start = Instant::now();
    loop {
        let records = std::fs::read_dir(run_dir)
            .map_or(0, |d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "freeze")).count());
        let alive = guardians(run_dir, None);
        if records == 0 && alive.is_empty() {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(2), "{records} record(s) left, guardians alive: {alive:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `pkill reseq`, `killall reseq` and `pkill -f reseq` match on: neither the
/// process name nor the command line of a live guardian of this run names reseq.
/// Returns how many guardians it saw.
fn guardians_not_named_reseq(run_dir: &Path, reseq: u32) -> usize {
    let found = guardians(run_dir, Some(reseq));
    for (pid, comm, cmdline) in &found {
        assert!(!comm.contains("reseq") && !cmdline.contains("reseq"), "guardian {pid}: {comm:?}, {cmdline:?}");
    }
    found.len()
}

#[test]
fn killing_reseq_by_name_never_leaves_a_freeze() {
    if !require(&["mkfs.ext4", "e2fsck", "pkill", "killall", "timeout", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, m) = env.mounted("d", 320 << 20, "ext4");
    fill_files(&m.dir, 4, 50 << 20, 3);
    let writer = FsyncWriter::start(&m.dir, &m.dir.join("log"), &env.path("ack"), &env.path("stop"));
    let bin = named_binary(&env);
    let name = bin.file_name().unwrap().to_str().unwrap().to_string();
    let mut rng = XorShift::new(99);
    let (mut in_window, mut guardians_seen) = (0, 0);
    for method in ["pkill", "killall", "pkill -f", "timeout"] {
        for i in 0..10 {
            let wait = Duration::from_millis(200 + rng.next_u64() % 1300);
            let mut cmd = if method == "timeout" {
                let mut t = with_reseq_env(&env, "timeout");
                t.args(["-s", "KILL", &format!("{:.3}", wait.as_secs_f64())]).arg(&bin);
                t
            } else {
                with_reseq_env(&env, &bin)
            };
            let child = spawn_captured(slow_rewrite(&mut cmd, &lo.path));
            if method != "timeout" {
                std::thread::sleep(wait);
                guardians_seen += guardians_not_named_reseq(&env.run_dir(), child.id());
                let kill = match method {
                    "pkill" => Command::new("pkill").args(["-9", &name]).output(),
                    "killall" => Command::new("killall").args(["-9", &name]).output(),
                    _ => Command::new("pkill").args(["-9", "-f", &format!("{name} rewrite")]).output(),
                };
                kill.unwrap();
            }
            let out = wait_captured(child);
            assert_eq!(out.status.code().or(Some(137)), Some(137), "{method} #{i}: reseq was not killed");
            let err = stderr(&out);
            if err.contains("were frozen; thawed them") {
                in_window += 1;
            }
            assert_thawed_within(&m.dir, Duration::from_secs(2));
            no_guardian_left(&env.run_dir());
        }
    }
    eprintln!("{in_window} of 40 kills landed inside a freeze window; {guardians_seen} guardians seen before a kill");
    assert!(guardians_seen > 0, "no guardian was there to check before a kill");
    assert!(in_window >= 10, "too few kills landed in a window to show anything ({in_window})");
    assert!(writer.finish() > 0);
    drop(m);
    fsck_clean(&lo.path, "ext4");
}
