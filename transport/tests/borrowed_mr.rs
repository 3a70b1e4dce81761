//! Borrowed registrations (`ProtectionDomain::with_borrowed`, `with_borrowed_ref`): the
//! caller's buffer is reachable for the closure's length only. After the scope a peer's
//! WRITE or READ with the rkey fails with a remote access error, a WRITE posted inside the
//! scope and retransmitted after it fails with a local protection error, a READ whose
//! response arrives after the scope fails and writes nothing, and a panic inside the closure
//! deregisters too: none of them touches the buffer. A receive posted inside the scope and
//! matched after it writes nothing; a shared borrow is never written (a receive's scatter, a
//! READ's or an atomic's local result, a peer's WRITE or atomic are all refused, inside the
//! scope too); and a stream of peer WRITEs racing the end of the scope lands nothing after it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use roce_transport::{
    Access, AccessError, Completion, CompletionQueue, ConnectOptions, Device, DeviceConfig,
    LinkConfig, MemoryRegion, ProtectionDomain, Psn, QpInit, QpType, QueuePair, RKey, RecvWr,
    RegisterError, RemoteQp, SendOp, SendWr, SimNetwork, VerbsError, WcStatus,
};

struct Side {
    dev: Device,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

/// Two connected RC QPs at 10.8.`x`.1 and 10.8.`x`.2. The ACK timeout is 67 ms a try (8
/// tries): short enough for the retransmission tests, long enough that a loaded host never
/// turns an answer into a retry-exceeded error (about 1 ms a try did, now and then).
fn pair(net: &SimNetwork, x: u8) -> (Side, Side) {
    let side = |host: u8| {
        let ip = format!("10.8.{x}.{host}").parse().unwrap();
        let dev = Device::open(DeviceConfig::sim(net, ip)).unwrap();
        let pd = dev.alloc_pd();
        let cq = dev.create_cq(64).unwrap();
        let qp = pd.create_qp(&QpInit::new(QpType::Rc, &cq)).unwrap();
        Side { dev, pd, cq, qp }
    };
    let (a, b) = (side(1), side(2));
    let remote = |s: &Side| RemoteQp {
        qpn: s.qp.qpn(),
        psn: Psn::new(0),
        gid: s.dev.local_gid(),
    };
    let o = ConnectOptions {
        access: Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC,
        timeout: 14,
        retry_cnt: 7,
        ..ConnectOptions::default()
    };
    a.qp.connect(&remote(&b), &o).unwrap();
    b.qp.connect(&remote(&a), &o).unwrap();
    (a, b)
}

fn post(s: &Side, op: SendOp, mr: &MemoryRegion, len: usize) {
    s.qp.post_send(SendWr::new(9, op, vec![mr.sge(0, len)]))
        .unwrap();
}

fn wait(s: &Side) -> WcStatus {
    let mut wc = [Completion::EMPTY];
    assert_eq!(
        s.cq.wait(&mut wc, Duration::from_secs(10)),
        1,
        "no completion"
    );
    wc[0].status
}

#[test]
fn a_peer_write_or_read_after_the_scope_fails_and_touches_nothing() {
    let net = SimNetwork::perfect();
    let (a, b) = pair(&net, 1);
    let mut buf = vec![0u8; 64];
    let src = a.pd.register(vec![0xAB; 16], Access::empty()).unwrap();
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (addr, rkey) =
        b.pd.with_borrowed(&mut buf, rights, |mr| {
            assert_eq!(mr.len(), 64);
            let write = SendOp::RdmaWrite {
                remote_addr: mr.addr() + 8,
                rkey: mr.rkey(),
            };
            post(&a, write, &src, 16);
            assert_eq!(wait(&a), WcStatus::Success);
            (mr.addr(), mr.rkey())
        })
        .unwrap();
    // The write inside the scope landed in the caller's buffer, readable plainly now.
    assert_eq!(&buf[8..24], &[0xAB; 16]);
    // After the scope: the same WRITE is refused.
    let again = SendOp::RdmaWrite {
        remote_addr: addr + 32,
        rkey,
    };
    post(&a, again, &src, 16);
    assert_eq!(wait(&a), WcStatus::RemAccessErr);
    assert_eq!(&buf[8..24], &[0xAB; 16]);
    assert!(buf[..8].iter().chain(&buf[24..]).all(|&x| x == 0));

    // A READ of a shared borrow after its scope: refused, the destination untouched.
    let (a, b) = pair(&net, 2);
    let data = vec![0x5Au8; 32];
    let dst = a.pd.register(vec![0u8; 32], Access::LOCAL_WRITE).unwrap();
    let (addr, rkey) =
        b.pd.with_borrowed_ref(&data, Access::REMOTE_READ, |mr| {
            let read = SendOp::RdmaRead {
                remote_addr: mr.addr(),
                rkey: mr.rkey(),
            };
            post(&a, read, &dst, 32);
            assert_eq!(wait(&a), WcStatus::Success);
            (mr.addr(), mr.rkey())
        })
        .unwrap();
    assert_eq!(dst.to_vec(), data);
    dst.write(0, &[0u8; 32]).unwrap();
    post(
        &a,
        SendOp::RdmaRead {
            remote_addr: addr,
            rkey,
        },
        &dst,
        32,
    );
    assert_eq!(wait(&a), WcStatus::RemAccessErr);
    assert_eq!(dst.to_vec(), vec![0u8; 32]);
}

#[test]
fn a_write_posted_in_the_scope_and_retransmitted_after_it_fails_locally() {
    let net = SimNetwork::perfect();
    let (a, b) = pair(&net, 3);
    let dst =
        b.pd.register(vec![0u8; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let mut buf = vec![0xC3u8; 4096];
    a.pd.with_borrowed(&mut buf, Access::empty(), |mr| {
        // Every packet is lost: the WRITE stays queued for retransmission.
        net.set_link(LinkConfig {
            loss: 1.0,
            ..LinkConfig::perfect()
        });
        let write = SendOp::RdmaWrite {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
        };
        post(&a, write, mr, 4096);
    })
    .unwrap();
    // The caller owns its buffer again and changes it; the retransmission must not read it.
    buf.fill(0x11);
    net.set_link(LinkConfig::perfect());
    assert_eq!(wait(&a), WcStatus::LocProtErr);
    assert!(
        dst.to_vec().iter().all(|&x| x == 0),
        "nothing of the buffer left"
    );
}

#[test]
fn a_read_response_arriving_after_the_scope_writes_nothing() {
    let net = SimNetwork::perfect();
    let (a, b) = pair(&net, 4);
    let src =
        b.pd.register(vec![0x77u8; 2048], Access::REMOTE_READ)
            .unwrap();
    let mut buf = vec![0u8; 2048];
    a.pd.with_borrowed(&mut buf, Access::LOCAL_WRITE, |mr| {
        net.set_link(LinkConfig {
            loss: 1.0,
            ..LinkConfig::perfect()
        });
        let read = SendOp::RdmaRead {
            remote_addr: src.addr(),
            rkey: src.rkey(),
        };
        post(&a, read, mr, 2048);
    })
    .unwrap();
    net.set_link(LinkConfig::perfect());
    assert_eq!(wait(&a), WcStatus::LocProtErr);
    assert!(buf.iter().all(|&x| x == 0), "the response was written");
}

#[test]
fn a_panic_inside_the_scope_deregisters() {
    let net = SimNetwork::perfect();
    let (a, b) = pair(&net, 5);
    let mut buf = vec![0u8; 32];
    let mut key: Option<(u64, RKey)> = None;
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let out = catch_unwind(AssertUnwindSafe(|| {
        b.pd.with_borrowed(&mut buf, rights, |mr| {
            key = Some((mr.addr(), mr.rkey()));
            panic!("inside the scope");
        })
    }));
    assert!(out.is_err());
    let (addr, rkey) = key.unwrap();
    let src = a.pd.register(vec![0xEE; 8], Access::empty()).unwrap();
    post(
        &a,
        SendOp::RdmaWrite {
            remote_addr: addr,
            rkey,
        },
        &src,
        8,
    );
    assert_eq!(wait(&a), WcStatus::RemAccessErr);
    assert_eq!(buf, vec![0u8; 32]);
}

#[test]
fn refused_rights_and_writes_to_a_shared_borrow() {
    let net = SimNetwork::perfect();
    let dev = Device::open(DeviceConfig::sim(&net, "10.8.6.1".parse().unwrap())).unwrap();
    let pd = dev.alloc_pd();
    let mut buf = vec![1u8; 16];
    let called = std::cell::Cell::new(false);
    let bind = Access::LOCAL_WRITE | Access::MW_BIND;
    let r = pd.with_borrowed(&mut buf, bind, |_| called.set(true));
    assert!(matches!(
        r,
        Err(VerbsError::Register(RegisterError::InvalidAccess { .. }))
    ));
    let r = pd.with_borrowed(&mut buf, Access::REMOTE_WRITE, |_| called.set(true));
    assert!(matches!(r, Err(VerbsError::Register(_))));
    for bad in [Access::LOCAL_WRITE, Access::REMOTE_ATOMIC, Access::MW_BIND] {
        let r = pd.with_borrowed_ref(&buf, bad, |_| called.set(true));
        assert!(matches!(
            r,
            Err(VerbsError::Register(RegisterError::InvalidAccess { .. }))
        ));
    }
    assert!(!called.get());
    let shared = buf.clone();
    pd.with_borrowed_ref(&shared, Access::REMOTE_READ, |mr| {
        assert!(matches!(
            mr.write(0, &[9]),
            Err(AccessError::AccessDenied { .. })
        ));
        let mut out = [0u8; 16];
        mr.read(0, &mut out).unwrap();
        assert_eq!(out, [1u8; 16]);
    })
    .unwrap();
    assert_eq!(shared, vec![1u8; 16]);
    // An exclusive borrow may be written through the region.
    pd.with_borrowed(&mut buf, Access::empty(), |mr| {
        mr.write(4, &[7, 7]).unwrap()
    })
    .unwrap();
    assert_eq!(&buf[3..7], &[1, 7, 7, 1]);
}

#[test]
fn a_receive_posted_in_the_scope_and_matched_after_it_writes_nothing() {
    let net = SimNetwork::perfect();
    let (a, b) = pair(&net, 7);
    let mut buf = vec![0u8; 64];
    b.pd.with_borrowed(&mut buf, Access::LOCAL_WRITE, |mr| {
        // Left posted when the scope ends.
        b.qp.post_recv(RecvWr::new(1, vec![mr.sge(0, 64)])).unwrap();
    })
    .unwrap();
    let src = a.pd.register(vec![0xAB; 64], Access::empty()).unwrap();
    post(&a, SendOp::Send, &src, 64);
    assert_eq!(wait(&b), WcStatus::LocProtErr, "the receive's scatter");
    assert_ne!(wait(&a), WcStatus::Success, "the SEND was not taken");
    assert!(buf.iter().all(|&x| x == 0), "the SEND was scattered");
}

#[test]
fn a_shared_borrow_is_never_written_even_inside_its_scope() {
    let net = SimNetwork::perfect();
    let data = vec![0x5Au8; 64];
    // Our receive scattering into it: refused locally.
    let (a, b) = pair(&net, 8);
    let src = a.pd.register(vec![0xAB; 64], Access::empty()).unwrap();
    b.pd.with_borrowed_ref(&data, Access::REMOTE_READ, |mr| {
        b.qp.post_recv(RecvWr::new(1, vec![mr.sge(0, 64)])).unwrap();
        post(&a, SendOp::Send, &src, 64);
        assert_eq!(wait(&b), WcStatus::LocProtErr, "the receive's scatter");
        assert_ne!(wait(&a), WcStatus::Success);
    })
    .unwrap();
    // Our READ's or atomic's result landing in it: refused locally.
    let remote = |x: u8| {
        let (a, b) = pair(&net, x);
        let mem =
            b.pd.register_zeroed(
                64,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            )
            .unwrap();
        (a, b, mem)
    };
    let (a, _b, mem) = remote(9);
    a.pd.with_borrowed_ref(&data, Access::empty(), |mr| {
        let read = SendOp::RdmaRead {
            remote_addr: mem.addr(),
            rkey: mem.rkey(),
        };
        post(&a, read, mr, 64);
        assert_eq!(
            wait(&a),
            WcStatus::LocProtErr,
            "a READ into a shared borrow"
        );
    })
    .unwrap();
    let (a, _b, mem) = remote(10);
    a.pd.with_borrowed_ref(&data, Access::empty(), |mr| {
        let add = SendOp::AtomicFetchAndAdd {
            remote_addr: mem.addr(),
            rkey: mem.rkey(),
            add: 1,
        };
        post(&a, add, mr, 8);
        assert_eq!(
            wait(&a),
            WcStatus::LocProtErr,
            "an atomic's result into a shared borrow"
        );
    })
    .unwrap();
    // A peer's WRITE, ATOMIC WRITE or atomic with its rkey: refused remotely.
    let ops: [&dyn Fn(u64, RKey) -> SendOp; 3] = [
        &|remote_addr, rkey| SendOp::RdmaWrite { remote_addr, rkey },
        &|remote_addr, rkey| SendOp::AtomicWrite { remote_addr, rkey },
        &|remote_addr, rkey| SendOp::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add: 1,
        },
    ];
    for (i, op) in ops.iter().enumerate() {
        let (a, b) = pair(&net, 11 + i as u8);
        let src = a.pd.register_zeroed(8, Access::LOCAL_WRITE).unwrap();
        src.write(0, &[0xEE; 8]).unwrap();
        b.pd.with_borrowed_ref(&data, Access::REMOTE_READ, |mr| {
            post(&a, op(mr.addr(), mr.rkey()), &src, 8);
            assert_eq!(wait(&a), WcStatus::RemAccessErr, "peer op {i}");
        })
        .unwrap();
    }
    assert_eq!(data, vec![0x5Au8; 64], "a shared borrow was written");
}

/// A peer streams multi-packet WRITEs into a borrowed buffer while the scope ends at a
/// varying moment: once `with_borrowed` has returned, no byte lands in the buffer any more
/// (deregistration waits for a packet being written and refuses the rest of a message
/// whose first packets landed inside the scope).
#[test]
fn remote_writes_racing_the_end_of_the_scope_never_land_after_it() {
    const LEN: usize = 64 << 10;
    let net = SimNetwork::perfect();
    for round in 0..8u8 {
        let (a, b) = pair(&net, 20 + round);
        let src = a.pd.register(vec![0xA5u8; LEN], Access::empty()).unwrap();
        let (tx, rx) = mpsc::channel::<(u64, RKey)>();
        let landed = Arc::new(AtomicU32::new(0));
        let seen = landed.clone();
        let writer = std::thread::spawn(move || {
            let (addr, rkey) = rx.recv().unwrap();
            let (mut ok, mut outstanding) = (0u32, 0u32);
            let started = Instant::now();
            loop {
                while outstanding < 4 {
                    let op = SendOp::RdmaWrite {
                        remote_addr: addr,
                        rkey,
                    };
                    if a.qp
                        .post_send(SendWr::new(1, op, vec![src.sge(0, LEN)]))
                        .is_err()
                    {
                        break;
                    }
                    outstanding += 1;
                }
                let mut wc = [Completion::EMPTY];
                assert_eq!(
                    a.cq.wait(&mut wc, Duration::from_secs(10)),
                    1,
                    "no completion"
                );
                outstanding -= 1;
                match wc[0].status {
                    WcStatus::Success => {
                        ok += 1;
                        seen.store(ok, Ordering::Release);
                    }
                    other => return (ok, other),
                }
                assert!(started.elapsed() < Duration::from_secs(20), "never refused");
            }
        });
        let mut buf = vec![0u8; LEN];
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        b.pd.with_borrowed(&mut buf, rights, |mr| {
            tx.send((mr.addr(), mr.rkey())).unwrap();
            // Once a WRITE has landed, end the scope at a different point each round.
            let t0 = Instant::now();
            while landed.load(Ordering::Acquire) == 0 && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::thread::sleep(Duration::from_micros(300 * u64::from(round)));
        })
        .unwrap();
        buf.fill(0);
        let (ok, status) = writer.join().unwrap();
        assert!(ok > 0, "round {round}: no WRITE landed inside the scope");
        assert_eq!(status, WcStatus::RemAccessErr, "round {round}");
        // Anything still in flight has been refused or dropped by now.
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            buf.iter().all(|&x| x == 0),
            "round {round}: a WRITE landed after the scope"
        );
    }
}
