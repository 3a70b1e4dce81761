//! Completion statuses as the stock tools print them, and hints about why a run failed.
//!
//! `ibv_wc_status_str` (rdma-core `libibverbs/enum_strs.c`) gives the text the stock tools
//! print in `Failed status %s (%d) for wr_id %d`; [`status_str`] returns the same text so that
//! logs of rocectl and of the stock tools read alike.

use roce_transport::{Mtu, QpStats, WcStatus};

/// `ibv_wc_status_str(status)`.
pub(crate) fn status_str(status: WcStatus) -> &'static str {
    status.as_str()
}

/// The line the stock tools print for a failed completion:
/// `Failed status transport retry counter exceeded (12) for wr_id 2`.
pub(crate) fn failed_line(status: WcStatus, wr_id: u64) -> String {
    format!(
        "Failed status {} ({}) for wr_id {}",
        status_str(status),
        status as u8,
        // The stock tools print `(int) wr_id`.
        wr_id as i32
    )
}

/// What the run knew when it failed, to explain it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Failure<'a> {
    /// The failed completion's status, if a completion failed (not a timeout).
    pub(crate) status: Option<WcStatus>,
    /// The QPs' counters, summed.
    pub(crate) stats: &'a QpStats,
    /// Our path MTU (`None` for UD: the port MTU).
    pub(crate) mtu: Option<Mtu>,
    /// Our message size (`-s`).
    pub(crate) size: usize,
    /// The peer's RoCE address, for messages.
    pub(crate) peer: &'a str,
}

/// Hints about the likely cause, most specific first (empty when nothing stands out).
///
/// A path MTU mismatch is named only where the sizes allow it: the peer's `-m` is not part of
/// the exchange, so for a refused request it is a possibility to check, named only when our
/// messages take more than one packet at the smallest path MTU (256 bytes; a smaller message is
/// one packet whatever either side's `-m`); packets dropped for their length on a UC QP are
/// the MTU check itself. Otherwise a NAK is described as what it is, in rdma-core's words.
pub(crate) fn hints(f: &Failure<'_>) -> Vec<String> {
    let s = f.stats;
    let mtu_can_matter = f.mtu.is_some() && f.size > Mtu::Mtu256.bytes();
    let check_mtu = match f.mtu {
        Some(m) if mtu_can_matter => format!(
            "; with {}-byte messages (more than one packet at a smaller MTU) it may be a path MTU \
             mismatch: both sides must use the same -m (ours: {})",
            f.size,
            m.bytes()
        ),
        _ => String::new(),
    };
    let mut out = Vec::new();
    let inv_sent = s.naks_sent_by_code[0];
    let inv_received = s.naks_received_by_code[0];
    if inv_sent > 0 {
        out.push(format!(
            "we refused {inv_sent} of the peer's packets as invalid requests (NAK sent: a \
             packet out of sequence or longer than the receive buffer of {} bytes) and our QP \
             entered the error state{check_mtu}",
            f.size
        ));
    }
    if inv_received > 0 || f.status == Some(WcStatus::RemInvReqErr) {
        out.push(format!(
            "the peer refused our request: {} (NAK received: is its -s smaller than ours, {}?)\
             {check_mtu}",
            status_str(WcStatus::RemInvReqErr),
            f.size
        ));
    }
    if s.drop_length > 0 {
        let why = match f.mtu {
            // UC: a FIRST or MIDDLE payload must be exactly the path MTU, an ONLY or LAST at most.
            Some(m) => format!(
                "their payloads do not fit our path MTU of {}: both sides must use the same -m",
                m.bytes()
            ),
            None => "malformed lengths".to_owned(),
        };
        out.push(format!(
            "{} packet(s) from the peer were dropped for their length: {why}",
            s.drop_length
        ));
    }
    if s.drop_qkey > 0 {
        out.push(format!(
            "{} packet(s) were dropped for a wrong Q_Key (the pingpong tools use 0x11111111)",
            s.drop_qkey
        ));
    }
    if s.drop_no_recv > 0 {
        out.push(format!(
            "{} packet(s) were dropped because no receive was posted",
            s.drop_no_recv
        ));
    }
    let silent = s.rx_packets == 0;
    match f.status {
        Some(WcStatus::RetryExcErr) if silent => out.push(format!(
            "nothing ever came back from the peer at {}: is it running, reachable over UDP \
             4791 (firewall?), and did it connect its QP?",
            f.peer
        )),
        Some(WcStatus::RetryExcErr) => out.push(format!(
            "the peer at {} stopped acknowledging ({} timeouts, {} packets retransmitted): did \
             it exit or fail?",
            f.peer, s.timeouts, s.retransmitted_packets
        )),
        Some(WcStatus::RnrRetryExcErr) => out
            .push("the peer had no receive posted for too long (RNR retries exhausted)".to_owned()),
        None if silent => {
            // UD: a message is one packet, dropped by a receiver whose port MTU is smaller.
            let ud_mtu = if f.mtu.is_none() && f.size > Mtu::Mtu256.bytes() {
                format!(
                    "; a UD message is one packet: a peer whose port MTU is below {} bytes drops \
                     ours",
                    f.size
                )
            } else {
                String::new()
            };
            out.push(format!(
                "nothing ever came from the peer at {} over RoCE: is it reachable over UDP 4791 \
                 (firewall?), and does its GID match its address?{check_mtu}{ud_mtu}",
                f.peer
            ));
        }
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_line_matches_the_stock_tools() {
        assert_eq!(
            failed_line(WcStatus::RetryExcErr, 2),
            "Failed status transport retry counter exceeded (12) for wr_id 2"
        );
        assert_eq!(
            failed_line(WcStatus::WrFlushErr, 1),
            "Failed status Work Request Flushed Error (5) for wr_id 1"
        );
    }

    fn failure(
        status: Option<WcStatus>,
        stats: &QpStats,
        mtu: Option<Mtu>,
        size: usize,
    ) -> Vec<String> {
        hints(&Failure {
            status,
            stats,
            mtu,
            size,
            peer: "127.0.0.1",
        })
    }

    #[test]
    fn mtu_mismatch_is_named_when_the_sizes_allow_it() {
        let mut stats = QpStats::default();
        stats.naks_sent_by_code[0] = 1;
        let h = failure(Some(WcStatus::WrFlushErr), &stats, Some(Mtu::Mtu1024), 4096);
        assert!(
            h[0].ends_with(
                "; with 4096-byte messages (more than one packet at a smaller MTU) it may be a \
                 path MTU mismatch: both sides must use the same -m (ours: 1024)"
            ),
            "{h:?}"
        );
        // A message that is one packet at any path MTU: no MTU in any hint.
        let h = failure(Some(WcStatus::WrFlushErr), &stats, Some(Mtu::Mtu1024), 256);
        assert_eq!(
            h,
            ["we refused 1 of the peer's packets as invalid requests (NAK sent: a packet out of \
              sequence or longer than the receive buffer of 256 bytes) and our QP entered the \
              error state"]
        );
    }

    #[test]
    fn an_invalid_request_nak_received_is_described_plainly() {
        let stats = QpStats {
            rx_packets: 3,
            ..QpStats::default()
        };
        let h = failure(Some(WcStatus::RemInvReqErr), &stats, Some(Mtu::Mtu4096), 64);
        assert_eq!(
            h,
            [
                "the peer refused our request: remote invalid request error (NAK received: is its \
              -s smaller than ours, 64?)"
            ]
        );
        let h = failure(
            Some(WcStatus::RemInvReqErr),
            &stats,
            Some(Mtu::Mtu1024),
            4096,
        );
        assert!(h[0].ends_with("the same -m (ours: 1024)"), "{h:?}");
        // UD has no path MTU of its own to mismatch.
        let h = failure(Some(WcStatus::RemInvReqErr), &stats, None, 4096);
        assert!(
            !h.iter().any(|l| l.contains("MTU") || l.contains("-m")),
            "{h:?}"
        );
    }

    #[test]
    fn uc_length_drops_are_the_mtu_check() {
        let stats = QpStats {
            drop_length: 2,
            rx_packets: 2,
            ..QpStats::default()
        };
        let h = failure(None, &stats, Some(Mtu::Mtu1024), 64);
        assert_eq!(
            h,
            ["2 packet(s) from the peer were dropped for their length: their payloads do not fit \
              our path MTU of 1024: both sides must use the same -m"]
        );
    }

    #[test]
    fn a_silent_peer_mentions_the_mtu_only_for_multi_packet_messages() {
        let stats = QpStats::default();
        let small = failure(None, &stats, Some(Mtu::Mtu1024), 100);
        assert!(!small[0].contains("MTU"), "{small:?}");
        let big = failure(None, &stats, Some(Mtu::Mtu1024), 100_000);
        assert!(big[0].contains("path MTU mismatch"), "{big:?}");
        // UD: one packet per message, so the peer's port MTU matters above 256 bytes only.
        let ud = failure(None, &stats, None, 2048);
        assert!(
            ud[0].ends_with(
                "; a UD message is one packet: a peer whose port MTU is below 2048 bytes drops \
                 ours"
            ),
            "{ud:?}"
        );
        let ud = failure(None, &stats, None, 200);
        assert!(!ud[0].contains("MTU"), "{ud:?}");
    }
}
