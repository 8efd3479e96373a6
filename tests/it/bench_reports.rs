//! `bench`, `scan`, `rewrite --bench` and the report renderings, on real loop devices.

use crate::faultfs;

use std::process::Command;

use crate::common::*;
use faultfs::*;

const MIB: u64 = 1 << 20;

/// dd's own figure for an O_DIRECT read of the whole device at `bs`, in bytes/s.
fn dd_rate(dev: &std::path::Path, bs: &str) -> f64 {
    let out = Command::new("dd")
        .arg(format!("if={}", dev.display()))
        .args(["of=/dev/null", &format!("bs={bs}"), "iflag=direct"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    // "268435456 bytes (268 MB, 256 MiB) copied, 0.17 s, 1.6 GB/s"
    let line = text.lines().find(|l| l.contains("copied")).expect("dd summary");
    let bytes: f64 = line.split_whitespace().next().unwrap().parse().unwrap();
    let secs: f64 = line.split("copied, ").nth(1).unwrap().split(" s,").next().unwrap().parse().unwrap();
    bytes / secs
}

#[test]
fn bench_agrees_with_dd() {
    if !require(&["losetup", "dd"]) {
        return;
    }
    // Best against best, dd on either side of the bench: a load only slows a pass, and
    // one dd pass against a median of three fell outside the band under the standard
    // load (3.41), on disk and in memory alike.
    let env = TestEnv::in_memory();
    let lo = env.random_loop_device("b.img", 256 * MIB, 31);
    let dd_before = dd_rate(&lo.path, "1M");
    let r = json_ok(env.reseq().args(["bench", "--json", "--passes", "3", "--block-size", "1M"]).arg(&lo.path));
    let dd = [dd_before, dd_rate(&lo.path, "1M"), dd_rate(&lo.path, "1M")].into_iter().fold(0.0, f64::max);
    let b = &r["bench"];
    assert_eq!(b["passes"].as_array().unwrap().len(), 3);
    for p in b["passes"].as_array().unwrap() {
        assert_eq!(p["bytes"], 256 * MIB);
    }
    let ours = b["max_bytes_per_second"].as_f64().unwrap();
    let ratio = ours / dd;
    eprintln!("reseq bench {ours:.0} B/s, dd {dd:.0} B/s, ratio {ratio:.2}");
    assert!((0.33..3.0).contains(&ratio), "bench and dd disagree beyond the sanity band: {ratio:.2}");
    // QD 4 really runs: same bytes, its own figure.
    let out = output(env.reseq().args(["bench", "--json", "--passes", "1", "--queue-depth", "4"]).arg(&lo.path));
    assert_eq!(json_report(&out)["bench"]["passes"][0]["bytes"], 256 * MIB);
}

/// `-q` quiets the log, not the result; `--json > file` at a terminal still shows the
/// operator the result, on stderr.
#[test]
fn the_result_shows_with_quiet_and_beside_json_redirected_at_a_terminal() {
    if !require(&["losetup", "script"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("q.img", 32 * MIB, 3);
    let out = output(env.reseq().env_remove("RUST_LOG").args(["bench", "-q", "--passes", "1"]).arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("MiB/s") || text.contains("GiB/s"), "bench -q printed no result: {text:?}");
    assert!(!stderr(&out).contains("INFO"), "-q still quiets the log: {}", stderr(&out));
    // stdout to a file, stderr a terminal (script gives the command a pty).
    let json = env.path("run.json");
    let cmd =
        format!("{} bench --json --passes 1 {} > {}", env!("CARGO_BIN_EXE_reseq"), lo.path.display(), json.display());
    let shown =
        output(Command::new("script").args(["-qec", &cmd, "/dev/null"]).env("RESEQ_STATE_DIR", env.state_dir()));
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("JSON in the file");
    assert_eq!(r["bench"]["passes"].as_array().unwrap().len(), 1);
    let on_terminal = String::from_utf8_lossy(&shown.stdout);
    assert!(
        on_terminal.contains("MiB/s") || on_terminal.contains("GiB/s"),
        "nothing shown at the terminal: {on_terminal:?}"
    );
    assert!(!on_terminal.contains("\"passes\""), "the JSON went to the file, not the terminal");
}

#[test]
fn bench_reads_files_through_the_filesystem_with_direct_io() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("bf", 128 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 3, 5 * (MIB as usize) + 1234, 5);
    let r = json_ok(env.reseq().args(["bench", "--json", "--passes", "1"]).arg(&mnt.dir));
    assert_eq!(r["bench"]["target"], "3 files");
    assert_eq!(r["bench"]["passes"][0]["bytes"], 3 * (5 * MIB + 1234), "every byte of every file, tails included");
    let out = output(env.reseq().args(["bench", "--json", "--passes", "1"]).arg(&files[0].0));
    assert_eq!(json_report(&out)["bench"]["passes"][0]["bytes"], 5 * MIB + 1234);
}

fn write_tmp(env: &TestEnv, bytes: &[u8]) -> std::path::PathBuf {
    let p = env.path(&format!("r{}.json", bytes.len()));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A strict reader of the Prometheus text format: every sample is preceded by its HELP
/// and TYPE, names are valid and end in a base unit or are dimensionless by design.
fn check_prometheus(text: &str) -> Vec<(String, f64)> {
    let mut samples = Vec::new();
    let mut declared: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            declared = Some(rest.split_whitespace().next().unwrap().to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            assert_eq!(it.next().map(String::from), declared, "TYPE without matching HELP: {line}");
            assert!(matches!(it.next(), Some("gauge" | "counter")), "{line}");
        } else {
            let (name_labels, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line: {line}"));
            let name = name_labels.split('{').next().unwrap();
            assert_eq!(Some(name.to_string()), declared, "sample without HELP/TYPE: {line}");
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && name.starts_with("reseq_"),
                "{name}"
            );
            let labels = name_labels.strip_prefix(name).unwrap();
            assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
            for pair in labels[1..labels.len() - 1].split("\",") {
                let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("bad label in {line}"));
                assert!(k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{line}");
                assert!(!v.contains('\n'));
            }
            assert!(
                // Units, counts, and 0/1 flags (`_success`, `_unreliable`).
                [
                    "_seconds",
                    "_bytes",
                    "_bytes_per_second",
                    "_success",
                    "_exit_code",
                    "_overrun",
                    "_change",
                    "_unreliable"
                ]
                .iter()
                .any(|u| name.ends_with(u)),
                "{name} does not name its unit"
            );
            samples.push((name.to_string(), value.parse::<f64>().unwrap_or_else(|_| panic!("bad value: {line}"))));
        }
    }
    samples
}

#[test]
fn rewrite_bench_reports_in_every_format() {
    if !require(&["losetup", "mkfs.ext4", "chromium"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("rb", 128 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 8 << 20, 41);
    let metrics = env.path("reseq.prom");
    let out = output(
        env.reseq()
            .args(["rewrite", "--json", "--bench", "--bench-passes", "3", "--bench-regions", "16", "--metrics-file"])
            .arg(&metrics)
            .arg(&lo.path),
    );
    assert_eq!(out.status.code(), Some(0));
    let r = json_report(&out);
    assert_eq!(r["bench_before"]["passes"].as_array().unwrap().len(), 3);
    assert_eq!(r["bench_after"]["passes"].as_array().unwrap().len(), 3);
    assert_eq!(r["scan_after"]["regions"].as_array().unwrap().len(), 16);
    let v = r["verdict"]["verdict"].as_str().unwrap();
    assert!(["faster", "no_measurable_change", "slower", "unreliable"].contains(&v), "{v}");
    let host = r["write_cost"]["host_bytes_written"].as_u64().unwrap();
    let written = r["results"]["bytes_written"].as_u64().unwrap();
    assert!(host >= written && host < written + 2 * MIB, "host bytes written {host} vs reseq's {written}");
    assert!(r["write_cost"]["nvme_data_units_written_before"].is_null(), "a loop device has no NVMe SMART");
    assert_files_intact(&files);

    // Prometheus textfile: written atomically, world-readable, parseable, base units.
    let prom = std::fs::read_to_string(&metrics).unwrap();
    let samples = check_prometheus(&prom);
    let get = |n: &str| samples.iter().find(|s| s.0 == n).unwrap_or_else(|| panic!("no {n}")).1;
    assert_eq!(get("reseq_last_run_success"), 1.0);
    assert_eq!(get("reseq_last_run_rewritten_bytes"), written as f64);
    assert!(get("reseq_read_throughput_before_bytes_per_second") > 0.0);
    assert!(get("reseq_last_run_longest_freeze_seconds") > 0.0);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&metrics).unwrap().permissions().mode() & 0o777, 0o644);
    let leftovers: Vec<_> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".reseq-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary metrics files left behind");

    // Markdown and HTML from the saved report.
    let saved = write_tmp(&env, &out.stdout);
    let md = output(env.reseq().args(["report", "--format", "md"]).arg(&saved));
    let md = String::from_utf8_lossy(&md.stdout);
    assert!(md.contains("| verdict |") && md.contains("| rewritten |"), "{md}");
    let html_out = output(env.reseq().args(["report", "--format", "html"]).arg(&saved));
    let html_path = env.path("report.html");
    std::fs::write(&html_path, &html_out.stdout).unwrap();
    let html = String::from_utf8_lossy(&html_out.stdout);
    assert!(html.contains("<svg id=\"regions\"") && html.contains("<svg id=\"passes\""));
    // The settings and what was frozen, as the Markdown has them; every chart mark named.
    for needle in
        ["<th>chunks</th>", "<th>windows</th>", "<th>frozen</th>", "<th>space</th>", "cache check:", "region start"]
    {
        assert!(html.contains(needle), "the HTML lacks {needle}");
    }
    // For the manager: what, where and when in the title; the effect, whether anything
    // was lost and how long the filesystem was paused in one sentence; the version.
    let title = format!("<title>reseq rewrite {} on {}", lo.path.display(), r["host"].as_str().unwrap());
    assert!(html.contains(&title), "{title} not in the page");
    assert!(html.contains("every byte written read back and checked: nothing lost"), "no headline");
    assert!(html.contains("paused") && html.contains("in all, at most"), "no total freeze in the headline");
    assert!(html.contains("<th>reseq version</th>"));
    assert!(html.contains(">read throughput, per second</text>"), "no y-axis title");
    assert_plain_above_the_fold(&html);
    // The rule the verdict applied, stated: in the JSON, the text and the page.
    let criteria = r["verdict"]["criteria"].as_str().unwrap();
    assert!(criteria.contains("Mann-Whitney") && criteria.contains("spread"), "{criteria}");
    assert!(r["verdict"]["needed_effect"].as_f64().unwrap() >= 1.5);
    assert!(html.contains("<p>Rule: faster (or slower) needs"), "no rule on the page");
    // The text gives the rule with -v (the verdict's first clause without).
    let text = output(env.reseq().args(["-v", "report", "--format", "text"]).arg(&saved));
    assert!(String::from_utf8_lossy(&text.stdout).contains("verdict rule: faster (or slower) needs"));

    // Headless Chromium: no console errors, and the chart has pixels where it belongs.
    let shot = env.path("report.png");
    let chrome = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--hide-scrollbars",
            "--window-size=1000,2400",
        ])
        .arg(format!("--user-data-dir={}", env.path("chrome").display()))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("file://{}", html_path.display()))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&chrome.stderr);
    let console: Vec<&str> = log.lines().filter(|l| l.contains("CONSOLE") || l.contains("Uncaught")).collect();
    assert!(console.is_empty(), "console messages: {console:?}");
    let keep = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-screenshot.png");
    std::fs::copy(&shot, &keep).expect("chromium wrote a screenshot");
    eprintln!("screenshot saved to {}", keep.display());
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    // The "after" line is #1f77b4; count pixels close to it.
    let blue = buf
        .chunks(px)
        .filter(|p| {
            (p[0] as i32 - 0x1f).abs() < 30 && (p[1] as i32 - 0x77).abs() < 30 && (p[2] as i32 - 0xb4).abs() < 30
        })
        .count();
    assert!(blue > 300, "the chart does not look drawn: {blue} chart-coloured pixels");
}

/// Words a manager should not meet above the fold of the HTML page.
const JARGON: [&str; 16] = [
    "chunk",
    "p50",
    "p99",
    "latency",
    "cache check",
    "/dev/",
    "journal",
    "exit",
    "mann-whitney",
    "median",
    "o_direct",
    "qd",
    "trim",
    "ext4",
    "freeze",
    "window",
];

/// The page opens with plain words for a manager (what was done, the effect, nothing
/// lost, the pauses, how sure), and the technical rows come below a heading of their own.
fn assert_plain_above_the_fold(html: &str) {
    let (top, details) = html.split_once("<h2>Details for engineers</h2>").expect("a details heading");
    let plain = top.split_once("</h1>").expect("a title first").1.to_lowercase();
    for label in ["what was done", "effect", "data safety", "pauses", "how sure"] {
        assert!(plain.contains(&format!("<b>{label}:</b>")), "no {label} above the fold: {plain}");
    }
    for word in JARGON {
        assert!(!plain.contains(word), "jargon above the fold: {word} in {plain}");
    }
    for needle in ["<th>chunks</th>", "<th>windows</th>", "cache check:", "<th>device</th>", "Verdict: <b>"] {
        assert!(details.contains(needle), "{needle} not in the details for engineers");
    }
}

/// An image full of random bytes, ext4 made without discard and a quarter used, mounted:
/// the state in which a rewrite's FITRIM makes free space read fast.
fn quarter_used(
    env: &TestEnv,
    name: &str,
    direct_io: bool,
) -> (LoopDevice, Mount, Vec<(std::path::PathBuf, blake3::Hash)>) {
    let lo = env.random_loop_device(name, 256 * MIB, 71);
    if !direct_io {
        run_cmd(Command::new("losetup").args(["--direct-io=off"]).arg(&lo.path)).unwrap();
    }
    run_cmd(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "nodiscard,lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&lo.path),
    )
    .unwrap();
    let mnt = Mount::new(&lo.path, &env.path(&format!("{name}-mnt")), &[]).unwrap();
    let files = fill_files(&mnt.dir, 4, 16 << 20, 72);
    (lo, mnt, files)
}

/// Before and after read the same in-use bytes: the FITRIM after the rewrite, which makes
/// free space read fast, cannot make the verdict "faster" on a device with no FTL.
#[test]
fn rewrite_bench_measures_in_use_bytes_and_does_not_credit_trim() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, _mnt, files) = quarter_used(&env, "trim", true);
    let args = ["rewrite", "--json", "--bench", "--bench-passes", "4", "--bench-regions", "8"];
    let r = json_ok(env.reseq().args(args).arg(&lo.path));
    assert!(r["space"]["bytes_trimmed"].as_u64().unwrap() > 100 * MIB, "the run trims: {}", r["space"]);
    let (before, after) = (&r["bench_before"], &r["bench_after"]);
    assert!(before["target"].as_str().unwrap().contains("in-use ranges"), "{}", before["target"]);
    let measured = before["params"]["length_bytes"].as_u64().unwrap();
    assert!(measured > 64 * MIB && measured < 128 * MIB, "in-use bytes only: {measured}");
    assert_eq!(after["params"]["length_bytes"], measured, "the same bytes after");
    // Whether this VM's host cache shows (it can: "unreliable") or not, never "faster".
    assert!(before["cache"]["finding"].is_string(), "{}", before["cache"]);
    // On a virtio disk (as where the project's CI runs), the image's disk is named as a
    // hypervisor's, through the loop device; as sysfs says from outside.
    let disk =
        run_cmd(Command::new("findmnt").args(["-n", "-o", "SOURCE,FSTYPE", "--target"]).arg(env.path(""))).unwrap();
    let on_ext4_or_xfs = disk.split_whitespace().nth(1).is_some_and(|t| t == "ext4" || t == "xfs");
    if disk.trim().starts_with("/dev/vd") && on_ext4_or_xfs {
        let e = before["cache"]["emulated_disk"].as_str().unwrap_or_default();
        assert!(e.contains("is a virtio or Xen disk"), "the image is on {disk}: {}", before["cache"]);
        assert!(r["verdict"]["needed_effect"].as_f64().unwrap() >= 2.0, "{}", r["verdict"]);
    }
    assert_ne!(r["verdict"]["verdict"], "faster", "a loop device has no FTL: {}", r["verdict"]);
    let regions = r["scan_after"]["regions"].as_array().unwrap();
    assert!(regions.iter().all(|g| !g["device_ranges"].as_array().unwrap().is_empty()), "regions name device ranges");
    // `reseq estimate` samples the same in-use bytes, and writes nothing.
    let before = hash_path(&files[0].0).unwrap();
    let e = &json_ok(env.reseq().args(["estimate", "--json", "--sample", "32M"]).arg(&lo.path))["estimate"];
    assert!(e["target"].as_str().unwrap().contains("in-use ranges"), "{e}");
    assert!(e["advice"].as_str().unwrap().len() > 10, "{e}");
    assert_eq!(hash_path(&files[0].0).unwrap(), before);
    assert_files_intact(&files);
}

/// A loop device that reads its image through the page cache: the verdict is
/// "unreliable", never "faster", and says why.
#[test]
fn a_cache_below_the_device_makes_the_verdict_unreliable() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, _mnt, files) = quarter_used(&env, "cache", false);
    let b = &json_ok(env.reseq().args(["bench", "--json", "--passes", "2"]).arg(&lo.path))["bench"];
    assert_eq!(b["cache"]["loop_direct_io"], false, "{}", b["cache"]);
    assert_eq!(b["cache"]["cache_suspected"], true);
    let args = ["rewrite", "--json", "--bench", "--bench-passes", "3", "--bench-regions", "4"];
    let v = &json_ok(env.reseq().args(args).arg(&lo.path))["verdict"];
    assert_eq!(v["verdict"], "unreliable", "{v}");
    assert!(v["rule"].as_str().unwrap().contains("page cache"), "{v}");
    assert_files_intact(&files);
}

/// File mode looks at the device beneath the files' filesystem as device mode does: on
/// a loop device without direct I/O the page cache below answers, and the verdict says
/// so, never "faster" (it once said "faster x2.04" there, with "no cache seen").
#[test]
fn file_mode_sees_a_loop_device_without_direct_io_beneath_the_files() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt, files) = quarter_used(&env, "fcache", false);
    let b = &json_ok(env.reseq().args(["bench", "--json", "--passes", "1"]).arg(&mnt.dir))["bench"];
    assert_eq!(b["cache"]["loop_direct_io"], false, "bench of the files: {}", b["cache"]);
    let args = ["rewrite", "--json", "--bench", "--bench-passes", "3", "--bench-regions", "4"];
    let r = json_ok(env.reseq().args(args).arg(&mnt.dir));
    assert_eq!(r["bench_before"]["cache"]["loop_direct_io"], false, "{}", r["bench_before"]["cache"]);
    let v = &r["verdict"];
    assert_eq!(v["verdict"], "unreliable", "{v}");
    assert!(v["rule"].as_str().unwrap().contains("page cache"), "{v}");
    assert_files_intact(&files);
}

/// A cache below the device smaller than a pass (a controller's read cache, emulated by
/// a FUSE filesystem under the loop device): the re-read test sees it, the first pass
/// evicts it, and the benchmark says it is ruled out, and how. A cache larger than a
/// pass still holds the sample afterwards: then the results stay unreliable.
#[test]
fn a_cache_smaller_than_a_pass_is_ruled_out_by_eviction() {
    if !require(&["losetup"]) || !require_fuse() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "cached", 256 * MIB, 5, None);
    // Direct I/O from the loop device to the FUSE file (served FOPEN_DIRECT_IO): no page
    // cache anywhere, only the emulated one (a loop without it is a page cache by rule).
    run_cmd(Command::new("losetup").args(["--direct-io=on"]).arg(&d.lo.path)).unwrap();
    let name = d.lo.path.file_name().unwrap().to_string_lossy().to_string();
    assert_eq!(std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap().trim(), "1");
    let bench = || {
        let out = output(env.reseq().args(["bench", "--json", "--passes", "1"]).arg(&d.lo.path));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        json_report(&out)["bench"]["cache"].clone()
    };
    // 15 ms a MiB from the flash: a cold read runs at most ~65 MiB/s, several times
    // slower than the FUSE path itself, even on a loaded host.
    let cold = std::time::Duration::from_millis(15);
    d.fs.set_cache(64 * MIB, cold);
    let c = bench();
    let rate = |k: &str| c[k].as_f64().unwrap();
    assert!(rate("second_read_bytes_per_second") > 2.0 * rate("first_read_bytes_per_second"), "not seen: {c}");
    assert!(rate("after_pass_bytes_per_second") < 2.0 * rate("first_read_bytes_per_second"), "{c}");
    assert_eq!(c["cache_suspected"], false, "{c}");
    assert!(c["finding"].as_str().unwrap().contains("ruled out: it is smaller than a pass"), "{c}");

    d.fs.set_cache(512 * MIB, cold);
    let c = bench();
    assert_eq!(c["cache_suspected"], true, "{c}");
    assert!(c["finding"].as_str().unwrap().contains("still held"), "{c}");
}

/// A cache below the device that serves recently written bytes fast (a VM host's, a
/// cloud volume's), emulated under a loop device with direct I/O: right after the
/// rewrite every byte reads fast and no re-read test can see a cache, so the passes
/// say "faster"; read again after the cache has let go, they do not, and the verdict
/// is "unreliable" with the reason. (The emulated SSD, whose effect lasts, stays
/// "faster": `sim_serve::consumer_nvme_degrades_and_file_and_device_mode_restore_it`.)
#[test]
fn a_speed_up_that_fades_is_not_called_faster() {
    if !require(&["losetup"]) || !require_fuse() {
        return;
    }
    // Alone on the machine: a change in the host's load between the benchmarks would
    // decide the verdict ("unreliable" for that reason) before the re-check.
    let _one = exclusive();
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "fading", 32 * MIB, 9, None);
    run_cmd(Command::new("losetup").args(["--direct-io=on"]).arg(&d.lo.path)).unwrap();
    // 20 ms a MiB unless written in the last 6 s: cold reads run at most ~50 MiB/s.
    d.fs.set_write_cache(std::time::Duration::from_secs(6), std::time::Duration::from_millis(20));
    let args = ["rewrite", "--json", "--bench", "--bench-passes", "3", "--bench-regions", "4"];
    // A shared machine's load can change between the benchmarks, and then that decides
    // the verdict (rightly "unreliable", but not what this tests): up to three tries.
    let mut r = serde_json::Value::Null;
    for _ in 0..3 {
        let out = output(env.reseq().args(args).args(["--bench-recheck", "8s"]).arg(&d.lo.path));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        r = json_report(&out);
        if !r["verdict"]["rule"].as_str().unwrap_or_default().contains("load changed") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(7));
    }
    let v = &r["verdict"];
    assert_eq!(
        r["bench_after"]["cache"]["cache_suspected"], false,
        "the re-read test cannot see it: {}",
        r["bench_after"]
    );
    assert_eq!(v["verdict"], "unreliable", "{v}");
    let rule = v["rule"].as_str().unwrap();
    if rule.contains("load changed") {
        // A host busy by spells three times running (other work on a shared machine):
        // either the load changed between the benchmarks themselves (no re-check needed:
        // nothing to compare), or the re-check ran and a first reading of "faster" was
        // not let stand. Never "faster" (asserted above).
        match v["recheck"].is_null() {
            true => assert!(rule.contains("between the benchmarks"), "{v}"),
            false => assert!(rule.contains("re-check") && rule.contains("could not tell (whether it lasted)"), "{v}"),
        }
        assert!(v["speedup"].as_f64().unwrap() > 2.0, "{v}");
        return;
    }
    let recheck = &v["recheck"];
    assert!(recheck["after_seconds"].as_f64().unwrap() >= 8.0, "{v}");
    let (first, later) = (v["speedup"].as_f64().unwrap(), recheck["speedup"].as_f64().unwrap());
    assert!(later < first / 1.5, "the cache had let go: {v}");
    assert!(rule.contains("did not last"), "{v}");
    // Without the re-check the same run would have said "faster": the first verdict's
    // speed-up is in the rule.
    assert!(v["speedup"].as_f64().unwrap() > 2.0, "the after-passes were served by the cache: {v}");
}

/// A VM's disk in its host's page cache, emulated under a loop device with direct I/O
/// as the project's VM measured it (a first read 500-600 MB/s, a second x1.85 faster,
/// bytes the guest wrote x1.3-1.9 faster again, for good): the rewrite leaves every byte
/// faster than a benchmark's reads had made it, and a re-check cannot see a cache that
/// does not let go. The cache check's re-read gain is the bar: never "faster".
#[test]
fn a_host_cache_that_serves_written_bytes_faster_is_not_called_faster() {
    // It measures: the cache check's reads and the verdict's passes, alone.
    let _alone = exclusive();
    if !require(&["losetup"]) || !require_fuse() {
        return;
    }
    let env = TestEnv::new();
    let d = fault_loop_device(&env, "hostcache", 16 * MIB, 11, None);
    run_cmd(Command::new("losetup").args(["--direct-io=on"]).arg(&d.lo.path)).unwrap();
    // A MiB: 96 ms never seen, 52 ms read before (x1.85), 32 ms written (x1.63 again).
    // The FUSE path's own time adds to each alike and shrinks both ratios, the written
    // one always more: on a busy host the change stays within the cache's gain.
    let ms = std::time::Duration::from_millis;
    d.fs.set_host_cache(ms(96), ms(52), ms(32));
    let args = ["rewrite", "--json", "--bench", "--bench-passes", "3", "--bench-recheck", "1s"];
    let out = output(env.reseq().args(args).arg(&d.lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json_report(&out);
    let (v, c) = (&r["verdict"], &r["bench_before"]["cache"]);
    assert_ne!(v["verdict"], "faster", "cache check before: {c}; verdict: {v}");
    let rate = |k: &str| c[k].as_f64().unwrap();
    let cold = rate("first_read_bytes_per_second").max(rate("other_first_read_bytes_per_second"));
    let gain = rate("second_read_bytes_per_second") / cold;
    if c["cache_suspected"] == true {
        // The host's load stretched the first reads past the cache check's bar (x2.29 seen
        // under bench/load.sh, x1.85 emulated): the check itself names the cache, and the
        // verdict is "unreliable" for it.
        assert!(c["finding"].as_str().unwrap().contains("a cache below the device"), "{c}");
        assert_eq!(v["verdict"], "unreliable", "{v}");
        assert!(v["rule"].as_str().unwrap().contains("a cache below the device"), "{v}");
        return;
    }
    assert!(gain > 1.3, "the re-read test did not see the cache's gain: {c}");
    assert!(v["speedup"].as_f64().unwrap() > 1.2, "the after-passes read bytes written: {v}");
    // Where the old bar (x1.5) alone would have let it pass, the cache's gain held it
    // (or a change in the host's load between the benchmarks, on a shared machine).
    if v["speedup"].as_f64().unwrap() > 1.5 && v["verdict"] == "no_measurable_change" {
        assert!(v["rule"].as_str().unwrap().contains("a cache below the device can make"), "{v}");
        assert!(v["needed_effect"].as_f64().unwrap() > 1.5, "{v}");
    }
    if v["verdict"] == "unreliable" {
        assert!(v["rule"].as_str().unwrap().contains("load changed"), "{v}");
    }
}

/// Files deleted during a `rewrite --bench` run are trimmed after it and read fast: the
/// ranges measured before are then not the same data, and the verdict says so
/// ("unreliable"), never "faster".
#[test]
fn bytes_freed_during_the_run_make_the_verdict_unreliable() {
    // A verdict, measured, over 300 ms windows: alone (beside the suite's I/O a thaw can
    // outlast the grace; see file_mode's short-window test).
    let _alone = exclusive();
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, _mnt, files) = quarter_used(&env, "freed", true);
    let mut cmd = env.reseq();
    cmd.args(["rewrite", "--json", "--bench", "--bench-passes", "2", "--bench-regions", "4", "--chunk-size", "1M"])
        .args(["--max-freeze", "300ms", "--max-overruns", "1000"])
        .arg(&lo.path)
        // Slow chunks: the run lasts seconds, in many windows, after its first.
        .env("RESEQ_FAULTS", "delay@after-write#*=30");
    let child = Running::captured(&mut cmd);
    assert!(wait_frozen_record(&env.run_dir(), std::time::Duration::from_secs(60)), "no window began");
    // Three of the four files (48 MiB of about 70 MiB in use); an unlink waits out a window.
    for (f, _) in &files[1..] {
        std::fs::remove_file(f).unwrap();
    }
    let out = child.wait();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let r = json_report(&out);
    let v = &r["verdict"];
    assert!(v["measured_bytes_freed"].as_u64().unwrap() >= 40 * MIB, "{v}");
    assert_eq!(v["verdict"], "unreliable", "{v}");
    let rule = v["rule"].as_str().unwrap();
    assert!(rule.contains("freed during it") || rule.contains("cache") || rule.contains("load changed"), "{rule}");
    assert!(r["space"]["bytes_trimmed"].as_u64().unwrap() >= 48 * MIB, "{}", r["space"]);
    assert_files_intact(&files[..1]);
}

/// A `--bench` run killed mid-rewrite: `status` shows `--bench`, and the resumed run (a
/// plain `--resume`) compares with the benchmark taken before the first run started,
/// read the same way (its passes, whatever the resuming command says), and gives a
/// verdict; in device mode and in file mode.
#[test]
fn a_resumed_bench_run_keeps_its_benchmark_before() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let lo = env.random_loop_device("resume-bench.img", 32 * MIB, 21);
    let (flo, mnt) = env.mounted("resume-bench-files", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 3, 6 << 20, 22);
    let first = ["rewrite", "--bench", "--bench-passes", "2", "--bench-recheck", "0s", "--chunk-size", "1M"];
    for target in [&lo.path, &mnt.dir] {
        let out = output(env.reseq().args(first).arg(target).env("RESEQ_FAULTS", "kill@after-write#4"));
        assert_eq!(out.status.code(), None, "killed mid-run: {}", stderr(&out));
        let status = output(env.reseq().arg("status"));
        let text = String::from_utf8_lossy(&status.stdout);
        assert!(text.contains("--bench"), "status must show the run's --bench: {text}");
        let out = output(env.reseq().args(["rewrite", "--resume", "--json", "--bench-passes", "4"]).arg(target));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(stderr(&out).contains("comparing with the benchmark taken before the interrupted run started"));
        let r = json_report(&out);
        assert_eq!(r["bench_before"]["passes"].as_array().unwrap().len(), 2, "the first run's: {}", r["bench_before"]);
        assert_eq!(r["bench_after"]["passes"].as_array().unwrap().len(), 2, "read as before was");
        assert!(r["verdict"]["verdict"].is_string(), "a verdict: {}", r["verdict"]);
    }
    assert_files_intact(&files);
    drop(mnt);
    drop(flo);
}

/// A `--bench` run refused at its first freeze (someone else's) wrote nothing: it keeps
/// no benchmark before in the state directory either, in device mode and in file mode.
#[test]
fn a_refused_bench_run_keeps_no_benchmark_before() {
    if !require(&["losetup", "mkfs.ext4", "fsfreeze"]) {
        return;
    }
    let env = TestEnv::new();
    let (lo, mnt) = env.mounted("refbench", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 1, 8 << 20, 5);
    let bench =
        ["rewrite", "--json", "--bench", "--bench-passes", "2", "--bench-regions", "4", "--bench-recheck", "0s"];
    let _frozen = ForeignFreeze::new(&mnt.dir);
    for target in [lo.path.clone(), files[0].0.clone()] {
        let out = output(env.reseq().args(bench).arg(&target));
        assert_eq!(out.status.code(), Some(3), "{}: {}", target.display(), stderr(&out));
        assert!(json_report(&out)["bench_before"].is_object(), "it benchmarked before it was refused");
        let left: Vec<_> =
            std::fs::read_dir(env.state_dir()).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        assert!(left.is_empty(), "{}: a refused run left {left:?}", target.display());
    }
}
