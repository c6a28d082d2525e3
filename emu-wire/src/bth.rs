//! The Base Transport Header, 12 bytes (IBTA 9.2).

use crate::error::{Error, Result};
use crate::opcode::Opcode;
use crate::psn::Psn;

/// BTH length in bytes.
pub const HEADER_LEN: usize = 12;

/// A view of a BTH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct BthPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// Wraps a buffer without checking its length.
    pub fn new_unchecked(buffer: T) -> Self {
        BthPacket { buffer }
    }

    /// Wraps a buffer of at least [`HEADER_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(BthPacket { buffer })
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The opcode byte.
    pub fn opcode(&self) -> u8 {
        self.b()[0]
    }
    /// Solicited event (SE).
    pub fn solicited(&self) -> bool {
        self.b()[1] & 0x80 != 0
    }
    /// Migration request (M).
    pub fn mig_req(&self) -> bool {
        self.b()[1] & 0x40 != 0
    }
    /// Pad count: bytes after the payload that make it a multiple of 4.
    pub fn pad_count(&self) -> u8 {
        (self.b()[1] >> 4) & 0x3
    }
    /// Transport header version.
    pub fn tver(&self) -> u8 {
        self.b()[1] & 0xF
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        u16::from_be_bytes([self.b()[2], self.b()[3]])
    }
    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[4] & 0x80 != 0
    }
    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[4] & 0x40 != 0
    }
    /// Destination QP number.
    pub fn dest_qp(&self) -> u32 {
        u32::from_be_bytes([0, self.b()[5], self.b()[6], self.b()[7]])
    }
    /// Acknowledge request (A).
    pub fn ack_req(&self) -> bool {
        self.b()[8] & 0x80 != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(u32::from_be_bytes([
            0,
            self.b()[9],
            self.b()[10],
            self.b()[11],
        ]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    /// Sets the opcode byte.
    pub fn set_opcode(&mut self, v: u8) {
        self.m()[0] = v;
    }
    /// Sets byte 1: SE, M, pad count, and TVer 0.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8) {
        self.m()[1] =
            (u8::from(solicited) << 7) | (u8::from(mig_req) << 6) | ((pad_count & 3) << 4);
    }
    /// Sets the partition key.
    pub fn set_pkey(&mut self, v: u16) {
        self.m()[2..4].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets FECN and BECN; the reserved bits are written 0.
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.m()[4] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Sets the destination QP number (24 bits).
    pub fn set_dest_qp(&mut self, v: u32) {
        self.m()[5..8].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    /// Sets AckReq and the PSN; the reserved bits are written 0.
    pub fn set_ack_req_psn(&mut self, ack_req: bool, psn: Psn) {
        let b = psn.value().to_be_bytes();
        let m = self.m();
        m[8] = u8::from(ack_req) << 7;
        m[9..12].copy_from_slice(&b[1..]);
    }
}

/// The fields of a BTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad count (0..=3).
    pub pad_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Parses a BTH; TVer must be 0 (IBTA 9.2, C9-?), the opcode one this crate knows.
    pub fn parse<T: AsRef<[u8]>>(p: &BthPacket<T>) -> Result<BthRepr> {
        let opcode = Opcode::try_from(p.opcode())?;
        if p.tver() != 0 {
            return Err(Error::BadVersion(p.tver()));
        }
        Ok(BthRepr {
            opcode,
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// Writes the BTH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut BthPacket<T>) {
        p.set_opcode(self.opcode as u8);
        p.set_flags(self.solicited, self.mig_req, self.pad_count);
        p.set_pkey(self.pkey);
        p.set_ecn(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req_psn(self.ack_req, self.psn);
    }

    /// [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

/// Bytes of pad that make a payload of `payload_len` a multiple of 4 (IBTA 9.2).
pub const fn pad_count(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}
