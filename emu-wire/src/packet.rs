//! A whole RoCEv2 UDP payload: BTH, the extended headers its opcode carries in IBTA
//! order (DETH, XRCETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH), payload, pad to a
//! multiple of 4, and the 4-byte ICRC (IBTA 9.2, Annex A17.4).

use crate::aeth::{AethPacket, AethRepr, Syndrome};
use crate::atomic::{AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr};
use crate::bth::{self, BthPacket, BthRepr};
use crate::deth::{DethPacket, DethRepr};
use crate::error::{Error, Result};
use crate::feth::{FethPacket, FethRepr};
use crate::imm::{IethPacket, ImmDtPacket};
use crate::opcode::Opcode;
use crate::psn::Psn;
use crate::reth::{RethPacket, RethRepr};
use crate::xrceth::{XrcEthPacket, XrcEthRepr};

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
    /// XRC requests only (XRC annex): the XRC SRQ at the target.
    pub xrceth: Option<XrcEthRepr>,
    /// FLUSH only (IBTA 1.5).
    pub feth: Option<FethRepr>,
    /// WRITE FIRST/ONLY, READ request, FLUSH, ATOMIC WRITE.
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
    /// A packet of `opcode` with P_Key 0xFFFF (the default partition), every flag clear,
    /// and every header the opcode needs present with zero fields, except an AETH,
    /// which is the plain ACK kernel rxe sends ([`Syndrome::ACK_NO_CREDIT`], MSN 0).
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
            xrceth: opcode.has_xrceth().then(XrcEthRepr::default),
            feth: opcode.has_feth().then(FethRepr::default),
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
    ///
    /// Which extended headers are read is decided by the opcode. Errors:
    /// [`Error::Truncated`] (shorter than the opcode's headers plus the ICRC),
    /// [`Error::UnknownOpcode`], [`Error::BadVersion`] (TVer not 0),
    /// [`Error::BadSyndrome`] (a reserved AETH syndrome), [`Error::BadLength`] (payload
    /// on an opcode that carries none), [`Error::BadPadding`] (pad count larger than
    /// the payload). Never panics.
    pub fn parse(udp_payload: &[u8]) -> Result<(PacketRepr, &[u8])> {
        let b = udp_payload;
        // IBTA 9.2 BTH: opcode and TVer decide everything that follows.
        let bth = BthRepr::parse(&BthPacket::new_checked(b)?)?;
        let op = bth.opcode;
        // IBTA 9.2.1 table 38: the opcode alone decides which extended headers follow.
        let hlen = op.header_len();
        // Annex A17.4: every RoCEv2 packet ends with a 4-byte ICRC.
        if b.len() < hlen + ICRC_LEN {
            return Err(Error::Truncated);
        }
        // IBTA 9.3: extended headers in the order DETH, XRCETH (XRC annex), FETH
        // (IBTA 1.5), RETH,
        // AtomicETH, AETH, AtomicAckETH, ImmDt, IETH. The length check above makes every
        // slice fit.
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
        let xrceth = if op.has_xrceth() {
            Some(XrcEthRepr::parse(&XrcEthPacket::new_unchecked(next(4)))?)
        } else {
            None
        };
        let feth = if op.has_feth() {
            Some(FethRepr::parse(&FethPacket::new_unchecked(next(4)))?)
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
        // IBTA 9.2.1 table 38: READ REQUEST, atomics and ACKs carry no payload.
        if !op.has_payload() && !body.is_empty() {
            return Err(Error::BadLength);
        }
        // IBTA 9.2 PadCnt: the pad bytes are the last ones before the ICRC.
        let pad = usize::from(bth.pad_count);
        if pad > body.len() {
            return Err(Error::BadPadding);
        }
        let repr = PacketRepr {
            bth,
            deth,
            xrceth,
            feth,
            reth,
            atomic_eth,
            aeth,
            atomic_ack_eth,
            imm_dt,
            ieth,
        };
        Ok((repr, &body[..body.len() - pad]))
    }

    /// The first extended header the opcode carries but this repr lacks, by name.
    fn missing_header(&self) -> Option<&'static str> {
        let op = self.bth.opcode;
        [
            (op.has_deth() && self.deth.is_none(), "DETH"),
            (op.has_xrceth() && self.xrceth.is_none(), "XRCETH"),
            (op.has_feth() && self.feth.is_none(), "FETH"),
            (op.has_reth() && self.reth.is_none(), "RETH"),
            (
                op.has_atomic_eth() && self.atomic_eth.is_none(),
                "AtomicETH",
            ),
            (op.has_aeth() && self.aeth.is_none(), "AETH"),
            (
                op.has_atomic_ack_eth() && self.atomic_ack_eth.is_none(),
                "AtomicAckETH",
            ),
            (op.has_immediate() && self.imm_dt.is_none(), "ImmDt"),
            (op.has_invalidate() && self.ieth.is_none(), "IETH"),
        ]
        .into_iter()
        .find_map(|(missing, name)| missing.then_some(name))
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

    /// Writes the headers into `buf[..header_len()]` and returns `header_len()`. Headers
    /// the opcode does not carry are ignored. A header the opcode carries but that is
    /// `None` is a caller bug: a debug assertion in debug builds; in release builds it
    /// is written as zeros (an AETH as a plain ACK, syndrome 0x1F). The BTH's pad count
    /// is written as it is in `bth`.
    ///
    /// # Panics
    /// If `buf` is shorter than [`header_len`](Self::header_len) (as smoltcp's `emit`).
    pub fn emit_headers(&self, buf: &mut [u8]) -> usize {
        let op = self.bth.opcode;
        debug_assert!(
            self.missing_header().is_none(),
            "{op} needs a {} header",
            self.missing_header().unwrap_or("")
        );
        // IBTA 9.2 BTH, then the extended headers of IBTA 9.3 in their order.
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
        if op.has_xrceth() {
            self.xrceth
                .unwrap_or_default()
                .emit(&mut XrcEthPacket::new_unchecked(&mut buf[next(4)]));
        }
        if op.has_feth() {
            self.feth
                .unwrap_or_default()
                .emit(&mut FethPacket::new_unchecked(&mut buf[next(4)]));
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
    /// zero ICRC slot (fill it with [`crate::write_icrc`]); returns the length written,
    /// [`buffer_len`](Self::buffer_len)`(payload.len())`.
    ///
    /// # Panics
    /// If `buf` is shorter than that.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opcode::Opcode::*;

    #[test]
    fn new_fills_exactly_the_headers_of_the_opcode() {
        for op in Opcode::ALL {
            let r = PacketRepr::new(op, 0x12, Psn::new(3));
            assert_eq!(r.missing_header(), None, "{op}");
            assert_eq!(r.deth.is_some(), op.has_deth());
            assert_eq!(r.xrceth.is_some(), op.has_xrceth());
            assert_eq!(r.feth.is_some(), op.has_feth());
            assert_eq!(r.reth.is_some(), op.has_reth());
            assert_eq!(r.atomic_eth.is_some(), op.has_atomic_eth());
            assert_eq!(r.aeth.is_some(), op.has_aeth());
            assert_eq!(r.atomic_ack_eth.is_some(), op.has_atomic_ack_eth());
            assert_eq!(r.imm_dt.is_some(), op.has_immediate());
            assert_eq!(r.ieth.is_some(), op.has_invalidate());
            assert_eq!(r.bth.pkey, 0xFFFF);
            assert_eq!(r.header_len(), op.header_len());
            assert_eq!(r.buffer_len(5), op.header_len() + 5 + 3 + ICRC_LEN);
        }
    }

    #[test]
    fn emit_layout_of_a_write_only_with_immediate() {
        let mut r = PacketRepr::new(RcRdmaWriteOnlyWithImmediate, 0x11, Psn::new(0x10203));
        r.reth = Some(RethRepr {
            va: 0x0102_0304_0506_0708,
            rkey: 0x0A0B_0C0D,
            dma_len: 3,
        });
        r.imm_dt = Some(0xCAFE_F00D);
        let mut buf = [0xEEu8; 64];
        let n = r.emit(&mut buf, b"abc");
        assert_eq!(n, 12 + 16 + 4 + 3 + 1 + 4);
        assert_eq!(buf[0], 0x0B);
        assert_eq!(buf[1], 0x10); // pad count 1
        assert_eq!(&buf[12..20], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&buf[20..28], &[0x0A, 0x0B, 0x0C, 0x0D, 0, 0, 0, 3]);
        assert_eq!(&buf[28..32], &[0xCA, 0xFE, 0xF0, 0x0D]);
        assert_eq!(&buf[32..35], b"abc");
        assert_eq!(&buf[35..40], &[0; 5]); // pad and ICRC slot
        let (back, payload) = PacketRepr::parse(&buf[..n]).unwrap();
        assert_eq!(payload, b"abc");
        assert_eq!(back.bth.pad_count, 1);
        assert_eq!((back.reth, back.imm_dt), (r.reth, r.imm_dt));
    }

    #[test]
    fn parse_errors() {
        let mut buf = [0u8; 64];
        let ack = PacketRepr::new(RcAcknowledge, 1, Psn::new(1));
        let n = ack.emit(&mut buf, &[]);
        assert_eq!(n, 12 + 4 + 4);
        assert!(PacketRepr::parse(&buf[..n]).is_ok());
        for k in 0..n {
            assert_eq!(PacketRepr::parse(&buf[..k]).unwrap_err(), Error::Truncated);
        }
        // payload on an ACK
        assert_eq!(
            PacketRepr::parse(&buf[..n + 4]).unwrap_err(),
            Error::BadLength
        );
        // a pad count on a packet without payload
        let mut b = buf;
        b[1] |= 0x30;
        assert_eq!(PacketRepr::parse(&b[..n]).unwrap_err(), Error::BadPadding);
        // a reserved syndrome
        let mut b = buf;
        b[12] = 0x40;
        assert_eq!(
            PacketRepr::parse(&b[..n]).unwrap_err(),
            Error::BadSyndrome(0x40)
        );
        // TVer
        let mut b = buf;
        b[1] |= 0x02;
        assert_eq!(
            PacketRepr::parse(&b[..n]).unwrap_err(),
            Error::BadVersion(2)
        );
        // RESYNC, CNP: not supported
        for op in [0x15, 0x81] {
            let mut b = buf;
            b[0] = op;
            assert_eq!(
                PacketRepr::parse(&b[..n]).unwrap_err(),
                Error::UnknownOpcode(op)
            );
        }
        // SEND ONLY with two bytes and pad count 3
        let send = PacketRepr::new(RcSendOnly, 1, Psn::new(1));
        let n = send.emit(&mut buf, &[1, 2]);
        assert_eq!(n, 12 + 2 + 2 + 4);
        buf[1] = 0x30;
        assert_eq!(PacketRepr::parse(&buf[..n]).unwrap().1, &[1][..]);
        let n = send.emit(&mut buf, &[]);
        buf[1] = 0x10;
        assert_eq!(PacketRepr::parse(&buf[..n]).unwrap_err(), Error::BadPadding);
    }

    #[test]
    fn flush_and_atomic_write_layouts() {
        // FLUSH: BTH, FETH, RETH, no payload (IBTA 1.5; kernel rxe 6.12's order).
        let mut r = PacketRepr::new(RcFlush, 0x18, Psn::new(0x400));
        r.feth = Some(crate::FethRepr {
            placement_type: crate::feth::PLACEMENT_GLOBAL,
            selectivity_level: crate::feth::SELECTIVITY_MR,
        });
        r.reth = Some(RethRepr {
            va: 0x1122_3344_5566_7788,
            rkey: 0x99,
            dma_len: 64,
        });
        let mut buf = [0u8; 64];
        let n = r.emit(&mut buf, &[]);
        assert_eq!(n, 12 + 4 + 16 + 4);
        assert_eq!(&buf[12..16], &[0, 0, 0, 0x11]);
        assert_eq!(&buf[16..24], &0x1122_3344_5566_7788u64.to_be_bytes());
        let (back, payload) = PacketRepr::parse(&buf[..n]).unwrap();
        assert_eq!((back, payload), (r, &[][..]));
        // payload on a FLUSH is refused
        let n2 = r.emit(&mut buf, &[1, 2, 3, 4]);
        assert_eq!(PacketRepr::parse(&buf[..n2]).unwrap_err(), Error::BadLength);
        // ATOMIC WRITE: BTH, RETH, 8 bytes of payload.
        let mut w = PacketRepr::new(RcAtomicWrite, 0x17, Psn::new(0x200));
        w.reth = Some(RethRepr {
            va: 0x7f00_0000_1040,
            rkey: 0x22a,
            dma_len: 8,
        });
        let n = w.emit(&mut buf, &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(n, 12 + 16 + 8 + 4);
        let (back, payload) = PacketRepr::parse(&buf[..n]).unwrap();
        assert_eq!((back, payload), (w, &[1, 2, 3, 4, 5, 6, 7, 8][..]));
    }

    /// XRC frames written out byte by byte from the XRC annex (BTH, then XRCETH: 8
    /// reserved bits and the 24-bit XRC SRQ number, then the other extended headers),
    /// checked against what `emit` writes and `parse` reads. The ICRC is computed as for
    /// RC (it does not look at the opcode); the slot is left zero here.
    #[test]
    fn xrc_golden_bytes() {
        // XRC SEND ONLY with immediate, to QPN 0x000123, PSN 0x000045, AckReq, XRC SRQ
        // 0x00ABCD, ImmDt 0x11223344, payload "hi" (2 bytes, pad 2).
        let mut r = PacketRepr::new(XrcSendOnlyWithImmediate, 0x123, Psn::new(0x45));
        r.bth.ack_req = true;
        r.xrceth = Some(XrcEthRepr { xrc_srqn: 0xABCD });
        r.imm_dt = Some(0x1122_3344);
        let mut buf = [0xEEu8; 64];
        let n = r.emit(&mut buf, b"hi");
        #[rustfmt::skip]
        let want: [u8; 28] = [
            // BTH: opcode 0xA5; SE 0 M 0 PadCnt 2 TVer 0; P_Key 0xFFFF
            0xA5, 0x20, 0xFF, 0xFF,
            // reserved byte, DestQP 0x000123
            0x00, 0x00, 0x01, 0x23,
            // AckReq 1, reserved 7 bits, PSN 0x000045
            0x80, 0x00, 0x00, 0x45,
            // XRCETH: reserved byte, XRC SRQ 0x00ABCD
            0x00, 0x00, 0xAB, 0xCD,
            // ImmDt
            0x11, 0x22, 0x33, 0x44,
            // payload, 2 pad bytes
            b'h', b'i', 0x00, 0x00,
            // ICRC slot
            0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(&buf[..n], &want[..]);
        let (back, payload) = PacketRepr::parse(&buf[..n]).unwrap();
        r.bth.pad_count = 2;
        assert_eq!((back, payload), (r, &b"hi"[..]));

        // XRC RDMA READ REQUEST: BTH, XRCETH, RETH.
        let mut r = PacketRepr::new(XrcRdmaReadRequest, 0xFF_FFFE, Psn::new(0xFF_FFFF));
        r.xrceth = Some(XrcEthRepr {
            xrc_srqn: 0xFF_0001,
        });
        r.reth = Some(RethRepr {
            va: 0x0000_7F00_DEAD_BEEF,
            rkey: 0x0000_1234,
            dma_len: 0x1000,
        });
        let n = r.emit(&mut buf, &[]);
        #[rustfmt::skip]
        let want: [u8; 36] = [
            0xAC, 0x00, 0xFF, 0xFF,
            0x00, 0xFF, 0xFF, 0xFE,
            0x00, 0xFF, 0xFF, 0xFF,
            // XRCETH
            0x00, 0xFF, 0x00, 0x01,
            // RETH: VA, R_Key, DMA length
            0x00, 0x00, 0x7F, 0x00, 0xDE, 0xAD, 0xBE, 0xEF,
            0x00, 0x00, 0x12, 0x34,
            0x00, 0x00, 0x10, 0x00,
            0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(&buf[..n], &want[..]);
        assert_eq!(PacketRepr::parse(&buf[..n]).unwrap(), (r, &[][..]));

        // XRC ACKNOWLEDGE: a response, no XRCETH (BTH, AETH).
        let ack = PacketRepr::new(XrcAcknowledge, 0x42, Psn::new(7));
        assert_eq!(ack.xrceth, None);
        let n = ack.emit(&mut buf, &[]);
        #[rustfmt::skip]
        let want: [u8; 20] = [
            0xB1, 0x00, 0xFF, 0xFF,
            0x00, 0x00, 0x00, 0x42,
            0x00, 0x00, 0x00, 0x07,
            // AETH: syndrome 0x1F (ACK, no credit), MSN 0
            0x1F, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00,
        ];
        assert_eq!(&buf[..n], &want[..]);

        // A truncated XRCETH is refused.
        let n = PacketRepr::new(XrcSendOnly, 1, Psn::new(1)).emit(&mut buf, &[]);
        assert_eq!(n, 12 + 4 + 4);
        assert_eq!(
            PacketRepr::parse(&buf[..n - 1]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "needs a RETH header")]
    fn emitting_without_a_needed_header_is_a_debug_assertion() {
        let mut r = PacketRepr::new(RcRdmaWriteFirst, 1, Psn::new(1));
        r.reth = None;
        let mut buf = [0u8; 64];
        r.emit_headers(&mut buf);
    }
}
