//! Packaging: the systemd units verify cleanly, and a job config runs.

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
    for cap in ["CAP_SYS_ADMIN", "CAP_SYS_NICE", "CAP_IPC_LOCK", "CAP_SYS_RESOURCE"] {
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
    // parse keeps typos out (no cluster or promtool runs here).
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
