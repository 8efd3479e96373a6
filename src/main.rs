//! The `reseq` binary: everything is in the library, from `cli::run` down.

fn main() -> std::process::ExitCode {
    reseq::main()
}
