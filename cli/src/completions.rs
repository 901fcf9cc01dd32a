//! `rfidl completions`: a shell completion script (clap_complete) for the
//! command line the binary defines.

use crate::man::to_stdout;
use crate::report::Outcome;

/// `rfidl completions SHELL`: the script on stdout.
pub fn completions(mut command: clap::Command, shell: clap_complete::Shell) -> Outcome {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "rfidl", &mut script);
    to_stdout(&script, "the completion script")
}
