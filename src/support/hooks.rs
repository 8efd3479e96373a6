//! Test-only fault and delay injection, compiled in only with the `fault-injection`
//! feature (the test suite builds with it; release builds compile every hook to nothing).
//!
//! `RESEQ_FAULTS` holds comma-separated rules:
//! - `read-error@OFFSET`, `write-error@OFFSET`: the read or write of the chunk that
//!   contains OFFSET fails with EIO.
//! - `corrupt@OFFSET`: the second read of the chunk containing OFFSET (the read-back)
//!   gets one byte flipped in memory, so verification must catch it.
//! - `delay@POINT#N=MS` (N may be `*` for every hit): sleep at the N-th hit of POINT.
//! - `pause@POINT#N=PATH`: at the N-th hit of POINT, create `PATH.paused` and wait
//!   (up to 60 s) until `PATH.go` exists: a test acts at exactly that point.
//! - `mark@POINT#N=PATH`: create PATH at the N-th hit of POINT and go on (a test learns
//!   from outside when reseq got there, without holding it).
//! - `kill@POINT#N`: SIGKILL reseq itself at the N-th hit of POINT.
//! - `panic@POINT#N`: panic at the N-th hit of POINT (a bug, on whichever thread hits it).
//! - `ebusy-open`: opening a mounted device for writing fails with EBUSY, as on kernels
//!   built with CONFIG_BLK_DEV_WRITE_MOUNTED=n (not reproducible on this CI kernel).
//! - `rotational`: the device is taken to be rotational (no test disk spins).
//! - `mount-order`: filesystems are frozen in the order they are found, dependents or
//!   not (the guardian's own defence against a freeze that waits on another).
//! - `slow@START-END=MS`: every benchmark read touching `[START, END)` takes MS longer
//!   (a region made slow on purpose, for `scan`).
//! - `slow-file@TEXT=MS`: every benchmark read of a file whose path contains TEXT takes
//!   MS longer (a slow file, for file mode's `--only-slow`).
//! - `trial-from=SIZE`: the chunk-size trial runs on runs of SIZE or more instead of
//!   16 GiB (tests on small devices).
//! - `trial-stretch=SIZE`: and each of its stretches rewrites SIZE instead of 512 MiB.
//!
//! POINTs: `planned` (device mode: planned and benchmarked, before the device is
//! taken), `window-start` (after the freeze), `before-write` (before asking to write),
//! `after-permit` (granted, before the write syscall), `after-write`, `after-verify`,
//! `after-journal`, `after-read` (the reader stage, a chunk read ahead), `window-end`
//! (before the thaw), `after-thaw`, `before-trim` (thawed,
//! before the first FITRIM slice), `trim-slice` (before each FITRIM slice).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoOp {
    Read,
    Write,
}

#[cfg(feature = "fault-injection")]
mod imp {
    use super::IoOp;
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    #[derive(Debug)]
    enum Rule {
        Io(IoOp, u64),
        Corrupt(u64),
        Delay(String, Option<u64>, u64),
        Pause(String, u64, String),
        Mark(String, u64, String),
        Kill(String, u64),
        Panic(String, u64),
        /// `ebusy-open`, `rotational`, `mount-order`.
        Flag(String),
        Slow(u64, u64, u64),
        SlowFile(String, u64),
        /// `trial-from=SIZE`, `trial-stretch=SIZE`.
        Size(String, u64),
    }

    struct State {
        rules: Vec<Rule>,
        hits: Mutex<HashMap<String, u64>>,
        /// Reads seen per corrupt offset (the first is the real read, the second the read-back).
        corrupt_reads: Mutex<HashMap<u64, u64>>,
    }

    fn state() -> &'static State {
        static S: OnceLock<State> = OnceLock::new();
        S.get_or_init(|| {
            let text = std::env::var("RESEQ_FAULTS").unwrap_or_default();
            let rules = text.split(',').filter(|r| !r.trim().is_empty()).map(|r| parse(r.trim())).collect();
            State { rules, hits: Mutex::new(HashMap::new()), corrupt_reads: Mutex::new(HashMap::new()) }
        })
    }

    fn parse(rule: &str) -> Rule {
        fn fail(rule: &str) -> ! {
            panic!("bad RESEQ_FAULTS rule '{rule}'")
        }
        let num = |s: &str| crate::support::units::parse_size(s).unwrap_or_else(|_| fail(rule));
        if let Some((name @ ("trial-from" | "trial-stretch"), size)) = rule.split_once('=') {
            return Rule::Size(name.to_string(), num(size));
        }
        let (kind, rest) = rule.split_once('@').unwrap_or((rule, ""));
        match kind {
            "ebusy-open" | "rotational" | "mount-order" if rest.is_empty() => Rule::Flag(kind.to_string()),
            "read-error" => Rule::Io(IoOp::Read, num(rest)),
            "write-error" => Rule::Io(IoOp::Write, num(rest)),
            "corrupt" => Rule::Corrupt(num(rest)),
            "slow-file" => {
                let (text, ms) = rest.split_once('=').unwrap_or_else(|| fail(rule));
                Rule::SlowFile(text.to_string(), ms.parse().unwrap_or_else(|_| fail(rule)))
            }
            "slow" => {
                let (range, ms) = rest.split_once('=').unwrap_or_else(|| fail(rule));
                let (a, b) = range.split_once('-').unwrap_or_else(|| fail(rule));
                Rule::Slow(num(a), num(b), ms.parse().unwrap_or_else(|_| fail(rule)))
            }
            "delay" => {
                let (at, ms) = rest.split_once('=').unwrap_or_else(|| fail(rule));
                let (point, n) = at.split_once('#').unwrap_or((at, "1"));
                let n = if n == "*" { None } else { Some(n.parse().unwrap_or_else(|_| fail(rule))) };
                Rule::Delay(point.to_string(), n, ms.parse().unwrap_or_else(|_| fail(rule)))
            }
            "pause" | "mark" => {
                let (at, path) = rest.split_once('=').unwrap_or_else(|| fail(rule));
                let (point, n) = at.split_once('#').unwrap_or((at, "1"));
                let (point, n, path) = (point.to_string(), n.parse().unwrap_or_else(|_| fail(rule)), path.to_string());
                if kind == "pause" { Rule::Pause(point, n, path) } else { Rule::Mark(point, n, path) }
            }
            "kill" | "panic" => {
                let (point, n) = rest.split_once('#').unwrap_or((rest, "1"));
                let n = n.parse().unwrap_or_else(|_| fail(rule));
                if kind == "kill" { Rule::Kill(point.to_string(), n) } else { Rule::Panic(point.to_string(), n) }
            }
            _ => fail(rule),
        }
    }

    pub(crate) fn point(name: &str) {
        let st = state();
        if st.rules.is_empty() {
            return;
        }
        let n = *st.hits.lock().unwrap().entry(name.to_string()).and_modify(|c| *c += 1).or_insert(1);
        for r in &st.rules {
            match r {
                Rule::Delay(p, when, ms) if p == name && when.is_none_or(|w| w == n) => {
                    std::thread::sleep(std::time::Duration::from_millis(*ms))
                }
                Rule::Pause(p, when, path) if p == name && *when == n => {
                    let _ = std::fs::write(format!("{path}.paused"), b"");
                    let t = std::time::Instant::now();
                    let go = std::path::PathBuf::from(format!("{path}.go"));
                    while !go.exists() && t.elapsed() < std::time::Duration::from_secs(60) {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
                Rule::Mark(p, when, path) if p == name && *when == n => {
                    let _ = std::fs::write(path, b"");
                }
                Rule::Kill(p, when) if p == name && *when == n => {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
                    std::thread::sleep(std::time::Duration::from_secs(60));
                }
                Rule::Panic(p, when) if p == name && *when == n => panic!("injected panic at {p}#{n}"),
                _ => {}
            }
        }
    }

    pub(crate) fn io_fault(op: IoOp, offset: u64, len: u64) -> std::io::Result<()> {
        for r in &state().rules {
            if let Rule::Io(o, at) = r
                && *o == op
                && (offset..offset + len).contains(at)
            {
                return Err(std::io::Error::from_raw_os_error(nix::libc::EIO));
            }
        }
        Ok(())
    }

    pub(crate) fn corrupt_read(offset: u64, buf: &mut [u8]) {
        for r in &state().rules {
            if let Rule::Corrupt(at) = r
                && (offset..offset + buf.len() as u64).contains(at)
            {
                let reads = *state().corrupt_reads.lock().unwrap().entry(*at).and_modify(|c| *c += 1).or_insert(1);
                if reads == 2 {
                    buf[(*at - offset) as usize] ^= 0x5a;
                }
            }
        }
    }

    pub(crate) fn open_error(mounted: bool) -> std::io::Result<()> {
        if mounted && flag("ebusy-open") {
            return Err(std::io::Error::from_raw_os_error(nix::libc::EBUSY));
        }
        Ok(())
    }

    /// The size a rule named `name` sets (`trial-from`, `trial-stretch`).
    pub(crate) fn size(name: &str) -> Option<u64> {
        state().rules.iter().find_map(|r| match r {
            Rule::Size(n, size) if n == name => Some(*size),
            _ => None,
        })
    }

    /// Whether a rule named `name` is set (`ebusy-open`, `rotational`, `mount-order`).
    pub(crate) fn flag(name: &str) -> bool {
        state().rules.iter().any(|r| matches!(r, Rule::Flag(n) if n == name))
    }

    pub(crate) fn read_delay(path: &std::path::Path, offset: u64, len: u64) {
        for r in &state().rules {
            let ms = match r {
                Rule::Slow(a, b, ms) if offset < *b && offset + len > *a => *ms,
                Rule::SlowFile(text, ms) if path.to_string_lossy().contains(text.as_str()) => *ms,
                _ => continue,
            };
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
}

#[cfg(not(feature = "fault-injection"))]
mod imp {
    use super::IoOp;
    #[inline(always)]
    pub(crate) fn point(_: &str) {}
    #[inline(always)]
    pub(crate) fn io_fault(_: IoOp, _: u64, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    #[inline(always)]
    pub(crate) fn corrupt_read(_: u64, _: &mut [u8]) {}
    #[inline(always)]
    pub(crate) fn open_error(_: bool) -> std::io::Result<()> {
        Ok(())
    }
    #[inline(always)]
    pub(crate) fn size(_: &str) -> Option<u64> {
        None
    }
    #[inline(always)]
    pub(crate) fn flag(_: &str) -> bool {
        false
    }
    #[inline(always)]
    pub(crate) fn read_delay(_: &std::path::Path, _: u64, _: u64) {}
}

pub(crate) use imp::*;
