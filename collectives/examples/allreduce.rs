//! Averaging a gradient across 4 ranks with `roce-collectives`.
//!
//! Under a launcher (each rank a process with torchrun-style `MASTER_ADDR`, `MASTER_PORT`,
//! `RANK` and `WORLD_SIZE`; or `OMPI_COMM_WORLD_*`, `PMI_*`, `SLURM_*` with
//! `ROCECTL_COLL_STORE`), every process runs one rank:
//!
//! ```text
//! rocectl coll launch -n 4 --link veth -- target/release/examples/allreduce
//! MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 RANK=0 WORLD_SIZE=4 target/release/examples/allreduce
//! ```
//!
//! Run without that environment it launches itself as 4 local processes (loopback addresses
//! 127.0.0.1 to 127.0.0.4, a TCP store on 127.0.0.1). Optional argument: the number of f32
//! elements (default 4 Mi, a 16 MiB gradient).

use std::process::{Command, ExitCode};
use std::time::Instant;

use roce_collectives::{Communicator, ReduceOp};

fn rank_main(elements: usize) -> Result<(), String> {
    // Everything from the environment: rank, size, store, options (ROCECTL_COLL_*).
    let comm = Communicator::from_env().map_err(|e| e.to_string())?;
    let (rank, size) = (comm.rank(), comm.size());

    // This rank's "gradient": rank + 1 times a small pattern (exact in f32).
    let mut grad: Vec<f32> = (0..elements)
        .map(|i| (rank + 1) as f32 * (i % 100) as f32)
        .collect();

    let t = Instant::now();
    comm.allreduce_in_place(&mut grad, ReduceOp::Avg)
        .map_err(|e| e.to_string())?;
    let took = t.elapsed();

    // Every rank now holds the average: (1 + 2 + … + size) / size times the pattern.
    let factor = (size * (size + 1) / 2) as f32 / size as f32;
    let wrong = grad
        .iter()
        .enumerate()
        .filter(|(i, g)| **g != factor * (i % 100) as f32)
        .count();
    let bytes = elements * 4;
    let busbw = bytes as f64 * 2.0 * (size - 1) as f64 / size as f64 / took.as_secs_f64() / 1e9;
    println!(
        "rank {rank}/{size}: allreduce(avg) of {elements} f32 in {took:?} ({busbw:.2} GB/s bus), \
         {wrong} wrong"
    );
    comm.barrier().map_err(|e| e.to_string())?;
    if wrong == 0 {
        Ok(())
    } else {
        Err(format!("rank {rank}: {wrong} wrong elements"))
    }
}

fn launch(elements: usize) -> Result<(), String> {
    const RANKS: usize = 4;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let children: Vec<_> = (0..RANKS)
        .map(|rank| {
            Command::new(&me)
                .arg(elements.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", RANKS.to_string())
                .spawn()
                .map_err(|e| format!("spawning rank {rank}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut failed = 0;
    for mut c in children {
        if !c.wait().map(|s| s.success()).unwrap_or(false) {
            failed += 1;
        }
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} of {RANKS} ranks failed"))
    }
}

fn main() -> ExitCode {
    let elements = match std::env::args().nth(1).map(|a| a.parse::<usize>()) {
        None => 4 << 20,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            eprintln!("usage: allreduce [ELEMENTS]");
            return ExitCode::from(2);
        }
    };
    let under_launcher = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .any(|k| std::env::var_os(k).is_some());
    let r = if under_launcher {
        rank_main(elements)
    } else {
        launch(elements)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
