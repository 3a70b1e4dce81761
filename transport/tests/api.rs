//! The public API's contracts: thread safety, the completion channel's descriptor under
//! mio/epoll, solicited-only notification, many devices in one process, queries.

use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use roce_transport::{
    Access, Completion, CompletionQueue, ConnectOptions, Device, DeviceConfig, MemoryRegion,
    ProtectionDomain, Psn, QpInit, QpType, QueuePair, RecvWr, RemoteQp, SendData, SendOp, SendWr,
    SharedReceiveQueue, SimNetwork, WcOpcode, WcStatus,
};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn verbs_objects_are_send_and_sync() {
    assert_send_sync::<Device>();
    assert_send_sync::<ProtectionDomain>();
    assert_send_sync::<MemoryRegion>();
    assert_send_sync::<CompletionQueue>();
    assert_send_sync::<QueuePair>();
    assert_send_sync::<SharedReceiveQueue>();
}

struct Rc {
    a: Device,
    b: Device,
    qa: QueuePair,
    qb: QueuePair,
    ca: CompletionQueue,
    cb: CompletionQueue,
    pa: ProtectionDomain,
    pb: ProtectionDomain,
}

fn rc_pair(net: &SimNetwork, x: u8) -> Rc {
    let a = Device::open(DeviceConfig::sim(
        net,
        format!("10.1.{x}.1").parse().unwrap(),
    ))
    .unwrap();
    let b = Device::open(DeviceConfig::sim(
        net,
        format!("10.1.{x}.2").parse().unwrap(),
    ))
    .unwrap();
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb)).unwrap();
    let o = ConnectOptions::default();
    let r = |q: &QueuePair, d: &Device| RemoteQp {
        qpn: q.qpn(),
        psn: Psn::new(0),
        gid: d.local_gid(),
    };
    qa.connect(&r(&qb, &b), &o).unwrap();
    qb.connect(&r(&qa, &a), &o).unwrap();
    Rc {
        a,
        b,
        qa,
        qb,
        ca,
        cb,
        pa,
        pb,
    }
}

#[test]
fn the_completion_channel_wakes_an_epoll_loop() {
    let net = SimNetwork::perfect();
    let p = rc_pair(&net, 1);
    let mut poll = Poll::new().unwrap();
    let fd = p.cb.event_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), Token(7), Interest::READABLE)
        .unwrap();
    let mut events = Events::with_capacity(4);
    // Not armed: a completion does not wake the loop.
    let dst = p.pb.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
    let src = p.pa.register(vec![3u8; 64], Access::LOCAL_WRITE).unwrap();
    p.qb.post_recv(RecvWr {
        wr_id: 1,
        sges: vec![dst.sge(0, 64)],
    })
    .unwrap();
    p.qa.post_send(SendWr::new(1, SendOp::Send, vec![src.sge(0, 64)]))
        .unwrap();
    let mut wc = [Completion::EMPTY; 4];
    assert_eq!(p.cb.wait(&mut wc, Duration::from_secs(5)), 1);
    poll.poll(&mut events, Some(Duration::from_millis(50)))
        .unwrap();
    assert!(events.is_empty(), "woke without being armed");
    // Armed: the next completion makes the descriptor readable.
    p.cb.req_notify(false);
    p.qb.post_recv(RecvWr {
        wr_id: 2,
        sges: vec![dst.sge(0, 64)],
    })
    .unwrap();
    p.qa.post_send(SendWr::new(2, SendOp::Send, vec![src.sge(0, 64)]))
        .unwrap();
    poll.poll(&mut events, Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        events.iter().map(|e| e.token()).collect::<Vec<_>>(),
        vec![Token(7)]
    );
    assert!(p.cb.get_event(Duration::ZERO));
    assert_eq!(p.cb.poll(&mut wc), 1);
    assert_eq!(wc[0].wr_id, 2);
    assert_eq!(dst.to_vec(), vec![3u8; 64]);
    // Consumed: no second event.
    assert!(!p.cb.get_event(Duration::from_millis(20)));
    let mut sent = [Completion::EMPTY; 4];
    let mut n = 0;
    while n < 2 {
        let got = p.ca.wait(&mut sent[n..], Duration::from_secs(5));
        assert!(got > 0, "send completions missing");
        n += got;
    }
    assert_eq!(
        sent[..2].iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![1, 2]
    );
}

#[test]
fn solicited_only_notification_waits_for_the_solicited_event_bit() {
    let net = SimNetwork::perfect();
    let p = rc_pair(&net, 2);
    let dst = p.pb.register(vec![0u8; 8], Access::LOCAL_WRITE).unwrap();
    let src = p.pa.register(vec![1u8; 8], Access::LOCAL_WRITE).unwrap();
    p.cb.req_notify(true);
    for (id, solicited) in [(1u64, false), (2, true)] {
        p.qb.post_recv(RecvWr {
            wr_id: id,
            sges: vec![dst.sge(0, 8)],
        })
        .unwrap();
        let mut wr = SendWr::new(id, SendOp::Send, vec![src.sge(0, 8)]);
        wr.solicited = solicited;
        p.qa.post_send(wr).unwrap();
        let mut wc = [Completion::EMPTY];
        assert_eq!(p.cb.wait(&mut wc, Duration::from_secs(5)), 1);
        assert_eq!(wc[0].solicited, solicited);
        assert_eq!(
            p.cb.get_event(Duration::from_millis(20)),
            solicited,
            "wr {id}"
        );
    }
}

#[test]
fn many_devices_in_one_process_are_independent() {
    let net = SimNetwork::perfect();
    let pairs: Vec<Rc> = (10..14).map(|x| rc_pair(&net, x)).collect();
    let mut regions = Vec::new();
    for (i, p) in pairs.iter().enumerate() {
        let dst =
            p.pb.register(vec![0u8; 32], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap();
        let src =
            p.pa.register(vec![i as u8 + 1; 32], Access::LOCAL_WRITE)
                .unwrap();
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: dst.addr(),
            rkey: dst.rkey(),
            imm: i as u32,
        };
        p.qb.post_recv(RecvWr {
            wr_id: 0,
            sges: vec![],
        })
        .unwrap();
        p.qa.post_send(SendWr::new(i as u64, op, vec![src.sge(0, 32)]))
            .unwrap();
        regions.push((src, dst));
    }
    for (i, p) in pairs.iter().enumerate() {
        let mut wc = [Completion::EMPTY];
        assert_eq!(p.cb.wait(&mut wc, Duration::from_secs(5)), 1);
        assert_eq!(wc[0].opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc[0].imm_data, Some(i as u32));
        assert_eq!(wc[0].status, WcStatus::Success);
        assert_eq!(regions[i].1.to_vec(), vec![i as u8 + 1; 32]);
        assert_eq!(p.ca.wait(&mut wc, Duration::from_secs(5)), 1);
        assert!(p.a.counters().sent_pkts >= 1 && p.b.counters().rcvd_pkts >= 1);
    }
}

#[test]
fn queries_describe_the_device() {
    let net = SimNetwork::perfect();
    let p = rc_pair(&net, 3);
    let attr = p.a.query_device();
    assert_eq!(attr.backend, "sim");
    assert!(attr.max_qp_rd_atom >= 16);
    let port = p.a.query_port();
    assert_eq!(
        port.local.ip(),
        "10.1.3.1".parse::<std::net::IpAddr>().unwrap()
    );
    assert_eq!(port.gid_tbl_len, p.a.gid_table().len());
    assert_eq!(
        p.a.gid(p.a.local_gid_index().unwrap()).unwrap(),
        p.a.local_gid()
    );
    assert_eq!(p.qa.state(), roce_transport::QpState::Rts);
    assert_eq!(p.qa.attr().dest_qpn, p.qb.qpn());
}

/// `post_send_batch_coalesced`: the WRs go in post order with one doorbell, a plain WRITE
/// lands before the zero-length WRITE WITH IMMEDIATE behind it completes (RC order), only the
/// signalled WR completes on the send side, and a refused WR stops the batch with the count
/// of those posted, which still run.
#[test]
fn a_coalesced_batch_places_a_write_before_the_immediate_behind_it() {
    let net = SimNetwork::perfect();
    let p = rc_pair(&net, 9);
    let len = 3 * 4096 + 100;
    let dst =
        p.pb.register(vec![0u8; len], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let src = p.pa.register(data.clone(), Access::LOCAL_WRITE).unwrap();
    for round in 0..3u32 {
        p.qb.post_recv(RecvWr {
            wr_id: 0,
            sges: vec![],
        })
        .unwrap();
        let write = SendWr {
            signaled: false,
            ..SendWr::new(
                100,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr(),
                    rkey: dst.rkey(),
                },
                vec![src.sge(0, len)],
            )
        };
        let imm = SendWr {
            data: SendData::Inline(Vec::new()),
            ..SendWr::new(
                200 + u64::from(round),
                SendOp::RdmaWriteWithImm {
                    remote_addr: dst.addr(),
                    rkey: dst.rkey(),
                    imm: 0xabc0 + round,
                },
                Vec::new(),
            )
        };
        let posted = if round < 2 {
            p.qa.post_send_batch_coalesced([write, imm]).unwrap()
        } else {
            // A third WR with more scatter/gather entries than the QP takes is refused: the
            // two before it are posted and run.
            let bad = SendWr::new(300, SendOp::Send, (0..64).map(|_| src.sge(0, 1)).collect());
            let (n, e) =
                p.qa.post_send_batch_coalesced([write, imm, bad])
                    .unwrap_err();
            assert_eq!(e.to_string(), "invalid scatter/gather list or inline data");
            n
        };
        assert_eq!(posted, 2);
        let mut wc = [Completion::EMPTY; 4];
        assert_eq!(p.cb.wait(&mut wc, Duration::from_secs(5)), 1);
        assert_eq!(wc[0].status, WcStatus::Success);
        assert_eq!(wc[0].opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(wc[0].imm_data, Some(0xabc0 + round));
        assert_eq!(wc[0].byte_len, 0);
        assert_eq!(dst.to_vec(), data, "round {round}: the WRITE landed first");
        assert_eq!(p.ca.wait(&mut wc, Duration::from_secs(5)), 1);
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (200 + u64::from(round), WcStatus::Success)
        );
        assert_eq!(
            p.ca.wait(&mut wc, Duration::from_millis(50)),
            0,
            "unsignalled WRITE"
        );
        dst.write(0, &vec![0u8; len]).unwrap();
    }
}
