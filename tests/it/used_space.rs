//! Used-space device mode: on a mounted ext4 about 30 % full, only what is in use is
//! written, files survive, fsck is clean, and FITRIM afterwards shows in the sparse
//! backing file (a loop device turns discards into hole punches).

use std::process::Command;

use crate::common::*;

const MIB: u64 = 1 << 20;

fn du_bytes(p: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn ext4_thirty_percent_full_writes_only_used_space_and_trims() {
    if !require(&["losetup", "mkfs.ext4", "e2fsck", "df"]) {
        return;
    }
    let env = TestEnv::new();
    let size = 256 * MIB;
    let (lo, mnt) = env.mounted("used", size, "ext4");
    // Fill ~80 %, then delete most of it: the freed blocks are allocated in the backing
    // file (ext4 does not discard on delete without -o discard) but free in ext4.
    let files = fill_files(&mnt.dir, 10, 20 << 20, 77);
    for (p, _) in &files[..7] {
        std::fs::remove_file(p).unwrap();
    }
    run_cmd(&mut Command::new("sync")).unwrap();
    let kept = &files[7..];
    let df = run_cmd(Command::new("df").args(["-B1", "--output=size,used"]).arg(&mnt.dir)).unwrap();
    let mut nums = df.lines().nth(1).unwrap().split_whitespace().map(|n| n.parse::<u64>().unwrap());
    let (df_size, used) = (nums.next().unwrap(), nums.next().unwrap());
    // df leaves the metadata (journal, inode tables, bitmaps) out of both its size and
    // its usage: that overhead is the device size minus df's size.
    let metadata = size - df_size;
    let du_before = du_bytes(&lo.image);
    assert!(du_before > 180 * MIB, "the deleted files' blocks should still be allocated ({du_before})");

    let out = output(env.reseq().args(["rewrite", "--json"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    let skipped = r["space"]["bytes_skipped_as_free"].as_u64().unwrap();
    let holes = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
    let trimmed = r["space"]["bytes_trimmed"].as_u64().unwrap();
    eprintln!("df used {used} + metadata {metadata}, written {written}, skipped {skipped}, trimmed {trimmed}");
    // GETFSMAP's view: everything not FREE is written, the rest skipped (the image's
    // holes, never written, are left out too: tests/it/sparse.rs).
    assert_eq!(written + skipped + holes, size);
    // df's view: what is used, plus the metadata, and nothing more (1 MiB of slack for
    // blocks the filesystem allocates while we run).
    assert!(written <= used + metadata + MIB, "wrote {written} bytes for {used} used + {metadata} metadata");
    assert!(written >= 60 * MIB, "the 60 MiB of files must be rewritten ({written})");
    // Progress and its ETA count the bytes in use, not the device.
    let line = stderr(&out).lines().find(|l| l.contains("progress and ETA count those")).map(str::to_string);
    let line = line.unwrap_or_else(|| panic!("no in-use estimate logged: {}", stderr(&out)));
    assert!(!line.contains(&format!("{} of", reseq::testing::human_bytes(size))), "{line}");
    assert!(trimmed > 150 * MIB, "FITRIM should discard the free space ({trimmed})");
    assert_files_intact(kept);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
    let du_after = du_bytes(&lo.image);
    // The holes left out include unwritten extents (mkfs's WRITE ZEROES of the journal
    // becomes a fallocate in the image): allocated, read as zeros, never written.
    let bound = written + holes + 16 * MIB;
    assert!(du_after < bound, "the image still holds {du_after} bytes after FITRIM");
}

#[test]
fn include_free_and_no_trim_rewrite_everything_and_keep_the_blocks() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("all", 128 * MIB, "ext4");
    fill_files(&mnt.dir, 2, 8 << 20, 3);
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--include-free", "--no-trim"]).arg(&lo.path));
    assert_eq!(r["space"]["mode"], "everything");
    // Everything that holds data: the image's holes were never written (sparse.rs).
    let holes = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
    assert_eq!(r["results"]["bytes_written"].as_u64().unwrap() + holes, 128 * MIB);
    assert!(r["space"]["bytes_trimmed"].is_null());
}

#[test]
fn an_unmounted_device_is_rewritten_whole_with_a_warning() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("unm", 64 * MIB);
    mkfs_ext4(&lo.path).unwrap();
    let out = output(env.reseq().args(["rewrite", "--json"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    let holes = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
    assert_eq!(r["results"]["bytes_written"].as_u64().unwrap() + holes, 64 * MIB);
    assert!(stderr(&out).contains("mount its ext4/xfs filesystem and run reseq again"));
}
