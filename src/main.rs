//! The `reseq` binary: parse, dispatch, print, exit. Everything else is in the library.

use clap::Parser;

use reseq::cli::{Cli, Command, OutputArgs, SimulateArgs};
use reseq::report::Report;
use reseq::report::render::{Format, render, write_atomically};
use reseq::support::exit_codes::ExitCode;

fn main() -> std::process::ExitCode {
    let mut cli = Cli::parse();
    reseq::support::output::init_logging(cli.verbose, cli.quiet);
    // A job file is a rewrite written down: load it and run it as one.
    if let Command::Run { config, dry_run } = &cli.command {
        match reseq::cli::config::load(config) {
            Ok(mut args) => {
                args.dry_run |= *dry_run;
                cli.command = Command::Rewrite(args);
            }
            Err(e) => return finish(Err(e)),
        }
    }
    let (report, output, result) = match &cli.command {
        Command::Rewrite(args) => {
            let (report, result) = match reseq::cli::hiargs::rewrite_options(args) {
                // A simulated SSD: the same engine, through `reseq sim rewrite`.
                Ok(o) if o.mode == reseq::options::rewrite::Mode::Sim => {
                    reseq::commands::simulate::rewrite_report(&o, cli.quiet)
                }
                Ok(o) => reseq::rewrite::run(&o, cli.quiet),
                Err(e) => {
                    let result = Err(e);
                    (reseq::rewrite::refused_report(&args.targets, args.dry_run, &result), result)
                }
            };
            (Some(report), args.output.clone(), result)
        }
        Command::Bench(args) => {
            let (report, result) = reseq::commands::measure::run_bench(args);
            (Some(report), args.output.clone(), result)
        }
        Command::Estimate(args) => {
            let (report, result) = reseq::commands::measure::run_estimate(args);
            (Some(report), args.output.clone(), result)
        }
        Command::Scan(args) => {
            let (report, result) = reseq::commands::measure::run_scan(args);
            (Some(report), args.output.clone(), result)
        }
        Command::Report(args) => return finish(rerender(&args.report, args.format)),
        Command::Thaw { json } => return finish(thaw(*json)),
        Command::Status { state_dir, json } => {
            return finish(reseq::commands::status::run(state_dir).map(|s| {
                if *json {
                    println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
                } else {
                    print!("{}", s.to_text());
                }
            }));
        }
        Command::Restore(args) => {
            return finish(reseq::commands::restore::run(args).map(|s| {
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
                } else {
                    print!("{}", s.to_text());
                }
            }));
        }
        Command::Generate { dir } => return finish(reseq::cli::generate::generate(dir)),
        Command::Run { .. } => unreachable!("replaced by the job's rewrite above"),
        Command::Demo(args) if !nix::unistd::geteuid().is_root() => {
            eprintln!("reseq demo: not root, so no loop device; running the simulated SSD instead (reseq simulate)");
            return print_simulation(
                reseq::commands::simulate::simulate(&SimulateArgs::defaults(), cli.quiet),
                args.json,
            );
        }
        Command::Demo(args) => {
            let (report, result) = reseq::commands::demo::run(args.size, args.no_fuse, cli.quiet);
            (report, OutputArgs { json: args.json, ..Default::default() }, result)
        }
        Command::Simulate(args) => {
            return print_simulation(reseq::commands::simulate::simulate(args, cli.quiet), args.json);
        }
        Command::Sim { command } => {
            return finish(
                reseq::commands::simulate::sim_command(command, cli.quiet)
                    .map(|v| println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default())),
            );
        }
    };
    if let Some(r) = &report {
        if result.is_err() && r.freeze_bound.is_some() && !r.dry_run {
            eprintln!("reseq: {}", reseq::host::thaw::after_abnormal_stop());
        }
        let format = output.format();
        if format != Format::Text || !cli.quiet || result.is_err() {
            print!("{}", render(r, format));
        }
        if let Some(path) = &output.metrics_file
            && let Err(e) = write_atomically(path, &render(r, Format::Prom))
        {
            eprintln!("reseq: {}", reseq::error_chain(&e));
        }
    }
    finish(result)
}

fn thaw(json: bool) -> reseq::support::error::Result<()> {
    let summary = reseq::host::thaw::run(&reseq::host::freeze_record::run_dir())?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary).unwrap_or_default());
    } else {
        print!("{}", summary.to_text());
    }
    reseq::host::thaw::live_guardian_error(&summary).map_or(Ok(()), Err)
}

fn rerender(path: &std::path::Path, format: Format) -> reseq::support::error::Result<()> {
    // A report that is not there or not readable is bad input, not an I/O failure of a run.
    let text = std::fs::read_to_string(path)
        .map_err(|e| reseq::support::error::Error::input(format!("reading the report {}", path.display()), e))?;
    let report: Report = serde_json::from_str(&text)
        .map_err(|e| reseq::support::error::Error::Usage(format!("{} is not a reseq report: {e}", path.display())))?;
    print!("{}", render(&report, format));
    Ok(())
}

fn print_simulation(
    r: reseq::support::error::Result<reseq::commands::simulate::Experiment>,
    json: bool,
) -> std::process::ExitCode {
    finish(r.map(|e| {
        if json {
            println!("{}", serde_json::to_string_pretty(&e).unwrap_or_default());
        } else {
            print!("{}", e.to_text());
        }
    }))
}

fn finish(result: reseq::support::error::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => ExitCode::Success.into(),
        Err(e) => {
            let err = anyhow::Error::new(e);
            eprintln!("reseq: {err:#}");
            err.downcast_ref::<reseq::support::error::Error>().map_or(ExitCode::Internal, |e| e.exit_code()).into()
        }
    }
}
