//! `shmlink check`: one scan and the failures since `--since`, as tables or JSON; exit 1 on any
//! warning or critical finding or a partly blind scan, 2 on a blind one.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use shmlink::check::{self, CheckSettings};
use shmlink::cli::{CheckArgs, LogFormat};
use shmlink::report;

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    super::init_logging(LogFormat::Text, args.common.log_level, "warn")?;
    let sources = super::sources(&args.common, &args.sources);
    let settings = CheckSettings {
        scan: super::scan_settings(&args.common, sources.docker_root.clone())?,
        sources,
        since: args.since,
        state_dir: args.state.dir(),
        kube: args.kube,
    };
    let snapshot = check::run(&settings)?;
    // Written whole at the end: stdout alone flushes each line, a write(2) per line of JSON.
    let mut stdout = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    if args.json {
        report::write_json(&mut stdout, &snapshot)?;
        stdout.flush()?;
        // The JSON says `blind`; a person running it should not have to look.
        for &reason in &snapshot.blind {
            eprintln!("shmlink: {}", shmlink::text::blind(reason, &snapshot.sight));
        }
    } else {
        let terminal = std::io::stdout().is_terminal();
        let style = report::Style {
            colour: terminal && std::env::var_os("NO_COLOR").is_none(),
            // A pipe gets every message whole on its line, for whoever reads it.
            width: terminal.then(terminal_width).flatten(),
        };
        report::write_tables(&mut stdout, &snapshot, style)?;
        stdout.flush()?;
    }
    Ok(ExitCode::from(check::exit_status(&snapshot)))
}

/// The terminal's columns (TIOCGWINSZ on stdout); None when it does not say.
fn terminal_width() -> Option<usize> {
    let size = rustix::termios::tcgetwinsize(std::io::stdout()).ok()?;
    (size.ws_col > 0).then_some(usize::from(size.ws_col))
}
