//! Data movement (manual 2.1, 3.6.4-3.6.5; IBTA 9.4, 9.5): SEND/RECV (with immediate, SGE
//! lists, inline), RDMA WRITE (with immediate), RDMA READ and atomics, at the sizes
//! around the path MTU, on RC and UC; ordering and fence.

use verbs_api::{QpType, RecvWr, SendFlags, SendWr, WcFlags, WcOpcode, WcStatus, WorkCompletion};

use crate::env::Pair;
use crate::{Case, Env, Outcome};

/// The path MTU of the pairs (`fast_params`: 1024).
const MTU: u64 = 1024;
const SIZES: [(&str, u64); 7] = [
    ("0", 0),
    ("1", 1),
    ("mtu_minus_1", MTU - 1),
    ("mtu", MTU),
    ("mtu_plus_1", MTU + 1),
    ("5_mtu_plus_3", 5 * MTU + 3),
    ("64_kib", 65536),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
}

const OPS: [(Op, &str); 5] = [
    (Op::Send, "send"),
    (Op::SendImm, "send_with_imm"),
    (Op::Write, "rdma_write"),
    (Op::WriteImm, "rdma_write_with_imm"),
    (Op::Read, "rdma_read"),
];

fn encode(t: QpType, op: usize, size: usize) -> u64 {
    (u64::from(t.as_u32()) << 16) | ((op as u64) << 8) | size as u64
}

pub(super) fn register(v: &mut Vec<Case>) {
    for t in [QpType::Rc, QpType::Uc] {
        let tn = if t == QpType::Rc { "rc" } else { "uc" };
        for (oi, (op, on)) in OPS.iter().enumerate() {
            if t == QpType::Uc && *op == Op::Read {
                continue;
            }
            for (si, (sn, _)) in SIZES.iter().enumerate() {
                v.push(Case::param(
                    format!("data::{tn}_{on}_{sn}_bytes"),
                    "manual 2.1 (transport operations), IBTA 9.4: the bytes arrive exactly, segmented by the path MTU (IBTA 9.7), and both ends' completions report the operation, length and immediate data (manual 3.6.10)",
                    one_op,
                    encode(t, oi, si),
                ).wc(WcStatus::Success));
            }
        }
    }
    v.push(Case::new(
        "data::rc_send_gathers_three_sges",
        "IBTA 10.7, manual 2.3.10: a send WR's gather list is sent as one message, in order",
        gather,
    ));
    v.push(Case::new(
        "data::rc_recv_scatters_over_three_sges",
        "IBTA 10.7, manual 2.3.10: a receive WR's scatter list is filled in order",
        scatter,
    ));
    v.push(Case::new("data::rc_send_inline", "manual 3.6.5 IBV_SEND_INLINE: the data is copied at post time; the buffer may be reused at once", inline));
    v.push(Case::new(
        "data::rc_send_zero_sges",
        "manual 3.6.5: a send with no SGE sends a zero-length message",
        zero_sges,
    ));
    v.push(Case::new(
        "data::rc_sends_arrive_in_order",
        "IBTA 9.5: RC delivers messages in order",
        sends_in_order,
    ));
    v.push(Case::new("data::rc_unsignaled_writes_complete_silently", "manual 3.6.5: without IBV_SEND_SIGNALED (and sq_sig_all off) a successful WR generates no completion", unsignaled));
    v.push(Case::new("data::rc_fence_orders_write_after_read", "manual 3.6.5 IBV_SEND_FENCE; IBTA 10.8.3.3: a fenced WR starts only after prior READs and atomics complete", fence));
    v.push(Case::new("data::rc_cmp_swap_equal_swaps", "manual 2.1.5; IBTA 9.4.5: CMP_AND_SWP replaces the word when it equals compare and returns the original", cas_equal));
    v.push(Case::new(
        "data::rc_cmp_swap_unequal_keeps",
        "IBTA 9.4.5: CMP_AND_SWP leaves the word when it differs and returns it",
        cas_unequal,
    ));
    v.push(Case::new(
        "data::rc_fetch_add_adds",
        "manual 2.1.5; IBTA 9.4.5: FETCH_AND_ADD adds and returns the original",
        faa,
    ));
    v.push(Case::new(
        "data::rc_fetch_add_wraps",
        "IBTA 9.4.5: the addition is modulo 2^64",
        faa_wraps,
    ));
    v.push(Case::new("data::rc_write_with_imm_needs_no_buffer", "IBTA 9.4.3: RDMA WRITE with immediate consumes a receive WR whose buffer is not touched; byte_len is the write length", write_imm_no_buffer));
}

fn wc_ok(wc: &WorkCompletion) {
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn one_op(env: &Env, param: u64) -> Outcome {
    let t = QpType::try_from((param >> 16) as u32).unwrap();
    let (op, _) = OPS[((param >> 8) & 0xFF) as usize];
    let (_, size) = SIZES[(param & 0xFF) as usize];
    let p = env.pair(t);
    let len = size as usize;
    let data = pattern(len, 0x40 + (param & 0xFF) as u8);
    let imm = 0xC0DE_0000 | (param as u32 & 0xFFFF);
    let src_off = 64u64;
    let dst_off = 8192 + 3u64;
    // Guard bytes around the destination catch writes out of bounds.
    p.b.buf.fill(0xEE);
    p.a.buf.fill(0xEE);
    if op == Op::Read {
        p.b.buf.write(dst_off as usize, &data).unwrap();
    } else {
        p.a.buf.write(src_off as usize, &data).unwrap();
    }
    let sg = |e: &crate::env::End, off: u64| {
        if len == 0 {
            vec![]
        } else {
            vec![e.sge(off, len as u32)]
        }
    };
    let needs_recv = matches!(op, Op::Send | Op::SendImm | Op::WriteImm);
    if needs_recv {
        let rsg = if op == Op::WriteImm {
            vec![]
        } else {
            vec![p.b.sge(dst_off, (len as u32).max(1))]
        };
        env.post_recv(p.b.qpn, RecvWr::new(77, rsg));
    }
    let wr = match op {
        Op::Send => SendWr::send(1, sg(&p.a, src_off)),
        Op::SendImm => SendWr::send_with_imm(1, sg(&p.a, src_off), imm),
        Op::Write => SendWr::rdma_write(1, sg(&p.a, src_off), p.b.addr(dst_off), p.b.mr.rkey),
        Op::WriteImm => {
            SendWr::rdma_write_with_imm(1, sg(&p.a, src_off), p.b.addr(dst_off), p.b.mr.rkey, imm)
        }
        Op::Read => SendWr::rdma_read(1, sg(&p.a, src_off), p.b.addr(dst_off), p.b.mr.rkey),
    };
    env.post_send(p.a.qpn, wr.signaled());
    let swc = env.poll_one(p.a.cq);
    wc_ok(&swc);
    assert_eq!(swc.wr_id, 1);
    let expect_op = match op {
        Op::Send | Op::SendImm => WcOpcode::Send,
        Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
        Op::Read => WcOpcode::RdmaRead,
    };
    assert_eq!(swc.opcode, expect_op, "{swc:?}");
    if op == Op::Read {
        assert_eq!(swc.byte_len as usize, len, "{swc:?}");
    }
    if needs_recv {
        let rwc = env.poll_one(p.b.cq);
        wc_ok(&rwc);
        assert_eq!(
            (rwc.wr_id, rwc.byte_len as usize, rwc.qp_num),
            (77, len, p.b.qpn),
            "{rwc:?}"
        );
        let want = if op == Op::WriteImm {
            WcOpcode::RecvRdmaWithImm
        } else {
            WcOpcode::Recv
        };
        assert_eq!(rwc.opcode, want, "{rwc:?}");
        let has_imm = matches!(op, Op::SendImm | Op::WriteImm);
        assert_eq!(rwc.wc_flags.contains(WcFlags::WITH_IMM), has_imm, "{rwc:?}");
        if has_imm {
            assert_eq!(rwc.imm_data, imm);
        }
    }
    // Check the target bytes and the guards around them. A UC WRITE completes at the
    // requester when sent (IBTA 9.8: UC has no acknowledgement), so its bytes may
    // arrive a little later.
    let (target, off) = if op == Op::Read {
        (&p.a, src_off)
    } else {
        (&p.b, dst_off)
    };
    let mut got = vec![0u8; len + 2];
    let deadline = std::time::Instant::now() + crate::env::WAIT;
    loop {
        target.buf.read(off as usize - 1, &mut got).unwrap();
        if got[1..=len] == data[..] || std::time::Instant::now() > deadline {
            break;
        }
        // Polling the (empty) receive CQ lets a device on virtual time move on.
        env.assert_no_completion(p.b.cq, std::time::Duration::from_micros(100));
    }
    assert_eq!(got[0], 0xEE, "byte before the target was written");
    assert_eq!(got[len + 1], 0xEE, "byte after the target was written");
    assert!(got[1..=len] == data[..], "payload differs");
    Outcome::Pass
}

fn gather(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.a.buf.write(0, b"hello ").unwrap();
    p.a.buf.write(100, b"rdma ").unwrap();
    p.a.buf.write(5000, b"world").unwrap();
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![p.b.sge(0, 64)]));
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 6), p.a.sge(100, 5), p.a.sge(5000, 5)]).signaled(),
    );
    wc_ok(&env.poll_one(p.a.cq));
    let wc = env.poll_one(p.b.cq);
    assert_eq!(wc.byte_len, 16);
    let mut got = [0u8; 16];
    p.b.buf.read(0, &mut got).unwrap();
    assert_eq!(&got, b"hello rdma world");
    Outcome::Pass
}

fn scatter(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let data = pattern(3000, 9);
    p.a.buf.write(0, &data).unwrap();
    env.post_recv(
        p.b.qpn,
        RecvWr::new(
            2,
            vec![
                p.b.sge(0, 1000),
                p.b.sge(10_000, 1500),
                p.b.sge(20_000, 4000),
            ],
        ),
    );
    env.post_send(p.a.qpn, SendWr::send(1, vec![p.a.sge(0, 3000)]).signaled());
    wc_ok(&env.poll_one(p.a.cq));
    assert_eq!(env.poll_one(p.b.cq).byte_len, 3000);
    let mut got = vec![0u8; 3000];
    p.b.buf.read(0, &mut got[..1000]).unwrap();
    p.b.buf.read(10_000, &mut got[1000..2500]).unwrap();
    p.b.buf.read(20_000, &mut got[2500..]).unwrap();
    assert!(got == data);
    Outcome::Pass
}

fn inline(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.a.buf.write(0, &[0x11; 48]).unwrap();
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![p.b.sge(0, 64)]));
    env.post_send(
        p.a.qpn,
        SendWr::send(1, vec![p.a.sge(0, 48)]).with_flags(SendFlags::INLINE | SendFlags::SIGNALED),
    );
    // The data was taken at post time: changing the buffer now changes nothing.
    p.a.buf.write(0, &[0x22; 48]).unwrap();
    wc_ok(&env.poll_one(p.a.cq));
    assert_eq!(env.poll_one(p.b.cq).byte_len, 48);
    let mut got = [0u8; 48];
    p.b.buf.read(0, &mut got).unwrap();
    assert_eq!(got, [0x11; 48]);
    Outcome::Pass
}

fn zero_sges(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    env.post_recv(p.b.qpn, RecvWr::new(2, vec![]));
    env.post_send(p.a.qpn, SendWr::send(1, vec![]).signaled());
    wc_ok(&env.poll_one(p.a.cq));
    let wc = env.poll_one(p.b.cq);
    wc_ok(&wc);
    assert_eq!(wc.byte_len, 0);
    Outcome::Pass
}

fn sends_in_order(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    for i in 0..32u64 {
        env.post_recv(p.b.qpn, RecvWr::new(100 + i, vec![p.b.sge(i * 2048, 2048)]));
    }
    for i in 0..32u64 {
        p.a.buf
            .write((i * 2048) as usize, &pattern(1500, i as u8))
            .unwrap();
        env.post_send(
            p.a.qpn,
            SendWr::send(i, vec![p.a.sge(i * 2048, 1500)]).signaled(),
        );
    }
    for i in 0..32u64 {
        let wc = env.poll_one(p.b.cq);
        assert_eq!(wc.wr_id, 100 + i);
        let mut got = vec![0u8; 1500];
        p.b.buf.read((i * 2048) as usize, &mut got).unwrap();
        assert!(got == pattern(1500, i as u8), "message {i} differs");
    }
    for i in 0..32u64 {
        assert_eq!(env.poll_one(p.a.cq).wr_id, i);
    }
    Outcome::Pass
}

fn unsignaled(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    for i in 0..4u64 {
        env.post_send(
            p.a.qpn,
            SendWr::rdma_write(i, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey),
        );
    }
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(9, vec![p.a.sge(0, 64)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    let wc = env.poll_one(p.a.cq);
    assert_eq!(wc.wr_id, 9, "an unsignaled WR completed: {wc:?}");
    env.assert_no_completion(p.a.cq, std::time::Duration::from_millis(20));
    Outcome::Pass
}

fn fence(env: &Env) -> Outcome {
    let p: Pair = env.pair(QpType::Rc);
    // READ b[0..8] into a[0..8], then a fenced WRITE of a[0..8] to b[100..108]: the
    // write must carry what the READ brought.
    p.b.buf.write(0, &[0x5A; 8]).unwrap();
    p.a.buf.write(0, &[0; 8]).unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_read(1, vec![p.a.sge(0, 8)], p.b.addr(0), p.b.mr.rkey).signaled(),
    );
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(2, vec![p.a.sge(0, 8)], p.b.addr(100), p.b.mr.rkey)
            .with_flags(SendFlags::FENCE | SendFlags::SIGNALED),
    );
    assert_eq!(env.poll_one(p.a.cq).wr_id, 1);
    assert_eq!(env.poll_one(p.a.cq).wr_id, 2);
    let mut got = [0u8; 8];
    p.b.buf.read(100, &mut got).unwrap();
    assert_eq!(got, [0x5A; 8]);
    Outcome::Pass
}

fn atomic(env: &Env, p: &Pair, wr: SendWr) -> (u64, u64) {
    env.post_send(p.a.qpn, wr.signaled());
    let wc = env.poll_one(p.a.cq);
    wc_ok(&wc);
    assert_eq!(wc.byte_len, 8, "{wc:?}");
    (p.a.buf.read_u64(0).unwrap(), p.b.buf.read_u64(64).unwrap())
}

fn cas_equal(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.write_u64(64, 5).unwrap();
    let wr = SendWr::atomic_cmp_swp(1, p.a.sge(0, 8), p.b.addr(64), p.b.mr.rkey, 5, 99);
    assert_eq!(atomic(env, &p, wr), (5, 99));
    Outcome::Pass
}

fn cas_unequal(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.write_u64(64, 6).unwrap();
    let wr = SendWr::atomic_cmp_swp(1, p.a.sge(0, 8), p.b.addr(64), p.b.mr.rkey, 5, 99);
    assert_eq!(atomic(env, &p, wr), (6, 6));
    Outcome::Pass
}

fn faa(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.write_u64(64, 41).unwrap();
    let wr = SendWr::atomic_fetch_add(1, p.a.sge(0, 8), p.b.addr(64), p.b.mr.rkey, 1);
    assert_eq!(atomic(env, &p, wr), (41, 42));
    Outcome::Pass
}

fn faa_wraps(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.write_u64(64, u64::MAX).unwrap();
    let wr = SendWr::atomic_fetch_add(1, p.a.sge(0, 8), p.b.addr(64), p.b.mr.rkey, 2);
    assert_eq!(atomic(env, &p, wr), (u64::MAX, 1));
    Outcome::Pass
}

fn write_imm_no_buffer(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.a.buf.write(0, &[3; 100]).unwrap();
    env.post_recv(p.b.qpn, RecvWr::new(5, vec![]));
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write_with_imm(1, vec![p.a.sge(0, 100)], p.b.addr(500), p.b.mr.rkey, 7)
            .signaled(),
    );
    wc_ok(&env.poll_one(p.a.cq));
    let wc = env.poll_one(p.b.cq);
    assert_eq!(
        (wc.status, wc.byte_len, wc.imm_data),
        (WcStatus::Success, 100, 7),
        "{wc:?}"
    );
    Outcome::Pass
}
