//! The text a person reads, pinned: reports saved with `--json` by real runs over loop
//! devices (tests/fixtures/reports/, each named by what it ran; make.sh there makes
//! them), rendered as a pipe gets them, without and with `-v`, and compared with the
//! reviewed snapshots beside this file (`snapshots/`). A change to a rendering shows as
//! a diff to review (`cargo insta review`, or INSTA_UPDATE=always and `git diff`), not
//! as a wall of text nobody looked at. Each rendering is also held to the screen's rules:
//! no line over [`WIDTH`] columns without `-v`, within its count of lines, and `-v`
//! saying no less.

use crate::report::Report;
use crate::report::render::text_at;
use crate::support::output::WIDTH;

/// (name, the saved report, the longest default rendering in lines).
const REPORTS: [(&str, &str, usize); 7] = [
    ("rewrite_device_bench", include_str!("../../tests/fixtures/reports/rewrite_device_bench.json"), 15),
    ("rewrite_files_bench", include_str!("../../tests/fixtures/reports/rewrite_files_bench.json"), 12),
    ("rewrite_write_error", include_str!("../../tests/fixtures/reports/rewrite_write_error.json"), 12),
    ("estimate_file", include_str!("../../tests/fixtures/reports/estimate_file.json"), 4),
    ("estimate_dir", include_str!("../../tests/fixtures/reports/estimate_dir.json"), 8),
    ("bench_device", include_str!("../../tests/fixtures/reports/bench_device.json"), 5),
    ("scan_device", include_str!("../../tests/fixtures/reports/scan_device.json"), 6),
];

fn report(json: &str, verbose: bool) -> Report {
    let mut r: Report = serde_json::from_str(json).expect("a saved report parses");
    r.every_file = verbose;
    r
}

#[test]
fn the_text_of_each_report_is_as_reviewed() {
    for (name, json, max_lines) in REPORTS {
        let short = text_at(&report(json, false), None);
        for line in short.lines() {
            assert!(line.chars().count() <= WIDTH, "{name}: a line of {}:\n{line}", line.chars().count());
        }
        assert!(short.lines().count() <= max_lines, "{name}: {} lines:\n{short}", short.lines().count());
        let long = text_at(&report(json, true), None);
        let said = |t: &str| t.chars().filter(|c| !c.is_whitespace()).count();
        assert!(said(&long) >= said(&short), "{name}: -v says less than the default:\n{long}");
        insta::assert_snapshot!(name, short);
        insta::assert_snapshot!(format!("{name}_verbose"), long);
    }
}

/// A verdict made unreliable by a cache the before-benchmark's check found gives its
/// reason once, in the cache check: the verdict line points there and stays on one line
/// (a nightly mail of 16 lines broke its promise of 15).
#[test]
fn a_verdict_does_not_repeat_the_cache_checks_reason() {
    let reason = "a second read of the same 24.0 MiB was x2.13 faster than the first reads of it and of other bytes";
    let mut r = report(include_str!("../../tests/fixtures/reports/rewrite_files_bench.json"), false);
    let cache = r.bench_before.as_mut().and_then(|b| b.cache.as_mut()).expect("the fixture checks for a cache");
    cache.cache_suspected = true;
    cache.finding = format!("{reason}: a cache below the device");
    let v = r.verdict.as_mut().expect("the fixture has a verdict");
    v.rule = format!("{reason}: a cache below the device");
    let text = text_at(&r, None);
    let line = text.lines().find(|l| l.starts_with("  verdict: ")).expect("a verdict line");
    assert!(line.ends_with("(x1.16; a cache below the device, as the cache check above says)"), "{text}");
    assert_eq!(text.matches("x2.13 faster").count(), 1, "{text}");
    // Not said above: the verdict keeps its own reason.
    r.bench_before.as_mut().and_then(|b| b.cache.as_mut()).unwrap().cache_suspected = false;
    let text = text_at(&r, None).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(text.contains(&format!("(x1.16; {reason})")), "{text}");
}
