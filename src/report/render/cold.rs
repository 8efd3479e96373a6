//! Cold data in words: `scan --by-file` (a table by age band, then the slow files) and
//! the per-file estimate, for the text rendering (and one line for the tables).

use std::fmt::Write as _;

use crate::measure::byfile::{FileScan, FileSpeed, human_age};
use crate::measure::cold_estimate::ColdEstimate;
use crate::report::Report;
use crate::support::output::cut;
use crate::support::units::{human_bytes, human_rate};

/// At most this many files are listed in the text.
const LISTED: usize = 20;

/// The bands first, so that a slowdown with age shows at a glance, then the files.
pub(crate) fn file_scan_text(sc: &FileScan) -> String {
    let (bytes, block, small) =
        (human_bytes(sc.bytes_total), human_bytes(sc.block_size_bytes), human_bytes(sc.small_file_bytes));
    let mut s = format!(
        "  scan by file: {} file(s), {bytes} under {}, read once each ({block} blocks, QD{}); files under {small} timed together per age band\n",
        sc.files.len(),
        sc.target,
        sc.queue_depth
    );
    let _ = writeln!(s, "    {:<12} {:>7} {:>11} {:>18} {:>6}", "age", "files", "bytes", "median throughput", "slow");
    for b in &sc.bands {
        let (med, bytes) = (b.median_bytes_per_second.map_or("-".into(), human_rate), human_bytes(b.bytes));
        let _ = writeln!(s, "    {:<12} {:>7} {bytes:>11} {med:>18} {:>6}", b.band, b.files, b.slow_files);
    }
    let reference = human_rate(sc.reference_bytes_per_second);
    let (bar, slow) = (human_rate(sc.threshold * sc.reference_bytes_per_second), human_bytes(sc.slow_bytes));
    let (threshold, share) = (sc.threshold * 100.0, sc.slow_bytes as f64 * 100.0 / sc.bytes_total.max(1) as f64);
    let _ = writeln!(
        s,
        "  reference: {reference} ({}); slow below {threshold:.0} % of it, {bar}: {} file(s), {slow} ({share:.0} % of the bytes)",
        sc.reference, sc.slow_files
    );
    if let (Some(g), Some(words)) = (sc.small_files_reference_bytes_per_second, &sc.small_files_reference) {
        let _ = writeln!(s, "  small files, timed per band, are compared with {words}: {}", human_rate(g));
    }
    if let Some(why) = &sc.unreliable_because {
        let _ = writeln!(s, "  UNRELIABLE: {why}");
    } else if let Some(c) = &sc.cache {
        let _ = writeln!(s, "    cache check: {}", c.finding);
    }
    s + &file_list(sc)
}

/// The slow files in the scan's order, or, when none is slow, the slowest ones.
fn file_list(sc: &FileScan) -> String {
    let slow: Vec<&FileSpeed> = sc.files.iter().filter(|f| f.slow).collect();
    let (title, listed): (&str, Vec<&FileSpeed>) = if slow.is_empty() {
        let mut all: Vec<&FileSpeed> = sc.files.iter().collect();
        all.sort_by(|a, b| a.bytes_per_second.total_cmp(&b.bytes_per_second));
        ("none slow; the slowest", all)
    } else {
        ("slow files", slow)
    };
    let mut s = format!("  {title} (by {}):\n", sc.sorted_by);
    let _ = writeln!(s, "    {:>12} {:>10} {:>8} {:>12}  path", "age", "size", "extents", "throughput");
    for f in listed.iter().take(LISTED) {
        let (age, size, rate) = (human_age(f.age_seconds), human_bytes(f.size_bytes), human_rate(f.bytes_per_second));
        let alone = if f.timed_alone { "" } else { " (small: its band's group)" };
        let _ = writeln!(s, "    {age:>12} {size:>10} {:>8} {rate:>12}  {}{alone}", f.extents, f.path);
    }
    if listed.len() > LISTED {
        let _ = writeln!(s, "    ... and {} more (--json lists every file)", listed.len() - LISTED);
    }
    s
}

/// The Markdown and HTML tables' rows of a per-file scan, estimate and selection.
pub(crate) fn rows(r: &Report) -> Vec<(&'static str, String)> {
    let rows = [
        r.scan_files.as_ref().map(|sc| ("scan by file", file_scan_row(sc))),
        r.estimate_files.as_ref().map(|e| ("estimate by file age", e.advice.clone())),
        r.file_selection.as_ref().map(|sel| ("selection", format!("{}; {}", sel.rule, sel.ages_after_rewrite))),
    ];
    rows.into_iter().flatten().collect()
}

/// One line for a table.
fn file_scan_row(sc: &FileScan) -> String {
    let bands: Vec<String> = sc
        .bands
        .iter()
        .filter(|b| b.files > 0)
        .map(|b| format!("{}: {}", b.band, b.median_bytes_per_second.map_or("-".into(), human_rate)))
        .collect();
    let (bands, reference, slow) =
        (bands.join(", "), human_rate(sc.reference_bytes_per_second), human_bytes(sc.slow_bytes));
    let unreliable = sc.unreliable_because.as_ref().map(|w| format!("; UNRELIABLE: {w}")).unwrap_or_default();
    format!(
        "{} files; {bands}; reference {reference} ({}); {} slow ({slow}){unreliable}",
        sc.files.len(),
        sc.reference,
        sc.slow_files
    )
}

/// `reseq estimate DIR`: the prediction in words, then the bands that have files (each
/// band, the sampling's rule, what the reference is and the cache check with `-v`).
pub(crate) fn cold_estimate_text(e: &ColdEstimate, verbose: bool) -> String {
    let advice = if verbose { e.advice.clone() } else { cut(&e.advice) };
    let (bytes, sampled) = (human_bytes(e.bytes), human_bytes(e.sample_bytes));
    let mut s = format!(
        "  {advice}\n  estimate by file age: {} file(s), {bytes} under {}; {sampled} sampled\n",
        e.files, e.target
    );
    if verbose {
        s += "    each sample read three times (the fastest counts; the reference at its slowest)\n";
    }
    let _ = writeln!(
        s,
        "    {:<12} {:>7} {:>11} {:>8} {:>18} {:>9} {:>11}",
        "age", "files", "bytes", "samples", "median throughput", "now", "refreshed"
    );
    for b in e.bands.iter().filter(|b| verbose || b.files > 0) {
        let (med, bytes) = (b.median_bytes_per_second.map_or("-".into(), human_rate), human_bytes(b.bytes));
        let slow = if b.slow { "  SLOW" } else { "" };
        let _ = writeln!(
            s,
            "    {:<12} {:>7} {bytes:>11} {:>8} {med:>18} {:>8.1}s {:>10.1}s{slow}",
            b.band, b.files, b.samples, b.seconds_now, b.seconds_refreshed
        );
    }
    match verbose {
        true => {
            let _ = writeln!(s, "  reference: {} ({})", human_rate(e.reference_bytes_per_second), e.reference);
            if let Some(c) = &e.cache {
                let _ = writeln!(s, "    cache check: {}", c.finding);
            }
        }
        false => {
            let _ = writeln!(s, "  reference: {}", human_rate(e.reference_bytes_per_second));
        }
    }
    s
}
