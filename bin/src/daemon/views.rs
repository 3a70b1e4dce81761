//! `rocectl res show [qp|cq|mr|pd]` and `rocectl stat`: what the daemon knows of every
//! process sharing the address, with iproute2 `rdma`'s vocabulary (`link DEV/1 lqpn N rqpn M
//! type RC state RTS sq-psn … rq-psn … pid P comm C`) and `-j` for JSON.
//!
//! pid, uid and comm come from the kernel (the daemon's `SO_PEERCRED` and `/proc`); object
//! counts from the daemon's own accounting; QP details and counters from the snapshot each
//! client pushes every half second (`report-age-ms` says how old it is). A user other than
//! root sees the PSNs of other users' QPs as 0 (the daemon withholds them: with the QPN they
//! are what a forged packet needs).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use roce_transport::control::{socket_path, ClientView, Connection, Hello, Reply, Request, Role};
use serde_json::{json, Value};

/// `rocectl res` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ResCommand {
    /// Show the objects of every process using the daemon (like `rdma resource show`)
    Show(ResShowArgs),
}

/// `rocectl res show` arguments.
#[derive(Debug, Args)]
pub(crate) struct ResShowArgs {
    /// Which objects: one line per QP, or per process for the others; all: a summary per process
    #[arg(value_enum)]
    object: Option<ResObject>,
    #[command(flatten)]
    common: ViewArgs,
}

/// The objects `res show` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ResObject {
    /// Queue pairs
    Qp,
    /// Completion queues
    Cq,
    /// Memory regions, one line each (`mrn rkey lkey mrlen pdn`, as `rdma resource show mr`)
    Mr,
    /// Protection domains
    Pd,
}

/// `rocectl stat` arguments.
#[derive(Debug, Args)]
pub(crate) struct StatArgs {
    /// `show` (the only action, as in `rdma statistic show`)
    #[arg(value_parser = ["show"])]
    action: Option<String>,
    #[command(flatten)]
    common: ViewArgs,
}

/// What every view takes.
#[derive(Debug, Args)]
pub(crate) struct ViewArgs {
    /// JSON output
    #[arg(short, long)]
    json: bool,
    /// The daemon's socket (default: $ROCECTL_DAEMON_SOCKET, else /run/rocectl/rocectl.sock)
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

fn ask(common: &ViewArgs, req: &Request) -> anyhow::Result<Reply> {
    let path = common.socket.clone().unwrap_or_else(socket_path);
    let mut hello = Hello::new(Role::View);
    hello.program = "rocectl view".into();
    let mut conn = Connection::connect(&path, hello)?;
    Ok(conn.call(req)?)
}

/// `rocectl res show`.
///
/// # Errors
/// The daemon cannot be reached or refuses; stdout fails.
pub(crate) fn run_res(cmd: &ResCommand) -> anyhow::Result<ExitCode> {
    let ResCommand::Show(args) = cmd;
    let clients = match ask(&args.common, &Request::ResShow)? {
        Reply::Clients { clients } => clients,
        other => anyhow::bail!("unexpected reply from the daemon: {other:?}"),
    };
    let rows = res_rows(args.object, &clients);
    print_rows(&rows, args.common.json)?;
    Ok(ExitCode::SUCCESS)
}

/// `rocectl stat`.
///
/// # Errors
/// As [`run_res`].
pub(crate) fn run_stat(args: &StatArgs) -> anyhow::Result<ExitCode> {
    let (daemon, clients) = match ask(&args.common, &Request::Stat)? {
        Reply::Stats { daemon, clients } => (daemon, clients),
        other => anyhow::bail!("unexpected reply from the daemon: {other:?}"),
    };
    let mut rows = Vec::new();
    let mut total: Vec<(String, u64)> = Vec::new();
    for c in &clients {
        let mut row = link(c);
        ident(&mut row, c);
        for (k, v) in &c.report.counters {
            row.push((k.clone(), json!(v)));
            match total.iter_mut().find(|(n, _)| n == k) {
                Some((_, t)) => *t += v,
                None => total.push((k.clone(), *v)),
            }
        }
        rows.push(row);
    }
    let mut sum = vec![("link".to_owned(), json!("total"))];
    sum.extend(total.into_iter().map(|(k, v)| (k, json!(v))));
    rows.push(sum);
    let d = serde_json::to_value(&daemon)?;
    let mut drow = vec![("daemon".to_owned(), json!("rocectl"))];
    if let Value::Object(m) = d {
        drow.extend(m.into_iter().map(|(k, v)| (k.replace('_', "-"), v)));
    }
    rows.push(drow);
    print_rows(&rows, args.common.json)?;
    Ok(ExitCode::SUCCESS)
}

type Row = Vec<(String, Value)>;

fn link(c: &ClientView) -> Row {
    let dev = if c.report.device.is_empty() {
        "?"
    } else {
        &c.report.device
    };
    vec![
        ("ifname".to_owned(), json!(dev)),
        ("port".to_owned(), json!(1)),
    ]
}

fn ident(row: &mut Row, c: &ClientView) {
    row.push(("pid".into(), json!(c.pid)));
    row.push(("uid".into(), json!(c.uid)));
    row.push(("comm".into(), json!(c.comm)));
}

/// The rows of `res show OBJECT` (`None`: the per-process summary).
fn res_rows(object: Option<ResObject>, clients: &[ClientView]) -> Vec<Row> {
    let mut rows = Vec::new();
    for c in clients {
        match object {
            Some(ResObject::Qp) => {
                for q in &c.report.qps {
                    let mut row = link(c);
                    row.extend([
                        ("lqpn".to_owned(), json!(q.lqpn)),
                        ("rqpn".to_owned(), json!(q.rqpn)),
                        ("type".to_owned(), json!(q.qp_type)),
                        ("state".to_owned(), json!(q.state)),
                        ("sq-psn".to_owned(), json!(q.sq_psn)),
                        ("rq-psn".to_owned(), json!(q.rq_psn)),
                    ]);
                    ident(&mut row, c);
                    rows.push(row);
                }
            }
            Some(ResObject::Mr) if !c.report.mrs.is_empty() => {
                for m in &c.report.mrs {
                    let mut row = link(c);
                    row.extend([
                        ("mrn".to_owned(), json!(m.mrn)),
                        ("rkey".to_owned(), json!(format!("{:#x}", m.rkey))),
                        ("lkey".to_owned(), json!(format!("{:#x}", m.lkey))),
                        ("mrlen".to_owned(), json!(m.mrlen)),
                        ("pdn".to_owned(), json!(m.pdn)),
                    ]);
                    ident(&mut row, c);
                    rows.push(row);
                }
            }
            Some(obj) => {
                let mut row = link(c);
                let (name, n) = match obj {
                    ResObject::Cq => ("cq", c.objects.cqs),
                    ResObject::Mr => ("mr", c.objects.mrs),
                    _ => ("pd", c.report.pds),
                };
                row.push((name.to_owned(), json!(n)));
                if obj == ResObject::Mr {
                    row.push(("mr-bytes".into(), json!(c.objects.mr_bytes)));
                }
                ident(&mut row, c);
                rows.push(row);
            }
            None => {
                let mut row = link(c);
                ident(&mut row, c);
                if let Some(l) = &c.lease {
                    row.push(("slot".into(), json!(l.slot)));
                    row.push((
                        "qpn-range".into(),
                        json!(format!(
                            "{:#x}-{:#x}",
                            l.qpn_base,
                            l.qpn_base + (l.qpn_count - 1)
                        )),
                    ));
                }
                row.extend([
                    ("pd".to_owned(), json!(c.report.pds)),
                    ("cq".to_owned(), json!(c.objects.cqs)),
                    ("qp".to_owned(), json!(c.objects.qps)),
                    ("mr".to_owned(), json!(c.objects.mrs)),
                    ("mr-bytes".to_owned(), json!(c.objects.mr_bytes)),
                    ("report-age-ms".to_owned(), json!(c.report_age_ms)),
                ]);
                rows.push(row);
            }
        }
    }
    rows
}

/// Prints rows as `rdma` does: `-j` a JSON array of objects, else one line of `key value`
/// pairs per row, with `ifname`/`port` as `link DEV/PORT`.
fn print_rows(rows: &[Row], json_out: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json_out {
        let arr: Vec<Value> = rows
            .iter()
            .map(|r| Value::Object(r.iter().cloned().collect()))
            .collect();
        serde_json::to_writer(&mut out, &arr)?;
        writeln!(out).context("writing stdout")?;
        return Ok(());
    }
    for r in rows {
        let mut words = Vec::new();
        let mut i = 0;
        while i < r.len() {
            let (k, v) = &r[i];
            if k == "ifname" && r.get(i + 1).is_some_and(|(k, _)| k == "port") {
                words.push(format!("link {}/{}", plain(v), plain(&r[i + 1].1)));
                i += 2;
                continue;
            }
            words.push(format!("{k} {}", plain(v)));
            i += 1;
        }
        writeln!(out, "{}", words.join(" ")).context("writing stdout")?;
    }
    Ok(())
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
