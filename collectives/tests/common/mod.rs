//! Multi-rank harness: N ranks as threads of one process, each with its own `udp` device on
//! its own loopback address (a block of 127.77.x.y per call, so tests in parallel never
//! share an address) and a TCP store on rank 0's.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use roce_collectives::{Bootstrap, CollError, CommOptions, Communicator, DeviceChoice};
use roce_transport::DeviceConfig;

static NEXT_BLOCK: AtomicU8 = AtomicU8::new(1);

/// A fresh block of loopback addresses: `127.77.<block>.<rank + 1>`.
pub(crate) fn block() -> u8 {
    let pid_part = (std::process::id() % 50) as u8;
    NEXT_BLOCK
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_add(pid_part * 5)
}

/// Options for tests: exclusive `udp` devices on the block, a short timeout.
pub(crate) fn opts(block: u8) -> CommOptions {
    CommOptions {
        timeout: Duration::from_secs(20),
        device: DeviceChoice::Config(Arc::new(move |r| {
            DeviceConfig::udp(IpAddr::V4(Ipv4Addr::new(127, 77, block, r as u8 + 1))).exclusive()
        })),
        ..CommOptions::default()
    }
}

/// A free TCP port on the block's first address.
pub(crate) fn store(block: u8) -> SocketAddr {
    let ip = IpAddr::V4(Ipv4Addr::new(127, 77, block, 1));
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).expect("a free port");
    l.local_addr().expect("its address")
}

/// Runs `f(comm)` on `n` ranks (threads), returning each rank's result in rank order.
pub(crate) fn run<T: Send + 'static>(
    n: usize,
    opts: CommOptions,
    f: impl Fn(Communicator) -> T + Send + Sync + 'static,
) -> Vec<Result<T, CollError>> {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("its address")
    };
    let f = Arc::new(f);
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            let f = f.clone();
            let opts = opts.clone();
            std::thread::spawn(move || {
                let comm = Communicator::init(
                    Bootstrap::Tcp {
                        addr,
                        rank,
                        size: n,
                    },
                    opts,
                )?;
                Ok(f(comm))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("rank thread panicked"))
        .collect()
}
