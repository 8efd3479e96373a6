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

/// Device mode on a mounted btrfs (found by its source and member devices: its
/// superblock's number is anonymous, `0:NN` in mountinfo), from the member it was
/// mounted from and from the other: what the device tree allocates on that member (and
/// its first MiB) is rewritten, frozen, and nothing else; the files, `btrfs scrub` and
/// `btrfs check --readonly` stay clean. RAID5 is refused, nothing written.
#[test]
fn a_mounted_btrfs_in_device_mode_rewrites_what_each_member_allocates() {
    if !require(&["losetup", "mkfs.btrfs", "btrfs"]) {
        return;
    }
    let env = TestEnv::new();
    let a = env.loop_device("a.img", 256 * MIB);
    let b = env.loop_device("b.img", 256 * MIB);
    run_cmd(Command::new("mkfs.btrfs").args(["-q", "-f", "-d", "raid1", "-m", "raid1"]).arg(&a.path).arg(&b.path))
        .unwrap();
    // The kernel learns of the second member by a device scan (udev would do it).
    run_cmd(Command::new("btrfs").args(["device", "scan"]).arg(&a.path).arg(&b.path)).unwrap();
    let m = Mount::new(&a.path, &env.path("two"), &[]).unwrap();
    let f = m.dir.join("f");
    let mut data = vec![0u8; 12 << 20];
    XorShift::new(21).fill(&mut data);
    std::fs::write(&f, &data).unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    for member in [&b, &a] {
        let allocated = allocated_on(member);
        let before = bytes_written_to(&member.path);
        let r = json_ok(env.reseq().args(["rewrite", "--json", "--chunk-size", "1M", "--no-trim"]).arg(&member.path));
        // What btrfs allocated but never wrote is a hole of the image: left out, counted.
        let written = r["results"]["bytes_written"].as_u64().unwrap();
        let holes = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
        assert_eq!(written + holes, allocated, "{}", member.path.display());
        assert!(written >= 12 * MIB, "the file's data at least: {written}");
        let w = bytes_written_to(&member.path) - before;
        assert!(w >= written && w <= allocated * 3 / 2, "{w} written, {allocated} allocated");
    }
    let out = output(env.reseq().args(["rewrite", "--include-free"]).arg(&b.path));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("--include-free is not supported"), "{}", stderr(&out));
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert_eq!(hash_path(&f).unwrap(), blake3::hash(&data));
    let scrub = Command::new("btrfs").args(["scrub", "start", "-B"]).arg(&m.dir).output().unwrap();
    assert!(scrub.status.success() && String::from_utf8_lossy(&scrub.stdout).contains("no errors found"));
    drop(m);
    let check = Command::new("btrfs").args(["check", "--readonly"]).arg(&a.path).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    // RAID5: refused from a member, nothing written.
    let r5: Vec<LoopDevice> = (0..3).map(|i| env.loop_device(&format!("r5-{i}.img"), 256 * MIB)).collect();
    let mut mkfs = Command::new("mkfs.btrfs");
    mkfs.args(["-q", "-f", "-d", "raid5", "-m", "raid1"]);
    for d in &r5 {
        mkfs.arg(&d.path);
    }
    run_cmd(&mut mkfs).unwrap();
    let mut scan = Command::new("btrfs");
    scan.args(["device", "scan"]);
    for d in &r5 {
        scan.arg(&d.path);
    }
    run_cmd(&mut scan).unwrap();
    let m5 = Mount::new(&r5[0].path, &env.path("r5"), &[]).unwrap();
    std::fs::write(m5.dir.join("f"), vec![4u8; 1 << 20]).unwrap();
    let paths: Vec<&std::path::Path> = r5.iter().map(|d| d.path.as_path()).collect();
    assert_refused_untouched(&env, &r5[1].path, &paths, &["holds btrfs", "RAID5", "parity"]);
}

/// What the device tree allocates on `dev`, plus the first MiB btrfs reserves.
fn allocated_on(dev: &LoopDevice) -> u64 {
    let out = Command::new("btrfs").args(["inspect-internal", "dump-tree", "-t", "4"]).arg(&dev.path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let devid = String::from_utf8_lossy(
        &Command::new("btrfs").args(["inspect-internal", "dump-super"]).arg(&dev.path).output().unwrap().stdout,
    )
    .lines()
    .find_map(|l| l.trim().strip_prefix("dev_item.devid").map(|v| v.trim().parse::<u64>().unwrap()))
    .unwrap();
    let mut total = MIB;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.contains(&format!("key ({devid} DEV_EXTENT")) {
            let len = lines.by_ref().find_map(|l| l.split("length ").nth(1)).unwrap();
            total += len.trim().parse::<u64>().unwrap();
        }
    }
    total
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
