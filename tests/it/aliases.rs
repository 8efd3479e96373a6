//! The target's bytes under another name (issue 26, item 1): a second loop device over
//! the same backing file (unmounted, mounted, at another offset), a process writing the
//! backing file (through a hard link, a bind mount), an alias of the filesystem's device
//! in file mode, and an alias that appears mid-run.
//!
//! Each refusal case runs a writer that rewrites random 4 KiB blocks with O_DIRECT and an
//! fdatasync each, and records the last value of each block whose fdatasync returned;
//! then reseq, which must exit 3 naming the alias, write nothing (the target loop
//! device's sectors-written counter does not move), and revert no block. Before the
//! check existed the same scenarios reverted fsync'd blocks, and some runs exited 0.

use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reseq::testing::AlignedBuf;

use crate::common::*;

const BLOCK: u64 = 4096;
const MAGIC: &[u8; 8] = b"ALIASBLK";

/// Rewrites random blocks (at `offsets` of `path`) until stopped, each with O_DIRECT and
/// an fdatasync; keeps, per block, the sequence number of its last write whose fdatasync
/// returned.
struct BlockWriter {
    stop: Arc<AtomicBool>,
    /// Writes whose fdatasync returned, so far.
    synced: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<Vec<u64>>>,
}

/// A block's contents: magic, its index, the sequence number, then a pattern of both.
fn block_bytes(buf: &mut [u8], index: u64, seq: u64) {
    let mut rng = XorShift::new(seq.wrapping_mul(0x9E37_79B9) ^ index);
    rng.fill(buf);
    buf[..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&index.to_le_bytes());
    buf[16..24].copy_from_slice(&seq.to_le_bytes());
}

impl BlockWriter {
    fn start(path: &Path, offsets: Vec<u64>, seed: u64) -> BlockWriter {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::libc::O_DIRECT)
            .open(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let stop = Arc::new(AtomicBool::new(false));
        let synced = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), synced.clone());
        let handle = std::thread::spawn(move || {
            let mut last = vec![0u64; offsets.len()];
            let (mut rng, mut buf) = (XorShift::new(seed), AlignedBuf::new(BLOCK as usize, BLOCK as usize));
            let mut seq = 0;
            while !s.load(Ordering::SeqCst) {
                seq += 1;
                let i = (rng.next_u64() % offsets.len() as u64) as usize;
                block_bytes(&mut buf, i as u64, seq);
                if f.write_all_at(&buf, offsets[i]).is_err() || f.sync_data().is_err() {
                    break;
                }
                last[i] = seq;
                n.fetch_add(1, Ordering::SeqCst);
            }
            last
        });
        // Writing before reseq starts: a count, not a sleep (an fdatasync on a busy
        // host's disk can take 100 ms).
        let w = BlockWriter { stop, synced, handle: Some(handle) };
        w.wait_for(20);
        w
    }

    /// Waits until `n` writes have been acknowledged (at most 60 s).
    fn wait_for(&self, n: u64) {
        let t = Instant::now();
        while self.synced.load(Ordering::SeqCst) < n {
            assert!(t.elapsed() < Duration::from_secs(60), "the writer acknowledged fewer than {n} writes in 60 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the writer, once it has written enough blocks for the check to mean
    /// something; the last acknowledged sequence number of each block.
    fn finish(mut self) -> Vec<u64> {
        self.wait_for(150);
        self.stop.store(true, Ordering::SeqCst);
        self.handle.take().unwrap().join().unwrap()
    }
}

impl Drop for BlockWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The blocks (read with O_DIRECT at `offsets` of `path`) that hold an older write than
/// the last acknowledged one: fsync'd data lost.
fn reverted(path: &Path, offsets: &[u64], last: &[u64]) -> Vec<usize> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(nix::libc::O_DIRECT).open(path).unwrap();
    let mut buf = AlignedBuf::new(BLOCK as usize, BLOCK as usize);
    let mut out = Vec::new();
    for (i, (&off, &want)) in offsets.iter().zip(last).enumerate() {
        f.read_exact_at(&mut buf, off).unwrap();
        let seq = if &buf[..8] == MAGIC { u64::from_le_bytes(buf[16..24].try_into().unwrap()) } else { 0 };
        if seq < want {
            out.push(i);
        }
    }
    out
}

/// 2,048 blocks from `start`.
fn blocks_from(start: u64) -> Vec<u64> {
    (0..2048).map(|i| start + i * BLOCK).collect()
}

/// Asserts the run was refused before any write, naming `names`, and that the writer lost
/// nothing (its blocks read back at `image_offsets` of `image`).
fn assert_refused_and_nothing_lost(
    out: &std::process::Output,
    target: &Path,
    written_before: u64,
    names: &[&str],
    writer: BlockWriter,
    (image, image_offsets): (&Path, &[u64]),
) {
    let last = writer.finish();
    let lost = reverted(image, image_offsets, &last);
    let wrote = bytes_written_to(target) - written_before;
    eprintln!(
        "exit {:?}, reseq wrote {wrote} bytes, {} of {} fsync'd blocks reverted",
        out.status.code(),
        lost.len(),
        last.iter().filter(|&&s| s > 0).count()
    );
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(3), "refused: {err}");
    for n in names {
        assert!(err.contains(n), "the refusal names {n}: {err}");
    }
    assert_eq!(wrote, 0, "reseq wrote nothing to {}", target.display());
    assert!(last.iter().filter(|&&s| s > 0).count() > 100, "the writer wrote (fsync'd) over 100 blocks");
    assert!(lost.is_empty(), "{} of {} fsync'd blocks went back to older contents: {lost:?}", lost.len(), last.len());
}

/// `reseq rewrite` of `dev`, chunks of 1 MiB, each write delayed (a run long enough for
/// any race to show).
fn rewrite(env: &TestEnv, dev: &Path) -> std::process::Output {
    output(env.reseq().env("RESEQ_FAULTS", "delay@after-write#*=20").args(["rewrite", "--chunk-size", "1M"]).arg(dev))
}

/// The case: a second loop device over the target's image, written by a process.
/// loop0 looks unmounted and free (O_EXCL succeeds): only its backing file tells.
#[test]
fn a_second_loop_over_the_same_file_is_refused() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("a.img", 16 << 20, 1);
    let alias = LoopDevice::attach(&lo.image, &[]).unwrap();
    let offsets = blocks_from(4 << 20);
    let writer = BlockWriter::start(&alias.path, offsets.clone(), 2);
    let before = bytes_written_to(&lo.path);
    let out = rewrite(&env, &lo.path);
    let names = [&*alias.path.to_string_lossy(), "backed by the same file as", &*lo.path.to_string_lossy()];
    assert_refused_and_nothing_lost(&out, &lo.path, before, &names, writer, (&lo.image, &offsets));
}

/// The filesystem is mounted from the alias, loop0 is not: loop0 is effectively mounted,
/// and freezing nothing would leave the filesystem writing under the rewrite.
#[test]
fn a_filesystem_mounted_from_an_alias_is_refused() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("m.img", 64 << 20);
    let alias = LoopDevice::attach(&lo.image, &[]).unwrap();
    mkfs_ext4(&alias.path).unwrap();
    let m = Mount::new(&alias.path, &env.path("alias-mnt"), &[]).unwrap();
    let file = m.dir.join("blocks");
    std::fs::write(&file, vec![0u8; 8 << 20]).unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    let offsets = blocks_from(0);
    let writer = BlockWriter::start(&file, offsets.clone(), 3);
    let before = bytes_written_to(&lo.path);
    let out = rewrite(&env, &lo.path);
    let mnt = m.dir.display().to_string();
    let names = [&*alias.path.to_string_lossy(), "mounted from it at", &*mnt];
    assert_refused_and_nothing_lost(&out, &lo.path, before, &names, writer, (&file, &offsets));
    drop(m);
    fsck_clean(&alias.path, "ext4");
}

/// An alias over another part of the same file (`losetup --offset`): refused too, and the
/// message says where it starts.
#[test]
fn an_alias_at_another_offset_is_refused() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("o.img", 16 << 20, 4);
    let alias = LoopDevice::attach(&lo.image, &["--offset", "1048576"]).unwrap();
    // The writer's blocks through the alias are the target's from 4 MiB on.
    let writer = BlockWriter::start(&alias.path, blocks_from(3 << 20), 5);
    let before = bytes_written_to(&lo.path);
    let out = rewrite(&env, &lo.path);
    let names = [&*alias.path.to_string_lossy(), "at offset 1048576"];
    assert_refused_and_nothing_lost(&out, &lo.path, before, &names, writer, (&lo.image, &blocks_from(4 << 20)));
}

/// A process writing the backing file itself, here through a hard link (another path,
/// one inode): refused, naming the PID and the loop device whose file it is.
#[test]
fn a_process_writing_the_backing_file_through_a_hard_link_is_refused() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("h.img", 16 << 20, 6);
    let link = env.path("hard-link.img");
    std::fs::hard_link(&lo.image, &link).unwrap();
    let offsets = blocks_from(4 << 20);
    let writer = BlockWriter::start(&link, offsets.clone(), 7);
    let before = bytes_written_to(&lo.path);
    let out = rewrite(&env, &lo.path);
    let pid = format!("PID {}", std::process::id());
    let names = [&*pid, "open for writing", "hard-link.img", "the backing file of"];
    assert_refused_and_nothing_lost(&out, &lo.path, before, &names, writer, (&lo.image, &offsets));
}

/// The same through a bind mount of the image's directory (one filesystem, one inode).
#[test]
fn a_process_writing_the_backing_file_through_a_bind_mount_is_refused() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("b.img", 16 << 20, 8);
    let bind = Mount::new(env.dir.path(), &env.path("bind"), &["bind"]).unwrap();
    let offsets = blocks_from(4 << 20);
    let writer = BlockWriter::start(&bind.dir.join("b.img"), offsets.clone(), 9);
    let before = bytes_written_to(&lo.path);
    let out = rewrite(&env, &lo.path);
    let pid = format!("PID {}", std::process::id());
    let names = [&*pid, "bind/b.img", "the backing file of"];
    assert_refused_and_nothing_lost(&out, &lo.path, before, &names, writer, (&lo.image, &offsets));
}

/// A backing file unlinked after the loop was attached: sysfs shows "(deleted)" and no
/// path leads to it, but the kernel still names its inode, and so does the writer's fd.
#[test]
fn a_process_writing_a_deleted_backing_file_is_refused() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("del.img", 16 << 20, 16);
    let offsets = blocks_from(4 << 20);
    let writer = BlockWriter::start(&lo.image, offsets.clone(), 17);
    std::fs::remove_file(&lo.image).unwrap();
    let before = bytes_written_to(&lo.path);
    let out = rewrite(&env, &lo.path);
    let pid = format!("PID {}", std::process::id());
    let names = [&*pid, "del.img (deleted)", "the backing file of"];
    // The image is gone: its blocks are read back through the loop device.
    assert_refused_and_nothing_lost(&out, &lo.path, before, &names, writer, (&lo.path, &offsets));
}

/// File mode: the filesystem's device is a loop device, and a second loop over its image
/// reaches the very blocks of the file being rewritten.
#[test]
fn file_mode_refuses_an_alias_of_the_filesystems_device() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("f.img", 64 << 20);
    mkfs_ext4(&lo.path).unwrap();
    let m = Mount::new(&lo.path, &env.path("f-mnt"), &["noatime"]).unwrap();
    let dir = m.dir.join("data");
    std::fs::create_dir(&dir).unwrap();
    fill_files(&dir, 1, 8 << 20, 10);
    let offsets = physical_blocks(&dir.join("file0.bin"));
    let alias = LoopDevice::attach(&lo.image, &[]).unwrap();
    let writer = BlockWriter::start(&alias.path, offsets.clone(), 11);
    let before = bytes_written_to(&lo.path);
    let out = rewrite(&env, &dir);
    let names = [&*alias.path.to_string_lossy(), "backed by the same file as"];
    assert_refused_and_nothing_lost(&out, &lo.path, before, &names, writer, (&lo.image, &offsets));
    drop(m);
    fsck_clean(&lo.path, "ext4");
}

/// The device offset of each 4 KiB block of a file, in file order (FIEMAP).
fn physical_blocks(file: &Path) -> Vec<u64> {
    let f = std::fs::File::open(file).unwrap();
    let extents = reseq::testing::fiemap(f.as_fd(), 0, reseq::testing::FIEMAP_FLAG_SYNC).unwrap();
    let blocks: Vec<u64> =
        extents.iter().flat_map(|e| (0..e.length / BLOCK).map(move |i| e.physical + i * BLOCK)).take(2048).collect();
    assert_eq!(blocks.len(), 2048, "the file is mapped");
    blocks
}

/// Starts `reseq rewrite` of `dev` (64 MiB, slowed), and once it has written 2 MiB (its
/// first check is behind it) calls `appear`; returns reseq's output and the bytes it
/// wrote after `appear` returned.
fn run_while_appearing<T>(env: &TestEnv, dev: &Path, appear: impl FnOnce() -> T) -> (std::process::Output, u64, T) {
    let start = bytes_written_to(dev);
    let child = spawn_captured(
        env.reseq()
            .env("RESEQ_FAULTS", "delay@after-write#*=20")
            .args(["rewrite", "--json", "--chunk-size", "1M"])
            .arg(dev),
    );
    let t = std::time::Instant::now();
    while bytes_written_to(dev) < start + (2 << 20) && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let made = appear();
    let at_appearance = bytes_written_to(dev);
    let out = wait_captured(child);
    (out, bytes_written_to(dev) - at_appearance, made)
}

/// The run stopped (exit 4, resumable) soon after the alias appeared: what it wrote
/// after is at most what 300 ms between scans and a window's chunks in flight allow,
/// far from the rest of the device; every byte is still the original.
fn assert_stopped_soon(out: &std::process::Output, after: u64, names: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    for n in names.iter().chain(&["--resume"]) {
        assert!(err.contains(n), "the message names {n}: {err}");
    }
    let r = json_report(out);
    let total = r["results"]["bytes_written"].as_u64().unwrap();
    eprintln!("reseq wrote {total} bytes, {after} of them after the alias appeared");
    assert!(total > 0 && total < 64 << 20, "stopped after the start and before the end");
    assert!(after <= 24 << 20, "wrote {after} bytes after the alias appeared");
}

/// An alias attached after the run started stops it before it writes more (exit 4) and
/// says why; the device holds what it held.
#[test]
fn an_alias_attached_mid_run_stops_it() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("late.img", 64 << 20, 12);
    let before = hash_path(&lo.path).unwrap();
    let (out, after, alias) = run_while_appearing(&env, &lo.path, || LoopDevice::attach(&lo.image, &[]).unwrap());
    assert_stopped_soon(&out, after, &[&alias.path.to_string_lossy()]);
    // Whichever look saw it first: the other-writers check or the device's shape.
    let err = stderr(&out);
    assert!(err.contains("backed by the same file as") || err.contains("loop devices over the same bytes"), "{err}");
    drop(alias);
    assert_eq!(hash_path(&lo.path).unwrap(), before, "the bytes are the same");
}

/// A process that opens the backing file for writing after the run started stops it too.
#[test]
fn a_process_opening_the_backing_file_mid_run_stops_it() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("late2.img", 64 << 20, 13);
    let before = hash_path(&lo.path).unwrap();
    let (out, after, mut holder) = run_while_appearing(&env, &lo.path, || hold_open(&lo.image));
    let _ = holder.kill();
    let _ = holder.wait();
    let pid = format!("PID {}", holder.id());
    assert_stopped_soon(&out, after, &[&pid, "the backing file of"]);
    assert_eq!(hash_path(&lo.path).unwrap(), before, "the bytes are the same");
}

/// The dry run names the backing file and says what no check on this host can see, in
/// device and in file mode.
#[test]
fn the_dry_run_names_the_backing_file_and_what_cannot_be_seen() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, m) = env.mounted("d.img", 64 << 20, "ext4");
    std::fs::write(m.dir.join("x"), vec![1u8; 1 << 20]).unwrap();
    let image: PathBuf = lo.image.clone();
    for target in [lo.path.clone(), m.dir.clone()] {
        let out = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&target));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&format!("the backing file of {}", lo.path.display())), "{text}");
        assert!(text.contains(&*image.to_string_lossy()), "{text}");
        assert!(text.contains("not visible from this host: another host or VM"), "{text}");
    }
}
