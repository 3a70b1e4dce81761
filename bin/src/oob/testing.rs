//! Test support: the out-of-band TCP conversations of the lab's captures, and a scripted
//! stock peer that replays one side of them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use super::DEFAULT_PORT;

/// One TCP segment's payload, or (after [`turns`]) a run of bytes one side sent before the
/// other answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Msg {
    /// Sent by the client (towards port 18515).
    pub(crate) from_client: bool,
    /// The capture frame of its first segment.
    pub(crate) frame: usize,
    /// The bytes.
    pub(crate) bytes: Vec<u8>,
}

/// `$ROCE_SHARED_DIR/captures`, else `<repo>/../shared/captures`.
pub(crate) fn captures_dir() -> PathBuf {
    std::env::var_os("ROCE_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
        .join("captures")
}

/// The TCP/18515 payloads of `captures/NAME.pcap` (Ethernet, IPv4), one per segment, in
/// frame order.
///
/// # Panics
/// A missing or unreadable capture: the captures are the ground truth.
pub(crate) fn transcript(name: &str) -> Vec<Msg> {
    transcript_at(&captures_dir().join(format!("{name}.pcap")))
}

/// The perftest captures with options (`conformance/lab/captures/perftest-options/`).
pub(crate) fn options_capture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../conformance/lab/captures/perftest-options")
        .join(format!("{name}.pcap"))
}

/// The TCP/18515 payloads of the capture at `path`, one per segment.
///
/// # Panics
/// A missing or unreadable capture.
pub(crate) fn transcript_at(path: &std::path::Path) -> Vec<Msg> {
    let file = std::fs::File::open(path)
        .unwrap_or_else(|e| panic!("capture {} unreadable: {e}", path.display()));
    let frames = roce_wire::pcap::read_capture(file).expect("a pcap file");
    let mut out: Vec<Msg> = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let Some((from_client, payload)) = tcp_payload(&f.data) else {
            continue;
        };
        out.push(Msg {
            from_client,
            frame: i + 1,
            bytes: payload.to_vec(),
        });
    }
    out
}

/// Consecutive messages of one direction merged: the turns of the conversation.
pub(crate) fn turns(msgs: &[Msg]) -> Vec<Msg> {
    let mut out: Vec<Msg> = Vec::new();
    for m in msgs {
        match out.last_mut() {
            Some(last) if last.from_client == m.from_client => {
                last.bytes.extend_from_slice(&m.bytes);
            }
            _ => out.push(m.clone()),
        }
    }
    out
}

/// `(sent by the client, payload)` of an Ethernet/IPv4/TCP frame to or from port 18515 that
/// carries data.
fn tcp_payload(d: &[u8]) -> Option<(bool, &[u8])> {
    if d.len() < 14 + 20 || d[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &d[14..];
    let ihl = usize::from(ip[0] & 0x0F) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ip[9] != 6 || ip.len() < total || total < ihl + 20 {
        return None;
    }
    let tcp = &ip[ihl..total];
    let sport = u16::from_be_bytes([tcp[0], tcp[1]]);
    let dport = u16::from_be_bytes([tcp[2], tcp[3]]);
    let off = usize::from(tcp[12] >> 4) * 4;
    let payload = tcp.get(off..)?;
    if payload.is_empty() || (sport != DEFAULT_PORT && dport != DEFAULT_PORT) {
        return None;
    }
    Some((dport == DEFAULT_PORT, payload))
}

/// Plays one side of `script` over `stream`: writes that side's messages as captured and
/// reads as many bytes as the other side sent at each turn. Returns everything it read,
/// concatenated. Stops quietly when the other side closes after the last message.
///
/// # Panics
/// The other side closed before the end of the script, or a read took over 10 s.
pub(crate) fn play(mut stream: TcpStream, script: &[Msg], as_client: bool) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    for (k, msg) in script.iter().enumerate() {
        if msg.from_client == as_client {
            if stream.write_all(&msg.bytes).is_err() && k + 1 == script.len() {
                break;
            }
        } else {
            let mut buf = vec![0u8; msg.bytes.len()];
            stream.read_exact(&mut buf).unwrap_or_else(|e| {
                panic!(
                    "scripted peer: reading the {} bytes of frame {}: {e}",
                    buf.len(),
                    msg.frame
                )
            });
            got.extend_from_slice(&buf);
        }
    }
    got
}

/// Everything one side sent in `script`, concatenated.
pub(crate) fn sent_by(script: &[Msg], client: bool) -> Vec<u8> {
    script
        .iter()
        .filter(|m| m.from_client == client)
        .flat_map(|m| m.bytes.iter().copied())
        .collect()
}
