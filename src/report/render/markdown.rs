//! Markdown, for a ticket: a heading, a table of the run, its warnings.

use std::fmt::Write as _;

use crate::report::Report;
use crate::support::units::{human_bytes, human_rate};

/// A table row: name and value.
type Row = (&'static str, String);

pub(crate) fn markdown(r: &Report) -> String {
    let mut s = format!("### reseq {} — {}\n\n", r.command, r.outcome_text());
    s += "| | |\n|---|---|\n";
    let rows = [run_rows(r), measurement_rows(r), outcome_rows(r)];
    for (k, v) in rows.iter().flatten() {
        let _ = writeln!(s, "| {k} | {} |", v.replace('|', "\\|"));
    }
    s + &r.warnings.iter().map(|w| format!("\n> warning: {w}\n")).collect::<String>()
}

/// Host, time, device, plan and what the engine did.
fn run_rows(r: &Report) -> Vec<Row> {
    let mut rows = vec![
        ("host", r.host.clone()),
        ("started", r.started_at.clone()),
        ("duration", format!("{:.1} s", r.duration_seconds)),
    ];
    if let Some(d) = &r.device {
        rows.push(("device", format!("`{}` ({}, {})", d.path, d.identity.dev, human_bytes(d.identity.size_bytes))));
    }
    if let Some(p) = &r.plan {
        rows.push(("chunks", format!("{} x {}", p.chunks_total, human_bytes(p.chunk_size_bytes))));
        let fs: Vec<String> =
            p.filesystems_frozen.iter().map(|f| format!("`{}` ({})", f.mount_point.display(), f.fs_type)).collect();
        rows.push(("frozen", if fs.is_empty() { "nothing mounted".into() } else { fs.join(", ") }));
    }
    if let Some(x) = &r.results {
        rows.push(("rewritten", human_bytes(x.bytes_written)));
    }
    rows.extend(super::run_summary_rows(r));
    if r.results.is_some() {
        rows.push(("verification", r.verification.to_string()));
    }
    rows
}

/// Benchmarks, verdict, scan, write cost and trims.
fn measurement_rows(r: &Report) -> Vec<Row> {
    let mut rows = Vec::new();
    for (k, b) in [("read", &r.bench), ("read before", &r.bench_before), ("read after", &r.bench_after)] {
        if let Some(b) = b {
            let (median, block) = (human_rate(b.median_bytes_per_second), human_bytes(b.params.block_size_bytes));
            let (min, max) = (human_rate(b.min_bytes_per_second), human_rate(b.max_bytes_per_second));
            let (passes, qd) = (b.passes.len(), b.params.queue_depth);
            rows.push((k, format!("median {median} (min {min}, max {max}; {passes} passes, {block} at QD{qd})")));
        }
    }
    if let Some(v) = &r.verdict {
        rows.push(("verdict", format!("**{}** x{:.2} ({})", v.verdict, v.speedup, v.rule)));
        if !v.criteria.is_empty() {
            rows.push(("verdict rule", v.criteria.clone()));
        }
    }
    rows.extend(super::cold::rows(r));
    if let Some(sc) = &r.scan {
        let slow = format!("below {:.0} % of {}", sc.threshold * 100.0, human_rate(sc.reference_bytes_per_second));
        rows.push(("scan", format!("{} regions, {} slow ({slow})", sc.regions.len(), sc.slow_regions)));
    }
    if let Some(w) = &r.write_cost {
        rows.push(("host bytes written", w.host_bytes_written.map(human_bytes).unwrap_or_else(|| "unknown".into())));
    }
    rows.extend(super::trim_rows(r));
    rows
}

fn outcome_rows(r: &Report) -> Vec<Row> {
    let cause = r.outcome.cause.as_deref().map(|c| format!(", {c}")).unwrap_or_default();
    let mut rows =
        vec![("exit", format!("{} ({:?}{cause}): {}", r.outcome.exit_code, r.outcome.status, r.outcome_text()))];
    if let Some(m) = &r.outcome.message {
        rows.push(("message", m.clone()));
    }
    rows
}
