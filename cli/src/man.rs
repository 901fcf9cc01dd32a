//! `rfidl man`: the manual pages (roff, clap_mangen) of the command line
//! the binary defines, on stdout or one file per subcommand.

use std::io::Write as _;
use std::path::PathBuf;

use crate::report::Outcome;

/// `rfidl man [--out DIR]`.
pub fn man(command: clap::Command, out: Option<PathBuf>) -> Outcome {
    let Some(dir) = out else {
        let mut roff = Vec::new();
        clap_mangen::Man::new(command)
            .render(&mut roff)
            .expect("rendering into memory cannot fail");
        return to_stdout(&roff, "the manual");
    };
    match std::fs::create_dir_all(&dir).and_then(|()| man_pages(command, &dir)) {
        Ok(()) => {
            eprintln!("wrote the manual pages into {}", dir.display());
            Outcome::Success
        }
        Err(error) => {
            eprintln!(
                "error: cannot write the manual into {}: {error}",
                dir.display()
            );
            Outcome::UsageOrIo
        }
    }
}

/// `rfidl.1` and one page per subcommand (`rfidl-check.1`, …), each naming
/// `rfidl VERSION` as its source.
fn man_pages(command: clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    let mut command = command.disable_help_subcommand(true);
    command.build();
    let source = format!("rfidl {}", env!("CARGO_PKG_VERSION"));
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        clap_mangen::Man::new(sub.clone())
            .source(source.clone())
            .generate_to(dir)?;
    }
    clap_mangen::Man::new(command)
        .source(source)
        .generate_to(dir)?;
    Ok(())
}

/// Writes `bytes` to stdout; a reader that stops early (`| head`) is fine.
pub(crate) fn to_stdout(bytes: &[u8], what: &str) -> Outcome {
    match std::io::stdout().lock().write_all(bytes) {
        Ok(()) => Outcome::Success,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Outcome::Success,
        Err(error) => {
            eprintln!("error: cannot write {what} to stdout: {error}");
            Outcome::UsageOrIo
        }
    }
}
