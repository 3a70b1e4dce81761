//! Counters per device and per QP, named like `rdma statistic` shows a NIC's.
//!
//! # Every datagram in exactly one place
//!
//! On receive, [`DeviceCounters`] account for every datagram that reached our socket:
//!
//! ```text
//! rx_packets = rx_icrc_errors + rx_drop_malformed + rx_drop_no_qp + rx_delivered
//! ```
//!
//! (`rx_delivered`: handed to a QP, which accepts it or counts its own drop reason)
//!
//! and `rx_drop_kernel` counts the datagrams the kernel dropped before they reached us
//! (receive buffer full), so for a sender's `n` datagrams, `n = rx_packets + rx_drop_kernel`
//! once all have arrived. `transport/tests/counters.rs` floods a device and reconciles.

use roce_qp::QpStats;

macro_rules! counters {
    ($(#[$m:meta])* $name:ident { $($(#[doc = $doc:literal])* $field:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl $name {
            /// Every counter as `(name, value)`, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$((stringify!($field), self.$field)),*].into_iter()
            }

            /// Adds every counter of `other` to this one (the shards of a device).
            pub fn add(&mut self, other: &Self) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

counters! {
    /// Device-level counters: what the engine saw below the QPs.
    DeviceCounters {
        /// Datagrams received from the datapath (including zero-length and oversized ones).
        rx_packets,
        /// Bytes of those datagrams (UDP payload).
        rx_bytes,
        /// Dropped: long enough to carry an ICRC, but it did not verify (for `udp` over IPv4
        /// without the IP header: no Identification with DF makes it verify, or only one this
        /// peer would not send now; see `roce_wire::icrc::Ipv4IdentChecker`).
        rx_icrc_errors,
        /// Dropped: not a well-formed RoCEv2 packet (shorter than BTH + ICRC, empty, larger
        /// than the receive buffer, unparsable after a good ICRC, wrong address family).
        rx_drop_malformed,
        /// Dropped: no QP with the destination QPN (includes QP1 / CM MADs).
        rx_drop_no_qp,
        /// Handed to the QP with the destination QPN (which accepts it or counts a drop).
        rx_delivered,
        /// Received with ECN Congestion Experienced.
        rx_ecn_ce,
        /// Datagrams the kernel dropped for our socket before we could read them (receive
        /// buffer full): `SO_RXQ_OVFL` / `SO_MEMINFO` on `udp`. Not in `rx_packets`.
        rx_drop_kernel,
        /// Receive errors from the datapath (failed system calls, not datagrams).
        rx_errors,
        /// Datagrams handed to the datapath.
        tx_packets,
        /// Bytes of those datagrams.
        tx_bytes,
        /// Dropped before sending: the destination's address family differs from ours.
        tx_drop_address,
        /// Sends the datapath refused for now (queue full); retried.
        tx_would_block,
        /// Datagrams lost to send errors (unreachable network or host...).
        tx_errors,
        /// A device with several engines ([`crate::DeviceConfig::engines`]): datagrams this
        /// engine received for another engine's QP (NAPI GRO merged them into one of its
        /// buffers) and handed on to that engine. Not in `rx_packets` (the owner counts them).
        rx_handed_on,
        /// A device with several engines: datagrams another engine received and handed to this
        /// one (counted in this engine's `rx_packets`).
        rx_handed_in,
    }
}

counters! {
    /// A device's counters with its QPs' summed in, rxe `hw_counters` names where one exists.
    Counters {
        /// Packets sent (rxe `sent_pkts`).
        sent_pkts,
        /// Packets received and accepted by a QP (rxe `rcvd_pkts`).
        rcvd_pkts,
        /// Datagrams handed to the datapath.
        tx_packets,
        /// Bytes handed to the datapath.
        tx_bytes,
        /// Datagrams received.
        rx_packets,
        /// Bytes received.
        rx_bytes,
        /// Request packets retransmitted (go-back-N).
        retransmitted_pkts,
        /// ACK timeouts (rxe `completer_retry_err` counts the ones that exhausted retries).
        ack_timeouts,
        /// Early retransmissions: go-back-N after several round trips without progress,
        /// before the ACK timeout and without spending a retry (`roce_qp::Timer::Probe`).
        early_retransmits,
        /// Duplicate requests answered (rxe `duplicate_request`).
        duplicate_request,
        /// Sequence NAKs sent (rxe `out_of_seq_request`).
        out_of_seq_request,
        /// Sequence NAKs received (rxe `rcvd_seq_err`).
        rcvd_seq_err,
        /// RNR NAKs sent (rxe `send_rnr_err`).
        send_rnr_err,
        /// RNR NAKs received (rxe `rcvd_rnr_err`).
        rcvd_rnr_err,
        /// Fatal NAKs sent (invalid request, remote access, remote operational).
        send_fatal_nak,
        /// Fatal NAKs received.
        rcvd_fatal_nak,
        /// NAK invalid request sent.
        send_nak_inv_req,
        /// NAK remote access error sent.
        send_nak_rem_access,
        /// NAK remote operational error sent.
        send_nak_rem_op,
        /// NAK invalid request received.
        rcvd_nak_inv_req,
        /// NAK remote access error received.
        rcvd_nak_rem_access,
        /// NAK remote operational error received.
        rcvd_nak_rem_op,
        /// ICRC errors.
        icrc_errors,
        /// Malformed packets.
        malformed,
        /// Packets for no QP.
        no_qp,
        /// Datagrams the kernel dropped before we could read them (receive buffer full).
        kernel_drops,
        /// Packets a QP dropped (state, P_Key, Q_Key, opcode, PSN, length, no receive WR,
        /// address).
        qp_drops,
        /// ECN CE marks received.
        ecn_ce,
        /// Send errors.
        send_errors,
    }
}

impl Counters {
    /// Sums device counters and QP statistics.
    pub(crate) fn collect<'a>(
        dev: &DeviceCounters,
        qps: impl Iterator<Item = &'a QpStats>,
    ) -> Self {
        let mut c = Self {
            tx_packets: dev.tx_packets,
            tx_bytes: dev.tx_bytes,
            rx_packets: dev.rx_packets,
            rx_bytes: dev.rx_bytes,
            icrc_errors: dev.rx_icrc_errors,
            malformed: dev.rx_drop_malformed,
            no_qp: dev.rx_drop_no_qp,
            kernel_drops: dev.rx_drop_kernel,
            ecn_ce: dev.rx_ecn_ce,
            send_errors: dev.tx_errors,
            ..Self::default()
        };
        for s in qps {
            c.add_qp(s);
        }
        c
    }

    fn add_qp(&mut self, s: &QpStats) {
        self.sent_pkts += s.tx_packets;
        self.rcvd_pkts += s.rx_packets;
        self.retransmitted_pkts += s.retransmitted_packets;
        self.ack_timeouts += s.timeouts;
        self.early_retransmits += s.early_retransmits;
        self.duplicate_request += s.duplicate_requests;
        self.out_of_seq_request += s.seq_naks_sent;
        self.rcvd_seq_err += s.seq_naks_received;
        self.send_rnr_err += s.rnr_naks_sent;
        self.rcvd_rnr_err += s.rnr_naks_received;
        self.send_fatal_nak += s.fatal_naks_sent;
        self.rcvd_fatal_nak += s.fatal_naks_received;
        self.send_nak_inv_req += s.naks_sent_by_code[0];
        self.send_nak_rem_access += s.naks_sent_by_code[1];
        self.send_nak_rem_op += s.naks_sent_by_code[2];
        self.rcvd_nak_inv_req += s.naks_received_by_code[0];
        self.rcvd_nak_rem_access += s.naks_received_by_code[1];
        self.rcvd_nak_rem_op += s.naks_received_by_code[2];
        self.qp_drops += s.drops();
    }
}
