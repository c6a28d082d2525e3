//! Memory windows (IBTA 10.6.7, manual 2.3.5): remote access granted through a bound
//! window, and refused once the window is invalidated.

use verbs_api::{
    AccessFlags, AsyncEventType, MwBindInfo, MwType, SendWr, WcFlags, WcOpcode, WcStatus,
    WrOperation,
};

use super::recovery::statuses;
use super::{ensure, expect_eq, Check, Scenario};
use crate::pair::{pair, PairConfig};
use crate::Fabric;

pub(crate) const MW_INVALIDATION: Scenario = Scenario {
    name: "mw-invalidation",
    description: "b binds a type 2 window over 512 bytes of its memory (BIND_MW WR); a WRITEs through it, then a SEND with Invalidate names its rkey; the next WRITE through it is NAKed REM_ACCESS_ERR and writes not one byte (IBTA 10.6.7, manual 2.3.5)",
    run: mw_invalidation,
};

fn mw_invalidation(f: &Fabric) -> Check {
    let e = |e: verbs_api::Error| e.to_string();
    let (a, b) = pair(f, &PairConfig::default());
    // A window lies in a region registered with MW_BIND (IBTA 10.6.7.2).
    let bindable =
        b.pd.reg_mr(
            &b.mem,
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::MW_BIND,
        )
        .map_err(e)?;
    let (_mw, rkey0) = b.pd.alloc_mw(MwType::Type2).map_err(e)?;
    // A type 2 window's rkey keeps its index (upper 24 bits) and takes a new key byte.
    let rkey = (rkey0 & !0xFF) | 0x42;
    let window = MwBindInfo {
        mr_lkey: bindable.lkey(),
        addr: b.addr(2048),
        length: 512,
        mw_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    };
    b.post(&[SendWr::new(
        20,
        vec![],
        WrOperation::BindMw {
            mw_rkey: rkey0,
            new_rkey: rkey,
            bind_info: window,
        },
    )]);
    let wc = b.wait(1);
    expect_eq(
        "b's bind",
        wc.iter().map(|w| (w.status, w.opcode)).collect::<Vec<_>>(),
        vec![(WcStatus::Success, WcOpcode::BindMw)],
    )?;

    a.mem
        .write(0, b"through the window")
        .map_err(|e| e.to_string())?;
    a.post(&[SendWr::rdma_write(
        1,
        vec![a.sge(0, 18)],
        b.addr(2048),
        rkey,
    )]);
    expect_eq(
        "a's WRITE through the window",
        statuses(&a.wait(1)),
        vec![(1, WcStatus::Success)],
    )?;
    let mut got = [0u8; 18];
    b.mem.read(2048, &mut got).map_err(|e| e.to_string())?;
    expect_eq("b's memory", &got, b"through the window")?;

    b.post_recv(5, 0, 64);
    a.post(&[SendWr::new(
        2,
        vec![a.sge(0, 18)],
        WrOperation::SendWithInv {
            invalidate_rkey: rkey,
        },
    )]);
    expect_eq(
        "a's SEND with Invalidate",
        statuses(&a.wait(1)),
        vec![(2, WcStatus::Success)],
    )?;
    let r = b.wait(1);
    expect_eq("b's receive", statuses(&r), vec![(5, WcStatus::Success)])?;
    ensure(r[0].wc_flags.contains(WcFlags::WITH_INV), || {
        "the receive lacks WITH_INV".into()
    })?;
    expect_eq("invalidated rkey", r[0].invalidated_rkey, rkey)?;

    b.mem.write(2048, &[0; 512]).map_err(|e| e.to_string())?;
    a.post(&[SendWr::rdma_write(
        3,
        vec![a.sge(0, 18)],
        b.addr(2048),
        rkey,
    )]);
    expect_eq(
        "a's WRITE after invalidation",
        statuses(&a.wait(1)),
        vec![(3, WcStatus::RemAccessErr)],
    )?;
    let mut after = [0xFFu8; 512];
    b.mem.read(2048, &mut after).map_err(|e| e.to_string())?;
    ensure(after.iter().all(|x| *x == 0), || {
        "the invalidated window was written".into()
    })?;
    let ev: Vec<AsyncEventType> = b.events().iter().map(|e| e.event_type).collect();
    expect_eq("b's events", ev, vec![AsyncEventType::QpAccessErr])
}
