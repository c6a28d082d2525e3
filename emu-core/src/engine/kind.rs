//! What a packet is to a driver that batches and orders what it sends and receives,
//! so that the driver never reads a header itself.
//!
//! A requester's packets and a responder's answers live in separate PSN spaces, which
//! the peer orders each on its own (IBTA 9.7.1): a positive ACK may therefore leave
//! after requests produced after it, while every other response keeps the
//! responder's order (a NAK must not overtake the ACK before it, nor a READ response
//! the READ responses before it).

use emu_wire::{Opcode, Syndrome};

/// What [`Engine::poll_transmit`](super::Engine::poll_transmit) hands out, or what
/// [`PacketKind::of`] reads from a received packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// A request (SEND, RDMA WRITE, RDMA READ request, atomic) of any transport: the
    /// requester's PSN space.
    Request,
    /// A positive RC ACKNOWLEDGE: the AETH syndrome's top three bits are 0 (IBTA
    /// 9.7.5.1). It may leave after requests produced after it.
    PositiveAck,
    /// Any other response: an RNR NAK or NAK, an RDMA READ response, an ATOMIC
    /// ACKNOWLEDGE. Responses leave in the order they were produced.
    Response,
}

impl PacketKind {
    /// The kind of `packet` (BTH first), or `None` when its first byte is not an
    /// opcode this device knows or an ACKNOWLEDGE is too short to hold its AETH.
    #[must_use]
    pub fn of(packet: &[u8]) -> Option<PacketKind> {
        let op = Opcode::try_from(*packet.first()?).ok()?;
        if op.is_request() {
            return Some(PacketKind::Request);
        }
        if op.is_ack() && !op.has_atomic_ack_eth() {
            // BTH (12 bytes), then the AETH's syndrome byte (IBTA 9.3.5).
            let syndrome = Syndrome::from_u8(*packet.get(12)?).ok()?;
            return Some(PacketKind::for_ack(syndrome));
        }
        Some(PacketKind::Response)
    }

    /// The kind of an ACKNOWLEDGE with `syndrome`.
    pub(crate) fn for_ack(syndrome: Syndrome) -> PacketKind {
        if matches!(syndrome, Syndrome::Ack { .. }) {
            PacketKind::PositiveAck
        } else {
            PacketKind::Response
        }
    }
}

/// The destination QP of an RC or UC packet (IBTA 9.2: the BTH opcode's top three bits
/// name the transport, 0 RC and 1 UC; bytes 5 to 7 the QP), `None` for any other: the
/// QP a connected packet is for, which a driver that pins each connection's source
/// port looks up.
#[must_use]
pub fn connected_dest_qpn(packet: &[u8]) -> Option<u32> {
    match packet {
        [op, _, _, _, _, a, b, c, ..] if op >> 5 <= 1 => Some(u32::from_be_bytes([0, *a, *b, *c])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use emu_wire::{AethRepr, NakCode, PacketRepr, Psn};

    fn packet(opcode: Opcode, syndrome: Option<Syndrome>) -> Vec<u8> {
        let mut repr = PacketRepr::new(opcode, 0x12, Psn::new(5));
        if let Some(syndrome) = syndrome {
            repr.aeth = Some(AethRepr { syndrome, msn: 1 });
        }
        let payload: &[u8] = if opcode.is_ack() { &[] } else { &[1, 2, 3, 4] };
        let mut buf = vec![0; repr.buffer_len(payload.len())];
        let n = repr.emit(&mut buf, payload);
        buf.truncate(n);
        buf
    }

    #[test]
    fn only_positive_acks_may_overtake_and_only_requests_are_requests() {
        let ack = packet(Opcode::RcAcknowledge, Some(Syndrome::ACK_NO_CREDIT));
        let rnr = packet(Opcode::RcAcknowledge, Some(Syndrome::RnrNak { timer: 3 }));
        let nak = packet(
            Opcode::RcAcknowledge,
            Some(Syndrome::Nak(NakCode::PsnSequenceError)),
        );
        let read = packet(
            Opcode::RcRdmaReadResponseOnly,
            Some(Syndrome::ACK_NO_CREDIT),
        );
        let atomic_ack = packet(Opcode::RcAtomicAcknowledge, Some(Syndrome::ACK_NO_CREDIT));
        assert_eq!(PacketKind::of(&ack), Some(PacketKind::PositiveAck));
        for p in [&rnr, &nak, &read, &atomic_ack] {
            assert_eq!(PacketKind::of(p), Some(PacketKind::Response));
        }
        for op in [
            Opcode::RcSendOnly,
            Opcode::UcRdmaWriteOnly,
            Opcode::UdSendOnly,
            Opcode::RcRdmaReadRequest,
        ] {
            assert_eq!(PacketKind::of(&packet(op, None)), Some(PacketKind::Request));
        }
        assert_eq!(PacketKind::of(&ack[..12]), None, "no room for the AETH");
        assert_eq!(PacketKind::of(&[]), None);
    }

    #[test]
    fn connected_packets_name_their_qp() {
        assert_eq!(
            connected_dest_qpn(&packet(Opcode::RcSendOnly, None)),
            Some(0x12)
        );
        assert_eq!(
            connected_dest_qpn(&packet(Opcode::UcSendOnly, None)),
            Some(0x12)
        );
        assert_eq!(connected_dest_qpn(&packet(Opcode::UdSendOnly, None)), None);
        assert_eq!(connected_dest_qpn(&[0; 4]), None);
    }
}
