//! The report document: its JSON shape is pinned by a committed JSON Schema, and a saved
//! report reads back identically.

use crate::common::reseq_command;

use reseq::testing::Report;

const SCHEMA_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/report.schema.json");

#[test]
fn the_report_schema_is_the_committed_one() {
    let schema = serde_json::to_string_pretty(&schemars::schema_for!(Report)).unwrap() + "\n";
    if std::env::var("RESEQ_UPDATE_SCHEMA").is_ok() {
        std::fs::write(SCHEMA_PATH, &schema).unwrap();
    }
    let committed = std::fs::read_to_string(SCHEMA_PATH).unwrap_or_default();
    assert!(
        schema == committed,
        "the report's JSON shape changed. If that is intended, bump report::SCHEMA_VERSION \
         (for incompatible changes), update docs/REPORT-SCHEMA.md, and regenerate with \
         RESEQ_UPDATE_SCHEMA=1 cargo test --features fault-injection --test it report_schema"
    );
}

fn run(args: &[&str]) -> std::process::Output {
    let out = reseq_command().args(args).output().unwrap();
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn a_saved_report_round_trips_and_a_changed_type_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("ssd.sim");
    let s = state.to_str().unwrap();
    assert!(run(&["sim", "create", s, "--device-size", "1G"]).status.success());
    assert!(run(&["sim", "write", s, "--length", "128M"]).status.success());
    let sim = format!("sim:{s}");
    let out = run(&["bench", &sim, "--json", "--length", "128M", "--passes", "2"]);
    assert!(out.status.success());
    let original: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(original["schema_version"], reseq::testing::SCHEMA_VERSION);
    assert_eq!(original["bench"]["virtual_time"], true);
    assert_eq!(original["bench"]["passes"].as_array().unwrap().len(), 2);

    // Typed round trip in the library...
    let report: Report = serde_json::from_value(original.clone()).expect("a report reads back");
    assert_eq!(serde_json::to_value(&report).unwrap(), original);
    // ...and through `reseq report`.
    let saved = dir.path().join("run.json");
    std::fs::write(&saved, &out.stdout).unwrap();
    let again = run(&["report", saved.to_str().unwrap(), "--format", "json"]);
    assert!(again.status.success());
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&again.stdout).unwrap(), original);

    // A field whose type changed no longer fits the schema.
    let mut changed = original.clone();
    changed["duration_seconds"] = serde_json::json!("1.5 s");
    assert!(serde_json::from_value::<Report>(changed.clone()).is_err());
    std::fs::write(&saved, serde_json::to_vec(&changed).unwrap()).unwrap();
    let bad = run(&["report", saved.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a reseq report"));
}
