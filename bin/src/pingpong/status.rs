//! Completion statuses as the stock tools print them, and hints about why a run failed.
//!
//! `ibv_wc_status_str` (rdma-core `libibverbs/enum_strs.c`) gives the text the stock tools
//! print in `Failed status %s (%d) for wr_id %d`; [`status_str`] returns the same text so that
//! logs of rocectl and of the stock tools read alike.

use roce_transport::{Mtu, QpStats, WcStatus};

/// `ibv_wc_status_str(status)`.
pub(crate) fn status_str(status: WcStatus) -> &'static str {
    match status {
        WcStatus::Success => "success",
        WcStatus::LocLenErr => "local length error",
        WcStatus::LocQpOpErr => "local QP operation error",
        WcStatus::LocEecOpErr => "local EE context operation error",
        WcStatus::LocProtErr => "local protection error",
        WcStatus::WrFlushErr => "Work Request Flushed Error",
        WcStatus::MwBindErr => "memory management operation error",
        WcStatus::BadRespErr => "bad response error",
        WcStatus::LocAccessErr => "local access error",
        WcStatus::RemInvReqErr => "remote invalid request error",
        WcStatus::RemAccessErr => "remote access error",
        WcStatus::RemOpErr => "remote operation error",
        WcStatus::RetryExcErr => "transport retry counter exceeded",
        WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
        WcStatus::LocRddViolErr => "local RDD violation error",
        WcStatus::RemInvRdReqErr => "remote invalid RD request",
        WcStatus::RemAbortErr => "aborted error",
        WcStatus::InvEecnErr => "invalid EE context number",
        WcStatus::InvEecStateErr => "invalid EE context state",
        WcStatus::FatalErr => "fatal error",
        WcStatus::RespTimeoutErr => "response timeout error",
        WcStatus::GeneralErr => "general error",
    }
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
    /// The peer's RoCE address, for messages.
    pub(crate) peer: &'a str,
}

/// Hints about the likely cause, most specific first (empty when nothing stands out).
pub(crate) fn hints(f: &Failure<'_>) -> Vec<String> {
    let s = f.stats;
    let mtu = f
        .mtu
        .map_or_else(|| "the port MTU".to_owned(), |m| m.bytes().to_string());
    let mismatch =
        format!("most often a path MTU mismatch: both sides must use the same -m (ours: {mtu})");
    let mut out = Vec::new();
    let inv_sent = s.naks_sent_by_code[0];
    let inv_received = s.naks_received_by_code[0];
    if inv_sent > 0 {
        out.push(format!(
            "we refused {inv_sent} of the peer's packets as invalid requests (NAK sent) and our \
             QP entered the error state: {mismatch}"
        ));
    }
    if inv_received > 0 || f.status == Some(WcStatus::RemInvReqErr) {
        out.push(format!(
            "the peer refused our request as invalid (NAK received): {mismatch}"
        ));
    }
    if s.drop_length > 0 {
        out.push(format!(
            "{} packet(s) from the peer were dropped for their length: {mismatch}",
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
        None if silent => out.push(format!(
            "nothing ever came from the peer at {} over RoCE: is it reachable over UDP 4791 \
             (firewall?), and does its GID match its address? If it runs, it may be dropping \
             our packets: {mismatch}",
            f.peer
        )),
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

    #[test]
    fn mtu_mismatch_is_named() {
        let mut stats = QpStats::default();
        stats.naks_sent_by_code[0] = 1;
        let h = hints(&Failure {
            status: Some(WcStatus::WrFlushErr),
            stats: &stats,
            mtu: Some(Mtu::Mtu1024),
            peer: "127.0.0.1",
        });
        assert!(h[0].contains("path MTU mismatch"), "{h:?}");
        assert!(h[0].contains("ours: 1024"), "{h:?}");
    }
}
