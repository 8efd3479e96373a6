//! The dry run's lines both modes print: the freeze's share, the guardian, the close.

/// The end of a dry run's plan: its warnings, and that it did nothing.
pub(crate) fn dry_run_end(warnings: &[String]) -> String {
    warnings.iter().map(|w| format!("  warning: {w}\n")).collect::<String>()
        + "  nothing was written or frozen (dry run)\n"
}

/// Where the guardian goes, and the priority it gets.
pub(crate) fn describe_guardian(p: &crate::host::cgroup::Placement) -> String {
    format!("  guardian: {}\n  guardian priority: {}\n", p.describe(), crate::host::hardening::expected())
}

/// How much of the run the filesystems stay frozen, and only the pauses let writers
/// through: as the prediction has it (frozen time over the whole run's), or without
/// one, from a window ending when one more chunk would not fit its budget, about 3/4 of
/// its bound (engine/pace.rs).
pub(crate) fn frozen_share(
    max_freeze: std::time::Duration,
    pause: std::time::Duration,
    rate: Option<u64>,
    predicted: Option<&crate::report::Prediction>,
) -> String {
    if rate.is_some() {
        return "  frozen: set by --rate: a window ends once the run is a quarter second ahead of its rate, and the pause after it makes up the time\n".into();
    }
    let (window, share) = match predicted.map(|p| (p.windows.expected, p)) {
        Some((0, _)) => return "  frozen: never: nothing to rewrite\n".into(),
        Some((1, p)) => {
            return format!(
                "  frozen: one window of about {}: writers wait that once\n",
                crate::support::units::human_seconds(p.frozen_seconds.expected)
            );
        }
        Some((n, p)) if n > 1 && p.duration_seconds.expected > 0.0 => {
            let frozen = p.frozen_seconds.expected;
            (frozen / n as f64, frozen / p.duration_seconds.expected)
        }
        _ => {
            let window = max_freeze.as_secs_f64() * 0.75;
            (window, window / (window + pause.as_secs_f64()).max(f64::MIN_POSITIVE))
        }
    };
    // A pause as long as a window frees writers half the time (in whole milliseconds:
    // the hint reads back as the option it names).
    let half = crate::support::units::format_duration(std::time::Duration::from_millis((window * 1e3) as u64));
    // Only when the pauses are shorter than the windows: a short run is mostly frozen
    // whatever its pause, since it has few of them.
    let hint = (share > 0.5 && pause.as_secs_f64() < window)
        .then(|| format!("; writers wait most of the run: --pause {half} would free them half the time"));
    format!(
        "  frozen: about {:.0} % of the run (windows of about {window:.2} s, pauses of {:.1} s){}\n",
        share * 100.0,
        pause.as_secs_f64(),
        hint.unwrap_or_default()
    )
}
