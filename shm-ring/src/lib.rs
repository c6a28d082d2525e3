//! A single-producer single-consumer ring of variable-length packets in memory that two
//! processes share: a same-host link for rdma-emu's devices carries RoCEv2 packets
//! through one ring each way instead of UDP sockets.
//!
//! - [`Region`]: the ring's memory: a sealed memfd that a peer process maps through
//!   its `/proc/PID/fd/N` path ([`Region::create_shared`], [`Region::open_shared`]), or
//!   this process's heap ([`Region::heap`]).
//! - [`Producer::push`] appends a packet, [`Consumer::pop`] takes the next one; both
//!   are wait-free and make no system call, except the producer's wake-up of a consumer
//!   that sleeps in [`Consumer::wait`] (a futex on a word of the shared memory).
//! - [`Bell`]: a consumer of several rings (one per producer) sleeps on one futex
//!   word, its doorbell, whatever the number of rings, and learns of a new ring by
//!   one load of the bell's generation.
//!
//! The peer is not trusted: every index and length read from the shared memory is
//! checked before use, and an impossible one is [`Error::Corrupt`], never undefined
//! behaviour or a panic (proptest `garbage` writes random words into the header and the
//! data under a working pair; the ring's protocol is model-checked with loom,
//! `loom_tests`). All `unsafe` is in one module, `region`, with its safety argument;
//! Miri runs the tests over the heap region.
//!
//! ```
//! let (mut tx, mut rx) = shm_ring::pair(64 * 1024, 4096).unwrap();
//! tx.push(b"a RoCEv2 packet").unwrap();
//! let mut buf = vec![0; rx.max_len()];
//! let n = rx.pop(&mut buf).unwrap().unwrap();
//! assert_eq!(&buf[..n], b"a RoCEv2 packet");
//! assert_eq!(rx.pop(&mut buf).unwrap(), None);
//! ```

#![deny(unsafe_code)]

mod bell;
mod region;
mod ring;
mod sync;

#[cfg(all(test, loom))]
mod loom_tests;
#[cfg(all(test, not(loom)))]
mod tests;

pub use bell::Bell;
pub use region::{Region, HEADER_BYTES};
pub use ring::{pair, Consumer, Producer, Sleeper};

/// The longest packet a ring may be made for (1 MiB).
pub const MAX_LEN: usize = 1 << 20;

/// The most data words a ring may have (1 GiB of data).
pub const MAX_WORDS: usize = 1 << 27;

/// What a ring operation can fail with.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The ring has no room for the packet now.
    Full,
    /// The packet (or, for [`Consumer::pop`], the next packet) is longer than `max`.
    TooBig {
        /// Its length.
        len: usize,
        /// The most that fits.
        max: usize,
    },
    /// The other side left: the producer's packets would not be read, or the consumer
    /// has read every packet and the producer is gone.
    Closed,
    /// The ring already has a producer (or consumer).
    Busy,
    /// The shared memory holds what a well-behaved peer never writes (what, in words):
    /// the peer is broken or hostile, and this side will not use the ring again.
    Corrupt(&'static str),
    /// Bad arguments to make a ring.
    Invalid(&'static str),
    /// A system call failed (making, opening or mapping the memory).
    Io(std::io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Full => write!(f, "the ring is full"),
            Error::TooBig { len, max } => write!(f, "a {len}-byte packet does not fit {max} bytes"),
            Error::Closed => write!(f, "the other side of the ring left"),
            Error::Busy => write!(f, "the ring already has that side"),
            Error::Corrupt(what) => write!(f, "the ring's shared memory is corrupt: {what}"),
            Error::Invalid(what) => write!(f, "invalid ring: {what}"),
            Error::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}
