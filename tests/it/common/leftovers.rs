//! What an earlier test run left behind when it was killed before it could clean up
//! (SIGKILL, a session or CI job ended mid-run): mounts, loop devices, swaps and
//! processes under its `reseq-test-` directories.
//!
//! They are not harmless. An ext4 still mounted from a loop device over the file of a
//! dead `reseq sim serve` makes every later `mkfs.btrfs` on the machine fail ("cannot
//! check mount status of /dev/loopN: Transport endpoint is not connected"): it failed a
//! CI run once. So each `TestEnv` writes its owner (pid and start time) into its
//! directory, and the first `TestEnv` of a test process sweeps the directories whose
//! owner is gone, with their run directories on /dev/shm. A directory without an owner file may be one being made right now: it
//! is left alone, as is everything of a live owner (another test run beside this one).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use reseq::testing::{mounts, procs};

/// Not `.reseq-*` nor `*.tmp`: tests look for reseq's own temporary files by those names.
const OWNER: &str = "test-owner";

/// Marks `dir` as owned by process `pid` (the test process, or a stand-in in a test),
/// with the other directories to remove with it (the run dir on /dev/shm: the files in
/// that one are reseq's, and `reseq thaw` reads them all).
pub fn mark(dir: &Path, pid: u32, with: &[&Path]) {
    let start = procs::stat(pid as i32).expect("the owner of a test dir is alive").start_ticks;
    let mut text = format!("{pid} {start}\n");
    for w in with {
        text.push_str(&format!("{}\n", w.display()));
    }
    std::fs::write(dir.join(OWNER), text).expect("writing the test dir's owner");
}

/// When `dir` has an owner file and that process is gone: the directories to remove
/// with it.
fn stale(dir: &Path) -> Option<Vec<PathBuf>> {
    let owner = std::fs::read_to_string(dir.join(OWNER)).ok()?;
    let mut lines = owner.lines();
    let mut f = lines.next()?.split_whitespace().map(|s| s.parse::<u64>().ok());
    let (Some(Some(pid)), Some(Some(start))) = (f.next(), f.next()) else { return None };
    // Gone, or a zombie: a killed test process stays one where PID 1 does not reap.
    if procs::alive(pid as i32, start).is_some() {
        return None;
    }
    // Only a run dir of ours, whatever the file says (root removes what it names).
    let run_dir = |p: &PathBuf| {
        p.parent() == Some(Path::new("/dev/shm"))
            && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("reseq-test-run-"))
    };
    Some(lines.map(PathBuf::from).filter(|p| run_dir(p) || p.starts_with(dir)).collect())
}

/// The test directories of processes that are gone, each with those to remove with it.
fn stale_dirs() -> Vec<(PathBuf, Vec<PathBuf>)> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return Vec::new() };
    let tests = entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("reseq-test-"));
    tests.filter_map(|e| Some((e.path(), stale(&e.path())?))).collect()
}

/// Cleans up after every test process that is gone; returns one line per thing undone.
/// Order matters: processes (a guardian may hold a freeze), then swaps, then mounts
/// (latest first: the filesystem on the loop device before the FUSE mount under it), then
/// loop devices, then the files. The loop devices are found first: once the mount their
/// file is on is detached, sysfs names the file relative to that mount ("/disk").
pub fn sweep() -> Vec<String> {
    let mut done = Vec::new();
    for (dir, with) in stale_dirs() {
        // The run directory's too: an image in memory (`TestEnv::in_memory`).
        let loops: Vec<PathBuf> = std::iter::once(&dir).chain(&with).flat_map(|d| loops_under(d)).collect();
        done.extend(kill_processes_using(&dir));
        done.extend(swapoff_under(&dir, &loops));
        done.extend(unmount_under(&dir));
        done.extend(detach(&loops));
        for d in with.iter().chain([&dir]) {
            match std::fs::remove_dir_all(d) {
                Ok(()) => done.push(format!("removed {}", d.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => done.push(format!("could not remove {}: {e}", d.display())),
            }
        }
    }
    done
}

/// Sweeps once per test process and says what it undid on the real stderr (not the
/// test's captured output): a CI log should show it.
pub fn sweep_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let done = sweep();
        if !done.is_empty() {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "cleaned up after an earlier test run that was killed:");
            for line in done {
                let _ = writeln!(err, "  {line}");
            }
        }
    });
}

/// Whether `bytes` (a command line) names `dir` or a path in it: the name must end there
/// (`/`, a quote, a space, NUL or the end), so /tmp/reseq-test-a never matches
/// /tmp/reseq-test-ab.
pub fn mentions(bytes: &[u8], dir: &[u8]) -> bool {
    let ends = |i: usize| bytes.get(i).is_none_or(|c| b"/\0'\" ".contains(c));
    bytes.windows(dir.len()).enumerate().any(|(i, w)| w == dir && ends(i + dir.len()))
}

/// SIGKILLs the processes whose command line names `dir` (the dead run's reseq, sim
/// server, writer scripts), then waits up to 2 s for them to go: a reseq still writing
/// must be gone before its filesystem is thawed and unmounted. Not the environment or the
/// working directory: a shell's OLDPWD, or a shell left in the directory, is not ours.
fn kill_processes_using(dir: &Path) -> Vec<String> {
    let me = std::process::id() as i32;
    let needle = dir.as_os_str().as_encoded_bytes();
    let mut killed = Vec::new();
    for pid in procs::pids() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if pid != me && mentions(&cmdline, needle) {
            let Some(st) = procs::stat(pid) else { continue };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            killed.push((pid, st.start_ticks));
        }
    }
    let t = std::time::Instant::now();
    while killed.iter().any(|&(pid, ticks)| procs::alive(pid, ticks).is_some())
        && t.elapsed() < std::time::Duration::from_secs(2)
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    killed.iter().map(|(pid, _)| format!("killed process {pid}")).collect()
}

fn unmount_under(dir: &Path) -> Vec<String> {
    let mounts = mounts::read_mounts().unwrap_or_default();
    let points: Vec<PathBuf> = mounts.into_iter().map(|m| m.mount_point).filter(|m| m.starts_with(dir)).collect();
    let mut done = Vec::new();
    for m in points.iter().rev() {
        // A frozen filesystem stays frozen after a lazy unmount, out of reach.
        let _ = Command::new("fsfreeze").arg("-u").arg(m).output();
        let ok = Command::new("umount").arg("-l").arg(m).output().is_ok_and(|o| o.status.success());
        done.push(format!("{} {}", if ok { "unmounted" } else { "could not unmount" }, m.display()));
    }
    done
}

/// Loop devices whose backing file is under `dir`, as /dev/loopN.
fn loops_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(blocks) = std::fs::read_dir("/sys/block") else { return out };
    for b in blocks.flatten() {
        let Ok(backing) = std::fs::read_to_string(b.path().join("loop/backing_file")) else { continue };
        if Path::new(backing.trim_end()).starts_with(dir) {
            out.push(Path::new("/dev").join(b.file_name()));
        }
    }
    out
}

fn swapoff_under(dir: &Path, loops: &[PathBuf]) -> Vec<String> {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    let mut done = Vec::new();
    for dev in
        swaps.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(|d| PathBuf::from(mounts::unescape(d)))
    {
        if dev.starts_with(dir) || loops.contains(&dev) {
            let ok = Command::new("swapoff").arg(&dev).output().is_ok_and(|o| o.status.success());
            done.push(format!("{} {}", if ok { "swapped off" } else { "could not swap off" }, dev.display()));
        }
    }
    done
}

fn detach(loops: &[PathBuf]) -> Vec<String> {
    let mut done = Vec::new();
    for dev in loops {
        // Still busy (a lazily unmounted filesystem being released), -d sets autoclear.
        let ok = Command::new("losetup").arg("-d").arg(dev).output().is_ok_and(|o| o.status.success());
        done.push(format!("{} {}", if ok { "detached" } else { "could not detach" }, dev.display()));
    }
    done
}
