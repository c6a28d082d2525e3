//! Per-device counters, in the spirit of kernel rxe's hw counters
//! (`/sys/class/infiniband/rxe0/ports/1/hw_counters`).

/// What the engine counted since the device was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets handed to the engine.
    pub rx_packets: u64,
    /// Packets the engine produced.
    pub tx_packets: u64,
    /// Datagrams that did not parse as RoCEv2 (dropped).
    pub rx_malformed: u64,
    /// Packets for a QP number the device does not have (dropped).
    pub rx_unknown_qp: u64,
    /// Packets whose opcode does not belong to the QP's transport, or that arrived in a
    /// state that accepts no packets (dropped).
    pub rx_dropped: u64,
    /// Duplicate requests the responder answered again (IBTA 9.7.5.1.2).
    pub duplicate_requests: u64,
    /// Out-of-sequence requests seen by the responder (IBTA 9.7.5.1.1).
    pub out_of_sequence: u64,
    /// UC messages dropped by the responder: a PSN gap, a missing receive WQE, a bad
    /// R_Key or length (IBTA 9.8).
    pub uc_dropped_messages: u64,
    /// PSN sequence error NAKs sent.
    pub seq_naks_sent: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Local ACK timeouts that caused a retransmission.
    pub ack_timeouts: u64,
    /// ACK timeouts that spent no retry: the peer device, on this host, had not run
    /// since the timer started (see `PeerLiveness`).
    pub stalled_peer_timeouts: u64,
    /// Go-back-N rewinds of the requester (timeouts, sequence NAKs, implied NAKs, RNR).
    pub retransmissions: u64,
    /// Completions lost to a full CQ.
    pub cq_overruns: u64,
    /// UD packets dropped because their Q_Key was not the receiving QP's (IBTA
    /// 10.2.5; kernel rxe drops them silently too).
    pub qkey_violations: u64,
    /// Packets dropped because their P_Key did not match the QP's (IBTA 10.9.3; the
    /// port's `bad_pkey_cntr`).
    pub bad_pkey: u64,
    /// UD packets dropped because the QP had no receive WQE (UD has no RNR).
    pub ud_no_recv_drops: u64,
    /// Packets that arrived while the port was not ACTIVE or the device had failed
    /// (dropped).
    pub rx_port_down: u64,
    /// Packets the QPs produced while the port was not ACTIVE (lost, as on a dead
    /// link).
    pub tx_port_down: u64,
    /// UD messages delivered to a receive WQE (each multicast copy counts).
    pub ud_received: u64,
}
