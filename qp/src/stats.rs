//! The counters of one QP.

use roce_wire::aeth::NakCode;

/// Counters of one QP, in the spirit of `rdma statistic`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Packets produced by `poll_transmit`.
    pub tx_packets: u64,
    /// Payload bytes in them.
    pub tx_bytes: u64,
    /// Packets `handle_packet` (or `handle_bad_pad`) processed: every packet handed to the QP
    /// lands either here or in exactly one `drop_*` counter.
    pub rx_packets: u64,
    /// Payload bytes in them.
    pub rx_bytes: u64,
    /// Request packets sent again (go-back-N).
    pub retransmitted_packets: u64,
    /// ACK timeouts that fired.
    pub timeouts: u64,
    /// Early retransmissions (`Timer::Probe`) that fired.
    pub early_retransmits: u64,
    /// Sequence-error NAKs sent / received.
    pub seq_naks_sent: u64,
    /// Sequence-error NAKs received.
    pub seq_naks_received: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Fatal NAKs (invalid request, remote access, remote operational) sent.
    pub fatal_naks_sent: u64,
    /// Fatal NAKs received.
    pub fatal_naks_received: u64,
    /// NAKs sent by code: invalid request, remote access error, remote operational error.
    pub naks_sent_by_code: [u64; 3],
    /// NAKs received by code: invalid request, remote access error, remote operational error.
    pub naks_received_by_code: [u64; 3],
    /// Duplicate requests answered.
    pub duplicate_requests: u64,
    /// Packets dropped: wrong state.
    pub drop_state: u64,
    /// Packets dropped: P_Key mismatch.
    pub drop_pkey: u64,
    /// Packets dropped: Q_Key mismatch (UD).
    pub drop_qkey: u64,
    /// Packets dropped: opcode not valid for this QP type or out of sequence (UC/UD).
    pub drop_opcode: u64,
    /// Packets dropped: out-of-sequence PSN (after the one NAK) or stale response.
    pub drop_psn: u64,
    /// Packets dropped: malformed lengths.
    pub drop_length: u64,
    /// Packets dropped: no receive WR (UD, UC).
    pub drop_no_recv: u64,
    /// Packets dropped: wrong source address for a connected QP.
    pub drop_address: u64,
}

impl QpStats {
    /// Packets dropped, all reasons (the sum of the `drop_*` counters).
    pub const fn drops(&self) -> u64 {
        self.drop_state
            + self.drop_pkey
            + self.drop_qkey
            + self.drop_opcode
            + self.drop_psn
            + self.drop_length
            + self.drop_no_recv
            + self.drop_address
    }
}

impl core::ops::AddAssign<&Self> for QpStats {
    /// Adds every counter of `other` (a device summing its QPs, live and destroyed).
    fn add_assign(&mut self, other: &Self) {
        let Self {
            tx_packets,
            tx_bytes,
            rx_packets,
            rx_bytes,
            retransmitted_packets,
            timeouts,
            early_retransmits,
            seq_naks_sent,
            seq_naks_received,
            rnr_naks_sent,
            rnr_naks_received,
            fatal_naks_sent,
            fatal_naks_received,
            naks_sent_by_code,
            naks_received_by_code,
            duplicate_requests,
            drop_state,
            drop_pkey,
            drop_qkey,
            drop_opcode,
            drop_psn,
            drop_length,
            drop_no_recv,
            drop_address,
        } = other;
        self.tx_packets += tx_packets;
        self.tx_bytes += tx_bytes;
        self.rx_packets += rx_packets;
        self.rx_bytes += rx_bytes;
        self.retransmitted_packets += retransmitted_packets;
        self.timeouts += timeouts;
        self.early_retransmits += early_retransmits;
        self.seq_naks_sent += seq_naks_sent;
        self.seq_naks_received += seq_naks_received;
        self.rnr_naks_sent += rnr_naks_sent;
        self.rnr_naks_received += rnr_naks_received;
        self.fatal_naks_sent += fatal_naks_sent;
        self.fatal_naks_received += fatal_naks_received;
        for i in 0..3 {
            self.naks_sent_by_code[i] += naks_sent_by_code[i];
            self.naks_received_by_code[i] += naks_received_by_code[i];
        }
        self.duplicate_requests += duplicate_requests;
        self.drop_state += drop_state;
        self.drop_pkey += drop_pkey;
        self.drop_qkey += drop_qkey;
        self.drop_opcode += drop_opcode;
        self.drop_psn += drop_psn;
        self.drop_length += drop_length;
        self.drop_no_recv += drop_no_recv;
        self.drop_address += drop_address;
    }
}

impl QpStats {
    /// Counts a fatal NAK sent with `code`.
    pub(crate) fn nak_sent(&mut self, code: NakCode) {
        self.fatal_naks_sent += 1;
        if let Some(i) = fatal_index(code) {
            self.naks_sent_by_code[i] += 1;
        }
    }

    /// Counts a fatal NAK received with `code`.
    pub(crate) fn nak_received(&mut self, code: NakCode) {
        self.fatal_naks_received += 1;
        if let Some(i) = fatal_index(code) {
            self.naks_received_by_code[i] += 1;
        }
    }
}

const fn fatal_index(code: NakCode) -> Option<usize> {
    match code {
        NakCode::InvalidRequest => Some(0),
        NakCode::RemoteAccessError => Some(1),
        NakCode::RemoteOperationalError => Some(2),
        _ => None,
    }
}
