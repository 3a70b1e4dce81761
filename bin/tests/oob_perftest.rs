//! perftest 6.06's exchange (`bin/src/oob/perftest.rs`): key records, the captured payloads
//! of the lab (`shared/captures/ib_*.pcap`), byte-exact replays of both sides of every
//! captured tool's conversation, and local client/server runs over 127.0.0.1.

#[path = "../src/oob/mod.rs"]
mod oob;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::thread;
use std::time::Duration;

use oob::perftest::{
    ud_all_sizes, version_number, BwReport, PerftestConn, PerftestDest, Role, Setup, Step, SysData,
    Tool, KEY_RECORD_LEN, RC_ALL_SIZES,
};
use oob::testing::{options_capture, play, sent_by, transcript, transcript_at, Msg};
use oob::{OobError, Timeout};
use roce_wire::{Gid, Psn, Qpn, RKey};

/// `shared/captures/ib_read_bw.pcap`, frame 14: the client's (10.77.0.2) key record
/// (out_reads 0x80 = rxe's max_qp_rd_atom).
const READ_BW_CLIENT_FRAME14: &[u8; 108] = b"0000:0080:000019:4c9057:000009b4:0000557fdb840000:\
00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:02:00000000:\0";
/// `shared/captures/ib_write_bw.pcap`, frame 4: the client's version.
const WRITE_BW_FRAME4: &[u8; 16] = b"6.06\0\0\0\0\0\0\0\0\0\0\0\0";
/// Same capture, frames 8, 10 and 12: cycle buffer, cache line size, MTU enum.
const WRITE_BW_FRAME8: [u8; 4] = [0x00, 0x00, 0x10, 0x00];
const WRITE_BW_FRAME10: [u8; 4] = [0x00, 0x00, 0x00, 0x40];
const WRITE_BW_FRAME12: &[u8; 2] = b"3\0";
/// Same capture, frames 64, 66, 68, 70, 72: the client's BW report (3000 bytes, 10
/// iterations, 14.58 MB/s peak, 12.05 MB/s average, 0.004213 Mpps: the numbers both tools
/// printed, see `ib_write_bw.txt`).
const WRITE_BW_REPORT_WORDS: [[u8; 8]; 5] = [
    [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0B, 0xB8],
    [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0A],
    [0x40, 0x2D, 0x27, 0xEF, 0x3B, 0x99, 0x54, 0x5B],
    [0x40, 0x28, 0x1B, 0x35, 0xA8, 0x62, 0x77, 0xEB],
    [0x3F, 0x71, 0x41, 0x86, 0x1E, 0x6F, 0x1D, 0x7D],
];

const T: Timeout = Timeout::After(Duration::from_secs(10));

/// Every capture of a perftest tool without `-R`, and the tool.
const CAPTURES: [(&str, Tool); 9] = [
    ("ib_send_bw", Tool::SendBw),
    ("ib_send_bw_ud", Tool::SendBw),
    ("ib_write_bw", Tool::WriteBw),
    ("ib_read_bw", Tool::ReadBw),
    ("ib_atomic_bw_fadd", Tool::AtomicBw),
    ("ib_atomic_bw_cas", Tool::AtomicBw),
    ("ib_send_lat", Tool::SendLat),
    ("ib_write_lat", Tool::WriteLat),
    ("ib_read_lat", Tool::ReadLat),
];

fn key(qpn: u32, psn: u32, ip: [u8; 4]) -> PerftestDest {
    PerftestDest {
        lid: 0,
        out_reads: 1,
        qpn: Qpn::new(qpn),
        psn: Psn::new(psn),
        rkey: RKey::new(0x1234),
        vaddr: 0x7F00_0000_0000 + u64::from(qpn),
        gid: Gid::from(Ipv4Addr::from(ip)),
        srqn: 0,
    }
}

/// The first key record each side sent in a captured conversation.
fn captured_keys(script: &[Msg]) -> (PerftestDest, PerftestDest) {
    let first = |client: bool| {
        let m = script
            .iter()
            .find(|m| m.from_client == client && m.bytes.len() == KEY_RECORD_LEN)
            .expect("a key record");
        PerftestDest::parse(&m.bytes).unwrap()
    };
    (first(true), first(false))
}

/// The client's BW report as captured (the five 8-byte client messages).
fn captured_client_report(script: &[Msg]) -> BwReport {
    let w: Vec<[u8; 8]> = script
        .iter()
        .filter(|m| m.from_client && m.bytes.len() == 8)
        .map(|m| m.bytes[..].try_into().unwrap())
        .collect();
    assert_eq!(w.len(), 5);
    BwReport {
        size: u64::from_be_bytes(w[0]),
        iters: u64::from_be_bytes(w[1]),
        bw_peak: f64::from_be_bytes(w[2]),
        bw_avg: f64::from_be_bytes(w[3]),
        msg_rate_avg: f64::from_be_bytes(w[4]),
    }
}

/// The message shape a plan implies: (sent by the client, length) per message, the final
/// `done` pair excluded (its order varies: both sides write without reading).
fn plan_shape(plan: &[Step]) -> (Vec<(bool, usize)>, bool) {
    let mut out = Vec::new();
    let mut both = |n: usize| {
        out.push((true, n));
        out.push((false, n));
    };
    let mut done = false;
    for step in plan {
        match step {
            Step::Versions => both(16),
            Step::SysData => {
                both(4);
                both(4);
            }
            Step::Mtu => both(2),
            Step::HandShake => both(KEY_RECORD_LEN),
            Step::Traffic => {}
            Step::BwReport => (0..5).for_each(|_| both(8)),
            Step::Close => {
                both(KEY_RECORD_LEN);
                done = true;
            }
        }
    }
    (out, done)
}

#[test]
fn key_record_round_trip() {
    let k = PerftestDest {
        lid: 0x0001,
        out_reads: 0x0080,
        qpn: Qpn::new(0x00AB_CDEF),
        psn: Psn::new(0x0012_3456),
        rkey: RKey::new(0xDEAD_BEEF),
        vaddr: 0x0000_5577_AC2E_C000,
        gid: "fe80::5054:ff:fe77:1".parse().unwrap(),
        srqn: 0x0102_0304,
    };
    let rec = k.to_record();
    assert_eq!(
        &rec[..],
        &b"0001:0080:abcdef:123456:deadbeef:00005577ac2ec000:\
fe:80:00:00:00:00:00:00:50:54:00:ff:fe:77:00:01:01020304:\0"[..]
    );
    assert_eq!(PerftestDest::parse(&rec).unwrap(), k);
}

#[test]
fn captured_payloads_parse_and_reformat() {
    let k = PerftestDest::parse(READ_BW_CLIENT_FRAME14).unwrap();
    assert_eq!(k.out_reads, 0x80);
    assert_eq!(k.qpn, Qpn::new(0x19));
    assert_eq!(k.psn, Psn::new(0x4C_9057));
    assert_eq!(k.rkey, RKey::new(0x09B4));
    assert_eq!(k.vaddr, 0x0000_557F_DB84_0000);
    assert_eq!(k.gid, Gid::from(Ipv4Addr::new(10, 77, 0, 2)));
    assert_eq!(k.srqn, 0);
    assert_eq!(&k.to_record(), READ_BW_CLIENT_FRAME14);

    assert_eq!(&WRITE_BW_FRAME4[..4], oob::perftest::VERSION.as_bytes());
    let sys = SysData::default();
    assert_eq!(sys.cycle_buffer.to_be_bytes(), WRITE_BW_FRAME8);
    assert_eq!(sys.cache_line_size.to_be_bytes(), WRITE_BW_FRAME10);
    assert_eq!(WRITE_BW_FRAME12, b"3\0");

    let r = [
        u64::from_be_bytes(WRITE_BW_REPORT_WORDS[0]),
        u64::from_be_bytes(WRITE_BW_REPORT_WORDS[1]),
    ];
    assert_eq!(r, [3_000, 10]);
    let peak = f64::from_be_bytes(WRITE_BW_REPORT_WORDS[2]);
    let avg = f64::from_be_bytes(WRITE_BW_REPORT_WORDS[3]);
    let rate = f64::from_be_bytes(WRITE_BW_REPORT_WORDS[4]);
    assert_eq!(
        format!("{peak:.2} {avg:.2} {rate:.6}"),
        "14.58 12.05 0.004213"
    );
    assert_eq!(version_number("6.06"), Some(6.06));
    assert_eq!(version_number("5.33-beta"), Some(5.33));
    assert_eq!(version_number("x"), None);
}

/// [`Tool::plan`] is exactly the message sequence of every captured tool.
#[test]
fn plans_match_the_captured_conversations() {
    for (name, tool) in CAPTURES {
        let t = transcript(name);
        let mut shape: Vec<(bool, usize)> =
            t.iter().map(|m| (m.from_client, m.bytes.len())).collect();
        let (expected, done) = plan_shape(tool.plan());
        if done {
            let tail: Vec<_> = shape.split_off(shape.len() - 2);
            assert!(
                tail.contains(&(true, 5)) && tail.contains(&(false, 5)),
                "{name}: {tail:?}"
            );
            assert!(
                t[t.len() - 2..].iter().all(|m| m.bytes == oob::DONE),
                "{name}"
            );
        }
        assert_eq!(shape, expected, "{name}");
    }
}

/// With options: `-a`, `-b`, `-c UC`/`UD` (captures made in the lab for this purpose).
#[test]
fn plans_with_options_match_the_option_captures() {
    for (name, tool, sizes) in [
        ("ib_send_bw_a", Tool::SendBw, RC_ALL_SIZES),
        ("ib_write_bw_a", Tool::WriteBw, RC_ALL_SIZES),
        ("ib_read_bw_a", Tool::ReadBw, RC_ALL_SIZES),
        ("ib_send_lat_a", Tool::SendLat, RC_ALL_SIZES),
        ("ib_write_lat_a", Tool::WriteLat, RC_ALL_SIZES),
        ("ib_read_lat_a", Tool::ReadLat, RC_ALL_SIZES),
        ("ib_write_bw_b", Tool::WriteBw, 1),
        ("ib_send_bw_uc", Tool::SendBw, 1),
        ("ib_write_bw_uc", Tool::WriteBw, 1),
        ("ib_send_lat_ud", Tool::SendLat, 1),
    ] {
        let t = transcript_at(&options_capture(name));
        let mut shape: Vec<(bool, usize)> =
            t.iter().map(|m| (m.from_client, m.bytes.len())).collect();
        let plan = tool.plan_for(sizes);
        if sizes == 1 {
            assert_eq!(plan, tool.plan(), "{name}");
        }
        let (expected, done) = plan_shape(&plan);
        if done {
            let tail: Vec<_> = shape.split_off(shape.len() - 2);
            assert!(
                tail.contains(&(true, 5)) && tail.contains(&(false, 5)),
                "{name}: {tail:?}"
            );
        }
        assert_eq!(shape, expected, "{name}");
    }
    assert_eq!(ud_all_sizes(1_024), 10);
    assert_eq!(ud_all_sizes(4_096), 12);

    // -q 2: the first and third hand shakes once per QP, each with its own QP's record.
    let t = transcript_at(&options_capture("ib_send_bw_q2"));
    let keys: Vec<PerftestDest> = t
        .iter()
        .filter(|m| m.from_client && m.bytes.len() == KEY_RECORD_LEN)
        .map(|m| PerftestDest::parse(&m.bytes).unwrap())
        .collect();
    let qpns: Vec<u32> = keys.iter().map(|k| k.qpn.value()).collect();
    let (a, b) = (qpns[0], qpns[1]);
    assert_ne!(a, b);
    assert_eq!(
        qpns,
        [a, b, a, a, b, a, a],
        "keys, after RTR, print, pre-traffic, close"
    );
}

/// [`PerftestConn::run_step`] walks an `-a` plan against our own server.
#[test]
fn run_step_walks_an_all_sizes_plan() {
    let plan = Tool::SendBw.plan_for(RC_ALL_SIZES);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let s_key = key(0x11, 1, [127, 0, 0, 1]);
    let c_key = key(0x22, 2, [127, 0, 0, 2]);
    let server_plan = plan.clone();
    let server = thread::spawn(move || {
        let mut conn = PerftestConn::accept(&listener, T, T).unwrap();
        let mut st = Setup::new(3);
        let mut traffic = 0;
        for step in &server_plan {
            conn.run_step(*step, &s_key, &BwReport::default(), &mut st)
                .unwrap();
            traffic += usize::from(*step == Step::Traffic);
        }
        (st, traffic)
    });
    let mut conn = PerftestConn::connect(addr, T).unwrap();
    let mut st = Setup::new(3);
    for step in &plan {
        conn.run_step(*step, &c_key, &BwReport::default(), &mut st)
            .unwrap();
    }
    let (s_st, traffic) = server.join().unwrap();
    assert_eq!(traffic, RC_ALL_SIZES);
    assert_eq!((st.peer, s_st.peer), (s_key, c_key));
    assert_eq!(st.peer_version, "6.06");
}

/// Our server against each captured stock client: it learns the client's record, and sends
/// exactly what the stock server sent (except the BW report words, which the 6.06 server
/// leaves uninitialised; ours are zeros).
#[test]
fn our_server_replays_every_captured_server() {
    for (name, tool) in CAPTURES {
        let script = transcript(name);
        let (client_key, server_key) = captured_keys(&script);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer_script = script.clone();
        let stock = thread::spawn(move || play(oob::connect(addr, T).unwrap(), &peer_script, true));

        let mut conn = PerftestConn::accept(&listener, T, T).unwrap();
        assert_eq!(conn.role(), Role::Server);
        let setup = conn.exchange_keys(tool, &server_key, 3).unwrap();
        assert_eq!(setup.peer, client_key, "{name}");
        assert_eq!(setup.mtu_enum, 3, "{name}");
        assert_eq!(setup.peer_version, "6.06", "{name}");
        assert_eq!(setup.peer_sys, SysData::default(), "{name}");
        assert_eq!(conn.remote_version(), Some(6.06));
        conn.sync_before_traffic(tool, &server_key).unwrap();
        conn.set_timeout(Timeout::Never);
        let report = conn
            .finish(tool, &server_key, &BwReport::default())
            .unwrap();
        if tool.plan().contains(&Step::BwReport) {
            assert_eq!(report, Some(captured_client_report(&script)), "{name}");
        } else {
            assert_eq!(report, None, "{name}");
        }

        let expected: Vec<u8> = script
            .iter()
            .filter(|m| !m.from_client)
            .flat_map(|m| {
                if m.bytes.len() == 8 {
                    vec![0u8; 8]
                } else {
                    m.bytes.clone()
                }
            })
            .collect();
        assert_eq!(stock.join().unwrap(), expected, "{name}");
    }
}

/// Our client against each captured stock server: byte for byte what the stock client sent,
/// given its record and its BW report.
#[test]
fn our_client_replays_every_captured_client() {
    for (name, tool) in CAPTURES {
        let script = transcript(name);
        let (client_key, server_key) = captured_keys(&script);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer_script = script.clone();
        let stock = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            play(s, &peer_script, false)
        });

        let mut conn = PerftestConn::connect(addr, T).unwrap();
        assert_eq!(conn.role(), Role::Client);
        let setup = conn.exchange_keys(tool, &client_key, 3).unwrap();
        assert_eq!(setup.peer, server_key, "{name}");
        conn.sync_before_traffic(tool, &client_key).unwrap();
        let mine = if tool.plan().contains(&Step::BwReport) {
            captured_client_report(&script)
        } else {
            BwReport::default()
        };
        let theirs = conn.finish(tool, &client_key, &mine).unwrap();
        assert_eq!(
            theirs.is_some(),
            tool.plan().contains(&Step::BwReport),
            "{name}"
        );
        assert_eq!(stock.join().unwrap(), sent_by(&script, true), "{name}");
    }
}

/// Our client and our server, every tool, over loopback: each learns the other's record,
/// the MTU is the smaller one, the server receives the client's BW report.
#[test]
fn local_sessions_for_every_tool() {
    for tool in Tool::ALL {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let s_key = key(0x11, 0x11_1111, [127, 0, 0, 1]);
        let c_key = key(0x22, 0x22_2222, [127, 0, 0, 2]);
        let report = BwReport {
            size: 65_536,
            iters: 1_000,
            bw_peak: 1_234.5,
            bw_avg: 1_000.25,
            msg_rate_avg: 0.015_625,
        };
        let server = thread::spawn(move || {
            let mut conn = PerftestConn::accept(&listener, T, T).unwrap();
            let setup = conn.exchange_keys(tool, &s_key, 3).unwrap();
            conn.sync_before_traffic(tool, &s_key).unwrap();
            let theirs = conn.finish(tool, &s_key, &BwReport::default()).unwrap();
            (setup, theirs)
        });
        let mut conn = PerftestConn::connect(addr, T).unwrap();
        let setup = conn.exchange_keys(tool, &c_key, 5).unwrap();
        conn.sync_before_traffic(tool, &c_key).unwrap();
        conn.finish(tool, &c_key, &report).unwrap();
        let (s_setup, s_theirs) = server.join().unwrap();
        assert_eq!(setup.peer, s_key, "{tool:?}");
        assert_eq!(s_setup.peer, c_key, "{tool:?}");
        assert_eq!((setup.mtu_enum, s_setup.mtu_enum), (3, 3), "{tool:?}");
        let has_report = tool.plan().contains(&Step::BwReport);
        assert_eq!(s_theirs, has_report.then_some(report), "{tool:?}");
    }
}

/// A scripted peer for the error cases: sends `reply` after reading `read` bytes.
fn fake_server(
    steps: Vec<(usize, Vec<u8>)>,
    hold: Duration,
) -> (std::net::SocketAddr, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let h = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        for (read, reply) in steps {
            let mut buf = vec![0u8; read];
            if s.read_exact(&mut buf).is_err() {
                return;
            }
            let _ = s.write_all(&reply);
        }
        thread::sleep(hold);
    });
    (addr, h)
}

#[test]
fn old_or_garbled_versions_are_refused() {
    let (addr, h) = fake_server(
        vec![(16, b"5.20\0\0\0\0\0\0\0\0\0\0\0\0".to_vec())],
        Duration::ZERO,
    );
    let mut conn = PerftestConn::connect(addr, T).unwrap();
    let err = conn.exchange_versions().unwrap_err();
    assert!(matches!(err, OobError::Unsupported { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("peer speaks perftest 5.20, which"),
        "{err}"
    );
    h.join().unwrap();

    let (addr, h) = fake_server(vec![(16, vec![0xFF; 16])], Duration::ZERO);
    let mut conn = PerftestConn::connect(addr, T).unwrap();
    let err = conn.exchange_versions().unwrap_err().to_string();
    assert!(
        err.starts_with("malformed record: perftest version"),
        "{err}"
    );
    h.join().unwrap();
}

#[test]
fn mtu_negotiation_follows_check_mtu() {
    for (mine, theirs, expect) in [
        (3u8, &b"3\0"[..], 3u8),
        (5, b"3\0", 3),
        (3, b"5\0", 3),
        (5, b"9\0", 5),
        (5, b"\0\0", 5),
    ] {
        let (addr, h) = fake_server(vec![(2, theirs.to_vec())], Duration::ZERO);
        let mut conn = PerftestConn::connect(addr, T).unwrap();
        assert_eq!(
            conn.exchange_mtu(mine).unwrap(),
            expect,
            "{mine} vs {theirs:?}"
        );
        h.join().unwrap();
    }
    let (addr, h) = fake_server(vec![], Duration::ZERO);
    let mut conn = PerftestConn::connect(addr, T).unwrap();
    assert!(conn.exchange_mtu(7).is_err());
    drop(conn);
    h.join().unwrap();
}

#[test]
fn a_peer_that_stops_answering_times_out() {
    let version = b"6.06\0\0\0\0\0\0\0\0\0\0\0\0".to_vec();
    let (addr, h) = fake_server(vec![(16, version)], Duration::from_millis(1_500));
    let mut conn = PerftestConn::connect(addr, Timeout::After(Duration::from_millis(300))).unwrap();
    conn.exchange_versions().unwrap();
    let err = conn.hand_shake(&key(1, 2, [127, 0, 0, 1])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "peer did not answer the exchange within 0.3s (waiting for the peer's key record \
         (hand shake))"
    );
    h.join().unwrap();
}

#[test]
fn malformed_key_records_are_reported() {
    let mut rec = *READ_BW_CLIENT_FRAME14;
    rec[40] = b'x';
    let err = PerftestDest::parse(&rec).unwrap_err().to_string();
    assert!(err.contains("vaddr: expected 16 hex digits"), "{err}");
    let err = PerftestDest::parse(&READ_BW_CLIENT_FRAME14[..107])
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected 108 bytes"), "{err}");
    let mut rec = *READ_BW_CLIENT_FRAME14;
    rec[106] = b'0';
    let err = PerftestDest::parse(&rec).unwrap_err().to_string();
    assert!(err.contains("23 fields"), "{err}");
}
