//! Every refusal before the first write, and every injected fault during a run: each
//! gives its message and exit code, leaves nothing frozen, and leaves the data intact.

use std::process::Command;

use crate::common::*;

const MIB: u64 = 1 << 20;

/// Runs reseq, expects `code` and a message containing `needle`, and checks that the
/// device's content did not change.
fn expect_refusal(
    env: &TestEnv,
    dev: &std::path::Path,
    extra: &[&str],
    faults: &str,
    code: i32,
    needle: &str,
) -> String {
    // The device's bytes, not the page cache's idea of them: on a mounted filesystem
    // that cache can hold stale pages (mkfs wrote through it) until something reads the
    // blocks again, as a refused run's GETFSMAP does (seen: the buffered hash changed,
    // the image's and an O_DIRECT read's did not).
    let device_hash = || {
        run_cmd(Command::new("blockdev").arg("--flushbufs").arg(dev)).unwrap();
        hash_path(dev).unwrap()
    };
    // What a mounted filesystem still had to write (its mount's superblock and journal,
    // committed every 5 s) goes first: on a busy host that commit once landed between
    // the two hashes.
    run_cmd(&mut Command::new("sync")).unwrap();
    let before = device_hash();
    let out = output(env.reseq().arg("rewrite").args(extra).arg(dev).env("RESEQ_FAULTS", faults));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "expected exit {code} with '{needle}'");
    assert!(err.contains(needle), "message should contain '{needle}': {err}");
    assert_eq!(device_hash(), before, "a refused run changed the device");
    if code == 3 && !extra.contains(&"--resume") {
        let journals = std::fs::read_dir(env.state_dir()).map(|d| d.count()).unwrap_or(0);
        assert_eq!(journals, 0, "a refused run left a journal behind");
    }
    err
}

#[test]
fn not_a_block_device() {
    let env = TestEnv::new();
    // A character device is neither a block device nor files.
    let out = output(env.reseq().args(["rewrite", "/dev/null"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("not a block device"), "{}", stderr(&out));
    let out = output(env.reseq().args(["rewrite", "/nonexistent/dev"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("No such file"));
    let out = output(env.reseq().args(["rewrite", "--chunk-size", "8Q", "/dev/null"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown size unit"));
}

#[test]
fn not_root_and_no_cap_sys_admin() {
    if !require(&["losetup", "setpriv"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("priv.img", 16 * MIB, 1);
    let before = hash_path(&lo.path).unwrap();
    let bin = env!("CARGO_BIN_EXE_reseq");
    let out = output(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin, "rewrite"])
            .arg(&lo.path),
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("must run as root"));
    let out = output(
        Command::new("setpriv")
            .args(["--inh-caps=-sys_admin", "--bounding-set=-sys_admin", bin, "rewrite"])
            .arg(&lo.path)
            .env("RESEQ_STATE_DIR", env.state_dir()),
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(stderr(&out).contains("without CAP_SYS_ADMIN"));
    assert_eq!(hash_path(&lo.path).unwrap(), before);
    // status, too, says it cannot read the state directory, instead of showing nothing.
    std::fs::create_dir_all(env.state_dir()).unwrap();
    std::fs::set_permissions(env.state_dir(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let out = output(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin, "status", "--state-dir"])
            .arg(env.state_dir()),
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("Permission denied"), "{}", stderr(&out));
}

#[test]
fn read_only_device() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let img = env.path("ro.img");
    std::fs::File::create(&img).unwrap().set_len(16 * MIB).unwrap();
    let lo = LoopDevice::attach(&img, &["--read-only"]).unwrap();
    expect_refusal(&env, &lo.path, &[], "", 3, "is read-only (BLKROGET)");
}

#[test]
fn active_swap() {
    if !require(&["losetup", "mkswap", "swapon", "swapoff"]) {
        return;
    }
    let _swap = swap_lock();
    let env = TestEnv::new();
    let lo = env.loop_device("swap.img", 32 * MIB);
    run_cmd(Command::new("mkswap").arg(&lo.path)).unwrap();
    run_cmd(Command::new("swapon").arg(&lo.path)).unwrap();
    struct SwapOff(std::path::PathBuf);
    impl Drop for SwapOff {
        fn drop(&mut self) {
            let _ = Command::new("swapoff").arg(&self.0).output();
        }
    }
    let _off = SwapOff(lo.path.clone());
    // Not expect_refusal's hash of the whole device: the kernel owns an active swap area
    // and may write pages to it at any time (seen in a full run: the hash moved while
    // reseq had refused). Its header page is the kernel's to read, not to write.
    let header = || {
        let mut f = std::fs::File::open(&lo.path).unwrap();
        let mut page = vec![0u8; 4096];
        std::io::Read::read_exact(&mut f, &mut page).unwrap();
        page
    };
    let before = header();
    let out = output(env.reseq().arg("rewrite").arg(&lo.path));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("swap is active"), "{}", stderr(&out));
    assert_eq!(header(), before, "the swap header changed");
    assert_eq!(std::fs::read_dir(env.state_dir()).map(|d| d.count()).unwrap_or(0), 0, "a journal was left");
}

/// An active swap file in file mode (found by a hostile review: rewritten, 32 MiB, exit
/// 0): refused before anything is written, named with the --exclude that leaves it out,
/// and the directory around it then rewritten without it.
#[test]
fn an_active_swap_file_is_refused_in_file_mode() {
    if !require(&["losetup", "mkfs.ext4", "mkswap", "swapon", "swapoff", "fsfreeze"]) {
        return;
    }
    let _swap = swap_lock();
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("swapfile", 96 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 1, 4 << 20, 91);
    let swap = mnt.dir.join("swapfile");
    run_cmd(
        Command::new("dd")
            .args(["if=/dev/zero", "bs=1M", "count=16", "status=none"])
            .arg(format!("of={}", swap.display())),
    )
    .unwrap();
    std::fs::set_permissions(&swap, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    run_cmd(Command::new("mkswap").arg(&swap)).unwrap();
    run_cmd(Command::new("swapon").arg(&swap)).unwrap();
    struct SwapOff(std::path::PathBuf);
    impl Drop for SwapOff {
        fn drop(&mut self) {
            let _ = Command::new("swapoff").arg(&self.0).output();
        }
    }
    let _off = SwapOff(swap.clone());
    run_cmd(&mut Command::new("sync")).unwrap();
    let out = output(env.reseq().arg("rewrite").arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("is an active swap file") && err.contains("--exclude"), "{err}");
    // Not the device's written-sectors counter: the kernel may swap pages out to the file
    // meanwhile. Refused at the plan: no run was recorded.
    assert_eq!(std::fs::read_dir(env.state_dir()).map(|d| d.count()).unwrap_or(0), 0, "a refused run left state");
    let _ = &lo;
    // The kernel may swap out to the file during the run, past the freeze: the device's
    // counter then sees a writer, and the run stops with exit 9, as it must. Otherwise it
    // passes. /proc/swaps: the KiB in use of the file.
    let out = output(env.reseq().args(["rewrite", "--json", "--exclude", "swapfile"]).arg(&mnt.dir));
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    let ours = swaps.lines().find(|l| l.starts_with(swap.to_str().unwrap()));
    let used: u64 = ours.and_then(|l| l.split_whitespace().nth(3)?.parse().ok()).unwrap_or(0);
    // Null where a stopped run printed no report: the checks below then hold or fail alike.
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    if out.status.code() == Some(9) && used > 0 {
        eprintln!("the kernel swapped {used} KiB out to the file: exit 9, as it must");
        assert!(stderr(&out).contains("another writer wrote"), "{}", stderr(&out));
    } else {
        assert_eq!(out.status.code(), Some(0), "{used} KiB swapped out to the file: {}", stderr(&out));
        assert_eq!(r["verification"], "passed", "{}", r["outcome"]);
    }
    let listed = r["files"].as_array().into_iter().flatten();
    assert!(listed.map(|f| f["path"].as_str().unwrap()).all(|p| !p.ends_with("swapfile")));
    assert_files_intact(&files);
}

#[test]
fn filesystem_that_cannot_freeze() {
    if !require(&["losetup", "mksquashfs"]) {
        return;
    }
    let env = TestEnv::new();
    std::fs::create_dir(env.path("content")).unwrap();
    std::fs::write(env.path("content/a"), b"hello").unwrap();
    let img = env.path("sq.img");
    run_cmd(Command::new("mksquashfs").arg(env.path("content")).arg(&img).args(["-quiet", "-noappend"])).unwrap();
    // A writable loop device carrying squashfs, which has no freeze (EOPNOTSUPP).
    let lo = LoopDevice::attach(&img, &[]).unwrap();
    let _m = Mount::new(&lo.path, &env.path("sq"), &[]).unwrap();
    expect_refusal(&env, &lo.path, &[], "", 3, "cannot be frozen");
}

#[test]
fn already_frozen_by_someone_else_is_left_frozen() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("busy", 64 * MIB, "ext4");
    run_cmd(Command::new("fsfreeze").arg("-f").arg(&mnt.dir)).unwrap();
    expect_refusal(&env, &lo.path, &[], "", 3, "already frozen by someone else");
    assert!(is_frozen(&mnt.dir), "reseq thawed a freeze it did not make");
    run_cmd(Command::new("fsfreeze").arg("-u").arg(&mnt.dir)).unwrap();
}

/// Someone else's freeze met as a later window begins (FIFREEZE's EBUSY): the run stops,
/// resumable, leaves that freeze in place, and runs no FITRIM after it: the filesystem is
/// not reseq's to touch while another program holds it (a FITRIM on a frozen ext4 goes
/// ahead on this kernel, discarding under the other program's feet; it ran before).
#[test]
fn a_freeze_met_between_windows_stops_the_run_and_skips_the_trim() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("between", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 4, 4 << 20, 61);
    run_cmd(&mut Command::new("sync")).unwrap();
    let before = bytes_written_to(&lo.path);
    let mut run = env.reseq();
    run.args(["rewrite", "--json", "--chunk-size", "1M", "--max-freeze", "300ms", "--pause", "3s"])
        .arg(&lo.path)
        .env("RESEQ_FAULTS", "delay@after-write#*=20");
    let child = Running::captured(&mut run);
    // The first window written, then a freeze of our own in the pause after it (EBUSY
    // while reseq's window holds the filesystem: tried again).
    let t = std::time::Instant::now();
    while bytes_written_to(&lo.path) < before + 2 * MIB {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "no window wrote in 60 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    while Command::new("fsfreeze").arg("-f").arg(&mnt.dir).status().map(|s| !s.success()).unwrap_or(true) {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "could not freeze between windows");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait();
    let frozen = is_frozen(&mnt.dir);
    run_cmd(Command::new("fsfreeze").arg("-u").arg(&mnt.dir)).unwrap();
    let err = stderr(&out);
    assert!(frozen, "reseq thawed a freeze it did not make");
    assert!(err.contains("already frozen by someone else"), "{err}");
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("FITRIM"), "trimmed beside another program's freeze:\n{err}");
    let r = json_report(&out);
    assert!(r["space"]["bytes_trimmed"].is_null(), "{}", r["space"]);
    let out = output(env.reseq().args(["rewrite", "--resume", "--json"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "--resume: {}", stderr(&out));
    assert_files_intact(&files);
    drop(mnt);
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn kernel_refusing_writes_to_mounted_devices() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    // This kernel allows it, so the EBUSY comes from the test hook at the same open.
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("wm", 64 * MIB, "ext4");
    expect_refusal(&env, &lo.path, &[], "ebusy-open", 3, "the kernel refuses to open the mounted device");
    assert!(!is_frozen(&mnt.dir));
}

#[test]
fn lazily_unmounted_device() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("lazy", 64 * MIB, "ext4");
    let open_file = std::fs::File::create(mnt.dir.join("held")).unwrap();
    // Nothing pending in the journal: the detached filesystem stays quiet, so the device
    // hash before and after reseq can be compared.
    open_file.sync_all().unwrap();
    run_cmd(Command::new("sync").arg("-f").arg(&mnt.dir)).unwrap();
    run_cmd(Command::new("umount").arg("-l").arg(&mnt.dir)).unwrap();
    std::mem::forget(mnt); // already unmounted
    expect_refusal(&env, &lo.path, &[], "", 3, "lazily unmounted");
    drop(open_file); // the filesystem goes away now; the loop device can detach
}

#[test]
fn chunk_size_not_aligned() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("al.img", 16 * MIB, 2);
    expect_refusal(
        &env,
        &lo.path,
        &["--chunk-size", "1000"],
        "",
        2,
        "not a multiple of the device's direct-I/O alignment of 512",
    );
    let img = env.path("4k.img");
    std::fs::File::create(&img).unwrap().set_len(16 * MIB).unwrap();
    let lo4k = LoopDevice::attach(&img, &["--sector-size", "4096"]).unwrap();
    expect_refusal(&env, &lo4k.path, &["--chunk-size", "1049088"], "", 2, "alignment of 4096");
}

#[test]
fn rotational_needs_force() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("rot.img", 16 * MIB, 3);
    expect_refusal(&env, &lo.path, &[], "rotational", 3, "is a rotational disk");
    let out = output(env.reseq().args(["rewrite", "--force"]).arg(&lo.path).env("RESEQ_FAULTS", "rotational"));
    assert_eq!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("rotational"), "--force should still warn");
}

#[test]
fn freeze_longer_than_half_the_hung_task_timeout() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let timeout: u64 =
        std::fs::read_to_string("/proc/sys/kernel/hung_task_timeout_secs").unwrap().trim().parse().unwrap();
    assert!(timeout > 0, "this test needs the hung-task watchdog on");
    let env = TestEnv::new();
    let (lo, _mnt) = env.mounted("hung", 64 * MIB, "ext4");
    let too_long = format!("{}s", timeout / 2 + 1);
    expect_refusal(&env, &lo.path, &["--max-freeze", &too_long], "", 3, "hung_task_timeout_secs");
}

#[test]
fn resume_refuses_a_different_device() {
    if !require(&["losetup"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("first.img", 16 * MIB, 4);
    let out = output(
        env.reseq().args(["rewrite", "--chunk-size", "1M"]).arg(&lo.path).env("RESEQ_FAULTS", "kill@after-verify#3"),
    );
    assert_eq!(out.status.code(), None);
    let name = lo.name();
    drop(lo);
    // Another image on (most likely) the same loop number: same name, other identity.
    let other = env.random_loop_device("second.img", 16 * MIB, 5);
    if other.name() == name {
        let err =
            expect_refusal(&env, &other.path, &["--resume"], "", 3, "the device changed since the journal was written");
        // A short diff, not two JSON blobs.
        assert!(err.contains("loop backing file") && err.contains("first.img -> ") && !err.contains("{\""), "{err}");
        let out = output(env.reseq().args(["rewrite", "--restart"]).arg(&other.path));
        assert_eq!(out.status.code(), Some(0));
    } else {
        eprintln!("loop number changed ({name} -> {}); identity check covered by the unit test", other.name());
    }
}

/// Faults in the I/O path stop the run at once, name the offset, thaw, and leave the
/// data intact (an injected error never writes anything different).
fn fault(faults: &str, code: i32, needle: &str) {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    // Dense: the faults count chunks of the whole device, and holes are not chunks.
    let (lo, mnt) = env.mounted_dense("fault", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 4 << 20, 19);
    let out = output(
        env.reseq()
            .args(["rewrite", "--json", "--include-free", "--chunk-size", "1M"])
            .arg(&lo.path)
            .env("RESEQ_FAULTS", faults),
    );
    assert_eq!(out.status.code(), Some(code));
    assert!(stderr(&out).contains(needle), "{}", stderr(&out));
    let r = json_report(&out);
    assert_eq!(r["outcome"]["offset_bytes"], 5 * MIB, "the report names the offset");
    assert_eq!(journal_done(&env.state_dir(), &lo), 5, "chunks before the fault are done, none after");
    assert!(!is_frozen(&mnt.dir));
    assert_files_intact(&files);
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn injected_read_error() {
    fault("read-error@5M", 4, "reading the device at offset 5242880");
}

#[test]
fn injected_write_error() {
    fault(
        "write-error@5M",
        4,
        "writing 1048576 bytes at offset 5242880 failed 3 time(s) (the last: Input/output error (os error 5)). A read-back found the original bytes there (checked by blake3): data intact",
    );
}

#[test]
fn injected_checksum_mismatch() {
    // One byte flipped in the read-back: one sector named, and nothing written again.
    fault("corrupt@5M", 5, "512 bytes differ in 1 range(s) (device bytes 5242880..5243392)");
}

/// An input that is not there, or not what it should be, is bad input (exit 2), not an
/// I/O error of a run (exit 4); no permission to read a device is a refusal (exit 3).
#[test]
fn missing_or_wrong_inputs_are_usage_errors_and_permission_a_refusal() {
    if !require(&["losetup", "setpriv"]) {
        return;
    }
    let env = TestEnv::new();
    let missing = env.path("not-there");
    let junk = env.path("junk");
    std::fs::write(&junk, "not a state file").unwrap();
    let cases: Vec<Vec<std::ffi::OsString>> = vec![
        vec!["report".into(), missing.with_extension("json").into()],
        vec!["run".into(), "--config".into(), missing.with_extension("toml").into()],
        vec!["bench".into(), format!("sim:{}", missing.display()).into()],
        vec!["sim".into(), "info".into(), missing.clone().into()],
        vec!["sim".into(), "info".into(), junk.clone().into()],
        vec!["bench".into(), missing.clone().into()],
    ];
    for args in cases {
        let out = output(env.reseq().args(&args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("resumable"), "{args:?}: {}", stderr(&out));
    }
    let lo = env.random_loop_device("perm.img", 8 * MIB, 2);
    let out = output(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_reseq"), "bench"])
            .arg(&lo.path),
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("Permission denied"), "{}", stderr(&out));
}

/// Out-of-range numbers and durations are refused when parsed, naming the option; a
/// negative number gets that message, not clap's tip about `-- -4`.
#[test]
fn options_out_of_range_are_refused_naming_the_option() {
    let env = TestEnv::new();
    let cases: [(&[&str], &str); 6] = [
        (&["rewrite", "--max-overruns", "-4", "/dev/null"], "--max-overruns"),
        (&["rewrite", "--read-ahead", "65", "/dev/null"], "--read-ahead"),
        (&["rewrite", "--slow-threshold", "5", "/dev/null"], "not in (0, 1]"),
        (&["rewrite", "--pause", "1y", "/dev/null"], "longer than a day"),
        (&["rewrite", "--max-freeze", "5ms", "/dev/null"], "outside 10ms..1h"),
        (&["scan", "--threshold", "-0.5", "/dev/null"], "not in (0, 1]"),
    ];
    for (args, needle) in cases {
        let out = output(env.reseq().args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("-- -"), "{args:?}: no tip about --: {}", stderr(&out));
    }
}

/// What a user who is not root is told: a metrics directory it may not look into is not
/// "missing", and a report it may not read is bad input (exit 2), not a refusal of
/// something unsafe (exit 3).
#[test]
fn a_user_who_is_not_root_is_told_what_is_wrong() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let env = TestEnv::new();
    let locked = env.path("locked");
    std::fs::create_dir_all(locked.join("sub")).unwrap();
    std::fs::write(locked.join("r.json"), "{}").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    // The test's own directory must let the user reach the binary's arguments' parents.
    std::fs::set_permissions(env.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let as_nobody = |args: &[&str]| {
        let mut c = reseq_command();
        c.args(args).uid(65534).gid(65534);
        output(&mut c)
    };
    let metrics = locked.join("sub/m.prom");
    let out = as_nobody(&["rewrite", "/dev/null", "--metrics-file", metrics.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be looked into") && !stderr(&out).contains("does not exist"),
        "{}",
        stderr(&out)
    );
    let out = as_nobody(&["report", locked.join("r.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("Permission denied") && !stderr(&out).contains("refused"), "{}", stderr(&out));
}
