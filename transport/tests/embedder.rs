//! What an application embedding the transport meets (issue 15, "the library as an embedder
//! meets it"): a `RemoteQp` that survives every serialised form, opening a device by
//! interface and GID index (with the errors naming the interface and its table), library
//! errors that name no CLI flag, and a whole connection set up through the serialised
//! out-of-band exchange over real sockets.
//!
//! The socket tests run in a private network namespace (`private_net`), so they may bind
//! 127.0.0.1:4791 and 127.0.0.2:4791 while other tests do the same.

use std::time::Duration;

use proptest::prelude::*;
use roce_testkit::netns::private_net;
use roce_transport::{
    Access, Completion, ConnectOptions, Device, DeviceConfig, Gid, OpenError, Psn, QpInit, QpType,
    Qpn, RecvWr, RemoteQp, RemoteQpParseError, SendOp, SendWr, WcOpcode, WcStatus,
};

fn remote(qpn: u32, psn: u32, gid: [u8; 16]) -> RemoteQp {
    RemoteQp {
        qpn: Qpn::new(qpn),
        psn: Psn::new(psn),
        gid: Gid(gid),
    }
}

proptest! {
    #[test]
    fn remote_qp_round_trips_through_every_form(
        qpn in 0u32..=0x00FF_FFFF,
        psn in 0u32..=0x00FF_FFFF,
        gid in any::<[u8; 16]>(),
    ) {
        let r = remote(qpn, psn, gid);
        let json = serde_json::to_string(&r).unwrap();
        prop_assert_eq!(serde_json::from_str::<RemoteQp>(&json).unwrap(), r);
        let bytes = r.to_bytes();
        prop_assert_eq!(bytes.len(), RemoteQp::WIRE_LEN);
        prop_assert_eq!(RemoteQp::from_bytes(&bytes).unwrap(), r);
        let text = r.to_string();
        prop_assert_eq!(text.len(), 51);
        prop_assert_eq!(text.parse::<RemoteQp>().unwrap(), r);
        prop_assert_eq!(text.to_uppercase().parse::<RemoteQp>().unwrap(), r);
    }

    #[test]
    fn remote_qp_parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = RemoteQp::from_bytes(&bytes);
        let _ = String::from_utf8_lossy(&bytes).parse::<RemoteQp>();
        let _ = serde_json::from_slice::<RemoteQp>(&bytes);
    }
}

#[test]
fn remote_qp_forms_are_the_documented_ones() {
    let r = remote(
        0x11,
        0x67_2a2c,
        Gid::from_ip("127.0.0.2".parse().unwrap()).0,
    );
    // The serde form: numbers and the GID's IPv6 text.
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"qpn":17,"psn":6761004,"gid":"::ffff:127.0.0.2"}"#
    );
    // The bytes: QPN, PSN big-endian, then the GID.
    let b = r.to_bytes();
    assert_eq!(&b[..8], &[0, 0, 0, 0x11, 0, 0x67, 0x2a, 0x2c]);
    assert_eq!(&b[8..], &Gid::from_ip("127.0.0.2".parse().unwrap()).0);
    // The text: ibv_rc_pingpong's record (shared/captures/rc_pingpong.pcap frame 4 has
    // `0000:000011:96d2ce:00000000000000000000ffff0a4d0002\0`), with or without the NUL.
    let captured = "0000:000011:96d2ce:00000000000000000000ffff0a4d0002\0";
    let parsed: RemoteQp = captured.parse().unwrap();
    assert_eq!(
        parsed,
        remote(
            0x11,
            0x96_d2ce,
            Gid::from_ip("10.77.0.2".parse().unwrap()).0
        )
    );
    assert_eq!(format!("{parsed}\0"), captured);
}

#[test]
fn remote_qp_refuses_bad_input_with_a_typed_error() {
    assert_eq!(
        RemoteQp::from_bytes(&[0; 23]),
        Err(RemoteQpParseError::Length {
            expected: 24,
            got: 23
        })
    );
    let mut b = remote(1, 2, [0; 16]).to_bytes();
    b[0] = 1; // QPN 0x0100_0001
    assert_eq!(
        RemoteQp::from_bytes(&b),
        Err(RemoteQpParseError::Range {
            field: "QPN",
            value: 0x0100_0001
        })
    );
    for bad in [
        "",
        "0000:000011:96d2ce",
        "0000:000011:96d2ce:00000000000000000000ffff0a4d000",
        "0000:0000111:96d2ce:00000000000000000000ffff0a4d0002",
        "0000:+00011:96d2ce:00000000000000000000ffff0a4d0002",
        "0000:000011:96d2ce:00000000000000000000ffff0a4d0002:",
    ] {
        assert!(
            matches!(bad.parse::<RemoteQp>(), Err(RemoteQpParseError::Text(_))),
            "{bad:?}"
        );
    }
    let err = serde_json::from_str::<RemoteQp>(r#"{"qpn":16777216,"psn":0,"gid":"::1"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("QPN 0x1000000 does not fit in 24 bits"),
        "{err}"
    );
    let err = serde_json::from_str::<RemoteQp>(r#"{"qpn":1,"psn":0,"gid":"10.0.0.1"}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not an IPv6 address"), "{err}");
}

#[test]
fn open_by_interface_and_gid_index() {
    let _net = private_net();
    // A fresh namespace's lo: [0] fe80::200:ff:fe00:0 (link-local), [1] ::ffff:127.0.0.1.
    let dev = Device::open_interface("lo", 1).unwrap();
    assert_eq!(dev.local_gid(), Gid::from_ip("127.0.0.1".parse().unwrap()));
    assert_eq!(dev.local_gid_index(), Some(1));
    assert_eq!(dev.query_device().name, "lo");

    let msg = match DeviceConfig::interface("lo", 0) {
        Err(e @ OpenError::UnusableGid { index: 0, .. }) => e.to_string(),
        other => panic!("GID 0 of lo: {other:?}"),
    };
    assert!(msg.contains("link-local"), "{msg}");
    let msg = match DeviceConfig::interface("lo", 200) {
        Err(e @ OpenError::NoSuchGid { index: 200, .. }) => e.to_string(),
        other => panic!("GID 200 of lo: {other:?}"),
    };
    assert!(
        msg.starts_with("GID index 200 does not exist on lo")
            && msg.contains("[1] ::ffff:127.0.0.1"),
        "{msg}"
    );
    let msg = match DeviceConfig::interface("rxe0", 1) {
        Err(e @ OpenError::NoSuchInterface { .. }) => e.to_string(),
        other => panic!("rxe0: {other:?}"),
    };
    assert!(msg.contains("\"rxe0\"") && msg.contains("lo"), "{msg}");
}

#[test]
fn library_errors_name_no_cli_flag() {
    let _net = private_net();
    let err = Device::open(DeviceConfig::udp("192.0.2.99".parse().unwrap()))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("192.0.2.99 is not an address of this host"),
        "{err}"
    );
    let errs = [
        err,
        DeviceConfig::interface("lo", 0).unwrap_err().to_string(),
        DeviceConfig::interface("lo", 99).unwrap_err().to_string(),
        DeviceConfig::interface("nosuch0", 1)
            .unwrap_err()
            .to_string(),
    ];
    for e in errs {
        for flag in [" -a", "-d ", "-g ", "-x ", "--"] {
            assert!(!e.contains(flag), "{e:?} names the CLI flag {flag:?}");
        }
    }
}

/// Two devices in one process, one opened by interface and GID index, connected through the
/// JSON form of `RemoteQp` (what crosses any out-of-band channel), then a SEND into a posted
/// `RecvWr::new` and an RDMA WRITE; the completion statuses print as rdma-core's.
#[test]
fn serialised_exchange_connects_two_devices() {
    let _net = private_net();
    let a = Device::open_interface("lo", 1).unwrap();
    let b = Device::open(DeviceConfig::udp("127.0.0.2".parse().unwrap())).unwrap();
    let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
    let (cq_a, cq_b) = (a.create_cq(16).unwrap(), b.create_cq(16).unwrap());
    let qp_a = pd_a.create_qp(&QpInit::new(QpType::Rc, &cq_a)).unwrap();
    let qp_b = pd_b.create_qp(&QpInit::new(QpType::Rc, &cq_b)).unwrap();

    let recv = pd_b
        .register(vec![0u8; 64], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();

    let (psn_a, psn_b) = (Psn::new(a.random_psn()), Psn::new(b.random_psn()));
    // What each side ships to the other, as text on the wire.
    let from_a = serde_json::to_string(&qp_a.endpoint(psn_a)).unwrap();
    let from_b = serde_json::to_string(&qp_b.endpoint(psn_b)).unwrap();
    let at_a: RemoteQp = serde_json::from_str(&from_b).unwrap();
    let at_b: RemoteQp = serde_json::from_str(&from_a).unwrap();
    assert_eq!(at_b.gid, Gid::from_ip("127.0.0.1".parse().unwrap()));
    let opts = |psn| ConnectOptions {
        local_psn: psn,
        ..ConnectOptions::default()
    };
    qp_a.connect(&at_a, &opts(psn_a)).unwrap();
    qp_b.connect(&at_b, &opts(psn_b)).unwrap();
    // A receive can be posted from INIT on (connect went through INIT to RTS).
    qp_b.post_recv(RecvWr::new(77, vec![recv.sge(0, 64)]))
        .unwrap();

    let src = pd_a
        .register(b"hello, embedder".to_vec(), Access::LOCAL_WRITE)
        .unwrap();
    qp_a.post_send(SendWr::new(1, SendOp::Send, vec![src.sge(0, 15)]))
        .unwrap();
    let write = SendOp::RdmaWrite {
        remote_addr: recv.addr() + 32,
        rkey: recv.rkey(),
    };
    qp_a.post_send(SendWr::new(2, write, vec![src.sge(0, 5)]))
        .unwrap();

    let mut wc = [Completion::EMPTY; 4];
    let mut got_a = Vec::new();
    while got_a.len() < 2 {
        let n = cq_a.wait(&mut wc, Duration::from_secs(10));
        assert!(n > 0, "no send completion within 10 s");
        got_a.extend_from_slice(&wc[..n]);
    }
    let n = cq_b.wait(&mut wc, Duration::from_secs(10));
    assert_eq!(n, 1, "one receive completion");
    assert_eq!(
        (wc[0].wr_id, wc[0].opcode, wc[0].byte_len),
        (77, WcOpcode::Recv, 15)
    );
    assert_eq!(wc[0].status.to_string(), "success");
    for c in &got_a {
        assert_eq!(c.status, WcStatus::Success, "{:#}", c.status);
    }
    let data = recv.to_vec();
    assert_eq!(&data[..15], b"hello, embedder");
    assert_eq!(&data[32..37], b"hello");
}

/// What `ConnectOptions` documents about RNR: with the default `rnr_retry` 7 a SEND to a QP
/// with no receive posted is retried forever (RNR NAKs counted, no completion); with
/// `rnr_retry` 2 it completes with `RnrRetryExcErr` after the retries.
#[test]
fn rnr_retry_seven_retries_forever_and_below_seven_gives_up() {
    use roce_transport::SimNetwork;

    for (rnr_retry, status) in [(7u8, None), (2, Some(WcStatus::RnrRetryExcErr))] {
        let net = SimNetwork::perfect();
        let a = Device::open(DeviceConfig::sim(&net, "10.0.0.1".parse().unwrap())).unwrap();
        let b = Device::open(DeviceConfig::sim(&net, "10.0.0.2".parse().unwrap())).unwrap();
        let (pd_a, pd_b) = (a.alloc_pd(), b.alloc_pd());
        let (cq_a, cq_b) = (a.create_cq(4).unwrap(), b.create_cq(4).unwrap());
        let qp_a = pd_a.create_qp(&QpInit::new(QpType::Rc, &cq_a)).unwrap();
        let qp_b = pd_b.create_qp(&QpInit::new(QpType::Rc, &cq_b)).unwrap();
        let psn = Psn::new(1);
        let opts = ConnectOptions {
            local_psn: psn,
            rnr_retry,
            // The responder asks for 0.01 ms between retries (IBTA code 1).
            min_rnr_timer: 1,
            ..ConnectOptions::default()
        };
        qp_a.connect(&qp_b.endpoint(psn), &opts).unwrap();
        qp_b.connect(&qp_a.endpoint(psn), &opts).unwrap();
        let src = pd_a.register(vec![7u8; 8], Access::LOCAL_WRITE).unwrap();
        qp_a.post_send(SendWr::new(5, SendOp::Send, vec![src.sge(0, 8)]))
            .unwrap();
        let mut wc = [Completion::EMPTY; 1];
        let n = cq_a.wait(&mut wc, Duration::from_millis(300));
        let naks = qp_a.stats().rnr_naks_received;
        match status {
            None => {
                assert_eq!(n, 0, "rnr_retry 7 completed: {:?}", wc[0]);
                assert!(naks > 3, "only {naks} RNR NAKs in 300 ms");
            }
            Some(s) => {
                assert_eq!(n, 1, "rnr_retry {rnr_retry}: no completion in 300 ms");
                assert_eq!((wc[0].wr_id, wc[0].status), (5, s), "{:#}", wc[0].status);
                assert_eq!(
                    naks,
                    u64::from(rnr_retry) + 1,
                    "the first NAK and {rnr_retry} retries"
                );
            }
        }
    }
}
