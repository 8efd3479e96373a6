//! `reseq generate DIR`: the man page and shell completions, generated from the clap
//! definitions so they can never drift from the real options. Never edit them by hand.

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;
use roff::{Roff, bold, italic, roman};

use crate::cli::Cli;
use crate::support::error::{Error, Result};
use crate::support::exit_codes::ExitCode;

fn arg_line(a: &clap::Arg) -> Vec<roff::Inline> {
    let mut v = Vec::new();
    if let Some(s) = a.get_short() {
        v.push(bold(format!("-{s}")));
        if a.get_long().is_some() {
            v.push(roman(", "));
        }
    }
    if let Some(l) = a.get_long() {
        v.push(bold(format!("--{l}")));
    }
    if a.get_action().takes_values() {
        let name = a.get_value_names().and_then(|n| n.first()).map(|n| n.to_string()).unwrap_or_else(|| "VALUE".into());
        if a.is_positional() {
            v.push(italic(name));
        } else {
            v.push(roman(" "));
            v.push(italic(name));
        }
    }
    v
}

fn arg_help(a: &clap::Arg) -> String {
    let mut h = a.get_long_help().or(a.get_help()).map(|h| h.to_string()).unwrap_or_default();
    let defaults: Vec<String> = a.get_default_values().iter().map(|d| d.to_string_lossy().into_owned()).collect();
    let values: Vec<String> = a.get_possible_values().iter().map(|v| v.get_name().to_string()).collect();
    if !values.is_empty() && a.get_action().takes_values() {
        h += &format!(" [values: {}]", values.join(", "));
    }
    // A default chosen at run time (--chunk-size, --read-ahead) is in the help's own words.
    if !defaults.is_empty() && a.get_action().takes_values() && !a.is_hide_default_value_set() {
        h += &format!(" [default: {}]", defaults.join(","));
    }
    h
}

fn options(roff: &mut Roff, cmd: &clap::Command) {
    for a in cmd.get_arguments().filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version") {
        roff.control("TP", []).text(arg_line(a)).text([roman(arg_help(a))]);
    }
}

/// The three uses, as an admin would type them.
fn examples(r: &mut Roff) {
    r.control("SH", ["EXAMPLES"]);
    let ex: [(&str, &[&str]); 7] = [
        (
            "A maintenance window: the whole device, 5 s windows, a before/after benchmark, the report kept.",
            &[
                "reseq rewrite /dev/nvme0n1p3 --dry-run",
                "reseq rewrite /dev/nvme0n1p3 --bench --json > run.json",
                "reseq report run.json --format html > run.html",
            ],
        ),
        (
            "A timer over database files on a live server: one-second stalls, a pause between windows, resumable.",
            &[
                "reseq rewrite /var/lib/postgresql/15/main/base --max-freeze 1s --pause 2s --resume \\",
                "    --metrics-file /var/lib/node_exporter/textfile_collector/reseq-pg.prom",
                "cp /etc/reseq/example.toml /etc/reseq/pgdata.toml; systemctl enable --now reseq@pgdata.timer",
            ],
        ),
        (
            "Is it worth it? Read first, write nothing.",
            &[
                "reseq estimate /dev/nvme0n1p3",
                "reseq scan /dev/nvme0n1p3 --regions 64",
                "reseq bench /var/lib/postgresql/15/main/base --passes 3",
            ],
        ),
        (
            "After an interruption: continue with the options the run was started with, or start over.",
            &["reseq rewrite /dev/nvme0n1p3 --resume", "reseq rewrite /dev/nvme0n1p3 --restart"],
        ),
        (
            "Does this drive stall readers while it trims? Then pace the trim after a rewrite.",
            &[
                "reseq bench --trim-impact /var/lib/postgresql --trim-size 4G",
                "reseq rewrite /dev/nvme0n1p3 --trim-rate 2G --bench",
            ],
        ),
        ("No degraded SSD at hand: the whole effect on a simulated drive.", &["reseq simulate", "reseq demo"]),
        (
            "The simulated drive as a block device (FUSE; its time x10 on the wall clock): every real code path on it.",
            &[
                "reseq sim create ssd.sim --device-size 2G",
                "reseq sim serve ssd.sim /tmp/ssd &",
                "losetup --direct-io=on --sector-size 4096 --find --show /tmp/ssd/disk",
            ],
        ),
    ];
    for (what, lines) in ex {
        r.control("PP", []).text([roman(what)]);
        r.control("RS", ["4"]);
        r.control("nf", []);
        for l in lines {
            r.text([roman(*l)]);
            r.control("br", []);
        }
        r.control("fi", []);
        r.control("RE", []);
    }
}

/// The man page: NAME, SYNOPSIS, DESCRIPTION, one section per subcommand, EXIT STATUS,
/// FILES, ENVIRONMENT.
pub(crate) fn man_page() -> String {
    let cmd = Cli::command();
    let mut r = Roff::new();
    r.control("TH", ["RESEQ", "1", "", &format!("reseq {}", env!("CARGO_PKG_VERSION")), "User Commands"]);
    r.control("SH", ["NAME"])
        .text([roman(format!("reseq - {}", cmd.get_about().map(|a| a.to_string()).unwrap_or_default()))]);
    r.control("SH", ["SYNOPSIS"]).text([
        bold("reseq"),
        roman(" ["),
        italic("OPTIONS"),
        roman("] "),
        italic("COMMAND"),
        roman(" ..."),
    ]);
    r.control("SH", ["DESCRIPTION"]).text([roman(cmd.get_long_about().map(|a| a.to_string()).unwrap_or_default())]);
    r.control("SS", ["Global options"]);
    options(&mut r, &cmd);
    subcommands(&mut r, &cmd);
    freeze_bound(&mut r);
    examples(&mut r);
    rescue_trim_resume(&mut r);
    exit_status(&mut r);
    files(&mut r);
    environment(&mut r);
    r.render()
}

/// One section per subcommand, with its options and its own subcommands.
fn subcommands(r: &mut Roff, cmd: &clap::Command) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = sub.get_name();
        r.control("SH", [format!("RESEQ {}", name.to_uppercase()).as_str()]);
        let mut synopsis = vec![bold(format!("reseq {name}")), roman(" ["), italic("OPTIONS"), roman("]")];
        for p in sub.get_positionals() {
            synopsis.push(roman(" "));
            synopsis.push(italic(p.get_id().as_str().to_uppercase()));
        }
        r.text(synopsis);
        r.control("PP", [])
            .text([roman(sub.get_long_about().or(sub.get_about()).map(|a| a.to_string()).unwrap_or_default())]);
        options(r, sub);
        for inner in sub.get_subcommands() {
            r.control("SS", [format!("reseq {name} {}", inner.get_name()).as_str()]);
            r.text([roman(inner.get_about().map(|a| a.to_string()).unwrap_or_default())]);
            options(r, inner);
        }
    }
}

/// How long a freeze lasts at most, the guardian, and other freezers.
fn freeze_bound(r: &mut Roff) {
    r.control("SH", ["FREEZE BOUND"]).text([roman(
        "No freeze window lasts longer than --max-freeze plus a grace: --max-freeze itself, at least 250 ms and at most 1 s (--max-freeze 500ms: 1 s in all; the default 5 s: 6 s). --dry-run prints the bound and the report carries it (freeze_bound). At the deadline the guardian grants no more writes; a write or read-back still outstanding at the end of the grace means reseq is stopped or stalled, and the guardian kills it (SIGKILL through a pidfd), waits until none of its threads is left, thaws, and notes it in the journal (exit status 137; --resume continues). Ctrl-Z waits for the end of the window. The one wait nothing can bound is I/O the kernel cannot finish (a task in D state on a failing device).",
    )]);
    r.control("PP", []).text([roman(
        "The guardian is the process that freezes and thaws. It runs in its own session, ignores termination and job-control signals, and is named freeze-guardian (process name and command line), so pkill reseq, pkill -f reseq, killall reseq, timeout and a systemd stop of reseq's main process do not reach it. See it with ps -o pid,ppid,sid,stat,args -C freeze-guardian; its parent is reseq. If both processes are killed anyway, reseq thaw thaws what they left frozen, and nothing else.",
    )]);
    r.control("PP", []).text([roman(
        "If another program thaws reseq's freeze, or thaws and freezes again (VM snapshot agents, backup hooks), reseq stops writing at once, never thaws the other program's freeze, names the filesystem, window and byte range, and exits 8. Do not schedule other freezers during a run.",
    )]);
}

/// RESCUE COPIES, TRIM and RESUMING.
fn rescue_trim_resume(r: &mut Roff) {
    r.control("SH", ["RESCUE COPIES"]).text([roman(
        "A write that fails is retried, each attempt read back, up to 3 attempts. A chunk whose write never verifies, tears, or reads back different keeps its original bytes in a rescue file in the state directory, rescue-DEVICE-OFFSET-BLAKE3-ID.bin, and the message says whether a read-back found the original bytes there (data intact) or other bytes (uncertain). Every later run on that device refuses until reseq restore FILE has put the bytes back; reseq restore freezes as a rewrite does, reads back, refuses another device or a range that changed since (unless --force), and removes the copy only then.",
    )]);
    r.control("SH", ["TRIM"]).text([roman(
        "After a used-space rewrite of a device with mounted ext4/xfs (not with --no-trim, not after a refused, lost or signalled run), reseq discards the filesystems' free space with FITRIM in slices: ascending, each byte of a filesystem in exactly one slice, and only after the last freeze window is thawed. One FITRIM over a whole filesystem can stall a drive's reads for seconds. By default reseq times each slice and idles 4 times as long before the next (the device busy with TRIM at most 20 % of the time), sizing slices to about 100 ms each. --trim-rate SIZE paces by bytes discarded per second instead (slices of a quarter second's worth; after a stall, such as SIGSTOP, it does not catch up in a burst); --pause sleeps at least that long between slices (both given: the longer sleep). ext4 discards a free extent that begins in a slice up to its end (at most its block group, 128 MiB with 4 KiB blocks), so one slice can discard more than its length; the pace counts what was discarded (xfs reports the range it went through instead, which the pace then counts). SIGINT/SIGTERM stops between slices; the report says what was trimmed, and reseq exits 6. With --bench, a light probe (4 KiB O_DIRECT reads of data in use, one every 5 ms) measures read latency before the trim (for 2 s and at least 100 reads, 10 s at most) and during it. reseq bench --trim-impact DIR measures the same on a scratch file it writes, deletes and trims on that filesystem, and removes in every case; it is refused (exit 3) where the device cannot discard.",
    )]);
    r.control("SH", ["RESUMING"]).text([roman(
        "A run that stops (a signal, a kill, a reboot, an error) leaves its journal, and every later run over the same device or the same files is refused (exit 3) until it is given --resume, which continues it, or --restart, which starts over. With --resume (or resume = true in a config file) a run continues with the options it was started with: an option left out takes the interrupted run's value, and an option given with another value is refused (exit 2), except the pacing options (--max-freeze, --rate, --pause, --max-overruns, --read-ahead, --trim-rate), which replace the run's for that run with a warning. A refused run writes nothing in the state directory. A resumed file-mode run skips the files the interrupted run finished, continues a large file where its journal says, and rewrites again the small files it was in the middle of (at most 16 MiB).",
    )]);
}

/// Every exit code, 134 (a bug inside a window) and 137 (killed).
fn exit_status(r: &mut Roff) {
    r.control("SH", ["EXIT STATUS"]);
    for c in ExitCode::ALL {
        r.control("TP", []).text([bold(c.code().to_string())]).text([roman(c.describe())]);
    }
    r.control("TP", []).text([bold("134")]).text([roman(
        "aborted (SIGABRT): a bug (a panic) while a window's stages ran; reseq ends at once (no core dump) rather than wind down with a half-updated state, and the guardian thaws on its death and prints the message (reseq writes nothing to stderr while frozen: it may be a file on the frozen filesystem); --resume continues as after 137",
    )]);
    r.control("TP", []).text([bold("137")]).text([roman(
        "killed (SIGKILL): by its guardian when a window outlasted its bound with a write outstanding (the guardian says so on stderr and in the journal), or by someone else; thawed; --resume continues and first re-reads every chunk that was in flight against its blake3",
    )]);
}

/// The files reseq keeps and reads.
fn files(r: &mut Roff) {
    r.control("SH", ["FILES"]);
    r.control("TP", []).text([italic("/var/lib/reseq/device-NAME.journal")]).text([roman(
        "The journal of a device's run (--state-dir, RESEQ_STATE_DIR): the plan and every finished chunk, each line checked by blake3. --resume continues from it. When the run finishes it is compacted to the plan and the verified chunks with their hashes, and kept until the next run of that device replaces it.",
    )]);
    r.control("TP", [])
        .text([italic("/var/lib/reseq/files-KEY-DEVICE.journal")])
        .text([roman("File mode: the journal of the run over one filesystem's files, with their table; every file below its cursor is finished. Removed when the run finishes.")]);
    r.control("TP", []).text([italic("/var/lib/reseq/files-KEY.run")]).text([roman(
        "File mode: the run's targets and options, and the files finished before a resume; removed when the run finishes. --resume skips the files it and the journals list, and continues the file a journal stopped in.",
    )]);
    r.control("TP", []).text([italic("/var/lib/reseq/rescue-NAME-OFFSET-BLAKE3.bin")]).text([roman(
        "A rescue copy: the original bytes of a chunk whose write did not verify, with a JSON header. reseq restore puts it back.",
    )]);
    r.control("TP", []).text([italic("/var/lib/reseq/device-NAME.lock")]).text([roman(
        "Held (flock) by the run working on the device; a second run on it is refused with the first one's PID.",
    )]);
    r.control("TP", []).text([italic("/etc/reseq/NAME.toml")]).text([roman(
        "A job for reseq run --config and the reseq@NAME systemd units: every key is a reseq rewrite option (example.toml shows them).",
    )]);
    r.control("TP", []).text([italic("PATH.prom")]).text([roman(
        "Prometheus textfile metrics written atomically with --metrics-file, for node_exporter's textfile collector.",
    )]);
    r.control("TP", []).text([italic("/run/reseq/guardian-PID-START.freeze")]).text([roman(
        "A freeze record: what a guardian is freezing, written before each freeze and removed after the thaw (RESEQ_RUN_DIR). reseq thaw acts on the records of guardians that are gone.",
    )]);
}

/// ENVIRONMENT and SEE ALSO.
fn environment(r: &mut Roff) {
    r.control("SH", ["ENVIRONMENT"]);
    r.control("TP", []).text([bold("RUST_LOG")]).text([roman("Log filter (env_logger syntax); overrides -v and -q.")]);
    r.control("TP", []).text([bold("RESEQ_STATE_DIR")]).text([roman("Default of --state-dir.")]);
    r.control("TP", []).text([bold("RESEQ_RUN_DIR")]).text([roman(
        "Where guardians keep their freeze records (default /run/reseq; must be writable and not on a filesystem reseq freezes).",
    )]);
    r.control("SH", ["SEE ALSO"]).text([
        bold("fsfreeze"),
        roman("(8), "),
        bold("fstrim"),
        roman("(8), "),
        bold("blkdiscard"),
        roman("(8)"),
    ]);
}

/// Writes `reseq.1`, `reseq.bash`, `_reseq` (zsh) and `reseq.fish` into `dir`.
pub(crate) fn generate(dir: &Path) -> Result<()> {
    let io = |e| Error::io(format!("writing into {}", dir.display()), e);
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::File::create(dir.join("reseq.1")).and_then(|mut f| f.write_all(man_page().as_bytes())).map_err(io)?;
    use clap_complete::Shell;
    for (shell, file) in [(Shell::Bash, "reseq.bash"), (Shell::Zsh, "_reseq"), (Shell::Fish, "reseq.fish")] {
        let mut f = std::fs::File::create(dir.join(file)).map_err(io)?;
        clap_complete::generate(shell, &mut Cli::command(), "reseq", &mut f);
    }
    Ok(())
}
