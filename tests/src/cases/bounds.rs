//! Access and bounds (IBTA 9.7.4.1, 10.6.3.1; manual 3.4.1 ibv_reg_mr): zero-length
//! transfers, the exact edges of a region (one byte before its first or past its last is
//! refused, the whole of it is not), local memory without LOCAL_WRITE, and atomics whose
//! target, access or local buffer is wrong.
//!
//! google/rdma-unit-test checks the same conditions (`buffer_test.cc` BufferMrTest,
//! `access_test.cc`, `rc_test.cc` FetchAddInvalidSize and FetchAddSplitSgl).

use std::time::Duration;

use verbs_api::{AccessFlags as A, MemBuf, MrInfo, QpType, RecvWr, SendWr, Sge, WcStatus as S};

use super::{assert_untouched, errno::EINVAL, UNTOUCHED};
use crate::env::{all_access, Pair};
use crate::{Case, Env, Outcome};

/// Where the sub-regions of the cases start in each end's buffer, and their length:
/// a byte before and after them is still memory the process owns.
const SUB: usize = 4096;

/// The operations of the zero-length and edge families.
const OPS: [&str; 3] = ["send", "rdma_write", "rdma_read"];

pub(super) fn register(v: &mut Vec<Case>) {
    for (i, op) in OPS.iter().enumerate() {
        v.push(Case::param(format!("bounds::zero_length_{op}_outside_the_region_succeeds"), "IBTA 9.7.4.1 C9-88 (a zero-length RDMA access checks neither R_Key nor address), manual 3.6.5 (an SGE of length 0 names no memory): a zero-length message whose SGEs (and remote address) lie outside their regions, keys valid, completes successfully and touches nothing (google/rdma-unit-test SendZeroByteOutsideMr, WriteZeroByteOutsideMr, ReadZeroByteOutsideMr)", zero_length, 2 * i as u64).wc(S::Success));
        v.push(Case::param(format!("bounds::zero_length_{op}_with_invalid_keys_succeeds"), "IBTA 9.7.4.1 C9-88, manual 3.6.5: a zero-length message whose L_Keys and R_Key name no region completes successfully and touches nothing: no byte is accessed, so no key is checked (google/rdma-unit-test ReadZeroByteInvalidRKey, WriteZeroByteInvalidRKey)", zero_length, 2 * i as u64 + 1).wc(S::Success));
    }
    for (i, op) in OPS[1..].iter().enumerate() {
        for (j, edge) in ["one_byte_before", "one_byte_past"].iter().enumerate() {
            v.push(Case::param(format!("bounds::{op}_{edge}_the_region_is_rem_access_err"), "IBTA 9.7.4.1 (the whole virtual range must lie inside the region the R_Key names), 10.6.3.1, manual 6.2.11 IBV_WC_REM_ACCESS_ERR: a 64-byte access that starts one byte before the region, or ends one byte past it, is NAKed and not a byte moves (google/rdma-unit-test ReadExceedFront/Rear, WriteExceedFront/Rear)", remote_edge, (i * 3 + j) as u64).wc(S::RemAccessErr));
        }
        v.push(Case::param(format!("bounds::{op}_of_the_whole_region_succeeds"), "IBTA 9.7.4.1, 10.6.3.1: an access from the region's first byte to its last is inside it and succeeds, every byte moved (the edge the one-byte-over cases step across)", remote_edge, (i * 3 + 2) as u64).wc(S::Success));
    }
    v.push(Case::param("bounds::send_sge_one_byte_before_the_region_is_loc_prot_err", "IBTA 10.6.3.1 (a local data segment must lie inside the region its L_Key names), manual 6.2.5 IBV_WC_LOC_PROT_ERR: a SEND whose gather SGE starts one byte before its region completes with LOC_PROT_ERR and nothing is received", local_edge, 0).wc(S::LocProtErr));
    v.push(Case::param("bounds::send_sge_one_byte_past_the_region_is_loc_prot_err", "IBTA 10.6.3.1, manual 6.2.5: a SEND whose gather SGE ends one byte past its region completes with LOC_PROT_ERR and nothing is received", local_edge, 1).wc(S::LocProtErr));
    v.push(Case::param("bounds::recv_sge_one_byte_past_the_region_is_loc_prot_err", "IBTA 10.6.3.1, 9.9 (the responder's local error is a remote operational error for the requester), manual 6.2.5, 6.2.12: a receive WR whose SGE ends one byte past its region completes with LOC_PROT_ERR when a SEND lands, the SEND with REM_OP_ERR, and the region is unchanged (google/rdma-unit-test RecvBufferExceedMr)", local_edge, 2).wc(S::LocProtErr).wc(S::RemOpErr));
    v.push(Case::param("bounds::atomic_on_the_last_word_of_the_region_succeeds", "IBTA 9.4.5, 9.7.4.1: an atomic on the region's last whole 8-byte word is inside it and succeeds", atomic_edge, 0).wc(S::Success));
    v.push(Case::param("bounds::atomic_straddling_the_end_of_the_region_is_rem_access_err", "IBTA 9.4.5, 9.7.4.1, manual 6.2.11: an aligned atomic whose word is half inside a region of 4092 bytes is NAKed with REM_ACCESS_ERR and neither the word nor the local buffer changes", atomic_edge, 1).wc(S::RemAccessErr));
    v.push(Case::param("bounds::read_into_a_region_without_local_write_is_loc_prot_err", "manual 3.4.1 ibv_reg_mr (IBV_ACCESS_LOCAL_WRITE: the device may write into the region), IBTA 10.6.3.1, manual 6.2.5: an RDMA READ whose scatter SGE names a region without LOCAL_WRITE completes with LOC_PROT_ERR and the region is unchanged (google/rdma-unit-test RdmaAccessTest.MissingSrcLocalWrite)", no_local_write, 0).wc(S::LocProtErr));
    v.push(Case::param("bounds::atomic_into_a_region_without_local_write_is_loc_prot_err", "manual 3.4.1, IBTA 10.6.3.1, manual 6.2.5: an atomic whose result SGE names a region without LOCAL_WRITE completes with LOC_PROT_ERR and its local buffer is unchanged (google/rdma-unit-test AtomicAccessTest.MissingSrcLocalWrite)", no_local_write, 1).wc(S::LocProtErr));
    v.push(Case::param("bounds::recv_into_a_region_without_local_write_is_loc_prot_err", "manual 3.4.1, IBTA 10.6.3.1, 9.9, manual 6.2.5, 6.2.12: a receive WR whose SGE names a region without LOCAL_WRITE completes with LOC_PROT_ERR when a SEND lands, the SEND with REM_OP_ERR, and the region is unchanged (google/rdma-unit-test MessagingAccessTest.MissingDstLocalWrite)", no_local_write, 2).wc(S::LocProtErr).wc(S::RemOpErr));
    v.push(Case::param("bounds::send_and_write_from_a_region_without_local_write_succeed", "manual 3.4.1 ibv_reg_mr (local read access is always enabled for the MR): a SEND and an RDMA WRITE gathering from a region registered with no access flag succeed and carry its bytes", no_local_write, 3).wc(S::Success));
    v.push(Case::new("bounds::cmp_swap_without_remote_atomic_is_rem_access_err", "IBTA 9.7.4.1, 10.6.3.1 (the region must grant REMOTE_ATOMIC), manual 6.2.11: a compare and swap on a region with every access but REMOTE_ATOMIC is NAKed with REM_ACCESS_ERR and the word is unchanged, though it holds the compare value (google/rdma-unit-test AtomicAccessTest.MissingDstRemoteAtomic)", cmp_swap_no_atomic).wc(S::RemAccessErr));
    v.push(Case::new("bounds::atomic_with_a_4_byte_local_buffer_fails", "IBTA 9.4.5, 10.7 (an atomic returns one 64-bit word into its local buffer), manual 3.6.5: an atomic whose local SGE holds 4 bytes is refused at post (EINVAL, as rdma-core's providers check) or completes with LOC_LEN_ERR; the remote word and the local buffer are unchanged (google/rdma-unit-test FetchAddInvalidSize)", atomic_4_bytes));
    v.push(Case::new("bounds::atomic_over_a_split_sge_list", "IBTA 9.4.5 (the atomic's original value is one 64-bit word; the specification does not provide for a local buffer in several pieces), manual 3.6.5: a fetch and add whose 8 local bytes are two SGEs of 4 is refused at post (EINVAL), or it completes with a local error, or successfully: then the original value is scattered over the two pieces in order and the word was added to once (google/rdma-unit-test FetchAddSplitSgl)", atomic_split));
}

/// A region over `SUB` bytes of `buf` from offset `SUB`.
fn sub_region(env: &Env, p: &Pair, buf: &MemBuf, access: A) -> MrInfo {
    env.dev
        .reg_mr(p.pd, buf, SUB, SUB, access)
        .expect("reg_mr of a sub-region")
}

fn sge(mr: &MrInfo, addr: u64, length: u32) -> Sge {
    Sge {
        addr,
        length,
        lkey: mr.lkey,
    }
}

/// A pair whose buffers are all [`UNTOUCHED`].
fn untouched_pair(env: &Env) -> Pair {
    let p = env.pair(QpType::Rc);
    p.a.buf.fill(UNTOUCHED);
    p.b.buf.fill(UNTOUCHED);
    p
}

/// `param` = 2 * op + variant; variant 0: every SGE and the remote address lie outside
/// their (valid) regions; 1: every key names no region.
fn zero_length(env: &Env, param: u64) -> Outcome {
    let p = untouched_pair(env);
    let (sa, sb) = (
        sub_region(env, &p, &p.a.buf, all_access()),
        sub_region(env, &p, &p.b.buf, all_access()),
    );
    let (local, recv, raddr, rkey) = if param.is_multiple_of(2) {
        (
            sge(&sa, sa.addr + SUB as u64 + 64, 0),
            sge(&sb, sb.addr + SUB as u64 + 64, 0),
            sb.addr - 64,
            sb.rkey,
        )
    } else {
        let bad = |mr: &MrInfo| Sge {
            lkey: mr.lkey ^ 0x5500,
            ..sge(mr, mr.addr, 0)
        };
        (bad(&sa), bad(&sb), sb.addr, 0xDEAD_BEEF)
    };
    let wr = match OPS[param as usize / 2] {
        "send" => {
            env.post_recv(p.b.qpn, RecvWr::new(9, vec![recv]));
            SendWr::send(1, vec![local])
        }
        "rdma_write" => SendWr::rdma_write(1, vec![local], raddr, rkey),
        _ => SendWr::rdma_read(1, vec![local], raddr, rkey),
    };
    env.post_send(p.a.qpn, wr.signaled());
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::Success), "requester: {wc:?}");
    if OPS[param as usize / 2] == "send" {
        let wc = env.poll_one(p.b.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (9, S::Success, 0),
            "receiver: {wc:?}"
        );
    }
    assert_untouched(&p.a.buf, "the requester's buffer");
    assert_untouched(&p.b.buf, "the responder's buffer");
    Outcome::Pass
}

/// `param` = 3 * op (0 WRITE, 1 READ) + edge (0 one byte before, 1 one byte past,
/// 2 the whole region).
fn remote_edge(env: &Env, param: u64) -> Outcome {
    let p = untouched_pair(env);
    let target = sub_region(env, &p, &p.b.buf, all_access());
    let (addr, len) = match param % 3 {
        0 => (target.addr - 1, 64),
        1 => (target.addr + SUB as u64 - 63, 64),
        _ => (target.addr, SUB as u32),
    };
    let write = param / 3 == 0;
    let pattern: Vec<u8> = (0..SUB).map(|i| (i * 13 + 1) as u8).collect();
    let (src, dst) = if write { (&p.a, &p.b) } else { (&p.b, &p.a) };
    src.buf.write(0, &pattern).unwrap();
    src.buf.write(SUB, &pattern).unwrap();
    let wr = if write {
        SendWr::rdma_write(1, vec![p.a.sge(0, len)], addr, target.rkey)
    } else {
        SendWr::rdma_read(1, vec![p.a.sge(0, len)], addr, target.rkey)
    };
    env.post_send(p.a.qpn, wr.signaled());
    let wc = env.poll_one(p.a.cq);
    if param % 3 == 2 {
        assert_eq!((wc.wr_id, wc.status), (1, S::Success), "{wc:?}");
        let mut got = vec![0u8; SUB];
        dst.buf.read(if write { SUB } else { 0 }, &mut got).unwrap();
        assert!(got == pattern, "the region's bytes did not all move");
    } else {
        assert_eq!((wc.wr_id, wc.status), (1, S::RemAccessErr), "{wc:?}");
        assert_untouched(&dst.buf, "the destination");
    }
    Outcome::Pass
}

/// 0: SEND SGE one byte before its region; 1: one byte past; 2: receive SGE one byte
/// past its region.
fn local_edge(env: &Env, param: u64) -> Outcome {
    let p = untouched_pair(env);
    let (sa, sb) = (
        sub_region(env, &p, &p.a.buf, A::LOCAL_WRITE),
        sub_region(env, &p, &p.b.buf, A::LOCAL_WRITE),
    );
    let end = SUB as u64;
    let (send, recv) = match param {
        0 => (sge(&sa, sa.addr - 1, 64), p.b.sge(0, 256)),
        1 => (sge(&sa, sa.addr + end - 63, 64), p.b.sge(0, 256)),
        _ => (p.a.sge(0, 64), sge(&sb, sb.addr + end - 63, 64)),
    };
    env.post_recv(p.b.qpn, RecvWr::new(9, vec![recv]));
    env.post_send(p.a.qpn, SendWr::send(1, vec![send]).signaled());
    let wc = env.poll_one(p.a.cq);
    if param < 2 {
        assert_eq!((wc.wr_id, wc.status), (1, S::LocProtErr), "{wc:?}");
        env.assert_no_completion(p.b.cq, Duration::from_millis(50));
    } else {
        assert_eq!((wc.wr_id, wc.status), (1, S::RemOpErr), "sender: {wc:?}");
        let wc = env.poll_one(p.b.cq);
        assert_eq!((wc.wr_id, wc.status), (9, S::LocProtErr), "{wc:?}");
    }
    assert_untouched(&p.b.buf, "the receiver's buffer");
    Outcome::Pass
}

/// 0: an atomic on the last word of a 4092-byte region; 1: on the word that straddles
/// its end.
fn atomic_edge(env: &Env, straddle: u64) -> Outcome {
    let p = env.pair(QpType::Rc);
    let target = env
        .dev
        .reg_mr(p.pd, &p.b.buf, SUB, SUB - 4, all_access())
        .expect("reg_mr of 4092 bytes");
    let off = if straddle == 1 { SUB - 8 } else { SUB - 16 };
    p.b.buf.write_u64(SUB + off, 40).unwrap();
    p.a.buf.write_u64(0, 7).unwrap();
    let wr = SendWr::atomic_fetch_add(1, p.a.sge(0, 8), target.addr + off as u64, target.rkey, 2);
    env.post_send(p.a.qpn, wr.signaled());
    let wc = env.poll_one(p.a.cq);
    let (word, local) = (
        p.b.buf.read_u64(SUB + off).unwrap(),
        p.a.buf.read_u64(0).unwrap(),
    );
    if straddle == 1 {
        assert_eq!((wc.wr_id, wc.status), (1, S::RemAccessErr), "{wc:?}");
        assert_eq!(
            (word, local),
            (40, 7),
            "the word or the local buffer changed"
        );
    } else {
        assert_eq!((wc.wr_id, wc.status), (1, S::Success), "{wc:?}");
        assert_eq!((word, local), (42, 40), "(the word, the fetched value)");
    }
    Outcome::Pass
}

/// A region of `SUB` bytes of a's buffer with no access flag (local read only).
fn read_only(env: &Env, p: &Pair) -> MrInfo {
    sub_region(env, p, &p.a.buf, A::empty())
}

/// 0: READ into a read-only region; 1: atomic into one; 2: receive into one (on b);
/// 3: SEND and WRITE out of one.
fn no_local_write(env: &Env, param: u64) -> Outcome {
    let p = untouched_pair(env);
    let ro = read_only(env, &p);
    let ro_sge = |len| sge(&ro, ro.addr, len);
    match param {
        0 | 1 => {
            let wr = if param == 0 {
                SendWr::rdma_read(1, vec![ro_sge(64)], p.b.addr(0), p.b.mr.rkey)
            } else {
                SendWr::atomic_fetch_add(1, ro_sge(8), p.b.addr(0), p.b.mr.rkey, 1)
            };
            env.post_send(p.a.qpn, wr.signaled());
            let wc = env.poll_one(p.a.cq);
            assert_eq!((wc.wr_id, wc.status), (1, S::LocProtErr), "{wc:?}");
            assert_untouched(&p.a.buf, "the read-only region");
        }
        2 => {
            let rb = sub_region(env, &p, &p.b.buf, A::empty());
            env.post_recv(p.b.qpn, RecvWr::new(9, vec![sge(&rb, rb.addr, 256)]));
            env.send_fails_the_receive(&p);
            assert_untouched(&p.b.buf, "the read-only region");
        }
        _ => {
            p.a.buf.write(SUB, &[0xC3; 64]).unwrap();
            env.post_recv(p.b.qpn, RecvWr::new(9, vec![p.b.sge(0, 256)]));
            env.post_send(p.a.qpn, SendWr::send(1, vec![ro_sge(64)]).signaled());
            let wr = SendWr::rdma_write(2, vec![ro_sge(32)], p.b.addr(1024), p.b.mr.rkey);
            env.post_send(p.a.qpn, wr.signaled());
            for id in [1, 2] {
                let wc = env.poll_one(p.a.cq);
                assert_eq!((wc.wr_id, wc.status), (id, S::Success), "{wc:?}");
            }
            let wc = env.poll_one(p.b.cq);
            assert_eq!((wc.wr_id, wc.status, wc.byte_len), (9, S::Success, 64));
            let (mut sent, mut written) = ([0u8; 64], [0u8; 32]);
            p.b.buf.read(0, &mut sent).unwrap();
            p.b.buf.read(1024, &mut written).unwrap();
            assert_eq!((sent, written), ([0xC3; 64], [0xC3; 32]));
        }
    }
    Outcome::Pass
}

fn cmp_swap_no_atomic(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let access = A::LOCAL_WRITE | A::REMOTE_WRITE | A::REMOTE_READ;
    let target = sub_region(env, &p, &p.b.buf, access);
    p.b.buf.write_u64(SUB, 5).unwrap();
    p.a.buf.write_u64(0, 77).unwrap();
    let wr = SendWr::atomic_cmp_swp(1, p.a.sge(0, 8), target.addr, target.rkey, 5, 9);
    env.post_send(p.a.qpn, wr.signaled());
    let wc = env.poll_one(p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (1, S::RemAccessErr), "{wc:?}");
    assert_eq!(p.b.buf.read_u64(SUB).unwrap(), 5, "the word was swapped");
    assert_eq!(p.a.buf.read_u64(0).unwrap(), 77, "the local buffer changed");
    Outcome::Pass
}

fn atomic_4_bytes(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    p.b.buf.write_u64(0, 2).unwrap();
    p.a.buf.write_u64(0, 1).unwrap();
    let wr = SendWr::atomic_fetch_add(1, p.a.sge(0, 4), p.b.addr(0), p.b.mr.rkey, 1);
    match env.dev.post_send(p.a.qpn, &[wr.signaled()]) {
        Err(e) => assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}"),
        Ok(()) => {
            let wc = env.poll_one(p.a.cq);
            assert_eq!((wc.wr_id, wc.status), (1, S::LocLenErr), "{wc:?}");
        }
    }
    assert_eq!(p.b.buf.read_u64(0).unwrap(), 2, "the remote word changed");
    assert_eq!(p.a.buf.read_u64(0).unwrap(), 1, "the local buffer changed");
    Outcome::Pass
}

fn atomic_split(env: &Env) -> Outcome {
    let p = env.pair(QpType::Rc);
    let fill = 0xAAAA_AAAA_AAAA_AAAAu64;
    for off in [0, 8, 16, 24] {
        p.a.buf.write_u64(off, fill).unwrap();
    }
    let original = 0x1122_3344_5566_7788u64;
    p.b.buf.write_u64(0, original).unwrap();
    let wr = SendWr::new(
        1,
        vec![p.a.sge(8, 4), p.a.sge(16, 4)],
        verbs_api::WrOperation::AtomicFetchAndAdd {
            remote_addr: p.b.addr(0),
            rkey: p.b.mr.rkey,
            add: 15,
        },
    );
    if let Err(e) = env.dev.post_send(p.a.qpn, &[wr.signaled()]) {
        assert_eq!((e.index, e.error.errno()), (0, EINVAL), "{e:?}");
        assert_eq!(p.b.buf.read_u64(0).unwrap(), original);
        return Outcome::Pass;
    }
    let wc = env.poll_one(p.a.cq);
    assert_eq!(wc.wr_id, 1, "{wc:?}");
    if wc.status != S::Success {
        // A device that does not scatter an atomic's value fails it locally.
        let local = [S::LocLenErr, S::LocQpOpErr, S::LocProtErr];
        assert!(local.contains(&wc.status), "{wc:?}");
        return Outcome::Pass;
    }
    assert_eq!(p.b.buf.read_u64(0).unwrap(), original + 15, "added once");
    let bytes = original.to_le_bytes();
    let mut got = [0u8; 32];
    p.a.buf.read(0, &mut got).unwrap();
    let mut want = [0xAAu8; 32];
    want[8..12].copy_from_slice(&bytes[..4]);
    want[16..20].copy_from_slice(&bytes[4..]);
    assert_eq!(got, want, "the fetched value is not scattered in order");
    Outcome::Pass
}
