//! The ACK Extended Transport Header, 4 bytes (IBTA 9.3.5): syndrome and MSN; the
//! syndrome encoding (IBTA 9.7.5.1) and the RNR NAK timer codes it carries.

use core::time::Duration;

use crate::error::{Error, Result};

/// AETH length in bytes.
pub const HEADER_LEN: usize = 4;

header_view!(
    /// A view of an AETH.
    AethPacket,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> AethPacket<T> {
    /// The syndrome byte.
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[0]
    }
    /// The message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        self.u32_at(0) & 0x00FF_FFFF
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AethPacket<T> {
    /// Sets syndrome and MSN.
    pub fn set(&mut self, syndrome: u8, msn: u32) {
        self.put_u32(0, (u32::from(syndrome) << 24) | (msn & 0x00FF_FFFF));
    }
}

/// NAK codes (IBTA 9.7.5.1, table 44).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: the requester goes back to the NAK's PSN.
    PsnSequenceError = 0,
    /// Invalid request.
    InvalidRequest = 1,
    /// Remote access error.
    RemoteAccessError = 2,
    /// Remote operational error.
    RemoteOperationalError = 3,
    /// Invalid RD request.
    InvalidRdRequest = 4,
}

/// The AETH syndrome: bit 7 reserved, bits 6-5 the type, bits 4-0 its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// ACK with a credit count (0x1F: no credit limit, what kernel rxe sends).
    Ack {
        /// 5-bit credit count.
        credits: u8,
    },
    /// Receiver not ready, with a 5-bit RNR timer code.
    RnrNak {
        /// 5-bit timer code (see [`rnr_timer_duration`]).
        timer: u8,
    },
    /// A negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// The ACK kernel rxe sends: credit count 0x1F (no limit).
    pub const ACK_NO_CREDIT: Syndrome = Syndrome::Ack { credits: 0x1F };

    /// Decodes a syndrome byte; reserved bit 7, type `10` and NAK codes above 4 are
    /// errors.
    pub fn from_u8(b: u8) -> Result<Syndrome> {
        // IBTA 9.7.5.1: bit 7 reserved (0), bits 6-5 the type, bits 4-0 its value.
        let v = b & 0x1F;
        match b >> 5 {
            0 => Ok(Syndrome::Ack { credits: v }),
            1 => Ok(Syndrome::RnrNak { timer: v }),
            3 => Ok(Syndrome::Nak(match v {
                0 => NakCode::PsnSequenceError,
                1 => NakCode::InvalidRequest,
                2 => NakCode::RemoteAccessError,
                3 => NakCode::RemoteOperationalError,
                4 => NakCode::InvalidRdRequest,
                _ => return Err(Error::BadSyndrome(b)),
            })),
            _ => Err(Error::BadSyndrome(b)),
        }
    }

    /// Encodes the syndrome byte.
    pub fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1F,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            Syndrome::Nak(code) => 0x60 | code as u8,
        }
    }
}

/// The fields of an AETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Reads an AETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AethPacket<T>) -> Result<Self> {
        p.check_len()?;
        Ok(AethRepr {
            syndrome: Syndrome::from_u8(p.syndrome())?,
            msn: p.msn(),
        })
    }
    /// Writes an AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AethPacket<T>) {
        p.set(self.syndrome.to_u8(), self.msn);
    }
    /// [`HEADER_LEN`].
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }
}

/// RNR NAK timer codes in units of 10 us (IBTA 9.7.5.1, the RNR NAK timer encoding);
/// code 0 is the longest wait, 655.36 ms.
const RNR_TIMER_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The wait an RNR NAK timer code stands for (the code is masked to 5 bits), e.g. code
/// 0 = 655.36 ms, 1 = 10 us, 14 = 1.28 ms, 31 = 491.52 ms.
pub fn rnr_timer_duration(code: u8) -> Duration {
    Duration::from_micros(u64::from(RNR_TIMER_10US[usize::from(code & 0x1F)]) * 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_round_trip_and_reserved_ones_fail() {
        for b in 0..=255u8 {
            match Syndrome::from_u8(b) {
                Ok(s) => assert_eq!(s.to_u8(), b),
                Err(e) => {
                    assert_eq!(e, Error::BadSyndrome(b));
                    assert!(b & 0x80 != 0 || b >> 5 == 2 || (b >> 5 == 3 && b & 0x1F > 4));
                }
            }
        }
        assert_eq!(
            Syndrome::from_u8(0x38).unwrap(),
            Syndrome::RnrNak { timer: 24 }
        );
        assert_eq!(
            Syndrome::from_u8(0x62).unwrap(),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(Syndrome::ACK_NO_CREDIT.to_u8(), 0x1F);
        // the NAKs kernel rxe sends (roce-wire.md)
        for (b, code) in [
            (0x60, NakCode::PsnSequenceError),
            (0x61, NakCode::InvalidRequest),
            (0x62, NakCode::RemoteAccessError),
            (0x63, NakCode::RemoteOperationalError),
            (0x64, NakCode::InvalidRdRequest),
        ] {
            assert_eq!(Syndrome::from_u8(b), Ok(Syndrome::Nak(code)));
            assert_eq!(Syndrome::Nak(code).to_u8(), b);
        }
        for t in 0..32 {
            assert_eq!(Syndrome::RnrNak { timer: t }.to_u8(), 0x20 | t);
            assert_eq!(Syndrome::Ack { credits: t }.to_u8(), t);
        }
        // type 10 is reserved; so are NAK codes 5..=31 and bit 7
        assert_eq!(Syndrome::from_u8(0x40), Err(Error::BadSyndrome(0x40)));
        assert_eq!(Syndrome::from_u8(0x65), Err(Error::BadSyndrome(0x65)));
        assert_eq!(Syndrome::from_u8(0x9F), Err(Error::BadSyndrome(0x9F)));
    }

    /// The table of roce-wire.md, in milliseconds as written there.
    const RNR_MS: [&str; 32] = [
        "655.36", "0.01", "0.02", "0.03", "0.04", "0.06", "0.08", "0.12", "0.16", "0.24", "0.32",
        "0.48", "0.64", "0.96", "1.28", "1.92", "2.56", "3.84", "5.12", "7.68", "10.24", "15.36",
        "20.48", "30.72", "40.96", "61.44", "81.92", "122.88", "163.84", "245.76", "327.68",
        "491.52",
    ];

    /// "655.36" ms -> 655_360 us, without floating point.
    fn ms_to_us(s: &str) -> u64 {
        let (int, frac) = s.split_once('.').unwrap();
        int.parse::<u64>().unwrap() * 1000 + frac.parse::<u64>().unwrap() * 10
    }

    #[test]
    fn every_rnr_code_matches_the_table() {
        for (code, ms) in RNR_MS.iter().enumerate() {
            let d = rnr_timer_duration(code as u8);
            assert_eq!(d, Duration::from_micros(ms_to_us(ms)), "code {code}");
            // bits above the 5-bit field are ignored
            assert_eq!(rnr_timer_duration(code as u8 | 0xE0), d);
        }
        // codes 1..=31 grow; 0 is the longest
        for c in 1..31u8 {
            assert!(rnr_timer_duration(c) < rnr_timer_duration(c + 1));
        }
        assert!(rnr_timer_duration(0) > rnr_timer_duration(31));
    }

    #[test]
    fn view_and_repr() {
        let b = [0x38u8, 0x00, 0x01, 0x0E];
        let p = AethPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.syndrome(), p.msn()), (0x38, 0x10E));
        let r = AethRepr::parse(&p).unwrap();
        assert_eq!(r.syndrome, Syndrome::RnrNak { timer: 24 });
        let mut out = [0u8; 4];
        r.emit(&mut AethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert_eq!(r.buffer_len(), HEADER_LEN);
        assert_eq!(
            AethPacket::new_checked(&b[..3]).unwrap_err(),
            Error::Truncated
        );
        let bad = [0x80u8, 0, 0, 0];
        assert_eq!(
            AethRepr::parse(&AethPacket::new_unchecked(&bad[..])),
            Err(Error::BadSyndrome(0x80))
        );
    }

    #[test]
    fn rnr_table_matches_roce_wire_md() {
        assert_eq!(rnr_timer_duration(0), Duration::from_micros(655_360));
        assert_eq!(rnr_timer_duration(1), Duration::from_micros(10));
        assert_eq!(rnr_timer_duration(14), Duration::from_micros(1280));
        assert_eq!(rnr_timer_duration(24), Duration::from_micros(40_960));
        assert_eq!(rnr_timer_duration(31), Duration::from_micros(491_520));
        assert_eq!(rnr_timer_duration(32 + 1), Duration::from_micros(10));
    }
}
