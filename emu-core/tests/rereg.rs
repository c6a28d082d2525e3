//! `ibv_rereg_mr`: new access, new memory, new PD, each keeping the keys; the errnos of
//! libibverbs; EBUSY while a memory window is bound.

mod util;

use util::*;
use verbs_api::PdId;
use verbs_api::{
    AccessFlags, MemBuf, MwBind, MwBindInfo, MwType, ReregMrFlags as F, SendFlags, SendWr, WcStatus,
};

fn write(wr_id: u64, from: &Node, len: u32, va: u64, rkey: u32) -> SendWr {
    SendWr::rdma_write(wr_id, vec![from.sge(0, len)], va, rkey).signaled()
}

/// CHANGE_ACCESS drops REMOTE_WRITE: the region keeps its keys (as kernel rxe and mlx5
/// do), and they refuse a WRITE from then on.
#[test]
fn change_access_gives_new_keys_and_new_rights() {
    let (mut p, a, b) = connected(Config::default());
    let m =
        p.b.rereg_mr(
            b.mr.lkey,
            F::CHANGE_ACCESS,
            None,
            None,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    assert_eq!((m.lkey, m.rkey), (b.mr.lkey, b.mr.rkey));
    assert_eq!((m.addr, m.length), (b.mr.addr, b.mr.length));
    a.write_bytes(0, b"xyz");
    a.post_send(
        &mut p,
        SendWr::rdma_read(1, vec![a.sge(100, 3)], m.addr, m.rkey).signaled(),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    a.post_send(&mut p, write(2, &a, 3, m.addr, m.rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    assert_eq!(b.read_bytes(0, 3), [0, 0, 0]);
    p.b.dereg_mr(m.lkey).unwrap();
    assert_eq!(p.b.dereg_mr(b.mr.lkey).unwrap_err().errno(), 22);
}

/// CHANGE_TRANSLATION moves the region to other memory: a WRITE lands there.
#[test]
fn change_translation_moves_the_region() {
    let (mut p, a, b) = connected(Config::default());
    let other = MemBuf::new(4096);
    let m =
        p.b.rereg_mr(
            b.mr.lkey,
            F::CHANGE_TRANSLATION,
            None,
            Some((&other, 512, 1024)),
            AccessFlags::empty(),
        )
        .unwrap();
    assert_eq!((m.addr, m.length), (other.addr() + 512, 1024));
    a.write_bytes(0, b"moved");
    a.post_send(&mut p, write(1, &a, 5, m.addr + 10, m.rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    let mut got = [0u8; 5];
    other.read(522, &mut got).unwrap();
    assert_eq!(&got, b"moved");
    assert_eq!(b.read_bytes(10, 5), [0; 5], "the old memory is untouched");
}

/// CHANGE_PD to another PD: the QP of the old PD cannot use it any more.
#[test]
fn change_pd_takes_the_region_away_from_the_qp() {
    let (mut p, a, b) = connected(Config::default());
    let pd2 = p.b.alloc_pd().unwrap();
    let m =
        p.b.rereg_mr(
            b.mr.lkey,
            F::CHANGE_PD,
            Some(pd2),
            None,
            AccessFlags::empty(),
        )
        .unwrap();
    assert_eq!(p.b.dealloc_pd(pd2).unwrap_err().errno(), 16);
    a.post_send(&mut p, write(1, &a, 4, m.addr, m.rkey));
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
    p.b.dereg_mr(m.lkey).unwrap();
    p.b.dealloc_pd(pd2).unwrap();
}

/// The errnos: unknown key, no or unknown flags, access without CHANGE_ACCESS, a missing
/// or unknown PD, a bad range, REMOTE_WRITE without LOCAL_WRITE; EBUSY while a window
/// is bound. A failed call changes nothing.
#[test]
fn rereg_errnos() {
    let d = Config::default();
    let (mut p, _a, b) = connected(Config {
        access: d.access | AccessFlags::MW_BIND,
        ..d
    });
    let e = &mut p.b;
    let k = b.mr.lkey;
    let none = AccessFlags::empty();
    let errno = |r: verbs_api::Result<_>| r.unwrap_err().errno();
    assert_eq!(
        errno(e.rereg_mr(k ^ 1, F::CHANGE_ACCESS, None, None, none)),
        22
    );
    assert_eq!(errno(e.rereg_mr(k, F::empty(), None, None, none)), 22);
    assert_eq!(
        errno(e.rereg_mr(k, F::from_bits_retain(8), None, None, none)),
        22
    );
    let rw = AccessFlags::REMOTE_READ;
    assert_eq!(errno(e.rereg_mr(k, F::CHANGE_PD, None, None, rw)), 22);
    assert_eq!(errno(e.rereg_mr(k, F::CHANGE_PD, None, None, none)), 22);
    assert_eq!(
        errno(e.rereg_mr(k, F::CHANGE_PD, Some(PdId(999)), None, none)),
        22
    );
    assert_eq!(
        errno(e.rereg_mr(k, F::CHANGE_TRANSLATION, None, None, none)),
        22
    );
    let small = MemBuf::new(16);
    assert_eq!(
        errno(e.rereg_mr(k, F::CHANGE_TRANSLATION, None, Some((&small, 8, 16)), none)),
        22
    );
    assert_eq!(
        errno(e.rereg_mr(k, F::CHANGE_TRANSLATION, None, Some((&small, 0, 0)), none)),
        22
    );
    assert_eq!(
        errno(e.rereg_mr(k, F::CHANGE_ACCESS, None, None, AccessFlags::REMOTE_WRITE)),
        22
    );
    // A bound window: EBUSY.
    let (mw, _) = e.alloc_mw(b.pd, MwType::Type1).unwrap();
    let now = p.now;
    let bind = MwBind {
        wr_id: 1,
        send_flags: SendFlags::empty(),
        bind_info: MwBindInfo {
            mr_lkey: k,
            addr: b.mr.addr,
            length: 64,
            mw_access_flags: AccessFlags::REMOTE_READ,
        },
    };
    p.b.bind_mw(now, b.qpn, mw, &bind).unwrap();
    p.drive();
    assert_eq!(
        errno(p.b.rereg_mr(k, F::CHANGE_ACCESS, None, None, AccessFlags::LOCAL_WRITE)),
        16
    );
    // Nothing changed: the original key still deregisters... once the window is gone.
    p.b.dealloc_mw(mw).unwrap();
    p.b.dereg_mr(k).unwrap();
}
