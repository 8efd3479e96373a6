//! A self-contained HTML page for a change record: outcome, verdict, a table of the run,
//! and SVG charts of the measurements.

use std::fmt::Write as _;

use super::svg::{Series, age_chart, pass_chart, region_chart};
use super::{esc, plain};
use crate::measure::bench::BenchResult;
use crate::measure::scan::ScanResult;
use crate::measure::verdict::Finding;
use crate::report::Report;
use crate::support::units::human_bytes;

/// A table row: name and value (escaped when written).
type Row = (&'static str, String);

pub(crate) fn html(r: &Report) -> String {
    let mut body = format!("<h1>{}</h1>", esc(&title(r)));
    body += &summary(r);
    body += "<section class=\"details\"><h2>Details for engineers</h2>";
    body += &verdict_detail(r);
    body += "<table>";
    for rows in [run_rows(r), plan_rows(r), measurement_rows(r), result_rows(r)] {
        for (k, v) in rows {
            let _ = write!(body, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
        }
    }
    body += "</table>";
    body += &charts(r);
    for w in &r.warnings {
        let _ = write!(body, "<p class=\"warn\">warning: {}</p>", esc(w));
    }
    if let Some(m) = &r.outcome.message {
        let _ = write!(body, "<pre>{}</pre>", esc(m));
    }
    body += "</section>";
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>\
body{{font-family:system-ui,sans-serif;margin:2em;color:#222;background:#fff}}table{{border-collapse:collapse;margin:1em 0}}\
th,td{{border:1px solid #ddd;padding:4px 10px;text-align:left;font-size:14px}}th{{background:#f3f3f5}}\
.ok{{color:#2a7}}.bad{{color:#c22}}.verdict{{font-size:18px}}.warn{{color:#a60}}svg{{display:block;margin:1em 0}}\
.summary li{{margin:.3em 0;font-size:16px}}.details{{margin-top:3em;border-top:2px solid #ddd}}</style></head>\
<body>{body}</body></html>\n",
        esc(&title(r))
    )
}

/// "reseq rewrite /dev/nvme0n1p3 on db1, 2026-11-25": what, where, when.
fn title(r: &Report) -> String {
    let what = r.device.as_ref().map(|d| d.path.clone()).unwrap_or_else(|| r.targets.join(" "));
    let day = r.started_at.split('T').next().unwrap_or_default();
    format!("reseq {} {what} on {}, {day}", r.command, r.host)
}

/// Above the fold, for a reader who is not an engineer: the headline, then what was
/// done, whether it finished, the effect, whether anything was lost, how long the
/// filesystems were paused, and how far the measurement can be trusted, in plain words.
fn summary(r: &Report) -> String {
    let mut s = String::from("<section class=\"summary\">");
    if let Some(h) = plain::headline(r) {
        let _ = write!(s, "<p class=\"verdict\"><b>{}</b></p>", esc(&h));
    }
    s += "<ul>";
    for (k, v) in plain::lines(r) {
        let _ = write!(s, "<li><b>{}:</b> {}</li>", esc(k), esc(&v));
    }
    s += "</ul>";
    let class = if r.outcome.exit_code == 0 { "ok" } else { "bad" };
    let _ = write!(s, "<p class=\"outcome {class}\">{}</p></section>", esc(&plain::outcome(r)));
    s
}

/// The verdict as measured, with the rule that decided it.
fn verdict_detail(r: &Report) -> String {
    let Some(v) = &r.verdict else { return String::new() };
    let (verdict, rule) = (esc(&v.verdict.to_string()), esc(&v.rule));
    let mut s = format!(
        "<p class=\"verdict\">Verdict: <b>{verdict}</b> — median read throughput ×{:.2} ({rule})</p>",
        v.speedup
    );
    if !v.criteria.is_empty() {
        let _ = write!(s, "<p>Rule: {}</p>", esc(&v.criteria));
    }
    s
}

/// Host, time, command line, device and targets.
fn run_rows(r: &Report) -> Vec<Row> {
    let mut rows = vec![
        ("host", r.host.clone()),
        ("started", r.started_at.clone()),
        ("finished", r.finished_at.clone()),
        ("duration", format!("{:.1} s", r.duration_seconds)),
        ("command line", r.argv.join(" ")),
        ("reseq version", r.tool_version.clone()),
        ("outcome", format!("{} (exit {})", r.outcome_text(), r.outcome.exit_code)),
    ];
    if let Some(d) = &r.device {
        let (size, serial) = (human_bytes(d.identity.size_bytes), d.identity.serial.as_deref().unwrap_or("n/a"));
        rows.push(("device", format!("{} ({}, {size}, serial {serial})", d.path, d.identity.dev)));
    }
    rows
}

/// Chunks, windows, what is frozen, free space and trims.
fn plan_rows(r: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(p) = &r.plan {
        let verify = if p.verify { "on" } else { "off" };
        rows.push((
            "chunks",
            format!("{} x {}, verification {verify}", p.chunks_total, human_bytes(p.chunk_size_bytes)),
        ));
        rows.push((
            "window bound",
            match p.max_freeze_seconds {
                Some(m) => format!("at most {m:.3} s frozen each, pause {:.3} s between", p.pause_seconds),
                None => "one, unfrozen (nothing mounted; the device held exclusively)".into(),
            },
        ));
        let fs: Vec<String> =
            p.filesystems_frozen.iter().map(|f| format!("{} ({})", f.mount_point.display(), f.fs_type)).collect();
        rows.push(("frozen", if fs.is_empty() { "nothing mounted".into() } else { fs.join(", ") }));
    }
    if let Some(sp) = &r.space {
        let trimmed = sp.bytes_trimmed.map(|b| format!("discarded {}", human_bytes(b)));
        let space = format!("{}: {} left out as free; TRIM ", sp.mode, human_bytes(sp.bytes_skipped_as_free));
        rows.push(("space", space + &trimmed.unwrap_or_else(|| "not run".into())));
    }
    rows.extend(super::trim_rows(r));
    rows
}

/// What each benchmark read.
fn measurement_rows(r: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(super::cold::rows(r));
    for (k, b) in [("measured", &r.bench), ("measured before", &r.bench_before), ("measured after", &r.bench_after)] {
        if let Some(b) = b {
            let cache = b.cache.as_ref().map(|c| format!("; cache check: {}", c.finding)).unwrap_or_default();
            rows.push((k, format!("{} of {}{cache}", human_bytes(b.params.length_bytes), b.target)));
        }
    }
    rows
}

/// What the engine did, and what it cost the drive.
fn result_rows(r: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(x) = &r.results {
        let (written, read, verified) = (x.bytes_written, x.bytes_read, x.bytes_verified);
        let rewritten =
            format!("{} (read {}, verified {})", human_bytes(written), human_bytes(read), human_bytes(verified));
        rows.push(("rewritten", rewritten));
    }
    rows.extend(super::run_summary_rows(r));
    if r.results.is_some() {
        rows.push(("verification", r.verification.to_string()));
    }
    if let Some(w) = &r.write_cost {
        rows.push(("host bytes written", w.host_bytes_written.map(human_bytes).unwrap_or_else(|| "unknown".into())));
    }
    rows
}

/// Throughput by region (before and after, or one scan) and each pass's throughput.
fn charts(r: &Report) -> String {
    let mut s = String::new();
    // Under an unreliable verdict nothing is drawn as slow, and each chart says why.
    let unreliable = r.verdict.as_ref().filter(|v| v.verdict == Finding::Unreliable).map(|v| {
        format!(
            "<p class=\"note\">The verdict calls this comparison unreliable ({}): the differences drawn here are not a measured change, and no region is marked slow.</p>",
            esc(&v.rule)
        )
    });
    let unmarked = |sc: &ScanResult| {
        let mut sc = sc.clone();
        sc.regions.iter_mut().for_each(|r| r.slow = false);
        sc.slow_regions = 0;
        sc
    };
    let kept: Vec<(&str, &str, ScanResult)> = [
        ("before", "#9a9a9a", &r.scan_before),
        ("after", "#1f77b4", &r.scan_after),
        ("throughput", "#1f77b4", &r.scan),
    ]
    .into_iter()
    .filter_map(|(label, color, sc)| sc.as_ref().map(|sc| (label, color, sc)))
    .map(|(label, color, sc)| (label, color, if unreliable.is_some() { unmarked(sc) } else { sc.clone() }))
    .collect();
    let scans: Vec<Series<ScanResult>> = kept.iter().map(|(l, c, sc)| (*l, *c, sc)).collect();
    if !scans.is_empty() {
        s += "<h2>Read throughput by region</h2><p>Each region is read once, in one short read after another: a region can read faster than a whole pass (below), whose figure is the one the verdict compares. Compare regions with each other, before with after.</p>";
        s += unreliable.as_deref().unwrap_or_default();
        s += &region_chart(&scans);
    }
    if let Some(sc) = r.scan_files.as_ref().or(r.file_selection.as_ref().and_then(|f| f.scan.as_ref())) {
        s += "<h2>Read throughput by file age</h2><p>Each file is read once; data left unwritten for months reads slowly on many TLC/QLC drives, and rewriting it restores the speed.</p>";
        s += &age_chart(sc);
    }
    // A close verdict was decided on more after-passes: they are shown with the first.
    let look = r.verdict.as_ref().and_then(|v| v.closer_look.as_ref());
    let after = r.bench_after.as_ref().map(|b| look.map_or_else(|| b.clone(), |c| b.clone().with_passes(&c.passes)));
    let benches: Vec<Series<BenchResult>> =
        [("before", "#9a9a9a", &r.bench_before), ("after", "#1f77b4", &after), ("pass", "#1f77b4", &r.bench)]
            .into_iter()
            .filter_map(|(label, color, b)| b.as_ref().map(|b| (label, color, b)))
            .collect();
    if !benches.is_empty() {
        s += "<h2>Sequential read, each pass</h2>";
        s += unreliable.as_deref().unwrap_or_default();
        s += &pass_chart(&benches);
    }
    s
}
