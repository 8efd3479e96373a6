//! No silent loss: whatever the device does to reseq's reads and writes (fails them,
//! tears them, stores something else), reseq never reports success over data that is not
//! what was there. The device faults come from a FUSE filesystem under a loop device
//! (`common/faultfs.rs`), so they reach reseq through the kernel as a failing disk's would.
//!
//! The first tests here check that harness itself, through the loop device with O_DIRECT.

use crate::faultfs;

use std::path::Path;

use crate::common::*;
use faultfs::*;

const MIB: u64 = 1 << 20;

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    XorShift::new(seed).fill(&mut v);
    v
}

fn is_eio(r: &std::io::Result<impl Sized>) -> bool {
    matches!(r, Err(e) if e.raw_os_error() == Some(nix::libc::EIO))
}

/// The first offset where `a` and `b` differ, for readable failures.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if let Some(i) = first_diff(got, want) {
        panic!("{what}: differs at byte {i} of {}", want.len());
    }
}

fn ready() -> bool {
    require(&["losetup"]) && require_fuse()
}

fn mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(&*dir.to_string_lossy()))
}

fn loop_on(image: &Path) -> bool {
    let out = run_cmd(std::process::Command::new("losetup").arg("-a")).unwrap();
    out.contains(&*image.to_string_lossy())
}

#[test]
fn faultfs_without_faults_passes_reads_and_writes_through() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "plain", 16 * MIB, 1, None);
    let dio = std::fs::read_to_string(format!("/sys/block/{}/loop/dio", d.lo.name())).unwrap();
    assert_eq!(dio.trim(), "0", "the loop device does buffered I/O on the FUSE file");

    let image = std::fs::read(&d.image).unwrap();
    assert_same("O_DIRECT read of the loop device", &direct_read(&d.lo.path, 0, 16 << 20).unwrap(), &image);
    let reads = d.fs.reads_seen();
    assert_eq!(reads.iter().map(|r| r.1).sum::<u64>(), 16 * MIB, "every byte read came through FUSE: {reads:?}");
    eprintln!("READ request sizes: {:?}", reads.iter().map(|r| r.1).collect::<std::collections::BTreeSet<_>>());

    let (off, new) = (5 * MIB + 4096, random(MIB as usize, 11));
    direct_write(&d.lo.path, off, &new).unwrap();
    assert_same("the written MiB in the image", &d.image_bytes(off, new.len()), &new);
    let writes = d.fs.writes_seen();
    eprintln!("WRITE requests for a 1 MiB O_DIRECT write: {writes:?}");
    assert_eq!(writes.iter().map(|w| w.1).sum::<u64>(), MIB, "{writes:?}");
    assert!(writes.iter().all(|&(o, l)| o >= off && o + l <= off + MIB), "{writes:?}");
    let after = std::fs::read(&d.image).unwrap();
    assert_same("the image outside the write", &after[..off as usize], &image[..off as usize]);
    assert_same("the image outside the write", &after[(off + MIB) as usize..], &image[(off + MIB) as usize..]);
    assert_same("read-back", &direct_read(&d.lo.path, off, new.len()).unwrap(), &new);

    // A flush of the loop device reaches the file as an fsync.
    let fsyncs = d.fs.fsyncs();
    std::fs::OpenOptions::new().write(true).open(&d.lo.path).unwrap().sync_all().unwrap();
    assert!(d.fs.fsyncs() > fsyncs, "fsync of the loop device sent no FSYNC");
    assert_eq!(d.fs.hits(), 0);

    // Nothing is left behind.
    let (mount_dir, image_path) = (d.fs.mount_dir().to_path_buf(), d.image.clone());
    assert!(mounted(&mount_dir) && loop_on(&image_path));
    drop(d);
    assert!(!mounted(&mount_dir), "{} still mounted", mount_dir.display());
    assert!(!loop_on(&image_path), "a loop device still on {}", image_path.display());
}

#[test]
fn faultfs_fail_read_fails_reads_over_the_range_only() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "failread", 16 * MIB, 2, None);
    d.fs.add(Fault::new(FaultKind::FailRead, 3 * MIB + 1000, 10_000));
    let r = direct_read(&d.lo.path, 3 * MIB, MIB as usize);
    assert!(is_eio(&r), "a read over the faulted range: {:?}", r.map(|_| ()));
    assert!(d.fs.hits() >= 1);
    // Next to it, and all of the device but the faulted sectors, reads fine.
    assert_same(
        "a read beside the fault",
        &direct_read(&d.lo.path, 8 * MIB, MIB as usize).unwrap(),
        &d.image_bytes(8 * MIB, MIB as usize),
    );
    assert_same(
        "a read just before the fault",
        &direct_read(&d.lo.path, 3 * MIB - 4096, 4096).unwrap(),
        &d.image_bytes(3 * MIB - 4096, 4096),
    );
    // Faults apply to reads only: writing the range works.
    let new = random(4096, 21);
    direct_write(&d.lo.path, 3 * MIB, &new).unwrap();
    assert_eq!(d.image_bytes(3 * MIB, 4096), new);
    d.fs.clear();
    assert_same("after clear()", &direct_read(&d.lo.path, 3 * MIB, 4096).unwrap(), &new);
}

#[test]
fn faultfs_fail_write_stores_nothing() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "failwrite", 16 * MIB, 3, None);
    let before = std::fs::read(&d.image).unwrap();
    // Over the whole write: nothing of it is stored.
    d.fs.add(Fault::new(FaultKind::FailWrite, 6 * MIB - 4096, MIB + 8192));
    let r = direct_write(&d.lo.path, 6 * MIB, &random(MIB as usize, 31));
    assert!(is_eio(&r), "{r:?}");
    assert!(d.fs.hits() >= 1 && !d.fs.writes_seen().is_empty());
    assert_same("the image after a failed write", &std::fs::read(&d.image).unwrap(), &before);
    // Over part of it: that part is not stored.
    d.fs.clear();
    d.fs.add(Fault::new(FaultKind::FailWrite, 10 * MIB + 300_000, 5000));
    let r = direct_write(&d.lo.path, 10 * MIB, &random(MIB as usize, 32));
    assert!(is_eio(&r), "{r:?}");
    let s = (10 * MIB + 300_000) as usize;
    assert_same("the faulted range", &d.image_bytes(s as u64, 5000), &before[s..s + 5000]);
}

#[test]
fn faultfs_tear_write_zeroes_exactly_the_range() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "tear", 16 * MIB, 4, None);
    let before = std::fs::read(&d.image).unwrap();
    let (off, new) = (9 * MIB, random(MIB as usize, 41));
    // Over the written MiB's last 100000 bytes and 50000 beyond: not at any request
    // boundary, so the request it starts in is stored in part and zeroed in part.
    let (fs, fe) = (off + MIB - 100_000, off + MIB + 50_000);
    d.fs.add(Fault::new(FaultKind::TearWrite, fs, fe - fs));
    let r = direct_write(&d.lo.path, off, &new);
    assert!(is_eio(&r), "{r:?}");
    assert!(d.fs.hits() >= 1);
    let after = std::fs::read(&d.image).unwrap();
    let (o, s, e, end) = (off as usize, fs as usize, (off + MIB) as usize, fe as usize);
    assert_same("before the tear", &after[o..s], &new[..s - o]);
    assert!(after[s..e].iter().all(|&b| b == 0), "the torn range is not all zeros");
    assert_same("after the written range", &after[e..end], &before[e..end]);
    assert_same("the rest of the image", &after[..o], &before[..o]);
    assert_same("the rest of the image", &after[end..], &before[end..]);
}

#[test]
fn faultfs_alter_write_flips_exactly_the_range() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "alter", 16 * MIB, 5, None);
    let (off, new) = (2 * MIB, random(MIB as usize, 51));
    let (fs, len) = (off + 4096 + 7, 5000usize);
    d.fs.add(Fault::new(FaultKind::AlterWrite, fs, len as u64));
    direct_write(&d.lo.path, off, &new).unwrap();
    assert_eq!(d.fs.hits(), 1);
    let mut want = new.clone();
    let s = (fs - off) as usize;
    want[s..s + len].iter_mut().for_each(|b| *b ^= 0xff);
    let back = direct_read(&d.lo.path, off, new.len()).unwrap();
    assert_ne!(back, new, "the read-back differs from what was written");
    assert_same("read-back of an altered write", &back, &want);
    assert_same("the image", &d.image_bytes(off, new.len()), &want);
}

#[test]
fn faultfs_times_limits_a_fault_to_the_first_requests() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "once", 16 * MIB, 6, Some(4096));
    let (off, new) = (12 * MIB, random(MIB as usize, 61));
    d.fs.add(Fault::new(FaultKind::FailWrite, off, MIB).times(1));
    let r = direct_write(&d.lo.path, off, &new);
    assert!(is_eio(&r), "{r:?}");
    direct_write(&d.lo.path, off, &new).unwrap();
    assert_eq!(d.fs.hits(), 1);
    assert_same("the second write", &d.image_bytes(off, new.len()), &new);
    // The 4096-byte sectors: a 512-byte O_DIRECT write is refused by the loop device.
    assert!(direct_write(&d.lo.path, off, &new[..512]).is_err());
}

/// A test that panics holding a fault device leaves no mount and no loop device.
#[test]
fn faultfs_cleans_up_after_a_panic() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let mut paths = None;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let d = fault_loop_device(&env, "panic", 4 * MIB, 7, None);
        paths = Some((d.fs.mount_dir().to_path_buf(), d.image.clone()));
        d.fs.add(Fault::new(FaultKind::FailRead, 0, 4 * MIB));
        assert!(is_eio(&direct_read(&d.lo.path, 0, 4096)));
        panic!("deliberate panic holding a fault device");
    }));
    assert!(r.is_err());
    let (mount_dir, image) = paths.unwrap();
    assert!(!mounted(&mount_dir), "{} still mounted", mount_dir.display());
    assert!(!loop_on(&image), "a loop device still on {}", image.display());
}

// ---- reseq against a device that fails, tears and alters ----

/// A rewrite of the whole fault device in 1 MiB chunks.
fn rewrite(env: &TestEnv, d: &FaultDevice, extra: &[&str]) -> std::process::Output {
    output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).args(extra).arg(&d.lo.path))
}

fn rescue_files(env: &TestEnv) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> =
        std::fs::read_dir(env.state_dir()).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    v.retain(|p| p.file_name().unwrap().to_string_lossy().starts_with("rescue-"));
    v
}

/// The one rescue file: its blake3 is the one the journal's `begin` recorded for the
/// chunk, and its bytes are the original image's there.
fn the_rescue(env: &TestEnv, d: &FaultDevice, original: &[u8], offset: u64) -> std::path::PathBuf {
    let files = rescue_files(env);
    assert_eq!(files.len(), 1, "one rescue file: {files:?}");
    let (h, data) = reseq::testing::rescue::load(&files[0]).unwrap();
    assert_eq!((h.offset, h.len), (offset, MIB));
    assert_same("the rescue copy", &data, &original[offset as usize..(offset + MIB) as usize]);
    let journal = std::fs::read_to_string(env.state_dir().join(format!("device-{}.journal", d.lo.name()))).unwrap();
    let r = reseq::testing::journal::replay(&journal);
    assert!(
        r.in_flight.contains(&(offset, MIB, h.blake3.clone())),
        "the journal keeps the chunk in flight: {:?}",
        r.in_flight
    );
    files[0].clone()
}

fn restore(env: &TestEnv, file: &Path) -> std::process::Output {
    output(env.reseq().arg("restore").arg(file))
}

#[test]
fn a_read_error_stops_the_run_before_writing_that_chunk() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "readerr", 16 * MIB, 21, None);
    let original = std::fs::read(&d.image).unwrap();
    d.fs.add(Fault::new(FaultKind::FailRead, 5 * MIB + 8192, 4096));
    let out = rewrite(&env, &d, &[]);
    assert_eq!(out.status.code(), Some(4));
    assert!(stderr(&out).contains("reading the device at offset 5242880"), "{}", stderr(&out));
    assert!(d.fs.writes_seen().iter().all(|&(o, _)| o < 5 * MIB), "nothing written from the failed chunk on");
    assert_same("the image", &std::fs::read(&d.image).unwrap(), &original);
    assert!(rescue_files(&env).is_empty(), "nothing was written there: nothing to rescue");
}

#[test]
fn a_write_error_that_passes_is_retried_and_verified() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "flaky", 16 * MIB, 22, None);
    let original = std::fs::read(&d.image).unwrap();
    d.fs.add(Fault::new(FaultKind::TearWrite, 5 * MIB + 4096, 4096).times(1));
    let out = rewrite(&env, &d, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("succeeded on attempt 2 and read back as written"), "{}", stderr(&out));
    assert_eq!(d.fs.hits(), 1);
    assert_same("the image", &std::fs::read(&d.image).unwrap(), &original);
    assert!(rescue_files(&env).is_empty());
}

#[test]
fn a_failing_write_that_leaves_the_data_is_rescued_then_cleared_by_the_next_run() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "failw", 16 * MIB, 23, None);
    let original = std::fs::read(&d.image).unwrap();
    d.fs.add(Fault::new(FaultKind::FailWrite, 5 * MIB, 4096));
    let out = rewrite(&env, &d, &[]);
    assert_eq!(out.status.code(), Some(4));
    let err = stderr(&out);
    assert!(err.contains("writing 1048576 bytes at offset 5242880 failed 3 time(s)"), "{err}");
    assert!(err.contains("found the original bytes there (checked by blake3): data intact"), "{err}");
    assert!(!err.contains("uncertain"), "{err}");
    the_rescue(&env, &d, &original, 5 * MIB);
    assert_same("the image", &std::fs::read(&d.image).unwrap(), &original);
    // The device holds the rescued bytes: the resume drops the copy and finishes.
    d.fs.clear();
    let out = rewrite(&env, &d, &["--resume"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(rescue_files(&env).is_empty());
    assert_same("the image", &std::fs::read(&d.image).unwrap(), &original);
}

/// The case: a torn write (zeros, EIO). Exit 4 naming the bytes as uncertain and
/// the rescue copy; a resume refuses (never exit 0) until `reseq restore`; restore
/// refuses while the device still fails, then puts the bytes back; the resume finishes
/// and the image is byte-identical to the original.
#[test]
fn a_torn_write_is_rescued_and_nothing_goes_on_until_it_is_restored() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "torn", 16 * MIB, 24, None);
    let original = std::fs::read(&d.image).unwrap();
    let (at, len) = (5 * MIB + 65536, 65536u64);
    d.fs.add(Fault::new(FaultKind::TearWrite, at, len));
    let out = rewrite(&env, &d, &[]);
    assert_eq!(out.status.code(), Some(4));
    let err = stderr(&out);
    assert!(err.contains("found other bytes there (a torn write): those 1048576 bytes are uncertain"), "{err}");
    assert!(err.contains("reseq restore "), "{err}");
    assert!(!err.contains("data intact"), "{err}");
    assert_eq!(d.image_bytes(at, len as usize), vec![0u8; len as usize], "the fault tore the image");
    let rescue = the_rescue(&env, &d, &original, 5 * MIB);

    for extra in [&["--resume"][..], &["--restart"][..], &[][..]] {
        let out = rewrite(&env, &d, extra);
        assert_eq!(out.status.code(), Some(3), "{extra:?} must refuse");
        assert!(stderr(&out).contains(&format!("reseq restore {}", rescue.display())), "{}", stderr(&out));
    }
    // Still failing: restore says so, keeps the copy.
    let out = restore(&env, &rescue);
    assert_eq!(out.status.code(), Some(4));
    assert!(rescue.exists() && stderr(&out).contains("is kept"), "{}", stderr(&out));
    d.fs.clear();
    let out = restore(&env, &rescue);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("read back and checked"));
    assert!(!rescue.exists());
    assert_same("the image after restore", &std::fs::read(&d.image).unwrap(), &original);
    let out = rewrite(&env, &d, &["--resume"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("is intact"), "the chunk in flight re-verified: {}", stderr(&out));
    assert_same("the image after the resume", &std::fs::read(&d.image).unwrap(), &original);
}

/// A read-back that differs: exit 5 with the differing sectors, the range never written
/// again, a rescue copy; restore refuses a device that another writer changed since.
#[test]
fn a_read_back_that_differs_is_rescued_never_written_over() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "alter", 16 * MIB, 25, None);
    let original = std::fs::read(&d.image).unwrap();
    d.fs.add(Fault::new(FaultKind::AlterWrite, 5 * MIB + 4096, 512));
    let out = rewrite(&env, &d, &[]);
    assert_eq!(out.status.code(), Some(5));
    let err = stderr(&out);
    assert!(err.contains("512 bytes differ in 1 range(s) (device bytes 5246976..5247488)"), "{err}");
    let over: u64 =
        d.fs.writes_seen().iter().filter(|&&(o, l)| o < 5 * MIB + 4608 && o + l > 5 * MIB + 4096).map(|_| 1).sum();
    assert_eq!(over, 1, "the differing range was written once, never again");
    let rescue = the_rescue(&env, &d, &original, 5 * MIB);
    // `status` names the range to check and, beside it, the rescue copy of its chunk.
    let status = env.reseq().args(["status", "--json"]).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let at_risk = report["unfinished"][0]["at_risk"][0].as_str().unwrap_or_default();
    assert!(at_risk.starts_with("stopped with exit 5 (a read-back differed"), "{report}");
    assert!(at_risk.contains("device bytes 5242880..6291456 "), "the differing chunk: {at_risk}");
    assert!(at_risk.contains(&format!("reseq restore {}", rescue.display())), "{at_risk}");
    d.fs.clear();
    // Someone writes there after reseq stopped: restore must not overwrite it blindly.
    direct_write(&d.lo.path, 5 * MIB + 65536, &random(4096, 99)).unwrap();
    let out = restore(&env, &rescue);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("changed since reseq stopped"), "{}", stderr(&out));
    // Bad input: a missing file, not a rescue file (exit 2); a copy whose header names
    // another device (exit 3); a copy whose bytes were damaged (exit 3).
    assert_eq!(restore(&env, &env.path("nope.bin")).status.code(), Some(2));
    assert_eq!(restore(&env, &d.image).status.code(), Some(2));
    let other = env.path("other.bin");
    let text = std::fs::read(&rescue).unwrap();
    let head = String::from_utf8_lossy(&text[..4096]).replace("\"size_bytes\":16777216", "\"size_bytes\":16777217");
    std::fs::write(&other, [head.as_bytes(), &text[4096..]].concat()).unwrap();
    let out = restore(&env, &other);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("is not the device this copy came from"), "{}", stderr(&out));
    let mut damaged = text.clone();
    damaged[5000] ^= 1;
    std::fs::write(&other, damaged).unwrap();
    let out = restore(&env, &other);
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("is damaged"), "{}", stderr(&out));
    let out = output(env.reseq().args(["restore", "--force"]).arg(&rescue));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_same("the image after restore --force", &std::fs::read(&d.image).unwrap(), &original);
}

/// Restore on a mounted filesystem: the write is frozen like any write, and refused for a
/// device that is not the rescue copy's.
#[test]
fn restore_on_a_mounted_filesystem_freezes_and_checks_the_device() {
    if !ready() || !require(&["mkfs.ext4", "e2fsck", "unshare", "setpriv"]) {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "mnt", 64 * MIB, 26, None);
    mkfs_ext4(&d.lo.path).unwrap();
    let mnt = Mount::new(&d.lo.path, &env.path("mnt-dir"), &[]).unwrap();
    let files = fill_files(&mnt.dir, 8, 4 << 20, 27);
    std::process::Command::new("sync").status().unwrap();
    let before = direct_read(&d.lo.path, 0, (64 * MIB) as usize).unwrap();
    // Tear a range in the middle of the files' data.
    let at = find_used_mib(&before);
    d.fs.add(Fault::new(FaultKind::TearWrite, at + 4096, 8192));
    let out = rewrite(&env, &d, &["--max-freeze", "2s"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(!is_frozen(&mnt.dir));
    let rescue = rescue_files(&env).pop().expect("a rescue copy");
    d.fs.clear();
    // Its guardian must leave reseq's cgroup like a rewrite's, or the restore is refused.
    let mut in_ns = std::process::Command::new("unshare");
    in_ns.args(["--cgroup", "--"]).arg(env!("CARGO_BIN_EXE_reseq")).args(["restore"]).arg(&rescue);
    in_ns.envs(env.reseq().get_envs().filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned()))));
    let out = output(&mut in_ns);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot leave reseq's cgroup"), "{}", stderr(&out));
    // Debug: where the guardian went is logged there. Without CAP_SYS_PTRACE the writers'
    // check cannot look into other processes: a recovery is not refused for that, only
    // told of it.
    let reseq = env.reseq();
    let mut blind = std::process::Command::new("setpriv");
    blind.args(["--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace", "--"]).arg(reseq.get_program());
    blind.envs(reseq.get_envs().filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))).env("RUST_LOG", "debug");
    let out = output(blind.args(["restore", "--json"]).arg(&rescue));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("reseq-guardian."), "the guardian did not leave: {}", stderr(&out));
    assert!(stderr(&out).contains("reseq lacks CAP_SYS_PTRACE"), "{}", stderr(&out));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["outcome"], "restored");
    assert_eq!(s["frozen_filesystems"][0], mnt.dir.display().to_string());
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    run_cmd(std::process::Command::new("e2fsck").args(["-f", "-n"]).arg(&d.lo.path)).unwrap();
}

/// The first MiB-aligned offset past 8 MiB whose bytes are not all zero (file data).
fn find_used_mib(dev: &[u8]) -> u64 {
    (8..dev.len() / MIB as usize)
        .map(|i| i as u64 * MIB)
        .find(|&o| dev[o as usize..(o + MIB) as usize].iter().filter(|&&b| b != 0).count() > 512 * 1024)
        .expect("file data on the device")
}

/// A loop device with 4096-byte sectors over 5 MiB + 512 bytes: the aligned part is
/// rewritten and the tail is named, not an I/O error.
#[test]
fn a_device_with_a_partial_last_sector_is_rewritten_up_to_it() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "odd", 5 * MIB + 512, 28, Some(4096));
    let original = std::fs::read(&d.image).unwrap();
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--chunk-size", "1M"]).arg(&d.lo.path));
    assert_eq!(r["results"]["bytes_written"], 5 * MIB);
    let warned = r["warnings"].as_array().unwrap().iter().any(|w| {
        w.as_str().unwrap().contains("the last 512 bytes") && w.as_str().unwrap().contains("from offset 5242880")
    });
    assert!(warned, "the tail is named in the report: {}", r["warnings"]);
    assert_same("the image", &std::fs::read(&d.image).unwrap(), &original);
}

// ---- the state directory and the journal ----

/// A tmpfs mounted at `dir` with `opts` (unmounted on drop).
fn tmpfs(dir: &Path, opts: &str) -> Mount {
    std::fs::create_dir_all(dir).unwrap();
    run_cmd(std::process::Command::new("mount").args(["-t", "tmpfs", "-o", opts, "tmpfs"]).arg(dir)).unwrap();
    Mount { dir: dir.to_path_buf() }
}

/// The case: a state directory reached through a symlink into the filesystem
/// being frozen is that filesystem. Journal records wait for the thaw; no window blocks
/// on them, none overruns.
#[test]
fn a_state_dir_symlinked_into_the_frozen_filesystem_is_seen_as_on_it() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("symstate", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 4, 4 << 20, 31);
    std::fs::create_dir(mnt.dir.join("state")).unwrap();
    let link = env.path("state-link");
    std::os::unix::fs::symlink(mnt.dir.join("state"), &link).unwrap();
    let r = json_ok(
        env.reseq()
            .args(["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "300ms"])
            .arg(&lo.path)
            .env("RESEQ_STATE_DIR", &link),
    );
    assert_eq!(r["results"]["windows_overrun"], 0);
    assert!(
        r["warnings"].to_string().contains("is on a filesystem reseq freezes"),
        "the journal is held during windows: {}",
        r["warnings"]
    );
    assert!(mnt.dir.join("state").join(format!("device-{}.journal", lo.name())).exists());
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
}

/// Read-only and full state directories are refused (exit 3) before anything is frozen
/// or written.
#[test]
fn a_read_only_or_full_state_dir_is_refused_before_any_freeze() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("rostate", 64 * MIB, "ext4");
    fill_files(&mnt.dir, 2, 4 << 20, 32);
    std::process::Command::new("sync").status().unwrap();
    let written = bytes_written_to(&lo.path);
    let ro = tmpfs(&env.path("ro"), "ro,size=8m");
    let full = tmpfs(&env.path("full"), "size=2m");
    for (dir, needle) in [(&ro.dir, "ead-only file system"), (&full.dir, "free, less than")] {
        let out = output(
            env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path).env("RESEQ_STATE_DIR", dir.join("s")),
        );
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(needle) && err.contains("state directory"), "{err}");
        assert!(!err.contains("data intact, resumable"), "nothing started: {err}");
    }
    // File mode too.
    let out = output(env.reseq().args(["rewrite"]).arg(&mnt.dir).env("RESEQ_STATE_DIR", &ro.dir));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(bytes_written_to(&lo.path), written, "nothing written");
}

/// Two runs on one device: the second is refused, naming the first one's PID.
#[test]
fn a_second_run_on_the_same_device_is_refused_with_the_pid_of_the_first() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("locked", 16 * MIB, 33);
    let before = hash_path(&lo.path).unwrap();
    let first = spawn_captured(
        env.reseq()
            .args(["rewrite", "--chunk-size", "1M"])
            .arg(&lo.path)
            .env("RESEQ_FAULTS", "delay@before-write#*=100"),
    );
    let lock = env.state_dir().join(format!("device-{}.lock", lo.name()));
    let pid = first.id().to_string();
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&lock).map(|t| t.trim() != pid).unwrap_or(true) {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the first run never took the lock");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let out = output(env.reseq().args(["rewrite", "--resume", "--chunk-size", "1M"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("another reseq (PID {pid}) is working on {}", lo.path.display())));
    let first = wait_captured(first);
    assert_eq!(first.status.code(), Some(0), "{}", String::from_utf8_lossy(&first.stderr));
    assert_eq!(hash_path(&lo.path).unwrap(), before);
}

/// A flipped byte in the middle of the journal: named by line and byte, the chunks after
/// it redone, the journal rewritten, and the finished run reads as finished.
#[test]
fn a_damaged_journal_line_is_named_repaired_and_the_run_finishes() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("jdamage", 16 * MIB, 34);
    let before = hash_path(&lo.path).unwrap();
    let out = output(
        env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path).env("RESEQ_FAULTS", "write-error@10M"),
    );
    assert_eq!(out.status.code(), Some(4));
    let jpath = env.state_dir().join(format!("device-{}.journal", lo.name()));
    let text = std::fs::read_to_string(&jpath).unwrap();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    assert!(lines.len() > 8, "{text}");
    // Line 4: flip one hex digit of its checksum.
    let at: usize = lines[..3].iter().map(|l| l.len()).sum();
    let mut bytes = text.into_bytes();
    bytes[at] = if bytes[at] == b'0' { b'1' } else { b'0' };
    std::fs::write(&jpath, &bytes).unwrap();

    let out = output(env.reseq().args(["rewrite", "--json", "--resume", "--chunk-size", "1M"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&format!("line 4 (byte {at}) of {} is damaged", jpath.display())), "{err}");
    assert!(err.contains("the journal was rewritten without it"), "{err}");
    let r = json_report(&out);
    assert!(
        r["results"]["bytes_written"].as_u64().unwrap() >= 13 * MIB,
        "chunks after the damage redone: {}",
        r["results"]
    );
    let replay = reseq::testing::journal::read(&jpath).unwrap().unwrap();
    assert!(replay.finished && replay.damage.is_none(), "{replay:?}");
    // Finished: a plain run starts afresh instead of "an unfinished run exists".
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(hash_path(&lo.path).unwrap(), before);
}

/// File mode with a write torn 8 KiB into `files[victim]` of `count` files of `size`
/// bytes: exit 4, a rescue copy covering the tear (its header given to `check`), every
/// later run refused until it is restored, then every file intact, the rest of the run
/// resumed, and the filesystem clean.
fn file_mode_torn_write(
    name: &str,
    count: usize,
    size: usize,
    victim: usize,
    check: impl Fn(&reseq::testing::rescue::RescueHeader),
) {
    if !ready() || !require(&["mkfs.ext4", "e2fsck", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, name, 64 * MIB, 35, None);
    mkfs_ext4(&d.lo.path).unwrap();
    let dir = env.path(&format!("{name}-dir"));
    let mnt = Mount::new(&d.lo.path, &dir, &[]).unwrap();
    let files = fill_files(&mnt.dir, count, size, 36);
    std::process::Command::new("sync").status().unwrap();
    let f = std::fs::File::open(&files[victim].0).unwrap();
    let at = reseq::testing::fiemap(std::os::fd::AsFd::as_fd(&f), 0, 0).unwrap()[0].physical;
    drop(f);
    d.fs.add(Fault::new(FaultKind::TearWrite, at + 8192, 4096));
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M", "--max-freeze", "2s"]).arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("a torn write"), "{}", stderr(&out));
    assert!(!is_frozen(&mnt.dir));
    let rescue = rescue_files(&env).pop().expect("a rescue copy");
    let (h, _) = reseq::testing::rescue::load(&rescue).unwrap();
    assert!(h.file.as_deref().is_some_and(|f| f.contains(&*mnt.dir.to_string_lossy())), "names the file: {h:?}");
    assert!(h.offset <= at + 8192 && at + 8192 < h.offset + h.len, "device offsets: {h:?}");
    check(&h);
    let out = output(env.reseq().args(["rewrite", "--resume"]).arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(3), "refused until restored: {}", stderr(&out));
    assert!(stderr(&out).contains("rescue"), "{}", stderr(&out));
    d.fs.clear();
    let out = restore(&env, &rescue);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Read the files from the device, not the page cache.
    mnt.unmount().unwrap();
    let mnt = Mount::new(&d.lo.path, &dir, &[]).unwrap();
    assert_files_intact(&files);
    let out = output(env.reseq().args(["rewrite", "--resume"]).arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    mnt.unmount().unwrap();
    run_cmd(std::process::Command::new("e2fsck").args(["-f", "-n"]).arg(&d.lo.path)).unwrap();
}

/// File mode: a torn write in a file's blocks keeps the file's original bytes in a rescue
/// copy that names the file.
#[test]
fn file_mode_rescues_a_torn_write_in_a_file() {
    file_mode_torn_write("fmode", 8, 4 << 20, 3, |_| {});
}

/// File mode, small files sharing one engine run and one chunk: the copy holds the
/// chunk, and names the files in it.
#[test]
fn file_mode_rescues_a_torn_write_in_a_batch_of_small_files() {
    file_mode_torn_write("fbatch", 64, 64 << 10, 20, |h| {
        assert!(h.len > 64 << 10, "one chunk holds several files: {h:?}");
        let named = h.file.clone().unwrap_or_default();
        assert!(named.contains("more file(s) through"), "names the files it holds: {named}");
    });
}

// ---- found by a hostile review ----

/// Every range of the image that differs from the original is covered by a rescue copy
/// (by device offset); restoring them all gives back the original image.
fn restore_all_and_compare(env: &TestEnv, d: &FaultDevice, original: &[u8]) {
    let now = std::fs::read(&d.image).unwrap();
    let copies: Vec<(std::path::PathBuf, reseq::testing::rescue::RescueHeader)> =
        rescue_files_in(&[env.state_dir(), env.run_dir()])
            .into_iter()
            .map(|p| (p.clone(), reseq::testing::rescue::load(&p).unwrap().0))
            .collect();
    for (i, (a, b)) in now.chunks(512).zip(original.chunks(512)).enumerate() {
        let at = i as u64 * 512;
        if a != b {
            assert!(
                copies.iter().any(|(_, h)| h.offset <= at && at < h.offset + h.len),
                "bytes at {at} differ and no rescue copy covers them: {copies:?}"
            );
        }
    }
    for (p, _) in &copies {
        let out = restore(env, p);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_same("the image after restoring every copy", &std::fs::read(&d.image).unwrap(), original);
}

fn rescue_files_in(dirs: &[std::path::PathBuf]) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    for d in dirs {
        if let Ok(r) = std::fs::read_dir(d) {
            v.extend(
                r.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("rescue-")),
            );
        }
    }
    v
}

/// A read-back that differs at one chunk and a torn write at the next, written while the
/// first was being read back: both are rescued, whatever the order they are seen in.
#[test]
fn a_torn_write_right_after_a_differing_read_back_is_rescued_too() {
    if !ready() {
        return;
    }
    for attempt in 0..3 {
        let env = TestEnv::new();
        let d = fault_loop_device(&env, &format!("two{attempt}"), 16 * MIB, 41, None);
        let original = std::fs::read(&d.image).unwrap();
        d.fs.add(Fault::new(FaultKind::AlterWrite, 5 * MIB + 4096, 512));
        d.fs.add(Fault::new(FaultKind::TearWrite, 6 * MIB + 65536, 65536));
        let out = rewrite(&env, &d, &[]);
        assert_eq!(out.status.code(), Some(5));
        d.fs.clear();
        restore_all_and_compare(&env, &d, &original);
    }
}

/// The device comes back under another name (loop and NVMe numbers change): its rescue
/// copy still stops every run on it, and restore takes it with --device.
#[test]
fn a_rescue_copy_follows_its_device_under_another_name() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let mut d = fault_loop_device(&env, "renamed", 16 * MIB, 42, None);
    let original = std::fs::read(&d.image).unwrap();
    d.fs.add(Fault::new(FaultKind::TearWrite, 5 * MIB, 8192));
    assert_eq!(rewrite(&env, &d, &[]).status.code(), Some(4));
    d.fs.clear();
    let rescue = rescue_files(&env).pop().expect("a rescue copy");
    // Detach, let another image take the number, attach the same disk again.
    let old = d.lo.path.clone();
    run_cmd(std::process::Command::new("losetup").arg("-d").arg(&old)).unwrap();
    let dummy_img = env.path("dummy");
    std::fs::write(&dummy_img, vec![0u8; MIB as usize]).unwrap();
    let out = run_cmd(std::process::Command::new("losetup").arg("--show").arg(&old).arg(&dummy_img)).unwrap();
    d.lo.path = std::path::PathBuf::from(out.trim()); // the struct now detaches the dummy
    let again =
        run_cmd(std::process::Command::new("losetup").args(["--direct-io=off", "--find", "--show"]).arg(d.fs.disk()))
            .unwrap();
    let again = LoopDevice { path: std::path::PathBuf::from(again.trim()), image: d.fs.disk() };
    assert_ne!(again.path, old);
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&again.path));
    assert_eq!(out.status.code(), Some(3), "a run on the renamed device refuses: {}", stderr(&out));
    assert!(stderr(&out).contains(&rescue.display().to_string()), "{}", stderr(&out));
    let out = restore(&env, &rescue);
    assert_eq!(out.status.code(), Some(3), "{old:?} is another device now");
    assert!(stderr(&out).contains("--device"), "{}", stderr(&out));
    let out = output(env.reseq().args(["restore", "--device"]).arg(&again.path).arg(&rescue));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_same("the image", &std::fs::read(&d.image).unwrap(), &original);
    drop(again);
}

/// Killed right after a torn write (before the thaw's housekeeping): the copy was saved
/// before any retry, so it is there, and the resume refuses until it is restored.
#[test]
fn a_kill_right_after_a_torn_write_keeps_the_rescue_copy() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "killtorn", 16 * MIB, 43, None);
    let original = std::fs::read(&d.image).unwrap();
    d.fs.add(Fault::new(FaultKind::TearWrite, 5 * MIB, 8192));
    let out = output(
        env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&d.lo.path).env("RESEQ_FAULTS", "kill@after-thaw#1"),
    );
    assert_eq!(out.status.code(), None, "killed");
    let rescue = rescue_files(&env).pop().expect("the copy survived the kill");
    d.fs.clear();
    let out = rewrite(&env, &d, &["--resume"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("reseq restore {}", rescue.display())), "{}", stderr(&out));
    restore_all_and_compare(&env, &d, &original);
    assert_eq!(rewrite(&env, &d, &["--resume"]).status.code(), Some(0));
}

/// A state directory that fills up during the run: the copy goes to the run directory,
/// and later runs find it there.
#[test]
fn a_rescue_copy_in_the_run_dir_is_found_by_later_runs() {
    if !ready() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "fullstate", 16 * MIB, 44, None);
    let original = std::fs::read(&d.image).unwrap();
    let state = tmpfs(&env.path("small-state"), "size=4m");
    d.fs.add(Fault::new(FaultKind::TearWrite, 5 * MIB, 8192));
    // The first write granted (its journal made), then held: the fill comes then, not
    // before the start-up's own check of the room (a fixed 500 ms once was, on a busy host).
    let granted = env.path("granted");
    let child = spawn_captured(
        env.reseq()
            .args(["rewrite", "--chunk-size", "1M"])
            .arg(&d.lo.path)
            .env("RESEQ_STATE_DIR", &state.dir)
            .env("RESEQ_FAULTS", format!("mark@after-permit#1={},delay@after-permit#1=1500", granted.display())),
    );
    assert!(wait_for_mark(&granted, std::time::Duration::from_secs(30)), "no write granted within 30 s");
    // Fill it once the journal is made (at the first write): the run had room, then not.
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=64k"])
        .arg(format!("of={}/filler", state.dir.display()))
        .output();
    let out = wait_captured(child);
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    let copies = rescue_files_in(&[env.run_dir()]);
    assert_eq!(copies.len(), 1, "the copy went to the run dir");
    let _ = std::fs::remove_file(state.dir.join("filler"));
    d.fs.clear();
    let out = output(
        env.reseq()
            .args(["rewrite", "--restart", "--chunk-size", "1M"])
            .arg(&d.lo.path)
            .env("RESEQ_STATE_DIR", &state.dir),
    );
    assert_eq!(out.status.code(), Some(3), "--restart refuses too: {}", stderr(&out));
    restore_all_and_compare(&env, &d, &original);
}

/// The journal's first record (the run) damaged: the resume refuses (it cannot tell what
/// the last run did); --restart starts over.
#[test]
fn a_damaged_first_journal_record_needs_restart() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("jfirst", 16 * MIB, 45);
    let before = hash_path(&lo.path).unwrap();
    let out = output(
        env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path).env("RESEQ_FAULTS", "write-error@10M"),
    );
    assert_eq!(out.status.code(), Some(4));
    let jpath = env.state_dir().join(format!("device-{}.journal", lo.name()));
    let mut bytes = std::fs::read(&jpath).unwrap();
    bytes[3] = if bytes[3] == b'0' { b'1' } else { b'0' };
    std::fs::write(&jpath, bytes).unwrap();
    for extra in [&["--resume"][..], &[][..]] {
        let out = output(env.reseq().args(["rewrite", "--chunk-size", "1M"]).args(extra).arg(&lo.path));
        assert_eq!(out.status.code(), Some(3), "{extra:?}");
        assert!(stderr(&out).contains("first record is damaged"), "{}", stderr(&out));
    }
    let out = output(env.reseq().args(["rewrite", "--restart", "--chunk-size", "1M"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(hash_path(&lo.path).unwrap(), before);
}

/// A write that tears and then stalls past the bound on a mounted filesystem: the
/// guardian kills reseq before it can keep anything. The guardian reads the granted
/// write back before it thaws and finds it torn, so the resume refuses and says so (a
/// stall that left the bytes intact resumes: see crash_and_resume.rs); --restart is the
/// admin's decision.
#[test]
fn a_guardian_kill_mid_write_makes_the_resume_refuse_a_changed_chunk() {
    if !ready() || !require(&["mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "gkill", 64 * MIB, 46, None);
    mkfs_ext4(&d.lo.path).unwrap();
    let mnt = Mount::new(&d.lo.path, &env.path("gkill-dir"), &[]).unwrap();
    let files = fill_files(&mnt.dir, 2, 4 << 20, 47);
    std::process::Command::new("sync").status().unwrap();
    // Tear inside file0's data, and stall right after that chunk's write.
    let f = std::fs::File::open(&files[0].0).unwrap();
    let at = reseq::testing::fiemap(std::os::fd::AsFd::as_fd(&f), 0, 0).unwrap()[0].physical + 8192;
    drop(f);
    d.fs.add(Fault::new(FaultKind::TearWrite, at, 4096));
    let args = ["rewrite", "--include-free", "--chunk-size", "1M", "--max-freeze", "500ms"];
    let stall = format!("delay@after-write#{}=5000", at / MIB + 1);
    let out = output(env.reseq().args(args).arg(&d.lo.path).env("RESEQ_FAULTS", stall));
    assert_eq!(out.status.code(), None, "killed by its guardian: {}", stderr(&out));
    assert!(!is_frozen(&mnt.dir));
    d.fs.clear();
    let out = output(env.reseq().args(args).arg("--resume").arg(&d.lo.path));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("when the guardian killed reseq") && err.contains("found torn"), "{err}");
}

/// The same in file mode, in a chunk shared by small files: the journal was only in
/// memory and nothing kept its bytes, but the guardian's note in the run directory
/// stops every later run until the bytes are back.
#[test]
fn a_guardian_kill_mid_write_in_a_shared_file_window_stops_later_runs() {
    if !ready() || !require(&["mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "gkillf", 64 * MIB, 48, None);
    mkfs_ext4(&d.lo.path).unwrap();
    let mnt = Mount::new(&d.lo.path, &env.path("gkillf-dir"), &[]).unwrap();
    let files = fill_files(&mnt.dir, 4, 40 << 10, 49);
    std::process::Command::new("sync").status().unwrap();
    let f = std::fs::File::open(&files[1].0).unwrap();
    let at = reseq::testing::fiemap(std::os::fd::AsFd::as_fd(&f), 0, 0).unwrap()[0].physical;
    drop(f);
    let original = direct_read(&d.lo.path, at, 40 << 10).unwrap();
    d.fs.add(Fault::new(FaultKind::TearWrite, at + 8192, 4096));
    let args = ["rewrite", "--max-freeze", "2s"];
    // The four files lie one after another: one chunk, one write, torn.
    let out = output(env.reseq().args(args).arg(&mnt.dir).env("RESEQ_FAULTS", "delay@after-write#1=8000"));
    assert_eq!(out.status.code(), None, "killed by its guardian: {}", stderr(&out));
    assert!(!is_frozen(&mnt.dir));
    d.fs.clear();
    for _ in 0..2 {
        let out = output(env.reseq().args(args).arg(&mnt.dir));
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(stderr(&out).contains("found torn when the guardian killed reseq"), "{}", stderr(&out));
    }
    // The bytes put back (from a backup, as the hint says): the note goes, the run works.
    direct_write(&d.lo.path, at, &original).unwrap();
    let out = output(env.reseq().args(args).arg("--resume").arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    mnt.unmount().unwrap();
    let mnt = Mount::new(&d.lo.path, &env.path("gkillf-dir"), &[]).unwrap();
    assert_files_intact(&files);
    drop(mnt);
}
