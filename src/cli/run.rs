//! The `reseq` command: parse, lower the arguments to options (`cli::lower`,
//! `cli::hiargs`), dispatch to the command, print, exit. `main.rs` only calls [`main`].

use std::io::IsTerminal;

use serde::Serialize;

use crate::cli::hiargs::Rewrite;
use crate::cli::{Cli, Command, OutputArgs, RewriteArgs, lower};
use crate::commands::{measure, restore, simulate, status};
use crate::options::sim::SimulateOptions;
use crate::report::Report;
use crate::report::render::{Format, render, write_atomically};
use crate::support::error::Result;
use crate::support::exit_codes::ExitCode;
use crate::support::output::for_stderr;

/// The whole of `reseq`: what `main` runs.
pub fn main() -> std::process::ExitCode {
    keep_panics_off_a_frozen_stderr();
    // A panic is a bug: the panic hook has printed where. Exit 1 (internal error), as the
    // exit codes document, not Rust's 101. (Inside a freeze window the engine aborts
    // instead: exit status 134.)
    std::panic::catch_unwind(run).unwrap_or_else(|_| {
        let text = "reseq: internal error (a bug): the panic above stopped it (exit 1); the guardian thaws whatever is still frozen as reseq exits. `reseq status` shows whether a rewrite was left unfinished (then --resume continues it)";
        match crate::support::output::is_held() {
            true => crate::engine::rescue::save_panic_note(std::process::id(), text),
            false => {
                // Thawed by now: what the panic hook kept while frozen can be printed.
                let run_dir = crate::engine::rescue::run_dir();
                let kept = crate::engine::rescue::take_panic_note(&run_dir, std::process::id() as i32);
                eprint!("{}", kept.unwrap_or_default());
                eprintln!("{text}");
            }
        }
        std::process::ExitCode::from(ExitCode::Internal.code() as u8)
    })
}

/// While a window is frozen, stderr may be a file on the frozen filesystem: a panic
/// message written there would block reseq, and the thaw with it. The text goes to the
/// run directory instead, and the guardian prints it after the thaw.
fn keep_panics_off_a_frozen_stderr() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| match crate::support::output::is_held() {
        true => crate::engine::rescue::save_panic_note(std::process::id(), &format!("reseq: {info}")),
        false => default(info),
    }));
}

fn run() -> std::process::ExitCode {
    let mut cli = Cli::try_parse_given(std::env::args_os()).unwrap_or_else(|e| e.exit());
    // A job file is a rewrite written down: load it and run it as one.
    if let Command::Run { config, dry_run } = &cli.command {
        match crate::cli::config::load(config) {
            Ok(mut job) => {
                job.args.dry_run |= *dry_run;
                cli.command = Command::Rewrite(job.args);
                cli.quiet |= job.quiet && cli.verbose == 0;
            }
            Err(e) => return finish(Err(e)),
        }
    }
    crate::support::output::init_logging(cli.verbose, cli.quiet);
    let quiet = cli.quiet;
    if let Some(Err(e)) = cli.command.output().map(OutputArgs::check_metrics_file) {
        return finish(Err(e));
    }
    // A report's detail follows -v, whichever command made it.
    let show_report = |run, output: &OutputArgs| print_report(every_file(run, cli.verbose), output, quiet);
    match &cli.command {
        Command::Rewrite(a) => show_report(rewrite(a, quiet), &a.output),
        Command::Bench(a) => show_report(measure::run_bench(&lower::bench(a)), &a.output),
        Command::Scan(a) => show_report(measure::run_scan(&lower::scan(a)), &a.output),
        Command::Estimate(a) => show_report(measure::run_estimate(&lower::estimate(a)), &a.output),
        Command::Demo(a) => demo(a, quiet),
        Command::Report(a) => finish(rerender(&a.report, a.format, cli.verbose)),
        Command::Thaw { json } => finish(thaw(*json)),
        Command::Status { state_dir, json } => finish(status::run(state_dir).map(|s| show(&s, *json, s.to_text()))),
        Command::Restore(a) => finish(restore::run(&lower::restore(a)).map(|s| show(&s, a.json, s.to_text()))),
        Command::Generate { dir } => finish(crate::cli::generate::generate(dir)),
        Command::Run { .. } => unreachable!("replaced by the job's rewrite above"),
        Command::Simulate(a) => {
            print_simulation(lower::simulate(a).and_then(|o| simulate::simulate(&o, quiet)), a.json)
        }
        Command::Sim { command } => finish(
            lower::sim_step(command)
                .and_then(|s| simulate::sim_command(&s, quiet))
                .map(|v| println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default())),
        ),
    }
}

/// `reseq rewrite`: a simulated SSD, files, or a block device.
fn rewrite(a: &RewriteArgs, quiet: bool) -> (Report, Result<()>) {
    match crate::cli::hiargs::rewrite(a) {
        // A simulated SSD: the same engine, through `reseq sim rewrite`.
        Ok(Rewrite::Sim(rw, bench)) => simulate::rewrite_report(&rw, bench.as_ref(), quiet),
        Ok(Rewrite::Run(o)) => crate::rewrite::run(&o, quiet),
        // Refused before it began: its options did not hold together.
        Err(e) => Report::of_run("rewrite", a.dry_run, &a.targets, |_| Err(e)),
    }
}

/// `-v`: the text of a file-mode run lists every file (else those with a problem).
fn every_file((mut r, result): (Report, Result<()>), verbose: u8) -> (Report, Result<()>) {
    r.every_file = verbose > 0;
    (r, result)
}

fn demo(a: &crate::cli::DemoArgs, quiet: bool) -> std::process::ExitCode {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("reseq demo: not root, so no loop device; running the simulated SSD instead (reseq simulate)");
        return print_simulation(simulate::simulate(&SimulateOptions::default(), quiet), a.json);
    }
    let (report, result) = crate::commands::demo::run(a.size, a.no_fuse, quiet);
    match report {
        Some(r) => print_report((r, result), &OutputArgs { json: a.json, ..Default::default() }, quiet),
        None => finish(result),
    }
}

/// Prints a command's report as asked (and the metrics file), then exits with its outcome.
fn print_report((r, result): (Report, Result<()>), output: &OutputArgs, quiet: bool) -> std::process::ExitCode {
    if result.is_err() && r.freeze_bound.is_some() && !r.dry_run {
        say(crate::host::thaw::after_abnormal_stop());
    }
    // The reason first, then the report, whose last line is the outcome: read top down,
    // the outcome line came before what it was about.
    let code = finish(result);
    // -q quiets the log, not the result.
    let format = output.format();
    // A dry run's warnings are in its plan's text; in another format, the log says them.
    if r.dry_run && format != Format::Text {
        r.warnings.iter().for_each(|w| log::warn!("{w}"));
    }
    if format == Format::Json {
        // Streamed: a file-mode run's report of 100,000 files is 70 MiB of JSON.
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let written = serde_json::to_writer_pretty(&mut out, &r).map_err(std::io::Error::from);
        if let Err(e) = written.and_then(|()| writeln!(out)).and_then(|()| out.flush()) {
            eprintln!("reseq: writing the report to standard output: {e}");
        }
    } else {
        print!("{}", render(&r, format));
    }
    // `--json > run.json` at a terminal: the operator still sees the verdict.
    if format != Format::Text && !quiet && !std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        eprint!("{}", render(&r, Format::Text));
    }
    // A dry run did nothing worth a metric.
    if let Some(path) = output.metrics_file.as_ref().filter(|_| !r.dry_run)
        && let Err(e) = write_atomically(path, &render(&r, Format::Prom))
    {
        say(crate::support::error::error_chain(&e));
    }
    code
}

/// Prints a summary as JSON or as its text.
fn show<T: Serialize>(v: &T, json: bool, text: String) {
    if json {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        print!("{text}");
    }
}

fn thaw(json: bool) -> Result<()> {
    let summary = crate::host::thaw::run(&crate::engine::rescue::run_dir())?;
    show(&summary, json, summary.to_text());
    crate::host::thaw::live_guardian_error(&summary).map_or(Ok(()), Err)
}

fn rerender(path: &std::path::Path, format: Format, verbose: u8) -> Result<()> {
    // A report that is not there or not readable is bad input (exit 2): not an I/O
    // failure of a run, nor a refusal of something unsafe.
    let text = std::fs::read_to_string(path).map_err(|e| {
        let denied = e.kind() == std::io::ErrorKind::PermissionDenied;
        let hint = if denied { " (run as root, or fix its permissions)" } else { "" };
        crate::support::error::Error::Usage(format!("reading the report {}: {e}{hint}", path.display()))
    })?;
    let mut report: Report = serde_json::from_str(&text)
        .map_err(|e| crate::support::error::Error::Usage(format!("{} is not a reseq report: {e}", path.display())))?;
    report.every_file = verbose > 0;
    print!("{}", render(&report, format));
    Ok(())
}

fn print_simulation(r: Result<simulate::Experiment>, json: bool) -> std::process::ExitCode {
    finish(r.map(|e| show(&e, json, e.to_text())))
}

/// Says a command's error, if any, and gives its exit code.
fn finish(result: Result<()>) -> std::process::ExitCode {
    let Err(e) = result else { return ExitCode::Success.into() };
    say(crate::support::error::error_chain(&e));
    e.exit_code().into()
}

/// A message of reseq's own on stderr, wrapped at a terminal (`for_stderr`).
fn say(message: impl std::fmt::Display) {
    eprint!("{}", for_stderr(&format!("reseq: {message}\n")));
}
