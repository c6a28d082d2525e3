//! Traffic: many QPs carrying a long random mix of operations at once, every byte and
//! every atomic result checked (IBTA 9.4 and 10.7: SEND, RDMA WRITE, RDMA READ and the
//! atomics deliver their data exactly; 9.5: an RC or UC send queue completes in order;
//! 9.7.4: messages longer than the path MTU are segmented). rdma-core's
//! `tests/test_rdmacm.py` traffic and google/rdma-unit-test's `loopback_test.cc` do the
//! same on fewer QPs.
//!
//! The mix is drawn from a seeded generator: `TRAFFIC_SEED=<n>` replays a run, and a
//! failure names its seed. In the suite the emulator runs 100 QPs x 240 operations and
//! hardware (kernel rxe in a VM, a software device on an emulated CPU) 100 QPs x 40, so
//! that the fabric suite stays under a minute and the VM step within its budget; the
//! full 100 QPs x 10,000 operations of each mix run on the fabric and over UDP as the
//! `traffic_full_*` tests of this crate's `stress.rs` ([`run_mix`]).

use std::time::{SystemTime, UNIX_EPOCH};

use verbs_api::{Mtu, QpCap, QpType, RecvWr, SendWr, WcOpcode, WcStatus as S, WorkCompletion};

use crate::env::{default_cap, Pair};
use crate::{Case, Env, Outcome};

/// Requester QPs of a run (each with a responder of its own).
const QPS: usize = 100;

/// Operations per requester QP on the emulator, in the suite.
const EMU_OPS: usize = 240;

/// Operations per requester QP on hardware, in the suite.
const HW_OPS: usize = 40;

/// Operations per requester QP of the full run ([`run_mix`]).
pub const FULL_OPS: usize = 10_000;

/// Operations each QP has in flight at once (one buffer slot each).
const WINDOW: usize = 8;

/// Bytes of one slot: the longest message.
const SLOT: u64 = 16 << 10;

/// Where the atomic words (responder) and their results (requester) are: after the slots.
const WORDS: u64 = WINDOW as u64 * SLOT;

/// What a run uses: the transport and how many threads drive the QPs.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    qp_type: QpType,
    threads: usize,
}

/// The mixes, by name: RC with every operation, UC, and RC from four threads.
pub const MIXES: [(&str, Mix); 3] = [
    (
        "rc_mixed_ops_on_100_qps",
        Mix {
            qp_type: QpType::Rc,
            threads: 1,
        },
    ),
    (
        "uc_sends_and_writes_on_100_qps",
        Mix {
            qp_type: QpType::Uc,
            threads: 1,
        },
    ),
    (
        "rc_mixed_ops_on_100_qps_from_4_threads",
        Mix {
            qp_type: QpType::Rc,
            threads: 4,
        },
    ),
];

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::param("traffic::rc_mixed_ops_on_100_qps", "IBTA 9.4, 10.7 (SEND, SEND with immediate, RDMA WRITE with and without immediate, RDMA READ, Fetch&Add, Compare&Swap deliver exactly), 9.5 (in-order completion), 9.7.4 (segmentation by path MTU), manual 3.6.5, 3.6.10: 100 RC pairs, each with a random path MTU, run 240 random operations each (hardware: 40; the full 10,000 each: the traffic_full test) of random length up to 16 KiB, eight in flight per QP; every WR completes in order with its opcode, every byte arrives, every atomic returns the value a model of the word predicts", traffic, 0).wc(S::Success));
    v.push(Case::param("traffic::uc_sends_and_writes_on_100_qps", "IBTA 9.4, 9.5, 9.7.4, manual 2.2 (UC: SEND and RDMA WRITE, with and without immediate): 100 UC pairs with random path MTUs run 240 random operations each (hardware: 40; the full 10,000 each: the traffic_full test) of random length up to 16 KiB on a lossless link; every WR completes in order and every byte arrives", traffic, 1).wc(S::Success));
    v.push(Case::param("traffic::rc_mixed_ops_on_100_qps_from_4_threads", "ibv_alloc_td(3) (verbs objects are safe for multi-threaded access), IBTA 9.4, 9.5, 10.7: the RC mix on 100 pairs driven by four threads at once, 25 pairs each, 240 operations a pair (hardware: 40; the full 10,000: the traffic_full test)", traffic, 2).wc(S::Success));
}

/// splitmix64: a small seeded generator (the suite needs no statistical quality, only
/// replayable variety).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A message length: often within a packet, sometimes many packets, now and then 0.
    fn len(&mut self) -> u32 {
        match self.below(8) {
            0 => 0,
            1..=4 => self.below(512) as u32 + 1,
            5 | 6 => self.below(4096) as u32 + 1,
            _ => self.below(SLOT) as u32 + 1,
        }
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// The seed of a run: `TRAFFIC_SEED` if set, else the clock.
fn seed() -> u64 {
    std::env::var("TRAFFIC_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// The operations of the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwap,
}

const RC_OPS: [Op; 7] = [
    Op::Send,
    Op::SendImm,
    Op::Write,
    Op::WriteImm,
    Op::Read,
    Op::FetchAdd,
    Op::CmpSwap,
];
const UC_OPS: [Op; 4] = [Op::Send, Op::SendImm, Op::Write, Op::WriteImm];

/// One QP pair of a run and the model of its atomic words.
struct Flow {
    p: Pair,
    qp_type: QpType,
    mtu: Mtu,
    words: [u64; WINDOW],
}

/// What one posted operation must produce.
struct Expect {
    op: Op,
    len: u32,
    /// The bytes that must arrive (SEND, WRITE: at the responder; READ: at the requester).
    data: Vec<u8>,
    imm: u32,
    /// The atomic's original value the requester must get back.
    original: u64,
}

/// Whether `op` consumes a receive WR (and so completes at the responder).
fn consumes_recv(op: Op) -> bool {
    matches!(op, Op::Send | Op::SendImm | Op::WriteImm)
}

fn op_name(op: Op) -> WcOpcode {
    match op {
        Op::Send | Op::SendImm => WcOpcode::Send,
        Op::Write | Op::WriteImm => WcOpcode::RdmaWrite,
        Op::Read => WcOpcode::RdmaRead,
        Op::FetchAdd => WcOpcode::FetchAdd,
        Op::CmpSwap => WcOpcode::CompSwap,
    }
}

/// Posts one window of random operations on `f` and returns what each must produce.
fn post_window(env: &Env, f: &mut Flow, rng: &mut Rng, ops: &[Op]) -> Vec<Expect> {
    let p = &f.p;
    let mut out = Vec::with_capacity(WINDOW);
    let mut sends = Vec::with_capacity(WINDOW);
    for j in 0..WINDOW {
        let mut op = ops[rng.below(ops.len() as u64) as usize];
        // A UC requester completes a WR once it is sent, not when it arrives: the
        // window ends with a message the responder completes, which arrives after
        // every other of the window (in order), so the data can be checked then.
        if f.qp_type == QpType::Uc && j == WINDOW - 1 && !consumes_recv(op) {
            op = Op::SendImm;
        }
        let at = j as u64 * SLOT;
        let atomic = matches!(op, Op::FetchAdd | Op::CmpSwap);
        let len = if atomic { 8 } else { rng.len() };
        let data = if atomic {
            Vec::new()
        } else {
            rng.bytes(len as usize)
        };
        let imm = rng.next() as u32;
        let mut original = 0;
        let word = WORDS + j as u64 * 8;
        let wr = match op {
            Op::Send | Op::SendImm | Op::Write | Op::WriteImm => {
                p.a.buf.write(at as usize, &data).unwrap();
                let sge = vec![p.a.sge(at, len)];
                match op {
                    Op::Send => SendWr::send(j as u64, sge),
                    Op::SendImm => SendWr::send_with_imm(j as u64, sge, imm),
                    Op::Write => SendWr::rdma_write(j as u64, sge, p.b.addr(at), p.b.mr.rkey),
                    _ => SendWr::rdma_write_with_imm(j as u64, sge, p.b.addr(at), p.b.mr.rkey, imm),
                }
            }
            Op::Read => {
                p.b.buf.write(at as usize, &data).unwrap();
                SendWr::rdma_read(j as u64, vec![p.a.sge(at, len)], p.b.addr(at), p.b.mr.rkey)
            }
            Op::FetchAdd => {
                let add = rng.next();
                original = f.words[j];
                f.words[j] = original.wrapping_add(add);
                SendWr::atomic_fetch_add(
                    j as u64,
                    p.a.sge(word, 8),
                    p.b.addr(word),
                    p.b.mr.rkey,
                    add,
                )
            }
            Op::CmpSwap => {
                // Half the time the compare matches.
                let hit = rng.below(2) == 0;
                let compare = if hit { f.words[j] } else { !f.words[j] };
                let swap = rng.next();
                original = f.words[j];
                if hit {
                    f.words[j] = swap;
                }
                SendWr::atomic_cmp_swp(
                    j as u64,
                    p.a.sge(word, 8),
                    p.b.addr(word),
                    p.b.mr.rkey,
                    compare,
                    swap,
                )
            }
        };
        if consumes_recv(op) {
            // The receive for this message lands in the responder's slot j.
            let sg = if op == Op::WriteImm {
                vec![]
            } else {
                vec![p.b.sge(at, SLOT as u32)]
            };
            env.post_recv(p.b.qpn, RecvWr::new(j as u64, sg));
        }
        sends.push(wr.signaled());
        out.push(Expect {
            op,
            len,
            data,
            imm,
            original,
        });
    }
    env.dev
        .post_send(p.a.qpn, &sends)
        .unwrap_or_else(|e| panic!("post_send: {e:?}"));
    out
}

/// Waits for the window's completions on `f` and checks them and the data.
fn check_window(env: &Env, f: &Flow, exp: &[Expect], round: usize) {
    let p = &f.p;
    let ctx =
        |wc: &WorkCompletion| format!("QP {} (MTU {:?}) round {round}: {wc:?}", p.a.qpn, f.mtu);
    for (j, e) in exp.iter().enumerate() {
        let wc = env.poll_one(p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (j as u64, S::Success, op_name(e.op)),
            "{} (expected {:?})",
            ctx(&wc),
            e.op
        );
    }
    // The responder's completions, in order; then the data, all of which has arrived.
    for (j, e) in exp.iter().enumerate() {
        if consumes_recv(e.op) {
            let wc = env.poll_one(p.b.cq);
            let (opcode, imm) = match e.op {
                Op::Send => (WcOpcode::Recv, None),
                Op::SendImm => (WcOpcode::Recv, Some(e.imm)),
                _ => (WcOpcode::RecvRdmaWithImm, Some(e.imm)),
            };
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
                (j as u64, S::Success, opcode, e.len),
                "receive: {}",
                ctx(&wc)
            );
            if let Some(imm) = imm {
                assert_eq!(wc.imm_data, imm, "immediate: {}", ctx(&wc));
            }
        }
    }
    for (j, e) in exp.iter().enumerate() {
        let at = j as u64 * SLOT;
        let (buf, what) = match e.op {
            Op::Read => (&p.a.buf, "READ"),
            Op::FetchAdd | Op::CmpSwap => {
                let got = p.a.buf.read_u64((WORDS + j as u64 * 8) as usize).unwrap();
                assert_eq!(
                    got, e.original,
                    "QP {} round {round} WR {j}: {:?} returned {got:#x}, the word held {:#x}",
                    p.a.qpn, e.op, e.original
                );
                continue;
            }
            _ => (&p.b.buf, "SEND/WRITE"),
        };
        let mut got = vec![0u8; e.len as usize];
        buf.read(at as usize, &mut got).unwrap();
        if got != e.data {
            let first = got
                .iter()
                .zip(&e.data)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "QP {} (MTU {:?}) round {round} WR {j} {:?} ({what}) of {} bytes differs from byte {first}",
                p.a.qpn, f.mtu, e.op, e.len
            );
        }
    }
}

/// Runs `rounds` windows on each of `flows`, posting a window on every flow before
/// checking any (so all QPs carry traffic at once).
fn drive(env: &Env, flows: &mut [Flow], rounds: usize, rng: &mut Rng, ops: &[Op]) {
    for round in 0..rounds {
        let exp: Vec<_> = flows
            .iter_mut()
            .map(|f| post_window(env, f, rng, ops))
            .collect();
        for (f, e) in flows.iter().zip(&exp) {
            check_window(env, f, e, round);
        }
    }
    // The atomic words hold what the model says.
    for f in flows.iter() {
        for (j, &w) in f.words.iter().enumerate() {
            assert_eq!(
                f.p.b.buf.read_u64((WORDS + j as u64 * 8) as usize).unwrap(),
                w,
                "QP {} atomic word {j}",
                f.p.b.qpn
            );
        }
    }
}

/// A pair of `qp_type` with a random path MTU up to the port's.
fn flow(env: &Env, qp_type: QpType, rng: &mut Rng) -> Flow {
    let active = env.dev.query_port(1).expect("query_port").active_mtu;
    let mtus = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];
    let fits: Vec<_> = mtus
        .into_iter()
        .filter(|m| m.as_u32() <= active.as_u32())
        .collect();
    let mtu = fits[rng.below(fits.len() as u64) as usize];
    let mut params = env.params();
    params.path_mtu = mtu;
    // 100 busy QPs on a device in a debug build (or in a VM) answer slowly: an ACK
    // timeout of 4 ms (the suite's default) would run out the retries; 1 s per try.
    params.timeout = 18;
    let cap = QpCap {
        max_send_wr: WINDOW as u32,
        max_recv_wr: WINDOW as u32,
        ..default_cap()
    };
    let p = env.pair_with(qp_type, &params, cap, 2 * WINDOW as u32);
    Flow {
        p,
        qp_type,
        mtu,
        words: [0; WINDOW],
    }
}

fn traffic(env: &Env, which: u64) -> Outcome {
    let per_qp = if env.emulator { EMU_OPS } else { HW_OPS };
    run_mix(env, which as usize, per_qp);
    Outcome::Pass
}

/// Runs mix `which` of [`MIXES`] on `env`: 100 pairs, `per_qp` operations each (a
/// multiple of the window of 8), with the seed of `TRAFFIC_SEED` or the clock; panics
/// with the seed on any failure.
pub fn run_mix(env: &Env, which: usize, per_qp: usize) {
    let (name, mix) = MIXES[which];
    let seed = seed();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(env, mix, seed, per_qp)));
    if let Err(p) = r {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        panic!("traffic::{name} with seed {seed} (replay: TRAFFIC_SEED={seed}): {msg}");
    }
}

fn run(env: &Env, mix: Mix, seed: u64, per_qp: usize) {
    let ops: &'static [Op] = if mix.qp_type == QpType::Rc {
        &RC_OPS
    } else {
        &UC_OPS
    };
    let rounds = per_qp / WINDOW;
    let per_thread = QPS / mix.threads;
    env.on_threads(
        mix.threads,
        std::time::Duration::from_secs(300),
        move |env, t| {
            let mut rng = Rng(seed ^ (t as u64).wrapping_mul(0x9E37_79B9));
            let mut flows: Vec<_> = (0..per_thread)
                .map(|_| flow(env, mix.qp_type, &mut rng))
                .collect();
            drive(env, &mut flows, rounds, &mut rng, ops);
        },
    );
}
