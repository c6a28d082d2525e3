//! The RAII handles of verbs-api over a real EmuDevice: destroy order is enforced
//! (EBUSY, handle returned) and dropping in any order never dangles or leaks (manual
//! 3.4: a PD with live MRs or QPs cannot be deallocated).

use std::net::Ipv4Addr;
use std::sync::Arc;

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::*;

fn ctx(host: u8) -> (Arc<EmuDevice>, Context) {
    let cfg = EmuConfig {
        ip: Ipv4Addr::new(127, 0, 9, host).into(),
        port: 0,
        ..EmuConfig::default()
    };
    let dev = Arc::new(EmuDevice::open(cfg).unwrap());
    (dev.clone(), Context::new(dev))
}

fn cap() -> QpCap {
    QpCap::new(4, 4)
}

#[test]
fn explicit_destroys_refuse_while_children_live_and_give_the_handle_back() {
    let (_dev, ctx) = ctx(1);
    let pd = ctx.alloc_pd().unwrap();
    let buf = MemBuf::new(64);
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let qp = pd.create_qp(&cq, &cq, QpType::Rc, cap(), false).unwrap();
    let (pd, e) = pd.dealloc().unwrap_err();
    assert_eq!(e.errno(), 16);
    let (cq, e) = cq.destroy().unwrap_err();
    assert_eq!(e.errno(), 16);
    qp.destroy().unwrap();
    cq.destroy().unwrap();
    let (pd, _) = pd.dealloc().unwrap_err();
    mr.dereg().unwrap();
    pd.dealloc().unwrap();
}

#[test]
fn dropping_parents_first_frees_everything_with_the_last_child() {
    let (dev, ctx) = ctx(2);
    let pd = ctx.alloc_pd().unwrap();
    let pd_id = pd.id();
    let buf = MemBuf::new(64);
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let cq = ctx.create_cq(8, Some(&ch)).unwrap();
    let cq_id = cq.id();
    let qp = pd.create_qp(&cq, &cq, QpType::Rc, cap(), false).unwrap();
    let qpn = qp.qpn();
    drop(pd);
    drop(cq);
    drop(ch);
    // The QP still works: its PD and CQ are alive through it.
    assert_eq!(qp.query().unwrap().qp_state, QpState::Reset);
    assert_eq!(
        dev.dealloc_pd(pd_id).unwrap_err().errno(),
        16,
        "the PD still exists, in use"
    );
    drop(qp);
    assert_eq!(dev.query_qp(qpn).unwrap_err().errno(), 22, "the QP is gone");
    assert_eq!(
        dev.destroy_cq(cq_id).unwrap_err().errno(),
        22,
        "the CQ went with its last user"
    );
    assert_eq!(
        dev.dealloc_pd(pd_id).unwrap_err().errno(),
        16,
        "the MR still holds the PD"
    );
    drop(mr);
    assert_eq!(
        dev.dealloc_pd(pd_id).unwrap_err().errno(),
        22,
        "the PD went with its last MR"
    );
}

/// Handles may move between and be shared by threads, as libibverbs objects may.
#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Context>();
    check::<Pd>();
    check::<Mr>();
    check::<Cq>();
    check::<CompChannel>();
    check::<Qp>();
}

/// SRQ, AH and MW handles: an SRQ used by a QP refuses to go and comes back; dropping
/// the PD handle first frees every child with the last one.
#[test]
fn srq_ah_and_mw_handles_keep_their_order() {
    let (dev, ctx) = ctx(3);
    let pd = ctx.alloc_pd().unwrap();
    let pd_id = pd.id();
    let cq = ctx.create_cq(8, None).unwrap();
    let srq = pd
        .create_srq(&SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qp = pd
        .create_qp_on(&cq, &cq, Some(&srq), QpType::Rc, cap(), false)
        .unwrap();
    let gid = dev.gid();
    let ah = pd.create_ah(&QpParams::default().ah_attr(gid)).unwrap();
    let (mw, rkey) = pd.alloc_mw(MwType::Type2).unwrap();
    assert_ne!(rkey, 0);
    let (srq, e) = srq.destroy().unwrap_err();
    assert_eq!(e.errno(), 16, "EBUSY: a QP takes its receives from the SRQ");
    let srq_id = srq.id();
    drop(pd);
    drop(srq);
    assert_eq!(dev.dealloc_pd(pd_id).unwrap_err().errno(), 16);
    qp.destroy().unwrap();
    // The SRQ went with the QP that held it.
    assert_eq!(dev.destroy_srq(srq_id).unwrap_err().errno(), 22);
    ah.destroy().unwrap();
    drop(mw);
    assert_eq!(
        dev.dealloc_pd(pd_id).unwrap_err().errno(),
        22,
        "the PD went with its last child"
    );
    drop(cq);
}
