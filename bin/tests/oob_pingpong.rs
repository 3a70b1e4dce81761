//! The rdma-core pingpong exchange (`bin/src/oob/pingpong.rs`): records, the captured
//! payloads of the lab (`shared/captures/*_pingpong.pcap`), byte-exact replays of both sides
//! of those conversations, and local client/server runs over 127.0.0.1.

#[path = "../src/oob/mod.rs"]
mod oob;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use oob::pingpong::{decode, encode, Layout, PingpongConn, PingpongDest, RECORD_LEN};
use oob::testing::{play, sent_by, transcript, turns};
use oob::{accept, connect, OobError, Timeout};
use roce_wire::{Gid, Psn, Qpn};
use socket2::{Domain, Socket, Type};

/// `shared/captures/rc_pingpong.pcap`, frame 4: the client's (10.77.0.2) record.
const RC_CLIENT_FRAME4: &[u8; 52] = b"0000:000011:96d2ce:00000000000000000000ffff0a4d0002\0";
/// Same capture, frame 6: the server's (10.77.0.1) answer.
const RC_SERVER_FRAME6: &[u8; 52] = b"0000:000011:7177b7:00000000000000000000ffff0a4d0001\0";
/// Same capture, frame 8: the client's last message.
const RC_CLIENT_FRAME8: &[u8; 5] = b"done\0";
/// `shared/captures/ud_pingpong.pcap`, frame 4.
const UD_CLIENT_FRAME4: &[u8; 52] = b"0000:000013:0b9fdd:00000000000000000000ffff0a4d0002\0";
/// `shared/captures/srq_pingpong.pcap` (`-q 2`), frame 4: the client's first record; frame 6
/// starts with its second and then the first all-zero padding record.
const SRQ_CLIENT_FRAME4: &[u8; 52] = b"0000:000014:e23f84:00000000000000000000ffff0a4d0002\0";
const SRQ_CLIENT_FRAME6_START: &[u8; 104] =
    b"0000:000015:dd0d1e:00000000000000000000ffff0a4d0002\0\
0000:000000:000000:00000000000000000000000000000000\0";

const T: Timeout = Timeout::After(Duration::from_secs(10));

fn gid(ip: [u8; 4]) -> Gid {
    Gid::from(Ipv4Addr::from(ip))
}

fn dest(qpn: u32, psn: u32, ip: [u8; 4]) -> PingpongDest {
    PingpongDest {
        lid: 0,
        qpn: Qpn::new(qpn),
        psn: Psn::new(psn),
        gid: gid(ip),
    }
}

#[test]
fn record_round_trip() {
    let d = PingpongDest {
        lid: 0xBEEF,
        qpn: Qpn::new(0x00AB_CDEF),
        psn: Psn::new(0x0012_3456),
        gid: "fe80::5054:ff:fe77:1".parse().unwrap(),
    };
    let rec = d.to_record();
    assert_eq!(rec.len(), RECORD_LEN);
    assert_eq!(
        &rec[..],
        b"beef:abcdef:123456:fe80000000000000505400fffe770001\0"
    );
    assert_eq!(PingpongDest::parse(&rec).unwrap(), d);
    assert_eq!(
        PingpongDest::default().to_record(),
        *b"0000:000000:000000:00000000000000000000000000000000\0"
    );
}

#[test]
fn captured_records_parse_and_reformat() {
    let c = PingpongDest::parse(RC_CLIENT_FRAME4).unwrap();
    assert_eq!(c, dest(0x11, 0x96_D2CE, [10, 77, 0, 2]));
    assert_eq!(&c.to_record(), RC_CLIENT_FRAME4);
    let s = PingpongDest::parse(RC_SERVER_FRAME6).unwrap();
    assert_eq!(s, dest(0x11, 0x71_77B7, [10, 77, 0, 1]));
    assert_eq!(&s.to_record(), RC_SERVER_FRAME6);
    assert_eq!(RC_CLIENT_FRAME8, oob::DONE);
    let u = PingpongDest::parse(UD_CLIENT_FRAME4).unwrap();
    assert_eq!(u, dest(0x13, 0x0B_9FDD, [10, 77, 0, 2]));
    let q0 = PingpongDest::parse(SRQ_CLIENT_FRAME4).unwrap();
    let q1 = PingpongDest::parse(&SRQ_CLIENT_FRAME6_START[..52]).unwrap();
    let pad = PingpongDest::parse(&SRQ_CLIENT_FRAME6_START[52..]).unwrap();
    assert_eq!(q0.qpn, Qpn::new(0x14));
    assert_eq!(q1.qpn, Qpn::new(0x15));
    assert_eq!(pad, PingpongDest::default());
    let srq = encode(&[q0, q1], Layout::Srq);
    assert_eq!(srq.len(), 256 * 52);
    assert_eq!(&srq[..52], SRQ_CLIENT_FRAME4);
    assert_eq!(&srq[52..156], SRQ_CLIENT_FRAME6_START);
}

/// Every record of every captured pingpong conversation parses and re-formats to the same
/// bytes, and the conversations have the documented shape.
#[test]
fn captured_conversations_have_the_documented_shape() {
    for (name, layout) in [
        ("rc_pingpong", Layout::Single),
        ("uc_pingpong", Layout::Single),
        ("ud_pingpong", Layout::Single),
        ("srq_pingpong", Layout::Srq),
        ("host_peer_py_rc_pingpong", Layout::Single),
    ] {
        let t = turns(&transcript(name));
        let shape: Vec<(bool, usize)> = t.iter().map(|m| (m.from_client, m.bytes.len())).collect();
        let n = layout.records() * RECORD_LEN;
        assert_eq!(shape, [(true, n), (false, n), (true, 5)], "{name}");
        for m in &t[..2] {
            let dests = decode(&m.bytes, layout).unwrap();
            assert_eq!(encode(&dests, layout), m.bytes, "{name} frame {}", m.frame);
            assert_ne!(dests[0].qpn, Qpn::new(0), "{name}");
        }
        assert_eq!(t[2].bytes, oob::DONE, "{name}");
    }
}

/// Our server against the captured stock client: it receives exactly the client's record,
/// and, given the captured server's address, sends exactly the captured bytes.
#[test]
fn our_server_replays_the_captured_server_byte_for_byte() {
    for (name, layout) in [
        ("rc_pingpong", Layout::Single),
        ("ud_pingpong", Layout::Single),
        ("srq_pingpong", Layout::Srq),
    ] {
        let script = turns(&transcript(name));
        let captured_server = decode(&script[1].bytes, layout).unwrap();
        let captured_client = decode(&script[0].bytes, layout).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer_script = script.clone();
        let stock = thread::spawn(move || play(connect(addr, T).unwrap(), &peer_script, true));

        let (stream, _) = accept(&listener, T).unwrap();
        let mut conn = PingpongConn::new(stream, layout, T);
        let client = conn.server_read().unwrap();
        assert_eq!(client, captured_client, "{name}");
        let n = if layout == Layout::Srq { 2 } else { 1 };
        conn.server_reply(&captured_server[..n]).unwrap();
        let received = stock.join().unwrap();
        assert_eq!(received, sent_by(&script, false), "{name}");
    }
}

/// Our client against the captured stock server.
#[test]
fn our_client_replays_the_captured_client_byte_for_byte() {
    for (name, layout) in [
        ("rc_pingpong", Layout::Single),
        ("uc_pingpong", Layout::Single),
        ("srq_pingpong", Layout::Srq),
    ] {
        let script = turns(&transcript(name));
        let captured_client = decode(&script[0].bytes, layout).unwrap();
        let captured_server = decode(&script[1].bytes, layout).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer_script = script.clone();
        let stock = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            play(s, &peer_script, false)
        });
        let n = if layout == Layout::Srq { 2 } else { 1 };
        let mut conn = PingpongConn::new(connect(addr, T).unwrap(), layout, T);
        let server = conn.client_exchange(&captured_client[..n]).unwrap();
        assert_eq!(server, captured_server, "{name}");
        drop(conn);
        assert_eq!(stock.join().unwrap(), sent_by(&script, true), "{name}");
    }
}

/// Our client and our server, both ways, single and srq.
#[test]
fn local_exchange_over_loopback() {
    for layout in [Layout::Single, Layout::Srq] {
        let srv: Vec<_> = (0..3)
            .map(|i| dest(0x20 + i, 0x1000 + i, [127, 0, 0, 1]))
            .collect();
        let cli: Vec<_> = (0..3)
            .map(|i| dest(0x40 + i, 0x2000 + i, [127, 0, 0, 2]))
            .collect();
        let n = if layout == Layout::Srq { 3 } else { 1 };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let srv_mine = srv[..n].to_vec();
        let server = thread::spawn(move || {
            let (s, _) = accept(&listener, T).unwrap();
            let mut conn = PingpongConn::new(s, layout, T);
            let peer = conn.server_read().unwrap();
            conn.server_reply(&srv_mine).unwrap();
            peer
        });
        let mut conn = PingpongConn::new(connect(addr, T).unwrap(), layout, T);
        let got = conn.client_exchange(&cli[..n]).unwrap();
        let peer = server.join().unwrap();
        assert_eq!(got.len(), layout.records());
        assert_eq!(&got[..n], &srv[..n]);
        assert_eq!(&peer[..n], &cli[..n]);
        assert!(got[n..].iter().all(|d| *d == PingpongDest::default()));
    }
}

#[test]
fn silent_server_times_out_with_a_clear_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // The peer holds the connection open, silent, until the test is done with it (at most
    // 10 s), so only our 300 ms timeout can end the exchange.
    let (done, hold_until) = mpsc::channel::<()>();
    let hold = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let _ = hold_until.recv_timeout(Duration::from_secs(10));
        drop(s);
    });
    let t0 = Instant::now();
    let mut conn = PingpongConn::new(
        connect(addr, T).unwrap(),
        Layout::Single,
        Timeout::After(Duration::from_millis(300)),
    );
    let err = conn
        .client_exchange(&[PingpongDest::default()])
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(matches!(err, OobError::Timeout { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "peer did not answer the exchange within 0.3s (waiting for the server's address)"
    );
    done.send(()).unwrap();
    hold.join().unwrap();
}

#[test]
fn nobody_connects_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let err = accept(&listener, Timeout::After(Duration::from_millis(200))).unwrap_err();
    assert_eq!(
        err.to_string(),
        "peer did not answer the exchange within 0.2s (waiting for a client to connect)"
    );
}

#[test]
fn malformed_and_closed_peers_are_reported() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let bad = thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 52];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"0000:000011:7177b7:not-a-gid-not-a-gid-not-a-gid-xx\0")
            .unwrap();
        let (mut s2, _) = listener.accept().unwrap();
        s2.read_exact(&mut buf).unwrap();
        s2.write_all(b"0000:0000").unwrap();
    });
    let mut conn = PingpongConn::new(connect(addr, T).unwrap(), Layout::Single, T);
    let err = conn
        .client_exchange(&[PingpongDest::default()])
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("malformed record: pingpong address (LID:QPN:PSN:GID): GID: expected 32 hex digits, got \"0000:000011:7177b7:not-a-gid"),
        "{msg}"
    );
    let mut conn = PingpongConn::new(connect(addr, T).unwrap(), Layout::Single, T);
    let err = conn
        .client_exchange(&[PingpongDest::default()])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "peer closed the connection while we waited for the server's address (9 of 52 bytes \
         received)"
    );
    bad.join().unwrap();

    for (bytes, why) in [
        (
            &b"0000:000011:7177b7:00000000000000000000ffff0a4d0001x"[..],
            "NUL",
        ),
        (
            &b"0000:000011:7177b7:00000000000000000000ffff0a4d001\0"[..],
            "52 bytes",
        ),
        (
            &b"0000:00011:07177b7:00000000000000000000ffff0a4d0001\0"[..],
            "QPN",
        ),
        (
            &b"0000-000011-7177b7-00000000000000000000ffff0a4d0001\0"[..],
            "4 fields",
        ),
    ] {
        let err = PingpongDest::parse(bytes).unwrap_err().to_string();
        assert!(err.contains(why), "{why}: {err}");
    }
}

#[test]
fn connect_retries_until_the_server_listens() {
    // A private namespace (as root): nothing else can take the port, nor listen on it when
    // the end of the test expects a refusal.
    let _net = roce_testkit::netns::private_net();
    // Hold a port without listening (a connect to it is refused, as to a closed port) and
    // start listening on the same socket a little later: no window in which the port is free.
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket
        .bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
        .unwrap();
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    let server = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        socket.listen(1).unwrap();
        let listener = TcpListener::from(socket);
        let (s, _) = accept(&listener, T).unwrap();
        let mut conn = PingpongConn::new(s, Layout::Single, T);
        conn.server_read().unwrap();
        conn.server_reply(&[dest(1, 2, [127, 0, 0, 1])]).unwrap();
    });
    let mut conn = PingpongConn::new(connect(("127.0.0.1", port), T).unwrap(), Layout::Single, T);
    let got = conn.client_exchange(&[dest(3, 4, [127, 0, 0, 1])]).unwrap();
    assert_eq!(got, [dest(1, 2, [127, 0, 0, 1])]);
    server.join().unwrap();

    let err = connect(
        ("127.0.0.1", port),
        Timeout::After(Duration::from_millis(200)),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("cannot connect to 127.0.0.1:{port}: ")),
        "{err}"
    );
}
