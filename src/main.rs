//! The `reseq` binary: parse, dispatch, print, exit. Everything else is in the library.

use clap::Parser;

use reseq::cli::{Cli, Command, SimulateArgs};
use reseq::exit_codes::ExitCode;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    reseq::output::init_logging(cli.verbose, cli.quiet);
    let (report, json, result) = match &cli.command {
        Command::Rewrite(args) => {
            let (report, result) = reseq::rewrite::run(args, cli.quiet);
            (Some(report), args.json, result)
        }
        Command::Demo(args) if !nix::unistd::geteuid().is_root() => {
            eprintln!(
                "reseq demo: not root, so no loop device; running the simulated SSD instead (reseq simulate)"
            );
            return print_simulation(
                reseq::simulate::simulate(&SimulateArgs::defaults(), cli.quiet),
                args.json,
            );
        }
        Command::Demo(args) => {
            let (report, result) = reseq::demo::run(args, cli.quiet);
            (report, args.json, result)
        }
        Command::Simulate(args) => {
            return print_simulation(reseq::simulate::simulate(args, cli.quiet), args.json);
        }
        Command::Sim { command } => {
            return finish(
                reseq::simulate::sim_command(command, cli.quiet)
                    .map(|v| println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default())),
            );
        }
    };
    if let Some(r) = &report {
        if json {
            println!("{}", r.to_json());
        } else if !cli.quiet || result.is_err() {
            print!("{}", r.to_text());
        }
    }
    finish(result)
}

fn print_simulation(
    r: reseq::error::Result<reseq::simulate::Experiment>,
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

fn finish(result: reseq::error::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => ExitCode::Success.into(),
        Err(e) => {
            let err = anyhow::Error::new(e);
            eprintln!("reseq: {err:#}");
            err.downcast_ref::<reseq::error::Error>()
                .map_or(ExitCode::Internal, |e| e.exit_code())
                .into()
        }
    }
}
