//! `shmlink check`: one scan and the failures since `--since`, as tables or JSON; exit 1 on any
//! warning or critical finding.

use std::io::IsTerminal;
use std::process::ExitCode;

use shmlink::check::{self, CheckSettings};
use shmlink::cli::{CheckArgs, LogFormat};
use shmlink::model::Severity;
use shmlink::report;

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    super::init_logging(LogFormat::Text, args.common.log_level, "warn")?;
    let sources = super::sources(&args.common, &args.sources);
    let settings = CheckSettings {
        scan: super::scan_settings(&args.common, sources.docker_root.clone())?,
        sources,
        since: args.since,
        kube: args.kube,
    };
    let snapshot = check::run(&settings)?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        report::write_json(&mut stdout, &snapshot)?;
    } else {
        let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        report::write_tables(&mut stdout, &snapshot, colour)?;
    }
    Ok(match snapshot.worst_severity() {
        Some(Severity::Warning | Severity::Critical) => ExitCode::from(1),
        _ => ExitCode::SUCCESS,
    })
}
