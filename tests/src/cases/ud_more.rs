//! Unreliable Datagram beyond the basics of `ud` (IBTA 9.6.1, 9.8, 10.2.5; manual
//! 3.4.15, 3.6.5): an address handle that does not exist, a destination QP that is
//! gone, RC and UD QPs addressing each other, more traffic classes, and bursts of
//! thousands of datagrams.
//!
//! google/rdma-unit-test checks the same conditions (`ud_test.cc` SendInvalidAh,
//! SendInvalidQpn, SendTrafficClass, AdvancedLoopbackTest.RcSendToUd and UdSendToRc;
//! `traffic/ud_burst_test.cc`).

use std::collections::BTreeSet;
use std::time::Duration;

use verbs_api::{
    Endpoint, QpCap, QpState, QpType, RecvWr, SendWr, UdDest, WcOpcode, WcStatus as S,
};

use super::errno::EINVAL;
use crate::env::{default_cap, Pair};
use crate::{Case, Env, Outcome};

/// Bytes of GRH that precede a UD payload in the receive buffer (IBTA 11.4).
const GRH: u32 = 40;

/// Datagrams of the burst.
const BURST: u64 = 2048;

/// Payload of each datagram of a burst.
const DGRAM: u32 = 64;

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("ud::send_through_an_unknown_ah_is_refused", "manual 3.6.5 ibv_post_send (wr.ud.ah must be an address handle of the context), 3.4.16; IBTA C10-10 (as google/rdma-unit-test's SendInvalidAh reads it): a SEND through an AH that was destroyed is refused at post (EINVAL) or completes with LOC_QP_OP_ERR; nothing is received", unknown_ah));
    v.push(Case::new("ud::send_to_a_destroyed_qp_is_dropped", "IBTA 9.8, 10.2.5 (UD is unacknowledged), 9.6.1.4 (a packet for a QP that does not exist is dropped): a datagram to the number of a destroyed UD QP completes successfully at the sender and reaches nobody; the sender still reaches another QP", destroyed_qp).wc(S::Success));
    v.push(Case::new("ud::rc_send_to_a_ud_qp_is_dropped", "IBTA 9.6.1 (a packet whose transport does not match the destination QP's is silently dropped), 9.7.6.1 (an unacknowledged RC requester times out): an RC QP connected to a UD QP's number gets no ACK for its SEND and completes it with RETRY_EXC_ERR; the UD QP receives nothing (google/rdma-unit-test RcSendToUd)", rc_to_ud).wc(S::RetryExcErr));
    v.push(Case::new("ud::ud_send_to_an_rc_qp_is_dropped", "IBTA 9.6.1 (transport mismatch: dropped), 9.8 (the UD sender completes without an answer): a datagram to an RC QP's number completes successfully, the RC QP receives nothing and stays in RTS, and its connection still carries a SEND (google/rdma-unit-test UdSendToRc)", ud_to_rc).wc(S::Success));
    for tc in [0u64, 96] {
        v.push(Case::param(format!("ud::traffic_class_{tc}_reaches_the_receiver"), "IBTA 8.3 (GRH TClass), Annex A17.4.5 (RoCEv2: the IP header's TOS carries it), manual 3.4.15 ibv_ah_attr.grh.traffic_class: the traffic class of the address handle, whatever its value, is what the receiver's GRH shows (google/rdma-unit-test SendTrafficClass)", super::ud::traffic_class, tc).wc(S::Success));
    }
    v.push(Case::new("ud::burst_of_2048_datagrams_arrives_whole", "IBTA 9.8 (each datagram is one packet, delivered to the QP's next receive WQE), manual 3.6.10: 2048 datagrams of 64 bytes sent back to back, 128 outstanding at a time, each complete successfully at the sender, and the receiver, its 2048 receives posted beforehand, gets every one once, intact (google/rdma-unit-test ud_burst_test)", burst).wc(S::Success));
    v.push(Case::new("ud::datagrams_without_a_receive_are_dropped", "IBTA 9.8, 10.2.5 (UD has no RNR: a datagram that finds no receive WQE is silently dropped; the QP is not affected): 200 datagrams to a QP with 10 receives posted fill exactly those 10; all 200 complete successfully at the sender, and the receiver then takes a datagram into a new receive", no_receive).wc(S::Success));
}

/// A destination of `p`'s PD: QP `qpn` on this device, with the pairs' Q_Key.
fn dest(env: &Env, p: &Pair, qpn: u32) -> UdDest {
    super::ud::dest(env, p, env.params().qkey, qpn, env.gid())
}

fn unknown_ah(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 256)]));
    let d = dest(env, &p, p.b.qpn);
    env.dev.destroy_ah(d.ah).expect("destroy_ah");
    let wr = SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled();
    match env.dev.post_send(p.a.qpn, &[wr]) {
        Err(e) => assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}"),
        Ok(()) => {
            let wc = env.poll_one(p.a.cq);
            assert_eq!((wc.wr_id, wc.status), (1, S::LocQpOpErr), "{wc:?}");
        }
    }
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    Outcome::Pass
}

fn destroyed_qp(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    let c = env.pair(QpType::Ud).b;
    env.post_recv(c.qpn, RecvWr::new(6, vec![c.sge(0, 256)]));
    let gone = p.b.qpn;
    env.dev.destroy_qp(gone).expect("destroy_qp");
    let d = dest(env, &p, gone);
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::Success), "{wc:?}");
    env.assert_no_completion(c.cq, Duration::from_millis(30));
    let d = dest(env, &p, c.qpn);
    env.post_send(
        p.a.qpn,
        SendWr::send(2, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, S::Success);
    assert_eq!(env.poll_one(c.cq).wr_id, 6);
    Outcome::Pass
}

/// An RC QP in `p`'s PD, on a CQ of its own, connected to QP `remote`: (QP, CQ).
fn rc_towards(env: &Env, p: &Pair, remote: u32) -> (u32, verbs_api::CqId) {
    let cq = env.cq(16);
    let qpn = env.qp(p.pd, cq, QpType::Rc, default_cap());
    let ep = Endpoint {
        lid: 0,
        qpn: remote,
        psn: 7,
        gid: env.gid(),
    };
    // Few, short tries: the requester gives up within milliseconds (kernel rxe retries
    // forever with retry_cnt 7).
    let params = verbs_api::QpParams {
        timeout: 8,
        retry_cnt: 2,
        ..env.params()
    };
    verbs_api::connect_qp(&*env.dev, qpn, QpType::Rc, &params, 9, &ep).expect("connect");
    (qpn, cq)
}

fn rc_to_ud(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 256)]));
    let (rc, cq) = rc_towards(env, &p, p.b.qpn);
    env.post_send(rc, SendWr::send(1, vec![p.a.sge(0, 16)]).signaled());
    let wc = env.poll_one(cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::RetryExcErr), "{wc:?}");
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    Outcome::Pass
}

fn ud_to_rc(env: &Env) -> Outcome {
    let u = env.pair(QpType::Ud);
    let r = env.pair(QpType::Rc);
    env.post_recv(r.b.qpn, RecvWr::new(5, vec![r.b.sge(0, 256)]));
    let d = dest(env, &u, r.b.qpn);
    env.post_send(
        u.a.qpn,
        SendWr::send(1, vec![u.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    let wc = env.poll_one(u.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::Success), "{wc:?}");
    env.assert_no_completion(r.b.cq, Duration::from_millis(30));
    let (attr, _) = env.dev.query_qp(r.b.qpn).expect("query_qp");
    assert_eq!(
        attr.qp_state,
        QpState::Rts,
        "the stray datagram moved the QP"
    );
    r.a.buf.write(0, b"still").unwrap();
    env.post_send(r.a.qpn, SendWr::send(2, vec![r.a.sge(0, 5)]).signaled());
    assert_eq!(env.poll_one(r.a.cq).status, S::Success);
    let wc = env.poll_one(r.b.cq);
    assert_eq!((wc.wr_id, wc.status, wc.byte_len), (5, S::Success, 5));
    Outcome::Pass
}

/// A UD pair whose receiver takes `recv_wr` receives and whose CQs hold a burst.
fn burst_pair(env: &Env, recv_wr: u32) -> Pair {
    let cap = QpCap {
        max_send_wr: 128,
        max_recv_wr: recv_wr,
        ..default_cap()
    };
    env.pair_with(QpType::Ud, &env.params(), cap, BURST as u32 + 64)
}

/// Sends `n` datagrams of [`DGRAM`] bytes from a to b, datagram `i` carrying `i`,
/// at most 128 outstanding; checks that each completes successfully at the sender.
fn send_burst(env: &Env, p: &Pair, n: u64) {
    let d = dest(env, p, p.b.qpn);
    for i in 0..n {
        p.a.buf
            .write_u64((i * u64::from(DGRAM)) as usize, i)
            .unwrap();
    }
    let (mut posted, mut done) = (0u64, 0u64);
    while done < n {
        while posted < n && posted - done < 128 {
            let sge = p.a.sge(posted * u64::from(DGRAM), DGRAM);
            let wr = SendWr::send(posted, vec![sge]).with_ud(d).signaled();
            env.post_send(p.a.qpn, wr);
            posted += 1;
        }
        let wc = env.poll_one(p.a.cq);
        assert_eq!((wc.wr_id, wc.status), (done, S::Success), "{wc:?}");
        done += 1;
    }
}

fn burst(env: &Env) -> Outcome {
    let p = burst_pair(env, BURST as u32);
    let slot = u64::from(DGRAM + GRH);
    let recvs: Vec<RecvWr> = (0..BURST)
        .map(|i| RecvWr::new(i, vec![p.b.sge(i * slot, DGRAM + GRH)]))
        .collect();
    env.dev
        .post_recv(p.b.qpn, &recvs)
        .unwrap_or_else(|e| panic!("post_recv: {e:?}"));
    send_burst(env, &p, BURST);
    let mut seen = BTreeSet::new();
    for _ in 0..BURST {
        let wc = env.poll_one(p.b.cq);
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len, wc.src_qp),
            (S::Success, WcOpcode::Recv, DGRAM + GRH, p.a.qpn),
            "{wc:?}"
        );
        let carried =
            p.b.buf
                .read_u64((wc.wr_id * slot) as usize + GRH as usize)
                .unwrap();
        assert!(carried < BURST, "datagram {carried} was never sent");
        assert!(seen.insert(carried), "datagram {carried} arrived twice");
    }
    assert_eq!(seen.len() as u64, BURST);
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    Outcome::Pass
}

fn no_receive(env: &Env) -> Outcome {
    let p = burst_pair(env, 64);
    let slot = u64::from(DGRAM + GRH);
    for i in 0..10 {
        env.post_recv(
            p.b.qpn,
            RecvWr::new(i, vec![p.b.sge(i * slot, DGRAM + GRH)]),
        );
    }
    send_burst(env, &p, 200);
    for i in 0..10 {
        let wc = env.poll_one(p.b.cq);
        assert_eq!((wc.wr_id, wc.status), (i, S::Success), "{wc:?}");
    }
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    let (attr, _) = env.dev.query_qp(p.b.qpn).expect("query_qp");
    assert_eq!(attr.qp_state, QpState::Rts);
    env.post_recv(p.b.qpn, RecvWr::new(99, vec![p.b.sge(0, DGRAM + GRH)]));
    let d = dest(env, &p, p.b.qpn);
    let wr = SendWr::send(500, vec![p.a.sge(0, 8)]).with_ud(d).signaled();
    env.post_send(p.a.qpn, wr);
    assert_eq!(env.poll_one(p.a.cq).status, S::Success);
    let wc = env.poll_one(p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (99, S::Success), "{wc:?}");
    Outcome::Pass
}
