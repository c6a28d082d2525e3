//! The conveniences of `verbs_api`'s handles, on fabric devices: the QP builder's
//! defaults, `Cq::wait`, `Cq::completions` and `Cq::resize`.

use std::time::Duration;

use emu_sims::pair::{pair, PairConfig};
use emu_sims::Fabric;
use verbs_api::{Error, QpBuilder, QpType, SendWr, WcStatus};

#[test]
fn a_built_qp_has_the_working_defaults_and_what_was_changed() {
    let fabric = Fabric::new(1);
    let (a, _b) = pair(&fabric, &PairConfig::default());
    let qp = a.pd.qp(QpType::Rc, &a.cq).build().unwrap();
    let (_, init) = a.ctx.device().query_qp(qp.qpn()).unwrap();
    assert_eq!(init.cap.max_send_wr, QpBuilder::DEFAULT_CAP.max_send_wr);
    assert_eq!(init.cap.max_recv_sge, 1);
    assert!(init.sq_sig_all);
    assert_eq!(
        (init.qp_type, init.send_cq, init.recv_cq),
        (QpType::Rc, a.cq.id(), a.cq.id())
    );
    let other = a.ctx.create_cq(8, None).unwrap();
    let ud =
        a.pd.qp(QpType::Ud, &a.cq)
            .recv_cq(&other)
            .max_send_wr(4)
            .max_sge(2)
            .sq_sig_all(false)
            .build()
            .unwrap();
    let (_, init) = a.ctx.device().query_qp(ud.qpn()).unwrap();
    assert_eq!((init.cap.max_send_wr, init.cap.max_send_sge), (4, 2));
    assert_eq!((init.recv_cq, init.sq_sig_all), (other.id(), false));
}

#[test]
fn wait_returns_the_next_completion_or_times_out() {
    let fabric = Fabric::new(1);
    let (a, b) = pair(&fabric, &PairConfig::default());
    assert!(matches!(
        a.cq.wait(Duration::from_millis(20)),
        Err(Error::TimedOut)
    ));
    a.post(&[SendWr::rdma_write(3, a.sge(0, 8), b.addr(0), b.rkey())]);
    let wc = a.cq.wait(Duration::from_secs(5)).unwrap();
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
}

#[test]
fn completions_yield_what_the_cq_holds_then_end() {
    let fabric = Fabric::new(1);
    let (a, b) = pair(&fabric, &PairConfig::default());
    let wrs: Vec<SendWr> = (0..40)
        .map(|i| SendWr::rdma_write(i, a.sge(0, 8), b.addr(0), b.rkey()))
        .collect();
    a.post(&wrs[..20]);
    a.post(&wrs[20..]);
    // Let every WRITE complete without taking the completions.
    fabric.run(Duration::from_secs(1));
    let ids: Vec<u64> = a.cq.completions().map(|wc| wc.unwrap().wr_id).collect();
    assert_eq!(ids, (0..40).collect::<Vec<u64>>());
    assert_eq!(a.cq.completions().count(), 0);
}

#[test]
fn resize_grows_and_will_not_shrink_below_what_is_queued() {
    let fabric = Fabric::new(1);
    let (a, b) = pair(&fabric, &PairConfig::default());
    a.cq.resize(1024).unwrap();
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| SendWr::rdma_write(i, a.sge(0, 8), b.addr(0), b.rkey()))
        .collect();
    a.post(&wrs);
    fabric.run(Duration::from_secs(1));
    assert_eq!(a.cq.resize(2).unwrap_err().errno(), 22);
    assert_eq!(a.cq.completions().count(), 4);
}
