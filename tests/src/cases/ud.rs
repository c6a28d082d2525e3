//! Unreliable Datagram (manual 2.1, 3.4.15-3.4.16, 3.6.11-3.6.14; IBTA 9.8, 10.2.5,
//! 11.4): one-packet messages, Q_Keys, the GRH in the receive buffer, address
//! handles and multicast.

use std::time::Duration;

use verbs_api::{Gid, QpType, RecvWr, SendWr, UdDest, WcFlags, WcOpcode, WcStatus};

use super::{
    assert_errno,
    errno::{EBUSY, EINVAL},
};
use crate::env::Pair;
use crate::{Case, Env, Outcome};

/// Bytes of GRH that precede a UD payload in the receive buffer (IBTA 11.4, manual 2.3.7).
const GRH: u64 = 40;

pub(super) fn register(v: &mut Vec<Case>) {
    for (name, size) in [("0", 0u64), ("1", 1), ("256", 256), ("mtu", u64::MAX)] {
        v.push(Case::param(format!("ud::send_{name}_bytes"), "IBTA 9.8 (UD: one packet per message), 11.4: the receive buffer holds the 40-byte GRH then the payload; the WC has IBV_WC_GRH, src_qp and byte_len = payload + 40 (manual 3.6.10)", send_size, size).wc(WcStatus::Success));
    }
    v.push(Case::new(
        "ud::send_with_imm",
        "IBTA 9.8: UD SEND with immediate delivers imm_data (IBV_WC_WITH_IMM)",
        send_imm,
    ));
    v.push(Case::new("ud::larger_than_mtu_is_loc_len_err", "IBTA 9.8, 10.7, manual 6.2.2: a UD message longer than the path MTU completes with LOC_LEN_ERR and is not sent (kernel rxe deviates)", oversize).wc(WcStatus::LocLenErr));
    v.push(Case::new(
        "ud::qkey_mismatch_is_dropped",
        "IBTA 10.2.5: a datagram whose Q_Key differs from the receiving QP's is silently dropped",
        qkey_mismatch,
    ));
    v.push(Case::new(
        "ud::qkey_high_bit_takes_the_qps",
        "IBTA 10.2.5: a WR Q_Key with the high bit set means: use the QP's own Q_Key",
        qkey_high_bit,
    ));
    v.push(
        Case::new(
            "ud::recv_without_room_for_grh_is_loc_len_err",
            "IBTA 11.4, manual 6.2.2: the receive WR must hold the GRH and the payload, else LOC_LEN_ERR",
            no_room_for_grh,
        )
        .wc(WcStatus::LocLenErr),
    );
    v.push(Case::param("ud::traffic_class_reaches_the_receiver", "IBTA 8.3 (GRH TClass), Annex A17.4.5 (RoCEv2: the IP header's TOS/traffic class carries it), manual 3.4.15 ibv_ah_attr.grh.traffic_class: the traffic class of the address handle reaches the receiver, whose GRH in the receive buffer shows it", traffic_class, 252).wc(WcStatus::Success));
    v.push(Case::new("ud::send_to_a_missing_qpn_is_dropped", "IBTA 9.8, 10.2.5 (UD is unacknowledged: the sender cannot know the destination QP), 9.2 (DestQP has 24 bits), 9.6.1.4 (a packet for a QP that does not exist is dropped by the receiver): a send to remote_qpn 0xDEADBEEF is posted, completes successfully and nothing is received", missing_qpn).wc(WcStatus::Success));
    v.push(Case::new(
        "ud::ah_create_and_destroy",
        "manual 3.4.15-3.4.16 ibv_create_ah/ibv_destroy_ah",
        ah_lifecycle,
    ));
    v.push(Case::new("ud::reply_through_ah_from_wc", "manual 3.6.11 ibv_init_ah_from_wc, 3.6.12 ibv_create_ah_from_wc: the receiver of a UD SEND builds from its WC and the GRH in its buffer a global address vector back to the sender (dgid = the sender's GID, sgid_index = the index of the GID the datagram was sent to), and a reply through it reaches the sender; without IBV_WC_GRH the vector is not global", reply_through_ah_from_wc));
    v.push(Case::new(
        "ud::dealloc_pd_with_ah_is_ebusy",
        "manual 3.3.6: a PD used by an address handle cannot be freed",
        pd_busy_with_ah,
    ));
    v.push(Case::new(
        "ud::rdma_write_is_einval",
        "manual 2.2 (the table of operations per transport mode): UD has SEND only",
        ud_write,
    ));
    v.push(Case::new("ud::multicast_reaches_every_attached_qp", "manual 3.6.13 ibv_attach_mcast: a send to a multicast group is delivered to every attached UD QP", multicast));
    v.push(Case::new(
        "ud::detached_qp_gets_nothing",
        "manual 3.6.14 ibv_detach_mcast: a detached QP no longer receives the group's datagrams",
        detached,
    ));
    v.push(Case::new(
        "ud::attach_mcast_on_rc_is_einval",
        "manual 3.6.13: only UD QPs join multicast groups",
        attach_rc,
    ));
}

/// A destination through a new AH of `p`'s PD towards `gid`: QP `qpn` with `qkey`.
pub(super) fn dest(env: &Env, p: &Pair, qkey: u32, qpn: u32, gid: Gid) -> UdDest {
    let ah = env
        .dev
        .create_ah(p.pd, &env.params().ah_attr(gid))
        .expect("create_ah");
    UdDest {
        ah,
        remote_qpn: qpn,
        remote_qkey: qkey,
    }
}

fn mtu(env: &Env) -> u64 {
    u64::from(
        env.dev
            .query_port(1)
            .expect("query_port")
            .active_mtu
            .bytes(),
    )
}

fn send_size(env: &Env, size: u64) -> Outcome {
    let size = if size == u64::MAX { mtu(env) } else { size };
    let p = env.pair(QpType::Ud);
    let data: Vec<u8> = (0..size).map(|i| (i * 7) as u8).collect();
    p.a.buf.write(0, &data).unwrap();
    env.post_recv(
        p.b.qpn,
        RecvWr::new(5, vec![p.b.sge(0, (size + GRH) as u32)]),
    );
    let d = dest(env, &p, env.params().qkey, p.b.qpn, env.gid());
    let sg = if size == 0 {
        vec![]
    } else {
        vec![p.a.sge(0, size as u32)]
    };
    env.post_send(p.a.qpn, SendWr::send(1, sg).with_ud(d).signaled());
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let wc = env.poll_one(p.b.cq);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    assert_eq!(
        (wc.opcode, u64::from(wc.byte_len), wc.src_qp),
        (WcOpcode::Recv, size + GRH, p.a.qpn),
        "{wc:?}"
    );
    assert!(wc.wc_flags.contains(WcFlags::GRH), "{wc:?}");
    let mut got = vec![0u8; size as usize];
    p.b.buf.read(GRH as usize, &mut got).unwrap();
    assert!(got == data, "payload differs");
    Outcome::Pass
}

fn send_imm(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
    let d = dest(env, &p, env.params().qkey, p.b.qpn, env.gid());
    env.post_send(
        p.a.qpn,
        SendWr::send_with_imm(1, vec![p.a.sge(0, 16)], 0xABCD)
            .with_ud(d)
            .signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let wc = env.poll_one(p.b.cq);
    assert!(wc.wc_flags.contains(WcFlags::WITH_IMM), "{wc:?}");
    assert_eq!(wc.imm_data, 0xABCD);
    Outcome::Pass
}

fn oversize(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    let m = mtu(env);
    env.post_recv(
        p.b.qpn,
        RecvWr::new(5, vec![p.b.sge(0, (m + 1 + GRH) as u32)]),
    );
    let d = dest(env, &p, env.params().qkey, p.b.qpn, env.gid());
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, (m + 1) as u32)])
            .with_ud(d)
            .signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::LocLenErr);
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    Outcome::Pass
}

fn qkey_mismatch(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
    let d = dest(env, &p, env.params().qkey ^ 1, p.b.qpn, env.gid());
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    Outcome::Pass
}

fn qkey_high_bit(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
    let d = dest(env, &p, 0x8000_0000, p.b.qpn, env.gid());
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    assert_eq!(env.poll_one(p.b.cq).status, WcStatus::Success);
    Outcome::Pass
}

fn no_room_for_grh(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 100)]));
    let d = dest(env, &p, env.params().qkey, p.b.qpn, env.gid());
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 100)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    assert_eq!(env.poll_one(p.b.cq).status, WcStatus::LocLenErr);
    Outcome::Pass
}

fn ah_lifecycle(env: &Env) -> Outcome {
    let pd = env.pd();
    let ah = env
        .dev
        .create_ah(pd, &env.params().ah_attr(env.gid()))
        .expect("create_ah");
    env.dev.destroy_ah(ah).expect("destroy_ah");
    assert_errno(env.dev.destroy_ah(ah), EINVAL);
    Outcome::Pass
}

fn reply_through_ah_from_wc(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    let qkey = env.params().qkey;
    p.a.buf.write(0, b"ping").unwrap();
    p.b.buf.write(1024, b"pong").unwrap();
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
    env.post_recv(p.a.qpn, RecvWr::new(6, vec![p.a.sge(2048, 128)]));
    let d = dest(env, &p, qkey, p.b.qpn, env.gid());
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 4)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.status, wc.src_qp),
        (WcStatus::Success, p.a.qpn),
        "{wc:?}"
    );
    assert!(wc.wc_flags.contains(WcFlags::GRH), "{wc:?}");
    let mut grh = [0u8; GRH as usize];
    p.b.buf.read(0, &mut grh).unwrap();

    let attr = env
        .dev
        .init_ah_from_wc(1, &wc, &grh)
        .expect("init_ah_from_wc");
    assert!(attr.is_global, "{attr:?}");
    assert_eq!(
        (attr.grh.dgid, attr.grh.sgid_index, attr.port_num),
        (env.gid(), env.gid_index, 1),
        "{attr:?}"
    );
    let ah = env
        .dev
        .create_ah_from_wc(p.pd, &wc, &grh, 1)
        .expect("create_ah_from_wc");
    let back = UdDest {
        ah,
        remote_qpn: wc.src_qp,
        remote_qkey: qkey,
    };
    env.post_send(
        p.b.qpn,
        SendWr::send(2, vec![p.b.sge(1024, 4)])
            .with_ud(back)
            .signaled(),
    );
    let sent = env.poll_one(p.b.cq);
    assert_eq!(
        (sent.wr_id, sent.status),
        (2, WcStatus::Success),
        "{sent:?}"
    );
    let got = env.poll_one(p.a.cq);
    assert_eq!(
        (got.wr_id, got.status, got.src_qp, got.byte_len),
        (6, WcStatus::Success, p.b.qpn, GRH as u32 + 4),
        "{got:?}"
    );
    let mut pong = [0u8; 4];
    p.a.buf.read(2048 + GRH as usize, &mut pong).unwrap();
    assert_eq!(&pong, b"pong");
    env.dev.destroy_ah(ah).expect("destroy_ah");

    // Without IBV_WC_GRH the same completion gives a local (non-global) vector.
    let local = verbs_api::WorkCompletion {
        wc_flags: wc.wc_flags - WcFlags::GRH,
        ..wc
    };
    let attr = env
        .dev
        .init_ah_from_wc(1, &local, &grh)
        .expect("init_ah_from_wc without a GRH");
    assert!(!attr.is_global, "{attr:?}");
    Outcome::Pass
}

fn pd_busy_with_ah(env: &Env) -> Outcome {
    let pd = env.pd();
    let ah = env
        .dev
        .create_ah(pd, &env.params().ah_attr(env.gid()))
        .expect("create_ah");
    assert_errno(env.dev.dealloc_pd(pd), EBUSY);
    env.dev.destroy_ah(ah).expect("destroy_ah");
    env.dev.dealloc_pd(pd).expect("dealloc_pd");
    Outcome::Pass
}

fn ud_write(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    let d = dest(env, &p, env.params().qkey, p.b.qpn, env.gid());
    let wr = SendWr::rdma_write(1, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).with_ud(d);
    let e = env.dev.post_send(p.a.qpn, &[wr]).expect_err("posted");
    assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
    Outcome::Pass
}

/// The case's multicast group as a RoCEv2 GID, of the device's address family
/// (::ffff:239.1.2.3 or ff05::239.1.2.3).
fn group(env: &Env) -> Gid {
    env.mcast_gid(std::net::Ipv4Addr::new(239, 1, 2, 3))
}

fn multicast(env: &Env) -> Outcome {
    if let Some(why) = env.no_multicast_delivery() {
        return Outcome::Skip(why);
    }
    let p = env.pair(QpType::Ud);
    let c = env.pair(QpType::Ud).b;
    for q in [p.b.qpn, c.qpn] {
        env.dev
            .attach_mcast(q, &group(env), 0)
            .expect("attach_mcast");
    }
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
    env.post_recv(c.qpn, RecvWr::new(6, vec![c.sge(0, 128)]));
    let d = dest(env, &p, env.params().qkey, 0xFF_FFFF, group(env));
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    assert_eq!(env.poll_one(p.b.cq).wr_id, 5);
    assert_eq!(env.poll_one(c.cq).wr_id, 6);
    Outcome::Pass
}

fn detached(env: &Env) -> Outcome {
    // Where no group is heard, hearing nothing after the detach shows nothing.
    if let Some(why) = env.no_multicast_delivery() {
        return Outcome::Skip(why);
    }
    let p = env.pair(QpType::Ud);
    env.dev
        .attach_mcast(p.b.qpn, &group(env), 0)
        .expect("attach_mcast");
    env.dev
        .detach_mcast(p.b.qpn, &group(env), 0)
        .expect("detach_mcast");
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
    let d = dest(env, &p, env.params().qkey, 0xFF_FFFF, group(env));
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    Outcome::Pass
}

fn attach_rc(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    assert_errno(env.dev.attach_mcast(p.a.qpn, &group(env), 0), EINVAL);
    Outcome::Pass
}

/// The traffic class in the 40 bytes a UD receive buffer starts with: the IPv4 header's
/// TOS byte (bytes 20..40 hold it, after 20 zero bytes) or the IPv6 traffic class.
fn grh_traffic_class(grh: &[u8; 40]) -> u8 {
    if grh[20] >> 4 == 4 && grh[..20].iter().all(|&x| x == 0) {
        grh[21]
    } else {
        (grh[0] << 4) | (grh[1] >> 4)
    }
}

/// A UD SEND through an AH with traffic class `tc`: the receiver's GRH shows `tc`.
pub(super) fn traffic_class(env: &Env, tc: u64) -> Outcome {
    let p = env.pair(QpType::Ud);
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
    let mut attr = env.params().ah_attr(env.gid());
    attr.grh.traffic_class = tc as u8;
    let ah = env.dev.create_ah(p.pd, &attr).expect("create_ah");
    let d = UdDest {
        ah,
        remote_qpn: p.b.qpn,
        remote_qkey: env.params().qkey,
    };
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    let wc = env.poll_one(p.b.cq);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    let mut grh = [0u8; 40];
    p.b.buf.read(0, &mut grh).unwrap();
    assert_eq!(u64::from(grh_traffic_class(&grh)), tc, "GRH {grh:02x?}");
    Outcome::Pass
}

fn missing_qpn(env: &Env) -> Outcome {
    let p = env.pair(QpType::Ud);
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![p.b.sge(0, 128)]));
    // google/rdma-unit-test's number: more than the BTH's 24 bits, whose low 24 name
    // no QP here.
    let missing = 0xDEAD_BEEF;
    assert!(![p.a.qpn, p.b.qpn].contains(&(missing & 0x00FF_FFFF)));
    let d = dest(env, &p, env.params().qkey, missing, env.gid());
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "{wc:?}");
    env.assert_no_completion(p.b.cq, Duration::from_millis(30));
    // The sender's QP still works.
    let d = dest(env, &p, env.params().qkey, p.b.qpn, env.gid());
    env.post_send(
        p.a.qpn,
        SendWr::send(2, vec![p.a.sge(0, 16)]).with_ud(d).signaled(),
    );
    assert_eq!(env.poll_one(p.a.cq).status, WcStatus::Success);
    assert_eq!(env.poll_one(p.b.cq).wr_id, 5);
    Outcome::Pass
}
