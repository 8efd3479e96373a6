//! `reseq rewrite` on real loop devices: mounted ext4 and xfs under a live writer, an
//! unmounted device, and a whole disk whose partition is mounted.

use std::process::Command;
use std::time::Duration;

use crate::common::*;

const MIB: u64 = 1 << 20;

/// A mounted filesystem with files and a process appending records through the whole
/// run: afterwards every file and every record is intact, fsck is clean, and the
/// filesystem takes writes.
fn mounted_with_writer(fs: &str) {
    if !require(&["losetup", "fsfreeze", if fs == "xfs" { "mkfs.xfs" } else { "mkfs.ext4" }]) {
        return;
    }
    let env = TestEnv::new();
    let size = 320 * MIB; // xfs needs 300 MiB at least
    let (lo, mnt) = env.mounted(fs, size, fs);
    let files = fill_files(&mnt.dir, 4, 8 << 20, 7);
    let appender = Appender::start(&mnt.dir, &mnt.dir.join("records.log"), &env.path("stop-writer"));
    std::thread::sleep(Duration::from_millis(200));

    let r = json_ok(
        env.reseq()
            .args(["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "300ms", "--pause", "50ms"])
            .arg(&lo.path)
            // Slow chunks down so the run spans several windows with the writer between.
            .env("RESEQ_FAULTS", "delay@after-write#*=20"),
    );
    // Used-space mode (the default): what is not free is rewritten, once, verified.
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    let skipped = r["space"]["bytes_skipped_as_free"].as_u64().unwrap();
    let holes = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
    assert_eq!(r["space"]["mode"], "used_space");
    assert_eq!(r["results"]["bytes_verified"], written);
    assert_eq!(written + skipped + holes, size, "every byte is rewritten, or skipped as free or as a hole");
    assert!(written >= 32 * MIB && written < size / 2, "rewrote {written} bytes for 32 MiB of files: {}", r["results"]);
    assert_eq!(r["verification"], "passed");
    assert_eq!(r["plan"]["filesystems_frozen"][0]["fs_type"], fs);
    let windows = r["results"]["windows"].as_u64().unwrap();
    assert!(windows >= 2, "expected several freeze windows, got {windows}");
    // Within the bound the run states (300 ms and a grace of 300 ms), which the guardian
    // enforces: under the standard load a window took 520 ms, thawed by the guardian.
    let bound = r["freeze_bound"]["bound_seconds"].as_f64().unwrap();
    assert!(bound <= 0.6 + 1e-9, "the bound of --max-freeze 300ms: {}", r["freeze_bound"]);
    let longest = r["results"]["longest_freeze_seconds"].as_f64().unwrap();
    assert!(longest <= bound, "a window of {longest} s ran past the bound of {bound} s");
    // 20-40 windows of 300 ms beside the rest of the suite on 2 cores: one or two overran
    // (each thawed by the guardian, within the bound checked above), with or without
    // the write-back before each write; beside the VM tests a thaw took up to 300 ms
    // (OPERATIONS.md). A writer that made windows overrun would do it in most of them.
    let overruns = r["results"]["windows_overrun"].as_u64().unwrap();
    eprintln!("{fs}: {overruns} of {windows} windows overran, the longest {longest} s");
    assert!(overruns <= (windows / 10).max(2), "{overruns} of {windows} windows overran");

    let records = appender.finish();
    assert!(records > 100, "the writer made little progress ({records} records): was it blocked?");
    assert_files_intact(&files);
    std::fs::write(mnt.dir.join("after"), b"thawed").expect("the filesystem takes writes after the run");
    assert!(!is_frozen(&mnt.dir));
    mnt.unmount().unwrap();
    match fs {
        "ext4" => run_cmd(Command::new("e2fsck").args(["-f", "-n"]).arg(&lo.path)).map(drop),
        _ => run_cmd(Command::new("xfs_repair").arg("-n").arg(&lo.path)).map(drop),
    }
    .expect("fsck clean after the run");
}

#[test]
fn mounted_ext4_with_concurrent_writer() {
    mounted_with_writer("ext4");
}

#[test]
fn mounted_xfs_with_concurrent_writer() {
    mounted_with_writer("xfs");
}

#[test]
fn unmounted_device_is_bit_identical_afterwards() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let size = 96 * MIB + 512 * 3; // not a multiple of the chunk: the last chunk is short
    let lo = env.random_loop_device("raw.img", size, 42);
    let before = hash_path(&lo.path).unwrap();
    let written_before = bytes_written_to(&lo.path);
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--chunk-size", "8M"]).arg(&lo.path));
    assert_eq!(r["results"]["bytes_written"], size);
    assert_eq!(r["plan"]["chunks_total"], 13);
    assert_eq!(r["results"]["windows"], 1, "no freeze, so one unbounded window");
    assert!(r["plan"]["max_freeze_seconds"].is_null());
    assert_eq!(hash_path(&lo.path).unwrap(), before, "device content changed");
    // The device really was written, once: host-side sectors match the report.
    let written = bytes_written_to(&lo.path) - written_before;
    assert!(written >= size && written <= size + MIB, "sysfs says {written} bytes written for {size}");
    // The report says so too, without --bench.
    let cost = r["write_cost"]["host_bytes_written"].as_u64().expect("the write cost, in every run");
    assert!(cost >= size && cost <= written, "the report's {cost} bytes written, sysfs's {written}");
}

#[test]
fn no_verify_skips_the_read_back_but_still_rewrites() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("nv.img", 32 * MIB, 5);
    let before = hash_path(&lo.path).unwrap();
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--no-verify"]).arg(&lo.path));
    assert_eq!(r["results"]["bytes_written"], 32 * MIB);
    assert_eq!(r["results"]["bytes_verified"], 0);
    assert_eq!(r["verification"], "off");
    assert_eq!(hash_path(&lo.path).unwrap(), before);
}

#[test]
fn dry_run_touches_nothing_and_shows_the_plan() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("dry", 64 * MIB, "ext4");
    // The mount's own commit first (every 5 s): not in the dry run's count.
    run_cmd(Command::new("sync").arg("-f").arg(&mnt.dir)).unwrap();
    let written_before = bytes_written_to(&lo.path);
    let out = output(
        env.reseq().args(["rewrite", "--dry-run", "-v", "--chunk-size", "2M", "--read-ahead", "3"]).arg(&lo.path),
    );
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("chunks: 32 of 2.0 MiB"), "{text}");
    assert!(text.contains("memory: 14.0 MiB"), "memory = (3 + 1 + 1 + 1 + 1) x 2 MiB: {text}");
    assert!(text.contains(&format!("freeze: {}", mnt.dir.display())), "{text}");
    assert!(text.contains("windows: at most 5.000 s"), "{text}");
    // A nearly empty filesystem: one window, and the prediction of it.
    assert!(text.contains("frozen: one window of about "), "{text}");
    assert!(text.contains("  prediction: ") && text.contains("about 1 window(s)"), "{text}");
    assert!(!env.state_dir().exists(), "a dry run created the state directory");
    assert_eq!(bytes_written_to(&lo.path), written_before, "a dry run wrote to the device");
    // Windows back to back: frozen nearly all the run, said with the way out; a pause as
    // long as a window frees writers half the time.
    fill_files(&mnt.dir, 8, 4 << 20, 5);
    let tight = ["rewrite", "--dry-run", "-v", "--max-freeze", "300ms", "--chunk-size", "4K"];
    let busy = output(env.reseq().args(tight).arg(&lo.path));
    let busy = String::from_utf8_lossy(&busy.stdout);
    assert!(busy.contains("frozen: about ") && busy.contains("writers wait most of the run: --pause "), "{busy}");
    let paused = output(env.reseq().args(tight).args(["--pause", "1s"]).arg(&lo.path));
    let paused = String::from_utf8_lossy(&paused.stdout);
    assert!(paused.contains("frozen: about ") && !paused.contains("writers wait"), "{paused}");
    let out = output(env.reseq().args(["rewrite", "--dry-run", "--json"]).arg(&lo.path));
    let r = json_report(&out);
    assert_eq!(r["dry_run"], true);
    assert_eq!(r["plan"]["memory_bytes"], 6 * 4 * MIB);
}

/// A whole disk with two partitions, one mounted: the disk's rewrite freezes the
/// partition's filesystem, and claims the unmounted one so nothing can mount it.
#[test]
fn whole_disk_freezes_filesystems_on_its_partitions() {
    if !require(&["losetup", "sfdisk", "partx", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::in_memory();
    // Random bytes: the unmounted p2 holds data all through (holes are never rewritten).
    let lo = env.random_loop_device("disk.img", 128 * MIB, 9);
    run_cmd(Command::new("sfdisk").arg("--quiet").arg(&lo.path).tap_stdin("label: dos\n,48M\n,48M\n")).unwrap();
    let parts = Partitions::add(&lo);
    mkfs_ext4(&parts.nodes[0]).unwrap();
    let mnt = Mount::new(&parts.nodes[0], &env.path("p1"), &[]).unwrap();
    let files = fill_files(&mnt.dir, 2, 4 << 20, 11);

    // The plan warns that the unmounted p2 is rewritten whole.
    let plan = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&lo.path));
    let p2 = parts.nodes[1].display().to_string();
    let said = format!("partition {p2} (48.0 MiB) is not mounted: all of it is rewritten");
    assert!(String::from_utf8_lossy(&plan.stdout).contains(&said), "{}", String::from_utf8_lossy(&plan.stdout));
    let out = output(env.reseq().args(["rewrite", "--json", "--max-freeze", "500ms"]).arg(&lo.path));
    let warnings = json_report(&out)["warnings"].to_string();
    assert!(warnings.contains(&said), "{warnings}");
    // p1's free space is skipped; the unmounted p2 and the partition table are rewritten.
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    let frozen = r["plan"]["filesystems_frozen"].as_array().unwrap();
    assert_eq!(frozen.len(), 1);
    assert_eq!(frozen[0]["mount_point"], mnt.dir.display().to_string());
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    let skipped = r["space"]["bytes_skipped_as_free"].as_u64().unwrap();
    let holes = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
    assert_eq!(written + skipped + holes, 128 * MIB);
    assert!(skipped > 20 * MIB, "p1's free space should be skipped ({skipped})");
    assert!(written > 48 * MIB, "p2 (unmounted, 48 MiB) is rewritten in full ({written})");
    assert_files_intact(&files);
    assert!(!is_frozen(&mnt.dir));
    mnt.unmount().unwrap();
    run_cmd(Command::new("e2fsck").args(["-f", "-n"]).arg(&parts.nodes[0])).unwrap();
}

/// Partition nodes for a loop device (no udev here: partx + mknod), removed on drop.
struct Partitions {
    nodes: Vec<std::path::PathBuf>,
    disk: std::path::PathBuf,
}

impl Partitions {
    fn add(lo: &LoopDevice) -> Partitions {
        let _ = Command::new("partx").arg("-a").arg(&lo.path).output();
        let mut nodes = Vec::new();
        for i in 1..=2 {
            let name = format!("{}p{i}", lo.name());
            let dev = std::fs::read_to_string(format!("/sys/class/block/{name}/dev")).expect("partition in sysfs");
            let (maj, min) = dev.trim().split_once(':').unwrap();
            let node = std::path::PathBuf::from(format!("/dev/{name}"));
            if !is_block_device(&node) {
                let _ = std::fs::remove_file(&node);
                run_cmd(Command::new("mknod").arg(&node).args(["b", maj, min])).unwrap();
            }
            nodes.push(node);
        }
        Partitions { nodes, disk: lo.path.clone() }
    }
}

impl Drop for Partitions {
    fn drop(&mut self) {
        for n in &self.nodes {
            let _ = std::fs::remove_file(n);
        }
        let _ = Command::new("partx").arg("-d").arg(&self.disk).output();
    }
}

trait TapStdin {
    fn tap_stdin(&mut self, input: &str) -> &mut Self;
}

impl TapStdin for Command {
    /// Feeds `input` on stdin through a temporary file.
    fn tap_stdin(&mut self, input: &str) -> &mut Self {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, input.as_bytes()).unwrap();
        std::io::Seek::rewind(&mut f).unwrap();
        self.stdin(f)
    }
}

/// The state directory and stderr both on the filesystem being frozen: a write there
/// during a window would block reseq until the guardian's deadline (an overrun). Held in
/// memory and written between windows, the run completes with no overrun.
#[test]
fn state_and_log_on_the_frozen_filesystem() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    // Dense: windows of the whole device (holes are not chunks).
    let (lo, mnt) = env.mounted_dense("self", 128 * MIB, "ext4");
    let log = std::fs::File::create(mnt.dir.join("reseq.log")).unwrap();
    let out = env
        .reseq()
        .args(["-v", "rewrite", "--json", "--include-free", "--chunk-size", "2M", "--max-freeze", "300ms"])
        .args(["--max-overruns", "1000"])
        .arg("--state-dir")
        .arg(mnt.dir.join("state"))
        .arg(&lo.path)
        .env("RUST_LOG", "debug")
        .env("RESEQ_FAULTS", "delay@after-write#*=10")
        .stderr(log)
        .output()
        .unwrap();
    let log_text = std::fs::read_to_string(mnt.dir.join("reseq.log")).unwrap();
    eprintln!("{log_text}");
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    // 300 ms windows, which overrun on a busy host (the thaw alone can take 300 ms there:
    // docs/OPERATIONS.md); what this tests is the state and the log on the frozen
    // filesystem, so the run is let through its overruns.
    assert!(r["results"]["windows"].as_u64().unwrap() >= 2);
    assert!(r["warnings"].to_string().contains("kept in memory during each window"));
    assert!(log_text.contains("window 2 froze for"), "log lines written between windows reached the file");
    let journal = reseq::testing::journal::read(&mnt.dir.join("state").join(format!("device-{}.journal", lo.name())))
        .unwrap()
        .unwrap();
    // Chunk sizes adapt under load, so count bytes: what holds data is journaled done, to
    // the last chunk written (the image's holes after it need nothing: sparse.rs).
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    assert!(journal.done_offset >= written && journal.done_offset <= 128 * MIB, "{}", journal.done_offset);
    let holes = r["space"]["bytes_skipped_as_holes"].as_u64().unwrap();
    assert!(journal.done >= (128 * MIB - holes) / (2 * MIB) && journal.finished);
}

/// `--rate` holds when the whole run fits one window (it was honoured only between
/// windows: 100M gave 468 MiB/s): 64 MiB at 16 MiB/s takes near 4 s, in several windows.
#[test]
fn rate_holds_for_a_run_that_fits_one_window() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    // Random bytes under the filesystem, kept by mkfs (no discard): all of it holds data,
    // but for the holes mkfs's zeroing leaves (its journal), which no run writes.
    let lo = env.random_loop_device("onewin", 64 * MIB, 12);
    run_cmd(Command::new("mkfs.ext4").args(["-q", "-F", "-E", "nodiscard"]).arg(&lo.path)).unwrap();
    let mnt = Mount::new(&lo.path, &env.path("onewin-mnt"), &[]).unwrap();
    let files = fill_files(&mnt.dir, 2, 4 << 20, 12);
    let t = std::time::Instant::now();
    let r = json_ok(
        env.reseq()
            .args(["rewrite", "--json", "--include-free", "--chunk-size", "1M", "--rate", "16M"])
            .args(["--max-overruns", "1000"])
            .arg(&lo.path),
    );
    let took = t.elapsed();
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    assert_eq!(written + r["space"]["bytes_skipped_as_holes"].as_u64().unwrap(), 64 * MIB);
    assert!(written >= 48 * MIB, "{written}");
    assert!(took >= Duration::from_secs(3), "{written} bytes at 16 MiB/s took only {took:?}");
    assert!(r["results"]["windows"].as_u64().unwrap() > 1, "{}", r["results"]);
    assert_files_intact(&files);
}
