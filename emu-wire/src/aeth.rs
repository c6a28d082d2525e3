//! The ACK Extended Transport Header, 4 bytes (IBTA 9.3.5, 9.7.5.1): syndrome and MSN;
//! and the RNR timer table (IBTA 9.7.5.2.8, table 45).

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

/// RNR timer codes in units of 10 us (IBTA 9.7.5.2.8 table 45); code 0 is 655.36 ms.
const RNR_TIMER_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The wait an RNR NAK timer code stands for (the code is masked to 5 bits).
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
