//! The cases, one module per area (the categories of rdma-core's `tests/` and
//! google/rdma-unit-test). Each module's `register` appends its cases.

use crate::Case;

mod adapter;
mod bounds;
mod cm;
mod cq;
mod cq_more;
mod cross_pd;
mod data;
mod device;
mod errors;
mod flush_atomic_write;
mod lifetimes;
mod limits;
mod mw;
mod mw_more;
mod pd_mr;
mod peer_state;
mod ports;
mod post_state;
mod qp_create;
mod qp_state;
mod rq_limits;
mod srq;
mod threads;
pub mod traffic;
mod ud;
mod ud_more;
mod unsignaled;
mod wc_flags;
mod xrc;

/// Appends every case.
pub fn register(v: &mut Vec<Case>) {
    device::register(v);
    pd_mr::register(v);
    cq::register(v);
    cq_more::register(v);
    qp_state::register(v);
    qp_create::register(v);
    post_state::register(v);
    peer_state::register(v);
    rq_limits::register(v);
    data::register(v);
    flush_atomic_write::register(v);
    wc_flags::register(v);
    errors::register(v);
    bounds::register(v);
    lifetimes::register(v);
    unsignaled::register(v);
    cross_pd::register(v);
    adapter::register(v);
    mw::register(v);
    mw_more::register(v);
    srq::register(v);
    ud::register(v);
    ud_more::register(v);
    ports::register(v);
    cm::register(v);
    limits::register(v);
    threads::register(v);
    traffic::register(v);
    xrc::register(v);
}

/// Asserts that `r` is an error with errno `errno`.
#[track_caller]
pub(crate) fn assert_errno<T: std::fmt::Debug>(r: verbs_api::Result<T>, errno: i32) {
    match r {
        Err(e) => assert_eq!(e.errno(), errno, "expected errno {errno}, got {e:?}"),
        Ok(v) => panic!("expected errno {errno}, got Ok({v:?})"),
    }
}

/// What fills memory a failed WR must not touch.
pub(crate) const UNTOUCHED: u8 = 0x5A;

/// Asserts that every byte of `buf` is still [`UNTOUCHED`].
#[track_caller]
pub(crate) fn assert_untouched(buf: &verbs_api::MemBuf, what: &str) {
    assert!(
        buf.to_vec().iter().all(|&b| b == UNTOUCHED),
        "bytes of {what} were written"
    );
}

/// errno values libibverbs returns.
pub(crate) mod errno {
    /// EINVAL.
    pub(crate) const EINVAL: i32 = 22;
    /// EBUSY.
    pub(crate) const EBUSY: i32 = 16;
    /// ENOMEM.
    pub(crate) const ENOMEM: i32 = 12;
    /// EOPNOTSUPP.
    pub(crate) const EOPNOTSUPP: i32 = 95;
}
