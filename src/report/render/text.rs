//! The human summary at the end of a run.

use std::fmt::Write as _;

use crate::engine::EngineStats;
use crate::measure::bench::BenchResult;
use crate::measure::estimate::Estimate;
use crate::measure::passes::WriteCost;
use crate::measure::scan::ScanResult;
use crate::report::{FileReport, Prediction, Report, Verification};
use crate::support::output::{WIDTH, cut, fit};
use crate::support::units::{human_bytes, human_rate, human_seconds};

/// The report as text; a dry run that succeeded prints its plan. Without `-v` every line
/// fits [`WIDTH`] columns (a longer one is wrapped under itself); with `-v` the whole text,
/// wrapped at the terminal's width when there is one (a pipe gets it unwrapped, for grep).
pub(crate) fn text(r: &Report) -> String {
    text_at(r, terminal_width())
}

/// The text for a terminal `width` columns wide (None: no terminal).
pub(crate) fn text_at(r: &Report, width: Option<usize>) -> String {
    let t = full_text(r);
    match (r.every_file, width) {
        (false, _) => fit(&t, WIDTH),
        (true, Some(w)) => fit(&t, w),
        (true, None) => t,
    }
}

/// stdout's width, when it is a terminal.
fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    let out = std::io::stdout();
    if !out.is_terminal() {
        return None;
    }
    terminal_size::terminal_size_of(&out).map(|(w, _)| (w.0 as usize).max(40))
}

/// The report's text, unwrapped.
fn full_text(r: &Report) -> String {
    if let (true, Some(t), 0) = (r.dry_run, &r.plan_text, r.outcome.exit_code) {
        if !r.every_file {
            return dry_run_summary(r, t);
        }
        let detail = r.plan_detail.as_deref();
        return t.clone() + detail.unwrap_or_default();
    }
    if let Some(files) = &r.files {
        return files_text(r, files);
    }
    let mut s = plan(r);
    s += &depth(r);
    s += &r.prediction.as_ref().map(prediction).unwrap_or_default();
    s += &results(r);
    if let Some(v) = &r.in_flight_reverify {
        s += &format!("  chunk in flight at the previous stop: {v}\n");
    }
    s += &measurements(r);
    if r.plan.is_some() {
        s += &format!("  verification: {}\n", r.verification);
    }
    s + &ending(r)
}

/// The pipeline's depth and why (`rewrite`), and the chunk-size trial's outcome: with
/// `-v` (the JSON has them too).
fn depth(r: &Report) -> String {
    if !r.every_file {
        return String::new();
    }
    let mut s = r.pipeline_depth.as_ref().map_or_else(String::new, |d| format!("  depth: {} ({})\n", d.depth, d.why));
    if let Some(t) = r.results.as_ref().and_then(|x| x.chunk_trial.as_ref()) {
        s += &format!("  chunk trial: {}\n", t.why);
    }
    s
}

/// The lines of a dry run's plan that `-v` alone shows: how it is done and checked, and
/// what the prediction rests on. The JSON has the figures.
const PLAN_DETAIL: [&str; 12] = [
    "memory",
    "depth",
    "chunk trial",
    "guardian",
    "guardian priority",
    "other writers",
    "aliases",
    "not visible from this host",
    "medium",
    "journal",
    "freeze order",
    "note",
];

/// A dry run without `-v`: the time frozen and in all first, then what is rewritten and
/// frozen, the warnings; the reasons, checks and model behind `-v`.
fn dry_run_summary(r: &Report, plan: &str) -> String {
    let mut s = r.prediction.as_ref().map(headline).unwrap_or_default();
    for line in plan.lines() {
        let key = line.trim_start().split(':').next().unwrap_or_default();
        if PLAN_DETAIL.contains(&key) || key.starts_with("prediction rests on") {
            continue;
        }
        let short = match key {
            "prediction" => r.prediction.as_ref().map_or_else(|| line.to_string(), short_prediction),
            "nothing was written or frozen (dry run)" => format!("{line}; -v shows the whole plan"),
            // The first line, the windows and the space: their reasons are behind -v.
            _ if line.len() > WIDTH => cut(line),
            _ => line.to_string(),
        };
        s += &short;
        s += "\n";
    }
    s
}

/// The dry run's answer: how long frozen, in how many windows, how long in all.
fn headline(p: &Prediction) -> String {
    let (frozen, windows) = (human_seconds(p.frozen_seconds.expected), p.windows.expected);
    let (longest, all) = (human_seconds(p.longest_freeze_seconds), human_seconds(p.duration_seconds.expected));
    format!("dry run: about {frozen} frozen in {windows} window(s), the longest {longest}; about {all} in all\n")
}

/// The prediction's figures without their ranges (`-v` and the JSON have those).
fn short_prediction(p: &Prediction) -> String {
    let verb = if p.bytes_verified > 0 { "written and read back" } else { "written" };
    let (written, read) = (human_bytes(p.bytes_written), human_bytes(p.bytes_read));
    format!("  prediction: {written} {verb} in {} chunk(s), {read} read", p.chunks)
}

/// A dry run's prediction, as its plan ends (and a saved dry run's report shows it).
pub(crate) fn prediction(p: &Prediction) -> String {
    let verb = if p.bytes_verified > 0 { "written and read back" } else { "written" };
    let again = match p.bytes_read - p.bytes_written {
        0 => String::new(),
        n => format!(" ({} again, read ahead by a window that stopped short of it)", human_bytes(n)),
    };
    let (w, f, d) = (&p.windows, &p.frozen_seconds, &p.duration_seconds);
    let (read, written, window_range) =
        (human_bytes(p.bytes_read), human_bytes(p.bytes_written), range(w.low.to_string(), w.high.to_string()));
    let (frozen, frozen_range) = (human_seconds(f.expected), range(human_seconds(f.low), human_seconds(f.high)));
    let (whole, whole_range) = (human_seconds(d.expected), range(human_seconds(d.low), human_seconds(d.high)));
    let longest = human_seconds(p.longest_freeze_seconds);
    let mut s = format!(
        "  prediction: {read} read{again}, {written} {verb} in {} chunk(s); about {} window(s){window_range}, {frozen} frozen in all{frozen_range}, the longest {longest}; the whole run about {whole}{whole_range}\n",
        p.chunks, w.expected,
    );
    for b in &p.basis {
        s += &format!("  prediction rests on {b}\n");
    }
    s
}

/// ` (low-high)`, or nothing when both read the same.
fn range(low: String, high: String) -> String {
    if low == high { String::new() } else { format!(" ({low}-{high})") }
}

/// The warnings, then the outcome.
fn ending(r: &Report) -> String {
    let warnings: String = r.warnings.iter().map(|w| format!("  warning: {w}\n")).collect();
    warnings + &format!("  outcome: {} (exit {})\n", r.outcome_text(), r.outcome.exit_code)
}

/// The device, the chunks and what is frozen.
fn plan(r: &Report) -> String {
    let mut s = String::new();
    let (Some(d), Some(p)) = (r.device.as_ref(), r.plan.as_ref()) else { return s };
    s += &format!("reseq {}: {} ({}, {})\n", r.command, d.path, d.identity.dev, human_bytes(d.identity.size_bytes));
    let (chunk, memory) = (human_bytes(p.chunk_size_bytes), human_bytes(p.memory_bytes));
    let verify = if p.verify { "on" } else { "off" };
    s += &format!(
        "  chunks: {} x {chunk}, verify {verify}, read-ahead {}, memory {memory}\n",
        p.chunks_total, p.read_ahead_chunks
    );
    if p.filesystems_frozen.is_empty() {
        s += "  freeze: none (no filesystem mounted; device held exclusively)\n";
    } else {
        for f in &p.filesystems_frozen {
            s += &format!("  freeze: {} ({}, {})\n", f.mount_point.display(), f.fs_type, f.dev);
        }
    }
    s
}

/// What the engine did: bytes, rate, windows.
fn results(r: &Report) -> String {
    let mut s = String::new();
    let Some(x) = &r.results else { return s };
    s += &rewrote(r, x);
    if x.chunks_already_done > 0 {
        s += &format!("  resumed: {} chunks were already done\n", x.chunks_already_done);
    }
    if x.windows > 0 && r.plan.as_ref().is_some_and(|p| !p.filesystems_frozen.is_empty()) {
        s += &windows(x);
    }
    s
}

/// Bytes written, rate, read and verified.
fn rewrote(r: &Report, x: &EngineStats) -> String {
    // The rewrite's own time: a benchmark before and after is not part of its rate.
    let secs = if x.rewrite_seconds > 0.0 { x.rewrite_seconds } else { r.duration_seconds };
    let rate = x.bytes_written as f64 / secs.max(1e-9);
    let (written, rate) = (human_bytes(x.bytes_written), human_rate(rate));
    let (read, verified) = (human_bytes(x.bytes_read), human_bytes(x.bytes_verified));
    format!("  rewrote {written} in {secs:.1} s ({rate}), read {read}, verified {verified}\n")
}

/// The stall applications saw.
fn windows(x: &EngineStats) -> String {
    format!(
        "  windows: {}, longest freeze {:.3} s, frozen {:.1} s in all, overruns {}\n",
        x.windows, x.longest_freeze_seconds, x.total_frozen_seconds, x.windows_overrun
    )
}

/// Files, bench, scan, estimate, trim, verdict and write cost.
fn measurements(r: &Report) -> String {
    let mut s = String::new();
    if let Some(sel) = &r.selection {
        let all = sel.bytes_chosen + sel.bytes_left_alone;
        let (chosen, all_bytes) = (human_bytes(sel.bytes_chosen), human_bytes(all));
        let (share, threshold) = (sel.bytes_chosen as f64 * 100.0 / all.max(1) as f64, sel.threshold * 100.0);
        s += &format!(
            "  selection ({}): {} slow region(s), {chosen} of {all_bytes} ({share:.0} % of a full rewrite); {} region(s) left alone, reading at least {threshold:.0} % of the fastest\n",
            sel.source,
            sel.chosen.len(),
            sel.regions_left_alone
        );
    }
    if let Some(sel) = &r.file_selection {
        s += &format!("  {}\n  note: {}\n", sel.rule, sel.ages_after_rewrite);
        if let Some(why) = sel.scan.as_ref().and_then(|sc| sc.unreliable_because.as_ref()) {
            s += &format!("  UNRELIABLE scan: {why}\n");
        }
    }
    let verdict = r.verdict.as_ref().map(|v| {
        // The rule is the same every run: -v (and the JSON) say it.
        let rule = (!v.criteria.is_empty() && r.every_file).then(|| format!("  verdict rule: {}\n", v.criteria));
        let why = if r.every_file { v.rule.clone() } else { verdict_reason(&v.rule) };
        // Said once: the cache check above gives the reason in full (a mail stays short).
        let above = [&r.bench_before, &r.bench_after].into_iter().flatten().filter_map(|b| b.cache.as_ref());
        let said = above.filter(|c| c.cache_suspected).any(|c| cut(&c.finding).contains(why.as_str()));
        let why =
            if said && !r.every_file { "a cache below the device, as the cache check above says".into() } else { why };
        // The speed-up once: a reason may begin with it ("x2.81 right after the rewrite, but").
        let speedup = format!("x{:.2}", v.speedup);
        let why = if why.starts_with(&speedup) { why } else { format!("{speedup}; {why}") };
        format!("  verdict: {} ({why})\n", v.verdict) + &rule.unwrap_or_default()
    });
    let sections = [
        // A benchmark alone says its cache check: the reader of one asks what it measured.
        r.bench.as_ref().map(|b| bench_line("read", b, r.every_file, true)),
        r.scan.as_ref().map(|sc| scan_text("scan", sc, r.every_file)),
        r.scan_files.as_ref().map(super::cold::file_scan_text),
        r.estimate.as_ref().map(|e| estimate_text(e, r.every_file)),
        r.estimate_files.as_ref().map(|e| super::cold::cold_estimate_text(e, r.every_file)),
        r.trim_impact.as_ref().map(|t| t.text()),
        // Before and after say a cache check only when it found a cache (or with -v): the
        // verdict below already weighs it.
        r.bench_before.as_ref().map(|b| bench_line("before", b, r.every_file, false)),
        r.bench_after.as_ref().map(|b| bench_line("after", b, r.every_file, false)),
        verdict,
        r.space.as_ref().and_then(|sp| sp.trim.as_ref()).map(|t| if r.every_file { t.text() } else { t.short_text() }),
        r.write_cost.as_ref().map(write_cost_text),
    ];
    s + &sections.into_iter().flatten().collect::<String>()
}

/// At most this many files with a problem are listed without `-v`.
const LISTED: usize = 20;

/// File mode: the totals first, then the files with a problem (or, with `-v`, every file).
/// A nightly job over thousands of files prints a screen, not a line per file.
fn files_text(r: &Report, files: &[FileReport]) -> String {
    let size: u64 = files.iter().map(|f| f.size_bytes).sum();
    let (size, targets) = (human_bytes(size), r.targets.join(" "));
    let mut s = format!("reseq rewrite: {} file(s), {size} in all, under {targets}\n", files.len());
    s += &depth(r);
    if let Some(x) = &r.results {
        s += &rewrote(r, x);
        s += &windows(x);
    }
    s += &format!("  files: {}; verification: {}\n", file_counts(files), r.verification);
    s += &measurements(r);
    let listed: Vec<&FileReport> = files.iter().filter(|f| r.every_file || has_problem(f)).collect();
    if !listed.is_empty() {
        s += if r.every_file { "  every file:\n" } else { "  files with a problem:\n" };
    }
    let shown = if r.every_file { listed.len() } else { LISTED };
    for f in listed.iter().take(shown) {
        s += &format!("  {}\n", file_line(f));
    }
    if listed.len() > shown {
        s += &format!("    ... and {} more (-v lists every file)\n", listed.len() - shown);
    }
    s + &ending(r)
}

/// Skipped, or left unfinished by a run that stopped.
fn has_problem(f: &FileReport) -> bool {
    f.skipped_reason.is_some()
        || (f.verification == Verification::Incomplete && f.left_alone.is_none() && !f.done_earlier)
}

/// How many files were rewritten, left alone and why, skipped, unfinished.
fn file_counts(files: &[FileReport]) -> String {
    let count = |p: &dyn Fn(&FileReport) -> bool| files.iter().filter(|f| p(f)).count();
    let done = |f: &FileReport| !has_problem(f) && f.left_alone.is_none() && !f.done_earlier;
    let parts = [
        (count(&|f| done(f) && f.bytes_rewritten > 0), "rewritten"),
        (count(&|f| done(f) && f.bytes_rewritten == 0), "with no written data to rewrite (holes, unwritten extents)"),
        (count(&|f| f.done_earlier), "done by the interrupted run"),
        (count(&|f| f.left_alone.is_some() && f.size_bytes == 0), "empty (nothing to rewrite)"),
        (count(&|f| f.left_alone.is_some() && f.size_bytes > 0), "left alone (not chosen)"),
        (count(&|f| f.skipped_reason.is_some()), "skipped"),
        (count(&|f| has_problem(f) && f.skipped_reason.is_none() && !not_reached(f)), "unfinished"),
        (count(&|f| not_reached(f)), "not reached (the run stopped before them)"),
    ];
    let said: Vec<String> = parts.iter().filter(|(n, _)| *n > 0).map(|(n, what)| format!("{n} {what}")).collect();
    if said.is_empty() { "none".into() } else { said.join(", ") }
}

/// A file a stopped run never came to: nothing of it was read or frozen.
fn not_reached(f: &FileReport) -> bool {
    has_problem(f) && f.skipped_reason.is_none() && f.windows == 0 && f.bytes_rewritten == 0
}

fn file_line(f: &FileReport) -> String {
    if not_reached(f) {
        return format!("  {}: {}, not reached (the run stopped before it)", f.path, human_bytes(f.size_bytes));
    }
    let (done, size, extents) = (human_bytes(f.bytes_rewritten), human_bytes(f.size_bytes), f.extents.unwrap_or(0));
    let line = format!(
        "  {}: {done} of {size}, {extents} extent(s), {} window(s), longest freeze {:.3} s, verification {}",
        f.path, f.windows, f.longest_freeze_seconds, f.verification
    );
    let bytes = |n: u64, what: &str| (n > 0).then(|| format!(", {} {what}", human_bytes(n)));
    let notes = [
        bytes(f.bytes_skipped_unwritten, "unwritten skipped"),
        bytes(f.bytes_skipped_shared, "shared (done with another file)"),
        f.skipped_reason.as_ref().map(|why| format!(", SKIPPED: {why}")),
        f.left_alone.as_ref().map(|why| format!(", left alone: {why}")),
        f.chosen_because.as_ref().map(|why| format!(", chosen: {why}")),
        f.done_earlier.then(|| ", done by the interrupted run this one resumed".into()),
    ];
    line + &notes.into_iter().flatten().collect::<String>()
}

/// Without -v, why the verdict is what it is, in a clause: where a change was seen but
/// does not count, only the reason it does not (its figure is the verdict's own); the
/// asides after a colon (which disk, which cache) are -v's.
fn verdict_reason(rule: &str) -> String {
    let short = cut(rule);
    let why = short.split_once(", but the medians differ by ").and_then(|(_, t)| t.split_once(", "));
    let why = why.map_or(short.as_str(), |(_, why)| why);
    why.split(": ").next().unwrap_or(why).to_string()
}

/// The figures on one line, with what was read when it fits; each pass with `-v`.
fn bench_line(label: &str, b: &BenchResult, verbose: bool, cache: bool) -> String {
    let passes: Vec<String> = b
        .passes
        .iter()
        .map(|p| match (p.latency_p50_seconds, p.latency_p99_seconds) {
            (Some(a), Some(c)) => {
                format!("{} (p50 {:.2} ms, p99 {:.2} ms)", human_rate(p.bytes_per_second), a * 1e3, c * 1e3)
            }
            _ => human_rate(p.bytes_per_second),
        })
        .collect();
    let each = verbose.then(|| format!("    passes: {}\n", passes.join(", ")));
    let (median, range) =
        (human_rate(b.median_bytes_per_second), rate_range(b.min_bytes_per_second, b.max_bytes_per_second));
    let virtual_time = if b.virtual_time { " (virtual time)" } else { "" };
    let block = human_bytes(b.params.block_size_bytes);
    let head = format!(
        "  {label}: median {median} ({range}{virtual_time}, {} passes of {block}, QD{})",
        b.passes.len(),
        b.params.queue_depth,
    );
    // What was read on the same line when it fits, else under it.
    let what = format!("{} of {}", human_bytes(b.params.length_bytes), b.target);
    let sep = if head.len() + 2 + what.len() <= WIDTH { ", " } else { "\n    " };
    format!("{head}{sep}{what}\n") + &each.unwrap_or_default() + &bench_notes(b, verbose, cache)
}

/// "354.6 to 471.5 MiB/s": the unit once where both ends share it.
fn rate_range(min: f64, max: f64) -> String {
    let (lo, hi) = (human_rate(min), human_rate(max));
    match (lo.split_once(' '), hi.split_once(' ')) {
        (Some((n, unit)), Some((_, u))) if unit == u => format!("{n} to {hi}"),
        _ => format!("{lo} to {hi}"),
    }
}

/// The cache check (`always`, or with -v, or when it found a cache) and the emulated
/// drive's punctuality under a benchmark's line.
fn bench_notes(b: &BenchResult, verbose: bool, always: bool) -> String {
    let cache = b.cache.as_ref().filter(|c| always || verbose || c.cache_suspected).map(|c| {
        let finding = if verbose { c.finding.clone() } else { cut(&c.finding) };
        format!("    cache check: {}{finding}\n", if c.cache_suspected { "UNRELIABLE, " } else { "" })
    });
    let emulated = b.emulated.as_ref().map(|e| {
        let late = e.late_share * 100.0;
        format!(
            "    emulated drive (reseq sim serve, time x{}): {} of {} replies late, by {late:.1} % of the passes' time\n",
            e.time_scale, e.late_replies, e.replies
        )
    });
    cache.unwrap_or_default() + &emulated.unwrap_or_default()
}

/// The count of slow regions first; the slow ones' rows without `-v` (at most
/// [`LISTED`]), every region's with it.
fn scan_text(label: &str, sc: &ScanResult, verbose: bool) -> String {
    let mut s = format!(
        "  {label}: {} of {} regions slow (below {:.0} % of the fastest quarter's {})\n    of {}\n",
        sc.slow_regions,
        sc.regions.len(),
        sc.threshold * 100.0,
        human_rate(sc.reference_bytes_per_second),
        sc.target,
    );
    let shown: Vec<_> = sc.regions.iter().filter(|r| verbose || r.slow).collect();
    let max = sc.regions.iter().map(|r| r.bytes_per_second).fold(0.0, f64::max).max(1.0);
    // Where each region lies: its offset on the device (the first of its in-use ranges
    // when only those are read), not only its place in the bytes laid end to end.
    if !shown.is_empty() {
        let _ = writeln!(s, "    {:>4} {:>14} {:>10} {:>14}", "#", "device offset", "length", "throughput");
    }
    let listed = if verbose { shown.len() } else { LISTED };
    for r in shown.iter().take(listed) {
        let bar = "#".repeat(((r.bytes_per_second / max) * 40.0).round() as usize);
        let at = r.device_ranges.first().map_or(r.offset_bytes, |d| d[0]);
        let (len, rate) = (human_bytes(r.length_bytes), human_bytes(r.bytes_per_second as u64));
        let slow = if r.slow { " SLOW" } else { "" };
        let row = format!("    {:>4} {at:>14} {len:>10} {rate:>12}/s {bar:<40}{slow}", r.index);
        let _ = writeln!(s, "{}", row.trim_end());
    }
    if shown.len() > listed {
        let _ = writeln!(s, "    ... and {} more slow regions", shown.len() - listed);
    }
    if !verbose {
        s += "    (-v shows every region)\n";
    }
    s
}

/// The advice first, then the figures; what the reference is, and the caveat about short
/// samples, with `-v`.
fn estimate_text(e: &Estimate, verbose: bool) -> String {
    // The verdict and its figures; the reasons behind -v.
    let advice = if verbose { e.advice.clone() } else { cut(&e.advice) };
    let (median, reference) = (human_rate(e.median_bytes_per_second), human_rate(e.reference_bytes_per_second));
    let virtual_time = if e.virtual_time { " (virtual time)" } else { "" };
    let sampled = human_bytes(e.sample_bytes);
    let mut s = format!(
        "  {advice}\n  estimate: median {median}, reference {reference}{virtual_time} ({sampled} in {} places, each read {} times)\n",
        e.regions.len(),
        e.sureness.readings_per_place,
    );
    if verbose {
        s += &format!("  sampled: {}\n  reference: {}\n", e.target, e.reference);
        s += "  (short samples can read faster than a whole pass of `reseq bench`: compare estimates with estimates)\n";
    }
    s
}

fn write_cost_text(w: &WriteCost) -> String {
    format!(
        "  write cost: {} written by the host{}\n",
        w.host_bytes_written.map(human_bytes).unwrap_or_else(|| "unknown".into()),
        match (w.nvme_data_units_written_before, w.nvme_data_units_written_after) {
            (Some(a), Some(b)) => format!(", NVMe data units written +{} ({} bytes)", b - a, (b - a) * 512_000),
            _ => String::new(),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_counted_by_what_happened_to_them() {
        let file = |bytes: u64, windows: u64, verification: Verification| FileReport {
            path: "f".into(),
            size_bytes: 1 << 20,
            bytes_rewritten: bytes,
            windows,
            verification,
            ..FileReport::default()
        };
        let files = [
            file(1 << 20, 1, Verification::Passed),
            file(0, 1, Verification::Passed),
            file(4096, 1, Verification::Incomplete),
            file(0, 0, Verification::Incomplete),
        ];
        assert_eq!(
            file_counts(&files),
            "1 rewritten, 1 with no written data to rewrite (holes, unwritten extents), 1 unfinished, 1 not reached (the run stopped before them)"
        );
        assert!(file_line(&files[3]).ends_with("not reached (the run stopped before it)"), "{}", file_line(&files[3]));
    }
    /// A verdict a noisy re-check made unreliable fits one line of a mail, its figure
    /// said once (a nightly job's mail went to 16 lines when it wrapped).
    #[test]
    fn an_unreliable_recheck_is_one_line_of_a_mail() {
        use crate::measure::bench::HostPressure;
        use crate::measure::bench::tests::bench_of;
        let quiet = Some(HostPressure { cpu_some: 0.0, io_some: 0.0 });
        let mut before = bench_of(&[100.0, 101.0, 102.0]);
        let mut after = bench_of(&[280.0, 281.0, 282.0]);
        (before.host_pressure, after.host_pressure) = (quiet.clone(), quiet);
        let v = crate::measure::verdict::verdict_of(&before, &after);
        // The re-check under a load the benchmarks did not see: it cannot tell.
        let mut again = bench_of(&[280.0, 281.0, 282.0]);
        again.host_pressure = Some(HostPressure { cpu_some: 0.6, io_some: 0.4 });
        let v = crate::measure::verdict::lasted(v, &before, &again, std::time::Duration::from_secs(30));
        assert_eq!(v.verdict, crate::measure::verdict::Finding::Unreliable, "{v:?}");
        let figure = format!("x{:.2}", v.speedup);
        let mut r = Report::new("rewrite", false);
        r.verdict = Some(v);
        // Unwrapped: text_at would fold a long line under 100 columns.
        let text = full_text(&r);
        let line = text.lines().find(|l| l.contains("verdict:")).unwrap();
        assert!(line.chars().count() <= WIDTH, "{} columns: {line}", line.chars().count());
        assert_eq!(line.matches(&figure).count(), 1, "{line}");
        assert!(line.contains("could not tell"), "{line}");
    }
}
