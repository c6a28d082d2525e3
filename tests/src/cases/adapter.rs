//! Completion statuses only an adapter reports (manual 6.2.21 `IBV_WC_RESP_TIMEOUT_ERR`,
//! 6.2.22 `IBV_WC_GENERAL_ERR`): no IBTA rule of RC, UC or UD produces them, but
//! drivers do (ocrdma's response timeout, a CQE syndrome the driver cannot map), and a
//! program must handle them like any completion error. The emulator injects them
//! (`Faults::fail_qp`); a healthy device never shows them, so hardware skips.

use verbs_api::{QpState, QpType, RecvWr, SendWr, WcStatus as S, WrOperation};

use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("errors::adapter_resp_timeout_err", "manual 6.2.21 IBV_WC_RESP_TIMEOUT_ERR, IBTA 10.8 (a WQE completed in error moves the QP to ERR and flushes the rest): an adapter's response timeout completes the SEND under way with RESP_TIMEOUT_ERR, the QP goes to ERR, the WRs behind it are flushed", resp_timeout).wc(S::RespTimeoutErr).faulty());
    v.push(Case::new("errors::adapter_general_err", "manual 6.2.22 IBV_WC_GENERAL_ERR, IBTA 10.8: an adapter error no other status describes completes the SEND under way with GENERAL_ERR, the QP goes to ERR, the WRs behind it are flushed", general).wc(S::GeneralErr).faulty());
}

fn resp_timeout(env: &Env) -> Outcome {
    adapter_error(env, S::RespTimeoutErr)
}

fn general(env: &Env) -> Outcome {
    adapter_error(env, S::GeneralErr)
}

/// Two SENDs posted, the adapter fails the QP: the first completes with `status`,
/// the second is flushed, the QP is in ERR; the peer, which got the first SEND or
/// not, stays usable (its state is its own).
fn adapter_error(env: &Env, status: S) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.post_recv(p.b.qpn, RecvWr::new(1, vec![p.b.sge(0, 64)]));
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![p.b.sge(64, 64)]));
    for id in [7, 8] {
        env.post_send(
            p.a.qpn,
            SendWr::new(id, vec![p.a.sge(0, 16)], WrOperation::Send).signaled(),
        );
    }
    env.faults().fail_qp(p.a.qpn, status);
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status, wc.qp_num), (7, status, p.a.qpn));
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (8, S::WrFlushErr));
    let (attr, _) = env.dev.query_qp(p.a.qpn).expect("query_qp");
    assert_eq!(attr.qp_state, QpState::Err);
    let (attr, _) = env.dev.query_qp(p.b.qpn).expect("query_qp");
    assert_eq!(attr.qp_state, QpState::Rts);
    Outcome::Pass
}
