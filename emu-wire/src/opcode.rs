//! The opcode table (IBTA 9.2.1, table 38): which transport and which headers each
//! opcode carries. RC opcodes are `0x00 + n`, UC `0x20 + n` (SEND and WRITE families
//! only), UD `0x60 + n` (SEND ONLY, with and without immediate), XRC `0xA0 + n` (the
//! RC set but FLUSH and ATOMIC WRITE: IBTA XRC annex A14; every XRC request carries
//! an XRCETH). RC also has FLUSH (0x1C) and ATOMIC WRITE (0x1D), from IBTA 1.5 (kernel
//! rxe since 6.2). RESYNC (0x15, 0xB5) and CNP (0x81) are not supported and parse as
//! [`Error::UnknownOpcode`].

use core::fmt;

use crate::error::Error;

/// A supported BTH opcode (IBTA 9.2.1, table 38). The discriminant is the byte on the
/// wire.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// RC SEND FIRST.
    RcSendFirst = 0x00,
    /// RC SEND MIDDLE.
    RcSendMiddle = 0x01,
    /// RC SEND LAST.
    RcSendLast = 0x02,
    /// RC SEND LAST with immediate.
    RcSendLastWithImmediate = 0x03,
    /// RC SEND ONLY.
    RcSendOnly = 0x04,
    /// RC SEND ONLY with immediate.
    RcSendOnlyWithImmediate = 0x05,
    /// RC RDMA WRITE FIRST.
    RcRdmaWriteFirst = 0x06,
    /// RC RDMA WRITE MIDDLE.
    RcRdmaWriteMiddle = 0x07,
    /// RC RDMA WRITE LAST.
    RcRdmaWriteLast = 0x08,
    /// RC RDMA WRITE LAST with immediate.
    RcRdmaWriteLastWithImmediate = 0x09,
    /// RC RDMA WRITE ONLY.
    RcRdmaWriteOnly = 0x0A,
    /// RC RDMA WRITE ONLY with immediate.
    RcRdmaWriteOnlyWithImmediate = 0x0B,
    /// RC RDMA READ REQUEST.
    RcRdmaReadRequest = 0x0C,
    /// RC RDMA READ RESPONSE FIRST.
    RcRdmaReadResponseFirst = 0x0D,
    /// RC RDMA READ RESPONSE MIDDLE.
    RcRdmaReadResponseMiddle = 0x0E,
    /// RC RDMA READ RESPONSE LAST.
    RcRdmaReadResponseLast = 0x0F,
    /// RC RDMA READ RESPONSE ONLY.
    RcRdmaReadResponseOnly = 0x10,
    /// RC ACKNOWLEDGE.
    RcAcknowledge = 0x11,
    /// RC ATOMIC ACKNOWLEDGE.
    RcAtomicAcknowledge = 0x12,
    /// RC COMPARE SWAP.
    RcCompareSwap = 0x13,
    /// RC FETCH ADD.
    RcFetchAdd = 0x14,
    /// RC SEND LAST with invalidate.
    RcSendLastWithInvalidate = 0x16,
    /// RC SEND ONLY with invalidate.
    RcSendOnlyWithInvalidate = 0x17,
    /// RC FLUSH (IBTA 1.5): FETH and RETH, no payload; answered by a zero-length
    /// RDMA READ RESPONSE ONLY.
    RcFlush = 0x1C,
    /// RC ATOMIC WRITE (IBTA 1.5): RETH and 8 bytes of payload written as one unit;
    /// answered by a zero-length RDMA READ RESPONSE ONLY.
    RcAtomicWrite = 0x1D,
    /// UC SEND FIRST.
    UcSendFirst = 0x20,
    /// UC SEND MIDDLE.
    UcSendMiddle = 0x21,
    /// UC SEND LAST.
    UcSendLast = 0x22,
    /// UC SEND LAST with immediate.
    UcSendLastWithImmediate = 0x23,
    /// UC SEND ONLY.
    UcSendOnly = 0x24,
    /// UC SEND ONLY with immediate.
    UcSendOnlyWithImmediate = 0x25,
    /// UC RDMA WRITE FIRST.
    UcRdmaWriteFirst = 0x26,
    /// UC RDMA WRITE MIDDLE.
    UcRdmaWriteMiddle = 0x27,
    /// UC RDMA WRITE LAST.
    UcRdmaWriteLast = 0x28,
    /// UC RDMA WRITE LAST with immediate.
    UcRdmaWriteLastWithImmediate = 0x29,
    /// UC RDMA WRITE ONLY.
    UcRdmaWriteOnly = 0x2A,
    /// UC RDMA WRITE ONLY with immediate.
    UcRdmaWriteOnlyWithImmediate = 0x2B,
    /// UD SEND ONLY.
    UdSendOnly = 0x64,
    /// UD SEND ONLY with immediate.
    UdSendOnlyWithImmediate = 0x65,
    /// XRC SEND FIRST.
    XrcSendFirst = 0xA0,
    /// XRC SEND MIDDLE.
    XrcSendMiddle = 0xA1,
    /// XRC SEND LAST.
    XrcSendLast = 0xA2,
    /// XRC SEND LAST with immediate.
    XrcSendLastWithImmediate = 0xA3,
    /// XRC SEND ONLY.
    XrcSendOnly = 0xA4,
    /// XRC SEND ONLY with immediate.
    XrcSendOnlyWithImmediate = 0xA5,
    /// XRC RDMA WRITE FIRST.
    XrcRdmaWriteFirst = 0xA6,
    /// XRC RDMA WRITE MIDDLE.
    XrcRdmaWriteMiddle = 0xA7,
    /// XRC RDMA WRITE LAST.
    XrcRdmaWriteLast = 0xA8,
    /// XRC RDMA WRITE LAST with immediate.
    XrcRdmaWriteLastWithImmediate = 0xA9,
    /// XRC RDMA WRITE ONLY.
    XrcRdmaWriteOnly = 0xAA,
    /// XRC RDMA WRITE ONLY with immediate.
    XrcRdmaWriteOnlyWithImmediate = 0xAB,
    /// XRC RDMA READ REQUEST.
    XrcRdmaReadRequest = 0xAC,
    /// XRC RDMA READ RESPONSE FIRST.
    XrcRdmaReadResponseFirst = 0xAD,
    /// XRC RDMA READ RESPONSE MIDDLE.
    XrcRdmaReadResponseMiddle = 0xAE,
    /// XRC RDMA READ RESPONSE LAST.
    XrcRdmaReadResponseLast = 0xAF,
    /// XRC RDMA READ RESPONSE ONLY.
    XrcRdmaReadResponseOnly = 0xB0,
    /// XRC ACKNOWLEDGE.
    XrcAcknowledge = 0xB1,
    /// XRC ATOMIC ACKNOWLEDGE.
    XrcAtomicAcknowledge = 0xB2,
    /// XRC COMPARE SWAP.
    XrcCompareSwap = 0xB3,
    /// XRC FETCH ADD.
    XrcFetchAdd = 0xB4,
    /// XRC SEND LAST with invalidate.
    XrcSendLastWithInvalidate = 0xB6,
    /// XRC SEND ONLY with invalidate.
    XrcSendOnlyWithInvalidate = 0xB7,
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
    /// eXtended Reliable Connected (IBTA XRC annex A14): RC's reliability, requests
    /// addressed to an XRC SRQ at the target by their XRCETH.
    Xrc,
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
    pub const ALL: [Opcode; 62] = [
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
        RcFlush,
        RcAtomicWrite,
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
        XrcSendFirst,
        XrcSendMiddle,
        XrcSendLast,
        XrcSendLastWithImmediate,
        XrcSendOnly,
        XrcSendOnlyWithImmediate,
        XrcRdmaWriteFirst,
        XrcRdmaWriteMiddle,
        XrcRdmaWriteLast,
        XrcRdmaWriteLastWithImmediate,
        XrcRdmaWriteOnly,
        XrcRdmaWriteOnlyWithImmediate,
        XrcRdmaReadRequest,
        XrcRdmaReadResponseFirst,
        XrcRdmaReadResponseMiddle,
        XrcRdmaReadResponseLast,
        XrcRdmaReadResponseOnly,
        XrcAcknowledge,
        XrcAtomicAcknowledge,
        XrcCompareSwap,
        XrcFetchAdd,
        XrcSendLastWithInvalidate,
        XrcSendOnlyWithInvalidate,
    ];

    /// The low five bits: the operation, whatever the transport.
    fn op(self) -> u8 {
        self as u8 & 0x1F
    }

    /// The transport service.
    pub fn transport(self) -> Transport {
        // IBTA 9.2.1: the top three bits select the transport (000 RC, 001 UC, 011 UD,
        // 101 XRC); no supported opcode has another prefix.
        match self as u8 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            3 => Transport::Ud,
            _ => Transport::Xrc,
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
        self.op() == 0x0C
    }

    /// An RDMA READ response packet.
    pub fn is_read_response(self) -> bool {
        matches!(self.op(), 0x0D..=0x10)
    }

    /// COMPARE_SWAP or FETCH_ADD.
    pub fn is_atomic(self) -> bool {
        matches!(self.op(), 0x13 | 0x14)
    }

    /// FLUSH (IBTA 1.5).
    pub fn is_flush(self) -> bool {
        self == RcFlush
    }

    /// ATOMIC WRITE (IBTA 1.5).
    pub fn is_atomic_write(self) -> bool {
        self == RcAtomicWrite
    }

    /// ACKNOWLEDGE or ATOMIC ACKNOWLEDGE.
    pub fn is_ack(self) -> bool {
        matches!(self.op(), 0x11 | 0x12)
    }

    /// Sent by a requester (SEND, WRITE, READ request, atomic, FLUSH, ATOMIC WRITE), as
    /// opposed to a response.
    pub fn is_request(self) -> bool {
        self.is_send()
            || self.is_write()
            || self.is_read_request()
            || self.is_atomic()
            || self.is_flush()
            || self.is_atomic_write()
    }

    /// Carries ImmDt.
    pub fn has_immediate(self) -> bool {
        matches!(self.op(), 0x03 | 0x05 | 0x09 | 0x0B)
    }

    /// Carries an IETH (SEND with invalidate).
    pub fn has_invalidate(self) -> bool {
        matches!(self.op(), 0x16 | 0x17)
    }

    /// Carries a RETH: WRITE FIRST/ONLY, READ request, FLUSH and ATOMIC WRITE.
    pub fn has_reth(self) -> bool {
        // IBTA 9.3.3 RETH; table 38 lists it on WRITE FIRST/ONLY and READ REQUEST, IBTA
        // 1.5 on FLUSH and ATOMIC WRITE.
        matches!(self.op(), 0x06 | 0x0A | 0x0B | 0x0C | 0x1C | 0x1D)
    }

    /// Carries a FETH: FLUSH (IBTA 1.5).
    pub fn has_feth(self) -> bool {
        self.is_flush()
    }

    /// Carries an AETH: ACKs and READ response FIRST/LAST/ONLY.
    pub fn has_aeth(self) -> bool {
        // IBTA 9.3.5 AETH: not on READ RESPONSE MIDDLE.
        matches!(self.op(), 0x0D | 0x0F | 0x10 | 0x11 | 0x12)
    }

    /// Carries an AtomicETH.
    pub fn has_atomic_eth(self) -> bool {
        self.is_atomic()
    }

    /// Carries an AtomicAckETH.
    pub fn has_atomic_ack_eth(self) -> bool {
        self.op() == 0x12
    }

    /// Carries an XRCETH: every XRC request (IBTA XRC annex A14), not XRC responses.
    pub fn has_xrceth(self) -> bool {
        self.transport() == Transport::Xrc && self.is_request()
    }

    /// Carries a DETH (UD).
    pub fn has_deth(self) -> bool {
        // IBTA 9.3.2 DETH: every UD packet.
        self.transport() == Transport::Ud
    }

    /// May carry payload.
    pub fn has_payload(self) -> bool {
        // IBTA 9.2.1 table 38: READ REQUEST, atomics and ACKs carry no payload; nor does
        // FLUSH (IBTA 1.5).
        !(self.is_read_request() || self.is_atomic() || self.is_ack() || self.is_flush())
    }

    /// BTH plus every extended header the opcode carries.
    pub fn header_len(self) -> usize {
        // IBTA 9.2 BTH, then the extended headers of 9.3 in the order IBTA puts them.
        let mut n = crate::bth::HEADER_LEN;
        if self.has_deth() {
            n += crate::deth::HEADER_LEN;
        }
        // XRC annex: the XRCETH follows the BTH (and a DETH, which XRC never has) and
        // comes before the RETH, AtomicETH, ImmDt and IETH.
        if self.has_xrceth() {
            n += crate::xrceth::HEADER_LEN;
        }
        // IBTA 1.5: a FLUSH's FETH comes before its RETH (as kernel rxe 6.12 sends it).
        if self.has_feth() {
            n += crate::feth::HEADER_LEN;
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
    /// operation at 0x20 + n; UD: SEND ONLY with or without immediate; XRC: the same
    /// operation at 0xA0 + n, which every RC operation but FLUSH and ATOMIC WRITE has).
    pub fn with_transport(self, t: Transport) -> Option<Opcode> {
        let base = match t {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            Transport::Ud => 0x60,
            Transport::Xrc => 0xA0,
        };
        Opcode::try_from(base | self.op())
            .ok()
            .filter(|o| o.transport() == t)
    }

    /// The name as Wireshark and kernel rxe print it, e.g. `RC_SEND_FIRST`.
    pub fn name(self) -> &'static str {
        const RC: [&str; 30] = [
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
            // 0x18..=0x1B are reserved: no opcode has them.
            "",
            "",
            "",
            "",
            "RC_FLUSH",
            "RC_ATOMIC_WRITE",
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
        const XRC: [&str; 24] = [
            "XRC_SEND_FIRST",
            "XRC_SEND_MIDDLE",
            "XRC_SEND_LAST",
            "XRC_SEND_LAST_WITH_IMMEDIATE",
            "XRC_SEND_ONLY",
            "XRC_SEND_ONLY_WITH_IMMEDIATE",
            "XRC_RDMA_WRITE_FIRST",
            "XRC_RDMA_WRITE_MIDDLE",
            "XRC_RDMA_WRITE_LAST",
            "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
            "XRC_RDMA_WRITE_ONLY",
            "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            "XRC_RDMA_READ_REQUEST",
            "XRC_RDMA_READ_RESPONSE_FIRST",
            "XRC_RDMA_READ_RESPONSE_MIDDLE",
            "XRC_RDMA_READ_RESPONSE_LAST",
            "XRC_RDMA_READ_RESPONSE_ONLY",
            "XRC_ACKNOWLEDGE",
            "XRC_ATOMIC_ACKNOWLEDGE",
            "XRC_COMPARE_SWAP",
            "XRC_FETCH_ADD",
            "XRC_RESYNC",
            "XRC_SEND_LAST_WITH_INVALIDATE",
            "XRC_SEND_ONLY_WITH_INVALIDATE",
        ];
        match self.transport() {
            Transport::Rc => RC[self.op() as usize],
            Transport::Uc => UC[self.op() as usize],
            Transport::Ud if self == UdSendOnly => "UD_SEND_ONLY",
            Transport::Ud => "UD_SEND_ONLY_WITH_IMMEDIATE",
            Transport::Xrc => XRC[self.op() as usize],
        }
    }
}

/// Every byte's opcode, if it names one: decoding a BTH is one load, not a search of
/// [`Opcode::ALL`] (it runs for every packet received and every packet a NIC sorts).
const BY_BYTE: [Option<Opcode>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < Opcode::ALL.len() {
        t[Opcode::ALL[i] as usize] = Some(Opcode::ALL[i]);
        i += 1;
    }
    t
};

impl TryFrom<u8> for Opcode {
    type Error = Error;
    fn try_from(b: u8) -> Result<Opcode, Error> {
        BY_BYTE[usize::from(b)].ok_or(Error::UnknownOpcode(b))
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

    /// The header table of roce-wire.md ("Opcodes"), written out per operation `n`:
    /// which extended headers follow the BTH, and whether payload may follow.
    /// (n, name without transport, RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH, payload)
    #[allow(clippy::type_complexity)]
    const TABLE: [(u8, &str, bool, bool, bool, bool, bool, bool, bool); 25] = [
        (
            0x00,
            "SEND_FIRST",
            false,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x01,
            "SEND_MIDDLE",
            false,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x02,
            "SEND_LAST",
            false,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x03,
            "SEND_LAST_WITH_IMMEDIATE",
            false,
            false,
            false,
            false,
            true,
            false,
            true,
        ),
        (
            0x04,
            "SEND_ONLY",
            false,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x05,
            "SEND_ONLY_WITH_IMMEDIATE",
            false,
            false,
            false,
            false,
            true,
            false,
            true,
        ),
        (
            0x06,
            "RDMA_WRITE_FIRST",
            true,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x07,
            "RDMA_WRITE_MIDDLE",
            false,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x08,
            "RDMA_WRITE_LAST",
            false,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x09,
            "RDMA_WRITE_LAST_WITH_IMMEDIATE",
            false,
            false,
            false,
            false,
            true,
            false,
            true,
        ),
        (
            0x0A,
            "RDMA_WRITE_ONLY",
            true,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x0B,
            "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            true,
            false,
            false,
            false,
            true,
            false,
            true,
        ),
        (
            0x0C,
            "RDMA_READ_REQUEST",
            true,
            false,
            false,
            false,
            false,
            false,
            false,
        ),
        (
            0x0D,
            "RDMA_READ_RESPONSE_FIRST",
            false,
            true,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x0E,
            "RDMA_READ_RESPONSE_MIDDLE",
            false,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x0F,
            "RDMA_READ_RESPONSE_LAST",
            false,
            true,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x10,
            "RDMA_READ_RESPONSE_ONLY",
            false,
            true,
            false,
            false,
            false,
            false,
            true,
        ),
        (
            0x11,
            "ACKNOWLEDGE",
            false,
            true,
            false,
            false,
            false,
            false,
            false,
        ),
        (
            0x12,
            "ATOMIC_ACKNOWLEDGE",
            false,
            true,
            false,
            true,
            false,
            false,
            false,
        ),
        (
            0x13,
            "COMPARE_SWAP",
            false,
            false,
            true,
            false,
            false,
            false,
            false,
        ),
        (
            0x14,
            "FETCH_ADD",
            false,
            false,
            true,
            false,
            false,
            false,
            false,
        ),
        (
            0x16,
            "SEND_LAST_WITH_INVALIDATE",
            false,
            false,
            false,
            false,
            false,
            true,
            true,
        ),
        (
            0x17,
            "SEND_ONLY_WITH_INVALIDATE",
            false,
            false,
            false,
            false,
            false,
            true,
            true,
        ),
        // IBTA 1.5; FLUSH also carries a FETH (checked below).
        (
            0x1C, "FLUSH", true, false, false, false, false, false, false,
        ),
        (
            0x1D,
            "ATOMIC_WRITE",
            true,
            false,
            false,
            false,
            false,
            false,
            true,
        ),
    ];

    #[test]
    fn every_opcode_matches_the_roce_wire_md_table() {
        let mut seen = 0;
        for (base, prefix, ops) in [
            (0x00u8, "RC", 0x00u8..=0x1D),
            (0x20, "UC", 0x00..=0x0B),
            (0x60, "UD", 0x04..=0x05),
            (0xA0, "XRC", 0x00..=0x17),
        ] {
            for (n, name, reth, aeth, atomic, atomic_ack, imm, ieth, payload) in TABLE {
                let Ok(op) = Opcode::try_from(base | n) else {
                    assert!(!ops.contains(&n), "{prefix} {name} is missing");
                    continue;
                };
                assert!(ops.contains(&n), "{op} should not exist");
                seen += 1;
                let deth = prefix == "UD";
                assert_eq!(op.name(), format!("{prefix}_{name}"));
                assert_eq!(op.to_string(), op.name());
                assert_eq!(
                    (op.has_reth(), op.has_aeth(), op.has_atomic_eth()),
                    (reth, aeth, atomic),
                    "{op}"
                );
                assert_eq!(
                    (
                        op.has_atomic_ack_eth(),
                        op.has_immediate(),
                        op.has_invalidate()
                    ),
                    (atomic_ack, imm, ieth),
                    "{op}"
                );
                assert_eq!((op.has_deth(), op.has_payload()), (deth, payload), "{op}");
                let feth = op == RcFlush;
                assert_eq!(op.has_feth(), feth, "{op}");
                // XRC annex: every XRC request, and only requests, carry an XRCETH.
                let xrceth = prefix == "XRC" && !(op.is_ack() || op.is_read_response());
                assert_eq!(op.has_xrceth(), xrceth, "{op}");
                let len = 12
                    + 4 * usize::from(feth)
                    + 4 * usize::from(xrceth)
                    + 8 * usize::from(deth)
                    + 16 * usize::from(reth)
                    + 28 * usize::from(atomic)
                    + 4 * usize::from(aeth)
                    + 8 * usize::from(atomic_ack)
                    + 4 * usize::from(imm)
                    + 4 * usize::from(ieth);
                assert_eq!(op.header_len(), len, "{op}");
                let t = match prefix {
                    "RC" => Transport::Rc,
                    "UC" => Transport::Uc,
                    "UD" => Transport::Ud,
                    _ => Transport::Xrc,
                };
                assert_eq!(op.transport(), t);
            }
        }
        assert_eq!(seen, Opcode::ALL.len());
    }

    #[test]
    fn header_lengths_follow_roce_wire_md() {
        assert_eq!(RcSendFirst.header_len(), 12);
        assert_eq!(RcRdmaWriteOnlyWithImmediate.header_len(), 12 + 16 + 4);
        assert_eq!(RcRdmaReadRequest.header_len(), 12 + 16);
        assert_eq!(RcRdmaReadResponseFirst.header_len(), 12 + 4);
        assert_eq!(RcRdmaReadResponseMiddle.header_len(), 12);
        assert_eq!(RcAcknowledge.header_len(), 12 + 4);
        assert_eq!(RcAtomicAcknowledge.header_len(), 12 + 4 + 8);
        assert_eq!(RcCompareSwap.header_len(), 12 + 28);
        assert_eq!(RcFetchAdd.header_len(), 12 + 28);
        assert_eq!(RcSendOnlyWithInvalidate.header_len(), 12 + 4);
        assert_eq!(UdSendOnly.header_len(), 12 + 8);
        assert_eq!(UdSendOnlyWithImmediate.header_len(), 12 + 8 + 4);
        assert_eq!(UcRdmaWriteFirst.header_len(), 12 + 16);
        assert_eq!(RcFlush.header_len(), 12 + 4 + 16);
        assert_eq!(RcAtomicWrite.header_len(), 12 + 16);
        assert_eq!(XrcSendOnly.header_len(), 12 + 4);
        assert_eq!(XrcSendOnlyWithImmediate.header_len(), 12 + 4 + 4);
        assert_eq!(XrcRdmaWriteFirst.header_len(), 12 + 4 + 16);
        assert_eq!(XrcRdmaReadRequest.header_len(), 12 + 4 + 16);
        assert_eq!(XrcCompareSwap.header_len(), 12 + 4 + 28);
        assert_eq!(XrcSendOnlyWithInvalidate.header_len(), 12 + 4 + 4);
        assert_eq!(XrcRdmaReadResponseFirst.header_len(), 12 + 4);
        assert_eq!(XrcAcknowledge.header_len(), 12 + 4);
        assert_eq!(XrcAtomicAcknowledge.header_len(), 12 + 4 + 8);
    }

    #[test]
    fn every_byte_is_an_opcode_or_an_error() {
        let mut known = 0;
        for b in 0..=255u8 {
            match Opcode::try_from(b) {
                Ok(o) => {
                    assert_eq!(u8::from(o), b);
                    known += 1;
                }
                Err(e) => assert_eq!(e, Error::UnknownOpcode(b)),
            }
        }
        assert_eq!(known, Opcode::ALL.len(), "every opcode decodes");
        // RESYNC and CNP are not supported; FLUSH and ATOMIC WRITE are, on RC only.
        assert_eq!(Opcode::try_from(0x1C), Ok(RcFlush));
        assert_eq!(Opcode::try_from(0x1D), Ok(RcAtomicWrite));
        assert_eq!(Opcode::try_from(0xA0), Ok(XrcSendFirst));
        assert_eq!(Opcode::try_from(0xB7), Ok(XrcSendOnlyWithInvalidate));
        for b in [0x15, 0x81, 0xB5, 0xBC, 0xBD] {
            assert_eq!(Opcode::try_from(b), Err(Error::UnknownOpcode(b)));
        }
        for w in Opcode::ALL.windows(2) {
            assert!((w[0] as u8) < (w[1] as u8));
        }
    }

    #[test]
    fn classes_and_positions() {
        for op in Opcode::ALL {
            let classes = [
                op.is_send(),
                op.is_write(),
                op.is_read_request(),
                op.is_read_response(),
                op.is_atomic(),
                op.is_ack(),
                op.is_flush(),
                op.is_atomic_write(),
            ];
            assert_eq!(classes.iter().filter(|&&c| c).count(), 1, "{op}");
            assert_eq!(
                op.is_request(),
                !(op.is_read_response() || op.is_ack()),
                "{op}"
            );
            let name = op.name();
            let pos = if name.contains("_FIRST") {
                Position::First
            } else if name.contains("_MIDDLE") {
                Position::Middle
            } else if name.contains("_LAST") {
                Position::Last
            } else {
                Position::Only
            };
            assert_eq!(op.position(), pos, "{op}");
        }
    }

    #[test]
    fn transport_twins() {
        for op in Opcode::ALL {
            for t in [Transport::Rc, Transport::Uc, Transport::Ud, Transport::Xrc] {
                match op.with_transport(t) {
                    Some(twin) => {
                        assert_eq!(twin.transport(), t);
                        let rest = |o: Opcode| o.name().split_once('_').unwrap().1;
                        assert_eq!(rest(twin), rest(op));
                    }
                    None => {
                        let rc = op.with_transport(Transport::Rc).unwrap();
                        if t == Transport::Xrc {
                            assert!(rc.is_flush() || rc.is_atomic_write(), "{op}");
                            continue;
                        }
                        assert!(
                            t == Transport::Ud
                                && !matches!(rc, RcSendOnly | RcSendOnlyWithImmediate)
                                || t == Transport::Uc && !(rc.is_write() || rc.is_send())
                                || t == Transport::Uc && rc.has_invalidate(),
                            "{op} has no {t:?} twin"
                        );
                    }
                }
            }
        }
        assert_eq!(
            RcSendLastWithImmediate.with_transport(Transport::Uc),
            Some(UcSendLastWithImmediate)
        );
        assert_eq!(RcRdmaReadRequest.with_transport(Transport::Uc), None);
        assert_eq!(RcSendOnly.with_transport(Transport::Ud), Some(UdSendOnly));
        assert_eq!(RcSendFirst.with_transport(Transport::Ud), None);
        assert_eq!(RcSendOnlyWithInvalidate.with_transport(Transport::Uc), None);
        assert_eq!(
            RcSendOnlyWithInvalidate.with_transport(Transport::Xrc),
            Some(XrcSendOnlyWithInvalidate)
        );
        assert_eq!(RcFlush.with_transport(Transport::Xrc), None);
    }
}
