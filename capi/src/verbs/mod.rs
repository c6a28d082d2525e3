//! The exported verbs: every `ibv_*` function of `libibverbs.so.1` that the emulator
//! implements, plus the per-context operations the inline verbs of `verbs.h` call
//! through `ctx->ops` and `verbs_context` (post_send, post_recv, poll_cq,
//! req_notify_cq, post_srq_recv, the MW ops, query_port, query_device_ex, and XRC's
//! open_xrcd, close_xrcd, create_srq_ex, get_srq_num and open_qp).
//!
//! Each function turns its pointers into objects ([`crate::objects`]), converts the C
//! structs ([`verbs_ffi::convert`]), calls the [`Device`] verb of the context's
//! `EmuDevice` and writes the answer back. Errors are the errno libibverbs gives:
//! returned (positive) by the `int` verbs, in `errno` with NULL or -1 for the others.
//!
//! # Safety argument
//!
//! Every pointer argument is, by the libibverbs contract the caller keeps (the man
//! page of each verb), either null (refused with EINVAL where the contract allows
//! it) or valid for the access the verb documents: objects this library returned
//! and has not freed ([`crate::objects`]), attribute structs and arrays the caller
//! owns, of the documented type and length (`num_entries` for `ibv_poll_cq`,
//! `num_sge` for SGE lists, `attr_size` for the extended queries, NUL-terminated
//! strings for paths). Nothing here keeps a pointer to caller memory after returning
//! except registered memory ([`crate::memory`]).

#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;
use std::time::Duration;

use emu_core::nic::{interop::LinkOptions, EmuConfig, EmuDevice, SameHost};
use parking_lot::Mutex;
use verbs_api::{
    AccessFlags, AsyncEventType, ChannelId, Device, Error, EventElement, Gid, MemBuf, MwBind,
    MwType, PortState, QpAttrMask, QpInitAttr, QpType, ReregMrFlags, SendFlags, SrqAttrMask,
    WcStatus, WorkCompletion, WrOperation,
};
use verbs_ffi::convert;

use crate::config::{self, DeviceConfig};
use crate::memory::UserMemory;
use crate::objects::{
    free, from_ptr, into_ptr, Ah, Channel, Context, Cq, Device as Dev, Kind, Mr, Mw, Pd, Qp, Srq,
    Xrcd,
};
use crate::sys;

const EINVAL: c_int = libc::EINVAL;
const EOPNOTSUPP: c_int = libc::EOPNOTSUPP;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Says on stderr that `what` is not supported, and gives EOPNOTSUPP.
pub(crate) fn unsupported(what: &str) -> c_int {
    eprintln!("rdma-emu libibverbs: {what} is not supported by the emulator (EOPNOTSUPP)");
    EOPNOTSUPP
}

/// An error as the `int` verbs return it (and in errno too).
pub(crate) fn fail(e: &Error) -> c_int {
    let n = e.errno();
    if n == EOPNOTSUPP {
        eprintln!("rdma-emu libibverbs: not supported by the emulator: {e}");
    }
    set_errno(n);
    n
}

/// Null with errno, for the verbs that return pointers.
pub(crate) fn null<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    std::ptr::null_mut()
}

fn status(r: verbs_api::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// The context of a verb's first argument, or return `$err` from the verb.
macro_rules! ctx_or {
    ($p:expr, $err:expr) => {
        // SAFETY: module safety argument.
        match unsafe { Context::from_ptr($p) } {
            Some(c) => c,
            None => return $err,
        }
    };
}

/// The context of a data-path verb's object (posting, polling), not looked up: providers
/// run these verbs in user space with no check ([`Context::from_ptr_unchecked`]).
macro_rules! ctx_fast {
    ($p:expr, $err:expr) => {
        // SAFETY: module safety argument.
        match unsafe { Context::from_ptr_unchecked($p) } {
            Some(c) => c,
            None => return $err,
        }
    };
}

/// The object behind a pointer argument and its context, checked as the kernel checks
/// a handle ([`crate::objects::live`]), or return `$ret` from the verb, with `$e` the
/// look-up's errno (ENOENT for an unknown handle or context, EINVAL for null).
macro_rules! live_or {
    ($t:ty, $p:expr, |$e:ident| $ret:expr) => {
        // SAFETY: module safety argument.
        match unsafe { crate::objects::live::<$t>($p) } {
            Ok(x) => x,
            Err($e) => return $ret,
        }
    };
}

/// The object behind a pointer argument, or return `$err` from the verb.
macro_rules! obj_or {
    ($t:ty, $p:expr, $err:expr) => {
        // SAFETY: module safety argument.
        match unsafe { from_ptr::<_, $t>($p) } {
            Some(o) => o,
            None => return $err,
        }
    };
}

/// Writes `value` through the out pointer `p` if it is not null.
macro_rules! out {
    ($p:expr, $value:expr) => {
        if !$p.is_null() {
            // SAFETY: caller's out parameter (module safety argument).
            unsafe { $p.write($value) };
        }
    };
}

/// Copies the first `len` bytes of `value` to `p` (for extensible structs whose
/// caller tells their size).
unsafe fn write_prefix<T>(p: *mut T, value: &T, len: usize) {
    let n = len.min(std::mem::size_of::<T>());
    // SAFETY: the caller's struct has at least `len` bytes (module safety argument).
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(value).cast::<u8>(), p.cast::<u8>(), n)
    };
}

/// A query's answer for a verb that returns 0 or an errno: `value` written to the
/// caller's `p` (its first `len` bytes, as [`write_prefix`]), EINVAL for a null `p`,
/// or the query's errno.
unsafe fn answer_into<T>(value: Result<T, c_int>, p: *mut T, len: usize) -> c_int {
    match value {
        Ok(v) if !p.is_null() => {
            // SAFETY: the caller's struct has `len` bytes (module safety argument).
            unsafe { write_prefix(p, &v, len) };
            0
        }
        Ok(_) => EINVAL,
        Err(e) => e,
    }
}

/// True if `fd` is in non-blocking mode (then the event calls return EAGAIN instead
/// of waiting, as rdma-core's `read()` on the fd would).
pub(crate) fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

mod ah;
mod cq;
mod device;
mod event;
mod misc;
mod mr;
pub(crate) mod mw;
mod qp;
mod srq;
mod xrc;

pub use ah::*;
pub use cq::*;
pub(crate) use cq::{channel_id, new_cq};
use cq::{op_poll_cq, op_req_notify_cq};
pub(crate) use device::devices;
pub use device::*;
pub use event::*;
pub use misc::*;
pub use mr::*;
use mw::{op_alloc_mw, op_bind_mw, op_dealloc_mw};
pub use qp::*;
use qp::{op_post_recv, op_post_send, op_post_srq_recv, vctx_create_qp_ex};
pub(crate) use qp::{post_send_staged, qp_init_of, unwrap_qp, wrap_qp};
pub use srq::*;
use xrc::{vctx_close_xrcd, vctx_create_srq_ex, vctx_get_srq_num, vctx_open_qp, vctx_open_xrcd};
