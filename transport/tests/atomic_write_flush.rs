//! ATOMIC WRITE and FLUSH over the transport API: a device advertises them in
//! `device_cap_flags_ex` (as rdma-core's `ibv_query_device_ex`), and two devices on the sim
//! network carry both end to end.

use std::time::Duration;

use roce_transport::{
    Access, Completion, ConnectOptions, Device, DeviceCapFlagsEx, DeviceConfig, FlushLevel,
    FlushPlacement, Progress, Psn, QpInit, QpType, QueuePair, RKey, RemoteQp, SendOp, SendWr,
    SimNetwork, WcOpcode, WcStatus,
};

fn device(net: &SimNetwork, ip: &str, name: &str) -> Device {
    Device::open(
        DeviceConfig::sim(net, ip.parse().unwrap())
            .name(name)
            .progress(Progress::Thread),
    )
    .unwrap()
}

#[test]
fn a_device_advertises_atomic_write_and_flush() {
    let net = SimNetwork::perfect();
    let dev = device(&net, "10.9.3.1", "sim-caps");
    let caps = dev.query_device().device_cap_flags_ex;
    assert!(caps.contains(DeviceCapFlagsEx::ATOMIC_WRITE), "{caps:?}");
    assert!(caps.contains(DeviceCapFlagsEx::FLUSH_GLOBAL), "{caps:?}");
    assert!(
        caps.contains(DeviceCapFlagsEx::FLUSH_PERSISTENT),
        "{caps:?}"
    );
    assert_eq!(caps.bits(), (1 << 38) | (1 << 39) | (1 << 40));
}

#[test]
fn atomic_write_and_flush_work_end_to_end_between_two_devices() {
    let net = SimNetwork::perfect();
    let (a, b) = (
        device(&net, "10.9.3.1", "sim-a"),
        device(&net, "10.9.3.2", "sim-b"),
    );
    let rights = Access::LOCAL_WRITE
        | Access::REMOTE_WRITE
        | Access::REMOTE_READ
        | Access::REMOTE_ATOMIC
        | Access::FLUSH_GLOBAL
        | Access::FLUSH_PERSISTENT;
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(8).unwrap(), b.create_cq(8).unwrap());
    let qa = pa.create_qp(&QpInit::new(QpType::Rc, &ca)).unwrap();
    let qb = pb.create_qp(&QpInit::new(QpType::Rc, &cb)).unwrap();
    let o = ConnectOptions {
        access: rights,
        ..ConnectOptions::default()
    };
    let remote = |q: &QueuePair, d: &Device| RemoteQp {
        qpn: q.qpn(),
        psn: Psn::new(0),
        gid: d.local_gid(),
    };
    qa.connect(&remote(&qb, &b), &o).unwrap();
    qb.connect(&remote(&qa, &a), &o).unwrap();
    // `connect` gives the QP the remote rights of `access`, the FLUSH ones included
    // (IBV_ACCESS_FLUSH_*, which rxe also requires on the QP).
    assert!(qb.attr().access_flags.contains(Access::FLUSH_GLOBAL));
    let value = 0x0123_4567_89AB_CDEFu64;
    let src = pa
        .register(value.to_ne_bytes().to_vec(), Access::LOCAL_WRITE)
        .unwrap();
    let dst = pb.register(vec![0xEEu8; 24], rights).unwrap();
    let rkey = RKey::new(dst.rkey().value());

    let write = SendOp::AtomicWrite {
        remote_addr: dst.addr() + 8,
        rkey,
    };
    qa.post_send(SendWr::new(1, write, vec![src.sge(0, 8)]))
        .unwrap();
    let flush = SendOp::Flush {
        remote_addr: dst.addr(),
        rkey,
        len: 24,
        placement: FlushPlacement::GLOBAL,
        level: FlushLevel::Range,
    };
    qa.post_send(SendWr::new(2, flush, vec![])).unwrap();

    let mut got = Vec::new();
    let mut wc = [Completion::EMPTY];
    while got.len() < 2 && ca.wait(&mut wc, Duration::from_secs(5)) == 1 {
        got.push((wc[0].wr_id, wc[0].status, wc[0].opcode));
    }
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::AtomicWrite),
            (2, WcStatus::Success, WcOpcode::Flush),
        ],
        "a {:?}\nb {:?}",
        a.counters(),
        b.counters()
    );
    let mem = dst.to_vec();
    assert_eq!(&mem[8..16], &value.to_ne_bytes());
    assert!(mem[..8].iter().chain(&mem[16..]).all(|&b| b == 0xEE));
}
