//! Every operation end to end between two QPs over the simulated network (perfect links):
//! the bytes land where they should and both sides complete with the right opcode and status.

use roce_qp::testing::{Pair, PairConfig, Region};
use roce_qp::verbs::{
    AddressHandle, Mtu, QpType, RecvWr, SendData, SendOp, SendWr, UdDest, WcOpcode, WcStatus,
};
use roce_qp::GRH_LEN;
use roce_wire::{QKey, Qpn};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn post_recv(pair: &mut Pair, r: &Region, wr_id: u64) {
    pair.b
        .qp
        .post_recv(RecvWr {
            wr_id,
            sges: vec![r.sge(0, r.len as u32)],
        })
        .unwrap();
}

#[test]
fn rc_send_every_size_including_multi_packet() {
    for len in [0usize, 1, 3, 1023, 1024, 1025, 4096, 10_000, 65_536] {
        let mut pair = Pair::new(PairConfig::new(QpType::Rc, len as u64));
        let data = pattern(len, 7);
        let src = pair.a.register(&data);
        let dst = pair.b.register(&vec![0u8; len + 16]);
        post_recv(&mut pair, &dst, 99);
        pair.a
            .qp
            .post_send(
                pair.now,
                SendWr::new(1, SendOp::Send, vec![src.sge(0, len as u32)]),
            )
            .unwrap();
        assert!(pair.drive_bounded(100_000));
        let sc = pair.a.send_completions();
        assert_eq!(sc.len(), 1, "len {len}");
        assert_eq!(
            (sc[0].status, sc[0].opcode, sc[0].byte_len),
            (WcStatus::Success, WcOpcode::Send, len as u32)
        );
        let rc = pair.b.recv_completions();
        assert_eq!(rc.len(), 1);
        assert_eq!(
            (rc[0].wr_id, rc[0].status, rc[0].opcode),
            (99, WcStatus::Success, WcOpcode::Recv)
        );
        assert_eq!(rc[0].byte_len as usize, len);
        assert_eq!(&pair.b.read(&dst)[..len], &data[..]);
        let packets = if len == 0 { 1 } else { len.div_ceil(1024) } as u64;
        assert_eq!(
            pair.a.qp.stats().tx_packets,
            packets,
            "segmentation at the path MTU"
        );
        assert_eq!(pair.a.qp.stats().retransmitted_packets, 0);
    }
}

#[test]
fn rc_send_with_imm_and_inline_and_gather_list() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 3));
    let src = pair.a.register(b"0123456789abcdef");
    let dst = pair.b.register(&[0u8; 64]);
    post_recv(&mut pair, &dst, 1);
    post_recv(&mut pair, &dst, 2);
    // Gather from two SGEs: "89ab" + "0123".
    let wr = SendWr::new(
        10,
        SendOp::SendWithImm { imm: 0xCAFE_F00D },
        vec![src.sge(8, 4), src.sge(0, 4)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    let rc = pair.b.recv_completions();
    assert_eq!(rc[0].imm_data, Some(0xCAFE_F00D));
    assert_eq!(&pair.b.read(&dst)[..8], b"89ab0123");
    let mut wr = SendWr::new(11, SendOp::Send, vec![]);
    wr.data = SendData::Inline(b"inline!".to_vec());
    wr.solicited = true;
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    let rc = pair.b.recv_completions();
    assert_eq!((rc[0].wr_id, rc[0].byte_len, rc[0].solicited), (2, 7, true));
    assert_eq!(&pair.b.read(&dst)[..7], b"inline!");
}

#[test]
fn rc_write_and_write_with_imm() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 4));
    let data = pattern(5000, 1);
    let src = pair.a.register(&data);
    let dst = pair.b.register(&vec![0u8; 8192]);
    let wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst.addr + 100,
            rkey: dst.rkey(),
        },
        vec![src.sge(0, 5000)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::Success);
    assert!(
        pair.b.recv_completions().is_empty(),
        "plain WRITE consumes no receive WR"
    );
    assert_eq!(&pair.b.read(&dst)[100..5100], &data[..]);

    let spare = pair.b.register(&[0u8; 4]);
    post_recv(&mut pair, &spare, 77);
    let wr = SendWr::new(
        2,
        SendOp::RdmaWriteWithImm {
            remote_addr: dst.addr,
            rkey: dst.rkey(),
            imm: 42,
        },
        vec![src.sge(0, 2000)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    let rc = pair.b.recv_completions();
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].opcode, rc[0].imm_data, rc[0].byte_len),
        (77, WcOpcode::RecvRdmaWithImm, Some(42), 2000)
    );
    assert_eq!(&pair.b.read(&dst)[..2000], &data[..2000]);
}

#[test]
fn rc_read_single_and_multi_packet() {
    for len in [0u32, 8, 1024, 3000, 70_000] {
        let mut pair = Pair::new(PairConfig::new(QpType::Rc, 5));
        let remote = pattern(len as usize, 9);
        let src = pair.b.register(&remote);
        let dst = pair.a.register(&vec![0u8; len as usize]);
        let wr = SendWr::new(
            5,
            SendOp::RdmaRead {
                remote_addr: src.addr,
                rkey: src.rkey(),
            },
            vec![dst.sge(0, len)],
        );
        pair.a.qp.post_send(pair.now, wr).unwrap();
        assert!(pair.drive_bounded(100_000));
        let sc = pair.a.send_completions();
        assert_eq!(
            (sc[0].status, sc[0].opcode),
            (WcStatus::Success, WcOpcode::RdmaRead),
            "len {len}"
        );
        assert_eq!(pair.a.read(&dst), remote);
        // One request packet; the responder sends one response per PMTU.
        assert_eq!(pair.a.qp.stats().tx_packets, 1);
        assert_eq!(
            pair.b.qp.stats().tx_packets,
            u64::from(len.div_ceil(1024).max(1))
        );
    }
}

#[test]
fn rc_atomics_return_the_original_value_and_update_memory() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 6));
    let word = pair.b.register(&100u64.to_ne_bytes());
    let result = pair.a.register(&[0u8; 16]);
    let fadd = SendWr::new(
        1,
        SendOp::AtomicFetchAndAdd {
            remote_addr: word.addr,
            rkey: word.rkey(),
            add: 5,
        },
        vec![result.sge(0, 8)],
    );
    let cas = SendWr::new(
        2,
        SendOp::AtomicCmpAndSwp {
            remote_addr: word.addr,
            rkey: word.rkey(),
            compare: 105,
            swap: 7,
        },
        vec![result.sge(8, 8)],
    );
    pair.a.qp.post_send(pair.now, fadd).unwrap();
    pair.a.qp.post_send(pair.now, cas).unwrap();
    assert!(pair.drive_bounded(10_000));
    let sc = pair.a.send_completions();
    assert_eq!(
        sc.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::FetchAdd),
            (2, WcStatus::Success, WcOpcode::CompSwap)
        ]
    );
    let r = pair.a.read(&result);
    assert_eq!(u64::from_ne_bytes(r[..8].try_into().unwrap()), 100);
    assert_eq!(u64::from_ne_bytes(r[8..].try_into().unwrap()), 105);
    assert_eq!(
        u64::from_ne_bytes(pair.b.read(&word)[..].try_into().unwrap()),
        7
    );
}

#[test]
fn rc_send_with_invalidate_kills_the_rkey() {
    let mut pair = Pair::new(PairConfig::new(QpType::Rc, 8));
    let victim = pair.b.table.alloc_mr(pair.b.pd, 4096).unwrap();
    pair.b
        .table
        .fast_reg(
            victim,
            pair.b.pd,
            roce_mr::FastReg {
                iova: 0x9000,
                len: 4096,
                offset: 0,
                access: roce_mr::Access::LOCAL_WRITE | roce_mr::Access::REMOTE_WRITE,
            },
        )
        .unwrap();
    let src = pair.a.register(b"abcd");
    let dst = pair.b.register(&[0u8; 16]);
    post_recv(&mut pair, &dst, 3);
    let rkey = roce_wire::RKey::new(victim.0);
    pair.a
        .qp
        .post_send(
            pair.now,
            SendWr::new(1, SendOp::SendWithInv { rkey }, vec![src.sge(0, 4)]),
        )
        .unwrap();
    assert!(pair.drive_bounded(10_000));
    let rc = pair.b.recv_completions();
    assert_eq!(
        (rc[0].status, rc[0].invalidated_rkey),
        (WcStatus::Success, Some(rkey))
    );
    // A WRITE through the invalidated rkey now fails with a remote access error.
    let wr = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: 0x9000,
            rkey,
        },
        vec![src.sge(0, 4)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        pair.a.send_completions().last().unwrap().status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn uc_send_and_write() {
    let mut pair = Pair::new(PairConfig::new(QpType::Uc, 9));
    let data = pattern(3000, 2);
    let src = pair.a.register(&data);
    let dst = pair.b.register(&vec![0u8; 4096]);
    post_recv(&mut pair, &dst, 1);
    pair.a
        .qp
        .post_send(
            pair.now,
            SendWr::new(1, SendOp::Send, vec![src.sge(0, 3000)]),
        )
        .unwrap();
    let wr = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: dst.addr + 3000,
            rkey: dst.rkey(),
        },
        vec![src.sge(0, 1000)],
    );
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(pair.a.send_completions().len(), 2);
    assert_eq!(pair.b.recv_completions()[0].byte_len, 3000);
    let mem = pair.b.read(&dst);
    assert_eq!(&mem[..3000], &data[..]);
    assert_eq!(&mem[3000..4000], &data[..1000]);
    assert_eq!(
        pair.b.qp.stats().tx_packets,
        0,
        "UC sends no acknowledgements"
    );
    assert_eq!(
        pair.a.qp.post_send(
            pair.now,
            SendWr::new(
                3,
                SendOp::RdmaRead {
                    remote_addr: 0,
                    rkey: dst.rkey()
                },
                vec![]
            )
        ),
        Err(roce_qp::PostError::UnsupportedOp)
    );
}

#[test]
fn ud_send_gets_grh_area_and_qkey_is_checked() {
    let mut cfg = PairConfig::new(QpType::Ud, 10);
    cfg.mtu = Mtu::Mtu1024;
    let mut pair = Pair::new(cfg);
    let src = pair.a.register(b"datagram");
    let dst = pair.b.register(&[0u8; GRH_LEN + 64]);
    post_recv(&mut pair, &dst, 5);
    let dest = UdDest {
        ah: AddressHandle::new(pair.b.gid),
        remote_qpn: Qpn::new(0x12),
        remote_qkey: QKey::new(0x1111_1111),
    };
    let mut wr = SendWr::new(1, SendOp::SendWithImm { imm: 9 }, vec![src.sge(0, 8)]);
    wr.ud = Some(dest);
    pair.a.qp.post_send(pair.now, wr.clone()).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(pair.a.send_completions()[0].status, WcStatus::Success);
    let rc = pair.b.recv_completions();
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (rc[0].byte_len, rc[0].grh, rc[0].src_qp, rc[0].imm_data),
        ((GRH_LEN + 8) as u32, true, Qpn::new(0x11), Some(9))
    );
    assert_eq!(&pair.b.read(&dst)[GRH_LEN..GRH_LEN + 8], b"datagram");
    // Wrong Q_Key: dropped and counted, no completion.
    post_recv(&mut pair, &dst, 6);
    wr.ud = Some(UdDest {
        remote_qkey: QKey::new(0x2222),
        ..dest
    });
    pair.a.qp.post_send(pair.now, wr.clone()).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert!(pair.b.recv_completions().is_empty());
    assert_eq!(pair.b.qp.stats().drop_qkey, 1);
    // Larger than the path MTU: local length error.
    let big = pair.a.register(&vec![1u8; 2000]);
    let mut wr = SendWr::new(3, SendOp::Send, vec![big.sge(0, 2000)]);
    wr.ud = Some(dest);
    pair.a.qp.post_send(pair.now, wr).unwrap();
    assert!(pair.drive_bounded(10_000));
    assert_eq!(
        pair.a.send_completions().last().unwrap().status,
        WcStatus::LocLenErr
    );
}
