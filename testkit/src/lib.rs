//! Test infrastructure for rocectl's integration tests, benchmarks and the conformance lab.
//!
//! This crate is not part of any public API: other crates use it as a dev-dependency (the
//! benchmark and conformance crates, which are test infrastructure themselves, as a normal
//! one). It holds, once:
//!
//! - [`netns`]: named network namespaces, veth pairs between two of them ([`NetnsPair`]), a
//!   throw-away namespace with only loopback ([`TempNetns`]), a private namespace for the
//!   calling thread ([`private_net`]), and the probe saying whether any of it works here;
//! - [`daemon`]: a `rocectl daemon` for a test: its configuration file and the wait until it
//!   serves;
//! - [`proc`]: child processes in their own process group with output to files, killed whole
//!   when their time runs out or their handle is dropped ([`Proc`], [`run_bounded`]);
//! - the **skip policy** ([`skip`], [`require_root`], [`netns_or_skip`]).
//!
//! # The skip policy
//!
//! A test that cannot run here (it needs root, or a kernel feature this host lacks) never
//! passes silently:
//!
//! - with `CI` set in the environment (CI runs as root on a kernel with every feature), it
//!   **panics**, so the test fails;
//! - otherwise it prints a banner with `SKIPPED: <test>: <reason>` on standard error and
//!   the test returns early. The banner is written past libtest's output capture, so a plain
//!   `cargo test` shows it; `grep SKIPPED` finds it.
//!
//! An environment that could run the test but is set up wrong (root without the `ip`
//! command) fails the test everywhere.
//!
//! [`NetnsPair`]: netns::NetnsPair
//! [`TempNetns`]: netns::TempNetns
//! [`private_net`]: netns::private_net
//! [`Proc`]: proc::Proc
//! [`run_bounded`]: proc::run_bounded
//! [`netns_or_skip`]: netns::netns_or_skip

pub mod daemon;
pub mod netns;
pub mod proc;
mod skip;

pub use skip::{current_test, in_ci, is_root, require_root, skip};
