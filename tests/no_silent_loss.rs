//! No silent loss: whatever the device does to reseq's reads and writes (fails them,
//! tears them, stores something else), reseq never reports success over data that is not
//! what was there. The device faults come from a FUSE filesystem under a loop device
//! (`common/faultfs.rs`), so they reach reseq through the kernel as a failing disk's would.
//!
//! The first tests here check that harness itself, through the loop device with O_DIRECT.

mod common;
#[path = "common/faultfs.rs"]
mod faultfs;

use std::path::Path;

use common::*;
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
