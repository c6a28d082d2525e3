//! Memory windows (IBTA 10.6.7, manual 2.3.5): type 1 bound with the bind verb, type 2
//! bound with a BIND_MW work request; remote access checked against the window;
//! invalidation by LOCAL_INV and by a remote SEND with Invalidate; MW_BIND_ERR on bad
//! binds; not one byte written after invalidation.

mod util;

use util::*;
use verbs_api::{
    AccessFlags, AsyncEventType, MwBind, MwBindInfo, MwType, SendFlags, SendWr, WcFlags, WcOpcode,
    WcStatus, WrOperation,
};
use verbs_api::{MwId, PdId};

fn cfg() -> Config {
    let d = Config::default();
    Config {
        access: d.access | AccessFlags::MW_BIND,
        ..d
    }
}

fn info(node: &Node, offset: u64, length: u64, access: AccessFlags) -> MwBindInfo {
    MwBindInfo {
        mr_lkey: node.mr.lkey,
        addr: node.mr.addr + offset,
        length,
        mw_access_flags: access,
    }
}

fn bind1(p: &mut Engines, node: &Node, mw: MwId, info: MwBindInfo) -> u32 {
    let now = p.now;
    let bind = MwBind {
        wr_id: 77,
        send_flags: SendFlags::SIGNALED,
        bind_info: info,
    };
    p.engine(node.side)
        .bind_mw(now, node.qpn, mw, &bind)
        .unwrap()
}

fn bind2_wr(rkey: u32, tag: u8, info: MwBindInfo) -> (SendWr, u32) {
    let new_rkey = (rkey & !0xFF) | u32::from(tag);
    let op = WrOperation::BindMw {
        mw_rkey: rkey,
        new_rkey,
        bind_info: info,
    };
    (SendWr::new(78, vec![], op).signaled(), new_rkey)
}

fn write(wr_id: u64, from: &Node, len: u32, va: u64, rkey: u32) -> SendWr {
    SendWr::rdma_write(wr_id, vec![from.sge(0, len)], va, rkey).signaled()
}

const RW: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ);

/// Type 1: the bind verb returns the new R_Key, the bind completes with BIND_MW, and a
/// WRITE through the window lands in the region; one byte past the window is a remote
/// access error although the region would allow it, and nothing is written.
#[test]
fn type1_window_grants_its_range_only() {
    let (mut p, a, b) = connected(cfg());
    let (mw, rkey0) = p.b.alloc_mw(b.pd, MwType::Type1).unwrap();
    let rkey = bind1(&mut p, &b, mw, info(&b, 1024, 256, RW));
    assert_eq!(rkey >> 8, rkey0 >> 8);
    assert_ne!(rkey, rkey0);
    p.drive();
    let wc = b.poll(&mut p);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (77, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(p.b.mw_info(mw).unwrap(), (rkey, MwType::Type1));
    let data = pattern(256, 9);
    a.write_bytes(0, &data);
    a.post_send(&mut p, write(1, &a, 256, b.mr.addr + 1024, rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(b.read_bytes(1024, 256), data);
    // The old key is dead.
    b.write_bytes(1024, &[0; 256]);
    a.post_send(&mut p, write(2, &a, 4, b.mr.addr + 1024, rkey0));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    assert_eq!(
        b.read_bytes(1024, 256),
        vec![0; 256],
        "not one byte written"
    );

    // One byte past the window.
    let (mut p, a, b) = connected(cfg());
    let (mw, _) = p.b.alloc_mw(b.pd, MwType::Type1).unwrap();
    let rkey = bind1(&mut p, &b, mw, info(&b, 1024, 256, RW));
    p.drive();
    b.poll(&mut p);
    a.post_send(&mut p, write(3, &a, 2, b.mr.addr + 1024 + 255, rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    assert_eq!(b.read_bytes(1024 + 255, 2), [0, 0]);
    let ev = b.events(&mut p);
    assert_eq!(ev[0].event_type, AsyncEventType::QpAccessErr);
}

/// The window's rights decide: a READ-only window refuses a WRITE on a region that
/// allows it.
#[test]
fn window_rights_not_the_regions() {
    let (mut p, a, b) = connected(cfg());
    let (mw, _) = p.b.alloc_mw(b.pd, MwType::Type1).unwrap();
    let rkey = bind1(&mut p, &b, mw, info(&b, 0, 4096, AccessFlags::REMOTE_READ));
    p.drive();
    b.write_bytes(0, b"window");
    a.post_send(
        &mut p,
        SendWr::rdma_read(1, vec![a.sge(100, 6)], b.mr.addr, rkey).signaled(),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(a.read_bytes(100, 6), b"window");
    a.post_send(&mut p, write(2, &a, 6, b.mr.addr, rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    assert_eq!(b.read_bytes(0, 6), b"window");
}

/// Type 2: bound with a BIND_MW WR (zero-based here), used by the peer, invalidated by
/// the peer's SEND with Invalidate (the receive WC has WITH_INV and the key), after
/// which a WRITE through it writes nothing.
#[test]
fn type2_bind_then_remote_invalidate() {
    let (mut p, a, b) = connected(cfg());
    let (_mw, rkey0) = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let access = RW | AccessFlags::ZERO_BASED;
    let (wr, rkey) = bind2_wr(rkey0, 0x42, info(&b, 2048, 512, access));
    b.post_send(&mut p, wr);
    p.drive();
    let wc = b.poll(&mut p);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    // Zero-based: address 16 of the window is byte 2048 + 16 of the region.
    a.write_bytes(0, b"zero-based");
    a.post_send(&mut p, write(1, &a, 10, 16, rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(b.read_bytes(2048 + 16, 10), b"zero-based");

    b.post_recv(&mut p, 5, 0, 64);
    let inv = SendWr::new(
        2,
        vec![a.sge(0, 4)],
        WrOperation::SendWithInv {
            invalidate_rkey: rkey,
        },
    )
    .signaled();
    a.post_send(&mut p, inv);
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    let wc = b.poll(&mut p);
    assert_eq!((wc[0].wr_id, wc[0].status), (5, WcStatus::Success));
    assert!(wc[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(wc[0].invalidated_rkey, rkey);

    b.write_bytes(2048, &[0; 512]);
    a.post_send(&mut p, write(3, &a, 10, 0, rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    assert_eq!(
        b.read_bytes(2048, 512),
        vec![0; 512],
        "not one byte written"
    );
    assert_eq!(b.events(&mut p)[0].event_type, AsyncEventType::QpAccessErr);
}

/// Type 2: the bind WR names the window by `mw_rkey` (its index: the key byte there
/// does not matter) and of the new R_Key only the key byte counts; the window keeps its
/// index (IBTA 10.6.7.2; kernel rxe). google/rdma-unit-test binds with R_Key 1024.
#[test]
fn type2_bind_keeps_the_index_and_takes_the_key_byte() {
    let (mut p, a, b) = connected(cfg());
    let (_mw, rkey0) = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let op = WrOperation::BindMw {
        mw_rkey: rkey0 ^ 0x5A,
        new_rkey: 1024 | 0x33,
        bind_info: info(&b, 0, 256, RW),
    };
    b.post_send(&mut p, SendWr::new(78, vec![], op).signaled());
    p.drive();
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::Success);
    let rkey = (rkey0 & !0xFF) | 0x33;
    a.write_bytes(0, b"key byte");
    a.post_send(&mut p, write(1, &a, 8, b.mr.addr, rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    assert_eq!(b.read_bytes(0, 8), b"key byte");
    a.post_send(&mut p, write(2, &a, 8, b.mr.addr, 1024 | 0x33));
    p.drive();
    assert_eq!(
        a.poll(&mut p)[0].status,
        WcStatus::RemAccessErr,
        "the R_Key as asked names no window"
    );
}

/// An RDMA WRITE with immediate through an invalidated window: REM_ACCESS_ERR at the
/// requester, and the receive WQE it would have completed completes with
/// LOC_ACCESS_ERR (IBTA's "local access error"); not a byte is written.
#[test]
fn write_with_imm_after_invalidation_is_a_local_access_error() {
    let (mut p, a, b) = connected(cfg());
    let (_mw, rkey0) = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let (wr, rkey) = bind2_wr(rkey0, 9, info(&b, 0, 256, RW));
    b.post_send(&mut p, wr);
    let inv = SendWr::new(
        2,
        vec![],
        WrOperation::LocalInv {
            invalidate_rkey: rkey,
        },
    );
    b.post_send(&mut p, inv);
    b.post_recv(&mut p, 11, 1024, 64);
    p.drive();
    b.poll(&mut p);
    a.write_bytes(0, b"late");
    a.post_send(&mut p, write(1, &a, 4, b.mr.addr, rkey).with_imm(5));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    let wc = b.poll(&mut p);
    assert_eq!((wc[0].wr_id, wc[0].status), (11, WcStatus::LocAccessErr));
    assert_eq!(b.read_bytes(0, 4), [0; 4]);
}

/// LOCAL_INV unbinds a type 2 window (WC LOCAL_INV); a READ after it fails. A region's
/// key cannot be invalidated: MW_BIND_ERR. While bound the region cannot be
/// deregistered (EBUSY); the PD cannot go while the window exists.
#[test]
fn local_invalidate_and_dereg_busy() {
    let (mut p, a, b) = connected(cfg());
    let (mw, rkey0) = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    let (wr, rkey) = bind2_wr(rkey0, 1, info(&b, 0, 64, RW));
    b.post_send(&mut p, wr);
    p.drive();
    b.poll(&mut p);
    assert_eq!(p.b.dereg_mr(b.mr.lkey).unwrap_err().errno(), 16);
    let inv = SendWr::new(
        9,
        vec![],
        WrOperation::LocalInv {
            invalidate_rkey: rkey,
        },
    )
    .signaled();
    b.post_send(&mut p, inv);
    p.drive();
    let wc = b.poll(&mut p);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (9, WcStatus::Success, WcOpcode::LocalInv)
    );
    a.post_send(
        &mut p,
        SendWr::rdma_read(1, vec![a.sge(0, 8)], b.mr.addr, rkey).signaled(),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.b.dealloc_pd(b.pd).unwrap_err().errno(), 16);
    p.b.dealloc_mw(mw).unwrap();
    assert_eq!(p.b.dealloc_mw(mw).unwrap_err().errno(), 22);

    // LOCAL_INV of a region's key.
    let (mut p, _a, b) = connected(cfg());
    let inv = SendWr::new(
        9,
        vec![],
        WrOperation::LocalInv {
            invalidate_rkey: b.mr.rkey,
        },
    );
    b.post_send(&mut p, inv);
    p.drive();
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::MwBindErr);
}

/// A SEND with Invalidate naming a region (not a window): a class J error (IBTA
/// 9.9.6.3): the receiver's WQE completes with MW_BIND_ERR and its QP goes to ERR; no
/// NAK, no ACK, so the sender runs out of retries.
#[test]
fn send_with_invalidate_of_a_region_is_refused() {
    let (mut p, a, b) = connected(cfg());
    b.post_recv(&mut p, 5, 0, 64);
    let inv = SendWr::new(
        2,
        vec![a.sge(0, 4)],
        WrOperation::SendWithInv {
            invalidate_rkey: b.mr.rkey,
        },
    )
    .signaled();
    a.post_send(&mut p, inv);
    p.drive();
    assert_eq!(b.poll(&mut p)[0].status, WcStatus::MwBindErr);
    assert_eq!(b.state(&mut p), verbs_api::QpState::Err);
    assert!(
        !p.log.iter().any(|r| r.syndrome.is_some_and(|s| s >= 0x60)),
        "a NAK went out"
    );
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RetryExcErr);
}

/// Every bad bind completes with MW_BIND_ERR (and the QP goes to error); the window
/// stays unbound.
#[test]
fn bad_binds_are_mw_bind_errors() {
    enum Case {
        WrongPd,
        MrWithoutMwBind,
        RangeOutsideMr,
        Type1ZeroBased,
        RemoteWriteWithoutLocalWrite,
        Type1ThroughWr,
        Type1MissingWindow,
        Type2MissingWindow,
        Type2BoundTwice,
    }
    for case in [
        Case::WrongPd,
        Case::MrWithoutMwBind,
        Case::RangeOutsideMr,
        Case::Type1ZeroBased,
        Case::RemoteWriteWithoutLocalWrite,
        Case::Type1ThroughWr,
        Case::Type1MissingWindow,
        Case::Type2MissingWindow,
        Case::Type2BoundTwice,
    ] {
        let (mut p, _a, b) = connected(cfg());
        let mut good = info(&b, 0, 128, RW);
        let type1 = |p: &mut Engines, pd: PdId, i: MwBindInfo| {
            let (mw, _) = p.b.alloc_mw(pd, MwType::Type1).unwrap();
            bind1(p, &b, mw, i);
        };
        match case {
            Case::WrongPd => {
                let pd2 = p.b.alloc_pd().unwrap();
                type1(&mut p, pd2, good);
            }
            Case::MrWithoutMwBind => {
                let mr =
                    p.b.reg_mr(b.pd, &b.buf, 0, 4096, AccessFlags::LOCAL_WRITE | RW)
                        .unwrap();
                good.mr_lkey = mr.lkey;
                type1(&mut p, b.pd, good);
            }
            Case::RangeOutsideMr => {
                good.addr = b.mr.addr + b.mr.length - 64;
                type1(&mut p, b.pd, good);
            }
            Case::Type1ZeroBased => {
                good.mw_access_flags |= AccessFlags::ZERO_BASED;
                type1(&mut p, b.pd, good);
            }
            Case::RemoteWriteWithoutLocalWrite => {
                let mr =
                    p.b.reg_mr(
                        b.pd,
                        &b.buf,
                        0,
                        4096,
                        AccessFlags::MW_BIND | AccessFlags::REMOTE_READ,
                    )
                    .unwrap();
                good.mr_lkey = mr.lkey;
                good.addr = mr.addr;
                type1(&mut p, b.pd, good);
            }
            Case::Type1ThroughWr => {
                let (_, rkey) = p.b.alloc_mw(b.pd, MwType::Type1).unwrap();
                b.post_send(&mut p, bind2_wr(rkey, 3, good).0);
            }
            // A window that is gone: the bind is posted all the same (by the verb
            // or a WR) and fails when it runs, as kernel rxe's lookup does.
            Case::Type1MissingWindow => {
                let (mw, _) = p.b.alloc_mw(b.pd, MwType::Type1).unwrap();
                p.b.dealloc_mw(mw).unwrap();
                bind1(&mut p, &b, mw, good);
            }
            Case::Type2MissingWindow => {
                let (mw, rkey) = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
                p.b.dealloc_mw(mw).unwrap();
                b.post_send(&mut p, bind2_wr(rkey, 3, good).0);
            }
            Case::Type2BoundTwice => {
                let (_, rkey) = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
                let (wr, new) = bind2_wr(rkey, 3, good);
                b.post_send(&mut p, wr);
                b.post_send(&mut p, bind2_wr(new, 4, good).0);
            }
        }
        p.drive();
        let wc = b.poll(&mut p);
        let last = wc.last().unwrap();
        assert_eq!(
            (last.status, wc.len()),
            (
                WcStatus::MwBindErr,
                if matches!(case, Case::Type2BoundTwice) {
                    2
                } else {
                    1
                }
            )
        );
        assert_eq!(b.state(&mut p), verbs_api::QpState::Err);
    }
}

/// The bind verb's immediate errors: EINVAL for a type 2 window, an unknown QP, a QP
/// not ready to send (an unknown window fails in its completion, see above).
#[test]
fn bind_verb_errnos() {
    let (mut p, _a, b) = connected(cfg());
    let now = p.now;
    let bind = MwBind {
        wr_id: 1,
        send_flags: SendFlags::empty(),
        bind_info: info(&b, 0, 64, RW),
    };
    let (mw2, _) = p.b.alloc_mw(b.pd, MwType::Type2).unwrap();
    assert_eq!(p.b.bind_mw(now, b.qpn, mw2, &bind).unwrap_err().errno(), 22);
    let (mw1, _) = p.b.alloc_mw(b.pd, MwType::Type1).unwrap();
    assert_eq!(
        p.b.bind_mw(now, 0xABCD, mw1, &bind).unwrap_err().errno(),
        22
    );
    assert_eq!(
        p.b.alloc_mw(PdId(999), MwType::Type1).unwrap_err().errno(),
        22
    );
    let q = setup(&mut p.b, Side::B, &cfg()).qpn;
    assert_eq!(
        p.b.bind_mw(now, q, mw1, &bind).unwrap_err().errno(),
        22,
        "QP in RESET"
    );
    // An unsignaled successful bind completes silently.
    p.b.bind_mw(now, b.qpn, mw1, &bind).unwrap();
    p.drive();
    assert!(b.poll(&mut p).is_empty());
}
