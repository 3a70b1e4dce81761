//! Helpers shared by the `raw_*` integration tests: open backends inside a namespace, send
//! whole batches, and pump receivers until enough datagrams arrived (all bounded in time).

#![allow(dead_code, unreachable_pub)]

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use roce_testkit::netns::{netns_or_skip, NetnsEnd};
use roce_transport::datapath::raw::{RawDatapath, RawOptions};
use roce_transport::datapath::{Datapath, RxMeta, TxDatagram};

/// The longest any single wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(5);

/// `true` when the test can run (see `netns_or_skip`).
pub fn can_run(test: &str) -> bool {
    netns_or_skip(test)
}

/// Opens a raw backend on `end`'s veth, inside its namespace.
pub fn open(end: &NetnsEnd, ip: IpAddr, opts: RawOptions) -> RawDatapath {
    end.netns()
        .enter_scoped(|| RawDatapath::open(end.ifname(), ip, opts))
        .expect("enter namespace")
        .unwrap_or_else(|e| panic!("open raw on {}: {e}", end.ifname()))
}

/// One received datagram.
#[derive(Clone, Debug)]
pub struct Got {
    pub data: Vec<u8>,
    pub meta: RxMeta,
}

/// Reads everything waiting on `dp` (also runs its neighbour resolution).
pub fn drain(dp: &mut dyn Datapath, out: &mut Vec<Got>) {
    let mut storage = vec![vec![0u8; 9216]; 16];
    loop {
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|s| IoSliceMut::new(s)).collect();
        let mut meta = [RxMeta::empty(); 16];
        match dp.recv(&mut bufs, &mut meta) {
            Ok(n) => {
                for (b, m) in bufs.iter().zip(&meta).take(n) {
                    out.push(Got {
                        data: b[..m.len].to_vec(),
                        meta: *m,
                    });
                }
                if n < 16 {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("recv: {e}"),
        }
    }
}

/// Sends all of `batch` from `tx`, pumping `tx` and `rx` while it waits (so replies to our
/// ARP requests are seen); returns what `rx` received meanwhile.
pub fn send_all(
    tx: &mut dyn Datapath,
    rx: &mut dyn Datapath,
    batch: &[TxDatagram<'_>],
) -> Vec<Got> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    let mut done = 0;
    let mut ignored = Vec::new();
    while done < batch.len() {
        match tx.send(&batch[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => panic!("send: {e}"),
        }
        drain(rx, &mut got);
        drain(tx, &mut ignored);
        assert!(Instant::now() < deadline, "send_all timed out");
    }
    got
}

/// Pumps `tx` (for neighbour resolution) and collects from `rx` until `want` datagrams
/// arrived or `timeout` passed.
pub fn collect(
    tx: &mut dyn Datapath,
    rx: &mut dyn Datapath,
    mut got: Vec<Got>,
    want: usize,
    timeout: Duration,
) -> Vec<Got> {
    let deadline = Instant::now() + timeout;
    let mut ignored = Vec::new();
    while got.len() < want && Instant::now() < deadline {
        drain(tx, &mut ignored);
        drain(rx, &mut got);
        std::thread::sleep(Duration::from_micros(300));
    }
    got
}

/// Sends `batch` from `tx` to `rx` and returns what arrived (waits until all did, or
/// `WAIT`).
pub fn transfer(
    tx: &mut dyn Datapath,
    rx: &mut dyn Datapath,
    batch: &[TxDatagram<'_>],
) -> Vec<Got> {
    let got = send_all(tx, rx, batch);
    collect(tx, rx, got, batch.len(), WAIT)
}

/// A datagram to `dst` with fields varied by `i`.
pub fn datagram(dst: SocketAddr, i: usize, payload: &[u8]) -> TxDatagram<'_> {
    TxDatagram {
        dst,
        src_port: 0xC000 + (i % 0x3FFF) as u16,
        tos: (i % 4) as u8 | 0x68,
        hop_limit: 64,
        flow_label: (i as u32 * 7919) & 0xF_FFFF,
        payload,
    }
}

/// A payload of `len` bytes that encodes `seq` and `len` (so reordering or truncation shows).
pub fn payload(seq: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seq.wrapping_mul(131) ^ len) as u8)
        .collect()
}
