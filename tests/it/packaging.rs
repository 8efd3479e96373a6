//! Packaging: the systemd units verify cleanly, a job config runs, the Kubernetes
//! manifest fits the API's schema, and the alert rules fire on real runs' metrics.

use std::process::Command;

use crate::common::*;

#[test]
fn systemd_units_verify() {
    if !require(&["systemd-analyze", "man"]) {
        return;
    }
    let env = TestEnv::new();
    let dir = env.path("units");
    std::fs::create_dir_all(env.path("man/man1")).unwrap();
    let generated = output(env.reseq().arg("generate").arg(env.path("gen")));
    assert!(generated.status.success());
    std::fs::copy(env.path("gen/reseq.1"), env.path("man/man1/reseq.1")).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    // An instance of each template; ExecStart pointed at the binary under test, since
    // verify checks that the command exists (the package installs it at /usr/bin/reseq).
    let root = env!("CARGO_MANIFEST_DIR");
    let service = std::fs::read_to_string(format!("{root}/packaging/systemd/reseq@.service")).unwrap();
    assert!(service.contains("ExecStart=/usr/bin/reseq run --config /etc/reseq/%i.toml"));
    assert!(
        !service.lines().any(|l| l.starts_with("KillMode=")),
        "the guardian leaves the unit: the default control-group kill is safe"
    );
    assert!(!service.contains("RestrictRealtime=yes"), "the guardian needs SCHED_FIFO");
    for cap in ["CAP_SYS_ADMIN", "CAP_SYS_NICE", "CAP_IPC_LOCK", "CAP_SYS_RESOURCE", "CAP_SYS_PTRACE"] {
        assert!(service.contains(cap), "the unit's bounding set lacks {cap}");
    }
    assert!(service.contains("ExecStopPost=-/usr/bin/reseq thaw"), "a stop must thaw what a killed guardian left");
    assert!(service.contains("RuntimeDirectory=reseq"), "the freeze records need a writable /run/reseq");
    // Every ReadWritePaths= entry that a host may lack is optional ("-"): systemd refuses
    // to start a unit whose ReadWritePaths= directory is missing (226/NAMESPACE), and
    // then runs its ExecStopPost= neither (tests/vm, systemd scenarios).
    for line in service.lines().filter(|l| l.starts_with("ReadWritePaths=")) {
        for path in line["ReadWritePaths=".len()..].split_whitespace() {
            assert!(
                path.starts_with('-') || path == "/var/lib/reseq",
                "ReadWritePaths={path} makes the unit fail where that directory is missing: write -{path}"
            );
        }
    }
    std::fs::write(dir.join("reseq@job.service"), service.replace("/usr/bin/reseq", env!("CARGO_BIN_EXE_reseq")))
        .unwrap();
    std::fs::copy(format!("{root}/packaging/systemd/reseq@.timer"), dir.join("reseq@job.timer")).unwrap();
    let out = output(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(dir.join("reseq@job.service"))
            .arg(dir.join("reseq@job.timer"))
            .env("MANPATH", env.path("man")),
    );
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "", "systemd-analyze found problems");
}

#[test]
fn a_job_config_runs_like_the_command_line() {
    if !require(&["losetup", "mkfs.ext4"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("job", 64 * (1 << 20), "ext4");
    let files = fill_files(&mnt.dir, 2, 1 << 20, 4);
    let job = env.path("job.toml");
    std::fs::write(
        &job,
        format!(
            "targets = [\"{}\"]\nmax_freeze = \"500ms\"\nstate_dir = \"{}\"\njson = true\nmetrics_file = \"{}\"\n",
            mnt.dir.display(),
            env.state_dir().display(),
            env.path("job.prom").display()
        ),
    )
    .unwrap();
    let r = json_ok(env.reseq().args(["run", "--config"]).arg(&job));
    assert_eq!(r["results"]["bytes_written"], 2 << 20);
    assert!(std::fs::read_to_string(env.path("job.prom")).unwrap().contains("reseq_last_run_success"));
    assert_files_intact(&files);
    // A metrics file whose directory is missing (no node_exporter here): refused before
    // anything runs, with the way out, not lost in silence; a dry run writes none.
    let missing = env.path("no-such-dir/reseq.prom");
    let with_missing = std::fs::read_to_string(&job)
        .unwrap()
        .replace(&env.path("job.prom").display().to_string(), &missing.display().to_string());
    std::fs::write(&job, with_missing).unwrap();
    for dry in [false, true] {
        let mut cmd = env.reseq();
        cmd.args(["run", "--config"]).arg(&job);
        if dry {
            cmd.arg("--dry-run");
        }
        let out = output(&mut cmd);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains("does not exist") && stderr(&out).contains("metrics_file"), "{}", stderr(&out));
    }
    std::fs::remove_file(env.path("job.prom")).unwrap();
    let out =
        output(env.reseq().args(["rewrite", "--dry-run", "--metrics-file"]).arg(env.path("job.prom")).arg(&mnt.dir));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!env.path("job.prom").exists(), "a dry run writes no metrics");
    std::fs::write(&job, "targets = [\"/x\"]\nmax_freeze = = 1\n").unwrap();
    let out = output(env.reseq().args(["run", "--config"]).arg(&job));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("line 2"), "{}", stderr(&out));
}

/// What cron gives a job: `PATH=/usr/bin:/bin`, nothing else, no terminal. The job
/// runs and prints its summary (cron mails it).
#[test]
fn a_job_runs_under_crons_environment() {
    if !require(&["losetup", "mkfs.ext4", "env"]) {
        return;
    }
    let env = TestEnv::new();
    let (_lo, mnt) = env.mounted("cron", 64 * (1 << 20), "ext4");
    let files = fill_files(&mnt.dir, 3, 1 << 20, 5);
    let job = env.path("cron.toml");
    let text = format!("targets = [\"{}\"]\nstate_dir = \"{}\"\n", mnt.dir.display(), env.state_dir().display());
    std::fs::write(&job, text).unwrap();
    // RESEQ_RUN_DIR only keeps this test's freeze records apart from the machine's.
    let mut cmd = Command::new("env");
    cmd.args(["-i", "PATH=/usr/bin:/bin"])
        .arg(format!("RESEQ_RUN_DIR={}", env.run_dir().display()))
        .arg(env!("CARGO_BIN_EXE_reseq"))
        .args(["run", "--config"])
        .arg(&job)
        .stdin(std::process::Stdio::null());
    let out = output(&mut cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verification: passed") && text.contains("outcome: success"), "{text}");
    assert!(text.lines().count() < 15, "cron mails this: {text}");
    assert_files_intact(&files);
}

#[test]
fn the_ansible_playbook_passes_its_syntax_check() {
    if !require(&["ansible-playbook"]) {
        return;
    }
    let out = output(
        Command::new("ansible-playbook")
            .args(["--syntax-check", "-i", "localhost,"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/ansible/reseq.yml")),
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn example_manifests_parse() {
    if !require(&["python3", "ansible-playbook"]) {
        return;
    }
    // The CronJob and the alert rules are YAML a cluster and Prometheus will read; a
    // parse keeps typos out (no cluster runs here: the CronJob is checked against the
    // API's schemas in the_kubernetes_manifest_validates_against_the_api_schema, and
    // promtool evaluates the rules in
    // the_alert_rules_fire_on_a_failed_run_and_stay_silent_on_a_good_one).
    for f in ["packaging/kubernetes/cronjob.yaml", "packaging/prometheus/reseq-alerts.yml"] {
        let path = format!("{}/{f}", env!("CARGO_MANIFEST_DIR"));
        let out = output(
            Command::new("python3").args(["-c", "import sys, yaml; yaml.safe_load(open(sys.argv[1]))"]).arg(&path),
        );
        assert!(out.status.success(), "{f} is not valid YAML: {}", stderr(&out));
    }
    // The pod runs reseq where its guardian can leave the pod's cgroup: the host's PID and
    // cgroup namespaces, the host's hierarchy (cgroup_strike tests the same entry).
    let cron =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/kubernetes/cronjob.yaml")).unwrap();
    for needle in [
        "hostPID: true",
        r#"command: ["nsenter", "--target", "1", "--cgroup", "--", "reseq"]"#,
        "hostPath: { path: /sys/fs/cgroup, type: Directory }",
        "mountPath: /sys/fs/cgroup",
    ] {
        assert!(cron.contains(needle), "the CronJob lacks {needle}");
    }
}

/// The CronJob against the Kubernetes API's own schemas, offline: kubernetes-validate
/// (PyPI) ships the JSON schemas made from each Kubernetes release's OpenAPI document,
/// and with `--strict` a field the API does not have is an error (a cluster would refuse
/// it under server-side field validation, or drop it in silence where that is off).
/// Against the newest release the package has and the oldest (1.25); then the check
/// can fail: a misspelt field, one in a volume mount's inline mapping, and a wrong type
/// are each rejected, naming what is wrong, and the misspelt field passes without
/// `--strict` (so strict is what catches it).
#[test]
fn the_kubernetes_manifest_validates_against_the_api_schema() {
    if !require(&["kubernetes-validate"]) {
        return;
    }
    let env = TestEnv::new();
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/kubernetes/cronjob.yaml");
    let validate = |path: &std::path::Path, args: &[&str]| {
        let out = output(Command::new("kubernetes-validate").args(args).arg(path));
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out)))
    };
    for args in [&["--strict"][..], &["--strict", "-k", "1.25.0"]] {
        let (code, text) = validate(std::path::Path::new(manifest), args);
        assert_eq!(code, Some(0), "kubernetes-validate {args:?} {manifest}: {text}");
        assert!(text.contains("passed for resource cronjob/reseq-node1-pgdata"), "{text}");
    }
    let text = std::fs::read_to_string(manifest).unwrap();
    let broken = [
        ("concurrencyPolicy: Forbid", "concurencyPolicy: Forbid", "'concurencyPolicy' was unexpected"),
        (
            "mountPath: /var/lib/reseq }",
            "mountPath: /var/lib/reseq, readOnli: false }",
            "volumeMounts.3: Additional properties are not allowed ('readOnli' was unexpected)",
        ),
        ("hostPID: true", "hostPID: \"yes\"", "hostPID: 'yes' is not of type 'boolean'"),
    ];
    for (i, (good, bad, says)) in broken.iter().enumerate() {
        assert_eq!(text.matches(good).count(), 1, "the manifest has no single {good}");
        let path = env.path(&format!("broken-{i}.yaml"));
        std::fs::write(&path, text.replace(good, bad)).unwrap();
        let (code, out) = validate(&path, &["--strict"]);
        assert_eq!(code, Some(1), "{bad}: not rejected: {out}");
        assert!(out.contains(says), "{bad}: the rejection does not say {says}: {out}");
        if i == 0 {
            let (code, out) = validate(&path, &[]);
            assert_eq!(code, Some(0), "without --strict a misspelt field passes: {out}");
        }
    }
}

/// The shipped alert rules (packaging/prometheus/reseq-alerts.yml), evaluated by
/// Prometheus's own `promtool test rules` on the metrics files of real runs: a good run
/// and a failed one on a loop device, and two `--bench` runs on the simulated SSD (one
/// that made reads faster, one that made no measurable change). Each file's samples are
/// turned into promtool's `input_series` as a scrape of node_exporter's textfile
/// collector would give them (with the `instance` and `job` labels the scrape adds).
#[test]
fn the_alert_rules_fire_on_a_failed_run_and_stay_silent_on_a_good_one() {
    if !require(&["losetup", "mkfs.ext4", "promtool"]) {
        return;
    }
    const MIB: u64 = 1 << 20;
    let env = TestEnv::new();
    // Dense: the failing write's chunk at 5 MiB must hold data (holes are not written).
    let (lo, mnt) = env.mounted_dense("alerts", 64 * MIB, "ext4");
    let files = fill_files(&mnt.dir, 2, 4 << 20, 23);
    let rewrite = |prom: &str| {
        let mut c = env.reseq();
        c.args(["rewrite", "--chunk-size", "1M", "--metrics-file"]).arg(env.path(prom));
        c
    };
    // No trim: it would punch the free space at 5 MiB into a hole, which is not written.
    let out = output(rewrite("good.prom").arg("--no-trim").arg(&lo.path));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // A write that fails at 5 MiB (and the bytes there found intact): exit 4.
    let out = output(rewrite("failed.prom").arg("--include-free").arg(&lo.path).env("RESEQ_FAULTS", "write-error@5M"));
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_files_intact(&files);
    // The verdict's metric, from the engine on the simulated SSD's clock: a file
    // rewritten as it was written (no measurable change), then degraded and rewritten
    // again (faster).
    let sim = env.path("ssd.sim");
    let s = sim.to_str().unwrap();
    for args in [&["sim", "create", s, "--device-size", "1G"][..], &["sim", "write", s, "--length", "64M"]] {
        assert!(output(env.reseq().args(args)).status.success());
    }
    let bench = |prom: &str| {
        let out = output(
            env.reseq()
                .args(["rewrite", &format!("sim:{s}"), "--bench", "--bench-length", "64M", "--json", "--metrics-file"])
                .arg(env.path(prom)),
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        json_report(&out)["verdict"]["verdict"].clone()
    };
    assert_eq!(bench("flat.prom"), "no_measurable_change");
    let fragment = ["sim", "fragment", s, "--length", "64M", "--random-writes", "64M"];
    assert!(output(env.reseq().args(fragment)).status.success());
    assert_eq!(bench("faster.prom"), "faster");

    // A fleet of four hosts, each with one of these runs' metrics file.
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/packaging/prometheus/reseq-alerts.yml");
    let host = |instance: &'static str, prom: &str| Host {
        instance,
        samples: parse_metrics(&std::fs::read_to_string(env.path(prom)).unwrap()),
        fire: vec![],
    };
    let mut fleet = [
        host("db1:9100", "good.prom"),
        host("db2:9100", "failed.prom"),
        host("db3:9100", "flat.prom"),
        host("db4:9100", "faster.prom"),
    ];
    // Every metric the rules name is one that reseq writes (a misspelt name would leave
    // its alert silent for ever, and "silent" below would prove nothing).
    let text = std::fs::read_to_string(rules).unwrap();
    for name in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("reseq_")) {
        assert!(
            fleet.iter().any(|h| h.samples.iter().any(|s| s.name == name)),
            "the alert rules use {name}, which no run's metrics file has"
        );
    }
    // What fires at 10 minutes (past the failure's `for: 5m`): the failure on db2 with
    // its exit code, the drive that did not benefit on db3; nothing on db1 and db4.
    let summary = |h: &Host, alert: &str| {
        let (instance, target) = (h.instance, h.target());
        match alert {
            "ReseqRunFailed" => format!("reseq on {instance} ({target}) failed with exit code 4"),
            "ReseqNoMeasurableChange" => {
                format!("re-sequencing {target} on {instance} made no measurable change: this drive may not benefit")
            }
            _ => format!("reseq has not run on {instance} ({target}) for two weeks"),
        }
    };
    fleet[1].fire = vec![("ReseqRunFailed", summary(&fleet[1], "ReseqRunFailed"))];
    fleet[2].fire = vec![("ReseqNoMeasurableChange", summary(&fleet[2], "ReseqNoMeasurableChange"))];
    let stale: Vec<(&Host, String)> = fleet.iter().map(|h| (h, summary(h, "ReseqRunStale"))).collect();
    let test = promtool_test(rules, &fleet, Some(&stale));
    let path = env.path("alerts-test.yml");
    std::fs::write(&path, &test).unwrap();
    eprintln!("--- {}:\n{test}", path.display());
    let out = output(Command::new("promtool").args(["test", "rules"]).arg(&path));
    assert!(
        out.status.success(),
        "the alert rules on the runs' metrics:\n{}{}\n(the test file:\n{test})",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    // And promtool does compare: the good run taken for a failed one is a failed test.
    fleet[0].fire = vec![("ReseqRunFailed", summary(&fleet[0], "ReseqRunFailed"))];
    std::fs::write(&path, promtool_test(rules, &fleet, None)).unwrap();
    let out = output(Command::new("promtool").args(["test", "rules"]).arg(&path));
    assert_eq!(out.status.code(), Some(1), "promtool passed a test that must fail");
    drop(mnt);
    drop(lo);
}

/// A host of the fleet: the `instance` label a Prometheus scrape of its node_exporter
/// adds, the samples of its metrics file, and the alerts (name, summary) that must fire.
struct Host {
    instance: &'static str,
    samples: Vec<Sample>,
    fire: Vec<(&'static str, String)>,
}

impl Host {
    fn target(&self) -> &str {
        label(&self.samples[0].labels, "target")
    }

    /// The labels of its series and alerts: the file's, and the scrape's.
    fn labels(&self) -> Vec<(String, String)> {
        let scrape = [("instance", self.instance), ("job", "node")];
        self.samples[0].labels.iter().cloned().chain(scrape.map(|(k, v)| (k.to_string(), v.to_string()))).collect()
    }
}

/// One sample of a Prometheus text file: `name{labels} value`.
struct Sample {
    name: String,
    /// Label names and values (unescaped).
    labels: Vec<(String, String)>,
    value: f64,
}

/// The samples of a Prometheus textfile (the `# HELP`/`# TYPE` lines skipped).
fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
        let (name, mut rest) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"))),
            None => (series, ""),
        };
        let mut labels = Vec::new();
        while let Some((key, after)) = rest.split_once("=\"") {
            // The value ends at the first `"` not escaped by a backslash.
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => panic!("bad escape: {line}"),
                    },
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => panic!("unclosed label value: {line}"),
                }
            };
            labels.push((key.trim_start_matches(',').to_string(), value));
            rest = &after[end + 1..];
        }
        let value = value.parse().unwrap_or_else(|e| panic!("{line}: {e}"));
        out.push(Sample { name: name.to_string(), labels, value });
    }
    assert!(!out.is_empty(), "no samples in the metrics file");
    out
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> &'a str {
    labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no label {key}"))
}

/// A `promtool test rules` file for `rules` over the fleet's samples, as a Prometheus
/// scraping the hosts' node_exporters sees them while their textfile collectors keep
/// exposing the metrics files the runs left:
/// - scraped every minute for 30 minutes: at 2 minutes the failure alert has not fired
///   yet (its `for: 5m`); at 10 minutes exactly the hosts' `fire` alerts have;
/// - with `stale`, scraped daily for 16 days, no run since: nothing stale at 13 days,
///   and at 15 days exactly `stale` (host, summary).
///
/// promtool's clock starts at 0, so each host's run ends at time 0: its timestamp
/// metric's value is shifted by the run's own time (to 0); every other value is the
/// file's.
fn promtool_test(rules: &str, fleet: &[Host], stale: Option<&[(&Host, String)]>) -> String {
    use std::fmt::Write as _;
    let quoted = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let series = |y: &mut String, steps: u32| {
        y.push_str("    input_series:\n");
        for h in fleet {
            let finished =
                h.samples.iter().find(|s| s.name == "reseq_last_run_timestamp_seconds").expect("a timestamp").value;
            let selector: Vec<String> = h
                .labels()
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")))
                .collect();
            for s in &h.samples {
                let v = if s.name == "reseq_last_run_timestamp_seconds" { s.value - finished } else { s.value };
                let series = format!("{}{{{}}}", s.name, selector.join(","));
                let _ = writeln!(y, "      - series: {}\n        values: '{v}+0x{steps}'", quoted(&series));
            }
        }
    };
    // An alert's labels: its series' (the metric's name dropped), and `alertname`,
    // which promtool adds.
    let check = |y: &mut String, at: &str, alert: &str, firing: &[(&Host, &str)]| {
        let _ = writeln!(y, "      - eval_time: {at}\n        alertname: {alert}");
        if firing.is_empty() {
            y.push_str("        exp_alerts: []\n");
            return;
        }
        y.push_str("        exp_alerts:\n");
        for (h, summary) in firing {
            y.push_str("          - exp_labels:\n");
            for (k, v) in h.labels() {
                let _ = writeln!(y, "              {k}: {}", quoted(&v));
            }
            let _ = writeln!(y, "            exp_annotations:\n              summary: {}", quoted(summary));
        }
    };
    let mut y = format!("rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n", quoted(rules));
    series(&mut y, 30);
    y.push_str("    alert_rule_test:\n");
    check(&mut y, "2m", "ReseqRunFailed", &[]);
    for alert in ["ReseqRunFailed", "ReseqRunStale", "ReseqNoMeasurableChange"] {
        let firing: Vec<(&Host, &str)> = fleet
            .iter()
            .flat_map(|h| h.fire.iter().filter(|(a, _)| *a == alert).map(move |(_, s)| (h, s.as_str())))
            .collect();
        check(&mut y, "10m", alert, &firing);
    }
    if let Some(stale) = stale {
        y.push_str("  - interval: 1d\n");
        series(&mut y, 16);
        y.push_str("    alert_rule_test:\n");
        check(&mut y, "13d", "ReseqRunStale", &[]);
        let firing: Vec<(&Host, &str)> = stale.iter().map(|(h, s)| (*h, s.as_str())).collect();
        check(&mut y, "15d", "ReseqRunStale", &firing);
    }
    y
}
