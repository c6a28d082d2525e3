//! The opcode table (IBTA 9.2.1, table 38): which transport and which headers each
//! opcode carries. RC opcodes are `0x00 + n`, UC `0x20 + n` (SEND and WRITE families
//! only), UD `0x60 + n` (SEND ONLY, with and without immediate). RESYNC (0x15), FLUSH
//! (0x1C), ATOMIC WRITE (0x1D) and CNP (0x81) are not supported yet and parse as
//! [`Error::UnknownOpcode`].

use core::fmt;

use crate::error::Error;

/// A supported BTH opcode.
#[allow(missing_docs)]
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    RcSendFirst = 0x00,
    RcSendMiddle = 0x01,
    RcSendLast = 0x02,
    RcSendLastWithImmediate = 0x03,
    RcSendOnly = 0x04,
    RcSendOnlyWithImmediate = 0x05,
    RcRdmaWriteFirst = 0x06,
    RcRdmaWriteMiddle = 0x07,
    RcRdmaWriteLast = 0x08,
    RcRdmaWriteLastWithImmediate = 0x09,
    RcRdmaWriteOnly = 0x0A,
    RcRdmaWriteOnlyWithImmediate = 0x0B,
    RcRdmaReadRequest = 0x0C,
    RcRdmaReadResponseFirst = 0x0D,
    RcRdmaReadResponseMiddle = 0x0E,
    RcRdmaReadResponseLast = 0x0F,
    RcRdmaReadResponseOnly = 0x10,
    RcAcknowledge = 0x11,
    RcAtomicAcknowledge = 0x12,
    RcCompareSwap = 0x13,
    RcFetchAdd = 0x14,
    RcSendLastWithInvalidate = 0x16,
    RcSendOnlyWithInvalidate = 0x17,
    UcSendFirst = 0x20,
    UcSendMiddle = 0x21,
    UcSendLast = 0x22,
    UcSendLastWithImmediate = 0x23,
    UcSendOnly = 0x24,
    UcSendOnlyWithImmediate = 0x25,
    UcRdmaWriteFirst = 0x26,
    UcRdmaWriteMiddle = 0x27,
    UcRdmaWriteLast = 0x28,
    UcRdmaWriteLastWithImmediate = 0x29,
    UcRdmaWriteOnly = 0x2A,
    UcRdmaWriteOnlyWithImmediate = 0x2B,
    UdSendOnly = 0x64,
    UdSendOnlyWithImmediate = 0x65,
}

/// The transport service an opcode belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected.
    Rc,
    /// Unreliable Connected.
    Uc,
    /// Unreliable Datagram.
    Ud,
}

/// Where a packet sits in its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Position {
    /// The first packet of a multi-packet message.
    First,
    /// Neither first nor last.
    Middle,
    /// The last packet of a multi-packet message.
    Last,
    /// The whole message in one packet.
    Only,
}

use Opcode::*;

impl Opcode {
    /// Every supported opcode, in numeric order.
    pub const ALL: [Opcode; 37] = [
        RcSendFirst,
        RcSendMiddle,
        RcSendLast,
        RcSendLastWithImmediate,
        RcSendOnly,
        RcSendOnlyWithImmediate,
        RcRdmaWriteFirst,
        RcRdmaWriteMiddle,
        RcRdmaWriteLast,
        RcRdmaWriteLastWithImmediate,
        RcRdmaWriteOnly,
        RcRdmaWriteOnlyWithImmediate,
        RcRdmaReadRequest,
        RcRdmaReadResponseFirst,
        RcRdmaReadResponseMiddle,
        RcRdmaReadResponseLast,
        RcRdmaReadResponseOnly,
        RcAcknowledge,
        RcAtomicAcknowledge,
        RcCompareSwap,
        RcFetchAdd,
        RcSendLastWithInvalidate,
        RcSendOnlyWithInvalidate,
        UcSendFirst,
        UcSendMiddle,
        UcSendLast,
        UcSendLastWithImmediate,
        UcSendOnly,
        UcSendOnlyWithImmediate,
        UcRdmaWriteFirst,
        UcRdmaWriteMiddle,
        UcRdmaWriteLast,
        UcRdmaWriteLastWithImmediate,
        UcRdmaWriteOnly,
        UcRdmaWriteOnlyWithImmediate,
        UdSendOnly,
        UdSendOnlyWithImmediate,
    ];

    /// The low five bits: the operation, whatever the transport.
    fn op(self) -> u8 {
        self as u8 & 0x1F
    }

    /// The transport service.
    pub fn transport(self) -> Transport {
        match self as u8 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            _ => Transport::Ud,
        }
    }

    /// The position in the message; single-packet operations are `Only`.
    pub fn position(self) -> Position {
        match self.op() {
            0x00 | 0x06 | 0x0D => Position::First,
            0x01 | 0x07 | 0x0E => Position::Middle,
            0x02 | 0x03 | 0x08 | 0x09 | 0x0F | 0x16 => Position::Last,
            _ => Position::Only,
        }
    }

    /// A SEND packet (any position, immediate or invalidate).
    pub fn is_send(self) -> bool {
        matches!(self.op(), 0x00..=0x05 | 0x16 | 0x17)
    }

    /// An RDMA WRITE packet.
    pub fn is_write(self) -> bool {
        matches!(self.op(), 0x06..=0x0B)
    }

    /// An RDMA READ request.
    pub fn is_read_request(self) -> bool {
        self == RcRdmaReadRequest
    }

    /// An RDMA READ response packet.
    pub fn is_read_response(self) -> bool {
        matches!(
            self,
            RcRdmaReadResponseFirst
                | RcRdmaReadResponseMiddle
                | RcRdmaReadResponseLast
                | RcRdmaReadResponseOnly
        )
    }

    /// COMPARE_SWAP or FETCH_ADD.
    pub fn is_atomic(self) -> bool {
        matches!(self, RcCompareSwap | RcFetchAdd)
    }

    /// ACKNOWLEDGE or ATOMIC ACKNOWLEDGE.
    pub fn is_ack(self) -> bool {
        matches!(self, RcAcknowledge | RcAtomicAcknowledge)
    }

    /// Sent by a requester (SEND, WRITE, READ request, atomic), as opposed to a response.
    pub fn is_request(self) -> bool {
        self.is_send() || self.is_write() || self.is_read_request() || self.is_atomic()
    }

    /// Carries ImmDt.
    pub fn has_immediate(self) -> bool {
        matches!(self.op(), 0x03 | 0x05 | 0x09 | 0x0B)
    }

    /// Carries an IETH (SEND with invalidate).
    pub fn has_invalidate(self) -> bool {
        matches!(self, RcSendLastWithInvalidate | RcSendOnlyWithInvalidate)
    }

    /// Carries a RETH: WRITE FIRST/ONLY and READ request.
    pub fn has_reth(self) -> bool {
        matches!(self.op(), 0x06 | 0x0A | 0x0B | 0x0C)
    }

    /// Carries an AETH: ACKs and READ response FIRST/LAST/ONLY.
    pub fn has_aeth(self) -> bool {
        matches!(
            self,
            RcRdmaReadResponseFirst
                | RcRdmaReadResponseLast
                | RcRdmaReadResponseOnly
                | RcAcknowledge
                | RcAtomicAcknowledge
        )
    }

    /// Carries an AtomicETH.
    pub fn has_atomic_eth(self) -> bool {
        self.is_atomic()
    }

    /// Carries an AtomicAckETH.
    pub fn has_atomic_ack_eth(self) -> bool {
        self == RcAtomicAcknowledge
    }

    /// Carries a DETH (UD).
    pub fn has_deth(self) -> bool {
        self.transport() == Transport::Ud
    }

    /// May carry payload.
    pub fn has_payload(self) -> bool {
        !(self.is_read_request() || self.is_atomic() || self.is_ack())
    }

    /// BTH plus every extended header the opcode carries.
    pub fn header_len(self) -> usize {
        let mut n = crate::bth::HEADER_LEN;
        if self.has_deth() {
            n += crate::deth::HEADER_LEN;
        }
        if self.has_reth() {
            n += crate::reth::HEADER_LEN;
        }
        if self.has_atomic_eth() {
            n += crate::atomic::ATOMIC_ETH_LEN;
        }
        if self.has_aeth() {
            n += crate::aeth::HEADER_LEN;
        }
        if self.has_atomic_ack_eth() {
            n += crate::atomic::ATOMIC_ACK_ETH_LEN;
        }
        if self.has_immediate() {
            n += 4;
        }
        if self.has_invalidate() {
            n += 4;
        }
        n
    }

    /// The twin of an RC SEND or WRITE opcode on transport `t` (UC: the same
    /// operation at 0x20 + n; UD: SEND ONLY with or without immediate).
    pub fn with_transport(self, t: Transport) -> Option<Opcode> {
        let base = match t {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
        };
        Opcode::try_from(base | self.op())
            .ok()
            .filter(|o| o.transport() == t)
    }

    /// The name as Wireshark and kernel rxe print it, e.g. `RC_SEND_FIRST`.
    pub fn name(self) -> &'static str {
        const RC: [&str; 24] = [
            "RC_SEND_FIRST",
            "RC_SEND_MIDDLE",
            "RC_SEND_LAST",
            "RC_SEND_LAST_WITH_IMMEDIATE",
            "RC_SEND_ONLY",
            "RC_SEND_ONLY_WITH_IMMEDIATE",
            "RC_RDMA_WRITE_FIRST",
            "RC_RDMA_WRITE_MIDDLE",
            "RC_RDMA_WRITE_LAST",
            "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            "RC_RDMA_WRITE_ONLY",
            "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            "RC_RDMA_READ_REQUEST",
            "RC_RDMA_READ_RESPONSE_FIRST",
            "RC_RDMA_READ_RESPONSE_MIDDLE",
            "RC_RDMA_READ_RESPONSE_LAST",
            "RC_RDMA_READ_RESPONSE_ONLY",
            "RC_ACKNOWLEDGE",
            "RC_ATOMIC_ACKNOWLEDGE",
            "RC_COMPARE_SWAP",
            "RC_FETCH_ADD",
            "RC_RESYNC",
            "RC_SEND_LAST_WITH_INVALIDATE",
            "RC_SEND_ONLY_WITH_INVALIDATE",
        ];
        const UC: [&str; 12] = [
            "UC_SEND_FIRST",
            "UC_SEND_MIDDLE",
            "UC_SEND_LAST",
            "UC_SEND_LAST_WITH_IMMEDIATE",
            "UC_SEND_ONLY",
            "UC_SEND_ONLY_WITH_IMMEDIATE",
            "UC_RDMA_WRITE_FIRST",
            "UC_RDMA_WRITE_MIDDLE",
            "UC_RDMA_WRITE_LAST",
            "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            "UC_RDMA_WRITE_ONLY",
            "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        ];
        match self.transport() {
            Transport::Rc => RC[self.op() as usize],
            Transport::Uc => UC[self.op() as usize],
            Transport::Ud if self == UdSendOnly => "UD_SEND_ONLY",
            Transport::Ud => "UD_SEND_ONLY_WITH_IMMEDIATE",
        }
    }
}

impl TryFrom<u8> for Opcode {
    type Error = Error;
    fn try_from(b: u8) -> Result<Opcode, Error> {
        Opcode::ALL
            .iter()
            .copied()
            .find(|o| *o as u8 == b)
            .ok_or(Error::UnknownOpcode(b))
    }
}

impl From<Opcode> for u8 {
    fn from(o: Opcode) -> u8 {
        o as u8
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lengths_follow_roce_wire_md() {
        assert_eq!(RcSendFirst.header_len(), 12);
        assert_eq!(RcRdmaWriteOnlyWithImmediate.header_len(), 12 + 16 + 4);
        assert_eq!(RcRdmaReadResponseFirst.header_len(), 12 + 4);
        assert_eq!(RcRdmaReadResponseMiddle.header_len(), 12);
        assert_eq!(RcAtomicAcknowledge.header_len(), 12 + 4 + 8);
        assert_eq!(RcCompareSwap.header_len(), 12 + 28);
        assert_eq!(RcSendOnlyWithInvalidate.header_len(), 12 + 4);
        assert_eq!(UdSendOnly.header_len(), 12 + 8);
        assert_eq!(UdSendOnlyWithImmediate.header_len(), 12 + 8 + 4);
        assert_eq!(UcRdmaWriteFirst.header_len(), 12 + 16);
    }

    #[test]
    fn every_byte_is_an_opcode_or_an_error() {
        for b in 0..=255u8 {
            match Opcode::try_from(b) {
                Ok(o) => assert_eq!(u8::from(o), b),
                Err(e) => assert_eq!(e, Error::UnknownOpcode(b)),
            }
        }
        assert!(
            Opcode::try_from(0x15).is_err()
                && Opcode::try_from(0x1C).is_err()
                && Opcode::try_from(0x81).is_err()
        );
        for w in Opcode::ALL.windows(2) {
            assert!((w[0] as u8) < (w[1] as u8));
        }
    }

    #[test]
    fn transport_twins() {
        assert_eq!(
            RcSendLastWithImmediate.with_transport(Transport::Uc),
            Some(UcSendLastWithImmediate)
        );
        assert_eq!(RcRdmaReadRequest.with_transport(Transport::Uc), None);
        assert_eq!(RcSendOnly.with_transport(Transport::Ud), Some(UdSendOnly));
        assert_eq!(RcSendFirst.with_transport(Transport::Ud), None);
        assert_eq!(UcRdmaWriteOnly.name(), "UC_RDMA_WRITE_ONLY");
        assert_eq!(
            RcSendOnlyWithInvalidate.name(),
            "RC_SEND_ONLY_WITH_INVALIDATE"
        );
        assert_eq!(UdSendOnlyWithImmediate.position(), Position::Only);
        assert!(
            RcRdmaWriteLastWithImmediate.has_immediate()
                && RcRdmaWriteLastWithImmediate.position() == Position::Last
        );
    }
}
