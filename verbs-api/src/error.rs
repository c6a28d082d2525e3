//! Errors returned by verbs.
//!
//! libibverbs reports failure through `errno` (manual 3.x "Return Value": "-1 on
//! error … errno will be set to indicate the reason for the failure"), and the
//! post verbs additionally return `bad_wr`, the first rejected work request
//! (manual 3.6.4 ibv_post_recv, 3.6.5 ibv_post_send). [`Error`] keeps that errno
//! (see [`Error::errno`]) and adds a short static explanation; [`PostError`] is
//! the Rust form of `bad_wr`.
//!
//! The Linux errno numbers live in [`errno`] so the crate does not depend on
//! `libc`.

use core::fmt;

/// Linux errno values (asm-generic/errno-base.h and asm-generic/errno.h), as
/// returned by [`Error::errno`].
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: i32 = 1;
    /// No such file or directory (no such object).
    pub const ENOENT: i32 = 2;
    /// Interrupted system call.
    pub const EINTR: i32 = 4;
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Try again (resource temporarily unavailable); same value as `EWOULDBLOCK`.
    pub const EAGAIN: i32 = 11;
    /// Out of memory (or out of a bounded resource such as queue entries).
    pub const ENOMEM: i32 = 12;
    /// Permission denied.
    pub const EACCES: i32 = 13;
    /// Bad address.
    pub const EFAULT: i32 = 14;
    /// Device or resource busy.
    pub const EBUSY: i32 = 16;
    /// File exists.
    pub const EEXIST: i32 = 17;
    /// No such device.
    pub const ENODEV: i32 = 19;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Function not implemented.
    pub const ENOSYS: i32 = 38;
    /// No data available (e.g. an empty GID table entry).
    pub const ENODATA: i32 = 61;
    /// Operation not supported on transport endpoint.
    pub const EOPNOTSUPP: i32 = 95;
    /// Address already in use.
    pub const EADDRINUSE: i32 = 98;
    /// Connection timed out.
    pub const ETIMEDOUT: i32 = 110;

    /// The symbolic name of a Linux errno value, or `None` if this table does not
    /// know it.
    #[must_use]
    pub const fn name(errno: i32) -> Option<&'static str> {
        Some(match errno {
            EPERM => "EPERM",
            ENOENT => "ENOENT",
            EINTR => "EINTR",
            EIO => "EIO",
            EAGAIN => "EAGAIN",
            ENOMEM => "ENOMEM",
            EACCES => "EACCES",
            EFAULT => "EFAULT",
            EBUSY => "EBUSY",
            EEXIST => "EEXIST",
            ENODEV => "ENODEV",
            EINVAL => "EINVAL",
            ENOSYS => "ENOSYS",
            ENODATA => "ENODATA",
            EOPNOTSUPP => "EOPNOTSUPP",
            EADDRINUSE => "EADDRINUSE",
            ETIMEDOUT => "ETIMEDOUT",
            _ => return None,
        })
    }
}

/// The error of a verb: the errno libibverbs would set, plus a short reason.
///
/// Each variant names the errno it maps to; [`Error::errno`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// `EINVAL`: an argument, attribute or attribute mask is invalid
    /// (e.g. an illegal ibv_modify_qp transition, manual 3.5.1).
    InvalidArgument(&'static str),
    /// `ENOMEM`: out of memory or of a bounded resource (a full send or receive
    /// queue, `max_qp` reached, …).
    NoMemory(&'static str),
    /// `EBUSY`: the object is still in use (e.g. a PD that still has MRs).
    Busy(&'static str),
    /// `EPERM`: the operation is not permitted.
    PermissionDenied(&'static str),
    /// `EOPNOTSUPP`: the device does not support the operation.
    Unsupported(&'static str),
    /// `ENOENT`: no such object (GID index, P_Key index, …).
    NotFound(&'static str),
    /// `EAGAIN`: nothing available right now (e.g. no async event pending on a
    /// non-blocking context); try again later.
    WouldBlock,
    /// `ETIMEDOUT`: a wait timed out.
    TimedOut,
    /// `ENODEV`: no device with this name (manual 3.2.5 ibv_open_device).
    NoDevice(String),
    /// `EADDRINUSE`: the address and UDP port a device was to open are held by a socket
    /// that does not share them (another program, or a device that keeps its address to
    /// itself). Boxed: it is rare, and every `Result` of a verb carries this enum.
    AddressInUse(Box<TakenAddress>),
    /// Any other errno, as reported by the operating system or a kernel driver.
    Os {
        /// The errno value.
        errno: i32,
        /// What was being done when it was reported.
        context: &'static str,
    },
}

/// An address and port held by another socket ([`Error::AddressInUse`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakenAddress {
    /// The address and port.
    pub address: std::net::SocketAddr,
    /// Who holds them, when that can be told: `process PID (COMMAND)`.
    pub holder: Option<String>,
}

impl Error {
    /// The Linux errno value libibverbs would leave in `errno` for this error.
    #[must_use]
    pub const fn errno(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => errno::EINVAL,
            Error::NoMemory(_) => errno::ENOMEM,
            Error::Busy(_) => errno::EBUSY,
            Error::PermissionDenied(_) => errno::EPERM,
            Error::Unsupported(_) => errno::EOPNOTSUPP,
            Error::NotFound(_) => errno::ENOENT,
            Error::WouldBlock => errno::EAGAIN,
            Error::TimedOut => errno::ETIMEDOUT,
            Error::NoDevice(_) => errno::ENODEV,
            Error::AddressInUse(_) => errno::EADDRINUSE,
            Error::Os { errno, .. } => *errno,
        }
    }

    /// Builds the variant that corresponds to `errno`, using `context` as its
    /// explanation (`NoDevice` gets `context` as the device name).
    #[must_use]
    pub fn from_errno(errno: i32, context: &'static str) -> Self {
        match errno {
            errno::EINVAL => Error::InvalidArgument(context),
            errno::ENOMEM => Error::NoMemory(context),
            errno::EBUSY => Error::Busy(context),
            errno::EPERM => Error::PermissionDenied(context),
            errno::EOPNOTSUPP => Error::Unsupported(context),
            errno::ENOENT => Error::NotFound(context),
            errno::EAGAIN => Error::WouldBlock,
            errno::ETIMEDOUT => Error::TimedOut,
            errno::ENODEV => Error::NoDevice(context.to_owned()),
            errno => Error::Os { errno, context },
        }
    }
}

impl fmt::Display for Error {
    /// `"<ERRNO NAME>: <reason>"`, e.g. `"EINVAL: QP is not ready to send"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.errno();
        match errno::name(e) {
            Some(name) => write!(f, "{name}: ")?,
            None => write!(f, "errno {e}: ")?,
        }
        match self {
            Error::InvalidArgument(s)
            | Error::NoMemory(s)
            | Error::Busy(s)
            | Error::PermissionDenied(s)
            | Error::Unsupported(s)
            | Error::NotFound(s) => f.write_str(s),
            Error::WouldBlock => f.write_str("resource temporarily unavailable"),
            Error::TimedOut => f.write_str("timed out"),
            Error::NoDevice(name) => write!(f, "no such device: {name}"),
            Error::AddressInUse(t) => {
                write!(f, "{} is already taken", t.address)?;
                if let Some(h) = &t.holder {
                    write!(f, " by {h}")?;
                }
                f.write_str(", which does not share it: use another address or port")
            }
            Error::Os { context, .. } => f.write_str(context),
        }
    }
}

impl std::error::Error for Error {}

/// The result type of verbs.
pub type Result<T> = core::result::Result<T, Error>;

/// The failure of a post verb: which work request was rejected, and why.
///
/// `index` is the position, in the slice passed to the post call, of the first
/// rejected WR — libibverbs' `bad_wr` (manual 3.6.4 ibv_post_recv, 3.6.5
/// ibv_post_send: "Processing of the WR list is stopped on the first error").
/// The WRs before `index` were posted; `index` and those after it were not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostError {
    /// Index of the first rejected work request (libibverbs' `bad_wr`).
    pub index: usize,
    /// Why it was rejected.
    pub error: Error,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "work request {} rejected: {}", self.index, self.error)
    }
}

impl std::error::Error for PostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// A number that is not a valid value of a libibverbs enum (the `Error` of the
/// `TryFrom<u32>` conversions in this crate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnknownValue {
    /// The C name of the enum, e.g. `"ibv_wc_status"`.
    pub type_name: &'static str,
    /// The rejected value.
    pub value: u32,
}

impl fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is not a valid {} value", self.value, self.type_name)
    }
}

impl std::error::Error for UnknownValue {}

impl From<UnknownValue> for Error {
    fn from(_: UnknownValue) -> Self {
        Error::InvalidArgument("value out of range for a verbs enum")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_values_are_linux() {
        assert_eq!(Error::InvalidArgument("x").errno(), 22);
        assert_eq!(Error::NoMemory("x").errno(), 12);
        assert_eq!(Error::Busy("x").errno(), 16);
        assert_eq!(Error::PermissionDenied("x").errno(), 1);
        assert_eq!(Error::Unsupported("x").errno(), 95);
        assert_eq!(Error::NotFound("x").errno(), 2);
        assert_eq!(Error::WouldBlock.errno(), 11);
        assert_eq!(Error::TimedOut.errno(), 110);
        assert_eq!(Error::NoDevice("rxe0".into()).errno(), 19);
        let taken = Error::AddressInUse(Box::new(TakenAddress {
            address: "127.0.0.1:4791".parse().unwrap(),
            holder: Some("process 7 (nc)".into()),
        }));
        assert_eq!(std::mem::size_of::<Error>(), 32, "small enough to return");
        assert_eq!(taken.errno(), 98);
        assert_eq!(
            taken.to_string(),
            "EADDRINUSE: 127.0.0.1:4791 is already taken by process 7 (nc), which does not \
             share it: use another address or port"
        );
        assert_eq!(
            Error::Os {
                errno: 5,
                context: "read"
            }
            .errno(),
            5
        );
    }

    #[test]
    fn from_errno_round_trips() {
        for e in [1, 2, 11, 12, 16, 19, 22, 95, 110, 5, 4242] {
            assert_eq!(Error::from_errno(e, "ctx").errno(), e);
        }
        assert_eq!(Error::from_errno(22, "bad"), Error::InvalidArgument("bad"));
        assert_eq!(
            Error::from_errno(5, "io"),
            Error::Os {
                errno: 5,
                context: "io"
            }
        );
    }

    #[test]
    fn display_names_the_errno() {
        assert_eq!(
            Error::InvalidArgument("no such CQ").to_string(),
            "EINVAL: no such CQ"
        );
        assert_eq!(
            Error::NoMemory("send queue is full").to_string(),
            "ENOMEM: send queue is full"
        );
        assert_eq!(Error::Unsupported("MW").to_string(), "EOPNOTSUPP: MW");
        assert_eq!(
            Error::WouldBlock.to_string(),
            "EAGAIN: resource temporarily unavailable"
        );
        assert_eq!(Error::TimedOut.to_string(), "ETIMEDOUT: timed out");
        assert_eq!(
            Error::NoDevice("mlx5_0".into()).to_string(),
            "ENODEV: no such device: mlx5_0"
        );
        assert_eq!(
            Error::Os {
                errno: 5,
                context: "read"
            }
            .to_string(),
            "EIO: read"
        );
        assert_eq!(
            Error::Os {
                errno: 4242,
                context: "x"
            }
            .to_string(),
            "errno 4242: x"
        );
    }

    #[test]
    fn post_error_reports_index_and_source() {
        let e = PostError {
            index: 2,
            error: Error::NoMemory("receive queue is full"),
        };
        assert_eq!(
            e.to_string(),
            "work request 2 rejected: ENOMEM: receive queue is full"
        );
        let src = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(src.as_deref(), Some("ENOMEM: receive queue is full"));
    }

    #[test]
    fn unknown_value_converts_to_einval() {
        let u = UnknownValue {
            type_name: "ibv_mtu",
            value: 9,
        };
        assert_eq!(u.to_string(), "9 is not a valid ibv_mtu value");
        assert_eq!(Error::from(u).errno(), errno::EINVAL);
    }
}
