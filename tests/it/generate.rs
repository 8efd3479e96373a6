//! The generated man page renders cleanly and the completions load.

use std::process::Command;

use crate::common::*;

#[test]
fn man_page_and_completions() {
    if !require(&["groff", "man", "bash"]) {
        return;
    }
    let env = TestEnv::new();
    let dir = env.path("gen");
    let out = output(env.reseq().arg("generate").arg(&dir));
    assert_eq!(out.status.code(), Some(0));
    // groff -ww: every warning on; a clean page prints none.
    let groff = Command::new("groff").args(["-ww", "-man", "-Tutf8", "-z"]).arg(dir.join("reseq.1")).output().unwrap();
    assert!(groff.status.success());
    assert_eq!(String::from_utf8_lossy(&groff.stderr), "", "groff warnings");
    let man = Command::new("man")
        .arg("-l")
        .arg(dir.join("reseq.1"))
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .output()
        .unwrap();
    assert!(man.status.success());
    let text = String::from_utf8_lossy(&man.stdout);
    for section in [
        "NAME",
        "SYNOPSIS",
        "EXIT STATUS",
        "FREEZE BOUND",
        "FILES",
        "RESEQ THAW",
        "RESEQ RESTORE",
        "RESCUE COPIES",
        "RESEQ REWRITE",
        "RESEQ BENCH",
        "RESEQ SCAN",
        "RESEQ SIMULATE",
        "RESEQ GENERATE",
        "EXAMPLES",
        "RESUMING",
    ] {
        assert!(text.contains(section), "the man page has no {section} section");
    }
    for needle in [
        "[values: text, json, md, html, prom]",
        "/etc/reseq/NAME.toml",
        "files-KEY.run",
        "files-KEY-DEVICE.journal",
        "reseq rewrite /dev/nvme0n1p3 --resume",
        "reseq@pgdata.timer",
    ] {
        assert!(text.contains(needle), "the man page lacks {needle}");
    }
    for code in reseq::testing::ExitCode::ALL {
        assert!(text.contains(code.describe()), "exit code {} is not documented", code.code());
    }
    let bash = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p reseq", dir.join("reseq.bash").display()))
        .output()
        .unwrap();
    assert!(bash.status.success(), "{}", String::from_utf8_lossy(&bash.stderr));
    assert!(String::from_utf8_lossy(&bash.stdout).contains("reseq"));
    for f in ["_reseq", "reseq.fish"] {
        let t = std::fs::read_to_string(dir.join(f)).unwrap();
        assert!(t.contains("rewrite") && t.contains("max-freeze"), "{f} lacks the rewrite options");
    }
}
