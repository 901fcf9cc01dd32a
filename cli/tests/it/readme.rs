//! The README's CLI table lists exactly the subcommands `rfidl --help`
//! shows (issue 30: `deploy-check`, `decommission` and `recommission` were
//! missing from it), so the two cannot drift apart again.

use std::collections::BTreeSet;
use std::process::Command;

/// The subcommands under `Commands:` in `rfidl --help`, without `help`.
fn help_subcommands() -> BTreeSet<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_rfidl"))
        .arg("--help")
        .output()
        .expect("run rfidl --help");
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).expect("UTF-8");
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        // A subcommand's line is indented two spaces; a wrapped description
        // goes on further in.
        .filter_map(|line| line.strip_prefix("  "))
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The first word of each row of the table under `### The \`rfidl\` CLI`
/// in the workspace's README.
fn readme_subcommands() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let section = readme
        .split("### The `rfidl` CLI")
        .nth(1)
        .expect("the README has a section `### The `rfidl` CLI`");
    section
        .lines()
        .skip_while(|line| !line.starts_with("| subcommand |"))
        .skip(2) // the header and its `| --- |` line
        .take_while(|line| line.starts_with('|'))
        .map(|row| {
            let cell = row.trim_start_matches('|').trim_start();
            let command = cell
                .strip_prefix('`')
                .unwrap_or_else(|| panic!("a row not starting with a `command`: {row}"));
            command
                .split(|c: char| c.is_whitespace() || c == '`')
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[test]
fn the_readme_lists_every_subcommand_of_rfidl_help_and_no_other() {
    let help = help_subcommands();
    let readme = readme_subcommands();
    assert!(help.len() >= 12, "parsed `rfidl --help`: {help:?}");
    assert_eq!(
        readme, help,
        "README.md's CLI table (left) against `rfidl --help` (right)"
    );
}
