//! The `reseq` binary: parse, dispatch, print, exit. Everything else is in the library.

use clap::Parser;

use reseq::cli::{Cli, Command};
use reseq::exit_codes::ExitCode;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    reseq::output::init_logging(cli.verbose, cli.quiet);
    let (report, json, result) = match &cli.command {
        Command::Rewrite(args) => {
            let (report, result) = reseq::rewrite::run(args, cli.quiet);
            (Some(report), args.json, result)
        }
        Command::Demo(args) => {
            let (report, result) = reseq::demo::run(args, cli.quiet);
            (report, args.json, result)
        }
    };
    if let Some(r) = &report {
        if json {
            println!("{}", r.to_json());
        } else if !cli.quiet || result.is_err() {
            print!("{}", r.to_text());
        }
    }
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
