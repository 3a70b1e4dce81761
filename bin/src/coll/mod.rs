//! Collectives tools (issue 15): `rocectl coll-perf` ([`perf`]), nccl-tests' benchmark with its
//! flags and its output, on the `roce-collectives` communicator; and `rocectl coll launch`
//! ([`launch`]), which runs N ranks of a command in network namespaces joined by a bridge (or
//! on loopback) with torchrun's environment, for tests and benchmarks.

mod check;
mod comm;
pub(crate) mod launch;
pub(crate) mod perf;
mod report;

/// `rocectl coll …`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum CollCommand {
    /// Run N ranks of a command in namespaces joined by a bridge (veth) or on loopback, with
    /// torchrun's environment (tests and benchmarks only; root)
    Launch(launch::LaunchArgs),
}

/// Runs `rocectl coll …`.
pub(crate) fn run(cmd: &CollCommand) -> anyhow::Result<std::process::ExitCode> {
    match cmd {
        CollCommand::Launch(args) => launch::run(args),
    }
}
