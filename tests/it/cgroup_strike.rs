//! What a service manager does to a whole unit, done to reseq's cgroup mid-window: kill
//! it (`cgroup.kill`: systemd's KillMode=control-group, `systemctl kill`, an OOM kill of
//! the unit), freeze it (`cgroup.freeze`: `systemctl freeze`, `docker pause`), stop
//! every process in it. The guardian has left the group before the first freeze, so
//! each time the filesystem is thawed within the bound, nothing is lost, and `--resume`
//! finishes. Where the guardian cannot leave (a cgroup namespace, a read-only
//! cgroupfs), reseq refuses unless `--accept-cgroup-risk`. Each test makes its own group
//! under the cgroup v2 hierarchy and removes it, pass or fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const MAX_FREEZE: &str = "500ms";
/// `--max-freeze` 500 ms plus its grace (500 ms).
const BOUND: Duration = Duration::from_millis(1000);
/// What the stall probe may see beyond the bound: its own fsync after the thaw and the
/// scheduling noise of a shared 2-core machine.
const PROBE_SLACK: Duration = Duration::from_millis(600);

/// The cgroup v2 hierarchy's mount point.
fn hierarchy() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        (f.get(sep + 1) == Some(&"cgroup2") && f.get(3) == Some(&"/")).then(|| PathBuf::from(f[4]))
    })
}

/// Checks for a writable cgroup v2 hierarchy as `require` checks tools.
fn require_cgroup2() -> Option<PathBuf> {
    hierarchy().or_else(|| {
        skip("missing test requirements: a cgroup v2 hierarchy mounted at its root");
        None
    })
}

/// The cgroup v1 freezer hierarchy's mount point (hybrid hosts, container runtimes on v1).
fn v1_freezer() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        let opts = f.get(sep + 3)?;
        (f.get(sep + 1) == Some(&"cgroup") && opts.split(',').any(|o| o == "freezer")).then(|| PathBuf::from(f[4]))
    })
}

/// A cgroup group of the test's own (v2, or the v1 freezer's); on drop it is thawed,
/// emptied and removed.
struct TestGroup {
    dir: PathBuf,
}

impl TestGroup {
    fn new(root: &Path, name: &str) -> TestGroup {
        sweep_dead_test_groups(root);
        let dir = root.join(format!("reseq-test-{}-{name}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("making {}: {e}", dir.display()));
        TestGroup { dir }
    }

    /// `cmd` run inside this group (a shell puts itself there, then execs it).
    fn wrap(&self, cmd: &Command) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"").arg(&self.dir).arg(cmd.get_program());
        c.args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.dir.join(file), value).unwrap_or_else(|e| panic!("{file}: {e}"));
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for TestGroup {
    fn drop(&mut self) {
        empty_and_remove(&self.dir);
    }
}

fn empty_and_remove(dir: &Path) {
    let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
    let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    for pid in std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines() {
        if let Ok(pid) = pid.trim().parse() {
            sigkill(pid);
        }
    }
    let start = Instant::now();
    while std::fs::remove_dir(dir).is_err() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Groups left by a killed test run (their PID is gone).
fn sweep_dead_test_groups(root: &Path) {
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("reseq-test-").and_then(|r| r.split('-').next()?.parse::<i32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            empty_and_remove(&e.path());
        }
    }
}

/// What a run's guardians left: a process or a group still there 2 s after the run
/// (each removes its own group when it leaves). The guardians are the ones reseq's log
/// names ("freeze guardian (pid N)").
fn guardians_left(root: &Path, stderr: &str) -> Vec<String> {
    let pids: Vec<i32> =
        stderr.split("freeze guardian (pid ").skip(1).filter_map(|s| s.split(')').next()?.parse().ok()).collect();
    assert!(!pids.is_empty(), "no guardian named in:\n{stderr}");
    let start = Instant::now();
    loop {
        let left: Vec<String> = pids
            .iter()
            .flat_map(|pid| {
                // A zombie is gone (this container's PID 1 may never reap an orphan).
                let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.rsplit(')').next().and_then(|r| r.split_whitespace().next()) != Some("Z"));
                let proc_ = alive.then(|| format!("process {pid}"));
                let group = root.join(format!("reseq-guardian.{pid}"));
                [proc_, group.exists().then(|| group.display().to_string())]
            })
            .flatten()
            .collect();
        if left.is_empty() || start.elapsed() > Duration::from_secs(2) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// ext4 on a 320 MiB loop device with 200 MiB of data in 4 files.
fn filesystem(env: &TestEnv) -> (LoopDevice, Mount, Vec<(PathBuf, blake3::Hash)>) {
    let (lo, m) = env.mounted("d", 320 << 20, "ext4");
    std::fs::create_dir(m.dir.join("data")).unwrap();
    let files = fill_files(&m.dir.join("data"), 4, 50 << 20, 11);
    (lo, m, files)
}

/// A rewrite slowed by 20 ms after each 1 MiB write, so that most of it runs inside
/// freeze windows: device mode on `target` = the device, file mode on a directory.
fn slow_rewrite(env: &TestEnv, target: &Path, extra: &[&str]) -> Command {
    let mut c = env.reseq();
    // Debug: the guardian's placement is logged there.
    c.env("RUST_LOG", "debug")
        .env("RESEQ_FAULTS", "delay@after-write#*=20")
        .args(["rewrite", "--max-freeze", MAX_FREEZE, "--chunk-size", "1M", "--json"])
        .args(extra)
        .arg(target);
    c
}

/// What is done to the group once a window is open.
#[derive(Clone, Copy, Debug)]
enum Strike {
    Kill,
    Freeze,
    StopAll,
    /// `FROZEN` into a cgroup v1 freezer group's `freezer.state` (a frozen task there
    /// does not die of SIGKILL until thawed).
    V1Freeze,
}

/// One strike on a run in device or file mode; then the checks every strike shares.
fn strike(strike: Strike, file_mode: bool) {
    if !require(&["mkfs.ext4", "e2fsck", "fsfreeze"]) {
        return;
    }
    let Some(root) = require_cgroup2() else { return };
    let group_root = match strike {
        Strike::V1Freeze => match v1_freezer() {
            Some(f) => f,
            None => {
                skip("missing test requirements: a cgroup v1 freezer hierarchy");
                return;
            }
        },
        _ => root.clone(),
    };
    let env = TestEnv::new();
    let (lo, m, files) = filesystem(&env);
    let group = TestGroup::new(&group_root, &format!("{strike:?}-{file_mode}"));
    let target = if file_mode { m.dir.join("data") } else { lo.path.clone() };
    let writer = FsyncWriter::start(&m.dir, &m.dir.join("log"), &env.path("ack"), &env.path("stop"));
    let probe = StallProbe::start(&m.dir);
    let child = spawn_captured(&mut group.wrap(&slow_rewrite(&env, &target, &["--max-overruns", "1"])));
    assert!(wait_frozen_record(&env.run_dir(), Duration::from_secs(20)), "no window opened");
    std::thread::sleep(Duration::from_millis(150));
    let struck = Instant::now();
    match strike {
        Strike::Kill => group.write("cgroup.kill", "1"),
        Strike::Freeze => group.write("cgroup.freeze", "1"),
        Strike::V1Freeze => group.write("freezer.state", "FROZEN"),
        Strike::StopAll => {
            for pid in group.pids() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGSTOP);
            }
        }
    }
    // Held well past the bound: the guardian, outside the group, must not wait for it.
    assert_thawed_within(&m.dir, BOUND + PROBE_SLACK);
    let thawed_after = struck.elapsed();
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(thawed_after));
    let stalled = probe.worst();
    eprintln!("{strike:?} (file mode {file_mode}): thawed {} ms after the strike", thawed_after.as_millis());
    match strike {
        Strike::Freeze => group.write("cgroup.freeze", "0"),
        Strike::V1Freeze => group.write("freezer.state", "THAWED"),
        Strike::StopAll => {
            for pid in group.pids() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGCONT);
            }
        }
        Strike::Kill => {}
    }
    let out = wait_captured(child);
    let worst = probe.finish().max(stalled);
    assert!(worst <= BOUND + PROBE_SLACK, "{strike:?}: writes stalled {worst:?} (bound {BOUND:?})");
    let err = stderr(&out);
    assert!(err.contains("freeze guardian (pid") && err.contains("reseq-guardian."), "placement not logged:\n{err}");
    // Under load the strike can land between windows: then the run may finish (exit 0).
    assert!(matches!(out.status.code(), Some(0) | Some(6) | Some(7) | None), "{strike:?}: {err}");
    let left = guardians_left(&root, &err);
    assert!(left.is_empty(), "outlived the run: {left:?}");
    drop(group);
    // Nothing lost, and the run finishes from where it stopped.
    let out = resume_to_the_end(&env, &target);
    assert_eq!(out.status.code(), Some(0), "--resume after {strike:?}:\n{}", stderr(&out));
    assert!(writer.finish() > 0);
    assert_files_intact(&files);
    drop(m);
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn a_cgroup_kill_mid_window_thaws_at_once_device_mode() {
    strike(Strike::Kill, false);
}

#[test]
fn a_cgroup_kill_mid_window_thaws_at_once_file_mode() {
    strike(Strike::Kill, true);
}

#[test]
fn a_cgroup_freeze_mid_window_ends_within_the_bound_device_mode() {
    strike(Strike::Freeze, false);
}

#[test]
fn a_cgroup_freeze_mid_window_ends_within_the_bound_file_mode() {
    strike(Strike::Freeze, true);
}

#[test]
fn a_cgroup_v1_freezer_freeze_mid_window_ends_within_the_bound() {
    strike(Strike::V1Freeze, false);
}

#[test]
fn sigstop_of_every_process_in_the_group_ends_within_the_bound() {
    strike(Strike::StopAll, false);
}

/// Where the guardian cannot leave reseq's group, reseq says so before any freeze and
/// refuses (exit 3) unless `--accept-cgroup-risk`; the dry run names the placement.
#[test]
fn where_the_guardian_cannot_leave_reseq_refuses_unless_the_risk_is_accepted() {
    if !require(&["mkfs.ext4", "unshare", "nsenter"]) {
        return;
    }
    let Some(root) = require_cgroup2() else { return };
    let env = TestEnv::new();
    let (lo, m, files) = filesystem(&env);
    let plain = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    let text = String::from_utf8_lossy(&plain.stdout);
    assert!(text.contains("guardian: the guardian leaves reseq's cgroup"), "{text}");
    assert!(text.contains(&format!("{}/reseq-guardian.PID", root.display())), "{text}");
    // A cgroup namespace of its own (as in a container), and a read-only cgroupfs.
    let hier = root.display().to_string();
    let ns: &[&str] = &["unshare", "--cgroup", "--"];
    let ro = ["unshare", "--mount", "--", "sh", "-c", "mount -o remount,bind,ro \"$0\" && exec \"$@\"", &hier];
    for (how, prefix, why) in [("namespace", ns, "cgroup namespace"), ("read-only", &ro[..], "read-only")] {
        let refused = output(under(&env, prefix).args(["rewrite", "--json", "--dry-run"]).arg(&lo.path));
        let err = stderr(&refused);
        assert_eq!(refused.status.code(), Some(3), "{how}: {err} {}", String::from_utf8_lossy(&refused.stdout));
        for needle in ["cannot leave reseq's cgroup", why, "--accept-cgroup-risk", "reseq thaw"] {
            assert!(err.contains(needle), "{how}: no {needle:?} in:\n{err}");
        }
        let accepted =
            output(under(&env, prefix).args(["rewrite", "--json", "--dry-run", "--accept-cgroup-risk"]).arg(&lo.path));
        assert_eq!(accepted.status.code(), Some(0), "{how}: {}", stderr(&accepted));
        let plan = json_report(&accepted)["guardian"].as_str().unwrap_or_default().to_string();
        assert!(plan.contains("the guardian stays in reseq's cgroup") && plan.contains(why), "{how}: {plan}");
    }
    // In a PID namespace of its own reseq cannot see the writers outside it: refused,
    // and accepting the cgroup risk does not change that.
    let pid_ns: &[&str] = &["unshare", "--pid", "--fork", "--mount-proc", "--"];
    for accept in [&[][..], &["--accept-cgroup-risk"][..]] {
        let out = output(under(&env, pid_ns).args(["rewrite", "--json", "--dry-run"]).args(accept).arg(&lo.path));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains("cannot see every process") && err.contains("PID namespace"), "{err}");
    }
    // The shipped pod spec's way out of a cgroup namespace: enter the host's through a
    // process in it (the pod enters PID 1's; here a process of the test's own stands in).
    let mut host_proc = Command::new("sleep").arg("60").spawn().unwrap();
    let target = host_proc.id().to_string();
    let entered = ["unshare", "--cgroup", "--", "nsenter", "--target", &target, "--cgroup", "--"];
    let out = output(under(&env, &entered).args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    let _ = host_proc.kill();
    let _ = host_proc.wait();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("guardian: the guardian leaves reseq's cgroup"));
    // Accepted, the run goes ahead with the guardian where reseq is, and says so.
    let out = output(under(&env, ns).args(["rewrite", "--accept-cgroup-risk", "--max-freeze", "1s"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("the guardian stays in reseq's cgroup"), "{}", stderr(&out));
    assert_files_intact(&files);
    drop(m);
    fsck_clean(&lo.path, "ext4");
}

/// `env.reseq()`, run through `prefix` (a command that execs what follows it).
fn under(env: &TestEnv, prefix: &[&str]) -> Command {
    let plain = env.reseq();
    let mut c = Command::new(prefix[0]);
    c.args(&prefix[1..]).arg(plain.get_program());
    for (k, v) in plain.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

/// The dry run says what priority the guardian will get; without CAP_SYS_NICE (dropped
/// from the bounding set) it says what is missing, and a real run warns the same before
/// its first freeze and still ends every window on time.
#[test]
fn the_guardian_s_priority_is_stated_and_a_shortfall_is_warned_about() {
    if !require(&["mkfs.ext4", "setpriv"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m, files) = filesystem(&env);
    let dry = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    let text = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(
        text.contains("guardian priority: the guardian runs SCHED_FIFO 99")
            || text.contains("guardian priority: the freeze guardian runs without"),
        "{text}"
    );
    assert!(!text.contains("without real-time priority"), "root here may use SCHED_FIFO:\n{text}");
    let no_nice = ["setpriv", "--bounding-set", "-sys_nice", "--"];
    let dry = output(under(&env, &no_nice).args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    let text = String::from_utf8_lossy(&dry.stdout).into_owned();
    assert!(text.contains("without real-time priority (EPERM"), "{text}");
    let out = output(under(&env, &no_nice).args(["rewrite", "--max-freeze", "500ms", "--json"]).arg(&lo.path));
    let err = stderr(&out);
    let warned = err.find("without real-time priority").unwrap_or_else(|| panic!("no warning:\n{err}"));
    assert!(err.find("rewriting ").is_some_and(|r| warned < r), "warned after the rewrite began:\n{err}");
    // On a loaded machine a guardian without real-time priority can be late (that is the
    // point of the warning): the run may then have been killed or stopped; it resumes.
    assert!(matches!(out.status.code(), Some(0) | Some(7) | None), "{err}");
    let mut code = out.status.code();
    for _ in 0..3 {
        if code == Some(0) {
            break;
        }
        code = output(env.reseq().args(["rewrite", "--resume"]).arg(&lo.path)).status.code();
        assert!(matches!(code, Some(0) | Some(7) | None), "--resume: {code:?}");
    }
    assert_eq!(code, Some(0), "three resumes did not finish");
    assert_files_intact(&files);
    drop(m);
    fsck_clean(&lo.path, "ext4");
}

/// A real-time busy loop starves the kernel threads a freeze and a thaw wait for (RCU,
/// the journal, the loop device's workers), whatever reseq's priority: refused unless
/// `--force`, naming the process. (The machine to itself: the loop takes a CPU.)
#[test]
fn a_real_time_busy_loop_is_refused_unless_forced() {
    let _alone = exclusive();
    if !require(&["mkfs.ext4", "chrt", "timeout"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, _m, _files) = filesystem(&env);
    // chrt execs the shell, so the child is the loop itself: killed on the way out, pass
    // or fail (a loop left spinning at real-time priority would take a CPU for good).
    let hog =
        Running::from(Command::new("chrt").args(["-f", "10", "sh", "-c", "while :; do :; done"]).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(300));
    let refused = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    let forced = output(env.reseq().args(["rewrite", "--dry-run", "-v", "--force"]).arg(&lo.path));
    drop(hog);
    assert_eq!(refused.status.code(), Some(3), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("real-time processes keep a CPU busy"), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("while :"), "the process is named: {}", stderr(&refused));
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    assert!(String::from_utf8_lossy(&forced.stdout).contains("warning: real-time processes"));
    // A busy real-time thread beside an idle main thread (the process's own stat shows
    // the main thread's policy only).
    // It says when the thread is real-time: a python slow to start on a busy host was
    // not yet there when reseq looked.
    let spin = "import os, threading\n\
                def spin():\n    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))\n    \
                print('spinning', flush=True)\n    while True: pass\n\
                threading.Thread(target=spin, daemon=True).start()\nthreading.Event().wait()";
    let mut hog = Running::from(
        Command::new("python3").args(["-c", spin, "rt-thread-hog"]).stdout(Stdio::piped()).spawn().unwrap(),
    );
    let mut said = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(hog.child().stdout.take().unwrap()), &mut said).unwrap();
    assert_eq!(said.trim(), "spinning", "the hog did not start");
    std::thread::sleep(Duration::from_millis(100));
    let refused = output(env.reseq().args(["rewrite", "--dry-run"]).arg(&lo.path));
    drop(hog);
    assert_eq!(refused.status.code(), Some(3), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("rt-thread-hog"), "the process is named: {}", stderr(&refused));
    // Without them, nothing to say.
    let plain = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
}
