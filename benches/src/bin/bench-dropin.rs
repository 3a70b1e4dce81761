//! Issue 13's performance check: the **unmodified** perftest binaries on rocectl's drop-in
//! `libibverbs.so.1` against rocectl's own `write-bw` / `send-lat`, side by side in one run, over
//! the same veth pair (MTU 9000, path MTU 4096), same options, same sizes. The issue asks for the
//! drop-in within 10% of our own tools.
//!
//! Each figure is measured `--reps` times round-robin (drop-in, ours, drop-in, ours, ...) and
//! reported as the median with min–max. `ib_write_bw` vs `rocectl write-bw`: 64 KiB WRITEs, the
//! client's BW average (MB/s = 2^20 bytes/s); `ib_send_lat` vs `rocectl send-lat`: 64-byte
//! SENDs, the client's t_typical (µs, the median one-way latency perftest prints). Both tools
//! poll (their default). Prints a table and writes `benches/results/dropin.{json,md}`.
//!
//! Needs root (namespaces), `verbs/build-so.sh`'s library, `rocectl` (release) and Debian's
//! perftest. `benches/run.sh` runs it after `bench-all`:
//!
//! ```text
//! cargo run -p roce-benches --release --bin bench-dropin
//! cargo run -p roce-benches --release --bin bench-dropin -- --reps 1 --out none
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use roce_conformance::stock::{
    parse_perftest, run_case, CaseSpec, CaseTimeouts, DropinLink, DropinPaths, Impl, Tool, Variant,
    SEND_LAT, WRITE_BW,
};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(about = "perftest on the drop-in libibverbs.so.1 vs rocectl's own perftest tools")]
struct Cli {
    /// Runs per figure and tool (the median and min–max are reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Output directory for dropin.json and dropin.md, or `none` (default: benches/results).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One comparison: the same perftest options through both programs.
struct Figure {
    title: &'static str,
    /// `bandwidth` (higher is better) or `latency` (lower is better).
    metric: &'static str,
    unit: &'static str,
    variant: Variant,
}

const FIGURES: &[Figure] = &[
    Figure {
        title: "RC WRITE BW 64 KiB PMTU 4096 veth",
        metric: "bandwidth",
        unit: "MB/s",
        variant: variant("write_bw_64k", WRITE_BW, "-s 65536 -n 5000 -m 4096"),
    },
    Figure {
        title: "RC SEND latency 64 B veth",
        metric: "latency",
        unit: "µs",
        variant: variant("send_lat_64", SEND_LAT, "-s 64 -n 10000 -m 4096"),
    },
];

const fn variant(name: &'static str, tool: Tool, args: &'static str) -> Variant {
    Variant {
        name,
        tool,
        args,
        jumbo: true,
        limit: Duration::from_secs(120),
    }
}

/// The median and range of a set of runs.
fn summary(values: &[f64]) -> Option<Value> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    Some(json!({
        "median": v[v.len() / 2],
        "min": v[0],
        "max": v[v.len() - 1],
        "n": v.len(),
        "runs": values,
    }))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!("bench-dropin needs root (two network namespaces joined by a veth pair)");
    }
    let paths = DropinPaths::from_env();
    let missing = paths.missing(&["ib_write_bw", "ib_send_lat", "ibv_devinfo"], true);
    if !missing.is_empty() {
        bail!("missing: {}", missing.join("; "));
    }
    roce_benches::netns::install_signal_cleanup();
    let t0 = Instant::now();
    let started = date();
    let log_dir = paths.workspace.join("target/bench-dropin");
    let link = DropinLink::create("benchdropin", 9000, &paths, true, &log_dir)
        .context("creating the veth pair")?;
    let mut samples: Vec<[Vec<f64>; 2]> = FIGURES.iter().map(|_| [vec![], vec![]]).collect();
    let mut commands: Vec<[String; 2]> = FIGURES.iter().map(|_| Default::default()).collect();
    let mut errors = Vec::new();
    let mut port = 18_700;
    for rep in 0..cli.reps {
        for (i, f) in FIGURES.iter().enumerate() {
            for (k, imp) in [Impl::Stock, Impl::Ours].into_iter().enumerate() {
                let spec = CaseSpec {
                    id: format!("{}/{}/{rep}", f.variant.name, imp_name(imp)),
                    variant: f.variant,
                    server: imp,
                    client: imp,
                };
                port += 1;
                let r = run_case(
                    &paths,
                    &link.server,
                    &link.client,
                    &spec,
                    port,
                    CaseTimeouts::default(),
                    &log_dir,
                );
                commands[i][k] = format!("{} & {}", r.server_cmd, r.client_cmd);
                let value = r
                    .client
                    .as_ref()
                    .filter(|_| r.passed())
                    .and_then(|o| parse_perftest(&o.stdout))
                    .and_then(|(_, rows)| rows.first().map(|row| row.value));
                match value {
                    Some(v) => {
                        eprintln!("{}: {v:.2} {}", spec.id, f.unit);
                        samples[i][k].push(v);
                    }
                    None => {
                        let why = r.failure.unwrap_or_else(|| "no result row".to_owned());
                        eprintln!("{}: FAILED: {why}", spec.id);
                        errors.push(format!("{}: {why}", spec.id));
                    }
                }
            }
        }
    }

    let mut rows = Vec::new();
    let mut md = String::new();
    md.push_str("# rocectl benchmarks: perftest on the drop-in vs rocectl's own tools\n\n");
    md.push_str(&format!(
        "{started} · {} · {:.0} s · {} runs per cell round-robin, each cell the median \
         (min–max)\n\nGenerated by `benches/run.sh` (`cargo run -p roce-benches --release --bin \
         bench-dropin`). The same perftest options through Debian's binary on the drop-in \
         `libibverbs.so.1` (`LD_LIBRARY_PATH=target/release/rocectl-verbs`, device \
         `rocectl_veth-a`) and through `rocectl`'s own tool (device `veth-a`), server in one \
         namespace, client in the other, over a veth pair with MTU 9000. Bandwidth: the client's \
         BW average (MB/s = 2^20 B/s), higher is better. Latency: the client's t_typical \
         (µs), lower is better. Issue 13's target: the drop-in within 10% of ours.\n\n",
        git_describe(),
        t0.elapsed().as_secs_f64(),
        cli.reps
    ));
    md.push_str(
        "| figure | drop-in (stock perftest) | rocectl tool | drop-in/ours | within 10% |\n",
    );
    md.push_str("|---|---|---|---|---|\n");
    for (i, f) in FIGURES.iter().enumerate() {
        let [stock, ours] = &samples[i];
        let (s, o) = (summary(stock), summary(ours));
        let med = |v: &Option<Value>| v.as_ref().and_then(|v| v["median"].as_f64());
        let ratio = match (med(&s), med(&o)) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let within = ratio.map(|r| {
            if f.metric == "bandwidth" {
                r >= 0.9
            } else {
                r <= 1.1
            }
        });
        let cell = |v: &Option<Value>| {
            v.as_ref().map_or("failed".to_owned(), |v| {
                format!(
                    "{:.2} {} ({:.2}–{:.2})",
                    v["median"].as_f64().unwrap_or_default(),
                    f.unit,
                    v["min"].as_f64().unwrap_or_default(),
                    v["max"].as_f64().unwrap_or_default()
                )
            })
        };
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            f.title,
            cell(&s),
            cell(&o),
            ratio.map_or("–".to_owned(), |r| format!("{r:.2}×")),
            within.map_or("–", |w| if w { "yes" } else { "**no**" })
        ));
        rows.push(json!({
            "id": f.variant.name,
            "title": f.title,
            "metric": f.metric,
            "unit": f.unit,
            "dropin": s,
            "ours": o,
            "ratio_dropin_over_ours": ratio,
            "within_10_percent": within,
            "commands": {"dropin": commands[i][0], "ours": commands[i][1]},
        }));
    }
    md.push_str(
        "\nCommands (`[ns a]`: the server's namespace, started first; `[ns b]`: the client's):\n\n",
    );
    for (i, f) in FIGURES.iter().enumerate() {
        md.push_str(&format!(
            "- {}\n  - drop-in: `{}`\n  - ours: `{}`\n",
            f.title, commands[i][0], commands[i][1]
        ));
    }
    if !errors.is_empty() {
        md.push_str("\nFailed runs:\n\n");
        for e in &errors {
            md.push_str(&format!("- {}\n", e.replace('|', "\\|")));
        }
    }
    let doc = json!({
        "date": started,
        "git": git_describe(),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "loadavg_end": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "elapsed_s": t0.elapsed().as_secs_f64(),
        "reps": cli.reps,
        "mtu": link.mtu,
        "figures": rows,
        "errors": errors,
    });
    println!("{md}");
    let out = match cli.out {
        Some(p) if p.as_os_str() == "none" => None,
        Some(p) => Some(p),
        None => Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results")),
    };
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("dropin.md"), &md)?;
        std::fs::write(
            dir.join("dropin.json"),
            serde_json::to_string_pretty(&doc)? + "\n",
        )?;
        eprintln!("wrote {}/dropin.{{md,json}}", dir.display());
    }
    if samples.iter().any(|s| s[0].is_empty() || s[1].is_empty()) {
        bail!("some figures have no measurement: {}", errors.join("; "));
    }
    Ok(())
}

fn imp_name(imp: Impl) -> &'static str {
    match imp {
        Impl::Stock => "dropin",
        Impl::Ours => "ours",
    }
}

fn git_describe() -> String {
    std::process::Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "describe",
            "--always",
            "--dirty",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

fn date() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}
