//! `reseq demo`: the main job on a throwaway device, for a newcomer.
//!
//! It makes a sparse image in a temporary directory, attaches a loop device, puts ext4
//! on it, writes a database-like file (8 KiB pages) and overwrites pages at random the
//! way a database does, then re-sequences the device *while it is mounted* with the real
//! code path (freeze windows, guardian, verification, journal), checks the file is
//! byte-identical, runs e2fsck, and cleans everything up, on failure too.

use std::io::{Seek, SeekFrom, Write};
use std::process::Command;

use crate::cli::{DemoArgs, RewriteArgs};
use crate::error::{Error, Result};
use crate::report::Report;
use crate::scratch::{LoopDevice, Mount, XorShift, hash_path, mkfs_ext4, run_cmd};
use crate::units::{self, human_bytes};

const PAGE: usize = 8192;

fn io(ctx: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(ctx.to_string(), e)
}

/// Runs the demo; returns the rewrite's report.
pub fn run(args: &DemoArgs, quiet: bool) -> (Option<Report>, Result<()>) {
    if !nix::unistd::geteuid().is_root() {
        let e = Error::refused(
            "the demo attaches a loop device and mounts ext4 on it, which needs root",
            "run `sudo reseq demo` (it touches only a temporary image file)",
        );
        return (None, Err(e));
    }
    let size = match units::parse_size(&args.size) {
        Ok(s) if s >= 64 << 20 => s,
        Ok(_) => {
            return (None, Err(Error::Usage("--size must be at least 64M".into())));
        }
        Err(e) => return (None, Err(Error::Usage(format!("--size: {e}")))),
    };
    let mut report = None;
    let r = demo(size, args.json, quiet, &mut report);
    (report, r)
}

fn say(quiet: bool, msg: String) {
    if !quiet {
        eprintln!("demo: {msg}");
    }
}

fn demo(size: u64, json: bool, quiet: bool, report_out: &mut Option<Report>) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("reseq-demo-").tempdir().map_err(io("creating a temporary directory"))?;
    let image = dir.path().join("disk.img");
    let lo = LoopDevice::create(&image, size).map_err(io("attaching a loop device"))?;
    say(quiet, format!("attached {} over a sparse {} image {}", lo.path.display(), human_bytes(size), image.display()));
    mkfs_ext4(&lo.path).map_err(io("making ext4"))?;
    let mnt = Mount::new(&lo.path, &dir.path().join("mnt"), &[]).map_err(io("mounting"))?;
    say(quiet, format!("mounted ext4 at {}", mnt.dir.display()));

    // A database-like file: pages written in order, then overwritten at random.
    let db_path = mnt.dir.join("table.db");
    let pages = (size / 4 / PAGE as u64) as usize;
    let mut rng = XorShift::new(0x5eed);
    let mut db = std::fs::File::create(&db_path).map_err(io("creating the database file"))?;
    let mut page = vec![0u8; PAGE];
    for p in 0..pages {
        rng.fill(&mut page);
        page[..8].copy_from_slice(&(p as u64).to_le_bytes());
        db.write_all(&page).map_err(io("writing the database file"))?;
    }
    db.sync_all().map_err(io("syncing"))?;
    let updates = pages * 2;
    for i in 0..updates {
        let p = (rng.next_u64() % pages as u64) as usize;
        rng.fill(&mut page);
        page[..8].copy_from_slice(&(p as u64).to_le_bytes());
        db.seek(SeekFrom::Start((p * PAGE) as u64)).map_err(io("seeking"))?;
        db.write_all(&page).map_err(io("updating a page"))?;
        if i % 256 == 0 {
            db.sync_data().map_err(io("syncing"))?;
        }
    }
    db.sync_all().map_err(io("syncing"))?;
    drop(db);
    let before = hash_path(&db_path).map_err(io("hashing the database file"))?;
    say(
        quiet,
        format!(
            "wrote {} of 8 KiB pages, then {updates} random page updates (blake3 {})",
            human_bytes((pages * PAGE) as u64),
            &before.to_hex()[..16]
        ),
    );

    say(
        quiet,
        format!(
            "re-sequencing {} while mounted: reseq rewrite {} --max-freeze 1s",
            lo.path.display(),
            lo.path.display()
        ),
    );
    let rewrite_args = RewriteArgs {
        targets: vec![lo.path.clone()],
        exclude: Vec::new(),
        chunk_size: crate::cli::DEFAULT_CHUNK_SIZE.into(),
        max_freeze: Some("1s".into()),
        pause: "100ms".into(),
        rate: None,
        read_ahead: 2,
        max_overruns: 3,
        no_verify: false,
        force: false,
        include_free: false,
        no_trim: false,
        trim_rate: None,
        only_slow: false,
        from_scan: None,
        scan_regions: 64,
        slow_threshold: 0.7,
        dry_run: false,
        resume: false,
        restart: false,
        state_dir: dir.path().join("state"),
        bench: false,
        bench_opts: crate::cli::BenchOpts::defaults(),
        output: crate::cli::OutputArgs { json, ..Default::default() },
    };
    let (report, result) = crate::rewrite::run(&rewrite_args, quiet);
    *report_out = Some(report);
    result?;

    let after = hash_path(&db_path).map_err(io("hashing the database file again"))?;
    if after != before {
        return Err(Error::Internal(format!("the database file changed: {before} -> {after}")));
    }
    std::fs::write(mnt.dir.join("after.txt"), b"the filesystem takes writes: it is thawed\n")
        .map_err(io("writing after the run"))?;
    mnt.unmount().map_err(io("unmounting"))?;
    run_cmd(Command::new("e2fsck").args(["-f", "-n"]).arg(&lo.path)).map_err(io("e2fsck after the run"))?;
    say(quiet, "database file byte-identical, filesystem thawed and writable, e2fsck -fn clean".into());
    drop(lo);
    say(quiet, "cleaned up the loop device and the image".into());
    Ok(())
}
