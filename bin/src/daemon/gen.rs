//! `rocectl gen man DIR` and `rocectl gen completions SHELL`: man pages and shell completions
//! generated from the command-line definition itself, so they never drift from it. One page
//! per command (`rocectl.1`, `rocectl-daemon.1`, `rocectl-res-show.1`, ...).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Command, Subcommand};
use clap_complete::Shell;

/// `rocectl gen` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum GenCommand {
    /// Write a man page for every rocectl command into DIR
    Man(ManArgs),
    /// Print the completion script for SHELL on stdout
    Completions(CompletionArgs),
}

/// `rocectl gen man` arguments.
#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// Output directory (created if missing)
    dir: PathBuf,
}

/// `rocectl gen completions` arguments.
#[derive(Debug, Args)]
pub(crate) struct CompletionArgs {
    /// The shell
    #[arg(value_enum)]
    shell: Shell,
}

/// Runs `rocectl gen`; `cmd` is the whole CLI's definition.
///
/// # Errors
/// The directory or a page cannot be written.
pub(crate) fn run(gen: &GenCommand, cmd: Command) -> anyhow::Result<ExitCode> {
    match gen {
        GenCommand::Man(a) => {
            std::fs::create_dir_all(&a.dir)
                .with_context(|| format!("creating {}", a.dir.display()))?;
            let n = write_pages(&a.dir, cmd, "")?;
            eprintln!("rocectl: {n} man pages written to {}", a.dir.display());
        }
        GenCommand::Completions(a) => {
            let mut cmd = cmd;
            clap_complete::generate(a.shell, &mut cmd, "rocectl", &mut std::io::stdout());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes the page of `cmd` and of every subcommand below it; returns how many.
fn write_pages(dir: &Path, cmd: Command, prefix: &str) -> anyhow::Result<usize> {
    let name = if prefix.is_empty() {
        cmd.get_name().to_owned()
    } else {
        format!("{prefix}-{}", cmd.get_name())
    };
    let cmd = cmd.name(name.clone());
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut page)
        .with_context(|| format!("rendering {name}.1"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    let mut n = 1;
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        n += write_pages(dir, sub.clone(), &name)?;
    }
    Ok(n)
}
