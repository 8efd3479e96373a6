//! Never-written space (issue 48): the holes of a loop device's sparse backing file are
//! left out, so the image does not grow; the plan and the report say how much and why;
//! the depth line counts the bytes the run rewrites. Checked from outside: `stat` of the
//! image, the loop device's written-sectors counter, the files' hashes, fsck.

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use reseq::testing::human_bytes;

use crate::common::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Bytes the image takes on its filesystem (`stat -c %b` x 512).
fn allocated(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// A 4 TiB sparse image, ext4 made with mkfs's defaults (inode tables left unwritten,
/// lazily), mounted without the thread that would write them, with 192 MiB of files:
/// GETFSMAP calls 30-odd GiB of never-written inode tables in use. The used-space run
/// writes what holds data, and the image grows by less than 1 % of what was rewritten.
#[test]
fn a_sparse_image_with_lazy_inode_tables_does_not_grow() {
    if !require(&["losetup", "mkfs.ext4", "e2fsck", "sync"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("big", 4 << 40);
    run_cmd(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&lo.path)).unwrap();
    let mnt = Mount::new(&lo.path, &env.path("big-mnt"), &["noinit_itable"]).unwrap();
    let files = fill_files(&mnt.dir, 3, 64 << 20, 48);
    run_cmd(&mut Command::new("sync")).unwrap();

    let dry = json_ok(env.reseq().args(["rewrite", "--dry-run", "--json"]).arg(&lo.path));
    let holes = &dry["plan"]["holes"];
    assert_eq!(holes["mapped"], true, "{holes}");
    let (in_holes, to_rewrite) =
        (holes["bytes_in_holes"].as_u64().unwrap(), holes["bytes_to_rewrite"].as_u64().unwrap());
    assert!(in_holes > 16 * GIB, "the never-written inode tables are holes: {holes}");
    assert!((192 * MIB..GIB).contains(&to_rewrite), "the files and the metadata written: {holes}");
    assert_eq!(dry["prediction"]["bytes_to_rewrite"], to_rewrite, "{}", dry["prediction"]);
    // The depth line: the bytes of this run, not the device's nor the used space's.
    let why = dry["pipeline_depth"]["why"].as_str().unwrap();
    assert!(why.starts_with(&format!("{} to rewrite", human_bytes(to_rewrite))), "{why}");

    let (before, counter) = (allocated(&lo.image), bytes_written_to(&lo.path));
    let out = output(env.reseq().args(["rewrite", "--json", "--no-trim"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json_report(&out);
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    let by_counter = bytes_written_to(&lo.path) - counter;
    let skipped = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
    let grew = allocated(&lo.image).saturating_sub(before);
    eprintln!("written {written} (counter {by_counter}), holes skipped {skipped}, image grew {grew}");
    assert!(written >= 192 * MIB && written <= to_rewrite + 8 * MIB, "{written} of {to_rewrite}");
    // What the device saw: the run's writes and ext4's own (freeze and thaw commits).
    assert!(by_counter <= written + 16 * MIB, "the loop device was written {by_counter} bytes");
    assert!(skipped + 8 * MIB >= in_holes, "{skipped} of {in_holes} left out as holes");
    assert!(grew * 100 < written, "the image grew {grew} bytes for {written} rewritten");
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// An unmounted sparse device (one long window, no freeze): only the ranges written
/// are rewritten, byte for byte; nothing is written into the holes.
#[test]
fn an_unmounted_sparse_device_is_rewritten_where_it_holds_data() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("holes", 64 * GIB);
    let mut rng = XorShift::new(7);
    let places = [(0, 4 * MIB), (3 * GIB + 512 * 1024, 5 * MIB), (40 * GIB, MIB), (64 * GIB - 2 * MIB, 2 * MIB)];
    let mut hashes = Vec::new();
    {
        use std::os::unix::fs::FileExt;
        let dev = std::fs::OpenOptions::new().write(true).open(&lo.path).unwrap();
        for &(at, len) in &places {
            let mut buf = vec![0u8; len as usize];
            rng.fill(&mut buf);
            dev.write_all_at(&buf, at).unwrap();
            hashes.push(blake3::hash(&buf));
        }
        dev.sync_all().unwrap();
    }
    let data: u64 = places.iter().map(|p| p.1).sum();
    let (before, counter) = (allocated(&lo.image), bytes_written_to(&lo.path));
    let r = json_ok(env.reseq().args(["rewrite", "--json"]).arg(&lo.path));
    assert_eq!(r["results"]["bytes_written"], data, "{}", r["results"]);
    assert_eq!(r["space"]["bytes_skipped_as_holes"], 64 * GIB - data, "{}", r["space"]);
    assert_eq!(r["plan"]["holes"]["bytes_to_rewrite"], data);
    assert_eq!(bytes_written_to(&lo.path) - counter, data, "the loop device's own counter");
    assert_eq!(allocated(&lo.image), before, "the image did not grow");
    use std::os::unix::fs::FileExt;
    let dev = std::fs::File::open(&lo.path).unwrap();
    for (&(at, len), h) in places.iter().zip(&hashes) {
        let mut buf = vec![0u8; len as usize];
        dev.read_exact_at(&mut buf, at).unwrap();
        assert_eq!(blake3::hash(&buf), *h, "the data at {at}");
    }
}

/// File mode's depth line counts the files' bytes (96 MiB here), not the device's
/// (8 GiB), and is chosen after the plan.
#[test]
fn file_modes_depth_line_counts_the_files() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("fm", 8 * GIB, "ext4");
    fill_files(&mnt.dir, 3, 32 << 20, 5);
    run_cmd(&mut Command::new("sync")).unwrap();
    let dry = json_ok(env.reseq().args(["rewrite", "--dry-run", "--json"]).arg(&mnt.dir));
    let why = dry["pipeline_depth"]["why"].as_str().unwrap();
    assert!(why.starts_with(&format!("{} to rewrite", human_bytes(96 * MIB))), "{why}");
    assert_eq!(dry["pipeline_depth"]["source"], "fallback");
}
