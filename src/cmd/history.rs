//! `shmlink history`: what serve stored on this node, read-only (works while serve runs).

use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context;

use shmlink::cli::HistoryArgs;
use shmlink::state::{self, Filter};

/// The rows printed at most, of each kind (the newest).
const LIMIT: usize = 10_000;

pub fn run(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let dir = args
        .state
        .dir()
        .context("--state-dir none: there is no store to read")?;
    let filter = Filter {
        since: SystemTime::now().checked_sub(args.since),
        namespace: args.namespace,
        pod: args.pod,
        limit: LIMIT,
    };
    let history = state::read_history(&dir, &filter).with_context(|| {
        format!(
            "no history to read in {} (is serve run with --state-dir?)",
            dir.display()
        )
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&history)?);
    } else {
        print!("{}", state::history::render(&history));
    }
    Ok(ExitCode::SUCCESS)
}
