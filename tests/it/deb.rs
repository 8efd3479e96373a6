//! The Debian package: `cargo deb` makes it (of the binary under test), `dpkg -i` installs a working reseq with its
//! man page, completions, config and units, and `dpkg -r`/`-P` remove it cleanly.

use std::path::Path;
use std::process::Command;

use crate::common::*;

/// Where the test records that it is installing the package: a killed test (SIGKILL, a
/// timeout) cannot purge it, and the next run must tell that leftover from a reseq an
/// admin installed, which it never touches.
const MARK: &str = "/var/lib/reseq-test-deb";

/// Holds MARK's lock for the test's life, so that two suites on one machine take turns
/// (the kernel drops the lock when its holder dies, however it dies), and purges the
/// package on drop, whatever the test did.
struct Installed {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl Installed {
    fn take() -> Installed {
        let file = std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(MARK).unwrap();
        let lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e).unwrap();
        let left = std::fs::read_to_string(MARK).unwrap_or_default();
        if left.starts_with("installing") {
            // The lock was free: whoever wrote this is dead. Its package is ours to purge.
            eprintln!("purging the reseq package a killed run of this test left ({})", left.trim());
            run_cmd(Command::new("dpkg").args(["-P", "reseq"])).expect("dpkg -P of a killed test's package");
            std::fs::write(MARK, "").unwrap();
        }
        Installed { _lock: lock }
    }

    fn mark(&self) {
        std::fs::write(MARK, format!("installing (test pid {})\n", std::process::id())).unwrap();
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if std::fs::read_to_string(MARK).unwrap_or_default().starts_with("installing") {
            let _ = Command::new("dpkg").args(["-P", "reseq"]).output();
            let _ = std::fs::write(MARK, "");
        }
    }
}

#[test]
fn debian_package_installs_and_removes_cleanly() {
    if !require(&["cargo-deb", "dpkg", "man"]) {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let env = TestEnv::new();
    // The generated assets the package ships.
    let out = output(env.reseq().arg("generate").arg(format!("{root}/target/generated")));
    assert!(out.status.success());
    // The binary every other test runs (`cargo test`'s, already built), packaged as
    // users get it: a release build here took 138 s of both cores in the middle of the
    // suite, for a package whose files and scripts are what this test is about.
    let out = output(
        Command::new("cargo")
            .args(["deb", "--quiet", "--fast", "--no-build", "--profile", "dev", "--output"])
            .arg(env.path("reseq.deb"))
            .current_dir(root),
    );
    assert!(out.status.success(), "cargo deb failed");
    let installed = Installed::take();
    if Path::new("/usr/bin/reseq").exists() {
        panic!("/usr/bin/reseq exists already: this test will not overwrite a reseq it did not install");
    }
    installed.mark();
    run_cmd(Command::new("dpkg").arg("-i").arg(env.path("reseq.deb"))).expect("dpkg -i");
    let v = run_cmd(Command::new("/usr/bin/reseq").arg("--version")).unwrap();
    assert!(v.contains(env!("CARGO_PKG_VERSION")), "{v}");
    let man = run_cmd(Command::new("man").args(["-w", "reseq"])).unwrap();
    assert!(man.trim().starts_with("/usr/share/man/man1/reseq.1"), "{man}");
    for f in [
        "/lib/systemd/system/reseq@.service",
        "/lib/systemd/system/reseq@.timer",
        "/etc/reseq/example.toml",
        "/usr/share/bash-completion/completions/reseq",
        "/usr/share/zsh/vendor-completions/_reseq",
        "/usr/share/fish/vendor_completions.d/reseq.fish",
        // The documents OPERATIONS.md and SAFETY.md link to.
        "/usr/share/doc/reseq/README.md",
        "/usr/share/doc/reseq/REPORT-SCHEMA.md",
    ] {
        assert!(Path::new(f).exists(), "{f} is not installed");
    }
    let about = run_cmd(Command::new("dpkg-query").args(["-W", "-f", "${Description}", "reseq"])).unwrap();
    assert!(!about.contains("generated from Rust crate"), "the package's first line: {about}");
    let listed = run_cmd(Command::new("dpkg").args(["-L", "reseq"])).unwrap();
    run_cmd(Command::new("dpkg").args(["-r", "reseq"])).expect("dpkg -r");
    assert!(!Path::new("/usr/bin/reseq").exists());
    assert!(Path::new("/etc/reseq/example.toml").exists(), "a removed (not purged) package keeps its conffile");
    run_cmd(Command::new("dpkg").args(["-P", "reseq"])).expect("dpkg -P");
    for f in listed.lines().filter(|l| l.contains("reseq")) {
        assert!(!Path::new(f).exists(), "{f} left behind");
    }
}
