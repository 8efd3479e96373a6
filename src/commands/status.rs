//! `reseq status`: what the state directory says is unfinished, and what waits for the
//! admin. An admin coming back to a server (or a timer job that refused with exit 3)
//! sees here which runs can be resumed and with which options, and which rescue copies
//! must be restored before anything else runs. Reads only.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::engine::journal;
use crate::support::error::{Error, Result};

/// An unfinished run.
#[derive(Debug, Serialize)]
pub(crate) struct Unfinished {
    /// `device`, `files` (a file-mode run) or `file` (a file-mode run's journal of one
    /// filesystem, named by the file it stopped in).
    pub(crate) kind: String,
    /// The device, the targets, or the file.
    pub(crate) target: String,
    pub(crate) started_at: String,
    /// How far it got, in words.
    pub(crate) progress: String,
    /// The options `--resume` continues it with (null: not recorded, an older run).
    pub(crate) options: Option<String>,
    pub(crate) record: String,
    /// What its stops left to check, one line per stop (exit 5, 8 or 9): device ranges
    /// where another writer's bytes may have been overwritten, or a read-back differed.
    pub(crate) at_risk: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct Status {
    pub(crate) state_dir: String,
    pub(crate) unfinished: Vec<Unfinished>,
    /// Rescue copies and torn-write notes: each stops later runs on its device.
    pub(crate) rescue_copies: Vec<String>,
    /// Journals or records that could not be read.
    pub(crate) unreadable: Vec<String>,
    /// Runs working now: "DEVICE: PID N" (from the device locks they hold).
    #[serde(default)]
    pub(crate) running: Vec<String>,
    /// What a finished run's stops (exit 5, 8 or 9 on the way, then resumed) left to
    /// check: "TARGET: stopped with exit N (...): check device bytes ...". Kept until
    /// the device's next run replaces its journal.
    pub(crate) to_check: Vec<String>,
}

impl Status {
    pub(crate) fn to_text(&self) -> String {
        let mut s = format!("state directory {}\n", self.state_dir);
        if self.unfinished.is_empty()
            && self.rescue_copies.is_empty()
            && self.unreadable.is_empty()
            && self.to_check.is_empty()
        {
            s += "  nothing unfinished, no rescue copies\n";
        }
        for r in &self.running {
            s += &format!("  running now: {r} (an unfinished run below may be this one)\n");
        }
        for u in &self.unfinished {
            s += &format!("  unfinished {} run: {} (started {}), {}\n", u.kind, u.target, u.started_at, u.progress);
            for r in &u.at_risk {
                s += &format!("    at risk: {r}\n");
            }
            if let Some(o) = &u.options {
                s += &format!("    --resume continues it with: {o}\n");
            }
            s += &format!("    record: {}\n", u.record);
        }
        for c in &self.to_check {
            s += &format!("  to check (a finished run stopped on its way): {c}\n");
        }
        for r in &self.rescue_copies {
            s += &format!("  rescue copy (restore it: reseq restore FILE): {r}\n");
        }
        for r in &self.unreadable {
            s += &format!("  unreadable: {r}\n");
        }
        // 100 columns, as every default text (a path longer than a line stays whole).
        crate::support::output::fit(&s, crate::support::output::WIDTH)
    }
}

fn entries(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?.flatten().map(|e| e.path()).collect();
    v.sort();
    Ok(v)
}

fn name_of(p: &Path) -> String {
    p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Reads the state directory (and the run directory, for rescue copies kept there).
pub(crate) fn run(state_dir: &Path) -> Result<Status> {
    let dir = crate::host::state_dir::resolve(state_dir);
    if !dir.is_dir() {
        return Err(Error::Usage(format!("{} is not a directory (--state-dir)", dir.display())));
    }
    let mut st = Status { state_dir: dir.display().to_string(), ..Status::default() };
    // Unreadable (not root, say): an error, not an empty status.
    let listed = entries(&dir).map_err(|e| Error::input(format!("the state directory {}", dir.display()), e))?;
    for p in listed {
        let name = name_of(&p);
        // A lock file exists while a run holds it (it is removed at the end); its PID
        // names the run, if that process is still there.
        if let Some(dev) = name.strip_prefix("device-").and_then(|n| n.strip_suffix(".lock")) {
            st.running.extend(running(&p, dev));
        } else if name.ends_with(".journal") {
            journal_entry(&mut st, &p, &name);
        } else if name.starts_with("files-") && name.ends_with(".run") {
            files_entry(&mut st, &p);
        }
    }
    for d in crate::engine::rescue::dirs(&dir) {
        match entries(&d) {
            Ok(listed) => {
                let records = listed.into_iter().filter(|p| crate::engine::rescue::is_rescue_record(p));
                st.rescue_copies.extend(records.map(|p| p.display().to_string()));
            }
            // No run directory: no run since boot kept anything there.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => st.unreadable.push(format!("{}: {e}", d.display())),
        }
    }
    Ok(st)
}

/// "DEVICE: reseq PID N" for a device lock whose PID is still a reseq.
fn running(lock: &Path, dev: &str) -> Option<String> {
    let pid = std::fs::read_to_string(lock).ok().and_then(|t| t.trim().parse::<u32>().ok());
    // Still a reseq: a PID left in a killed run's lock can be reused by anything.
    let is_reseq =
        |pid: &u32| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.windows(5).any(|w| w == b"reseq"));
    pid.filter(is_reseq).map(|pid| format!("/dev/{dev}: reseq PID {pid}"))
}

/// A journal: an unfinished device run or large file, or unreadable.
fn journal_entry(st: &mut Status, p: &Path, name: &str) {
    let shown = p.display().to_string();
    match journal::read(p) {
        Ok(Some(r)) if !r.finished => {
            let Some(run) = r.run else {
                st.unreadable.push(format!("{shown}: its first record is damaged"));
                return;
            };
            // A file-mode run's journal names the file it stopped in.
            let at = run.files.iter().find(|p| r.done_offset < p.base + p.span).or(run.files.last());
            let (kind, target) = match at {
                Some(p) => ("file", p.file.path.clone()),
                None if name.starts_with("file-") => {
                    let why =
                        "a file journal of an older reseq, which is not resumed (its file is done again): remove it";
                    return st.unreadable.push(format!("{shown}: {why}"));
                }
                None => ("device", format!("/dev/{}", run.identity.name)),
            };
            st.unfinished.push(Unfinished {
                kind: kind.into(),
                target,
                started_at: run.started_at.clone(),
                progress: bytes_done(r.done_offset, &run),
                options: run.options.as_ref().map(|o| o.describe()),
                record: shown,
                at_risk: r.at_risk.iter().map(journal::AtRiskNote::describe).collect(),
            });
        }
        Ok(Some(r)) => {
            let target = r.run.as_ref().map_or(shown, |run| format!("/dev/{}", run.identity.name));
            st.to_check.extend(r.at_risk.iter().map(|n| format!("{target}: {}", n.describe())));
        }
        Ok(None) => {}
        Err(e) => st.unreadable.push(format!("{shown}: {e}")),
    }
}

/// How far an unfinished run got, in bytes of its range: chunks adapt their size to the
/// windows, so a count of chunks done says nothing against the planned total.
fn bytes_done(done_offset: u64, run: &crate::engine::journal::RunRecord) -> String {
    let (start, end) = (run.range_start_bytes, run.range_end_bytes);
    let done = done_offset.clamp(start, end) - start;
    let total = end - start;
    format!(
        "{} of {} done ({:.1} %)",
        crate::support::units::human_bytes(done),
        crate::support::units::human_bytes(total),
        100.0 * done as f64 / total.max(1) as f64
    )
}

/// A file-mode run's record: unfinished, or unreadable.
fn files_entry(st: &mut Status, p: &Path) {
    let shown = p.display().to_string();
    match crate::rewrite::files::record::read(p) {
        Ok(Some(e)) => st.unfinished.push(Unfinished {
            kind: "files".into(),
            target: e.header.targets.join(" "),
            started_at: e.header.started_at.clone(),
            progress: format!("{} file(s) done", e.done.len()),
            options: Some(e.header.options.describe()),
            record: shown,
            // Its device runs' journals name them.
            at_risk: Vec::new(),
        }),
        Ok(None) => {}
        Err(e) => st.unreadable.push(format!("{shown}: {e}")),
    }
}
