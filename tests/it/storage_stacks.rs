//! Storage stacks this host can build: btrfs (one device and two) and filesystems with
//! an external journal or log. Device mode must refuse them with the true reason and
//! write nothing. (LVM, dm-crypt, md and thin pools need a kernel with dm and md: the
//! VM tests under tests/vm/.)

use std::process::Command;

use crate::common::*;
use reseq::testing::scratch::{Mount, run_cmd};

const MIB: u64 = 1 << 20;

/// A refusal (exit 3) whose message holds every one of `says`, with nothing written to
/// any of `devices`.
fn assert_refused_untouched(env: &TestEnv, target: &std::path::Path, devices: &[&std::path::Path], says: &[&str]) {
    run_cmd(&mut Command::new("sync")).unwrap();
    let before: Vec<u64> = devices.iter().map(|d| bytes_written_to(d)).collect();
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(target));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    for s in says {
        assert!(err.contains(s), "the refusal should say {s:?}: {err}");
    }
    assert!(!err.contains("lazily unmounted"), "not the true reason: {err}");
    let after: Vec<u64> = devices.iter().map(|d| bytes_written_to(d)).collect();
    assert_eq!(before, after, "nothing may be written");
}

/// btrfs has an anonymous device number (`0:NN` in mountinfo): it is found by its
/// source and its member devices, and refused in device mode, naming btrfs and its
/// mount point, from either member of a two-device filesystem.
#[test]
fn a_mounted_btrfs_is_refused_in_device_mode_from_any_member() {
    if !require(&["losetup", "mkfs.btrfs"]) {
        return;
    }
    let env = TestEnv::new();
    let one = env.loop_device("one.img", 256 * MIB);
    let a = env.loop_device("a.img", 256 * MIB);
    let b = env.loop_device("b.img", 256 * MIB);
    run_cmd(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&one.path)).unwrap();
    run_cmd(Command::new("mkfs.btrfs").args(["-q", "-f", "-d", "raid1", "-m", "raid1"]).arg(&a.path).arg(&b.path))
        .unwrap();
    // The kernel learns of the second member by a device scan (udev would do it).
    run_cmd(Command::new("btrfs").args(["device", "scan"]).arg(&a.path).arg(&b.path)).unwrap();
    let m1 = Mount::new(&one.path, &env.path("one"), &[]).unwrap();
    let m2 = Mount::new(&a.path, &env.path("two"), &[]).unwrap();
    std::fs::write(m1.dir.join("f"), vec![3u8; 1 << 20]).unwrap();
    std::fs::write(m2.dir.join("f"), vec![4u8; 1 << 20]).unwrap();
    let at = |m: &Mount| format!("mounted at {}", m.dir.display());
    assert_refused_untouched(&env, &one.path, &[&one.path], &["holds btrfs", &at(&m1), "btrfs balance"]);
    assert_refused_untouched(&env, &a.path, &[&a.path, &b.path], &["holds btrfs", &at(&m2)]);
    // The member it was not mounted from: no mountinfo line names it.
    assert_refused_untouched(&env, &b.path, &[&a.path, &b.path], &["holds btrfs", &at(&m2)]);
    // The dry run refuses alike.
    let out = output(env.reseq().args(["rewrite", "--dry-run"]).arg(&b.path));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

/// An ext4 external journal and an xfs external log are held by their filesystem and
/// have no mountinfo line: the refusal names the filesystem that uses them.
#[test]
fn an_external_journal_or_log_is_refused_naming_its_filesystem() {
    if !require(&["losetup", "mkfs.ext4", "mkfs.xfs"]) {
        return;
    }
    let env = TestEnv::new();
    let journal = env.loop_device("journal.img", 64 * MIB);
    let data = env.loop_device("data.img", 128 * MIB);
    run_cmd(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", "-O", "journal_dev"]).arg(&journal.path))
        .unwrap();
    let jdev = format!("device={}", journal.path.display());
    run_cmd(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", "-J", &jdev]).arg(&data.path)).unwrap();
    let log = env.loop_device("log.img", 64 * MIB);
    let xdata = env.loop_device("xdata.img", 320 * MIB);
    let logdev = format!("logdev={}", log.path.display());
    run_cmd(Command::new("mkfs.xfs").args(["-q", "-f", "-l", &logdev]).arg(&xdata.path)).unwrap();
    let m = Mount::new(&data.path, &env.path("ext4"), &[]).unwrap();
    let x = Mount::new(&xdata.path, &env.path("xfs"), &[&logdev]).unwrap();
    std::fs::write(m.dir.join("f"), vec![5u8; 1 << 20]).unwrap();
    std::fs::write(x.dir.join("f"), vec![6u8; 1 << 20]).unwrap();
    let ext4 = format!("external journal of ext4 mounted at {}", m.dir.display());
    assert_refused_untouched(&env, &journal.path, &[&journal.path], &[&ext4]);
    let xfs = format!("external log of xfs mounted at {}", x.dir.display());
    assert_refused_untouched(&env, &log.path, &[&log.path], &[&xfs]);
    // Their filesystems' own devices are still rewritten as ever.
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--chunk-size", "1M"]).arg(&data.path));
    assert_eq!(r["outcome"]["status"], "success");
    drop(x);
    drop(m);
    fsck_clean(&data.path, "ext4");
}
