//! File mode on a mounted btrfs, on loop devices: every copy of every extent rewritten
//! in place (single, DUP, RAID1), shared extents once, inline files left alone, RAID5
//! refused, a balance stopping the run, a kill and `--resume`. After every run: the
//! files' bytes unchanged, `btrfs scrub` clean, `btrfs check --readonly` clean after
//! unmount, and each device written about as much as the plan said (the same places
//! rewritten, not a relocation).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;

const MIB: u64 = 1 << 20;

fn tools() -> bool {
    require(&["losetup", "mkfs.btrfs", "btrfs", "chattr", "cp"])
}

/// A btrfs over `devs` made with `args`, mounted at `env/name`.
fn btrfs(env: &TestEnv, devs: &[&LoopDevice], args: &[&str], name: &str) -> Mount {
    let mut mkfs = Command::new("mkfs.btrfs");
    mkfs.args(["-q", "-f"]).args(args);
    for d in devs {
        mkfs.arg(&d.path);
    }
    run_cmd(&mut mkfs).unwrap();
    if devs.len() > 1 {
        // The kernel learns of the other members by a device scan (udev would do it).
        let mut scan = Command::new("btrfs");
        scan.args(["device", "scan"]);
        for d in devs {
            scan.arg(&d.path);
        }
        run_cmd(&mut scan).unwrap();
    }
    Mount::new(&devs[0].path, &env.path(name), &[]).unwrap()
}

/// `size` random bytes in a new file; `nocow`: made `nodatacow` first (`chattr +C` on
/// the empty file), as databases keep their files on btrfs.
fn file(path: &Path, size: usize, seed: u64, nocow: bool) -> (PathBuf, blake3::Hash) {
    std::fs::File::create(path).unwrap();
    if nocow {
        run_cmd(Command::new("chattr").arg("+C").arg(path)).unwrap();
    }
    let mut data = vec![0u8; size];
    XorShift::new(seed).fill(&mut data);
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    std::io::Write::write_all(&mut f, &data).unwrap();
    f.sync_all().unwrap();
    (path.to_path_buf(), blake3::hash(&data))
}

fn drop_caches() {
    run_cmd(&mut Command::new("sync")).unwrap();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

/// `btrfs scrub start -B`: every copy read and checked against its checksum.
fn scrub_clean(mnt: &Path) {
    let out = Command::new("btrfs").args(["scrub", "start", "-B"]).arg(mnt).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("no errors found"), "scrub found errors: {text}");
}

/// `btrfs check --readonly` of an unmounted member.
fn check_clean(dev: &Path) {
    let out = Command::new("btrfs").args(["check", "--readonly"]).arg(dev).output().unwrap();
    assert!(
        out.status.success(),
        "btrfs check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn rewrite(env: &TestEnv, targets: &[&Path]) -> Command {
    rewrite_in(env, targets, "1M")
}

fn rewrite_in(env: &TestEnv, targets: &[&Path], chunk: &str) -> Command {
    let mut c = env.reseq();
    c.args(["rewrite", "--json", "--chunk-size", chunk]);
    for t in targets {
        c.arg(t);
    }
    c
}

/// Between `want` and 1.5 x `want` bytes written to `dev` since `before`.
fn written_about(dev: &LoopDevice, before: u64, want: u64) {
    let w = bytes_written_to(&dev.path) - before;
    assert!(w >= want && w <= want * 3 / 2, "{} took {w} bytes written, the plan {want}", dev.path.display());
}

/// Single device (data single, metadata DUP): a nodatacow file and a checksummed one
/// rewritten in place; a reflinked copy and a snapshot share their extents and are
/// rewritten once; an inline file is left alone.
#[test]
fn single_device_nodatacow_checksummed_reflink_snapshot_inline() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("one.img", 256 * MIB);
    let m = btrfs(&env, &[&lo], &[], "one");
    let db = file(&m.dir.join("db"), 6 << 20, 1, true);
    let sum = file(&m.dir.join("sum"), 4 << 20, 2, false);
    let small = file(&m.dir.join("small"), 300, 3, false);
    run_cmd(Command::new("cp").arg("--reflink=always").arg(&sum.0).arg(m.dir.join("sum.reflink"))).unwrap();
    run_cmd(Command::new("btrfs").args(["subvolume", "snapshot"]).arg(&m.dir).arg(m.dir.join("snap"))).unwrap();
    drop_caches();
    let before = bytes_written_to(&lo.path);
    let r = json_ok(&mut rewrite(&env, &[&m.dir, &m.dir.join("snap")]));
    written_about(&lo, before, 10 << 20);
    assert_eq!(r["results"]["bytes_written"], 10 << 20, "each shared extent once");
    let files = r["files"].as_array().unwrap();
    let of = |name: &str| files.iter().find(|f| f["path"].as_str().unwrap().ends_with(name)).unwrap().clone();
    assert_eq!(of("/db")["bytes_rewritten"], 6 << 20);
    assert_eq!(of("/sum.reflink")["bytes_skipped_shared"], 4 << 20);
    assert_eq!(of("snap/db")["bytes_skipped_shared"], 6 << 20);
    assert!(of("/small")["skipped_reason"].as_str().unwrap().contains("INLINE"));
    drop_caches();
    for (p, h) in [&db, &sum, &small] {
        assert_eq!(hash_path(p).unwrap(), *h, "{}", p.display());
    }
    assert_eq!(hash_path(&m.dir.join("snap/db")).unwrap(), db.1);
    // Reading the files (scan --by-file, --bench, estimate, --only-slow) works on btrfs
    // too: its files read directly at its sector size, which statx does not report.
    // In JSON: the text lists only the slow files, which a busy host decides.
    let scan = json_ok(env.reseq().args(["scan", "--by-file", "--json"]).arg(&m.dir));
    let scanned = scan["scan_files"]["files"].as_array().unwrap_or_else(|| panic!("{scan}"));
    let db_read =
        scanned.iter().find(|f| f["path"].as_str().unwrap().ends_with("/db")).unwrap_or_else(|| panic!("{scan}"));
    assert!(db_read["bytes_per_second"].as_f64().unwrap() > 0.0, "{db_read}");
    let e = json_ok(env.reseq().arg("estimate").arg(&m.dir).args(["--json", "--sample", "4M"]));
    let sampled = e["estimate_files"]["sample_bytes"].as_u64().unwrap_or_else(|| panic!("{e}"));
    assert!(sampled > 0 && e["estimate_files"]["advice"].is_string(), "{e}");
    // Selections: --only-slow reads every file first (or refuses, when the host is too
    // busy for its rounds to agree: a loaded CI host does that to files this small);
    // --older-than 1d finds all of them new (written just now), so it plans nothing.
    let out = output(rewrite(&env, &[&m.dir]).args(["--dry-run", "-v", "--only-slow"]));
    match out.status.code() {
        Some(0) => assert!(json_report(&out)["plan"]["files"].is_array(), "{}", stderr(&out)),
        Some(3) => {
            assert!(stderr(&out).contains("--only-slow cannot tell which files read slowly"), "{}", stderr(&out))
        }
        c => panic!("--only-slow --dry-run exit {c:?}: {}", stderr(&out)),
    }
    let old = json_ok(rewrite(&env, &[&m.dir]).args(["--dry-run", "--older-than", "1d"]));
    let chosen: u64 =
        old["plan"]["files"].as_array().unwrap().iter().map(|f| f["bytes_to_rewrite"].as_u64().unwrap()).sum();
    assert_eq!(chosen, 0, "{}", old["plan"]);
    scrub_clean(&m.dir);
    m.unmount().unwrap();
    check_clean(&lo.path);
}

/// The offset of the first 4 KiB block of `dev` that holds `needle`.
fn find_block(dev: &Path, needle: &[u8]) -> u64 {
    let data = std::fs::read(dev).unwrap();
    (0..data.len() / 4096).map(|i| i * 4096).find(|&at| &data[at..at + needle.len()] == needle).unwrap() as u64
}

/// RAID1 over two devices: both mirrors rewritten, each on its device; a mirror that
/// differs is reported and left as it was.
#[test]
fn raid1_rewrites_both_mirrors_and_reports_a_differing_one() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let (a, b) = (env.loop_device("a.img", 256 * MIB), env.loop_device("b.img", 256 * MIB));
    let m = btrfs(&env, &[&a, &b], &["-d", "raid1", "-m", "raid1"], "r1");
    let db = file(&m.dir.join("db"), 6 << 20, 4, true);
    let sum = file(&m.dir.join("sum"), 4 << 20, 5, false);
    let odd = file(&m.dir.join("odd"), 1 << 20, 6, true);
    drop_caches();
    // One block of the nodatacow file (no checksum) differs on b: a finding, not a fix.
    let head = std::fs::read(&odd.0).unwrap()[..4096].to_vec();
    let on_b = find_block(&b.path, &head);
    let zeros = AlignedZeros::new();
    direct_write_block(&b.path, on_b, zeros.as_slice());
    let (a0, b0) = (bytes_written_to(&a.path), bytes_written_to(&b.path));
    // The dry run plans and predicts both copies, each on its device.
    let text = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&m.dir));
    let text = String::from_utf8_lossy(&text.stdout).replace('\n', " ");
    assert!(text.contains("btrfs data RAID1") && text.contains("2 copies of each byte"), "{text}");
    let dry = json_ok(rewrite(&env, &[&m.dir]).arg("--dry-run"));
    assert_eq!(dry["prediction"]["bytes_written"], 22 << 20, "{}", dry["prediction"]);
    let planned: u64 =
        dry["plan"]["files"].as_array().unwrap().iter().map(|f| f["bytes_to_rewrite"].as_u64().unwrap()).sum();
    assert_eq!(planned, 22 << 20, "{}", dry["plan"]);
    let r = json_ok(&mut rewrite(&env, &[&m.dir]));
    written_about(&a, a0, 11 << 20);
    written_about(&b, b0, 11 << 20);
    assert_eq!(r["results"]["bytes_written"], 22 << 20, "both copies");
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("differs from"), "{warnings}");
    drop_caches();
    assert_eq!(std::fs::read(&b.path).unwrap()[on_b as usize..][..4096], zeros.as_slice()[..], "left as it was");
    assert_eq!(find_block(&a.path, &head) % 4096, 0, "a keeps its copy");
    for (p, h) in [&db, &sum] {
        assert_eq!(hash_path(p).unwrap(), *h, "{}", p.display());
    }
    scrub_clean(&m.dir);
    m.unmount().unwrap();
    check_clean(&a.path);
}

/// 4 KiB of zeros, aligned for O_DIRECT.
struct AlignedZeros(Vec<u8>, usize);

impl AlignedZeros {
    fn new() -> AlignedZeros {
        let v = vec![0u8; 8192];
        let skip = v.as_ptr().align_offset(4096);
        AlignedZeros(v, skip)
    }
    fn as_slice(&self) -> &[u8] {
        &self.0[self.1..self.1 + 4096]
    }
}

fn direct_write_block(dev: &Path, at: u64, data: &[u8]) {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new().write(true).custom_flags(nix::libc::O_DIRECT).open(dev).unwrap();
    f.write_all_at(data, at).unwrap();
    f.sync_all().unwrap();
}

/// DUP data on one device: both copies rewritten, on the same device.
#[test]
fn dup_rewrites_both_copies_on_one_device() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("dup.img", 256 * MIB);
    let m = btrfs(&env, &[&lo], &["-d", "dup", "-m", "dup"], "dup");
    let db = file(&m.dir.join("db"), (5 << 20) + 8192, 7, true);
    let sum = file(&m.dir.join("sum"), 3 << 20, 8, false);
    drop_caches();
    let before = bytes_written_to(&lo.path);
    let r = json_ok(&mut rewrite(&env, &[&m.dir]));
    let want = 2 * ((5 << 20) + 8192 + (3 << 20));
    written_about(&lo, before, want);
    assert_eq!(r["results"]["bytes_written"], want);
    assert!(!r["warnings"].to_string().contains("differs"), "{}", r["warnings"]);
    drop_caches();
    for (p, h) in [&db, &sum] {
        assert_eq!(hash_path(p).unwrap(), *h, "{}", p.display());
    }
    scrub_clean(&m.dir);
    m.unmount().unwrap();
    check_clean(&lo.path);
}

/// RAID5 keeps parity over its devices' stripes: refused, nothing written.
#[test]
fn raid5_is_refused() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let devs: Vec<LoopDevice> = (0..3).map(|i| env.loop_device(&format!("r5-{i}.img"), 256 * MIB)).collect();
    let m = btrfs(&env, &devs.iter().collect::<Vec<_>>(), &["-d", "raid5", "-m", "raid1"], "r5");
    let f = file(&m.dir.join("f"), 1 << 20, 9, false);
    drop_caches();
    let before = settled_written(&devs);
    let out = output(&mut rewrite(&env, &[&m.dir]));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("RAID5") && stderr(&out).contains("parity"), "{}", stderr(&out));
    // A rewrite of the file would put 256 KiB or more on each member; a commit of
    // btrfs's own (seen once under load: 8, 72 and 72 KiB) is not the run's.
    for (d, b) in devs.iter().zip(before) {
        let w = bytes_written_to(&d.path) - b;
        assert!(w < 128 << 10, "{} written: {w}", d.path.display());
    }
    assert_eq!(blake3::hash(&std::fs::read(&f.0).unwrap()), f.1, "the file changed");
}

/// The members' write counters once they stay put for a second (a fresh btrfs does
/// work of its own in the background), at most ten seconds.
fn settled_written(devs: &[LoopDevice]) -> Vec<u64> {
    let now = || devs.iter().map(|d| bytes_written_to(&d.path)).collect::<Vec<u64>>();
    let mut last = now();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_secs(1));
        let next = now();
        if next == last {
            break;
        }
        last = next;
    }
    last
}

/// A balance started mid-run moves the very extents being rewritten. It holds a write
/// reference on the mount while it runs, so the next window's freeze waits for it to
/// end (measured: FIFREEZE returned when the balance did), and that window maps the
/// files and reads the chunk tree again, frozen: it rewrites the extents where the
/// balance put them. (A balance still running when a window starts refuses the run.)
#[test]
fn a_balance_started_mid_run_leaves_the_data_intact() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("bal.img", 512 * MIB);
    let m = btrfs(&env, &[&lo], &[], "bal");
    let db = file(&m.dir.join("db"), 16 << 20, 10, true);
    let bulk = file(&m.dir.join("bulk"), 96 << 20, 11, false);
    drop_caches();
    let mut run = rewrite_in(&env, &[&m.dir.join("db")], "256K");
    run.args(["--pause", "50ms"]).env("RESEQ_FAULTS", "delay@after-write#*=20");
    let child = spawn_captured(&mut run);
    std::thread::sleep(Duration::from_millis(500));
    let balance = Command::new("btrfs").args(["balance", "start", "-d", "--full-balance"]).arg(&m.dir).output();
    let out = wait_captured(child);
    let balance = balance.unwrap();
    assert!(balance.status.success(), "balance: {}", String::from_utf8_lossy(&balance.stderr));
    let code = out.status.code();
    assert!(code == Some(0) || (code == Some(3) && stderr(&out).contains("a balance runs")), "{}", stderr(&out));
    drop_caches();
    for (p, h) in [&db, &bulk] {
        assert_eq!(hash_path(p).unwrap(), *h, "{}", p.display());
    }
    scrub_clean(&m.dir);
    m.unmount().unwrap();
    check_clean(&lo.path);
}

/// RAID1, killed by SIGKILL in the second device's run: thawed, intact, and `--resume`
/// finishes it, each device's copies through its own journal.
#[test]
fn killed_mid_window_then_resumed() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let (a, b) = (env.loop_device("ka.img", 256 * MIB), env.loop_device("kb.img", 256 * MIB));
    let m = btrfs(&env, &[&a, &b], &["-d", "raid1", "-m", "raid1"], "kill");
    let db = file(&m.dir.join("db"), 6 << 20, 12, true);
    let sum = file(&m.dir.join("sum"), 4 << 20, 13, false);
    drop_caches();
    let (a0, b0) = (bytes_written_to(&a.path), bytes_written_to(&b.path));
    // 10 chunks a device: the 14th write is the 4th of b's run.
    let out = output(rewrite(&env, &[&m.dir]).env("RESEQ_FAULTS", "kill@after-write#14"));
    assert_eq!(out.status.code(), None, "should have died by SIGKILL: {}", stderr(&out));
    assert_thawed_within(&m.dir, Duration::from_secs(3));
    let r = json_ok(rewrite(&env, &[&m.dir]).arg("--resume"));
    // a's chunks journaled before the kill are not written again. On a quiet host a's run
    // was journaled whole before it; beside other tests the pacer cut the windows
    // elsewhere and the kill came first, and the resume did a again: a took twice.
    // b's resumes after its last journaled chunk (here a window held all of it).
    // What the resume wrote beyond b's 10 chunks is a's again, and a's counter must agree.
    let resumed = r["results"]["bytes_written"].as_u64().unwrap();
    assert!(resumed == 10 << 20 || resumed == 20 << 20, "{}", r["results"]);
    let a_again = resumed - (10 << 20);
    written_about(&a, a0, (10 << 20) + a_again);
    assert!(bytes_written_to(&b.path) - b0 >= 10 << 20);
    drop_caches();
    for (p, h) in [&db, &sum] {
        assert_eq!(hash_path(p).unwrap(), *h, "{}", p.display());
    }
    scrub_clean(&m.dir);
    m.unmount().unwrap();
    check_clean(&a.path);
}

/// RAID10 over four devices: each 64 KiB stripe on one mirrored pair, so each device
/// takes a quarter of both copies; every write's mirror compared (a wrong stripe
/// mapping would compare two different stripes and report them).
#[test]
fn raid10_rewrites_each_stripe_on_its_pair() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let devs: Vec<LoopDevice> = (0..4).map(|i| env.loop_device(&format!("r10-{i}.img"), 256 * MIB)).collect();
    let m = btrfs(&env, &devs.iter().collect::<Vec<_>>(), &["-d", "raid10", "-m", "raid1"], "r10");
    let sum = file(&m.dir.join("sum"), 8 << 20, 14, false);
    let db = file(&m.dir.join("db"), 4 << 20, 15, true);
    drop_caches();
    let before: Vec<u64> = devs.iter().map(|d| bytes_written_to(&d.path)).collect();
    let r = json_ok(&mut rewrite(&env, &[&m.dir]));
    assert_eq!(r["results"]["bytes_written"], 24 << 20, "two copies");
    assert!(!r["warnings"].to_string().contains("differs"), "{}", r["warnings"]);
    for (d, b) in devs.iter().zip(before) {
        written_about(d, b, 6 << 20);
    }
    drop_caches();
    for (p, h) in [&db, &sum] {
        assert_eq!(hash_path(p).unwrap(), *h, "{}", p.display());
    }
    scrub_clean(&m.dir);
    m.unmount().unwrap();
    check_clean(&devs[0].path);
}

/// A member's path (what DEV_INFO reports) leads to another device now than the one
/// btrfs opened by it: reseq must not write the device it leads to. Refused at the plan
/// (exit 3, saying what the device really is), nothing written anywhere.
#[test]
fn a_member_path_leading_to_another_device_is_refused() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let (a, b) = (env.loop_device("pa.img", 256 * MIB), env.loop_device("pb.img", 256 * MIB));
    let x = env.loop_device("px.img", 256 * MIB);
    run_cmd(Command::new("mkfs.btrfs").args(["-q", "-f", "-d", "raid1", "-m", "raid1"]).arg(&a.path).arg(&b.path))
        .unwrap();
    let link = env.path("linkB");
    std::os::unix::fs::symlink(&b.path, &link).unwrap();
    run_cmd(Command::new("btrfs").args(["device", "scan", "--forget"]).arg(&b.path)).unwrap();
    let opt = format!("device={}", link.display());
    let m = Mount::new(&a.path, &env.path("pm"), &[&opt]).unwrap();
    let f = file(&m.dir.join("f"), 4 << 20, 16, true);
    drop_caches();
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&x.path, &link).unwrap();
    let before: Vec<u64> = [&a, &b, &x].iter().map(|d| bytes_written_to(&d.path)).collect();
    let out = output(&mut rewrite(&env, &[&m.dir]));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("holds no btrfs superblock") && stderr(&out).contains("linkB"), "{}", stderr(&out));
    // btrfs's own commits may write a few blocks of a and b; nothing may reach x.
    assert_eq!(bytes_written_to(&x.path), before[2], "the non-member written");
    for (d, b0) in [&a, &b].iter().zip(before) {
        let w = bytes_written_to(&d.path) - b0;
        assert!(w < MIB, "{} written: {w}", d.path.display());
    }
    assert_eq!(hash_path(&f.0).unwrap(), f.1);
    m.unmount().unwrap();
}

/// A device added mid-run: the plan knows nothing of copies btrfs puts there, so the
/// next window stops the run before it writes more (exit 4; exit 3 where the add is
/// still under way, btrfs's own exclusive operation), rather than finish and call the
/// files done.
#[test]
fn a_device_added_mid_run_stops_it() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let (a, b) = (env.loop_device("da.img", 256 * MIB), env.loop_device("db.img", 256 * MIB));
    let c = env.loop_device("dc.img", 256 * MIB);
    let m = btrfs(&env, &[&a, &b], &["-d", "raid1", "-m", "raid1"], "add");
    let db = file(&m.dir.join("db"), 8 << 20, 17, true);
    drop_caches();
    let first = env.path("first-write.done");
    let mut run = rewrite_in(&env, &[&m.dir], "256K");
    let faults = format!("mark@after-write#1={},delay@after-write#*=30", first.display());
    run.args(["--pause", "20ms"]).env("RESEQ_FAULTS", faults);
    let child = spawn_captured(&mut run);
    assert!(wait_for_mark(&first, Duration::from_secs(30)), "no write within 30 s");
    run_cmd(Command::new("btrfs").args(["device", "add", "-f"]).arg(&c.path).arg(&m.dir)).unwrap();
    let out = wait_captured(child);
    let err = stderr(&out);
    match out.status.code() {
        // The add done: the next window's check of the filesystem's devices.
        Some(4) => assert!(err.contains("changed its devices"), "{err}"),
        // The add still under way (a busy host makes it slow): btrfs's own writer, seen
        // before the next freeze is asked for (as a scrub is, below).
        Some(3) => assert!(err.contains("an exclusive operation is in progress (device add)"), "{err}"),
        code => panic!("exit {code:?}, not stopped by the added device: {err}"),
    }
    drop_caches();
    assert_eq!(hash_path(&db.0).unwrap(), db.1);
    scrub_clean(&m.dir);
}

/// A scrub started mid-run (slowed to 6 MB/s: it runs a second or two): FIFREEZE would
/// wait for it to end, with every writer of the filesystem waiting behind the freeze.
/// The next window checks for it before asking for the freeze, unfrozen, and stops the
/// run (exit 3) at once instead.
#[test]
fn a_scrub_started_mid_run_stops_it_before_a_freeze() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("scr.img", 256 * MIB);
    let m = btrfs(&env, &[&lo], &[], "scr");
    let db = file(&m.dir.join("db"), 8 << 20, 18, true);
    drop_caches();
    let fsid = output(Command::new("blkid").args(["-s", "UUID", "-o", "value"]).arg(&lo.path));
    let fsid = String::from_utf8_lossy(&fsid.stdout).trim().to_string();
    let speed = format!("/sys/fs/btrfs/{fsid}/devinfo/1/scrub_speed_max");
    std::fs::write(&speed, "6m").unwrap();
    let first = env.path("first-write.done");
    let mut run = rewrite_in(&env, &[&m.dir.join("db")], "256K");
    let faults = format!("mark@after-write#1={},delay@after-write#*=30", first.display());
    run.args(["--pause", "20ms"]).env("RESEQ_FAULTS", faults);
    let child = spawn_captured(&mut run);
    assert!(wait_for_mark(&first, Duration::from_secs(30)), "no write within 30 s");
    run_cmd(Command::new("btrfs").args(["scrub", "start"]).arg(&m.dir)).unwrap();
    let started = std::time::Instant::now();
    let out = wait_captured(child);
    let took = started.elapsed();
    std::fs::write(&speed, "0").unwrap();
    let _ = Command::new("btrfs").args(["scrub", "cancel"]).arg(&m.dir).output();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("a scrub runs"), "{}", stderr(&out));
    assert!(took < Duration::from_secs(3), "stopped {took:?} after the scrub started");
    // Not frozen, nor stuck in a freeze: an application's write goes through at once.
    let wrote = std::time::Instant::now();
    file(&m.dir.join("app"), 4096, 20, false);
    assert!(wrote.elapsed() < Duration::from_secs(1), "a 4 KiB write took {:?}", wrote.elapsed());
    drop_caches();
    assert_eq!(hash_path(&db.0).unwrap(), db.1);
}

/// A second loop device over the second member's image (another way to write its
/// bytes, which no freeze stops): refused at the plan, before the first member is
/// written; the dry run names that alias.
#[test]
fn a_later_members_alias_is_refused_before_any_write() {
    if !tools() {
        return;
    }
    let env = TestEnv::new();
    let (a, b) = (env.loop_device("aa.img", 256 * MIB), env.loop_device("ab.img", 256 * MIB));
    let m = btrfs(&env, &[&a, &b], &["-d", "raid1", "-m", "raid1"], "alias");
    let f = file(&m.dir.join("f"), 4 << 20, 21, true);
    drop_caches();
    let alias = LoopDevice::attach(&env.path("ab.img"), &["-r"]).unwrap();
    let dry = output(rewrite(&env, &[&m.dir]).args(["--dry-run", "-v"]));
    assert!(String::from_utf8_lossy(&dry.stdout).contains(&alias.name()), "{}", String::from_utf8_lossy(&dry.stdout));
    let before: Vec<u64> = [&a, &b].iter().map(|d| bytes_written_to(&d.path)).collect();
    let out = output(&mut rewrite(&env, &[&m.dir]));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains(&alias.name()), "{}", stderr(&out));
    // btrfs's own commits may write a few blocks meanwhile; a rewrite of a member 4 MiB.
    for (d, b0) in [&a, &b].iter().zip(before) {
        let w = bytes_written_to(&d.path) - b0;
        assert!(w < MIB, "{} written: {w}", d.path.display());
    }
    assert_eq!(hash_path(&f.0).unwrap(), f.1);
    drop(alias);
    m.unmount().unwrap();
}
