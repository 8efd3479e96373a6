//! A test run killed mid-test leaves its mounts and loop devices; the next run cleans
//! them up before they break it (`common::leftovers`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let d = dir.to_str().unwrap();
    info.lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(d))).map(String::from).collect()
}

/// Whether a loop device has a file attached.
/// Whether loop device `lo` is still attached to a file under `dir`: once detached, its
/// number is free, and another process on the machine may take it at once.
fn attached_under(lo: &str, dir: &Path) -> bool {
    let backing = Path::new("/sys/block").join(Path::new(lo).file_name().unwrap()).join("loop/backing_file");
    std::fs::read_to_string(backing).is_ok_and(|f| Path::new(f.trim_end()).starts_with(dir))
}

/// What a SIGKILLed sim_serve test leaves (the case that failed a CI run): an ext4
/// mounted from a loop device over the file of a killed `reseq sim serve`. While it is
/// there `mkfs.btrfs` fails anywhere on the machine; after the sweep it works, and a live
/// test's directory and mount are left alone.
#[test]
fn a_killed_runs_mounts_and_loop_devices_are_swept_by_the_next() {
    if !require(&["losetup", "mkfs.ext4", "mkfs.btrfs", "sleep"]) || !require_fuse() {
        return;
    }
    // The dead mount breaks every mkfs.btrfs on this host while it lasts.
    let _one = exclusive_of_tests();
    let env = TestEnv::new();
    let live = env.mounted("live.img", 64 << 20, "ext4");

    // The killed run: a directory owned by a process that is then killed.
    let dead = tempfile::Builder::new().prefix("reseq-test-").tempdir().unwrap().keep();
    // Passed or failed, the test ends with the killed run swept away, after its
    // processes (declared below, so dropped first) are killed and reaped.
    let _sweep = Defer(|| {
        leftovers::sweep();
    });
    let owner = Running::from(Command::new("sleep").arg("600").spawn().unwrap());
    // Its run directory on /dev/shm, with an image in memory under a loop device and a
    // mount (as `TestEnv::in_memory` makes): once missed by the sweep, which
    // removed the directory and left the loop device on the deleted image.
    let run = tempfile::Builder::new().prefix("reseq-test-run-").tempdir_in("/dev/shm").unwrap().keep();
    leftovers::mark(&dead, owner.pid() as u32, &[&run]);
    let mem = LoopDevice::create(&run.join("mem.img"), 16 << 20).unwrap();
    mkfs_ext4(&mem.path).unwrap();
    std::fs::create_dir(dead.join("mem-mnt")).unwrap();
    run_cmd(Command::new("mount").arg(&mem.path).arg(dead.join("mem-mnt"))).unwrap();
    let mem_lo = mem.path.display().to_string();
    // The killed run never detached it.
    std::mem::forget(mem);
    let state = dead.join("drive");
    json_ok(env.reseq().args(["sim", "create"]).arg(&state).args(["--preset", "consumer-nvme", "--device-size", "2G"]));
    let served = dead.join("served");
    std::fs::create_dir(&served).unwrap();
    let server = Running::from(
        env.reseq().args(["sim", "serve"]).arg(&state).arg(&served).stdout(Stdio::null()).spawn().unwrap(),
    );
    let t = Instant::now();
    while !served.join("disk").exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "sim serve did not mount");
        std::thread::sleep(Duration::from_millis(20));
    }
    let lo = run_cmd(Command::new("losetup").args(["-f", "--show"]).arg(served.join("disk"))).unwrap();
    let lo = lo.trim().to_string();
    mkfs_ext4(Path::new(&lo)).unwrap();
    std::fs::create_dir(dead.join("mnt")).unwrap();
    run_cmd(Command::new("mount").arg(&lo).arg(dead.join("mnt"))).unwrap();
    drop((server, owner));

    let probe = env.loop_device("probe.img", 256 << 20);
    let mkfs = || Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&probe.path).output().unwrap();
    let before = mkfs();
    assert!(
        String::from_utf8_lossy(&before.stderr).contains("Transport endpoint is not connected"),
        "the leftover breaks mkfs.btrfs: {before:?}"
    );

    let done = leftovers::sweep();
    eprintln!("swept: {done:#?}");
    assert!(mounts_under(&dead).is_empty(), "mounts left: {:?}", mounts_under(&dead));
    assert!(!attached_under(&lo, &dead), "{lo} is still attached");
    assert!(!attached_under(&mem_lo, &run), "{mem_lo} is still attached to the run directory's image");
    assert!(!run.exists(), "the killed run's run directory is removed");
    assert!(!dead.exists(), "the killed run's directory is removed");
    assert!(done.iter().any(|l| l.starts_with("detached")), "{done:?}");
    let after = mkfs();
    assert!(after.status.success(), "mkfs.btrfs after the sweep: {after:?}");

    assert_eq!(mounts_under(env.dir.path()).len(), 1, "a live test's mount is left alone");
    assert!(live.1.dir.is_dir() && env.dir.path().exists());
}

/// Only a command line that names the directory or a path in it counts: not one that
/// names another directory it is a prefix of.
#[test]
fn a_process_is_the_dead_runs_only_if_its_command_line_names_the_directory() {
    let dir = b"/tmp/reseq-test-a";
    assert!(leftovers::mentions(b"reseq\0rewrite\0/tmp/reseq-test-a/img\0", dir));
    assert!(leftovers::mentions(b"sh\0-c\0echo 1 >> '/tmp/reseq-test-a' && sync\0", dir));
    assert!(leftovers::mentions(b"sleep\0/tmp/reseq-test-a", dir));
    assert!(!leftovers::mentions(b"reseq\0rewrite\0/tmp/reseq-test-ab/img\0", dir));
    assert!(!leftovers::mentions(b"cat\0/tmp/reseq-test-abc\0", dir));
}
