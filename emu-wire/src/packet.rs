//! A whole RoCEv2 UDP payload: BTH, the extended headers its opcode carries in IBTA
//! order (DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH), payload, pad to a
//! multiple of 4, and the 4-byte ICRC (IBTA 9.2, Annex A17.4).

use crate::aeth::{AethPacket, AethRepr, Syndrome};
use crate::atomic::{AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr};
use crate::bth::{self, BthPacket, BthRepr};
use crate::deth::{DethPacket, DethRepr};
use crate::error::{Error, Result};
use crate::imm::{IethPacket, ImmDtPacket};
use crate::opcode::Opcode;
use crate::psn::Psn;
use crate::reth::{RethPacket, RethRepr};

/// ICRC length in bytes.
pub const ICRC_LEN: usize = 4;

/// The headers of one packet. Which extended headers are present is decided by the
/// opcode: `parse` fills exactly those, `emit_headers` writes exactly those.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// UD only.
    pub deth: Option<DethRepr>,
    /// WRITE FIRST/ONLY, READ request.
    pub reth: Option<RethRepr>,
    /// COMPARE_SWAP, FETCH_ADD.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// ACKs and READ response FIRST/LAST/ONLY.
    pub aeth: Option<AethRepr>,
    /// ATOMIC ACKNOWLEDGE.
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// Immediate data.
    pub imm_dt: Option<u32>,
    /// R_Key to invalidate.
    pub ieth: Option<u32>,
}

impl PacketRepr {
    /// A packet of `opcode` with P_Key 0xFFFF and every header the opcode needs present
    /// with zero fields (an AETH is a plain ACK).
    pub fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> PacketRepr {
        PacketRepr {
            bth: BthRepr {
                opcode,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp,
                ack_req: false,
                psn,
            },
            deth: opcode.has_deth().then(DethRepr::default),
            reth: opcode.has_reth().then(RethRepr::default),
            atomic_eth: opcode.has_atomic_eth().then(AtomicEthRepr::default),
            aeth: opcode.has_aeth().then_some(AethRepr {
                syndrome: Syndrome::ACK_NO_CREDIT,
                msn: 0,
            }),
            atomic_ack_eth: opcode.has_atomic_ack_eth().then(AtomicAckEthRepr::default),
            imm_dt: opcode.has_immediate().then_some(0),
            ieth: opcode.has_invalidate().then_some(0),
        }
    }

    /// Parses a UDP payload (BTH through ICRC) into the headers and the payload (pad
    /// and ICRC excluded). The ICRC is not checked here (see [`crate::icrc`]).
    pub fn parse(udp_payload: &[u8]) -> Result<(PacketRepr, &[u8])> {
        let b = udp_payload;
        let bth = BthRepr::parse(&BthPacket::new_checked(b)?)?;
        let op = bth.opcode;
        let hlen = op.header_len();
        if b.len() < hlen + ICRC_LEN {
            return Err(Error::Truncated);
        }
        let mut at = bth::HEADER_LEN;
        let mut next = |n: usize| {
            let s = &b[at..at + n];
            at += n;
            s
        };
        let deth = if op.has_deth() {
            Some(DethRepr::parse(&DethPacket::new_unchecked(next(8)))?)
        } else {
            None
        };
        let reth = if op.has_reth() {
            Some(RethRepr::parse(&RethPacket::new_unchecked(next(16)))?)
        } else {
            None
        };
        let atomic_eth = if op.has_atomic_eth() {
            Some(AtomicEthRepr::parse(&AtomicEthPacket::new_unchecked(
                next(28),
            ))?)
        } else {
            None
        };
        let aeth = if op.has_aeth() {
            Some(AethRepr::parse(&AethPacket::new_unchecked(next(4)))?)
        } else {
            None
        };
        let atomic_ack_eth = if op.has_atomic_ack_eth() {
            Some(AtomicAckEthRepr::parse(
                &AtomicAckEthPacket::new_unchecked(next(8)),
            )?)
        } else {
            None
        };
        let imm_dt = if op.has_immediate() {
            Some(ImmDtPacket::new_unchecked(next(4)).imm_data())
        } else {
            None
        };
        let ieth = if op.has_invalidate() {
            Some(IethPacket::new_unchecked(next(4)).rkey())
        } else {
            None
        };
        let body = &b[hlen..b.len() - ICRC_LEN];
        if !op.has_payload() && !body.is_empty() {
            return Err(Error::BadLength);
        }
        let pad = usize::from(bth.pad_count);
        if pad > body.len() {
            return Err(Error::BadPadding);
        }
        let repr = PacketRepr {
            bth,
            deth,
            reth,
            atomic_eth,
            aeth,
            atomic_ack_eth,
            imm_dt,
            ieth,
        };
        Ok((repr, &body[..body.len() - pad]))
    }

    /// BTH plus the extended headers.
    pub fn header_len(&self) -> usize {
        self.bth.opcode.header_len()
    }

    /// The whole UDP payload for `payload_len` bytes of payload: headers, payload, pad,
    /// ICRC.
    pub fn buffer_len(&self, payload_len: usize) -> usize {
        self.header_len() + payload_len + usize::from(bth::pad_count(payload_len)) + ICRC_LEN
    }

    /// Writes the headers into `buf[..header_len()]` and returns `header_len()`. A header
    /// the opcode carries but that is `None` is written as zeros; headers the opcode
    /// does not carry are ignored. The BTH's pad count is written as it is in `bth`.
    pub fn emit_headers(&self, buf: &mut [u8]) -> usize {
        let op = self.bth.opcode;
        self.bth
            .emit(&mut BthPacket::new_unchecked(&mut buf[..bth::HEADER_LEN]));
        let mut at = bth::HEADER_LEN;
        let mut next = |n: usize| {
            let s = at;
            at += n;
            s..at
        };
        if op.has_deth() {
            self.deth
                .unwrap_or_default()
                .emit(&mut DethPacket::new_unchecked(&mut buf[next(8)]));
        }
        if op.has_reth() {
            self.reth
                .unwrap_or_default()
                .emit(&mut RethPacket::new_unchecked(&mut buf[next(16)]));
        }
        if op.has_atomic_eth() {
            self.atomic_eth
                .unwrap_or_default()
                .emit(&mut AtomicEthPacket::new_unchecked(&mut buf[next(28)]));
        }
        if op.has_aeth() {
            let aeth = self.aeth.unwrap_or(AethRepr {
                syndrome: Syndrome::ACK_NO_CREDIT,
                msn: 0,
            });
            aeth.emit(&mut AethPacket::new_unchecked(&mut buf[next(4)]));
        }
        if op.has_atomic_ack_eth() {
            self.atomic_ack_eth
                .unwrap_or_default()
                .emit(&mut AtomicAckEthPacket::new_unchecked(&mut buf[next(8)]));
        }
        if op.has_immediate() {
            ImmDtPacket::new_unchecked(&mut buf[next(4)]).set_imm_data(self.imm_dt.unwrap_or(0));
        }
        if op.has_invalidate() {
            IethPacket::new_unchecked(&mut buf[next(4)]).set_rkey(self.ieth.unwrap_or(0));
        }
        at
    }

    /// Writes headers (with the pad count for `payload`), the payload, zero pad and a
    /// zero ICRC slot; returns the length written.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> usize {
        let mut repr = *self;
        repr.bth.pad_count = bth::pad_count(payload.len());
        let h = repr.emit_headers(buf);
        let end = h + payload.len();
        buf[h..end].copy_from_slice(payload);
        let total = end + usize::from(repr.bth.pad_count) + ICRC_LEN;
        buf[end..total].fill(0);
        total
    }
}
