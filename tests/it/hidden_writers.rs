//! Writers a scan of `/proc/*/fd` cannot see, and a device that changes shape mid-run
//! (issue 35, items 1 and 2).
//!
//! A writer (a small Python program, for `unshare` and `pthread_exit` through ctypes)
//! rewrites random 4 KiB blocks with O_DIRECT and an fdatasync each and, when stopped,
//! records the last sequence number of each block whose fdatasync returned; afterwards
//! every block is read back: none may hold an older write than that (0 fsync'd blocks
//! reverted), and reseq must stop with a documented exit code and say why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::recording::{Recorder as Writer, reverted};
use crate::common::*;

const BLOCK: u64 = 4096;
const BLOCKS: u64 = 2048;

/// The writer. Modes: `plain` (one fd), `unshare` (a thread with a file table of its own
/// opens the device), `zombie` (the main thread calls pthread_exit, a thread writes),
/// `blink` (opens, writes, fsyncs and closes each block: never there for a scan's three
/// looks 100 ms apart), `getfd` (takes a copy of reseq's own read-write fd of the device
/// with pidfd_getfd and writes through it).
const WRITER: &str = r#"
import ctypes, mmap, os, random, sys, threading, time
mode, path, first, count, out, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
libc = ctypes.CDLL(None, use_errno=True)
last = [0] * count
def grab():
    dev = os.stat(path).st_rdev
    for p in filter(str.isdigit, os.listdir('/proc')):
        try:
            if open('/proc/%s/comm' % p).read().strip() != 'reseq':
                continue
            for n in os.listdir('/proc/%s/fd' % p):
                st = os.stat('/proc/%s/fd/%s' % (p, n))
                flags = int(open('/proc/%s/fdinfo/%s' % (p, n)).read().split('flags:')[1].split()[0], 8)
                if st.st_rdev == dev and flags & 3 == os.O_RDWR:
                    fd = libc.syscall(438, os.pidfd_open(int(p)), int(n), 0)
                    if fd >= 0:
                        return fd
        except (OSError, IndexError):
            continue
    raise OSError('no reseq holds %s for writing' % path)
def run(open_each, fd=None):
    rng, seq, buf = random.Random(7), 0, mmap.mmap(-1, 4096)
    while not os.path.exists(stop):
        seq += 1
        i = rng.randrange(count)
        buf[:24] = b'HIDDENBK' + i.to_bytes(8, 'little') + seq.to_bytes(8, 'little')
        try:
            if fd is None:
                fd = os.open(path, os.O_RDWR | os.O_DIRECT)
            os.pwrite(fd, buf, first + i * 4096)
            os.fdatasync(fd)
        except OSError:
            break
        last[i] = seq
        if seq == 1:
            # Ready once it writes, and (zombie) once the leader is a zombie.
            while mode == 'zombie' and open('/proc/%d/stat' % os.getpid()).read().rsplit(')', 1)[1].split()[0] != 'Z':
                time.sleep(0.01)
            open(out + '.ready', 'w').close()
        if open_each:
            os.close(fd)
            fd = None
            time.sleep(0.005)
    with open(out + '.tmp', 'w') as f:
        f.write(' '.join(map(str, last)))
    os.rename(out + '.tmp', out)
def unshared():
    if libc.unshare(0x400) != 0:
        raise OSError(ctypes.get_errno(), 'unshare(CLONE_FILES)')
    run(False)
if mode == 'unshare':
    t = threading.Thread(target=unshared); t.start(); t.join()
elif mode == 'zombie':
    t = threading.Thread(target=run, args=(False,)); t.start()
    time.sleep(0.05)
    libc.pthread_exit(None)
elif mode == 'getfd':
    run(False, grab())
else:
    run(mode == 'blink')
"#;

/// Writes blocks `first..first + BLOCKS * 4096` of `path`.
fn start_writer(env: &TestEnv, mode: &str, path: &Path, first: u64) -> Writer {
    start_writer_n(env, mode, path, first, BLOCKS)
}

/// Writes `count` blocks from `first`.
fn start_writer_n(env: &TestEnv, mode: &str, path: &Path, first: u64, count: u64) -> Writer {
    let script = env.path("writer.py");
    std::fs::write(&script, WRITER).unwrap();
    let (out, stop) = (env.path(&format!("{mode}.last")), env.path(&format!("{mode}.stop")));
    let child = Command::new("python3")
        .arg(&script)
        .args([mode, &path.to_string_lossy(), &first.to_string(), &count.to_string()])
        .args([&out, &stop])
        .spawn()
        .unwrap();
    // Until it has written (a fixed wait lost the race on a loaded host).
    let ready = PathBuf::from(format!("{}.ready", out.display()));
    let t = Instant::now();
    while !ready.exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    Writer { child: Some(child), stop, out }
}

/// Stops the writer and asserts that no fsync'd block reverted; says the figures.
fn assert_nothing_lost(writer: Writer, path: &Path, first: u64, out: &std::process::Output, at_least: usize) {
    let last = writer.finish();
    let (lost, acked) = reverted(path, first, &last);
    eprintln!("exit {:?}, {lost} of {acked} fsync'd blocks reverted", out.status.code());
    assert!(acked >= at_least, "the writer wrote (fsync'd) while reseq ran: {acked}");
    assert_eq!(lost, 0, "{lost} of {acked} fsync'd blocks went back to older contents");
}

/// `reseq rewrite` of `dev`, chunks of 1 MiB, each write delayed (a run of about 1.3 s
/// over 64 MiB, long enough for a change mid-run); returned once its first write is done
/// (at most 30 s), so that what the test does next is mid-run: on a busy host the start
/// once took longer than the test's pause, and a partition added then was a refusal.
fn slow_rewrite(env: &TestEnv, dev: &Path) -> Running {
    let first = env.path("first-write.done");
    let faults = format!("mark@after-write#1={},delay@after-write#*=20", first.display());
    let run =
        Running::captured(env.reseq().env("RESEQ_FAULTS", faults).args(["rewrite", "--chunk-size", "1M"]).arg(dev));
    wait_for_mark(&first, Duration::from_secs(30));
    run
}

/// A writer in `mode` starting after the run did: its first write shows in the counters
/// before reseq's next write (exit 9), or the scan names it (exit 4, saying `how`); no
/// fsync'd block reverts.
fn writer_mid_run(mode: &str, seed: u64, how: &str) {
    let env = TestEnv::new();
    let lo = env.random_loop_device(&format!("late-{mode}.img"), 64 << 20, seed);
    let run = slow_rewrite(&env, &lo.path);
    std::thread::sleep(Duration::from_millis(300));
    let writer = start_writer(&env, mode, &lo.path, 40 << 20);
    let out = run.wait();
    let err = stderr(&out);
    assert_nothing_lost(writer, &lo.path, 40 << 20, &out, 1);
    match out.status.code() {
        Some(4) => assert!(err.contains(how) && err.contains("--resume"), "{err}"),
        Some(9) => assert!(err.contains("another writer wrote"), "{err}"),
        c => panic!("exit {c:?}: {err}"),
    }
}

/// Refused before any write (exit 3), naming the writer's PID and `how`.
fn assert_refused(env: &TestEnv, mode: &str, how: &str) {
    let lo = env.random_loop_device(&format!("{mode}.img"), 16 << 20, 3);
    let writer = start_writer(env, mode, &lo.path, 4 << 20);
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path));
    let err = stderr(&out);
    let pid = writer.pid();
    assert_nothing_lost(writer, &lo.path, 4 << 20, &out, 20);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(&format!("PID {pid}")) && err.contains(how), "{err}");
}

/// (a) A thread with a file table of its own (`unshare(CLONE_FILES)`) holds the
/// unmounted target open and writes: before, exit 0 with 22 fsync'd blocks reverted.
#[test]
fn a_thread_with_its_own_file_table_is_refused() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    assert_refused(&TestEnv::new(), "unshare", "of thread");
}

/// (a) mid-run: the thread starts writing after the run did. Its first write shows in the
/// counters before reseq's next write (exit 9), or the scan within the window names the
/// thread (exit 4); no fsync'd block reverts.
#[test]
fn a_thread_with_its_own_file_table_appearing_mid_run_stops_it() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    writer_mid_run("unshare", 10, "of thread");
}

/// (b) The main thread called pthread_exit: the leader is a zombie with an empty `fd/`,
/// and a thread writes.
#[test]
fn a_writer_behind_a_zombie_leader_is_refused() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    assert_refused(&TestEnv::new(), "zombie", "open for writing (fd");
}

/// (c) A writer that opens, writes, fsyncs and closes each block mid-run: no scan sees
/// it for three looks, but the device's written-sectors counter grows by more than reseq
/// wrote, and the run stops before its next write (exit 9), naming the device and the
/// bytes at risk.
#[test]
fn a_writer_no_scan_sees_is_stopped_by_the_written_sectors_counter() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("blink.img", 64 << 20, 5);
    let run = slow_rewrite(&env, &lo.path);
    std::thread::sleep(Duration::from_millis(300));
    let writer = start_writer(&env, "blink", &lo.path, 40 << 20);
    let out = run.wait();
    let err = stderr(&out);
    // The counter stops the run at the writer's first block: few are written.
    assert_nothing_lost(writer, &lo.path, 40 << 20, &out, 1);
    assert_eq!(out.status.code(), Some(9), "{err}");
    let dev = lo.path.display().to_string();
    assert!(err.contains(&format!("another writer wrote {dev}")) && err.contains("Device bytes"), "{err}");
    assert_status_names_the_ranges(&env, &err);
    // The writer gone, a resume finishes the run: it repeats the ranges, and status
    // keeps them (nobody has checked them) until the device's next run.
    let resumed = env.reseq().args(["rewrite", "--resume"]).arg(&lo.path).output().unwrap();
    let said = stderr(&resumed).split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(resumed.status.code(), Some(0), "{said}");
    assert!(
        said.contains("the run being resumed stopped with exit 9 (another writer wrote): check device bytes"),
        "{said}"
    );
    let status = env.reseq().args(["status", "--json"]).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(report["unfinished"].as_array().map(Vec::len), Some(0), "{report}");
    let to_check = report["to_check"].as_array().unwrap();
    assert!(to_check.len() == 1 && to_check[0].as_str().unwrap().contains("stopped with exit 9"), "{report}");
    // A fresh run replaces the journal, and its notes with it.
    let fresh = env.reseq().args(["rewrite", "--chunk-size", "4M"]).arg(&lo.path).output().unwrap();
    assert_eq!(fresh.status.code(), Some(0), "{}", stderr(&fresh));
    let status = env.reseq().args(["status", "--json"]).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(report["to_check"].as_array().map(Vec::len), Some(0), "{report}");
}

/// `status` names every range the stop's message named, until the run is finished: an
/// admin who comes back to the server later reads there what to check.
fn assert_status_names_the_ranges(env: &TestEnv, err: &str) {
    // As one line: a long message is wrapped to the screen.
    let err = err.split_whitespace().collect::<Vec<_>>().join(" ");
    let named = err.split("Device bytes ").nth(1).and_then(|t| t.split(" (").next()).expect("ranges in the message");
    let ranges: Vec<&str> = named.split(", ").collect();
    assert!(!ranges.is_empty() && ranges.iter().all(|r| r.contains("..")), "{named}");
    let status = env.reseq().args(["status", "--json"]).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let unfinished = report["unfinished"].as_array().unwrap();
    let at_risk: Vec<&str> =
        unfinished.iter().flat_map(|u| u["at_risk"].as_array().unwrap()).map(|r| r.as_str().unwrap()).collect();
    assert_eq!(at_risk.len(), 1, "{report}");
    assert!(at_risk[0].starts_with("stopped with exit 9 (another writer wrote)"), "{}", at_risk[0]);
    // Merged where they touch: each named range lies in one that status names.
    let listed: Vec<(u64, u64)> = at_risk[0]
        .split("device bytes ")
        .nth(1)
        .and_then(|t| t.split(" (").next())
        .unwrap()
        .split(", ")
        .map(|r| r.split_once("..").map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).unwrap())
        .collect();
    for r in &ranges {
        let (a, b): (u64, u64) = r.split_once("..").map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).unwrap();
        assert!(listed.iter().any(|&(la, lb)| la <= a && b <= lb), "{r} not in status's {listed:?}");
    }
    let text = String::from_utf8(env.reseq().arg("status").output().unwrap().stdout).unwrap();
    assert!(text.contains("at risk: stopped with exit 9"), "{text}");
}

/// (e) A process that takes a copy of reseq's own read-write fd of the device mid-run
/// (pidfd_getfd, as a debugger or a tool that borrows fds can) and writes through it: the
/// kernel counts its writes (exit 9) or the scan finds the copy open for writing (exit
/// 4); no fsync'd block reverts.
#[test]
fn a_copy_of_reseqs_own_fd_taken_mid_run_stops_it() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    writer_mid_run("getfd", 12, "open for writing");
}

/// Holds a run at a fault point (`POINT#N`) until the returned function lets it go.
fn held_at(env: &TestEnv, cmd: &mut Command, point: &str) -> (Running, impl FnOnce() + use<>) {
    let gate = env.path(&format!("gate-{}", point.replace('#', "-")));
    let mut rule = format!("pause@{point}={}", gate.display());
    // After the command's own rules, if it has any.
    if let Some(Some(before)) = cmd.get_envs().find(|(k, _)| *k == "RESEQ_FAULTS").map(|(_, v)| v) {
        rule = format!("{},{rule}", before.to_string_lossy());
    }
    let run = Running::captured(cmd.env("RESEQ_FAULTS", rule));
    let paused = PathBuf::from(format!("{}.paused", gate.display()));
    let t = Instant::now();
    while !paused.exists() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(paused.exists(), "the run never reached {point}");
    (run, move || std::fs::write(format!("{}.go", gate.display()), b"").unwrap())
}

/// Mounts made mid-run. Of the unmounted target: the kernel refuses the mount (reseq
/// holds the device O_EXCL, and a mount needs it exclusively too), and the run finishes.
/// Of a mounted target: a second mount of the device and a bind mount are the same
/// filesystem (one superblock), frozen by the same freeze: writers through them lose
/// nothing, and fsck is clean.
#[test]
fn mounts_made_mid_run_are_refused_or_frozen_with_the_first() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("late-mount.img", 64 << 20);
    mkfs_ext4(&lo.path).unwrap();
    let (run, go) = held_at(&env, env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path), "before-write#3");
    let dir = env.path("late-mnt");
    std::fs::create_dir(&dir).unwrap();
    let mount = Command::new("mount").arg(&lo.path).arg(&dir).output().unwrap();
    if mount.status.success() {
        let _ = Command::new("umount").arg(&dir).output();
    }
    go();
    let out = run.wait();
    assert!(!mount.status.success(), "mounted while reseq wrote the device");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    fsck_clean(&lo.path, "ext4");

    let (lo, first) = env.mounted("two-mounts", 64 << 20, "ext4");
    let files = fill_files(&first.dir, 4, 4 << 20, 13);
    let slow = ["rewrite", "--chunk-size", "1M", "--max-freeze", "300ms", "--pause", "50ms", "--max-overruns", "1000"];
    let mut cmd = env.reseq();
    cmd.args(slow).arg("--include-free").arg(&lo.path);
    let (run, go) = held_at(&env, &mut cmd, "after-thaw#1");
    let second = Mount::new(&lo.path, &env.path("second-mnt"), &[]).unwrap();
    let bind = Mount::new(&first.dir, &env.path("bind-mnt"), &["bind"]).unwrap();
    let writers = [
        Appender::start(&second.dir, &second.dir.join("second.log"), &env.path("stop-second")),
        Appender::start(&bind.dir, &bind.dir.join("bind.log"), &env.path("stop-bind")),
    ];
    go();
    let out = run.wait();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for w in writers {
        assert!(w.finish() > 0, "a writer made no progress");
    }
    assert_files_intact(&files);
    drop(bind);
    second.unmount().unwrap();
    first.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// LOOP_CHANGE_FD swaps a loop device's backing file, and the kernel allows it only on a
/// loop attached read-only (drivers/block/loop.c), which reseq refuses before anything
/// (`refusals_and_faults::read_only_device`). On the writable target mid-run it fails
/// (EINVAL), and the run finishes with the data where it was.
#[test]
fn loop_change_fd_is_refused_by_the_kernel_on_a_writable_target() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("change-fd.img", 16 << 20, 14);
    let before = hash_path(&lo.path).unwrap();
    let other = env.path("other.img");
    std::fs::write(&other, vec![0u8; 16 << 20]).unwrap();
    let (run, go) = held_at(&env, env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path), "before-write#3");
    // LOOP_CHANGE_FD = 0x4C06 (include/uapi/linux/loop.h).
    let script = "import fcntl, os, sys\n\
        d = os.open(sys.argv[1], os.O_RDONLY); f = os.open(sys.argv[2], os.O_RDWR)\n\
        try:\n    fcntl.ioctl(d, 0x4C06, f); print('changed')\n\
        except OSError as e:\n    print('errno', e.errno)\n";
    let tried = output(Command::new("python3").args(["-c", script]).arg(&lo.path).arg(&other));
    go();
    let out = run.wait();
    let said = String::from_utf8_lossy(&tried.stdout).trim().to_string();
    assert_eq!(said, format!("errno {}", nix::libc::EINVAL), "LOOP_CHANGE_FD on the writable target");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(hash_path(&lo.path).unwrap(), before, "the device reads as before");
    assert!(std::fs::read(&other).unwrap().iter().all(|b| *b == 0), "the other file was written");
}

/// (d) A buffered write to the device node between reseq's read of a chunk and its write
/// (the run held there by a fault hook), closed without fsync: the page waits in the
/// device's page cache, and a direct write writes such pages back before it writes over
/// them. Before, the check before the write saw nothing and the page was written over
/// (the run stopped with exit 9 only after). Now reseq writes the range back first and
/// the counter sees it before the write: exit 9, the page kept.
#[test]
fn a_buffered_write_between_the_read_and_the_write_is_counted_first() {
    use std::os::unix::fs::FileExt;
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("buffered.img", 16 << 20, 11);
    // The third chunk of 1 MiB, [2, 3) MiB: read, about to be written.
    let (run, go) = held_at(&env, env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path), "before-write#3");
    let at = (2 << 20) + 8192;
    let mut page = vec![0x5a; BLOCK as usize];
    page[..8].copy_from_slice(b"BUFFERED");
    // Buffered, closed without a sync: reseq holds the device, so the close writes nothing.
    std::fs::OpenOptions::new().write(true).open(&lo.path).unwrap().write_all_at(&page, at).unwrap();
    go();
    let out = run.wait();
    let err = stderr(&out);
    let f = std::fs::File::open(&lo.path).unwrap();
    let mut now = vec![0u8; BLOCK as usize];
    // The device as it is: flushed and dropped from the page cache first.
    run_cmd(Command::new("blockdev").arg("--flushbufs").arg(&lo.path)).unwrap();
    f.read_exact_at(&mut now, at).unwrap();
    assert!(now == page, "the buffered page was written over (exit {:?}): {err}", out.status.code());
    assert_eq!(out.status.code(), Some(9), "{err}");
    assert!(err.contains("another writer wrote"), "{err}");
}

/// (c) in file mode: the same writer, on the mounted ext4's device, over the blocks of
/// the file being rewritten; windows freeze, and the counters are read inside them. No
/// fsync'd block may revert.
#[test]
fn file_mode_a_writer_no_scan_sees_is_stopped_by_the_counter() {
    if !require(&["losetup", "python3", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = env.mounted("fblink", 64 << 20, "ext4");
    let file = m.dir.join("data");
    std::fs::write(&file, vec![7u8; 4 << 20]).unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    let (physical, len) = first_extent(&file);
    let count = (len / BLOCK).min(512);
    assert!(count >= 64, "the file's first extent is {len} bytes");
    let writer = start_writer_n(&env, "blink", &lo.path, physical, count);
    let args = ["rewrite", "--chunk-size", "64K", "--max-freeze", "300ms", "--force"];
    let out = output(env.reseq().env("RESEQ_FAULTS", "delay@after-write#*=5").args(args).arg(&file));
    let err = stderr(&out);
    let pid = writer.pid();
    assert_nothing_lost(writer, &lo.path, physical, &out, 1);
    // In a frozen window 4 KiB are left to the filesystem: a writer's first block there
    // may pass the counters and be caught by the read-back instead (exit 5, nothing
    // written over it); its next block trips the counters (exit 9).
    // The scan before the first window, or one between two, may also find it between its
    // open and its close (exit 3, refused, or exit 4, stopped, naming it: seen with the
    // host's CPUs all busy).
    match out.status.code() {
        Some(3 | 4) => assert!(err.contains(&format!("PID {pid}")) && err.contains("open for writing"), "{err}"),
        Some(9) => assert!(err.contains(&format!("another writer wrote {}", lo.path.display())), "{err}"),
        Some(5) => {
            assert!(err.contains("checksum mismatch") && err.contains("did not write this range again"), "{err}")
        }
        c => panic!("exit {c:?}: {err}"),
    }
    if matches!(out.status.code(), Some(3 | 4)) {
        return;
    }
    // status names what to check as device bytes (not the files' offsets laid end to
    // end): every range within the file's extent, where the writer wrote.
    let status = env.reseq().args(["status", "--json"]).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let notes: Vec<&str> = report["unfinished"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|u| u["at_risk"].as_array().unwrap())
        .map(|n| n.as_str().unwrap())
        .collect();
    // The counter can catch the write before reseq has written anything since its last
    // clean look (load run 2 of 5503d6c): then nothing of reseq's can have overwritten it,
    // the message says so, and no range is at risk. Otherwise exactly one note.
    let nothing =
        err.split_whitespace().collect::<Vec<_>>().join(" ").contains("reseq wrote nothing since its last look");
    assert_eq!(notes.len(), usize::from(!nothing), "{report}");
    if nothing {
        return;
    }
    let listed = notes[0].split("check device bytes ").nth(1).and_then(|t| t.split(" (").next()).unwrap();
    for r in listed.split(", ") {
        let (a, b) = r.split_once("..").map(|(a, b)| (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap())).unwrap();
        assert!(physical <= a && b <= physical + len, "{r} is not in the file's extent {physical}+{len}: {}", notes[0]);
    }
}

/// The device offset and length of a file's first extent (FS_IOC_FIEMAP).
fn first_extent(file: &Path) -> (u64, u64) {
    let py = format!(
        "import fcntl, os, struct\nfd = os.open('{}', os.O_RDONLY)\nb = bytearray(32 + 56)\nstruct.pack_into('<QQIIII', b, 0, 0, 2**64 - 1, 1, 0, 1, 0)\nfcntl.ioctl(fd, 0xC020660B, b)\nlogical, physical, length = struct.unpack_from('<QQQ', b, 32)\nprint(physical, length)\n",
        file.display()
    );
    let out = run_cmd(Command::new("python3").arg("-c").arg(py)).unwrap();
    let f: Vec<u64> = out.split_whitespace().map(|n| n.parse().unwrap()).collect();
    (f[0], f[1])
}

/// No false alarm: runs over mounted ext4 and xfs with files being written between
/// windows, in device mode and file mode, in many short windows, all exit 0.
#[test]
fn the_counter_check_never_trips_on_a_normal_run() {
    if !require(&["losetup", "mkfs.ext4", "mkfs.xfs"]) {
        return;
    }
    let env = TestEnv::new();
    for fs in ["ext4", "xfs"] {
        let (lo, m) = env.mounted(fs, 320 << 20, fs);
        let files = fill_files(&m.dir, 8, 2 << 20, 11);
        run_cmd(&mut Command::new("sync")).unwrap();
        let appender = Appender::start(&m.dir, &m.dir.join("log"), &env.path(&format!("{fs}-stop")));
        // Many windows; overruns on a busy host are not what this test is about.
        let small = ["--chunk-size", "256K", "--max-freeze", "300ms", "--max-overruns", "1000", "--force"];
        let device = output(env.reseq().args(["rewrite"]).args(small).arg(&lo.path));
        assert_eq!(device.status.code(), Some(0), "{fs}, device mode: {}", stderr(&device));
        let file_mode = output(env.reseq().args(["rewrite"]).args(small).arg(&m.dir));
        assert_eq!(file_mode.status.code(), Some(0), "{fs}, file mode: {}", stderr(&file_mode));
        assert!(appender.finish() > 0);
        assert_files_intact(&files);
        drop(m);
        fsck_clean(&lo.path, fs);
    }
}

/// A partition made by hand (BLKPG through `addpart`), with its node (no udev here);
/// removed, node and partition, on drop.
struct Partition {
    disk: PathBuf,
    node: PathBuf,
}

impl Partition {
    /// Partition 1 of `disk`, `len` bytes from `start`.
    fn add(disk: &Path, start: u64, len: u64) -> Partition {
        let d = disk.to_string_lossy();
        run_cmd(Command::new("addpart").args([&*d, "1", &(start / 512).to_string(), &(len / 512).to_string()]))
            .unwrap();
        let name = format!("{}p1", disk.file_name().unwrap().to_string_lossy());
        let p = Partition { disk: disk.to_path_buf(), node: PathBuf::from(format!("/dev/{name}")) };
        let dev = std::fs::read_to_string(format!("/sys/class/block/{name}/dev")).unwrap();
        if !p.node.exists() {
            let (maj, min) = dev.trim().split_once(':').unwrap();
            run_cmd(Command::new("mknod").arg(&p.node).args(["b", maj, min])).unwrap();
        }
        p
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.node);
        let _ = run_cmd(Command::new("delpart").arg(&self.disk).arg("1"));
    }
}

/// (d) A partition added mid-run (BLKPG succeeds on a disk reseq holds O_EXCL) over
/// bytes being rewritten, and written through its new node: the run stops (the shape
/// changed, exit 4, or the counter grew, exit 9), nothing fsync'd reverts.
#[test]
fn a_partition_added_mid_run_stops_it() {
    if !require(&["losetup", "python3", "addpart", "delpart", "mknod"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("part.img", 64 << 20, 6);
    let run = slow_rewrite(&env, &lo.path);
    std::thread::sleep(Duration::from_millis(300));
    let (start, len) = (32 << 20, 16 << 20);
    let part = Partition::add(&lo.path, start, len);
    let writer = start_writer(&env, "plain", &part.node, 0);
    let out = run.wait();
    let err = stderr(&out);
    assert_nothing_lost(writer, &lo.path, start, &out, 1);
    drop(part);
    let name = format!("{}p1", lo.name());
    match out.status.code() {
        Some(4) => assert!(err.contains("changed shape") && err.contains(&name), "{err}"),
        Some(9) => assert!(err.contains("another writer wrote"), "{err}"),
        c => panic!("exit {c:?}: {err}"),
    }
}

/// (e) The loop device's offset changed mid-run (LOOP_SET_STATUS64, as a program may do
/// on a loop device it did not set up): before, "I/O error: unexpected end of file";
/// now the run stops before its next write and says what changed (exit 4).
#[test]
fn a_loop_offset_changed_mid_run_stops_it() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("offset.img", 64 << 20, 7);
    let image = std::fs::read(&lo.image).unwrap();
    let run = slow_rewrite(&env, &lo.path);
    std::thread::sleep(Duration::from_millis(300));
    set_loop_offset(&lo.path, 1 << 20);
    let out = run.wait();
    let err = stderr(&out);
    set_loop_offset(&lo.path, 0);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("changed shape") && err.contains("offset 0") && err.contains("offset 1048576"), "{err}");
    // A write the loop driver held during the change lands at the new offset: the
    // message names it (the chunk written since the last look), and nothing else moved.
    let changed = changed_mib(&lo.image, &image);
    eprintln!("MiB of the image changed: {changed:?}");
    for mib in &changed {
        let (at, end) = ((mib - 1) << 20, mib << 20);
        assert!(err.contains(&format!("device bytes {at}..{end}")), "MiB {mib} of the image changed unnamed: {err}");
    }
}

/// The 1 MiB pieces of `image` that differ from `before`, numbered from 0.
fn changed_mib(image: &Path, before: &[u8]) -> Vec<u64> {
    let now = std::fs::read(image).unwrap();
    (0..before.len() / (1 << 20))
        .filter(|&i| now[i << 20..(i + 1) << 20] != before[i << 20..(i + 1) << 20])
        .map(|i| i as u64)
        .collect()
}

/// (e) The backing file shrunk and the loop's size re-read (`losetup -c`) mid-run.
#[test]
fn a_loop_resized_mid_run_stops_it() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("size.img", 64 << 20, 8);
    let run = slow_rewrite(&env, &lo.path);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::OpenOptions::new().write(true).open(&lo.image).unwrap().set_len(48 << 20).unwrap();
    run_cmd(Command::new("losetup").arg("-c").arg(&lo.path)).unwrap();
    let out = run.wait();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    // Shrinking the file is a write to it: the look for writers of the backing file may
    // see this test's descriptor before the loop's new size is read. Either stops it.
    let resized = err.contains("changed shape") && err.contains("size (sectors) was 131072, now 98304");
    let seen = err.contains("another writer") && err.contains("size.img open for writing");
    assert!(resized || seen, "{err}");
}

/// LOOP_GET_STATUS64, a new lo_offset (byte 24 of struct loop_info64), LOOP_SET_STATUS64.
fn set_loop_offset(dev: &Path, offset: u64) {
    let py = format!(
        "import fcntl, os, struct\nfd = os.open('{}', os.O_RDWR)\nb = bytearray(232)\nfcntl.ioctl(fd, 0x4C05, b)\nb[24:32] = struct.pack('<Q', {offset})\nfcntl.ioctl(fd, 0x4C04, bytes(b))\n",
        dev.display()
    );
    run_cmd(Command::new("python3").arg("-c").arg(py)).unwrap();
}

/// A file registered with an io_uring (IORING_REGISTER_FILES) stays writable through the
/// ring after its fd is closed: no fd shows it, the ring's fdinfo does (`UserFiles:`).
#[test]
fn a_file_registered_with_an_io_uring_is_refused() {
    if !require(&["losetup", "python3"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("uring.img", 16 << 20, 9);
    let stop = env.path("uring.stop");
    let py = "import ctypes, os, sys, time\nlibc = ctypes.CDLL(None, use_errno=True)\nparams = (ctypes.c_ubyte * 120)()\nring = libc.syscall(425, 4, params)\nfd = os.open(sys.argv[1], os.O_RDWR)\nfds = (ctypes.c_int * 1)(fd)\nok = libc.syscall(427, ring, 2, fds, 1)\nos.close(fd)\nprint(ring, ok, ctypes.get_errno(), flush=True)\nwhile not os.path.exists(sys.argv[2]):\n    time.sleep(0.05)\n";
    let mut child = Command::new("python3")
        .args(["-c", py])
        .arg(&lo.path)
        .arg(&stop)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _end = Defer(|| {
        let _ = std::fs::write(&stop, b"");
    });
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let f: Vec<i64> = line.split_whitespace().map(|n| n.parse().unwrap()).collect();
    if f[0] < 0 || f[1] < 0 {
        let _ = std::fs::write(&stop, b"");
        let _ = child.wait();
        skip(&format!("io_uring unavailable here (setup {}, register {}, errno {})", f[0], f[1], f[2]));
        return;
    }
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path));
    let _ = std::fs::write(&stop, b"");
    let _ = child.wait();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(&format!("PID {}", child.id())) && err.contains("registered with an io_uring"), "{err}");
}

/// A program whose memory the kernel swaps out: it stamps every 4 KiB page of `MIB` MiB
/// with the page's number and a round, and each round checks every page's stamp before
/// it writes the next, so a page that came back from swap older than it went out is
/// seen. Exits 1 naming the first such page, 0 when all held; `STOP.ready` once two
/// rounds are done (the cage holds it to a few MiB: it is swapping by then).
const PRESSURE: &str = r#"
import mmap, os, sys
size, stop = int(sys.argv[1]) << 20, sys.argv[2]
pages, m = size // 4096, mmap.mmap(-1, size)
def stamp(i, r):
    return (b'SWAPPAGE' + i.to_bytes(8, 'little') + r.to_bytes(8, 'little')) * 170
last, r, bad = [0] * pages, 0, []
while not bad:
    r += 1
    for i in range(pages):
        o = i * 4096
        if last[i] and m[o:o + 4080] != stamp(i, last[i]):
            bad.append('page %d of round %d came back as %r' % (i, last[i], m[o:o + 24]))
            break
        m[o:o + 4080] = stamp(i, r)
        last[i] = r
    if r == 2:
        open(stop + '.ready', 'w').close()
    if os.path.exists(stop):
        break
print('%d rounds of %d pages' % (r, pages), *bad)
sys.exit(1 if bad else 0)
"#;

/// A memory cgroup of the test's own (v2 `memory.max`, or v1's `memory.limit_in_bytes`),
/// removed with whatever still runs in it.
struct MemCage(PathBuf);

impl MemCage {
    fn new(name: &str, limit: u64) -> MemCage {
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let root = if v2 { PathBuf::from("/sys/fs/cgroup") } else { PathBuf::from("/sys/fs/cgroup/memory") };
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = root.join(format!("reseq-test-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let cage = MemCage(dir);
        let knob = if v2 { "memory.max" } else { "memory.limit_in_bytes" };
        std::fs::write(cage.0.join(knob), limit.to_string()).unwrap();
        cage
    }

    fn spawn(&self, cmd: &Command) -> std::process::Child {
        Command::new("sh")
            .arg("-c")
            .arg("echo $$ > \"$0/cgroup.procs\" && exec \"$@\"")
            .arg(&self.0)
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl Drop for MemCage {
    fn drop(&mut self) {
        for pid in std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default().lines() {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
        let t = Instant::now();
        while std::fs::remove_dir(&self.0).is_err() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Sectors written to a block device since boot (its stat's seventh field).
fn sectors_written(dev: &Path) -> u64 {
    let name = std::fs::canonicalize(dev).unwrap().file_name().unwrap().to_string_lossy().into_owned();
    let stat = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).unwrap();
    stat.split_whitespace().nth(6).unwrap().parse().unwrap()
}

/// A swap file, swapped off when dropped (before its filesystem is unmounted).
struct SwapOn(PathBuf);

impl Drop for SwapOn {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
    }
}

/// (issue 49, item 5) A swap file on the mounted target, turned on mid-run and swapped
/// to under memory pressure: the kernel writes swap straight to the device, whatever the
/// freeze, so a page reseq read before the swap wrote it and wrote back after would come
/// back old into a program's memory. The program checks every page it gets back; reseq
/// must stop (the swap named, or the counter's exit 9) with every page intact, and the
/// files and the filesystem as they were.
#[test]
fn a_swap_file_turned_on_mid_run_loses_no_page() {
    swap_turned_on_mid_run(false);
}

/// The same in file mode, the swap file one of the run's files when the run began.
#[test]
fn file_mode_a_member_turned_into_swap_mid_run_loses_no_page() {
    swap_turned_on_mid_run(true);
}

fn swap_turned_on_mid_run(file_mode: bool) {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze", "mkswap", "swapon", "swapoff", "python3"]) {
        return;
    }
    let _one = swap_lock();
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("swap-target", 128 << 20, "ext4");
    let files = fill_files(&mnt.dir, 4, 4 << 20, 21);
    let swap = mnt.dir.join("swapfile");
    // Written out (no holes: swapon refuses a sparse file), inactive at the start.
    let made = Command::new("sh")
        .arg("-c")
        .arg("dd if=/dev/zero of=\"$0\" bs=1M count=48 status=none && chmod 600 \"$0\" && mkswap -q \"$0\"")
        .arg(&swap)
        .status()
        .unwrap();
    assert!(made.success(), "making the swap file");
    let slow = ["rewrite", "--chunk-size", "1M", "--max-freeze", "300ms", "--pause", "50ms", "--max-overruns", "1000"];
    let mut cmd = env.reseq();
    cmd.args(slow).env("RESEQ_FAULTS", "delay@after-write#*=20");
    cmd.arg(if file_mode { &mnt.dir } else { &lo.path });
    let (run, go) = held_at(&env, &mut cmd, "after-thaw#1");
    let written_before = sectors_written(&lo.path);
    let on = Command::new("swapon").args(["-p", "32767"]).arg(&swap).output().unwrap();
    assert!(on.status.success(), "swapon: {}", String::from_utf8_lossy(&on.stderr));
    let swapped = SwapOn(swap.clone());
    let cage = MemCage::new("swap", 8 << 20);
    let script = env.path("pressure.py");
    std::fs::write(&script, PRESSURE).unwrap();
    let stop = env.path("pressure.stop");
    let mut press = Command::new("python3");
    press.arg(&script).arg("32").arg(&stop);
    let pressure = cage.spawn(&press);
    let ready = PathBuf::from(format!("{}.ready", stop.display()));
    let t = Instant::now();
    while !ready.exists() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(ready.exists(), "the program under pressure never finished two rounds");
    // Swapped out to the device, not kept in memory (zswap would): its counter says.
    let reached = (sectors_written(&lo.path) - written_before) * 512;
    assert!(reached >= 4 << 20, "only {reached} bytes reached the device: no swapping to test");
    let used = std::fs::read_to_string("/proc/swaps").unwrap();
    go();
    let out = run.wait();
    std::thread::sleep(Duration::from_secs(1));
    std::fs::write(&stop, b"").unwrap();
    let pressed = pressure.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&pressed.stdout).trim().to_string();
    let err = stderr(&out);
    eprintln!("reseq exit {:?}; under pressure: {said}; swaps:\n{used}", out.status.code());
    assert!(pressed.status.success(), "a page came back from swap older than it went out: {said}");
    drop(cage);
    drop(swapped);
    // Turned on between windows, it is found before the next (without that check the
    // counter stopped every run with exit 9, one naming a range written after its look).
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains(&format!("swap is active on {}", lo.path.display())), "{err}");
    assert!(err.contains(&swap.display().to_string()) && err.contains("--resume"), "{err}");
    assert_files_intact(&files);
    std::fs::remove_file(&swap).unwrap();
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}
