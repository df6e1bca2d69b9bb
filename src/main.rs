//! The `shmlink` binary: parses the command line and hands each command to its file under
//! `cmd/`; errors are one line on stderr and exit 2 (anyhow lives only on this side).

mod cmd;

use std::process::ExitCode;

use clap::Parser;

use shmlink::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ran = match cli.command {
        Command::Check(args) => cmd::check::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Preflight(args) => cmd::preflight::run(args),
        Command::Probe(args) => cmd::probe::run(args),
        Command::History(args) => cmd::history::run(args),
        Command::Admit(args) => cmd::admit::run(args),
        Command::Fleet(args) => cmd::fleet::run(args),
        Command::ProbeWorker(args) => cmd::probe::worker(args),
    };
    ran.unwrap_or_else(|e| {
        eprintln!("shmlink: {e:#}");
        ExitCode::from(2)
    })
}
