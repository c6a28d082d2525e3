//! RDMA ATOMIC WRITE and FLUSH (IBTA 1.5; kernel rxe since Linux 6.2): an ATOMIC WRITE
//! places its 8 bytes as one unit with remote write access; a FLUSH makes a range or a
//! whole region globally visible (or persistent) once every earlier write landed, with
//! the region's FLUSH access for its placement type. Bad cases complete with the
//! remote error and write not one byte.
//!
//! A device that does not report the capability (`IB_UVERBS_DEVICE_ATOMIC_WRITE`,
//! `_FLUSH_GLOBAL` in `device_cap_flags_ex`; kernel rxe before 6.2, or a backend that
//! cannot post the operations) skips these cases.

use verbs_api::{
    AccessFlags as A, DeviceCapFlagsEx as X, FlushLevel, FlushPlacement, QpType, SendFlags, SendWr,
    WcOpcode, WcStatus as S, WorkCompletion,
};

use super::{assert_untouched, UNTOUCHED};
use crate::env::{default_cap, Pair};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new("atomic_write::rc_places_8_bytes", "IBTA 1.5 (RDMA ATOMIC WRITE): the 8 bytes of the request land at the remote address as given, the bytes around them untouched; the WR completes with IBV_WC_ATOMIC_WRITE", places_8_bytes).wc(S::Success));
    v.push(Case::new("atomic_write::rc_misaligned_is_rem_inv_req_err", "IBTA 1.5 (ATOMIC WRITE, like the atomics of 9.4.5, targets an 8-byte aligned address): a misaligned one is an invalid request, REM_INV_REQ_ERR, and writes nothing (kernel rxe: misaligned atomic NAK)", misaligned).wc(S::RemInvReqErr));
    v.push(Case::new("atomic_write::rc_without_remote_write_is_rem_access_err", "IBTA 1.5, 9.7.4.1.3: an ATOMIC WRITE needs remote write access to the region (REMOTE_ATOMIC is not enough; kernel rxe checks REMOTE_WRITE): REM_ACCESS_ERR, nothing written", without_remote_write).wc(S::RemAccessErr));
    v.push(Case::new("atomic_write::rc_lands_after_an_earlier_write_to_the_word", "IBTA 1.5, 9.5 (RC executes requests in order): an ATOMIC WRITE posted after an RDMA WRITE to the same 8 bytes leaves its own value there", after_a_write).wc(S::Success));
    v.push(Case::new("atomic_write::rc_with_an_unknown_rkey_is_rem_access_err", "IBTA 1.5, 9.7.4.1.3: an R_Key that names no region is a remote access error: REM_ACCESS_ERR, nothing written", unknown_rkey).wc(S::RemAccessErr));
    v.push(Case::new("flush::rc_range_after_writes_completes", "IBTA 1.5 (RDMA FLUSH): a FLUSH of a range to global visibility, posted after RDMA WRITEs to it, completes with IBV_WC_FLUSH once they landed; the written bytes are in place", range_after_writes).wc(S::Success));
    v.push(Case::new("flush::rc_region_level_ignores_the_range", "IBTA 1.5 FETH selectivity level 1 (memory region): only the R_Key is checked, not the RETH's address and length; the FLUSH completes", region_level).wc(S::Success));
    v.push(Case::new("flush::rc_range_past_the_region_is_rem_access_err", "IBTA 1.5 FETH selectivity level 0 (memory range), 9.7.4.1.3: the range must lie in the region: REM_ACCESS_ERR", range_past_region).wc(S::RemAccessErr));
    v.push(Case::new("flush::rc_region_without_flush_access_is_rem_access_err", "IBTA 1.5: the region must be registered with the FLUSH access of the placement type (IBV_ACCESS_FLUSH_GLOBAL); without it REM_ACCESS_ERR", without_flush_access).wc(S::RemAccessErr));
}

/// Skips unless the device reports `cap` (kernel rxe before 6.2 does not).
fn needs(env: &Env, cap: X) -> Option<Outcome> {
    let attr = env.dev.query_device().expect("query_device");
    (!attr.device_cap_flags_ex.contains(cap)).then(|| {
        Outcome::Skip(format!(
            "the device does not report {cap:?} in device_cap_flags_ex (kernel rxe has it \
             since Linux 6.2)"
        ))
    })
}

/// A connected RC pair whose QPs also allow FLUSH to global visibility.
fn flush_pair(env: &Env) -> Pair {
    let mut params = env.params();
    params.access |= A::FLUSH_GLOBAL;
    env.pair_with(QpType::Rc, &params, default_cap(), 64)
}

fn signaled(env: &Env, p: &Pair, wr: SendWr) -> WorkCompletion {
    env.post_send(p.a.qpn, wr.with_flags(SendFlags::SIGNALED));
    env.poll_one(p.a.cq)
}

fn places_8_bytes(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::ATOMIC_WRITE) {
        return skip;
    }
    let p = env.pair(QpType::Rc);
    p.b.buf.fill(UNTOUCHED);
    let data = *b"ATOMIC!!";
    let wc = signaled(
        env,
        &p,
        SendWr::atomic_write(1, p.b.addr(64), p.b.mr.rkey, data),
    );
    assert_eq!(
        (wc.status, wc.opcode),
        (S::Success, WcOpcode::AtomicWrite),
        "{wc:?}"
    );
    let mut got = [0u8; 24];
    p.b.buf.read(56, &mut got).unwrap();
    assert_eq!(&got[..8], &[UNTOUCHED; 8]);
    assert_eq!(&got[8..16], &data);
    assert_eq!(&got[16..], &[UNTOUCHED; 8]);
    Outcome::Pass
}

fn misaligned(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::ATOMIC_WRITE) {
        return skip;
    }
    let p = env.pair(QpType::Rc);
    p.b.buf.fill(UNTOUCHED);
    let wc = signaled(
        env,
        &p,
        SendWr::atomic_write(1, p.b.addr(68), p.b.mr.rkey, [0; 8]),
    );
    assert_eq!(wc.status, S::RemInvReqErr, "{wc:?}");
    assert_untouched(&p.b.buf, "the responder's buffer");
    Outcome::Pass
}

fn without_remote_write(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::ATOMIC_WRITE) {
        return skip;
    }
    let p = env.pair(QpType::Rc);
    let (buf, mr) = env.mr(
        p.pd,
        4096,
        A::LOCAL_WRITE | A::REMOTE_READ | A::REMOTE_ATOMIC,
    );
    buf.fill(UNTOUCHED);
    let wc = signaled(
        env,
        &p,
        SendWr::atomic_write(1, mr.addr + 8, mr.rkey, [0; 8]),
    );
    assert_eq!(wc.status, S::RemAccessErr, "{wc:?}");
    assert_untouched(&buf, "the region without REMOTE_WRITE");
    Outcome::Pass
}

fn after_a_write(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::ATOMIC_WRITE) {
        return skip;
    }
    let p = env.pair(QpType::Rc);
    p.a.buf.write(0, b"by WRITE").unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 8)], p.b.addr(128), p.b.mr.rkey),
    );
    let wc = signaled(
        env,
        &p,
        SendWr::atomic_write(2, p.b.addr(128), p.b.mr.rkey, *b"by AWRIT"),
    );
    assert_eq!((wc.wr_id, wc.status), (2, S::Success), "{wc:?}");
    let mut got = [0u8; 8];
    p.b.buf.read(128, &mut got).unwrap();
    assert_eq!(&got, b"by AWRIT");
    Outcome::Pass
}

fn unknown_rkey(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::ATOMIC_WRITE) {
        return skip;
    }
    let p = env.pair(QpType::Rc);
    p.b.buf.fill(UNTOUCHED);
    let wc = signaled(
        env,
        &p,
        SendWr::atomic_write(1, p.b.addr(64), p.b.mr.rkey ^ 0x8000_0000, [0; 8]),
    );
    assert_eq!(wc.status, S::RemAccessErr, "{wc:?}");
    assert_untouched(&p.b.buf, "the responder's buffer");
    Outcome::Pass
}

fn flush(wr_id: u64, addr: u64, rkey: u32, len: u32, level: FlushLevel) -> SendWr {
    SendWr::flush(wr_id, addr, rkey, len, FlushPlacement::GLOBAL, level)
}

fn range_after_writes(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::FLUSH_GLOBAL) {
        return skip;
    }
    let p = flush_pair(env);
    let (buf, mr) = env.mr(
        p.pd,
        8192,
        A::LOCAL_WRITE | A::REMOTE_WRITE | A::FLUSH_GLOBAL,
    );
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    p.a.buf.write(0, &data).unwrap();
    env.post_send(
        p.a.qpn,
        SendWr::rdma_write(1, vec![p.a.sge(0, 5000)], mr.addr + 100, mr.rkey),
    );
    let wc = signaled(
        env,
        &p,
        flush(2, mr.addr + 100, mr.rkey, 5000, FlushLevel::Range),
    );
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (2, S::Success, WcOpcode::Flush),
        "{wc:?}"
    );
    let mut got = vec![0u8; 5000];
    buf.read(100, &mut got).unwrap();
    assert_eq!(got, data);
    Outcome::Pass
}

fn region_level(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::FLUSH_GLOBAL) {
        return skip;
    }
    let p = flush_pair(env);
    let (_buf, mr) = env.mr(p.pd, 4096, A::LOCAL_WRITE | A::FLUSH_GLOBAL);
    let wc = signaled(
        env,
        &p,
        flush(1, mr.addr + (1 << 20), mr.rkey, 1 << 20, FlushLevel::Mr),
    );
    assert_eq!(
        (wc.status, wc.opcode),
        (S::Success, WcOpcode::Flush),
        "{wc:?}"
    );
    Outcome::Pass
}

fn range_past_region(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::FLUSH_GLOBAL) {
        return skip;
    }
    let p = flush_pair(env);
    let (_buf, mr) = env.mr(p.pd, 4096, A::LOCAL_WRITE | A::FLUSH_GLOBAL);
    let wc = signaled(
        env,
        &p,
        flush(1, mr.addr + 4090, mr.rkey, 8, FlushLevel::Range),
    );
    assert_eq!(wc.status, S::RemAccessErr, "{wc:?}");
    Outcome::Pass
}

fn without_flush_access(env: &Env) -> Outcome {
    if let Some(skip) = needs(env, X::FLUSH_GLOBAL) {
        return skip;
    }
    let p = flush_pair(env);
    let (_buf, mr) = env.mr(p.pd, 4096, A::LOCAL_WRITE | A::REMOTE_WRITE);
    let wc = signaled(env, &p, flush(1, mr.addr, mr.rkey, 64, FlushLevel::Range));
    assert_eq!(wc.status, S::RemAccessErr, "{wc:?}");
    Outcome::Pass
}
