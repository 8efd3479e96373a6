//! File mode on real ext4 and xfs: a file fragmented on purpose, a live writer, awkward
//! files, and the filesystems and files that are refused.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::process::Command;

use crate::common::*;

const MIB: u64 = 1 << 20;

/// Grows `target` and two other files in turns of 64 KiB with an fsync each, so their
/// extents interleave on disk.
fn fragmented_file(dir: &std::path::Path, size: usize) -> (std::path::PathBuf, blake3::Hash) {
    let path = dir.join("table.db");
    let mut files: Vec<std::fs::File> =
        ["table.db", "other1", "other2"].iter().map(|n| std::fs::File::create(dir.join(n)).unwrap()).collect();
    let mut rng = XorShift::new(11);
    let mut data = vec![0u8; size];
    rng.fill(&mut data);
    let mut junk = vec![0u8; 64 << 10];
    for piece in data.chunks(64 << 10) {
        files[0].write_all(piece).unwrap();
        files[0].sync_data().unwrap();
        for f in &mut files[1..] {
            rng.fill(&mut junk);
            f.write_all(&junk).unwrap();
            f.sync_data().unwrap();
        }
    }
    (path, blake3::hash(&data))
}

fn drop_caches() {
    run_cmd(&mut Command::new("sync")).unwrap();
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

/// The bytes of `path` read from the raw device at the places FIEMAP gives.
fn bytes_via_device(path: &std::path::Path, dev: &std::path::Path) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let size = f.metadata().unwrap().len();
    let exts = reseq::testing::fiemap(f.as_fd(), 0, reseq::testing::FIEMAP_FLAG_SYNC).unwrap();
    let d = std::fs::File::open(dev).unwrap();
    let mut out = vec![0u8; size as usize];
    for e in exts {
        let n = e.length.min(size.saturating_sub(e.logical));
        d.read_exact_at(&mut out[e.logical as usize..(e.logical + n) as usize], e.physical).unwrap();
    }
    out
}

fn fragmented_file_is_rewritten_intact(fs: &str) {
    if !require(&["losetup", "fsfreeze", if fs == "xfs" { "mkfs.xfs" } else { "mkfs.ext4" }]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted(fs, 320 * MIB, fs);
    let (path, hash) = fragmented_file(&mnt.dir, 24 << 20);
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--max-freeze", "500ms", "--chunk-size", "1M"]).arg(&path));
    let f = &r["files"][0];
    assert!(f["extents"].as_u64().unwrap() > 3, "the file should be fragmented: {f}");
    assert_eq!(f["bytes_rewritten"], 24 * MIB, "every byte of the file, once");
    assert_eq!(f["verification"], "passed");
    // What the host wrote, in file mode too, without --bench: the file and what the
    // filesystem wrote meanwhile.
    let cost = r["write_cost"]["host_bytes_written"].as_u64().expect("the write cost, in every run");
    assert!((24 * MIB..48 * MIB).contains(&cost), "host bytes written {cost}");
    assert!(f["skipped_reason"].is_null());
    assert_eq!(r["plan"]["files"][0]["bytes_to_rewrite"], 24 * MIB, "{}", r["plan"]);
    drop_caches();
    assert_eq!(hash_path(&path).unwrap(), hash, "content through the filesystem changed");
    assert_eq!(
        blake3::hash(&bytes_via_device(&path, &lo.path)),
        hash,
        "the device ranges FIEMAP gives differ from the file"
    );
    assert!(!is_frozen(&mnt.dir));
    mnt.unmount().unwrap();
    match fs {
        "ext4" => run_cmd(Command::new("e2fsck").args(["-f", "-n"]).arg(&lo.path)).map(drop),
        _ => run_cmd(Command::new("xfs_repair").arg("-n").arg(&lo.path)).map(drop),
    }
    .expect("fsck clean");
}

#[test]
fn fragmented_file_on_ext4() {
    fragmented_file_is_rewritten_intact("ext4");
}

#[test]
fn fragmented_file_on_xfs() {
    fragmented_file_is_rewritten_intact("xfs");
}

/// A writer appends to the very file being rewritten, through many short windows.
#[test]
fn a_live_writer_on_the_same_file_loses_nothing() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("live", 256 * MIB, "ext4");
    let log = mnt.dir.join("records.log");
    // Some history first, so there is something to rewrite.
    let mut f = std::fs::File::create(&log).unwrap();
    for i in 1..=20000 {
        writeln!(f, "record {i}").unwrap();
    }
    drop(f);
    let appender = Appender::start_from(&mnt.dir, &log, &env.path("stop"), 20001);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let r = json_ok(
        env.reseq()
            .args(["rewrite", "--json", "--max-freeze", "200ms", "--pause", "50ms", "--chunk-size", "64K"])
            // Overruns under load are counted, not fatal: the longest freeze is checked below.
            .args(["--max-overruns", "1000"])
            .arg(&log)
            .env("RESEQ_FAULTS", "delay@after-write#*=20"),
    );
    assert!(r["results"]["windows"].as_u64().unwrap() >= 2, "expected several windows");
    assert!(r["results"]["longest_freeze_seconds"].as_f64().unwrap() < 0.2 + 0.5);
    let records = appender.finish();
    assert!(records > 20000, "the writer was blocked for the whole run");
    assert!(!is_frozen(&mnt.dir));
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn awkward_files_write_only_their_data() {
    if !require(&["losetup", "mkfs.ext4", "fallocate"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("awk", 256 * MIB, "ext4");
    let d = &mnt.dir;
    // Sparse: 1 MiB of data, a 10 MiB hole, 1 MiB of data.
    let sparse = std::fs::File::create(d.join("sparse")).unwrap();
    sparse.write_all_at(&[7u8; 1 << 20], 0).unwrap();
    sparse.write_all_at(&[9u8; 1 << 20], 11 << 20).unwrap();
    sparse.sync_all().unwrap();
    // Fallocated: 4 MiB allocated but never written, then 1 MiB of data.
    run_cmd(Command::new("fallocate").args(["-l", "4M"]).arg(d.join("prealloc"))).unwrap();
    let pre = std::fs::OpenOptions::new().write(true).open(d.join("prealloc")).unwrap();
    pre.write_all_at(&[5u8; 1 << 20], 4 << 20).unwrap();
    pre.sync_all().unwrap();
    std::fs::File::create(d.join("empty")).unwrap();
    // A tree of small files, and an excluded one.
    for i in 0..1000 {
        let sub = d.join(format!("tree/{}", i % 10));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i}")), vec![i as u8; 4096]).unwrap();
    }
    std::fs::write(d.join("tree/skip.tmp"), vec![1u8; 8192]).unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    drop((sparse, pre));
    let hashes: Vec<_> = ["sparse", "prealloc"].iter().map(|n| hash_path(&d.join(n)).unwrap()).collect();

    let out = output(
        env.reseq()
            .args(["rewrite", "--json", "--chunk-size", "1M", "--exclude", "*.tmp"])
            .arg(d.join("sparse"))
            .arg(d.join("prealloc"))
            .arg(d.join("empty"))
            .arg(d.join("tree")),
    );
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    let files = r["files"].as_array().unwrap();
    assert_eq!(files.len(), 3 + 1000, "the excluded file is left out");
    let by = |name: &str| files.iter().find(|f| f["path"].as_str().unwrap().ends_with(name)).unwrap().clone();
    assert_eq!(by("/sparse")["bytes_rewritten"], 2 * MIB, "holes are never written");
    assert_eq!(by("/sparse")["bytes_skipped_holes"], 10 * MIB);
    assert_eq!(by("/prealloc")["bytes_rewritten"], MIB, "unwritten extents are never written");
    assert_eq!(by("/prealloc")["bytes_skipped_unwritten"], 4 * MIB);
    assert_eq!(by("/empty")["bytes_rewritten"], 0);
    let tree: u64 = files
        .iter()
        .filter(|f| f["path"].as_str().unwrap().contains("/tree/"))
        .map(|f| f["bytes_rewritten"].as_u64().unwrap())
        .sum();
    assert_eq!(tree, 1000 * 4096);
    drop_caches();
    for (n, h) in ["sparse", "prealloc"].iter().zip(hashes) {
        assert_eq!(hash_path(&d.join(n)).unwrap(), h, "{n} changed");
    }
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn refused_filesystems_and_files() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    // tmpfs
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    std::fs::write(shm.path().join("f"), b"x").unwrap();
    let out = output(env.reseq().arg("rewrite").arg(shm.path().join("f")));
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("tmpfs lives in memory"));
    // A read-only mount.
    let (lo2, m2) = env.mounted("ro", 64 * MIB, "ext4");
    std::fs::write(m2.dir.join("f"), vec![1u8; 1 << 20]).unwrap();
    run_cmd(Command::new("mount").args(["-o", "remount,ro"]).arg(&m2.dir)).unwrap();
    let out = output(env.reseq().arg("rewrite").arg(m2.dir.join("f")));
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("on a filesystem mounted read-only"), "{}", stderr(&out));
    let _ = lo2;
    // Not root.
    let bin = env!("CARGO_BIN_EXE_reseq");
    let out = output(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin, "rewrite"])
            .arg(m2.dir.join("f")),
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("must run as root"));
}

/// Killed in the middle of a file, the next run continues that file where its journal
/// says, and the file is intact.
#[test]
fn a_killed_file_run_resumes_where_it_stopped() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("fres", 128 * MIB, "ext4");
    let (path, hash) = fragmented_file(&mnt.dir, 16 << 20);
    let args = ["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "200ms"];
    let out =
        output(env.reseq().args(args).arg(&path).env("RESEQ_FAULTS", "delay@after-write#*=30,kill@window-start#3"));
    assert_eq!(out.status.code(), None, "killed");
    assert_thawed_within(&mnt.dir, std::time::Duration::from_secs(2));
    // As in device mode, an unfinished run is neither continued nor dropped unasked.
    let out = output(env.reseq().args(args).arg(&path));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("--resume"), "{}", stderr(&out));
    let out = output(env.reseq().args(args).arg("--resume").arg(&path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let f = json_report(&out)["files"][0].clone();
    let from = f["resumed_from_bytes"].as_u64().unwrap();
    assert!(from > 0 && from < 16 * MIB, "resumed from {from}");
    assert_eq!(f["bytes_rewritten"].as_u64().unwrap(), 16 * MIB - from, "only the rest of the file");
    // A finished file starts afresh next time.
    let out = output(env.reseq().args(args).arg(&path));
    assert_eq!(json_report(&out)["files"][0]["resumed_from_bytes"], 0);
    drop_caches();
    assert_eq!(hash_path(&path).unwrap(), hash);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// File mode keeps a resumed run's options as device mode does; `--restart` starts the
/// file over.
#[test]
fn a_resumed_file_run_keeps_its_options_and_restart_starts_over() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (_lo, mnt) = env.mounted("fopts", 128 * MIB, "ext4");
    let (path, hash) = fragmented_file(&mnt.dir, 16 << 20);
    let mut first = env.reseq();
    first
        .args(["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "300ms", "--pause", "10ms"])
        .arg(&path)
        .env("RESEQ_FAULTS", "delay@after-write#*=30,kill@window-start#3");
    assert_eq!(output(&mut first).status.code(), None, "killed");
    let out = output(env.reseq().args(["status", "--json"]));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<&str> = st["unfinished"].as_array().unwrap().iter().map(|u| u["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"files") && kinds.contains(&"file"), "the run and its large file: {st}");
    let out = output(env.reseq().args(["rewrite", "--resume", "--chunk-size", "2M"]).arg(&path));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--chunk-size 2M differs from the interrupted run's 1M"), "{}", stderr(&out));
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--resume"]).arg(&path));
    assert_eq!(r["freeze_bound"]["max_freeze_seconds"], 0.3, "{}", r["freeze_bound"]);
    assert!(r["files"][0]["resumed_from_bytes"].as_u64().unwrap() > 0);
    assert_eq!(output(&mut first).status.code(), None, "killed again");
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--restart"]).arg(&path));
    assert_eq!(r["files"][0]["resumed_from_bytes"], 0, "started over");
    assert_eq!(r["freeze_bound"]["max_freeze_seconds"], 1.0, "the file-mode default");
    let left: Vec<_> = std::fs::read_dir(env.state_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "a finished run leaves nothing behind: {left:?}");
    drop_caches();
    assert_eq!(hash_path(&path).unwrap(), hash);
}

/// Killed in the middle of the small files, `--resume` skips the files the killed run
/// finished (its journal says which), does the rest, and every file is intact.
#[test]
fn a_run_killed_inside_a_batch_of_small_files_loses_nothing() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("fbatch", 128 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 400, 96 << 10, 64);
    // 1 s windows: the guardian kills a run whose write is still outstanding half its
    // grace past the deadline (125 ms at --max-freeze 200ms), and under bench/load.sh one
    // 128 KiB write took that long: the resumed run was killed in its window 4.
    let args = ["rewrite", "--json", "--chunk-size", "128K", "--max-freeze", "1s", "--max-overruns", "1000"];
    // Killed right after the first finished files reached the run's record (a write
    // count would depend on how chunks adapt to a loaded machine), in the middle of the
    // next run of small files.
    let faults = "delay@after-write#*=5,kill@after-journal#1";
    let out = output(env.reseq().args(args).arg(&mnt.dir).env("RESEQ_FAULTS", faults));
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    assert_thawed_within(&mnt.dir, std::time::Duration::from_secs(2));
    let out = output(env.reseq().args(args).arg("--resume").arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json_report(&out);
    let files_r = r["files"].as_array().unwrap();
    let earlier = files_r.iter().filter(|f| f["done_earlier"] == true).count() as u64;
    let rewritten: u64 = files_r.iter().map(|f| f["bytes_rewritten"].as_u64().unwrap()).sum();
    let resumed: u64 = files_r.iter().map(|f| f["resumed_from_bytes"].as_u64().unwrap()).sum();
    assert!(earlier > 0, "the killed run finished some files: {}", stderr(&out));
    assert!(files_r.iter().filter(|f| f["done_earlier"] == true).all(|f| f["bytes_rewritten"] == 0));
    // The file the killed run stopped in continues where it stopped.
    assert_eq!(rewritten + resumed, (400 - earlier) * (96 << 10), "every other file rewritten in full");
    let left: Vec<_> = std::fs::read_dir(env.state_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "nothing left in the state dir: {left:?}");
    drop_caches();
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// Runs a slow rewrite of `path` (many windows) and applies `change` to the file while
/// it runs (between windows: a change blocks while the filesystem is frozen).
fn rewrite_while(env: &TestEnv, path: &std::path::Path, change: impl FnOnce() + Send) -> serde_json::Value {
    let mut cmd = env.reseq();
    // Many short windows on purpose; on a loaded machine some last past --max-freeze, and
    // each such counts as overrun: the overrun policy is not what these tests test. Under
    // a parallel CPU and disk load a 150 ms window once lasted 819 ms, past its whole
    // 400 ms bound (exit 7), hence 300 ms windows.
    cmd.args(["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "300ms", "--pause", "30ms"])
        .args(["--max-overruns", "1000"])
        .arg(path)
        .env("RESEQ_FAULTS", "delay@after-write#*=25");
    let child = spawn_captured(&mut cmd);
    // Once the first window froze, the run has its files (a fixed sleep once changed the
    // file before reseq had started, under load).
    assert!(wait_frozen_record(&env.run_dir(), std::time::Duration::from_secs(30)), "no window began");
    let prio = run_cmd(Command::new("ionice").arg("-p").arg(child.id().to_string())).unwrap();
    assert!(prio.contains("best-effort: prio 7"), "file mode runs at a low I/O priority: {prio}");
    change();
    let out = wait_captured(child);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    json_report(&out)
}

#[test]
fn files_deleted_truncated_or_extended_during_the_run() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("chg", 256 * MIB, "ext4");
    let make = |name: &str| {
        let p = mnt.dir.join(name);
        let mut data = vec![0u8; 32 << 20];
        XorShift::new(name.len() as u64).fill(&mut data);
        std::fs::write(&p, &data).unwrap();
        (p, data)
    };
    run_cmd(&mut Command::new("sync")).unwrap();

    let (gone, _) = make("gone");
    let r = rewrite_while(&env, &gone, || std::fs::remove_file(&gone).unwrap());
    let f = &r["files"][0];
    assert_eq!(f["skipped_reason"], "deleted during the run", "{f}");
    assert!(f["bytes_rewritten"].as_u64().unwrap() < 32 * MIB);

    let (short, data) = make("short");
    let r = rewrite_while(&env, &short, || {
        std::fs::OpenOptions::new().write(true).open(&short).unwrap().set_len(8 << 20).unwrap()
    });
    assert!(r["files"][0]["bytes_rewritten"].as_u64().unwrap() < 32 * MIB);
    drop_caches();
    assert_eq!(std::fs::read(&short).unwrap(), data[..8 << 20], "the truncated file lost or changed bytes");

    let (long, mut data) = make("long");
    let extra = vec![0xabu8; 4 << 20];
    let r = rewrite_while(&env, &long, || {
        std::fs::OpenOptions::new().append(true).open(&long).unwrap().write_all(&extra).unwrap()
    });
    assert!(r["files"][0]["bytes_rewritten"].as_u64().unwrap() <= 32 * MIB, "the file as it was at the start");
    data.extend_from_slice(&extra);
    drop_caches();
    assert_eq!(blake3::hash(&std::fs::read(&long).unwrap()), blake3::hash(&data), "the extended file changed");
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn reflinked_pair_on_xfs_is_written_once() {
    if !require(&["losetup", "mkfs.xfs", "cp"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("rl", 320 * MIB, "xfs");
    let a = mnt.dir.join("a");
    let mut data = vec![0u8; 8 << 20];
    XorShift::new(5).fill(&mut data);
    std::fs::write(&a, &data).unwrap();
    run_cmd(Command::new("cp").arg("--reflink=always").arg(&a).arg(mnt.dir.join("b"))).unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    // The dry run counts the shared range once, as the run writes it.
    let out = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(&a).arg(mnt.dir.join("b")));
    let plan = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(plan.contains("/a: 1 extent(s), 8.0 MiB to rewrite\n"), "{plan}");
    assert!(
        plan.contains("/b: 1 extent(s), nothing to rewrite (holes, unwritten, or shared"),
        "the clone adds nothing: {plan}"
    );
    assert!(plan.contains("2 file(s), 8.0 MiB to rewrite in 2 chunk(s): about 1 window(s)"), "counted once: {plan}");
    assert!(plan.contains("  prediction: 8.0 MiB read, 8.0 MiB written and read back in 2 chunk(s)"), "{plan}");
    let r = json_ok(env.reseq().args(["rewrite", "--json"]).arg(&a).arg(mnt.dir.join("b")));
    let files = r["files"].as_array().unwrap();
    assert_eq!(files[0]["bytes_rewritten"], 8 * MIB, "the first file writes the shared range");
    assert_eq!(files[1]["bytes_rewritten"], 0, "the second finds it done");
    assert_eq!(files[1]["bytes_skipped_shared"], 8 * MIB);
    drop_caches();
    for p in [a.clone(), mnt.dir.join("b")] {
        assert_eq!(std::fs::read(&p).unwrap(), data);
    }
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "xfs");
}

/// `--only-slow` in file mode: with two of ten files reading slowly (made slow through the
/// test hook; a loop device has no FTL to degrade), only those two are rewritten.
#[test]
fn only_slow_files_are_rewritten() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("sel", 128 * MIB, "ext4");
    let dir = mnt.dir.join("db");
    std::fs::create_dir(&dir).unwrap();
    let mut hashes = Vec::new();
    for i in 0..10 {
        let name = if i < 2 { format!("slow{i}") } else { format!("fast{i}") };
        let mut data = vec![0u8; 4 << 20];
        XorShift::new(i + 1).fill(&mut data);
        std::fs::write(dir.join(&name), &data).unwrap();
        hashes.push((dir.join(name), blake3::hash(&data)));
    }
    run_cmd(&mut Command::new("sync")).unwrap();
    // Every read 100 ms longer, so timing noise (a busy disk stalls a read by 100 ms and
    // more) cannot double a fast file's time; the two "slow" files' reads 400 ms more.
    let out = until_decided(|| {
        output(
            env.reseq()
                .args(["rewrite", "--json", "--only-slow"])
                .arg(&dir)
                .env("RESEQ_FAULTS", "slow-file@/db/=100,slow-file@/slow=400"),
        )
    });
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json_report(&out);
    let files = r["files"].as_array().unwrap();
    let rewritten: Vec<&str> = files
        .iter()
        .filter(|f| f["bytes_rewritten"].as_u64().unwrap() > 0)
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(rewritten.len(), 2, "{rewritten:?}");
    assert!(rewritten.iter().all(|p| p.contains("/slow")));
    let full = 10 * 4 * MIB;
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    assert!(written * 10 <= full * 3, "selective wrote {written} of {full} bytes");
    assert_eq!(files.iter().filter(|f| f["left_alone"].is_string()).count(), 8);
    drop_caches();
    assert_files_intact(&hashes);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// ext4 with inline_data keeps tiny files inside the inode: FIEMAP flags them
/// DATA_INLINE|NOT_ALIGNED and their "physical" address points into the inode table, so
/// they are skipped with the reason, and nothing is written.
#[test]
fn inline_data_files_are_skipped_with_the_reason() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.loop_device("inl.img", 64 * MIB);
    run_cmd(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "inline_data", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&lo.path),
    )
    .unwrap();
    let mnt = Mount::new(&lo.path, &env.path("inl"), &[]).unwrap();
    let tiny = mnt.dir.join("tiny");
    std::fs::write(&tiny, b"a few bytes kept in the inode").unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    let before = bytes_written_to(&lo.path);
    let f = &json_ok(env.reseq().args(["rewrite", "--json"]).arg(&tiny))["files"][0];
    assert!(f["skipped_reason"].as_str().unwrap().contains("DATA_INLINE"), "{f}");
    assert_eq!(f["bytes_rewritten"], 0);
    assert!(bytes_written_to(&lo.path) - before < 64 * 1024, "only the filesystem's own journal writes");
    assert_eq!(std::fs::read(&tiny).unwrap(), b"a few bytes kept in the inode");
}

/// --rate keeps the average: 8 MiB at 8 MiB/s takes about a second, at full speed far less.
#[test]
fn rate_limits_the_run() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (_lo, mnt) = env.mounted("rate", 128 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 4, 2 << 20, 8);
    let t = std::time::Instant::now();
    let out = output(
        env.reseq()
            .args(["rewrite", "--json", "--rate", "8M", "--chunk-size", "512K", "--max-freeze", "100ms"])
            // 100 ms windows overrun under a parallel load (exit 7 seen); the rate is what
            // this tests.
            .args(["--max-overruns", "1000"])
            .arg(&mnt.dir),
    );
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json_report(&out)["results"]["bytes_written"], 8 * MIB);
    assert!(took >= std::time::Duration::from_millis(850), "8 MiB at 8 MiB/s took only {took:?}");
    assert_files_intact(&files);
}

/// A writer overwrites random 4 KiB records of the file being rewritten, logging what it
/// wrote where, and appends; afterwards the file is exactly what the log says, and no
/// single write stalled longer than the window budget plus half a second.
#[test]
fn random_overwrites_during_the_run_are_all_kept() {
    if !require(&["losetup", "mkfs.ext4", "python3"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("rnd", 256 * MIB, "ext4");
    let (path, _) = fragmented_file(&mnt.dir, 16 << 20);
    let script = r#"
import os, random, sys, time, json
path, stop, out = sys.argv[1:4]
fd = os.open(path, os.O_WRONLY)
slots = os.fstat(fd).st_size // 4096
last, worst, n, appended = {}, 0.0, 0, 0
while not os.path.exists(stop):
    n += 1
    slot = random.randrange(slots)
    rec = (f"slot {slot} write {n} ".encode() * 300)[:4096]
    t = time.perf_counter()
    os.pwrite(fd, rec, slot * 4096)
    if n % 50 == 0:
        os.pwrite(fd, rec, (slots + appended) * 4096); appended += 1
    worst = max(worst, time.perf_counter() - t)
    last[slot] = n
    time.sleep(0.0005)
os.fsync(fd)
json.dump({"last": last, "worst": worst, "appended": appended, "slots": slots}, open(out, "w"))
"#;
    std::fs::write(env.path("w.py"), script).unwrap();
    let (stop, result) = (env.path("stop"), env.path("w.json"));
    let mut writer = Command::new("python3").arg(env.path("w.py")).arg(&path).arg(&stop).arg(&result).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = output(
        env.reseq()
            .args(["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "300ms", "--pause", "50ms"])
            .arg(&path)
            .env("RESEQ_FAULTS", "delay@after-write#*=15"),
    );
    std::fs::write(&stop, b"").unwrap();
    assert!(writer.wait().unwrap().success());
    assert_eq!(out.status.code(), Some(0));
    assert!(json_report(&out)["results"]["windows"].as_u64().unwrap() >= 2);
    let w: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&result).unwrap()).unwrap();
    let worst = w["worst"].as_f64().unwrap();
    eprintln!("writer: {} slots rewritten, worst write stall {worst:.3} s", w["last"].as_object().unwrap().len());
    assert!(worst <= 0.3 + 0.5, "a write stalled {worst:.3} s");
    drop_caches();
    let data = std::fs::read(&path).unwrap();
    for (slot, n) in w["last"].as_object().unwrap() {
        let slot: usize = slot.parse().unwrap();
        let want = format!("slot {slot} write {} ", n.as_u64().unwrap());
        assert!(data[slot * 4096..].starts_with(want.as_bytes()), "slot {slot} lost its last write (#{n})");
    }
    let slots = w["slots"].as_u64().unwrap() as usize;
    assert_eq!(data.len(), (slots + w["appended"].as_u64().unwrap() as usize) * 4096, "appends lost");
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn dry_run_plans_each_file_and_touches_nothing() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    // noatime: the dry run reads the directories it walks, and ext4 writing their access
    // times (once seen in CI: 4 KiB) is not reseq writing.
    let lo = env.loop_device("dry", 128 * MIB);
    mkfs_ext4(&lo.path).unwrap();
    let mnt = Mount::new(&lo.path, &env.path("dry-mnt"), &["noatime"]).unwrap();
    let (path, _) = fragmented_file(&mnt.dir, 8 << 20);
    std::fs::create_dir(mnt.dir.join("small")).unwrap();
    fill_files(&mnt.dir.join("small"), 100, 16 << 10, 68);
    std::fs::File::create(mnt.dir.join("small/empty")).unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    let before = bytes_written_to(&lo.path);
    let dry = |verbose: bool| {
        let mut c = env.reseq();
        c.args(["rewrite", "--dry-run", "--max-freeze", "1s"]).arg(&path).arg(mnt.dir.join("small"));
        if verbose {
            c.arg("-v");
        }
        let out = output(&mut c);
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The totals, not a line per file: files, bytes, windows and time frozen expected.
    let text = dry(false);
    let bytes = human(8 * MIB + 100 * (16 << 10));
    assert!(text.contains(&format!("102 file(s), {bytes} to rewrite in ")), "{text}");
    assert!(
        text.contains(" chunk(s): about ") && text.contains(" window(s), ") && text.contains(" frozen, "),
        "{text}"
    );
    assert!(text.lines().count() < 20, "a summary: {text}");
    assert!(!text.contains("file7.bin"), "no line per file without -v: {text}");
    assert!(text.contains("nothing was written or frozen"));
    // How much of the run the filesystem stays frozen, as device mode's plan says it:
    // these 9.6 MiB take one window.
    assert!(text.contains("  frozen: one window of about "), "{text}");
    // Windows back to back: the hint when writers would wait most of the run.
    let busy = ["rewrite", "--dry-run", "-v", "--max-freeze", "300ms", "--pause", "0s", "--chunk-size", "4K"];
    let out = output(env.reseq().args(busy).arg(&path));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  frozen: about ") && text.contains("writers wait most of the run: --pause "), "{text}");
    // -v: the details (the filesystem, the whole run's prediction and what it rests on:
    // tests/it/plan_predicts.rs holds it against runs) and every file, an empty one said
    // to be empty, not given a window.
    let text = dry(true);
    assert!(text.contains(&format!("filesystem {} (ext4) on {}", mnt.dir.display(), lo.path.display())), "{text}");
    assert!(text.contains("  prediction: ") && text.contains("  prediction rests on probe: "), "{text}");
    assert!(text.contains(&format!("102 file(s) (1 empty: nothing to rewrite), {bytes} to rewrite in ")), "{text}");
    assert!(text.contains("table.db: ") && text.contains("extent(s), 8.0 MiB to rewrite"), "{text}");
    assert!(text.contains("/small/file7.bin: 1 extent(s), 16.0 KiB to rewrite\n"), "{text}");
    assert!(text.contains("/small/empty: empty, nothing to rewrite\n"), "{text}");
    let every = text.split("  every file:\n").nth(1).unwrap_or_else(|| panic!("{text}"));
    assert!(!every.contains("0 extent") && !every.contains("window"), "{every}");
    // The same plan for scripts: every file, what the run does with it, the limits.
    let r = json_ok(env.reseq().args(["rewrite", "--dry-run", "--json"]).arg(&path).arg(mnt.dir.join("small")));
    let p = &r["plan"];
    let planned = p["files"].as_array().unwrap_or_else(|| panic!("{p}"));
    assert_eq!(planned.len(), 102, "{p}");
    let empty = planned.iter().find(|f| f["path"].as_str().unwrap().ends_with("/small/empty")).unwrap();
    assert!(empty["left_alone"].as_str().unwrap().contains("empty") && empty["bytes_to_rewrite"] == 0, "{empty}");
    let total: u64 = planned.iter().map(|f| f["bytes_to_rewrite"].as_u64().unwrap()).sum();
    assert_eq!(total, 8 * MIB + 100 * (16 << 10), "{p}");
    assert_eq!(p["filesystems_frozen"][0]["mount_point"], mnt.dir.display().to_string());
    assert_eq!(p["max_freeze_seconds"], 1.0);
    assert!(p["range_start_bytes"].is_null(), "{p}");
    // 16 KiB files share chunks: fewer chunks than files.
    let chunks = p["chunks_total"].as_u64().unwrap();
    assert!((3..102).contains(&chunks), "{p}");
    assert_eq!(r["prediction"]["chunks"], chunks, "the plan and its prediction count alike");
    assert_eq!(bytes_written_to(&lo.path), before, "a dry run wrote");
    assert!(!env.state_dir().exists());
}

/// As reseq's `human_bytes` prints sizes.
fn human(bytes: u64) -> String {
    reseq::testing::human_bytes(bytes)
}

/// Small files share freezes: 300 files of 40 KiB in a handful of windows instead of
/// 300, each window within its bound, every file intact; also with the state directory
/// on the frozen filesystem (the journal's records wait in memory while it is frozen).
#[test]
fn small_files_share_freeze_windows() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("batch", 128 * MIB, "ext4");
    std::fs::create_dir_all(mnt.dir.join("many")).unwrap();
    std::fs::create_dir_all(mnt.dir.join("few")).unwrap();
    let files = fill_files(&mnt.dir.join("many"), 300, 40 << 10, 61);
    let args = ["rewrite", "--json", "--max-freeze", "500ms", "--max-overruns", "1000"];
    let out = output(env.reseq().args(args).arg(mnt.dir.join("many")));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json_report(&out);
    let windows = r["results"]["windows"].as_u64().unwrap();
    // A handful unloaded (1-8 measured); under a parallel CPU and disk load, 23. Without
    // sharing it is at least 300.
    assert!((1..=60).contains(&windows), "300 small files in {windows} freezes");
    assert!(r["results"]["longest_freeze_seconds"].as_f64().unwrap() <= 1.0, "within the bound: {}", r["results"]);
    let rewritten: u64 = r["files"].as_array().unwrap().iter().map(|f| f["bytes_rewritten"].as_u64().unwrap()).sum();
    assert_eq!(rewritten, 300 * (40 << 10), "every file rewritten in full");
    // Small files run many to one engine run, and files laid out one after another on
    // the device are rewritten in large chunks: 12 MiB in 4 MiB chunks, not 300 chunks.
    let chunks = r["results"]["chunks_written"].as_u64().unwrap();
    assert!(chunks <= 30, "300 files laid out in order, in {chunks} chunks");
    let left: Vec<_> = std::fs::read_dir(env.state_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "finished files leave no journal (nor lock) behind: {left:?}");
    // The state directory on the frozen filesystem: the files still share windows.
    let few = fill_files(&mnt.dir.join("few"), 12, 40 << 10, 62);
    let out = output(env.reseq().args(args).arg(mnt.dir.join("few")).env("RESEQ_STATE_DIR", mnt.dir.join("state")));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(json_report(&out)["results"]["windows"].as_u64().unwrap() < 12, "{}", stderr(&out));
    drop_caches();
    assert_files_intact(&files);
    assert_files_intact(&few);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// Two names of one inode are one file: rewritten once.
#[test]
fn a_hard_linked_file_is_rewritten_once() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("hlink", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 1, 1 << 20, 63);
    std::fs::hard_link(&files[0].0, mnt.dir.join("second-name")).unwrap();
    let r = json_ok(env.reseq().args(["rewrite", "--json"]).arg(&mnt.dir));
    assert_eq!(r["files"].as_array().unwrap().len(), 1, "{}", r["files"]);
    assert_eq!(r["results"]["bytes_written"], 1 << 20);
    drop_caches();
    assert_files_intact(&files);
}

/// `--bench` in file mode: the DBA's before/after on the files themselves.
#[test]
fn file_mode_bench_reads_the_files_before_and_after() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("fbench", 128 * MIB, "ext4");
    // Sizes that are not multiples of the direct-I/O alignment: the regions of a scan
    // over several files must still read each file at aligned offsets.
    let size = (1 << 20) + 1000;
    let files = fill_files(&mnt.dir, 20, size, 65);
    let args = ["rewrite", "--json", "--bench", "--bench-passes", "3", "--bench-regions", "4", "--metrics-file"];
    let prom = env.path("files.prom");
    let r = json_ok(env.reseq().args(args).arg(&prom).arg(&mnt.dir));
    for b in [&r["bench_before"], &r["bench_after"]] {
        assert_eq!(b["params"]["length_bytes"], 20 * size as u64, "the files' bytes: {b}");
        assert_eq!(b["target"], "20 files");
        assert_eq!(b["passes"].as_array().unwrap().len(), 3);
        assert!(b["cache"]["finding"].is_string(), "{b}");
        for p in b["passes"].as_array().unwrap() {
            let (p50, p99) = (p["latency_p50_seconds"].as_f64().unwrap(), p["latency_p99_seconds"].as_f64().unwrap());
            assert!(p50 > 0.0 && p99 >= p50, "read latencies as fio reports them: {p}");
        }
    }
    let v = r["verdict"]["verdict"].as_str().unwrap();
    assert!(["faster", "no_measurable_change", "slower", "unreliable"].contains(&v), "{v}");
    assert_eq!(r["targets"][0], mnt.dir.display().to_string());
    // Dashboards key on the target: a directory names itself.
    let metrics = std::fs::read_to_string(&prom).unwrap();
    assert!(metrics.contains(&format!("target=\"{}\"", mnt.dir.display())), "{metrics}");
    let rewritten: u64 = r["files"].as_array().unwrap().iter().map(|f| f["bytes_rewritten"].as_u64().unwrap()).sum();
    // (A filesystem this small has 1 KiB blocks.)
    let block = std::os::unix::fs::MetadataExt::blksize(&std::fs::metadata(&files[0].0).unwrap());
    assert_eq!(rewritten, 20 * (size as u64).div_ceil(block) * block, "each file to the end of its last block");
    assert_files_intact(&files);
}

/// The realtime check reads a file's xfs flags (FS_IOC_FSGETXATTR). This kernel has no
/// XFS realtime support (mounting with rtdev= gives ENOSYS), so a realtime file cannot be
/// made here; this checks the ioctl itself, on a file with a flag set.
#[test]
fn xfs_flags_are_read_for_the_realtime_check() {
    if !require(&["losetup", "mkfs.xfs", "xfs_io"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("xflags", 320 * MIB, "xfs");
    let f = mnt.dir.join("f");
    std::fs::write(&f, b"x").unwrap();
    let flags = |p: &std::path::Path| {
        reseq::testing::fs_xflags(std::os::fd::AsFd::as_fd(&std::fs::File::open(p).unwrap())).unwrap()
    };
    assert_eq!(flags(&f) & reseq::testing::FS_XFLAG_REALTIME, 0);
    // FS_XFLAG_NODUMP (0x80), set with xfs_io, is seen: the struct and request are right.
    run_cmd(Command::new("xfs_io").args(["-c", "chattr +d"]).arg(&f)).unwrap();
    assert_ne!(flags(&f) & 0x80, 0, "the flag xfs_io set");
}

/// Found by a hostile test: a file rewritten in place (same inode) after an interrupted
/// run is done again by `--resume` (its blocks may be new), not skipped as done.
#[test]
fn resume_redoes_a_file_changed_since_the_interrupted_run() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (_lo, mnt) = env.mounted("fchg", 128 * MIB, "ext4");
    let (path, _) = fragmented_file(&mnt.dir, 16 << 20);
    let args = ["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "200ms"];
    let out =
        output(env.reseq().args(args).arg(&path).env("RESEQ_FAULTS", "delay@after-write#*=30,kill@window-start#3"));
    assert_eq!(out.status.code(), None, "killed");
    // Another program truncates and writes the file again, in place.
    let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    let out = output(env.reseq().args(args).arg("--resume").arg(&path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let f = json_report(&out)["files"][0].clone();
    assert_eq!(f["resumed_from_bytes"], 0, "a changed file starts over: {f}");
    assert_eq!(f["bytes_rewritten"], 16 * MIB);
    drop_caches();
    assert_eq!(std::fs::read(&path).unwrap(), data);
}

/// A live database writes its finished files in place between a kill and the resume:
/// their change time moves, their extents do not, and they stay finished (they were
/// rewritten three times over on a live InnoDB directory when the change time decided).
#[test]
fn resume_keeps_a_finished_file_written_in_place_finished() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (_lo, mnt) = env.mounted("finplace", 128 * MIB, "ext4");
    let dir = mnt.dir.join("db");
    std::fs::create_dir(&dir).unwrap();
    let files = fill_files(&dir, 6, 4 << 20, 81);
    run_cmd(&mut Command::new("sync")).unwrap();
    let args = ["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "200ms"];
    // Killed once a file is finished: a kill at a fixed journal write came before any
    // file was, when windows were short.
    let mut child = spawn_captured(env.reseq().args(args).arg(&dir).env("RESEQ_FAULTS", "delay@after-write#*=30"));
    let finished = || -> Vec<String> {
        let record = std::fs::read_dir(env.state_dir())
            .ok()
            .and_then(|d| d.flatten().find(|e| e.file_name().to_string_lossy().ends_with(".run")))
            .and_then(|e| reseq::testing::record::read(&e.path()).ok().flatten());
        record.map(|r| r.done.values().map(|id| id.path.clone()).collect()).unwrap_or_default()
    };
    let t = std::time::Instant::now();
    while finished().is_empty() {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "no file finished in 60 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().unwrap();
    let out = wait_captured(child);
    assert_eq!(out.status.code(), None, "killed");
    // The files the run recorded as finished (its journal's cursor is past them).
    let recorded = finished();
    let done: Vec<&(std::path::PathBuf, blake3::Hash)> =
        files.iter().filter(|(p, _)| recorded.contains(&p.display().to_string())).collect();
    assert!(!done.is_empty() && done.len() < files.len(), "killed mid-run: {recorded:?}");
    // A page written in place, as a database does: same blocks, new change time.
    let f = std::fs::OpenOptions::new().write(true).open(&done[0].0).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &[0x5au8; 4096], 8192).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let expected = std::fs::read(&done[0].0).unwrap();
    dry_run_of_the_resume(&env, &dir, &done.iter().map(|d| d.0.clone()).collect::<Vec<_>>(), files.len());
    let out = output(env.reseq().args(args).arg("--resume").arg(&dir));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json_report(&out);
    let reports = r["files"].as_array().unwrap();
    let report = |p: &std::path::Path| reports.iter().find(|f| f["path"] == p.display().to_string()).unwrap().clone();
    for (p, _) in &done {
        let a = report(p);
        assert_eq!(a["done_earlier"], true, "finished (one written in place since): still finished: {a}");
        assert_eq!(a["bytes_rewritten"], 0, "{a}");
    }
    drop_caches();
    assert_eq!(std::fs::read(&done[0].0).unwrap(), expected);
    assert_files_intact(&files[..].iter().filter(|f| f.0 != done[0].0).cloned().collect::<Vec<_>>());
}

/// `--resume --dry-run` plans only what the resumed run will rewrite: the finished files
/// are listed as such and left out of the totals, the prediction and the text; nothing
/// in the state directory changes.
fn dry_run_of_the_resume(env: &TestEnv, dir: &std::path::Path, done: &[std::path::PathBuf], files: usize) {
    let state = || -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(env.state_dir())
            .unwrap()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap_or_default()))
            .collect();
        v.sort();
        v
    };
    let before = state();
    let r = json_ok(env.reseq().args(["rewrite", "--resume", "--dry-run", "--json"]).arg(dir));
    let planned = r["plan"]["files"].as_array().unwrap_or_else(|| panic!("no files in the plan: {}", r["plan"]));
    assert_eq!(planned.len(), files, "{}", r["plan"]);
    let (mut left, mut finished) = (0, 0);
    for f in planned {
        let is_done = done.iter().any(|d| f["path"] == d.display().to_string());
        assert_eq!(f["done_earlier"], is_done, "{f}");
        if is_done {
            assert_eq!(f["bytes_to_rewrite"], 0, "{f}");
            finished += 1;
        } else {
            left += f["bytes_to_rewrite"].as_u64().unwrap();
        }
    }
    assert_eq!(left, (files - finished) as u64 * (4 << 20), "{}", r["plan"]);
    assert_eq!(r["prediction"]["bytes_to_rewrite"], left, "{}", r["prediction"]);
    assert!(r["plan"]["range_start_bytes"].is_null() && r["plan"]["chunks_total"].as_u64().unwrap() >= 1);
    let out = output(env.reseq().args(["rewrite", "--resume", "--dry-run", "-v"]).arg(dir));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("    {} file(s), ", files - finished)), "{text}");
    assert!(text.contains(&format!("  resumed: {finished} file(s) (")), "{text}");
    assert_eq!(state(), before, "a dry run changed the state directory");
}

/// Found by a hostile test: a file-mode run refused before writing anything (the
/// filesystem frozen by someone else) leaves no unfinished run behind.
#[test]
fn a_refused_file_run_leaves_no_unfinished_run() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("fref", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 3, 8 << 20, 66);
    run_cmd(Command::new("fsfreeze").arg("-f").arg(&mnt.dir)).unwrap();
    let out = output(env.reseq().arg("rewrite").arg(&mnt.dir));
    run_cmd(Command::new("fsfreeze").arg("-u").arg(&mnt.dir)).unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("already frozen by someone else"), "{}", stderr(&out));
    let left: Vec<_> = std::fs::read_dir(env.state_dir()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "a refused run leaves nothing: {left:?}");
    let out = output(env.reseq().arg("rewrite").arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(0), "the next run is not refused: {}", stderr(&out));
    assert_files_intact(&files);
}

/// Found by a hostile test: `--bench` in file mode reads written data only; a sparse
/// file's holes (read at memory speed) would fake a "faster".
#[test]
fn file_mode_bench_skips_holes() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze", "truncate"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("fhole", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 2 << 20, 67);
    run_cmd(Command::new("truncate").args(["-s", "10M"]).arg(mnt.dir.join("allhole"))).unwrap();
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--bench", "--bench-passes", "2"]).arg(&mnt.dir));
    assert_eq!(r["bench_before"]["params"]["length_bytes"], 4 * MIB, "the two files' data, not the hole");
    let out = output(env.reseq().args(["rewrite", "--bench"]).arg(mnt.dir.join("allhole")));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no written data"), "{}", stderr(&out));
    assert_files_intact(&files);
}

/// `--pause` holds between the windows of a file-mode run (20 files with `--pause 1s`
/// once froze back to back), and a stop during a pause ends the run at once, thawed,
/// instead of after the pause.
#[test]
fn pause_holds_between_windows_and_a_stop_cuts_it_short() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    // In memory: the test times its windows with its own delays (a busy host disk once
    // stretched one past its 200 ms).
    let env = TestEnv::in_memory();
    let (_lo, mnt) = env.mounted("pause", 128 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 4, 2 << 20, 21);
    let rewrite = |pause: &str, dir: &std::path::Path| {
        let mut c = env.reseq();
        // Slow chunks: two or three to a window, so the run takes several windows. Windows
        // of 1 s (200 ms ones with 50 ms chunks met a CPU stall past the grace under
        // bench/load.sh: the guardian's kill; the subject here is the pause).
        c.args(["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "1s", "--max-overruns", "1000"])
            .args(["--pause", pause])
            .arg(dir)
            .env("RESEQ_FAULTS", "delay@after-write#*=250");
        c
    };
    let t = std::time::Instant::now();
    let out = output(&mut rewrite("400ms", &mnt.dir));
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let windows = json_report(&out)["results"]["windows"].as_u64().unwrap();
    assert!(windows >= 3, "expected several windows, got {windows}");
    let paused = std::time::Duration::from_millis(400) * (windows as u32 - 1);
    assert!(took >= paused, "{windows} windows with --pause 400ms took only {took:?}");
    assert_files_intact(&files);

    // A stop while pausing 10 s between files: seen within the pause, not after it, and
    // no freeze after it. With the state directory on the frozen filesystem each file
    // gets a window of its own, so the pause is the one between files.
    let one = mnt.dir.join("one");
    std::fs::create_dir(&one).unwrap();
    let small = fill_files(&one, 4, 1 << 20, 22);
    let child = Running::captured(rewrite("10s", &one).arg("--state-dir").arg(mnt.dir.join("state")));
    assert!(wait_frozen_record(&env.run_dir(), std::time::Duration::from_secs(20)), "no window began");
    // The first window lasts at most 1 s (and the guardian's bound); then the pause.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    child.signal(nix::sys::signal::Signal::SIGINT).unwrap();
    let asked = std::time::Instant::now();
    let out = child.wait();
    assert!(asked.elapsed() < std::time::Duration::from_secs(3), "the stop waited {:?}", asked.elapsed());
    assert_eq!(out.status.code(), Some(6), "{}", stderr(&out));
    let r = json_report(&out);
    assert_eq!(r["results"]["windows"], 1, "a freeze after the stop: {}", r["results"]);
    assert!(r["results"]["bytes_written"].as_u64().unwrap() > 0, "stopped before the first window: {}", r["results"]);
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
    assert_files_intact(&small);
}

/// A directory laid out like a database's: subdirectories of many small files, some
/// empty, and a few larger ones (over a chunk: each an engine run of its own).
fn database_like(dir: &std::path::Path) -> Vec<(std::path::PathBuf, blake3::Hash)> {
    let mut files = Vec::new();
    for (i, sub) in ["1", "4", "5", "16384"].iter().enumerate() {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        files.extend(fill_files(&d, 150, 24 << 10, 70 + i as u64));
        for e in 0..10 {
            std::fs::File::create(d.join(format!("{e}_vm"))).unwrap();
        }
    }
    std::fs::create_dir_all(dir.join("2")).unwrap();
    files.extend(fill_files(&dir.join("2"), 3, 6 << 20, 75));
    files
}

/// Issue 27: a nightly job over a database's data directory prints a summary of under
/// 15 lines on success, with the totals (files, bytes, windows, longest and total
/// freeze, verification), not a line per file; `-v` lists every file; the report says
/// the files were verified, and a file rewritten in a shared window has that window's
/// freeze, not 0.
#[test]
fn a_nightly_run_over_many_small_files_prints_a_summary() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("nightly", 160 * MIB, "ext4");
    let base = mnt.dir.join("base");
    let files = database_like(&base);
    let args = ["rewrite", "--max-freeze", "1s", "--max-overruns", "1000"];
    // The default text, as cron mails it.
    let out = output(env.reseq().args(args).arg(&base));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.lines().count() < 15, "{} lines:\n{text}", text.lines().count());
    let mib = human(600 * (24 << 10) + 3 * (6 << 20));
    assert!(text.contains(&format!("reseq rewrite: 643 file(s), {mib} in all, under {}", base.display())), "{text}");
    assert!(text.contains(&format!("  rewrote {mib} in ")), "{text}");
    let windows = text.lines().find(|l| l.starts_with("  windows: ")).unwrap_or_else(|| panic!("no windows: {text}"));
    assert!(windows.contains(", longest freeze ") && windows.contains(" s in all, overruns "), "{windows}");
    assert!(text.contains("  files: 603 rewritten, 40 empty (nothing to rewrite); verification: passed\n"), "{text}");
    assert!(text.contains("  outcome: success"), "{text}");
    assert!(!text.contains("file7.bin"), "no line per file: {text}");
    // Nor a log line per file or batch of small files on stderr, which cron mails too.
    let log = stderr(&out);
    assert!(!log.contains(&base.display().to_string()) && !log.contains("small files"), "{log}");
    assert!(log.lines().filter(|l| !l.contains("progress: ")).count() < 5, "{log}");

    // -v: every file, each with the freeze it was rewritten in.
    let out = output(env.reseq().args(args).arg("-v").arg(&base));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let listed = text.lines().filter(|l| l.starts_with(&format!("    {}/", base.display()))).count();
    assert_eq!(listed, 643, "{text}");
    assert!(text.contains("/1/0_vm: 0 B of 0 B") && text.contains("left alone: empty, nothing to rewrite"), "{text}");
    assert!(!text.contains("longest freeze 0.000 s, verification passed"), "a shared window froze too: {text}");

    // The JSON: verified, and each file's windows and longest freeze.
    let r = json_ok(env.reseq().args(args).arg("--json").arg(&base));
    assert_eq!(r["verification"], "passed", "every file was read back");
    let longest = r["results"]["longest_freeze_seconds"].as_f64().unwrap();
    let listed = r["files"].as_array().unwrap();
    for f in listed.iter().filter(|f| f["size_bytes"] != 0) {
        assert_eq!(f["verification"], "passed", "{f}");
        assert!(f["windows"].as_u64().unwrap() >= 1, "{f}");
        let own = f["longest_freeze_seconds"].as_f64().unwrap();
        assert!(own > 0.0 && own <= longest, "a file's freeze ({own}) is one of the run's (longest {longest}): {f}");
    }
    let empty: Vec<_> = listed.iter().filter(|f| f["size_bytes"] == 0).collect();
    assert_eq!(empty.len(), 40);
    assert!(empty.iter().all(|f| f["left_alone"] == "empty, nothing to rewrite" && f["windows"] == 0), "{empty:?}");
    // Off only when it was.
    let r = json_ok(env.reseq().args(args).args(["--json", "--no-verify"]).arg(&base));
    assert_eq!(r["verification"], "off");
    drop_caches();
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// Issue 27: a database's hot files (InnoDB redo log and temporary tablespace,
/// PostgreSQL WAL, SQLite's write-ahead log) are rewritten only with a warning that
/// names the option leaving them out; left out, no warning.
#[test]
fn hot_database_files_are_warned_about() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("hot", 64 * MIB, "ext4");
    let d = &mnt.dir;
    for sub in ["mysql/#innodb_redo", "pg/pg_wal/archive_status", "pg/base/1", "app"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    for f in ["mysql/ib_logfile0", "mysql/ib_logfile1", "mysql/#innodb_redo/#ib_redo9", "mysql/ibtmp1"] {
        std::fs::write(d.join(f), vec![1u8; 256 << 10]).unwrap();
    }
    // A MariaDB datadir's other files that commits wait for.
    let mariadb = ["mysql-bin.000001", "mysql-bin.index", "db1-relay-bin.000003", "undo001", "aria_log.00000001"];
    for f in mariadb.iter().chain(&["ibdata1"]) {
        std::fs::write(d.join("mysql").join(f), vec![7u8; 64 << 10]).unwrap();
    }
    std::fs::write(d.join("mysql/t1.ibd"), vec![2u8; 256 << 10]).unwrap();
    std::fs::write(d.join("pg/pg_wal/000000010000000000000001"), vec![3u8; 1 << 20]).unwrap();
    std::fs::File::create(d.join("pg/pg_wal/archive_status/000000010000000000000001.done")).unwrap();
    std::fs::write(d.join("pg/base/1/1259"), vec![4u8; 64 << 10]).unwrap();
    std::fs::write(d.join("app/data.db"), vec![5u8; 64 << 10]).unwrap();
    std::fs::write(d.join("app/data.db-wal"), vec![6u8; 64 << 10]).unwrap();
    run_cmd(&mut Command::new("sync")).unwrap();
    let dry = |extra: &[&str]| {
        let out = output(
            env.reseq()
                .args(["rewrite", "--dry-run", "--json"])
                .args(extra)
                .arg(d.join("mysql"))
                .arg(d.join("pg"))
                .arg(d.join("app")),
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        // The warnings about files of the run: the prediction's own (a window that would
        // overrun on a busy host, under bench/load.sh) are not this test's.
        (
            json_report(&out)["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap().to_string())
                .filter(|w| w.contains(" is among the files ("))
                .collect::<Vec<_>>(),
            stderr(&out),
        )
    };
    let (warnings, log) = dry(&[]);
    let about = |kind: &str| {
        warnings.iter().find(|w| w.contains(kind)).unwrap_or_else(|| panic!("no {kind}: {warnings:?}")).clone()
    };
    let redo = about("InnoDB redo log");
    assert!(redo.starts_with("the InnoDB redo log is among the files (") && redo.contains(" and 2 more)"), "{redo}");
    assert!(redo.contains("--exclude 'ib_logfile*' --exclude '#innodb_redo'"), "{redo}");
    assert!(about("InnoDB temporary tablespace").contains("--exclude ibtmp1"));
    let wal = about("PostgreSQL WAL");
    assert!(wal.contains("pg_wal/000000010000000000000001):") && wal.contains("--exclude pg_wal"), "{wal}");
    assert!(about("SQLite write-ahead log").contains("--exclude '*-wal'"));
    let binlog = about("MariaDB/MySQL binary log");
    assert!(binlog.contains("mysql-bin.000001 and 1 more") && binlog.contains("--exclude '*-bin.*'"), "{binlog}");
    assert!(about("MariaDB/MySQL relay log").contains("--exclude '*relay-bin.*'"));
    assert!(about("InnoDB undo tablespace").contains("--exclude 'undo*'"));
    assert!(about("MariaDB Aria log").contains("--exclude 'aria_log*'"));
    assert!(about("InnoDB system tablespace").contains("--exclude ibdata1"));
    assert_eq!(warnings.len(), 9, "{warnings:?}");
    assert!(log.contains("InnoDB redo log"), "said when it matters, before a run: {log}");
    // The text of the plan says it too.
    let out = output(env.reseq().args(["rewrite", "--dry-run", "-v"]).arg(d.join("mysql")));
    assert!(String::from_utf8_lossy(&out.stdout).contains("  warning: "), "{}", String::from_utf8_lossy(&out.stdout));
    // Left out as the warnings say: no warning.
    let (warnings, _) = dry(&[
        "--exclude",
        "ib_logfile*",
        "--exclude",
        "#innodb_redo",
        "--exclude",
        "ibtmp1",
        "--exclude",
        "pg_wal",
        "--exclude",
        "*-wal",
        "--exclude",
        "*-bin.*",
        "--exclude",
        "undo*",
        "--exclude",
        "aria_log*",
        "--exclude",
        "ibdata1",
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
}

/// A refused run writes nothing (issue 35): after a run stopped by SIGINT, a run without
/// `--resume` (exit 3), a `--resume` with another chunk size (exit 2) and a `--resume`
/// refused at its first freeze, someone else's (exit 3), each leave every byte of the
/// state directory as it was; `status` and `--resume --dry-run` still show the
/// interrupted run, whose `--resume` then finishes it.
#[test]
fn a_refused_file_run_writes_nothing() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (_lo, mnt) = env.mounted("frefused", 128 * MIB, "ext4");
    let (path, hash) = fragmented_file(&mnt.dir, 16 << 20);
    // Windows of 1 s: the guardian's kill comes half a grace (500 ms) past one, not 125 ms
    // as with 200 ms windows, which a host with every CPU busy overran once (a kill, not
    // the SIGINT's exit 6). 100 ms a write: the run spans two windows or more, so that
    // SIGINT stops it before its end.
    let first = ["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "1s", "--max-overruns", "1000"];
    let run = Running::captured(env.reseq().args(first).arg(&path).env("RESEQ_FAULTS", "delay@after-write#*=100"));
    wait_journal_done(&env.state_dir());
    run.signal(nix::sys::signal::Signal::SIGINT).unwrap();
    assert_eq!(run.wait().status.code(), Some(6), "interrupted");
    let (before, runs) = (snapshot_dir(&env.state_dir()), unfinished_runs(&env));
    assert!(runs.to_string().contains("--max-freeze 1s"), "{runs}");
    let refused: [(&[&str], i32); 2] =
        [(&["--max-freeze", "300ms", "--rate", "10M", "--pause", "5s"], 3), (&["--resume", "--chunk-size", "2M"], 2)];
    for (args, code) in refused {
        let out = output(env.reseq().arg("rewrite").args(args).arg(&path));
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(snapshot_dir(&env.state_dir()) == before, "{args:?} changed the state directory");
    }
    {
        let _frozen = ForeignFreeze::new(&mnt.dir);
        let out = output(env.reseq().args(["rewrite", "--resume", "--max-freeze", "300ms"]).arg(&path));
        assert_eq!(out.status.code(), Some(3), "someone else's freeze: {}", stderr(&out));
    }
    assert!(snapshot_dir(&env.state_dir()) == before, "the refused --resume changed the state directory");
    unfinished_run_refused_alike(&env, &path);
    assert_eq!(unfinished_runs(&env), runs, "status shows the interrupted run");
    let out = output(env.reseq().args(["rewrite", "--resume", "--dry-run", "-v"]).arg(&path));
    assert!(stderr(&out).contains("--max-freeze 1s"), "{}", stderr(&out));
    let r = json_ok(env.reseq().args(["rewrite", "--json", "--resume"]).arg(&path));
    assert!(r["files"][0]["resumed_from_bytes"].as_u64().unwrap() > 0, "continued where SIGINT stopped it");
    drop_caches();
    assert_eq!(hash_path(&path).unwrap(), hash);
}

/// Bytes read from and written to a block device so far, as its own counters say
/// (`/sys/class/block/<dev>/stat` fields 3 and 7, in 512-byte sectors).
fn device_io(dev: &std::path::Path) -> (u64, u64) {
    let name = dev.file_name().unwrap().to_string_lossy();
    let stat = std::fs::read_to_string(format!("/sys/class/block/{name}/stat")).unwrap();
    let field = |i: usize| stat.split_whitespace().nth(i).unwrap().parse::<u64>().unwrap() * 512;
    (field(2), field(6))
}

/// Short windows over many files read little more than they write (issue 37): the reader
/// reads what the window is expected to write, not chunks the thaw drops for the next
/// window to read again. Before, 100 ms windows over 5 MiB files read 1.8-1.9 x (up to
/// 3.5 x under load) what they wrote, read-backs apart.
#[test]
fn short_windows_read_little_more_than_they_write() {
    // A measurement, of 100 ms windows: alone. With another writer saturating the disk
    // (bench/load.sh's dd) a thaw (ext4's superblock write and a flush, queued behind its
    // data) took 227-307 ms by hand, past these windows' 200 ms bound (exit 7).
    let _alone = exclusive();
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::in_memory();
    let (lo, mnt) = env.mounted("readahead", 320 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 40, 5 << 20, 37);
    // The best of up to three runs: a window cut short by a slow moment drops what was
    // read ahead, so a hiccup only adds reads (CI once saw 1.19 x in one run). Before
    // the fix every run read 1.8-1.9 x: the best of three still decides.
    let run = || {
        let (read0, written0) = device_io(&lo.path);
        let args = ["rewrite", "--json", "--max-freeze", "100ms", "--pause", "0s", "--max-overruns", "1000"];
        // 5 ms after each write: 86 chunks hold windows for 430 ms or more, so at least
        // 5 windows of 100 ms end by their budget however fast the host (a quiet one
        // rewrote the 200 MiB in 0.30 s, in 4 windows).
        let r = json_ok(env.reseq().args(args).arg(&mnt.dir).env("RESEQ_FAULTS", "delay@after-write#*=5"));
        let (read, written) = device_io(&lo.path);
        (read - read0, written - written0, r)
    };
    // The device's reads: reseq's reads to rewrite (goal: at most 1.15 x the bytes
    // rewritten), its read-backs (each chunk written is read back once: v = w), and what
    // the filesystem and the guardian read meanwhile (metadata, sentinel reads: far under
    // 8 MiB). So read <= 1.15 w + v + 8 MiB; before, about 1.9 w + v.
    let bound_of = |r: &serde_json::Value| {
        let (w, v) =
            (r["results"]["bytes_written"].as_u64().unwrap(), r["results"]["bytes_verified"].as_u64().unwrap());
        w + w * 15 / 100 + v + 8 * MIB
    };
    let (mut read, mut written, mut r) = run();
    for _ in 0..2 {
        if read <= bound_of(&r) {
            break;
        }
        eprintln!("read {read} for {} written: once more", r["results"]["bytes_written"]);
        let (rd, wr, again) = run();
        if rd < read {
            (read, written, r) = (rd, wr, again);
        }
    }
    let res = &r["results"];
    let field = |k: &str| res[k].as_u64().unwrap();
    let (w, v) = (field("bytes_written"), field("bytes_verified"));
    assert_eq!(w, 200 * MIB, "every file once: {res}");
    assert!(field("windows") >= 5, "the budget should end windows: {res}");
    // The device saw reseq's writes and the filesystem's few (a journal commit per
    // freeze and thaw).
    assert!((w..w + 16 * MIB).contains(&written), "device writes {written} for {w} rewritten");
    let bound = bound_of(&r);
    eprintln!("device: read {read}, written {written}; reseq: {res}");
    assert!(
        read <= bound,
        "the device read {} for {} rewritten ({:.2} x, read-backs apart): {res}",
        human(read),
        human(w),
        read.saturating_sub(v) as f64 / w as f64
    );
    // The report's own count agrees: what it read, less what it dropped, is what it wrote.
    let (reseq_read, dropped) = (field("bytes_read"), field("bytes_read_ahead_dropped"));
    assert!(reseq_read <= w + w * 15 / 100, "reseq counted {reseq_read} read for {w} written: {res}");
    assert_eq!(reseq_read - dropped, w, "{res}");
    assert!(reseq_read + v <= read, "the device read at least what reseq counted: {read}, {res}");
    let bound = r["freeze_bound"]["bound_seconds"].as_f64().unwrap();
    assert!(res["longest_freeze_seconds"].as_f64().unwrap() <= bound, "within the bound {bound} s: {res}");
    drop_caches();
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

/// A read-only view of a read-write filesystem, as the shipped unit's
/// `ProtectSystem=strict` gives (every mount of it read-only in the unit's own mount
/// namespace), is rewritten: its device is written, never the mount. Every byte intact,
/// the device's counter showing the rewrite.
#[test]
fn a_read_only_view_of_a_writable_filesystem_is_rewritten() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze", "unshare"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("roview", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 4 << 20, 90);
    run_cmd(&mut Command::new("sync")).unwrap();
    let before = bytes_written_to(&lo.path);
    // In a mount namespace of its own (gone with the process), the filesystem's only
    // mount made read-only, as systemd does for a unit.
    let script = format!(
        "mount -o remount,bind,ro \"$1\" && ! touch \"$1/x\" 2>/dev/null && exec {} rewrite --json --max-freeze 500ms --state-dir \"$2\" \"$1\"",
        env!("CARGO_BIN_EXE_reseq")
    );
    let out = output(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
            .arg(&mnt.dir)
            .arg(env.state_dir()),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_report(&out)["verification"], "passed");
    assert!(bytes_written_to(&lo.path) - before >= 8 * MIB, "the device was not written");
    drop_caches();
    assert_files_intact(&files);
    assert!(!is_frozen(&mnt.dir));
    std::fs::write(mnt.dir.join("y"), b"y").expect("still writable outside the namespace");
}
