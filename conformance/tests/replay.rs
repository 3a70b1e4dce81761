//! Replaying the requests of every real rxe capture into our responder gives the responses rxe
//! gave: same opcodes, PSNs, AETH syndromes, MSNs and payload lengths.

use std::path::PathBuf;

use roce_conformance::replay::replay;

fn captures() -> PathBuf {
    std::env::var_os("ROCE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
        .join("captures")
}

#[test]
fn our_responder_answers_like_rxe() {
    let mut checked = 0;
    let mut report = String::new();
    let mut failed = false;
    for name in [
        "rc_pingpong",
        "srq_pingpong",
        "ib_send_bw",
        "ib_send_lat",
        "ib_write_bw",
        "ib_write_lat",
        "ib_read_bw",
        "ib_read_lat",
        "ib_atomic_bw_fadd",
        "ib_atomic_bw_cas",
        "rping",
        "ib_send_bw_rdmacm",
        "host_peer_py_rc_pingpong",
    ] {
        let path = captures().join(format!("{name}.pcap"));
        let streams = replay(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!streams.is_empty(), "{name}: no RC request stream found");
        for s in streams {
            assert!(
                !s.expected.is_empty(),
                "{name} {:?}: rxe sent no response",
                s.responder
            );
            checked += s.expected.len();
            report += &format!(
                "{name} {:?}: {} requests, {} responses, match={}\n",
                s.responder,
                s.requests,
                s.expected.len(),
                s.matches()
            );
            if !s.matches() {
                failed = true;
                let n = s
                    .expected
                    .iter()
                    .zip(&s.ours)
                    .take_while(|(a, b)| a == b)
                    .count();
                report += &format!("  first difference at response {n}: rxe {:?} ours {:?} (rxe {} total, ours {})\n",
                    s.expected.get(n), s.ours.get(n), s.expected.len(), s.ours.len());
            }
        }
    }
    eprintln!("{report}");
    assert!(!failed, "{report}");
    assert!(checked > 150, "compared {checked} responses");
}
