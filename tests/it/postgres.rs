//! A real PostgreSQL: its cluster on a loop-mounted ext4 with data checksums, pgbench
//! running through the whole file-mode rewrite of `base/`. Afterwards pgbench has no
//! failed transaction, amcheck is clean over all indexes, and after a clean shutdown
//! pg_checksums passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

const MIB: u64 = 1 << 20;

fn pg_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

/// PostgreSQL's bin directory, with the tools these tests need; None (said) where they
/// are missing outside CI, a failure under CI=true.
fn postgres_here() -> Option<PathBuf> {
    if !require(&["losetup", "mkfs.ext4", "runuser", "fsfreeze"]) {
        return None;
    }
    let bin = pg_bin();
    if bin.is_none() {
        skip("missing test requirements: PostgreSQL under /usr/lib/postgresql (the README's test command installs it)");
    }
    bin
}

fn as_postgres(bin: &Path, tool: &str) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
    c
}

/// Stops the server on drop, thawing first: a server blocked on a frozen filesystem
/// cannot stop.
struct Server {
    bin: PathBuf,
    data: PathBuf,
    mnt: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("-u").arg(&self.mnt).output();
        let _ =
            as_postgres(&self.bin, "pg_ctl").args(["-D"]).arg(&self.data).args(["-m", "immediate", "stop"]).output();
    }
}

/// A cluster with data checksums in `mnt/data`, its server started (Unix socket in the
/// test's directory, port 5491), and pgbench's tables at `scale`.
fn start_cluster(env: &TestEnv, bin: &Path, mnt: &Path, scale: u32) -> (PathBuf, PathBuf, Server) {
    let data = mnt.join("data");
    let sock = env.path("sock");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&sock).unwrap();
    run_cmd(Command::new("chown").args(["-R", "postgres:postgres"]).arg(mnt).arg(&sock)).unwrap();
    run_cmd(Command::new("chmod").arg("755").arg(env.dir.path())).unwrap();
    run_cmd(
        as_postgres(bin, "initdb")
            .args(["--no-instructions", "--data-checksums", "-A", "trust", "-U", "postgres", "-D"])
            .arg(&data),
    )
    .unwrap();
    let opts = format!("-c listen_addresses='' -k {} -p 5491 -c fsync=on", sock.display());
    run_cmd(
        as_postgres(bin, "pg_ctl")
            .args(["-w", "-D"])
            .arg(&data)
            .args(["-o", &opts, "-l"])
            .arg(mnt.join("server.log"))
            .arg("start"),
    )
    .unwrap();
    let server = Server { bin: bin.to_path_buf(), data: data.clone(), mnt: mnt.to_path_buf() };
    let mut init = as_postgres(bin, "pgbench");
    init.args(["-h"]).arg(&sock).args(["-p", "5491", "-U", "postgres"]);
    run_cmd(init.args(["-i", "-q", "-s", &scale.to_string(), "postgres"])).unwrap();
    (data, sock, server)
}

/// Issue 27: a new user's nightly job over a PostgreSQL data directory prints under 15
/// lines on success, with the totals; over the whole data directory, the plan warns of
/// the WAL and names the option that leaves it out.
#[test]
fn a_nightly_run_over_a_postgresql_data_directory_prints_a_summary() {
    let Some(bin) = postgres_here() else { return };
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("pgn", 256 * MIB, "ext4");
    let (data, _sock, server) = start_cluster(&env, &bin, &mnt.dir, 2);
    let out = output(env.reseq().args(["rewrite", "--max-freeze", "1s"]).arg(data.join("base")));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.lines().count() < 15, "{} lines:\n{text}", text.lines().count());
    for total in
        ["reseq rewrite: ", "  rewrote ", "  windows: ", "  files: ", "; verification: passed\n", "  outcome: success"]
    {
        assert!(text.contains(total), "{total:?} missing:\n{text}");
    }
    let log = stderr(&out);
    assert!(log.lines().count() < 5, "{log}");
    // The whole data directory: its WAL is named, with the option that leaves it out.
    let dry = |extra: &[&str]| {
        let out = output(env.reseq().args(["rewrite", "--dry-run", "--json"]).args(extra).arg(&data));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        json_report(&out)["warnings"].to_string()
    };
    let warnings = dry(&[]);
    assert!(
        warnings.contains("the PostgreSQL WAL is among the files") && warnings.contains("--exclude pg_wal"),
        "{warnings}"
    );
    assert!(!dry(&["--exclude", "pg_wal"]).contains("WAL"));
    run_cmd(as_postgres(&bin, "pg_ctl").args(["-w", "-D"]).arg(&data).args(["-m", "fast", "stop"])).unwrap();
    std::mem::forget(server);
    run_cmd(as_postgres(&bin, "pg_checksums").args(["--check", "-D"]).arg(&data)).expect("pg_checksums clean");
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}

#[test]
fn postgresql_under_pgbench_survives_a_file_mode_rewrite() {
    let Some(bin) = postgres_here() else { return };
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("pg", 768 * MIB, "ext4");
    let (data, sock, server) = start_cluster(&env, &bin, &mnt.dir, 20);
    let conn = |c: &mut Command| {
        c.args(["-h"]).arg(&sock).args(["-p", "5491", "-U", "postgres"]);
    };

    // pgbench through the whole rewrite, logging every transaction's latency.
    let logdir = env.path("pgbench");
    std::fs::create_dir_all(&logdir).unwrap();
    run_cmd(Command::new("chown").arg("postgres").arg(&logdir)).unwrap();
    let mut bench = as_postgres(&bin, "pgbench");
    conn(&mut bench);
    bench.args(["-c", "4", "-j", "2", "-T", "20", "--log", "--log-prefix"]).arg(logdir.join("tx")).arg("postgres");
    let bench = bench.current_dir(&logdir).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(2));

    let r = json_ok(
        // Its subject is pgbench through the run: overruns of a busy host do not stop it.
        env.reseq()
            .args(["rewrite", "--json", "--max-freeze", "500ms", "--pause", "200ms", "--max-overruns", "1000"])
            .arg(data.join("base")),
    );
    let files = r["files"].as_array().unwrap();
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    assert!(written > 200 * MIB, "the pgbench tables should be rewritten ({written} bytes)");
    assert!(files.iter().all(|f| f["verification"] != "incomplete"), "every file finished");

    let bench = bench.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&bench.stdout);
    eprintln!("{report}\n{}", String::from_utf8_lossy(&bench.stderr));
    assert!(bench.status.success(), "pgbench failed");
    assert!(report.contains("number of failed transactions: 0 "), "pgbench had failed transactions");
    // The longest transaction, from pgbench's per-transaction log (3rd field, µs).
    let mut worst = 0u64;
    for e in std::fs::read_dir(&logdir).unwrap().flatten() {
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            worst = worst.max(line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or(0));
        }
    }
    eprintln!(
        "longest pgbench transaction: {:.1} ms (windows: longest freeze {} s)",
        worst as f64 / 1000.0,
        r["results"]["longest_freeze_seconds"]
    );

    let mut psql = Command::new("runuser");
    psql.args(["-u", "postgres", "--", "psql", "-q", "-h"]).arg(&sock).args([
        "-p",
        "5491",
        "-U",
        "postgres",
        "-c",
        "CREATE EXTENSION amcheck",
        "postgres",
    ]);
    run_cmd(&mut psql).unwrap();
    let mut check = as_postgres(&bin, "pg_amcheck");
    conn(&mut check);
    run_cmd(check.args(["--all", "--heapallindexed"])).expect("amcheck clean");

    run_cmd(as_postgres(&bin, "pg_ctl").args(["-w", "-D"]).arg(&data).args(["-m", "fast", "stop"])).unwrap();
    std::mem::forget(server);
    run_cmd(as_postgres(&bin, "pg_checksums").args(["--check", "-D"]).arg(&data)).expect("pg_checksums clean");
    mnt.unmount().unwrap();
    fsck_clean(&lo.path, "ext4");
}
