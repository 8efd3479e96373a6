//! The freeze bound: whatever happens to reseq (Ctrl-Z, SIGSTOP, kill -9 of both
//! processes, another program thawing and re-freezing), no freeze outlasts
//! `--max-freeze` plus the stated grace, reseq never thaws a freeze that is not its own,
//! and no fsync'd write is lost. Each test has its own loop devices and runs in parallel
//! with the others. (Killing by name, which would hit other tests' reseq processes,
//! runs alone: tests/it/kill_by_name.rs.)

use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const MAX_FREEZE: &str = "500ms";
/// `--max-freeze` 500 ms plus its grace (500 ms): reseq states it in the dry run.
const BOUND: Duration = Duration::from_millis(1000);
/// What the stall probe may see beyond the bound: its own fsync after the thaw and the
/// scheduling noise of a shared 2-core machine.
const PROBE_SLACK: Duration = Duration::from_millis(600);

/// ext4 on a 320 MiB loop device with 200 MiB of data, so a run has chunks to write.
fn filesystem(env: &TestEnv, name: &str) -> (LoopDevice, Mount) {
    let (lo, m) = env.mounted(name, 320 << 20, "ext4");
    fill_files(&m.dir, 4, 50 << 20, 7);
    (lo, m)
}

/// A device-mode rewrite slowed by 20 ms after each 1 MiB write, so that most of the
/// run is spent inside freeze windows and a signal usually lands in one.
fn slow_rewrite(env: &TestEnv, dev: &Path, extra: &[&str]) -> Command {
    let mut c = env.reseq();
    c.env("RESEQ_FAULTS", "delay@after-write#*=20")
        .args(["rewrite", "--max-freeze", MAX_FREEZE, "--chunk-size", "1M", "--json"])
        .args(extra)
        .arg(dev);
    c
}

/// The guardian's own measurement when it killed reseq: "after N ms frozen".
fn guardian_kill_ms(stderr: &str) -> Option<u64> {
    let at = stderr.find("ms frozen")?;
    stderr[..at].rsplit("after ").next()?.trim().parse().ok()
}

/// The PID of the reseq process rewriting `dev` (found by its command line).
fn reseq_running_on(dev: &Path) -> Option<u32> {
    let want = dev.display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmd.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        (comm.trim() == "reseq" && args.contains(&want)).then_some(pid)
    })
}

#[test]
fn dry_run_and_report_state_the_bound() {
    if !require(&["mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, _m) = filesystem(&env, "d");
    let out = output(env.reseq().args(["rewrite", "--dry-run", "-v", "--max-freeze", MAX_FREEZE]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("0.500 s after the deadline (grace)") && text.contains("beyond 1.000 s"), "{text}");
    let out = output(env.reseq().args(["rewrite", "--dry-run", "--json", "--max-freeze", MAX_FREEZE]).arg(&lo.path));
    let r = json_report(&out);
    assert_eq!(r["freeze_bound"]["grace_seconds"], 0.5);
    assert_eq!(r["freeze_bound"]["bound_seconds"], 1.0);
    // The bound, not --max-freeze alone, must stay under half the hung-task timeout.
    let hung: u64 = std::fs::read_to_string("/proc/sys/kernel/hung_task_timeout_secs")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    if hung >= 4 {
        let just_over = format!("{}ms", hung * 500 - 500);
        let out = output(env.reseq().args(["rewrite", "--dry-run", "-v", "--max-freeze", &just_over]).arg(&lo.path));
        assert_eq!(out.status.code(), Some(3), "max-freeze + grace over half the hung-task timeout is refused");
        assert!(stderr(&out).contains("grace"), "{}", stderr(&out));
    }
}

/// `kill -STOP` of reseq at 10 random moments, held well past the bound: every freeze
/// ends within it; a run that was stopped mid-window exits non-zero (7, or 137 when the
/// guardian had to kill it), `--resume` finishes, the writer's log is whole and e2fsck
/// is clean.
#[test]
fn sigstop_at_random_moments_never_holds_a_freeze() {
    if !require(&["mkfs.ext4", "e2fsck"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = filesystem(&env, "d");
    let writer = FsyncWriter::start(&m.dir, &m.dir.join("log"), &env.path("ack"), &env.path("stop"));
    let mut rng = XorShift::new(42);
    let (mut killed, mut overran) = (0, 0);
    for i in 0..10 {
        let probe = StallProbe::start(&m.dir);
        let child = spawn_captured(&mut slow_rewrite(&env, &lo.path, &["--restart", "--max-overruns", "1"]));
        std::thread::sleep(Duration::from_millis(300 + rng.next_u64() % 1500));
        let pid = Pid::from_raw(child.id() as i32);
        let _ = kill(pid, Signal::SIGSTOP);
        std::thread::sleep(Duration::from_millis(2500));
        let stalled = probe.worst();
        let _ = kill(pid, Signal::SIGCONT);
        let out = wait_captured(child);
        let worst = probe.finish().max(stalled);
        eprintln!("try {i}: writes stalled at most {} ms", worst.as_millis());
        assert!(worst <= BOUND + PROBE_SLACK, "try {i}: writes stalled {worst:?} (bound {BOUND:?})");
        let err = stderr(&out);
        let was_killed = out.status.code().is_none();
        match out.status.code() {
            None => {
                // Killed by the guardian: it says so, with the time frozen.
                killed += 1;
                let ms = guardian_kill_ms(&err).unwrap_or_else(|| panic!("try {i}: no guardian message:\n{err}"));
                assert!(ms <= BOUND.as_millis() as u64, "try {i}: frozen {ms} ms");
                let jp = env.state_dir().join(format!("device-{}.journal", lo.name()));
                let replay = reseq::testing::journal::read(&jp).unwrap().unwrap();
                assert!(!replay.guardian_kills.is_empty(), "try {i}: the kill is not in the journal");
            }
            Some(7) => overran += 1,
            Some(0) => {} // stopped between windows: nothing was frozen, nothing to say
            other => panic!("try {i}: exit {other:?}\n{err}"),
        }
        if out.status.code() != Some(0) {
            let out = resume_to_the_end(&env, &lo.path);
            assert_eq!(out.status.code(), Some(0), "try {i}: --resume: {}", stderr(&out));
            if was_killed {
                assert!(json_report(&out)["warnings"].to_string().contains("killed by its guardian"));
            }
        }
    }
    eprintln!("{killed} runs killed by the guardian, {overran} stopped with exit 7");
    assert!(killed + overran >= 5, "most stops should land in a window ({killed} + {overran} of 10)");
    assert!(writer.finish() > 0);
    drop(m);
    fsck_clean(&lo.path, "ext4");
}

/// reseq held up right after a window's freeze (here by a delay, in the field by SIGSTOP
/// or a busy host) past the deadline: the guardian thaws on its own, the filesystem
/// writes (an fsync'd append), and the written-sectors counters grow by that when reseq
/// looks again. That growth is the filesystem's own once thawed, not a hidden writer's:
/// the window ends as an overrun, never exit 9.
#[test]
fn a_window_the_guardian_thawed_is_not_taken_for_a_hidden_writer() {
    if !require(&["mkfs.ext4", "e2fsck"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = filesystem(&env, "d");
    let writer = FsyncWriter::start(&m.dir, &m.dir.join("log"), &env.path("ack"), &env.path("stop"));
    let out = output(
        env.reseq()
            .env("RESEQ_FAULTS", "delay@window-start#2=1500")
            // Paced: a quiet host rewrote it all in one window, leaving no second to delay.
            // --max-overruns 3: on a busy host window 1 may overrun too (seen in a suite
            // run), and the run must reach window 2.
            .args(["rewrite", "--max-freeze", MAX_FREEZE, "--chunk-size", "1M", "--max-overruns", "3", "--json"])
            .args(["--rate", "100M"])
            .arg(&lo.path),
    );
    let err = stderr(&out);
    assert!(!err.contains("another writer"), "{err}");
    assert!(matches!(out.status.code(), Some(0 | 7)), "exit {:?}: {err}", out.status.code());
    assert!(err.contains("after the guardian had thawed window 2"), "{err}");
    assert!(writer.finish() > 0);
    drop(m);
    fsck_clean(&lo.path, "ext4");
}

/// Ctrl-Z typed into an interactive shell (a real pty, job control on) at 10 random
/// moments, `fg` after each: the window in progress ends on time, reseq stops after the
/// thaw, the guardian does not stop at all, and the run finishes.
#[test]
fn ctrl_z_in_a_shell_waits_for_the_window_to_end() {
    if !require(&["mkfs.ext4", "script", "bash"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = filesystem(&env, "d");
    let writer = FsyncWriter::start(&m.dir, &m.dir.join("log"), &env.path("ack"), &env.path("stop"));
    let probe = StallProbe::start(&m.dir);
    let (err_file, out_file) = (env.path("stderr"), env.path("stdout"));
    let mut shell = Command::new("script")
        .args(["-qfec", "bash --norc --noprofile -i", "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // On failure: kill the run (it may be stopped) and the shell, so nothing holds the
    // loop device.
    let (shell_pid, dev) = (shell.id() as i32, lo.path.clone());
    let _cleanup = Defer(move || {
        if let Some(pid) = reseq_running_on(&dev) {
            sigkill(pid as i32);
        }
        sigkill(shell_pid);
    });
    let mut stdin = shell.stdin.take().unwrap();
    let mut stdout = shell.stdout.take().unwrap();
    let transcript = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    // In a subshell, so that the exit code is the run's, not the 147 of a stopped job.
    // Overruns are the guardian's to bound (the probe judges that), not what this tests:
    // its 235 windows of 500 ms met 3 under bench/load.sh, and the default stops at 3.
    let code_file = env.path("code");
    let line = format!(
        "( RESEQ_FAULTS='delay@after-write#*=30' RESEQ_STATE_DIR='{}' RESEQ_RUN_DIR='{}' RUST_LOG=info '{}' rewrite --max-freeze {MAX_FREEZE} --max-overruns 1000 --chunk-size 1M --json '{}' >'{}' 2>'{}'; echo $? >'{}' )\n",
        env.state_dir().display(),
        env.run_dir().display(),
        env!("CARGO_BIN_EXE_reseq"),
        lo.path.display(),
        out_file.display(),
        err_file.display(),
        code_file.display()
    );
    use std::io::Write;
    stdin.write_all(line.as_bytes()).unwrap();
    let mut rng = XorShift::new(7);
    let mut guardian_states = Vec::new();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(200 + rng.next_u64() % 500));
        stdin.write_all(b"\x1a").unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        // This run's guardian (in its own session) must not have stopped.
        if let Some(g) = reseq_running_on(&lo.path).and_then(guardian_of)
            && let Ok(s) = std::fs::read_to_string(format!("/proc/{g}/stat"))
            && let Some(state) = s[s.rfind(')').unwrap() + 2..].chars().next()
        {
            guardian_states.push(state);
        }
        stdin.write_all(b"fg\n").unwrap();
    }
    let start = Instant::now();
    while !code_file.exists() {
        assert!(start.elapsed() < Duration::from_secs(300), "the run did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    stdin.write_all(b"exit\n").unwrap();
    while shell.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(300), "the shell did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Reaped: its PID may be reused from here on, so the cleanup must not run.
    std::mem::forget(_cleanup);
    drop(stdin);
    let text = transcript.join().unwrap();
    let worst = probe.finish();
    eprintln!("transcript:\n{text}\nreseq stderr:\n{}", std::fs::read_to_string(&err_file).unwrap_or_default());
    assert_eq!(std::fs::read_to_string(&code_file).unwrap().trim(), "0", "the run's exit code");
    let stops = text.matches("Stopped").count();
    assert!(stops >= 8, "only {stops} of 10 Ctrl-Z stopped reseq");
    assert!(guardian_states.iter().all(|s| *s != 'T' && *s != 't'), "the guardian was stopped: {guardian_states:?}");
    // Deferred to the end of the window: the freeze never outlasts --max-freeze by much.
    assert!(worst <= BOUND + PROBE_SLACK, "writes stalled {worst:?}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    assert_eq!(report["verification"], "passed");
    assert!(writer.finish() > 0);
}

/// `kill -9` of reseq and its guardian while frozen: `reseq thaw` thaws exactly that
/// filesystem, not one frozen by `fsfreeze -f`; a second call has nothing to do.
#[test]
fn reseq_thaw_after_both_are_killed() {
    if !require(&["mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = filesystem(&env, "d");
    let (_lo2, other) = env.mounted("other", 64 << 20, "ext4");
    let child = spawn_captured(&mut slow_rewrite(&env, &lo.path, &[]));
    assert!(wait_frozen_record(&env.run_dir(), Duration::from_secs(20)), "never froze");
    let guardian = guardian_of(child.id()).expect("the guardian");
    // Both stopped first: neither can see the other die and thaw (reseq thaws itself
    // when its guardian is lost), then both killed.
    let reseq = Pid::from_raw(child.id() as i32);
    let _ = kill(reseq, Signal::SIGSTOP);
    let _ = kill(Pid::from_raw(guardian), Signal::SIGSTOP);
    let _ = kill(Pid::from_raw(guardian), Signal::SIGKILL);
    let _ = kill(reseq, Signal::SIGKILL);
    let _ = wait_captured(child);
    std::thread::sleep(Duration::from_millis(300));
    assert!(is_frozen(&m.dir), "both killed mid-window: the freeze must still be there for this test");
    run_cmd(Command::new("fsfreeze").arg("-f").arg(&other.dir)).unwrap();
    let out = output(env.reseq().arg("thaw"));
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&m.dir.display().to_string()) && text.contains("thawed"), "{text}");
    assert!(!text.contains(&other.dir.display().to_string()), "{text}");
    assert!(!is_frozen(&m.dir), "reseq thaw did not thaw reseq's freeze");
    assert!(is_frozen(&other.dir), "reseq thaw thawed a freeze it did not make");
    run_cmd(Command::new("fsfreeze").arg("-u").arg(&other.dir)).unwrap();
    let out = output(env.reseq().args(["thaw", "--json"]));
    assert_eq!(out.status.code(), Some(0));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["filesystems"].as_array().map(Vec::len), Some(0), "nothing left to thaw");
    let out = output(env.reseq().arg("thaw"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to thaw"));
}

/// A stopped guardian holds its freeze: `reseq thaw` refuses, naming its PID and how to
/// let it go on; once continued, it ends the freeze within its bound.
#[test]
fn reseq_thaw_refuses_while_the_guardian_lives() {
    if !require(&["mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = filesystem(&env, "d");
    let child = spawn_captured(&mut slow_rewrite(&env, &lo.path, &[]));
    assert!(wait_frozen_record(&env.run_dir(), Duration::from_secs(20)), "never froze");
    let guardian = Pid::from_raw(guardian_of(child.id()).expect("the guardian"));
    let reseq = Pid::from_raw(child.id() as i32);
    // On failure both stay stopped: kill them, so nothing holds the loop device.
    let _cleanup = Defer(move || {
        sigkill(guardian.as_raw());
        sigkill(reseq.as_raw());
    });
    let _ = kill(guardian, Signal::SIGSTOP);
    let _ = kill(reseq, Signal::SIGSTOP);
    // A stop takes effect when the process is next scheduled: on a busy machine it shows
    // as running for a moment.
    let start = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{guardian}/stat")).is_ok_and(|s| s.contains(") T ")) {
        assert!(start.elapsed() < Duration::from_secs(10), "the guardian did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = output(env.reseq().arg("thaw"));
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(err.contains(&guardian.to_string()) && err.contains("kill -CONT"), "{err}");
    assert!(is_frozen(&m.dir), "reseq thaw must not thaw a live guardian's freeze");
    // Held past the bound: the guardian cannot keep it (it is stopped), so the run must
    // not pass this off as a success.
    std::thread::sleep(Duration::from_millis(1500));
    let _ = kill(guardian, Signal::SIGCONT);
    assert_thawed_within(&m.dir, Duration::from_secs(2));
    let _ = kill(reseq, Signal::SIGCONT);
    let out = wait_captured(child);
    // Reaped: their PIDs may be reused from here on, so the cleanup must not run.
    std::mem::forget(_cleanup);
    assert_ne!(out.status.code(), Some(0), "a run whose window overran its bound does not exit 0");
}

/// Another program thaws reseq's freeze and freezes again at once (as a snapshot agent
/// does), 10 times on ext4: each run stops with exit 8, never thaws the other program's
/// freeze, and every fsync'd write of a live writer survives.
#[test]
fn a_foreign_thaw_and_refreeze_stops_the_run() {
    if !require(&["mkfs.ext4", "e2fsck"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = filesystem(&env, "d");
    let writer = FsyncWriter::start(&m.dir, &m.dir.join("log"), &env.path("ack"), &env.path("stop"));
    let fs = std::fs::File::open(&m.dir).unwrap();
    let mut refrozen = 0;
    for i in 0..10 {
        let child = spawn_captured(&mut slow_rewrite(&env, &lo.path, &["--restart"]));
        // Catch a window: FITHAW succeeds only on a frozen filesystem. Then freeze again
        // at once, as a snapshot agent does. (If the guardian's own check comes between
        // the two, it holds the freeze, ours fails with EBUSY, and it must still stop.)
        let ours_still = foreign_thaw_and_refreeze(&env, &fs, i);
        let out = wait_captured(child);
        assert_ne!(ours_still, Some(false), "try {i}: reseq thawed the other program's freeze");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(8), "try {i}: {err}");
        // Either reseq saw the re-freeze, or (on a loaded machine) its own check came
        // between our thaw and our freeze and it gave up its fresh freeze before ours: both
        // are right, as long as it never thawed ours (checked above).
        if err.contains("froze it again") {
            assert!(err.contains("did not thaw"), "try {i}: {err}");
            refrozen += 1;
        } else {
            assert!(err.contains("thawed only its own"), "try {i}: {err}");
        }
        assert_thawed_within(&m.dir, Duration::from_secs(2));
    }
    // Which of the two a try sees is a race with the guardian's own check; CI once saw 4
    // of 10. The sentinel must see some.
    assert!(refrozen >= 2, "the sentinel saw only {refrozen} of 10 re-freezes");
    // A plain thaw (no re-freeze) is caught too; reseq thaws only its own new freeze.
    let child = spawn_captured(&mut slow_rewrite(&env, &lo.path, &["--restart"]));
    assert!(wait_frozen_record(&env.run_dir(), Duration::from_secs(20)));
    let _ = reseq::testing::fithaw(fs.as_fd());
    let out = wait_captured(child);
    assert_eq!(out.status.code(), Some(8), "{}", stderr(&out));
    assert_thawed_within(&m.dir, Duration::from_secs(2));
    let out = output(env.reseq().args(["rewrite", "--resume"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0));
    assert!(writer.finish() > 0);
    drop(fs);
    drop(m);
    fsck_clean(&lo.path, "ext4");
}

/// Acts as a snapshot agent would: catches one of reseq's windows (FITHAW succeeds only
/// on a frozen filesystem), freezes again at once, holds it 300 ms, and thaws it.
/// Returns None if the guardian's own check came between (it then holds the freeze, ours
/// fails with EBUSY), else whether our freeze was still there to thaw (reseq must never
/// thaw it).
fn foreign_thaw_and_refreeze(env: &TestEnv, fs: &std::fs::File, i: usize) -> Option<bool> {
    let start = Instant::now();
    let mut caught = None;
    while caught.is_none() && start.elapsed() < Duration::from_secs(20) {
        if !wait_frozen_record(&env.run_dir(), Duration::from_secs(20)) {
            break;
        }
        if reseq::testing::fithaw(fs.as_fd()).is_ok() {
            caught = Some(reseq::testing::fifreeze(fs.as_fd()).is_ok());
        }
    }
    let refroze = caught.unwrap_or_else(|| panic!("try {i}: never caught a window"));
    refroze.then(|| {
        std::thread::sleep(Duration::from_millis(300));
        reseq::testing::fithaw(fs.as_fd()).is_ok()
    })
}

/// `windows_overrun` counts every window frozen longer than --max-freeze, by any amount.
#[test]
fn windows_overrun_counts_every_window_longer_than_max_freeze() {
    if !require(&["mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, _m) = filesystem(&env, "d");
    // Delays before the thaw that put the window's end around its 200 ms deadline.
    for delay in [30, 45, 55, 65, 230] {
        let out = output(
            env.reseq()
                .env("RESEQ_FAULTS", format!("delay@window-end#1={delay}"))
                .args(["rewrite", "--restart", "--json", "--max-freeze", "200ms", "--max-overruns", "1000"])
                .arg(&lo.path),
        );
        let r = json_report(&out);
        let longest = r["results"]["longest_freeze_seconds"].as_f64().unwrap();
        let overruns = r["results"]["windows_overrun"].as_u64().unwrap();
        eprintln!("delay {delay} ms: longest freeze {longest:.3} s, {overruns} overrun(s)");
        if longest > 0.2 {
            assert!(overruns >= 1, "a window of {longest:.3} s against 200 ms counted no overrun");
        }
    }
}

/// The same on xfs, whose freeze rewrites its superblock (sector 0) as it quiesces the
/// log: the sentinel sees a thaw and re-freeze there too.
#[test]
fn a_foreign_thaw_and_refreeze_is_seen_on_xfs() {
    if !require(&["mkfs.xfs"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = env.mounted("x", 320 << 20, "xfs");
    fill_files(&m.dir, 4, 50 << 20, 11);
    let fs = std::fs::File::open(&m.dir).unwrap();
    let mut refrozen = 0;
    for i in 0..3 {
        let child = spawn_captured(&mut slow_rewrite(&env, &lo.path, &["--restart"]));
        let ours_still = foreign_thaw_and_refreeze(&env, &fs, i);
        let refroze = ours_still.is_some();
        assert_ne!(ours_still, Some(false), "try {i}: reseq thawed the other program's freeze");
        let out = wait_captured(child);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(8), "try {i}: {err}");
        if refroze && err.contains("froze it again") {
            refrozen += 1;
        } else {
            assert!(err.contains("thawed only its own"), "try {i}: {err}");
        }
        assert_thawed_within(&m.dir, Duration::from_secs(2));
    }
    assert!(refrozen >= 2, "the sentinel saw only {refrozen} of 3 re-freezes on xfs");
}
