//! Which files a file-mode run rewrites when asked for some only: `--only-slow` (the
//! files a per-file scan flags, as `scan --by-file` does) and `--older-than` (the files
//! whose data is older than that). Both given: the files that are both (intersection),
//! since each flag narrows the run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::measure::byfile::{self, FileScan, FileSpeed, human_age};
use crate::measure::noise::ROUNDS;
use crate::options::bench::FileSort;
use crate::options::rewrite::RewriteOptions;
use crate::report::FileSelection;
use crate::support::error::{Error, Result};
use crate::support::units::{human_bytes, human_rate};

/// A file-mode rewrite writes through the device, not the filesystem: mtime and ctime
/// stay as they were, so ages do not show a refresh.
pub(crate) const AGES_UNCHANGED: &str = "a file-mode rewrite writes the same bytes through the device, not through the filesystem, so it does not change mtime or ctime; a run with --older-than records the files it refreshed in its state directory (refreshed.json) and --older-than counts their age from the refresh, so a later run leaves them alone until they are old again (files refreshed by a run without --older-than, or with another --state-dir, are chosen again; the report's files list what each run refreshed)";

/// The choice: why each file is rewritten, and why each other one is left alone (by
/// index into the run's files).
pub(crate) struct Choice {
    pub(crate) chosen: HashMap<usize, String>,
    pub(crate) left_alone: HashMap<usize, String>,
    pub(crate) summary: FileSelection,
}

/// The files of `paths` to rewrite, or None when every file is (no selecting flag).
/// `--only-slow` reads every file once (reads only, also for a dry run).
pub(crate) fn choose(o: &RewriteOptions, paths: &[PathBuf]) -> Result<Option<Choice>> {
    if !o.run.only_slow && o.run.older_than.is_none() {
        return Ok(None);
    }
    // The files' maps (FIEMAP) only for a scan: --older-than alone needs their times.
    let found = if o.run.only_slow { byfile::found_of(paths)? } else { Vec::new() };
    let scan = if !found.is_empty() {
        let read = (o.bench_opts.block_size, o.bench_opts.queue_depth);
        let scan = byfile::scan_found("the files of this run", &found, read, o.run.slow_threshold, FileSort::Age)?;
        if let Some(why) = &scan.unreliable_because {
            return Err(Error::refused(
                format!("--only-slow cannot tell which files read slowly: {why}"),
                "run again when the host is quieter, or choose files by age alone with --older-than",
            ));
        }
        Some(scan)
    } else {
        None
    };
    let by_path: HashMap<String, &FileSpeed> =
        scan.iter().flat_map(|s| s.files.iter()).map(|f| (f.path.clone(), f)).collect();
    let refreshed = super::refreshed::Refreshed::load(&o.state_dir);
    let (mut chosen, mut left_alone) = (HashMap::new(), HashMap::new());
    let (mut bytes_chosen, mut bytes_all) = (0, 0);
    for (i, p) in paths.iter().enumerate() {
        let Ok(md) = std::fs::metadata(p) else { continue };
        bytes_all += md.len();
        let age = (byfile::age_of(&md), refreshed.since(p, &md));
        match reasons(o, scan.as_ref(), by_path.get(&p.display().to_string()).copied(), age) {
            Ok(why) => {
                bytes_chosen += md.len();
                chosen.insert(i, why);
            }
            Err(why) => {
                left_alone.insert(i, why);
            }
        }
    }
    let summary = summary(o, scan, (chosen.len(), paths.len()), (bytes_chosen, bytes_all));
    log::info!("{}", summary.rule);
    Ok(Some(Choice { chosen, left_alone, summary }))
}

/// Every file's line of the choice, in path order: chosen or left alone, and why.
pub(crate) fn each_why<'a>(c: &Choice, paths: impl Iterator<Item = &'a std::path::Path>) -> String {
    let mut s = String::new();
    for (i, p) in paths.enumerate() {
        let (what, why) = match (c.chosen.get(&i), c.left_alone.get(&i)) {
            (Some(w), _) => ("chosen", w),
            (None, Some(w)) => ("left alone", w),
            (None, None) => continue,
        };
        s += &format!("    {}: {what}: {why}\n", p.display());
    }
    s
}

/// Why a file is chosen (Ok) or left alone (Err), in words with its figures.
fn reasons(
    o: &RewriteOptions,
    scan: Option<&FileScan>,
    speed: Option<&FileSpeed>,
    (written, refreshed): (f64, Option<f64>),
) -> std::result::Result<String, String> {
    let mut yes = Vec::new();
    if let Some(limit) = o.run.older_than {
        let want = age_words(limit);
        if let Some(r) = refreshed.filter(|r| *r < limit.as_secs_f64()) {
            return Err(format!(
                "younger than {want}: refreshed by reseq {} ago (state directory record)",
                human_age(r)
            ));
        }
        let (age, old) = (written, human_age(written));
        if age < limit.as_secs_f64() {
            return Err(format!("younger than {want} ({old} since its last write)"));
        }
        yes.push(format!("older than {want} ({old} since its last write)"));
    }
    if o.run.only_slow {
        let (Some(sc), Some(f)) = (scan, speed) else { return Err("no written data, nothing to read".into()) };
        let (rate, reference) = (human_rate(f.bytes_per_second), human_rate(reference_of(sc, f)));
        let threshold = sc.threshold * 100.0;
        if !f.slow {
            return Err(format!("reads at {rate}, not below {threshold:.0} % of {reference}"));
        }
        yes.push(format!(
            "flagged slow at every reading (up to {ROUNDS}), at best {rate} vs reference {reference} ({threshold:.0} % threshold)"
        ));
    }
    Ok(yes.join("; "))
}

/// The reference a file was judged against: its group's, for a small file.
fn reference_of(sc: &FileScan, f: &FileSpeed) -> f64 {
    if f.timed_alone {
        sc.reference_bytes_per_second
    } else {
        sc.small_files_reference_bytes_per_second.unwrap_or(sc.reference_bytes_per_second)
    }
}

/// The selection as the report has it.
fn summary(o: &RewriteOptions, scan: Option<FileScan>, files: (usize, usize), bytes: (u64, u64)) -> FileSelection {
    let how = match (o.run.only_slow, o.run.older_than) {
        (true, Some(d)) => format!("--only-slow and --older-than {}: files both slow and old", age_words(d)),
        (true, None) => format!("--only-slow: files flagged slow at each of up to {ROUNDS} readings"),
        (false, Some(d)) => format!("--older-than {}: files older than that", age_words(d)),
        (false, None) => "every file".into(),
    };
    let reference = scan
        .as_ref()
        .map(|s| format!("; reference {} ({})", human_rate(s.reference_bytes_per_second), s.reference))
        .unwrap_or_default();
    let (chosen, all) = (human_bytes(bytes.0), human_bytes(bytes.1));
    let share = bytes.0 as f64 * 100.0 / bytes.1.max(1) as f64;
    let rule = format!(
        "selection ({how}{reference}): {} of {} file(s), {chosen} of {all} ({share:.0} % of a full rewrite)",
        files.0, files.1
    );
    FileSelection {
        rule,
        only_slow: o.run.only_slow,
        older_than_seconds: o.run.older_than.as_ref().map(Duration::as_secs_f64),
        files_chosen: files.0,
        files_all: files.1,
        bytes_chosen: bytes.0,
        bytes_all: bytes.1,
        ages_after_rewrite: AGES_UNCHANGED.into(),
        scan,
    }
}

/// `--older-than` in words: whole days as days ("90d"), else as humantime spells it
/// ("36h", "6months").
fn age_words(d: Duration) -> String {
    match d.as_secs() {
        s if s > 0 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        _ => humantime::format_duration(d).to_string(),
    }
}
