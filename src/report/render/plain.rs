//! The run in plain words, for a reader who is not an engineer (the top of the HTML
//! page): no device names, chunk sizes, percentiles or statistics.

use crate::engine::EngineStats;
use crate::measure::bench::{BenchResult, PRESSURE_CHANGE};
use crate::measure::verdict::{FREED_SHARE, Finding, Verdict};
use crate::report::{Report, Verification};
use crate::support::units::{human_bytes, human_rate};

/// (label, sentence) pairs: what was done, the effect, data safety, the pauses, how sure
/// the measurement is, and whether there are warnings.
pub(crate) fn lines(r: &Report) -> Vec<(&'static str, String)> {
    let mut out = vec![("What was done", done(r))];
    match (&r.verdict, &r.bench) {
        (Some(v), _) => out.push(("Effect", effect(v))),
        (None, Some(b)) => out.push(("Read speed", format!("about {}", human_rate(b.median_bytes_per_second)))),
        (None, None) if r.results.is_some() => out.push(("Effect", "not measured".into())),
        _ => {}
    }
    if let Some(x) = &r.results {
        out.push(("Data safety", safety(r, x).into()));
        let waited = if x.windows > 0 && x.total_frozen_seconds > 0.0 {
            "; programs writing to them waited meanwhile"
        } else {
            ""
        };
        out.push(("Pauses", paused(x) + waited));
    }
    if let Some(v) = &r.verdict {
        out.push(("How sure", how_sure(r, v)));
    }
    if !r.warnings.is_empty() {
        out.push(("Warnings", format!("{}, listed in the details for engineers", r.warnings.len())));
    }
    out
}

/// The run in one sentence a manager can read: the effect, whether anything was lost,
/// and how long the filesystems were paused.
pub(crate) fn headline(r: &Report) -> Option<String> {
    let stats = r.results.as_ref()?;
    let effect = match r.verdict.as_ref().map(|v| (v.verdict, v.speedup)) {
        Some((Finding::Faster, x)) => format!("Reads of the rewritten data are {x:.1}× faster"),
        Some((Finding::Slower, x)) => {
            format!("Reads of the rewritten data are {:.1}× slower", 1.0 / x.max(f64::MIN_POSITIVE))
        }
        Some((Finding::NoMeasurableChange, _)) => "Reads of the rewritten data are no faster, as measured".into(),
        Some((Finding::Unreliable, _)) => "The speed before and after could not be compared reliably".into(),
        None => format!("{} rewritten in place", human_bytes(stats.bytes_written)),
    };
    let kept = match (r.verification, all_verified(r, stats)) {
        (Verification::Passed, _) | (Verification::Incomplete, true) => {
            "every byte written read back and checked: nothing lost"
        }
        (Verification::Off, _) => "not verified (--no-verify)",
        (Verification::Failed, _) | (Verification::Incomplete, false) => "see the outcome below",
    };
    Some(format!("{effect}; {kept}; {}.", paused(stats)))
}

/// How long the filesystems were paused, in all and at most at a time.
fn paused(x: &EngineStats) -> String {
    if x.windows == 0 || x.total_frozen_seconds == 0.0 {
        return "no filesystem was paused".into();
    }
    format!(
        "filesystems paused {:.1} s in all, at most {:.1} s at a time",
        x.total_frozen_seconds, x.longest_freeze_seconds
    )
}

/// Whether the run finished, in a few words.
pub(crate) fn outcome(r: &Report) -> String {
    if r.outcome.exit_code == 0 {
        return "Finished.".into();
    }
    let what = r.outcome_cause();
    format!(
        "Did not finish: {}. The details for engineers say where it stopped.",
        what.split(';').next().unwrap_or(what)
    )
}

fn done(r: &Report) -> String {
    let Some(x) = &r.results else {
        return match r.command.as_str() {
            "rewrite" if r.dry_run => "nothing was changed: this was a plan only".into(),
            "rewrite" => "nothing was rewritten".into(),
            _ => "the read speed was measured; nothing was changed".into(),
        };
    };
    let files = r.files.as_ref().map(|f| format!("{} files, ", f.len())).unwrap_or_default();
    format!(
        "{files}{} of data read and written back in place, so that the drive stores it in order again",
        human_bytes(x.bytes_written)
    )
}

fn effect(v: &Verdict) -> String {
    match v.verdict {
        Finding::Faster => format!("reading the rewritten data is now {:.1} times as fast as before", v.speedup),
        Finding::Slower => {
            format!("reading the rewritten data is {:.1} times slower than before", 1.0 / v.speedup.max(1e-9))
        }
        Finding::NoMeasurableChange => "no change in reading speed that stands out from ordinary variation".into(),
        Finding::Unreliable => "unknown: the speed before and after could not be compared reliably".into(),
    }
}

/// A run that stopped early (`incomplete`) read back every chunk it wrote: verified,
/// not failed. Only `failed` is a check that did not pass.
fn all_verified(r: &Report, x: &EngineStats) -> bool {
    r.verification == Verification::Incomplete && x.bytes_verified >= x.bytes_written
}

fn safety(r: &Report, x: &EngineStats) -> &'static str {
    match r.verification {
        Verification::Passed => "every byte written was read back and compared with the original: nothing lost",
        Verification::Off => "not checked after writing (checking was turned off)",
        Verification::Failed => "the check after writing did not pass: see the details for engineers",
        Verification::Incomplete if x.bytes_written == 0 => "nothing was written before the run stopped",
        Verification::Incomplete if all_verified(r, x) => {
            "every byte written was read back and compared with the original: nothing lost (the run stopped before the end; see the outcome)"
        }
        Verification::Incomplete => {
            "not every byte written was read back (checking was off, or the run stopped first): see the details for engineers"
        }
    }
}

/// How far the verdict can be trusted, and why not where it cannot.
fn how_sure(r: &Report, v: &Verdict) -> String {
    let (before, after) = (r.bench_before.as_ref().map_or(0, |b| b.passes.len()), r.bench_after.as_ref());
    let more = v.closer_look.as_ref().map_or(0, |c| c.passes.len());
    let after = after.map_or(0, |b| b.passes.len()) + more;
    let measured = format!("measured {before} times before and {after} times after");
    let closer = if more > 0 { " (the first results were close, so more were taken to decide)" } else { "" };
    match v.verdict {
        Finding::Unreliable => format!("not sure: {}", why_unsure(r, v)),
        Finding::NoMeasurableChange => {
            format!("{measured}{closer}; the speeds differ by less than repeated readings of the same data do")
        }
        Finding::Faster | Finding::Slower => {
            let lasted = v
                .recheck
                .as_ref()
                .map(|c| format!(", and it lasted when measured again {:.0} s later", c.after_seconds));
            format!(
                "sure: {measured}{closer}; the change is larger than repeated readings of the same data vary{}",
                lasted.unwrap_or_default()
            )
        }
    }
}

/// Why an "unreliable" verdict is, in plain words.
fn why_unsure(r: &Report, v: &Verdict) -> String {
    let benches: Vec<&BenchResult> = [&r.bench_before, &r.bench_after].into_iter().flatten().collect();
    if benches.iter().any(|b| b.cache.as_ref().is_some_and(|c| c.cache_suspected)) {
        return "a cache beneath the drive (for example the memory of a virtual machine's host) could have answered the reads, so the drive's own speed is not known".into();
    }
    if let Some(c) = v.recheck.as_ref().filter(|c| c.verdict != Finding::Unreliable) {
        return format!(
            "the speed-up faded within {:.0} s, as a cache's does; a lasting improvement would have stayed",
            c.after_seconds
        );
    }
    let loads: Vec<_> = benches.iter().filter_map(|b| b.host_pressure.as_ref()).collect();
    if let [a, b] = loads[..]
        && ((a.cpu_some - b.cpu_some).abs() > PRESSURE_CHANGE || (a.io_some - b.io_some).abs() > PRESSURE_CHANGE)
    {
        return "the machine was much busier during one measurement than during the other".into();
    }
    let measured = r.bench_after.as_ref().map_or(0, |b| b.params.length_bytes).max(1);
    if v.measured_bytes_freed.is_some_and(|f| f as f64 / measured as f64 > FREED_SHARE) {
        return "much of the measured data was deleted during the run, so before and after did not read the same data"
            .into();
    }
    "the measurement after the rewrite was interrupted, could not be repeated, or its test drive fell behind".into()
}
