//! `pkill -9 reseq`, `killall -9 reseq`, `pkill -9 -f 'reseq rewrite'` and
//! `timeout -s KILL`, each at 10 random moments of a run on a mounted filesystem: the
//! guardian is out of their reach (its own session and process group, its own name and
//! command line), so the filesystem is thawed within 2 s every time and no fsync'd write
//! is lost.
//!
//! Alone on the machine (`common::exclusive`): killing by name would hit every reseq
//! process of the tests running beside it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

fn slow_rewrite(env: &TestEnv, dev: &Path) -> Command {
    let mut c = env.reseq();
    c.env("RESEQ_FAULTS", "delay@after-write#*=20")
        .args(["rewrite", "--restart", "--max-freeze", "500ms", "--chunk-size", "1M"])
        .arg(dev);
    c
}

fn no_guardian_left(run_dir: &Path) {
    let start = Instant::now();
    loop {
        let records = std::fs::read_dir(run_dir)
            .map_or(0, |d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "freeze")).count());
        // Running guardians (a zombie is gone: a container's PID 1 may never reap it).
        let alive = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("stat"))
                .is_ok_and(|s| s.contains("(freeze-guardian)") && !s.contains(") Z ") && !s.contains(") X "))
        });
        if records == 0 && !alive {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(2), "{records} record(s) left, guardian alive: {alive}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn killing_reseq_by_name_never_leaves_a_freeze() {
    // Killing by name hits every reseq process of the tests beside it: this one runs alone.
    let _alone = exclusive();
    if !require(&["mkfs.ext4", "e2fsck", "pkill", "killall", "timeout", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = env.mounted("d", 320 << 20, "ext4");
    fill_files(&m.dir, 4, 50 << 20, 3);
    let writer = FsyncWriter::start(&m.dir, &m.dir.join("log"), &env.path("ack"), &env.path("stop"));
    let mut rng = XorShift::new(99);
    let mut in_window = 0;
    for method in ["pkill", "killall", "pkill -f", "timeout"] {
        for i in 0..10 {
            let wait = Duration::from_millis(200 + rng.next_u64() % 1300);
            let child = if method == "timeout" {
                let c = slow_rewrite(&env, &lo.path);
                let mut t = Command::new("timeout");
                t.args(["-s", "KILL", &format!("{:.3}", wait.as_secs_f64())]).arg(c.get_program()).args(c.get_args());
                for (k, v) in c.get_envs() {
                    match v {
                        Some(v) => t.env(k, v),
                        None => t.env_remove(k),
                    };
                }
                spawn_captured(&mut t)
            } else {
                let c = spawn_captured(&mut slow_rewrite(&env, &lo.path));
                std::thread::sleep(wait);
                let kill = match method {
                    "pkill" => Command::new("pkill").args(["-9", "reseq"]).output(),
                    "killall" => Command::new("killall").args(["-9", "reseq"]).output(),
                    _ => Command::new("pkill").args(["-9", "-f", "reseq rewrite"]).output(),
                };
                kill.unwrap();
                c
            };
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
    eprintln!("{in_window} of 40 kills landed inside a freeze window");
    assert!(in_window >= 10, "too few kills landed in a window to show anything ({in_window})");
    assert!(writer.finish() > 0);
    drop(m);
    fsck_clean(&lo.path, "ext4");
}
