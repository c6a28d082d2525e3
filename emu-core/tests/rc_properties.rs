//! Property: for arbitrary message sizes and opcode mixes and arbitrary seeded
//! schedules of drop, duplication and reordering, every RC message is delivered exactly
//! once, in order, byte-exact, with successful completions; or, when the losses exceed
//! the retry budget, the requester completes with RETRY_EXC_ERR, everything after it is
//! flushed, and the responder has executed a prefix of the posted messages, in order,
//! each once, touching no byte outside them (IBTA 9.7: RC executes in PSN order).
//!
//! 1,000 cases by default; set `PROPTEST_CASES` for more.

mod util;

use std::time::Duration;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use util::*;
use verbs_api::{Mtu, SendFlags, SendWr, WcOpcode, WcStatus, WrOperation};

const SLOT: usize = 4096;
const COUNTER: usize = 0; // B's FETCH_ADD target, in the first slot

#[derive(Clone, Copy, Debug)]
enum Op {
    Send(usize),
    Write(usize),
    WriteImm(usize),
    Read(usize),
    FetchAdd,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..SLOT).prop_map(Op::Send),
        (0..SLOT).prop_map(Op::Write),
        (0..SLOT).prop_map(Op::WriteImm),
        (0..SLOT).prop_map(Op::Read),
        Just(Op::FetchAdd),
    ]
}

#[derive(Clone, Copy, Debug)]
struct Faults {
    seed: u64,
    drop: f64,
    dup: f64,
    delay: f64,
}

fn faults() -> impl Strategy<Value = Faults> {
    (
        any::<u64>(),
        prop_oneof![Just(0.0), 0.0..0.15, 0.3..0.7],
        0.0..0.2,
        0.0..0.3,
    )
        .prop_map(|(seed, drop, dup, delay)| Faults {
            seed,
            drop,
            dup,
            delay,
        })
}

fn run(ops: &[Op], mtu: Mtu, f: Faults) -> Result<(), TestCaseError> {
    let slots = ops.len() + 1;
    let cfg = Config {
        mtu,
        buf_len: SLOT * slots,
        timeout: 8, // ~1 ms
        retry_cnt: 7,
        cap: verbs_api::QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 0,
        },
        ..Config::default()
    };
    let (mut p, a, b) = connected(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(f.seed);
    p.set_rule(move |_, _, _| {
        let x: f64 = rng.gen();
        if x < f.drop {
            Action::Drop
        } else if x < f.drop + f.dup {
            Action::Duplicate
        } else if x < f.drop + f.dup + f.delay {
            Action::Delay(Duration::from_micros(rng.gen_range(1..40)))
        } else {
            Action::Deliver
        }
    });
    // Slot i+1 of each buffer belongs to op i.
    let mut expected_recv = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let slot = (i + 1) * SLOT;
        let data = pattern(SLOT, i as u8);
        a.write_bytes(slot, &data);
        b.write_bytes(slot, &pattern(SLOT, 100 + i as u8));
        let (wr_op, len) = match *op {
            Op::Send(len) => {
                b.post_recv(&mut p, i as u64, slot as u64, SLOT as u32);
                expected_recv.push(i);
                (WrOperation::Send, len)
            }
            Op::Write(len) => (
                WrOperation::RdmaWrite {
                    remote_addr: b.mr.addr + slot as u64,
                    rkey: b.mr.rkey,
                },
                len,
            ),
            Op::WriteImm(len) => {
                b.post_recv(&mut p, i as u64, 0, 0);
                expected_recv.push(i);
                (
                    WrOperation::RdmaWriteWithImm {
                        remote_addr: b.mr.addr + slot as u64,
                        rkey: b.mr.rkey,
                        imm_data: i as u32,
                    },
                    len,
                )
            }
            Op::Read(len) => (
                WrOperation::RdmaRead {
                    remote_addr: b.mr.addr + slot as u64,
                    rkey: b.mr.rkey,
                },
                len,
            ),
            Op::FetchAdd => (
                WrOperation::AtomicFetchAndAdd {
                    remote_addr: b.mr.addr + COUNTER as u64,
                    rkey: b.mr.rkey,
                    add: 1,
                },
                8,
            ),
        };
        a.post_send(
            &mut p,
            SendWr {
                wr_id: i as u64,
                sg_list: vec![a.sge(slot as u64, len as u32)].into(),
                op: wr_op,
                send_flags: SendFlags::SIGNALED,
                ud: None,
                xrc_remote_srqn: None,
            },
        );
    }
    p.drive();

    let sc = a.poll(&mut p);
    prop_assert_eq!(sc.len(), ops.len(), "every send WR completes");
    prop_assert!(
        sc.iter().enumerate().all(|(i, w)| w.wr_id == i as u64),
        "send completions in posting order"
    );
    let failed = sc.iter().position(|w| w.status != WcStatus::Success);
    if let Some(k) = failed {
        prop_assert_eq!(
            sc[k].status,
            WcStatus::RetryExcErr,
            "only retry exhaustion can fail here (wr {})",
            k
        );
        prop_assert!(sc[k + 1..].iter().all(|w| w.status == WcStatus::WrFlushErr));
    }
    let ok = failed.unwrap_or(ops.len());

    // RC executes in order: what the responder executed is a prefix of what was
    // posted. Everything before the failure executed; the failed WR and those after it
    // may have executed too (their ACKs lost), whole or (the first unfinished one) in
    // part, but never out of order, never twice, never outside their ranges.
    let rc = b.poll(&mut p);
    let delivered: Vec<usize> = rc
        .iter()
        .filter(|w| w.status == WcStatus::Success)
        .map(|w| w.wr_id as usize)
        .collect();
    prop_assert!(
        expected_recv.starts_with(&delivered),
        "receives complete in order, once each: {:?} of {:?}",
        delivered,
        expected_recv
    );
    let must = expected_recv.iter().filter(|&&i| i < ok).count();
    prop_assert!(
        delivered.len() >= must,
        "every receive before the failure completes: {:?}, need {}",
        delivered,
        must
    );
    let mut adds = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let slot = (i + 1) * SLOT;
        let executed = i < ok;
        match *op {
            Op::Send(len) | Op::Write(len) | Op::WriteImm(len) => {
                let got = b.read_bytes(slot, SLOT);
                let sent = pattern(SLOT, i as u8);
                let orig = pattern(SLOT, 100 + i as u8);
                if executed {
                    prop_assert!(got[..len] == sent[..len], "op {} payload differs", i);
                } else {
                    let clean = (0..len).all(|j| got[j] == sent[j] || got[j] == orig[j]);
                    prop_assert!(
                        clean,
                        "op {} after the failure left bytes that are neither old nor sent",
                        i
                    );
                }
                prop_assert!(got[len..] == orig[len..], "op {} wrote past its length", i);
                if let Some(wc) = rc
                    .iter()
                    .find(|w| w.wr_id == i as u64 && w.status == WcStatus::Success)
                {
                    prop_assert!(
                        got[..len] == sent[..len],
                        "op {} completed but its data differs",
                        i
                    );
                    match op {
                        Op::Send(_) => prop_assert_eq!(wc.byte_len as usize, len),
                        _ => prop_assert_eq!(
                            (wc.opcode, wc.imm_data),
                            (WcOpcode::RecvRdmaWithImm, i as u32)
                        ),
                    }
                }
            }
            Op::Read(len) => {
                if executed {
                    prop_assert!(
                        a.read_bytes(slot, len) == pattern(SLOT, 100 + i as u8)[..len],
                        "READ {} data differs",
                        i
                    );
                }
            }
            Op::FetchAdd => {
                if executed {
                    prop_assert_eq!(
                        a.buf.read_u64(slot).unwrap(),
                        adds,
                        "FETCH_ADD {} saw every earlier add once",
                        i
                    );
                    adds += 1;
                }
            }
        }
    }
    let counter = b.buf.read_u64(COUNTER).unwrap();
    let later = ops[ok..]
        .iter()
        .filter(|o| matches!(o, Op::FetchAdd))
        .count() as u64;
    prop_assert!(
        counter >= adds && counter <= adds + later,
        "atomics executed at most once: {} vs {}..={}",
        counter,
        adds,
        adds + later
    );
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 200, ..ProptestConfig::default() })]

    #[test]
    fn rc_delivers_exactly_once_in_order_or_fails_cleanly(
        ops in proptest::collection::vec(op(), 1..10),
        mtu in prop_oneof![Just(Mtu::Mtu256), Just(Mtu::Mtu1024), Just(Mtu::Mtu4096)],
        f in faults(),
    ) {
        run(&ops, mtu, f)?;
    }
}
