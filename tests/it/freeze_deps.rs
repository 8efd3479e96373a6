//! Freezes that wait on each other: a disk with two ext4 partitions, the second with its
//! external journal on a loop device over a file in the first. Freezing p1 first makes
//! p2's FIFREEZE sync its journal into the frozen p1 and wait there (D state) until p1
//! thaws: before the fix, p1 stayed frozen 76 s with the guardian stuck in that call.
//!
//! Checked from outside: a probe writes and fsyncs a file on p1 every 20 ms and thaws p1
//! and p2 itself (then fails the test) if one write waits longer than the bound plus 1 s,
//! so a failing test never leaves the machine frozen; a writer on p2 notes every record
//! it fsync'd; e2fsck after.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;

const MIB: u64 = 1 << 20;
const MAX_FREEZE: &str = "500ms";
/// `--max-freeze 500ms` plus its grace (500 ms).
const BOUND: Duration = Duration::from_millis(1000);

/// The disk, its partitions, p1 mounted, the journal loop over a file on p1, p2 mounted
/// with that journal. Dropped in reverse: p2, the journal loop, p1, the partitions, the
/// disk.
struct Stack {
    p2: Option<Mount>,
    journal: Option<LoopDevice>,
    /// With a stacked journal: the loop over the file, below `journal`.
    journal_base: Option<LoopDevice>,
    p1: Option<Mount>,
    parts: Vec<PathBuf>,
    disk: LoopDevice,
}

impl Stack {
    /// `stacked`: the journal is a loop over a loop over the file on p1.
    fn new(env: &TestEnv, stacked: bool) -> Stack {
        let disk = env.loop_device("disk.img", 160 * MIB);
        let table = "label: dos\n,64M\n,64M\n";
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, table.as_bytes()).unwrap();
        std::io::Seek::rewind(&mut f).unwrap();
        run_cmd(Command::new("sfdisk").arg("--quiet").arg(&disk.path).stdin(f)).unwrap();
        let mut s = Stack { p2: None, journal: None, journal_base: None, p1: None, parts: Vec::new(), disk };
        let _ = Command::new("partx").arg("-a").arg(&s.disk.path).output();
        for i in 1..=2 {
            let name = format!("{}p{i}", s.disk.name());
            let dev = std::fs::read_to_string(format!("/sys/class/block/{name}/dev")).expect("partition in sysfs");
            let (maj, min) = dev.trim().split_once(':').unwrap();
            let node = PathBuf::from(format!("/dev/{name}"));
            if !is_block_device(&node) {
                let _ = std::fs::remove_file(&node);
                run_cmd(Command::new("mknod").arg(&node).args(["b", maj, min])).unwrap();
            }
            s.parts.push(node);
        }
        mkfs_ext4(&s.parts[0]).unwrap();
        s.p1 = Some(Mount::new(&s.parts[0], &env.path("p1"), &[]).unwrap());
        let mut journal = LoopDevice::create(&env.path("p1").join("journal.img"), 8 * MIB).unwrap();
        if stacked {
            let above = LoopDevice::attach(&journal.path, &[]).unwrap();
            s.journal_base = Some(std::mem::replace(&mut journal, above));
        }
        run_cmd(Command::new("mke2fs").args(["-q", "-F", "-O", "journal_dev", "-b", "4096"]).arg(&journal.path))
            .unwrap();
        let jdev = format!("device={}", journal.path.display());
        run_cmd(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-b", "4096", "-E", "lazy_itable_init=0,lazy_journal_init=0", "-J", &jdev])
                .arg(&s.parts[1]),
        )
        .unwrap();
        s.journal = Some(journal);
        s.p2 = Some(Mount::new(&s.parts[1], &env.path("p2"), &[]).unwrap());
        s
    }

    fn p1(&self) -> &Path {
        &self.p1.as_ref().unwrap().dir
    }

    fn p2(&self) -> &Path {
        &self.p2.as_ref().unwrap().dir
    }

    /// Unmounts all and checks both filesystems.
    fn fsck(mut self) {
        self.p2.take().unwrap().unmount().unwrap();
        let journal = self.journal.take().unwrap();
        run_cmd(Command::new("e2fsck").args(["-f", "-n", "-j"]).arg(&journal.path).arg(&self.parts[1])).unwrap();
        drop(journal);
        self.journal_base.take();
        self.p1.take().unwrap().unmount().unwrap();
        run_cmd(Command::new("e2fsck").args(["-f", "-n"]).arg(&self.parts[0])).unwrap();
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for m in [&self.p2, &self.p1].into_iter().flatten() {
            let _ = Command::new("fsfreeze").arg("-u").arg(&m.dir).output();
        }
        self.p2.take();
        self.journal.take();
        self.journal_base.take();
        self.p1.take();
        for n in &self.parts {
            let _ = std::fs::remove_file(n);
        }
        let _ = Command::new("partx").arg("-d").arg(&self.disk.path).output();
    }
}

/// Writes and fsyncs a file on `mount` every 20 ms and keeps the longest wait; a wait
/// longer than `limit` makes it thaw `thaw` itself (the test then fails).
struct Watchdog {
    stop: Arc<AtomicBool>,
    worst_us: Arc<AtomicU64>,
    thawed: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(mount: &Path, limit: Duration, thaw: Vec<PathBuf>) -> Watchdog {
        let (stop, worst_us, thawed) =
            (Arc::<AtomicBool>::default(), Arc::<AtomicU64>::default(), Arc::<AtomicBool>::default());
        let since_us = Arc::new(AtomicU64::new(0));
        let epoch = Instant::now();
        let (s, w, b, file) = (Arc::clone(&stop), worst_us.clone(), since_us.clone(), mount.join("probe"));
        let probe = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                b.store(epoch.elapsed().as_micros() as u64 + 1, Ordering::SeqCst);
                let t = Instant::now();
                if let Ok(mut f) = std::fs::File::create(&file) {
                    let _ = std::io::Write::write_all(&mut f, b"probe");
                    let _ = f.sync_all();
                }
                b.store(0, Ordering::SeqCst);
                w.fetch_max(t.elapsed().as_micros() as u64, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let (s, t) = (Arc::clone(&stop), thawed.clone());
        let dog = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let began = since_us.load(Ordering::SeqCst);
                if began > 0 && epoch.elapsed() > Duration::from_micros(began - 1) + limit {
                    for m in &thaw {
                        let _ = Command::new("fsfreeze").arg("-u").arg(m).output();
                    }
                    t.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Watchdog { stop, worst_us, thawed, threads: vec![probe, dog] }
    }

    /// Stops both threads; the longest wait, and whether the watchdog had to thaw.
    fn finish(mut self) -> (Duration, bool) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        (Duration::from_micros(self.worst_us.load(Ordering::SeqCst)), self.thawed.load(Ordering::SeqCst))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn requirements() -> bool {
    require(&["losetup", "sfdisk", "partx", "mkfs.ext4", "mke2fs", "e2fsck", "fsfreeze", "mkswap", "swapon"])
}

/// The dependent p2 is frozen first, the run completes, and p1 never waits beyond the
/// bound; every record p2's writer fsync'd is there.
#[test]
fn an_external_journal_on_a_sibling_is_frozen_first() {
    if !requirements() {
        return;
    }
    let env = TestEnv::new();
    let stack = Stack::new(&env, false);
    let files = fill_files(stack.p1(), 3, 2 << 20, 41);
    // Swap on a loop over a file on p1: swap-outs would wait for each window (a warning).
    let swap = LoopDevice::create(&stack.p1().join("swap.img"), 16 * MIB).unwrap();
    let _swap = swap_lock();
    run_cmd(Command::new("mkswap").arg(&swap.path)).unwrap();
    run_cmd(Command::new("swapon").arg(&swap.path)).unwrap();
    let swapoff = Defer(|| drop(Command::new("swapoff").arg(&swap.path).output()));
    let plan = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&stack.disk.path));
    drop(swapoff);
    drop(swap);
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(text.contains("warning: swap on /dev/loop") && text.contains("swap.img, on "), "{text}");
    let order = format!("freeze order: {} before {}: its external journal", stack.p2().display(), stack.p1().display());
    assert!(text.contains(&order), "{text}");
    let (p1, p2) = (stack.p1().display().to_string(), stack.p2().display().to_string());
    assert!(text.find(&format!("freeze: {p2}")) < text.find(&format!("freeze: {p1}")), "{text}");

    let writer = FsyncWriter::start(stack.p2(), &stack.p2().join("log"), &env.path("ack"), &env.path("stop"));
    let dog = Watchdog::start(stack.p1(), BOUND + Duration::from_secs(1), vec![stack.p1().into(), stack.p2().into()]);
    std::thread::sleep(Duration::from_millis(200));
    let out = output(env.reseq().args(["rewrite", "--json", "--max-freeze", MAX_FREEZE]).arg(&stack.disk.path));
    let (worst, thawed) = dog.finish();
    let acked = writer.finish();
    assert!(!thawed, "p1 stayed frozen beyond the bound plus 1 s: the test thawed it");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(worst < BOUND + Duration::from_secs(1), "p1 waited {worst:?}");
    assert!(acked > 0, "the writer on p2 made no progress");
    let r = json_report(&out);
    assert_eq!(r["results"]["windows_overrun"].as_u64(), Some(0), "{r}");
    assert_files_intact(&files);
    stack.fsck();
}

/// The journal through a loop stacked on the loop over p1's file (a loop over a block
/// device has no `slaves/`): the order still follows it down to p1.
#[test]
fn a_journal_through_a_stacked_loop_is_followed() {
    if !requirements() {
        return;
    }
    let env = TestEnv::new();
    let stack = Stack::new(&env, true);
    let plan = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&stack.disk.path));
    let text = String::from_utf8_lossy(&plan.stdout);
    let order = format!("freeze order: {} before {}", stack.p2().display(), stack.p1().display());
    assert!(text.contains(&order) && text.contains("journal.img"), "{text}");
    let out = output(env.reseq().args(["rewrite", "--json", "--max-freeze", MAX_FREEZE]).arg(&stack.disk.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stack.fsck();
}

/// While p2's freeze waits on p1: nothing done to the processes, reseq killed (as
/// `timeout` does), the guardian killed, the guardian stopped.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Strike {
    None,
    KillReseq,
    KillGuardian,
    StopGuardian,
}

/// Frozen in the wrong order (the `mount-order` fault: p1 first), p2's FIFREEZE waits on
/// p1: the guardian gives it up at the bound, thaws p1 in time, and thaws p2 itself when
/// its late freeze returns; reseq stops with exit 7 and says why. Also when reseq is
/// killed meanwhile; and when the guardian is killed or stopped, reseq thaws p1, then p2.
#[test]
fn a_freeze_that_waits_on_another_is_given_up_at_the_bound() {
    if !requirements() {
        return;
    }
    for strike in [Strike::None, Strike::KillReseq, Strike::KillGuardian, Strike::StopGuardian] {
        let env = TestEnv::new();
        let stack = Stack::new(&env, false);
        let writer = FsyncWriter::start(stack.p2(), &stack.p2().join("log"), &env.path("ack"), &env.path("stop"));
        let both = vec![stack.p1().to_path_buf(), stack.p2().to_path_buf()];
        let dog = Watchdog::start(stack.p1(), BOUND + Duration::from_secs(1), both);
        std::thread::sleep(Duration::from_millis(200));
        let mut cmd = env.reseq();
        cmd.env("RESEQ_FAULTS", "mount-order").args(["rewrite", "--max-freeze", MAX_FREEZE]).arg(&stack.disk.path);
        let run = Running::captured(&mut cmd);
        let stopped = std::cell::Cell::new(None);
        let _cont = Defer(|| {
            if let Some(pid) = stopped.get() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGCONT);
            }
        });
        if strike != Strike::None {
            // While the guardian waits on p2's freeze.
            let t = Instant::now();
            while !std::fs::read_dir(env.run_dir()).is_ok_and(|mut d| d.next().is_some()) {
                assert!(t.elapsed() < Duration::from_secs(20), "no freeze began");
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(300));
            let guardian = guardian_of(run.pid() as u32).expect("a guardian");
            match strike {
                Strike::KillReseq => sigkill(run.pid()),
                Strike::KillGuardian => sigkill(guardian),
                _ => {
                    stopped.set(Some(guardian));
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(guardian), nix::sys::signal::Signal::SIGSTOP);
                }
            }
        }
        let out = run.wait();
        // p2's late freeze returned once p1 thawed: the guardian thawed it, and left.
        let t = Instant::now();
        // A killed guardian's record stays for `reseq thaw` (below).
        let record_goes = !matches!(strike, Strike::KillGuardian | Strike::StopGuardian);
        while is_frozen(stack.p2())
            || (record_goes && std::fs::read_dir(env.run_dir()).is_ok_and(|mut d| d.next().is_some()))
        {
            assert!(t.elapsed() < Duration::from_secs(10), "{strike:?}: p2 frozen, or its freeze record left, 10 s on");
            std::thread::sleep(Duration::from_millis(50));
        }
        let (worst, thawed) = dog.finish();
        let acked = writer.finish();
        assert!(!thawed, "{strike:?}: p1 stayed frozen beyond the bound plus 1 s: the test thawed it");
        assert!(worst < BOUND + Duration::from_secs(1), "{strike:?}: p1 waited {worst:?}");
        assert!(acked > 0);
        if matches!(strike, Strike::KillGuardian | Strike::StopGuardian) {
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(4), "{strike:?}: {err}");
            assert!(err.contains("reseq thawed directly"), "{strike:?}: {err}");
        }
        if strike == Strike::None {
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(7), "{err}");
            assert!(err.contains(&format!("freezing {}", stack.p2().display())), "{err}");
            assert!(err.contains("did not finish within"), "{err}");
            assert_eq!(journal_done(&env.state_dir(), &stack.disk), 0, "nothing is written in that window");
        }
        stack.fsck();
    }
}
