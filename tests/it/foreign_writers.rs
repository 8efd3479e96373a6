//! Nobody else writes while reseq does: a process holding the target open for writing,
//! or a loop device stacked on it with a filesystem and a live writer, is refused before
//! anything is written (exit 3, naming the PID or the device); one that appears mid-run
//! stops the run before the next window.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

#[test]
fn a_process_holding_the_device_for_writing_is_refused() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("held", 16 << 20, 5);
    let before = hash_path(&lo.path).unwrap();
    let mut h = hold_open(&lo.path);
    let written = bytes_written_to(&lo.path);
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path));
    let _ = h.kill();
    let _ = h.wait();
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(err.contains(&format!("PID {}", h.id())) && err.contains("open for writing"), "{err}");
    assert_eq!(bytes_written_to(&lo.path), written, "nothing may be written");
    assert_eq!(hash_path(&lo.path).unwrap(), before);
    // The dry run says what it checked.
    let out = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("other writers: none"));
}

/// The case: `losetup loop7 /dev/loop6`, ext4 mounted from loop7, a writer on it.
/// O_EXCL on loop6 succeeds (loop7 is no exclusive opener, and shows in no holders/), so
/// only the backing-file check can see it.
#[test]
fn a_loop_device_stacked_on_the_target_is_refused() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let lower = env.loop_device("lower", 64 << 20);
    let upper = LoopDevice::attach(&lower.path, &[]).unwrap();
    mkfs_ext4(&upper.path).unwrap();
    let m = Mount::new(&upper.path, &env.path("upper-mnt"), &[]).unwrap();
    let writer = FsyncWriter::start(&m.dir, &m.dir.join("log"), &env.path("ack"), &env.path("stop"));
    std::thread::sleep(Duration::from_millis(300));
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lower.path));
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(err.contains(&upper.path.display().to_string()) && err.contains("loop device backed by"), "{err}");
    assert!(writer.finish() > 0, "the writer's fsync'd records are all there");
    drop(m);
    let out = Command::new("e2fsck").args(["-f", "-n"]).arg(&upper.path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

/// A writer that opens the device after the run started stops it within 250 ms, before
/// reseq writes more (exit 4: something was written before, all of it verified).
#[test]
fn a_writer_appearing_mid_run_stops_it_between_windows() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("late", 64 << 20, 9);
    let before = hash_path(&lo.path).unwrap();
    late_writer_stops_the_run(&env, &lo, 64 << 20, 20);
    assert_eq!(hash_path(&lo.path).unwrap(), before, "the bytes are the same");
}

/// A run of `lo` (`size` bytes, each 1 MiB write followed by `delay_ms`) that a process
/// opening it after the first write stops: exit 4, naming the process and `--resume`,
/// before the end.
fn late_writer_stops_the_run(env: &TestEnv, lo: &LoopDevice, size: u64, delay_ms: u32) {
    let first = env.path("first-write.done");
    let faults = format!("mark@after-write#1={},delay@after-write#*={delay_ms}", first.display());
    let child = spawn_captured(
        env.reseq().env("RESEQ_FAULTS", faults).args(["rewrite", "--json", "--chunk-size", "1M"]).arg(&lo.path),
    );
    assert!(wait_for_mark(&first, Duration::from_secs(60)), "no write within 60 s");
    let mut h = hold_open(&lo.path);
    let out = wait_captured(child);
    let _ = h.kill();
    let _ = h.wait();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("PID {}", h.id())) && stderr(&out).contains("--resume"), "{}", stderr(&out));
    let r = json_report(&out);
    assert!(r["results"]["bytes_written"].as_u64().unwrap() < size, "stopped before the end");
}

/// `n` processes, each holding `k` files open, until dropped: a busy host's /proc. Each
/// waits on the pipe this holds: when it closes (dropped, or this test process gone by
/// whatever signal) all of them exit, and their parent reaps them before it exits.
struct Crowd(std::process::Child, Option<std::process::ChildStdin>);

impl Crowd {
    fn start(n: usize, k: usize) -> Crowd {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        let script = format!(
            "import os, sys\n\
             for _ in range({n}):\n    if os.fork() == 0:\n        \
             fds = [os.open('/etc/hostname', os.O_RDONLY) for _ in range({k})]\n        \
             os.read(0, 1)\n        os._exit(0)\n\
             print('ready', flush=True)\nos.read(0, 1)\n\
             while True:\n    try:\n        os.wait()\n    except ChildProcessError:\n        break\n"
        );
        let child = Command::new("python3")
            .args(["-c", &script])
            .process_group(0)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut crowd = Crowd(child, None);
        crowd.1 = crowd.0.stdin.take();
        let mut line = String::new();
        std::io::BufReader::new(crowd.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        std::thread::sleep(Duration::from_secs(1));
        crowd
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        drop(self.1.take());
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// How long the writers' scan beside the writer took, as its warning says (None: under
/// 250 ms, no warning).
fn scan_ms(stderr: &str) -> Option<u64> {
    let at = stderr.find("the writers' scan of /proc took ")? + "the writers' scan of /proc took ".len();
    stderr[at..].split(' ').next()?.parse().ok()
}

/// On a host of 2,000 processes with 60 open files each, a scan of /proc takes longer
/// than the writer's old limit of 300 ms: the writer waited for a whole scan at every
/// chunk (8 GiB took over 10 minutes at 8 MiB/s). Now the scans are paced at half a
/// CPU and hold no chunk; a writer that appears mid-run is still stopped.
#[test]
fn a_host_of_many_processes_holds_no_chunk_and_hides_no_late_writer() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let lo = env.random_loop_device("crowded", 256 << 20, 11);
    let before = hash_path(&lo.path).unwrap();
    // Alone: every other test's scans would meet the crowd too, and see its writers later.
    let _alone = exclusive();
    let _crowd = Crowd::start(2000, 60);
    let t = std::time::Instant::now();
    // 256 chunks of at least 5 ms each: the scans beside the writer run many times.
    let mut run = env.reseq();
    run.env("RESEQ_FAULTS", "delay@after-write#*=5").args(["rewrite", "--json", "--no-verify", "--chunk-size", "1M"]);
    let out = output(run.arg(&lo.path));
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The control: the scans were slower than the old limit, which held every chunk of
    // the 256 for a whole scan (over 75 s).
    let scan = scan_ms(&stderr(&out)).expect("a crowd this large makes the scan warn");
    assert!(scan >= 300, "a scan took {scan} ms: too light a crowd to tell");
    assert!(took < Duration::from_secs(40), "{took:?} for 256 MiB with scans of {scan} ms");
    assert_eq!(hash_path(&lo.path).unwrap(), before);

    // A writer that appears after the first write is still seen, and stops the run.
    late_writer_stops_the_run(&env, &lo, 256 << 20, 40);
    assert_eq!(hash_path(&lo.path).unwrap(), before, "the bytes are the same");
}

/// The shipped unit's capabilities (its `CapabilityBoundingSet=`, which systemd makes
/// reseq's), as `setpriv --bounding-set` takes them; and `less` left out.
fn unit_caps(less: &str) -> String {
    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/systemd/reseq@.service")).unwrap();
    let set = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).expect("the unit bounds its caps");
    let caps: Vec<String> = set
        .split_whitespace()
        .filter(|c| *c != less)
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    format!("--bounding-set=-all,{}", caps.join(","))
}

/// Under the shipped unit's capabilities a process holding the device for writing is
/// refused as under a root shell: reading another process's fds takes ptrace read
/// access, CAP_SYS_PTRACE for one of root's with more capabilities than the unit's.
/// Without that capability the kernel shows reseq none of them, the holder among them:
/// the run is refused for that, naming it, and with --force goes on, saying so.
#[test]
fn under_the_shipped_units_capabilities_a_holder_is_still_refused() {
    if !require(&["losetup", "setpriv"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("held-unit", 16 << 20, 6);
    let before = hash_path(&lo.path).unwrap();
    let under = |caps: String, args: &[&str]| {
        let reseq = env.reseq();
        let mut c = Command::new("setpriv");
        c.args(["--inh-caps=-all", &caps, "--"]).arg(reseq.get_program()).args(args).arg(&lo.path);
        c.envs(reseq.get_envs().filter_map(|(k, v)| v.map(|v| (k, v)))).env("RUST_LOG", "reseq::host=debug");
        let out = output(&mut c);
        (out.status.code(), stderr(&out) + &String::from_utf8_lossy(&out.stdout))
    };
    // Nothing held: the unit's reseq looks into every process, and says nothing of it.
    let clear = under(unit_caps(""), &["rewrite", "--dry-run"]);
    let mut h = hold_open(&lo.path);
    let written = bytes_written_to(&lo.path);
    let refused = under(unit_caps(""), &["rewrite", "--chunk-size", "1M"]);
    // The control: the unit's set without CAP_SYS_PTRACE, then with --force (dry runs).
    let blind = under(unit_caps("CAP_SYS_PTRACE"), &["rewrite", "--dry-run"]);
    let forced = under(unit_caps("CAP_SYS_PTRACE"), &["rewrite", "--dry-run", "--force"]);
    let _ = h.kill();
    let _ = h.wait();
    assert_eq!(clear.0, Some(0), "{}", clear.1);
    assert!(!clear.1.contains("CAP_SYS_PTRACE"), "the unit's reseq sees every process: {}", clear.1);
    assert_eq!(refused.0, Some(3), "{}", refused.1);
    assert!(refused.1.contains(&format!("PID {}", h.id())) && refused.1.contains("open for writing"), "{}", refused.1);
    // The PIDs it could not look into, as its debug line lists them: the holder's among them.
    let listed = |text: &str| -> Vec<u32> {
        let line = text.lines().find(|l| l.contains("does not let reseq see the open files of PIDs")).unwrap_or("");
        let list = line.rsplit('[').next().unwrap_or("").trim_end_matches(']');
        list.split(',').filter_map(|p| p.trim().parse().ok()).collect()
    };
    assert_eq!(blind.0, Some(3), "{}", blind.1);
    assert!(blind.1.contains("reseq lacks CAP_SYS_PTRACE"), "{}", blind.1);
    assert!(listed(&blind.1).contains(&h.id()), "{}", blind.1);
    assert_eq!(forced.0, Some(0), "{}", forced.1);
    assert!(forced.1.contains("warning: reseq lacks CAP_SYS_PTRACE"), "{}", forced.1);
    assert_eq!(bytes_written_to(&lo.path), written, "nothing may be written");
    assert_eq!(hash_path(&lo.path).unwrap(), before);
}
