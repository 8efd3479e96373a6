//! Killing reseq, interrupting it, and overrunning a window: the filesystem is always
//! thawed, the data always intact, and the run resumes where it stopped.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;

const MIB: u64 = 1 << 20;

/// Common arguments: 1 MiB chunks and short windows, so a 64 MiB device takes many
/// windows, and a 15 ms delay per chunk, so kills land where they are aimed.
fn slow_rewrite(env: &TestEnv, lo: &LoopDevice, faults: &str) -> Command {
    paced_rewrite(env, lo, "200ms", 15, faults)
}

/// The whole device in 1 MiB chunks, windows of `window`, each write held `delay_ms`.
fn paced_rewrite(env: &TestEnv, lo: &LoopDevice, window: &str, delay_ms: u32, faults: &str) -> Command {
    let mut c = env.reseq();
    // --include-free: these tests count chunks of the whole device.
    // --max-overruns 1000: windows this short overrun on a loaded host, and resumed runs
    // keep the options (an overrun is not what these tests test).
    c.args(["rewrite", "--json", "--include-free", "--chunk-size", "1M", "--max-freeze", window, "--pause", "20ms"])
        .args(["--max-overruns", "1000"])
        .arg(&lo.path)
        .env("RESEQ_FAULTS", format!("delay@after-write#*={delay_ms},{faults}").trim_end_matches(','));
    c
}

/// A mounted 64 MiB ext4 holding two files, and the command that rewrites the whole
/// device in 1 MiB chunks with `extra` arguments and test hooks `faults`.
fn mounted_rewrite(
    env: &TestEnv,
    name: &str,
    seed: u64,
    extra: &[&str],
    faults: &str,
) -> (LoopDevice, Mount, Vec<(std::path::PathBuf, blake3::Hash)>, Command) {
    let (lo, mnt) = env.mounted_dense(name, 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 4 << 20, seed);
    let mut cmd = env.reseq();
    cmd.args(["rewrite", "--json", "--include-free", "--chunk-size", "1M"])
        .args(extra)
        .arg(&lo.path)
        .env("RESEQ_FAULTS", faults);
    (lo, mnt, files, cmd)
}

#[test]
fn kill_9_at_many_points_then_resume() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted_dense("kill", 128 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 3, 4 << 20, 3);
    let total_chunks = 128;

    // Where to die: between every step of a chunk, at window edges, and inside windows.
    let points = [
        "kill@window-start#1",
        "kill@before-write#2",
        "kill@after-permit#3",
        "kill@after-write#2",
        "kill@after-verify#4",
        "kill@after-journal#3",
        "kill@window-end#1",
        "kill@after-thaw#1",
        "kill@window-start#2",
        "kill@after-permit#6",
        "kill@after-write#5",
    ];
    let mut done = 0;
    let mut resume = false;
    for (i, point) in points.iter().enumerate() {
        let mut cmd = slow_rewrite(&env, &lo, point);
        if resume {
            cmd.arg("--resume");
        }
        let out = output(&mut cmd);
        assert_eq!(out.status.code(), None, "run {i} ({point}) should have died by SIGKILL: {}", stderr(&out));
        // A kill between the journal's `begin` and `done` leaves a chunk in flight, which
        // the next run re-reads and checks against the hash it was read with.
        if i > 0 && ["after-permit", "after-write", "after-verify"].iter().any(|p| points[i - 1].contains(p)) {
            assert!(
                stderr(&out).contains("in flight when the last run stopped, is intact"),
                "no re-verification after {}",
                points[i - 1]
            );
        }
        assert_thawed_within(&mnt.dir, Duration::from_secs(2));
        assert_files_intact(&files);
        let now = journal_done(&env.state_dir(), &lo);
        assert!(now >= done, "the journal went backwards at {point}: {done} -> {now}");
        assert!(now < total_chunks, "run {i} finished before its kill point");
        done = now;
        resume = true;
    }
    assert!(done > 10, "the killed runs made too little progress ({done} chunks)");

    // Two more, killed from outside at arbitrary moments.
    for delay_ms in [150, 320] {
        let mut child = slow_rewrite(&env, &lo, "").arg("--resume").spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_thawed_within(&mnt.dir, Duration::from_secs(2));
        assert_files_intact(&files);
        let now = journal_done(&env.state_dir(), &lo);
        assert!(now >= done && now < total_chunks, "journal: {done} -> {now} of {total_chunks}");
        done = now;
    }

    // The last resume finishes, and writes only what was left. (Chunk sizes can adapt
    // between windows, so count bytes, not chunks.)
    let remaining = total_chunks * MIB - journal_done_bytes(&env.state_dir(), &lo);
    let before = bytes_written_to(&lo.path);
    let r = json_ok(
        env.reseq().args(["rewrite", "--json", "--include-free", "--chunk-size", "1M", "--resume"]).arg(&lo.path),
    );
    assert_eq!(r["results"]["chunks_already_done"], done);
    assert_eq!(r["results"]["bytes_written"], remaining, "resume rewrote finished chunks");
    assert_eq!(r["plan"]["resume_from_chunk"], done);
    // The device's own counter, independent of reseq's accounting. It also counts the
    // mounted filesystem's writes (its journal at each freeze: 2.7 MiB seen under a
    // parallel load), so it is held against what a resume from the start would add.
    let host_written = bytes_written_to(&lo.path) - before;
    let done_bytes = total_chunks * MIB - remaining;
    assert!(
        host_written >= remaining && host_written < remaining + done_bytes,
        "the device saw {host_written} bytes written for {remaining} remaining ({done_bytes} done before)"
    );
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn sigint_stops_thaws_and_resumes() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted_dense("int", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 4 << 20, 9);
    let child = spawn_captured(&mut slow_rewrite(&env, &lo, ""));
    // Mid-run: once the journal has a chunk done (a fixed sleep can land before the
    // first window on a loaded host).
    let start = Instant::now();
    while journal_done_or_zero(&env.state_dir(), &lo) == 0 && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let start = Instant::now();
    let out = wait_captured(child);
    assert!(start.elapsed() < Duration::from_secs(2), "SIGINT took {:?} to stop the run", start.elapsed());
    assert_eq!(out.status.code(), Some(6), "interrupted exit code");
    let r = json_report(&out);
    assert_eq!(r["outcome"]["status"], "interrupted");
    assert!(stderr(&out).contains("--resume"), "the message should say how to resume");
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
    let done = journal_done(&env.state_dir(), &lo);
    let done_bytes = journal_done_bytes(&env.state_dir(), &lo);
    assert!(done > 0 && done_bytes < 64 * MIB, "journal says {done} chunks done");
    assert_eq!(r["results"]["next_offset_bytes"], done_bytes, "the report and the journal disagree");
    // The message names the bytes done of those to do, and status gives the bytes done of
    // the range (chunks adapt their size: a count of them overran its total).
    assert!(stderr(&out).contains("done, every chunk written verified"), "{}", stderr(&out));
    let progress = unfinished_runs(&env)[0]["progress"].as_str().unwrap().to_string();
    let pct: f64 = progress.rsplit('(').next().unwrap().trim_end_matches(" %)").parse().unwrap();
    assert!(progress.contains(" of 64.0 MiB done (") && pct > 0.0 && pct < 100.0, "{progress}");

    // Without --resume, reseq refuses to start over silently.
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("--resume"));

    let r = json_ok(env.reseq().args(["rewrite", "--json", "--include-free", "--resume"]).arg(&lo.path));
    assert_eq!(r["results"]["bytes_written"], 64 * MIB - done_bytes);
    assert_files_intact(&files);
}

/// Chunks done per the journal; 0 while there is none yet.
fn journal_done_or_zero(state_dir: &std::path::Path, dev: &LoopDevice) -> u64 {
    let p = state_dir.join(format!("device-{}.journal", dev.name()));
    reseq::testing::journal::read(&p).ok().flatten().map(|r| r.done).unwrap_or(0)
}

/// A signal before anything is written (planning, the before-benchmark) stops the run
/// with its report and exit 6, not without a word; nothing is written and no journal
/// asks for --resume.
#[test]
fn sigint_before_the_first_write_exits_6_with_a_report() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted_dense("early", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 4 << 20, 5);
    let before = bytes_written_to(&lo.path);
    let child = spawn_captured(slow_rewrite(&env, &lo, "delay@planned#1=4000").arg("--bench"));
    std::thread::sleep(Duration::from_millis(600));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let out = wait_captured(child);
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("interrupted before anything was written"), "{}", stderr(&out));
    let r = json_report(&out);
    assert_eq!(r["outcome"]["status"], "interrupted");
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
    assert!(bytes_written_to(&lo.path) - before < MIB, "nothing but the filesystem's own writes may reach the device");
    assert!(!env.state_dir().join(format!("device-{}.journal", lo.name())).exists(), "no journal to resume");
}

/// Ctrl-C during the before-benchmark does not wait the benchmark out: exit 6 at once,
/// "interrupted before anything was written", and the report (a `--json > file` is not
/// left empty).
#[test]
fn sigint_during_the_before_benchmark_stops_it() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let lo = env.random_loop_device("benchint", 64 * MIB, 8);
    let before = bytes_written_to(&lo.path);
    // Every benchmark read 200 ms slower: a pass takes 13 s.
    let mut cmd = env.reseq();
    cmd.args(["rewrite", "--json", "--bench", "--chunk-size", "1M"]).arg(&lo.path);
    let child = spawn_captured(cmd.env("RESEQ_FAULTS", format!("slow@0-{}=200", 64 * MIB)));
    std::thread::sleep(Duration::from_millis(1500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let sent = Instant::now();
    let out = wait_captured(child);
    assert!(sent.elapsed() < Duration::from_secs(3), "the benchmark went on for {:?}", sent.elapsed());
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    assert!(stderr(&out).contains("interrupted before anything was written"), "{}", stderr(&out));
    assert_eq!(json_report(&out)["outcome"]["status"], "interrupted");
    assert_eq!(bytes_written_to(&lo.path), before, "nothing written");
}

/// Ctrl-C during the benchmark after a finished rewrite: the rewrite stands (exit 0,
/// verified, nothing to resume), the verdict says the benchmark was cut short.
#[test]
fn sigint_during_the_after_benchmark_keeps_the_finished_rewrite() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let lo = env.random_loop_device("afterint", 16 * MIB, 9);
    let mut cmd = env.reseq();
    cmd.args(["rewrite", "--json", "--bench", "--chunk-size", "1M"]).arg(&lo.path);
    // Every benchmark read 100 ms slower: each benchmark takes about 9 s.
    let child = spawn_captured(cmd.env("RESEQ_FAULTS", format!("slow@0-{}=100", 16 * MIB)));
    let journal = env.state_dir().join(format!("device-{}.journal", lo.name()));
    let start = Instant::now();
    while !reseq::testing::journal::read(&journal).ok().flatten().is_some_and(|r| r.finished) {
        assert!(start.elapsed() < Duration::from_secs(60), "the rewrite did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let sent = Instant::now();
    let out = wait_captured(child);
    assert!(sent.elapsed() < Duration::from_secs(3), "the benchmark went on for {:?}", sent.elapsed());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json_report(&out);
    assert_eq!(r["verification"], "passed");
    assert_eq!(r["results"]["bytes_written"], 16 * MIB);
    assert_eq!(r["verdict"]["verdict"], "unreliable", "{}", r["verdict"]);
    assert!(r["verdict"]["rule"].as_str().unwrap().contains("stopped by SIGINT"), "{}", r["verdict"]);
}

/// A window that outlives its deadline: the guardian thaws on its own, reseq reports the
/// overrun, and the chunk whose write would have come after the thaw is not written.
#[test]
fn window_overrun_before_a_write_is_thawed_and_not_written() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    // The third chunk stalls for 1.5 s before asking to write; the deadline is 500 ms.
    let stalled = env.dir.path().join("stall.began");
    let (lo, mnt, files, mut cmd) = mounted_rewrite(
        &env,
        "over",
        13,
        &["--max-freeze", "500ms", "--max-overruns", "1"],
        &format!("mark@before-write#3={},delay@before-write#3=1500", stalled.display()),
    );
    let before = bytes_written_to(&lo.path);
    let mut child = spawn_captured(&mut cmd);
    // While reseq is still stalled, the guardian must already have thawed. (Timed from
    // the stall, inside its window: start-up can take long on a loaded host, and a first
    // window may end after one chunk.)
    assert!(wait_for_mark(&stalled, Duration::from_secs(30)), "the stall did not begin within 30 s");
    std::thread::sleep(Duration::from_millis(900));
    assert!(child.try_wait().unwrap().is_none(), "reseq ended before the stall was over");
    assert!(!is_frozen(&mnt.dir), "the guardian did not thaw at the deadline");
    let out = wait_captured(child);
    assert_eq!(out.status.code(), Some(7));
    let r = json_report(&out);
    assert_eq!(r["results"]["windows_overrun"], 1);
    // Only the two chunks before the stall: 1 MiB each, or less where a loaded host made
    // the engine halve its chunks to fit the window (seen under bench/load.sh: 1.5 MiB).
    assert_eq!(r["results"]["chunks_written"], 2, "only the two chunks before the stall");
    let wrote = r["results"]["bytes_written"].as_u64().unwrap();
    assert!(wrote > 0 && wrote <= 2 * MIB, "the two chunks before the stall were {wrote} bytes");
    assert!(stderr(&out).contains("reseq guardian: freeze window overran"));
    assert!(stderr(&out).contains("overran the 500 ms deadline"));
    let host = bytes_written_to(&lo.path) - before;
    assert!(host <= wrote + 256 * 1024, "the device saw {host} bytes written; reseq wrote {wrote}");
    assert_files_intact(&files);
    assert_eq!(journal_done(&env.state_dir(), &lo), 2);
}

/// A write that is itself slow: the guardian does not thaw under it (that could let a
/// stale write land after the filesystem's own) while it is within the first half of the
/// grace (500 ms past a 1 s deadline; the other half is for a kill), and thaws as soon as
/// it completes. Timed by the write itself, not by the test's clock: reseq marks the end
/// of the slow write (a file), and the first look that finds the filesystem thawed must
/// find the mark already there (the mark comes before reseq tells the guardian, so a busy
/// host delays both the same way).
#[test]
fn window_overrun_during_a_write_waits_for_it_then_thaws() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (started, written) = (env.dir.path().join("slow-write.began"), env.dir.path().join("slow-write.done"));
    // The marks in this order: the slow write granted (frozen: the permit was), then done.
    let faults = format!(
        "mark@after-permit#2={},delay@after-permit#2=1100,mark@after-write#2={}",
        started.display(),
        written.display()
    );
    let (_lo, mnt, files, mut cmd) =
        mounted_rewrite(&env, "overw", 17, &["--max-freeze", "1s", "--max-overruns", "1"], &faults);
    let child = spawn_captured(&mut cmd);
    // From the grant of the slow write, not from the first freeze: on a busy host the
    // first window once ended after one chunk, and its thaw was taken for this one's.
    assert!(wait_for_mark(&started, Duration::from_secs(30)), "the slow write was not granted within 30 s");
    // Every 10 ms (each look is an fsfreeze process; this test shares the machine).
    let looked = Instant::now();
    let mut thawed = false;
    while !thawed && looked.elapsed() < Duration::from_secs(30) {
        thawed = !is_frozen(&mnt.dir);
        std::thread::sleep(Duration::from_millis(if thawed { 0 } else { 10 }));
    }
    // Frozen first, the mark second: a mark that appears after a thawed look is a thaw
    // under the write.
    let marked = written.exists();
    assert!(thawed, "still frozen 30 s after the window began");
    let out = wait_captured(child);
    // A write held past the half grace is the guardian's to end (a kill, no exit code):
    // that is another test's case, and says so before the mark's assertion could.
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert!(marked, "thawed under a granted write (before it completed)");
    let r = json_report(&out);
    assert_eq!(r["results"]["windows_overrun"], 1);
    assert_eq!(r["results"]["bytes_written"], 2 * MIB, "the slow write completed inside the freeze");
    assert_eq!(r["verification"], "incomplete");
    let longest = r["results"]["longest_freeze_seconds"].as_f64().unwrap();
    assert!((1.1..1.5).contains(&longest), "frozen {longest} s");
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
}

/// A write stalled past the grace: the guardian kills reseq (it cannot know whether
/// reseq will ever report), waits for its exit, thaws within the bound, and says so;
/// the journal remembers, and --resume finishes and reports it.
#[test]
fn a_write_stalled_past_the_grace_gets_reseq_killed_and_the_freeze_ended() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt, files, mut cmd) =
        mounted_rewrite(&env, "stall", 19, &["--max-freeze", "500ms"], "delay@after-permit#2=5000");
    let started = Instant::now();
    let child = spawn_captured(&mut cmd);
    let out = wait_captured(child);
    assert!(started.elapsed() < Duration::from_secs(4), "the guardian did not end the stall");
    assert_eq!(out.status.code(), None, "killed by its guardian");
    let err = stderr(&out);
    assert!(err.contains("the guardian killed it and thawed"), "{err}");
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
    let mut resume = env.reseq();
    resume.args(["rewrite", "--resume", "--json"]).arg(&lo.path);
    let out = output(&mut resume);
    assert_eq!(out.status.code(), Some(0));
    assert!(json_report(&out)["warnings"].to_string().contains("killed by its guardian"));
    assert_files_intact(&files);
}

/// By default an overrun is not the end: the guardian thaws, reseq warns, shortens its
/// windows and goes on; the run completes, reporting the overrun.
#[test]
fn an_overrun_shortens_later_windows_and_the_run_completes() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    // Windows of 1 s: halved they still hold a chunk on a busy host (with 500 ms ones, a
    // 250 ms window overran too, twice more than injected would have been the default's
    // stop).
    let (_lo, mnt, files, mut cmd) =
        mounted_rewrite(&env, "overc", 23, &["--max-freeze", "1s"], "delay@before-write#3=1500");
    let out = output(&mut cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let r = json_report(&out);
    // The injected one at least; each one counted is warned of (a busy host may add one).
    let overruns = r["results"]["windows_overrun"].as_u64().unwrap();
    assert!(overruns >= 1, "the stall overran no window: {}", r["results"]);
    assert_eq!(err.matches("Continuing with windows").count() as u64, overruns, "{err}");
    assert_eq!(r["results"]["bytes_written"], 64 * MIB);
    assert_eq!(r["verification"], "passed");
    // The budget, the whole deadline, halved.
    assert!(err.contains("Continuing with windows that stop new chunks at 500 ms"), "{err}");
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
}

/// Someone thaws reseq's freeze mid-window (`fsfreeze -u`): before the next write the
/// guardian finds its freeze gone, nothing more is written, and the run stops.
#[test]
fn a_freeze_released_by_someone_else_stops_the_run() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let first = env.dir.path().join("first.write");
    let faults = format!("delay@after-write#*=40,mark@after-write#1={}", first.display());
    let (lo, mnt, files, mut cmd) = mounted_rewrite(&env, "stolen", 29, &["--max-freeze", "3s"], &faults);
    let child = spawn_captured(&mut cmd);
    // After a first write (a fixed sleep after the freeze let a loaded host thaw before
    // any: "wrote 0"), in its window, or in the next if a stall ended that one.
    assert!(wait_for_mark(&first, Duration::from_secs(30)), "no write within 30 s");
    let start = Instant::now();
    while !Command::new("fsfreeze").arg("-u").arg(&mnt.dir).status().unwrap().success() {
        assert!(start.elapsed() < Duration::from_secs(30), "fsfreeze -u failed for 30 s");
        while !is_frozen(&mnt.dir) {
            assert!(start.elapsed() < Duration::from_secs(30), "no window to release within 30 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let out = wait_captured(child);
    assert_eq!(out.status.code(), Some(8), "a lost freeze has its own exit code");
    let err = stderr(&out);
    assert!(err.contains("another program thawed it") && err.contains("thawed only its own"), "{err}");
    let r = json_report(&out);
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    assert!(written > 0 && written < 64 * MIB, "wrote {written}");
    assert!(!is_frozen(&mnt.dir), "the guardian's re-freeze must be thawed too");
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// Slow chunks (120 ms against a 400 ms window) make the chunks of the next windows
/// smaller, so windows keep within their budget. (They grow back once quick, a window at
/// a time; here the rest fits in one window, so that is not seen.)
#[test]
fn chunks_shrink_when_they_are_slow_for_the_window() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    // The first three chunks are slow (300 ms against a 750 ms budget: over a quarter);
    // later ones quick. Windows of 1 s leave 400 ms for a machine under a parallel load
    // (with 120 ms chunks in 400 ms windows, a loaded host overran one).
    let slow = "delay@after-write#1=300,delay@after-write#2=300,delay@after-write#3=300";
    let (lo, mnt, files, mut cmd) = mounted_rewrite(&env, "adapt", 31, &["--max-freeze", "1s"], slow);
    let r = json_ok(&mut cmd);
    assert_eq!(r["results"]["bytes_written"], 64 * MIB);
    assert_eq!(r["results"]["windows_overrun"], 0);
    let journal = std::fs::read_to_string(env.state_dir().join(format!("device-{}.journal", lo.name()))).unwrap();
    let lens: Vec<u64> = journal
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(_, j)| serde_json::from_str::<serde_json::Value>(j).unwrap()))
        .filter(|v| v["type"] == "done")
        .map(|v| v["len"].as_u64().unwrap())
        .collect();
    assert_eq!(lens[0], MIB, "the first window uses --chunk-size");
    assert!(lens.iter().any(|&l| l < MIB), "no chunk ever shrank: {lens:?}");
    assert_eq!(lens.iter().sum::<u64>(), 64 * MIB);
    assert_files_intact(&files);
    let _ = mnt;
}

/// The chunk in flight when a run died reads differently on an unmounted device (a torn
/// write, or another writer): `--resume` refuses rather than rewrite whatever is there
/// now as if it were the data (which would end "verification: passed" over zeros).
#[test]
fn a_changed_in_flight_chunk_on_an_unmounted_device_stops_the_resume() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let lo = env.random_loop_device("torn", 16 * MIB, 12);
    let mut cmd = env.reseq();
    cmd.env("RESEQ_FAULTS", "kill@after-write#3").args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path);
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), None, "killed at the hook");
    let jp = env.state_dir().join(format!("device-{}.journal", lo.name()));
    let (offset, len, _) =
        reseq::testing::journal::read(&jp).unwrap().unwrap().in_flight.pop().expect("a chunk in flight");
    // What a torn write leaves: zeros over part of the chunk.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&lo.path).unwrap();
        f.write_all_at(&vec![0u8; 4096], offset + len / 2).unwrap();
        f.sync_all().unwrap();
    }
    let out = output(env.reseq().args(["rewrite", "--resume"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(err.contains("changed since the last run stopped") && err.contains(&format!("{offset}..")), "{err}");
}

/// `--resume` continues a run with the options it was started with: a plain `--resume`
/// (a timer job) keeps `--include-free` and 300 ms windows; a different value given is
/// refused (pacing, `--max-freeze` among it, may change); `--restart` takes the new ones.
#[test]
fn a_resumed_run_keeps_the_options_it_was_started_with() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted_dense("opts", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 4 << 20, 91);
    let mut first = env.reseq();
    first
        .args(["rewrite", "--json", "--include-free", "--chunk-size", "1M", "--max-freeze", "300ms"])
        .arg(&lo.path)
        .env("RESEQ_FAULTS", "delay@after-write#*=15,kill@window-start#3");
    assert_eq!(output(&mut first).status.code(), None, "killed");
    assert_thawed_within(&mnt.dir, Duration::from_secs(2));
    // `reseq status` shows the run and what --resume would continue it with.
    let out = output(env.reseq().arg("status"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(text.contains("unfinished device run") && text.contains(&lo.name()), "{text}");
    assert!(text.contains("--chunk-size 1M --max-freeze 300ms --include-free"), "{text}");
    let out = output(env.reseq().args(["rewrite", "--resume", "--chunk-size", "2M"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--chunk-size 2M differs from the interrupted run's 1M"), "{}", stderr(&out));
    // --max-freeze is pacing: a longer one (what an overrun's message advises) is taken,
    // for that run only.
    let out = output(env.reseq().args(["rewrite", "--resume", "--dry-run", "-v", "--max-freeze", "2s"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("--max-freeze 2s replaces the interrupted run's 300ms"), "{}", stderr(&out));
    let out = output(env.reseq().args(["rewrite", "--json", "--resume"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("resuming with the interrupted run's options"), "{}", stderr(&out));
    let r = json_report(&out);
    assert_eq!(r["freeze_bound"]["max_freeze_seconds"], 0.3, "{}", r["freeze_bound"]);
    // --include-free kept: the whole device, up to its end.
    assert_eq!(r["results"]["next_offset_bytes"], 64 * MIB, "{}", r["results"]);
    assert_eq!(r["plan"]["chunk_size_bytes"], MIB, "{}", r["plan"]);
    // Killed again, then started over with other options.
    assert_eq!(output(&mut first).status.code(), None, "killed");
    let out = output(env.reseq().args(["rewrite", "--json", "--restart", "--max-freeze", "2s"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_report(&out)["freeze_bound"]["max_freeze_seconds"], 2.0);
    let out = output(env.reseq().args(["status", "--json"]));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["unfinished"].as_array().unwrap().len(), 0, "{st}");
    mnt.unmount().unwrap();
    let mnt = Mount::new(&lo.path, &env.path("opts-again"), &[]).unwrap();
    let files: Vec<_> = files.iter().map(|(p, h)| (mnt.dir.join(p.file_name().unwrap()), *h)).collect();
    assert_files_intact(&files);
}

/// `reseq status` names a run that is working now, by its PID.
#[test]
fn status_names_a_run_in_progress() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let lo = env.random_loop_device("live.img", 64 * MIB, 8);
    let mut cmd = slow_rewrite(&env, &lo, "");
    let child = spawn_captured(&mut cmd);
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = String::new();
    while Instant::now() < deadline {
        let out = output(env.reseq().args(["status", "--json"]));
        seen = String::from_utf8_lossy(&out.stdout).into_owned();
        if seen.contains(&format!("reseq PID {pid}")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT);
    let _ = wait_captured(child);
    assert!(seen.contains(&format!("/dev/{}: reseq PID {pid}", lo.name())), "{seen}");
}

/// A bug inside a freeze window (a panic on the writer's thread or on a stage's) ends
/// reseq at once with SIGABRT: the guardian thaws on its death, nothing unverified is
/// recorded as done, and `--resume` checks the chunk in flight and finishes. Unwinding
/// instead hung reseq for good after a writer's panic, and a reader's panic passed for
/// the window's end: the run "succeeded" with most of the device not rewritten. A panic
/// outside a window is exit 1, as documented.
#[test]
fn a_panic_inside_a_window_aborts_thaws_and_resumes() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze", "e2fsck"]) {
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted_dense("panic", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 3, 4 << 20, 5);
    // 1 s windows of about six 100 ms writes: a panic's subject, not a window's length,
    // and a CPU stall under load must reach 500 ms for the guardian's kill to come first.
    let paced = |faults: &str| paced_rewrite(&env, &lo, "1s", 100, faults);
    let points = [
        ("panic@before-write#2", "writer"),
        ("panic@after-read#3", "reader"),
        ("panic@after-write#4", "writer"),
        ("panic@after-verify#3", "writer"),
        ("panic@window-end#2", "writer"),
    ];
    let mut resume = false;
    for (point, stage) in points {
        let mut cmd = paced(point);
        if resume {
            cmd.arg("--resume");
        }
        let t = Instant::now();
        let out = output(&mut cmd);
        assert!(t.elapsed() < Duration::from_secs(10), "{point}: took {:?}", t.elapsed());
        assert_eq!(out.status.signal(), Some(6), "{point}: SIGABRT, not {:?}: {}", out.status, stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(&format!("the {stage} panicked during a window")), "{point}: {err}");
        assert!(err.contains("--resume"), "{err}");
        assert_thawed_within(&mnt.dir, Duration::from_secs(2));
        assert_files_intact(&files);
        assert!(journal_done(&env.state_dir(), &lo) < 64, "{point}: recorded as finished");
        resume = true;
    }
    // stderr and the working directory on the frozen filesystem (a cron job's log; cores
    // written where the process runs): neither the panic message nor a core dump may
    // wait for the thaw, which waits for reseq to be gone. The guardian prints the text.
    let log = mnt.dir.join("reseq.log");
    let mut cmd = paced("panic@after-write#3");
    cmd.arg("--resume").env("RUST_BACKTRACE", "1");
    let script = format!("ulimit -c unlimited; cd {}; exec \"$@\"", mnt.dir.display());
    let mut bash = Command::new("bash");
    bash.args(["-c", &script, "bash"]).arg(cmd.get_program()).args(cmd.get_args());
    bash.envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))));
    let t = Instant::now();
    let status =
        bash.stdout(std::process::Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).status().unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "stderr on the frozen filesystem: took {:?}", t.elapsed());
    drop((bash, cmd)); // they hold the log open, on the mount
    assert_eq!(status.signal(), Some(6), "{status:?}");
    assert_thawed_within(&mnt.dir, Duration::from_secs(2));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("the writer panicked during a window") && text.contains("reseq guardian: reseq exited"),
        "{text}"
    );
    let cores: Vec<_> = std::fs::read_dir(&mnt.dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("core"))
        .collect();
    assert!(cores.is_empty(), "a core dump on the frozen filesystem: {cores:?}");
    assert_files_intact(&files);
    // Outside a window a panic unwinds: exit 1 (internal error), not Rust's 101.
    let out = output(paced("panic@after-thaw#2").arg("--resume"));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("internal error (a bug)"));
    assert_thawed_within(&mnt.dir, Duration::from_secs(2));
    assert_files_intact(&files);
    // Chunk sizes adapt between windows: count bytes.
    let done = journal_done_bytes(&env.state_dir(), &lo);
    let r = json_ok(paced("").arg("--resume"));
    assert_eq!(r["verification"], "passed");
    assert_eq!(done + r["results"]["bytes_written"].as_u64().unwrap(), 64 * MIB, "done {done} before the last run");
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// A refused run writes nothing (issue 35), in device mode: a finished run's journal is
/// not replaced by a run refused at its first freeze; after a run stopped by SIGINT, a
/// run without `--resume`, a `--resume` with another chunk size and a `--resume` refused
/// at the first freeze leave every byte of the state directory as it was, and `status`
/// still shows the interrupted run.
#[test]
fn a_refused_device_run_writes_nothing() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt, files, mut cmd) = mounted_rewrite(&env, "refused", 41, &["--max-freeze", "500ms"], "");
    assert_eq!(output(&mut cmd).status.code(), Some(0));
    let finished = snapshot_dir(&env.state_dir());
    {
        let _frozen = ForeignFreeze::new(&mnt.dir);
        let out = output(env.reseq().args(["rewrite", "--include-free"]).arg(&lo.path));
        assert_eq!(out.status.code(), Some(3), "someone else's freeze: {}", stderr(&out));
    }
    assert!(snapshot_dir(&env.state_dir()) == finished, "a refused run replaced the finished run's journal");
    // Then a run stopped mid-way (the finished journal goes first, so that its chunks
    // done are not taken for the new run's).
    std::fs::remove_file(env.state_dir().join(format!("device-{}.journal", lo.name()))).unwrap();
    let run = Running::captured(&mut slow_rewrite(&env, &lo, ""));
    wait_journal_done(&env.state_dir());
    run.signal(nix::sys::signal::Signal::SIGINT).unwrap();
    // What follows needs an unfinished run, not SIGINT's own exit (other tests check it):
    // on a busy host a 1 MiB write can outlast the 200 ms window's grace, and the guardian
    // kills reseq first, which leaves one just the same (load run 1 of 5430b4c).
    let out = run.wait();
    let killed = out.status.code().is_none() && stderr(&out).contains("the guardian killed it and thawed");
    assert!(out.status.code() == Some(6) || killed, "interrupted: {:?}: {}", out.status, stderr(&out));
    let (before, runs) = (snapshot_dir(&env.state_dir()), unfinished_runs(&env));
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "the stopped run is unfinished: {runs}");
    let refused: [(&[&str], i32); 2] =
        [(&["--max-freeze", "300ms", "--rate", "10M", "--pause", "5s"], 3), (&["--resume", "--chunk-size", "2M"], 2)];
    for (args, code) in refused {
        let out = output(env.reseq().arg("rewrite").args(args).arg(&lo.path));
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(snapshot_dir(&env.state_dir()) == before, "{args:?} changed the state directory");
    }
    {
        let _frozen = ForeignFreeze::new(&mnt.dir);
        let out = output(env.reseq().args(["rewrite", "--resume"]).arg(&lo.path));
        assert_eq!(out.status.code(), Some(3), "someone else's freeze: {}", stderr(&out));
    }
    assert!(snapshot_dir(&env.state_dir()) == before, "the refused --resume changed the state directory");
    unfinished_run_refused_alike(&env, &lo.path);
    assert_eq!(unfinished_runs(&env), runs, "status shows the interrupted run");
    // Then it finishes. Its 200 ms windows are the interrupted run's: on a host with every
    // CPU busy a thaw can outlast the hard bound, and the resume stops there (exit 7, every
    // chunk written verified; seen once, two guests beside the suite), to go on again.
    for attempt in 1..=3 {
        let out = output(env.reseq().args(["rewrite", "--json", "--resume"]).arg(&lo.path));
        match out.status.code() {
            Some(0) => break,
            Some(7) if attempt < 3 && stderr(&out).contains("beyond its bound") => {
                eprintln!("resume {attempt} stopped at the hard bound: {}", stderr(&out))
            }
            code => panic!("resume {attempt}: exit {code:?}: {}", stderr(&out)),
        }
    }
    assert_files_intact(&files);
}
