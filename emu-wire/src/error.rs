//! Parse errors.

use core::fmt;

/// Why bytes are not a RoCEv2 packet this crate accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Shorter than the headers the opcode needs (or than the ICRC).
    Truncated,
    /// An opcode outside the RC, UC and UD tables this crate implements.
    UnknownOpcode(u8),
    /// BTH transport header version is not 0 (IBTA 9.2); also an IP version that does
    /// not match its EtherType ([`crate::frame`]) or GRH layout ([`crate::grh`]).
    BadVersion(u8),
    /// The pad count exceeds the payload, or is set on an opcode without payload.
    BadPadding,
    /// A reserved AETH syndrome (IBTA 9.7.5.1).
    BadSyndrome(u8),
    /// More bytes than a packet of this opcode may carry (e.g. payload on an ACK); for
    /// frames, IP/UDP lengths larger than the frame, IPv4 options, or a protocol that is
    /// not UDP over IPv4/IPv6.
    BadLength,
}

/// A result with [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => write!(f, "packet truncated"),
            Error::UnknownOpcode(o) => write!(f, "unknown or unsupported opcode {o:#04x}"),
            Error::BadVersion(v) => write!(f, "unsupported header version {v}"),
            Error::BadPadding => write!(f, "pad count larger than the payload"),
            Error::BadSyndrome(s) => write!(f, "reserved AETH syndrome {s:#04x}"),
            Error::BadLength => write!(f, "length or layout not allowed here"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_a_std_error_with_a_message() {
        let e: Box<dyn std::error::Error> = Box::new(Error::UnknownOpcode(0x81));
        assert_eq!(e.to_string(), "unknown or unsupported opcode 0x81");
        for e in [
            Error::Truncated,
            Error::BadVersion(1),
            Error::BadPadding,
            Error::BadSyndrome(0x40),
            Error::BadLength,
        ] {
            assert!(!e.to_string().is_empty());
        }
    }
}
