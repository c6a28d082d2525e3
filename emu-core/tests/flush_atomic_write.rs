//! ATOMIC WRITE and FLUSH (IBTA 1.5; kernel rxe since 6.2) between two engines: the
//! packets exchanged, the completions, the bytes in memory, and the error cases, in
//! which not one byte moves.

mod util;

use std::time::Duration;

use emu_wire::Opcode::*;
use util::*;
use verbs_api::{
    AccessFlags, Error, FlushLevel, FlushPlacement, MemBuf, QpState, SendWr, WcOpcode, WcStatus,
};

fn flush_config() -> Config {
    Config {
        access: Config::default().access | AccessFlags::FLUSH_GLOBAL,
        ..Config::default()
    }
}

/// IBTA 1.5: an ATOMIC WRITE carries a RETH and its 8 bytes, which land as given; the
/// responder answers with a zero-length READ RESPONSE ONLY (kernel rxe 6.12 does).
#[test]
fn atomic_write_lands_its_8_bytes_and_is_answered_by_an_empty_read_response() {
    let (mut p, a, b) = connected(Config::default());
    let data = 0x0123_4567_89ab_cdef_u64.to_le_bytes();
    a.post_send(
        &mut p,
        SendWr::atomic_write(7, b.mr.addr + 64, b.mr.rkey, data).signaled(),
    );
    p.drive();
    assert_eq!(p.opcodes(Side::A), [RcAtomicWrite]);
    assert_eq!(p.opcodes(Side::B), [RcRdmaReadResponseOnly]);
    assert_eq!(b.read_bytes(64, 8), data);
    assert_eq!(b.read_bytes(56, 8), [0; 8]);
    assert_eq!(b.read_bytes(72, 8), [0; 8]);
    let wc = a.poll(&mut p);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (7, WcStatus::Success, WcOpcode::AtomicWrite)
    );
    // The 8 bytes it carried, as kernel rxe reports them.
    assert_eq!(wc[0].byte_len, 8);
    // No receive completion on the responder.
    assert!(b.poll(&mut p).is_empty());
}

/// An ATOMIC WRITE at an address that is not 8-byte aligned is an invalid request
/// (kernel rxe: misaligned atomic): REM_INV_REQ_ERR, the QP to error, nothing written.
#[test]
fn a_misaligned_atomic_write_is_an_invalid_request_and_writes_nothing() {
    let (mut p, a, b) = connected(Config::default());
    a.post_send(
        &mut p,
        SendWr::atomic_write(1, b.mr.addr + 60, b.mr.rkey, [0xAA; 8]).signaled(),
    );
    p.drive();
    let wc = a.poll(&mut p);
    assert_eq!(wc[0].status, WcStatus::RemInvReqErr);
    assert_eq!(b.read_bytes(56, 16), [0; 16]);
    assert_eq!(b.state(&mut p), QpState::Err);
}

/// IBTA 1.5 (kernel rxe: REMOTE_WRITE): a region without remote write access refuses
/// an ATOMIC WRITE with a remote access error; REMOTE_ATOMIC alone is not enough.
#[test]
fn atomic_write_needs_remote_write_access_on_the_region() {
    let (mut p, a, b) = connected(Config::default());
    let buf = MemBuf::new(4096);
    let mr = p
        .engine(Side::B)
        .reg_mr(
            b.pd,
            &buf,
            0,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    a.post_send(
        &mut p,
        SendWr::atomic_write(1, mr.addr + 8, mr.rkey, [0x55; 8]).signaled(),
    );
    p.drive();
    let wc = a.poll(&mut p);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::RemAccessErr, WcOpcode::AtomicWrite)
    );
    let mut back = [0u8; 16];
    buf.read(0, &mut back).unwrap();
    assert_eq!(back, [0; 16]);
}

/// A lost response: the requester sends the ATOMIC WRITE again and the responder
/// answers from its resources without writing a second time (IBTA 9.7.5.1.2, as for
/// atomics): the value the responder's application wrote in between stays.
#[test]
fn a_duplicate_atomic_write_is_answered_again_not_executed_again() {
    let (mut p, a, b) = connected(Config::default());
    p.set_rule(|side, _, _| match side {
        Side::B => Action::Drop,
        Side::A => Action::Deliver,
    });
    a.post_send(
        &mut p,
        SendWr::atomic_write(1, b.mr.addr, b.mr.rkey, [1; 8]).signaled(),
    );
    p.advance(Duration::from_micros(100));
    assert_eq!(b.read_bytes(0, 8), [1; 8]);
    b.write_bytes(0, &[2; 8]);
    p.clear_rule();
    p.drive();
    assert_eq!(p.opcodes(Side::A), [RcAtomicWrite, RcAtomicWrite]);
    assert_eq!(
        p.opcodes(Side::B),
        [RcRdmaReadResponseOnly, RcRdmaReadResponseOnly]
    );
    assert_eq!(b.read_bytes(0, 8), [2; 8]);
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
}

/// The verbs' own checks (ibv_post_send EINVAL): ATOMIC WRITE and FLUSH are RC only,
/// take no scatter/gather list, and a FLUSH names a placement type.
#[test]
fn post_send_refuses_malformed_atomic_writes_and_flushes() {
    let (mut p, a, b) = connected(Config::default());
    let mut with_sge = SendWr::atomic_write(1, b.mr.addr, b.mr.rkey, [0; 8]);
    with_sge.sg_list = a.sge(0, 8).into();
    let no_type = SendWr::flush(
        2,
        b.mr.addr,
        b.mr.rkey,
        8,
        FlushPlacement::empty(),
        FlushLevel::Range,
    );
    let bad_type = SendWr::flush(
        3,
        b.mr.addr,
        b.mr.rkey,
        8,
        FlushPlacement::from_bits_retain(4),
        FlushLevel::Range,
    );
    for wr in [with_sge, no_type, bad_type] {
        let now = p.now;
        let err = p.engine(Side::A).post_send(now, a.qpn, &[wr]).unwrap_err();
        assert!(matches!(err.error, Error::InvalidArgument(_)), "{err:?}");
    }
    let (mut p, a, b) = connected(Config {
        qp_type: verbs_api::QpType::Uc,
        ..Config::default()
    });
    let now = p.now;
    let err = p
        .engine(Side::A)
        .post_send(
            now,
            a.qpn,
            &[SendWr::atomic_write(1, b.mr.addr, b.mr.rkey, [0; 8])],
        )
        .unwrap_err();
    assert!(matches!(err.error, Error::InvalidArgument(_)));
}

/// IBTA 1.5 FLUSH: FETH and RETH, no payload, answered by an empty READ RESPONSE ONLY
/// once every earlier WRITE has landed; completes with IBV_WC_FLUSH.
#[test]
fn flush_after_writes_completes_once_they_landed() {
    let (mut p, a, b) = connected(flush_config());
    let data = pattern(3000, 9);
    a.write_bytes(0, &data);
    a.post_send(
        &mut p,
        SendWr::rdma_write(1, vec![a.sge(0, 3000)], b.mr.addr + 100, b.mr.rkey),
    );
    a.post_send(
        &mut p,
        SendWr::flush(
            2,
            b.mr.addr + 100,
            b.mr.rkey,
            3000,
            FlushPlacement::GLOBAL,
            FlushLevel::Range,
        )
        .signaled(),
    );
    p.drive();
    assert_eq!(
        p.opcodes(Side::A),
        [
            RcRdmaWriteFirst,
            RcRdmaWriteMiddle,
            RcRdmaWriteLast,
            RcFlush
        ]
    );
    assert_eq!(p.opcodes(Side::B).last(), Some(&RcRdmaReadResponseOnly));
    assert_eq!(b.read_bytes(100, 3000), data);
    let wc = a.poll(&mut p);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (2, WcStatus::Success, WcOpcode::Flush)
    );
}

/// FLUSH at the memory region level (IBTA 1.5 selectivity level 1): only the key
/// counts, not the RETH's range; at the range level a range past the region is a
/// remote access error.
#[test]
fn flush_of_the_whole_region_ignores_the_range_and_a_range_flush_checks_it() {
    let (mut p, a, b) = connected(flush_config());
    let end = b.mr.addr + b.mr.length;
    a.post_send(
        &mut p,
        SendWr::flush(
            1,
            end + 4096,
            b.mr.rkey,
            1 << 20,
            FlushPlacement::GLOBAL,
            FlushLevel::Mr,
        )
        .signaled(),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::Success);
    a.post_send(
        &mut p,
        SendWr::flush(
            2,
            end - 8,
            b.mr.rkey,
            16,
            FlushPlacement::GLOBAL,
            FlushLevel::Range,
        )
        .signaled(),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemAccessErr);
}

/// The region must grant the FLUSH access of the placement type asked for (IBTA 1.5;
/// kernel rxe looks the R_Key up with IB_ACCESS_FLUSH_*): a FLUSH to persistence on a
/// region registered for global visibility only is a remote access error.
#[test]
fn flush_needs_the_regions_flush_access_for_its_placement_type() {
    let cfg = Config {
        access: flush_config().access | AccessFlags::FLUSH_PERSISTENT,
        ..Config::default()
    };
    let (mut p, a, b) = connected(cfg);
    let buf = MemBuf::new(4096);
    let mr = p
        .engine(Side::B)
        .reg_mr(
            b.pd,
            &buf,
            0,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::FLUSH_GLOBAL,
        )
        .unwrap();
    a.post_send(
        &mut p,
        SendWr::flush(
            1,
            mr.addr,
            mr.rkey,
            64,
            FlushPlacement::GLOBAL | FlushPlacement::PERSISTENT,
            FlushLevel::Range,
        )
        .signaled(),
    );
    p.drive();
    let wc = a.poll(&mut p);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::RemAccessErr, WcOpcode::Flush)
    );
    assert_eq!(b.state(&mut p), QpState::Err);
}

/// The responder's QP must allow the placement type too (kernel rxe checks
/// `qp_access_flags`): without IBV_ACCESS_FLUSH_GLOBAL on the QP, an invalid request.
#[test]
fn flush_needs_the_qps_flush_access() {
    let (mut p, a, b) = connected(Config::default());
    let buf = MemBuf::new(4096);
    let mr = p
        .engine(Side::B)
        .reg_mr(
            b.pd,
            &buf,
            0,
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::FLUSH_GLOBAL,
        )
        .unwrap();
    a.post_send(
        &mut p,
        SendWr::flush(
            1,
            mr.addr,
            mr.rkey,
            64,
            FlushPlacement::GLOBAL,
            FlushLevel::Range,
        )
        .signaled(),
    );
    p.drive();
    assert_eq!(a.poll(&mut p)[0].status, WcStatus::RemInvReqErr);
}

/// ATOMIC WRITE and FLUSH take responder resources: with max_rd_atomic 1 the second
/// waits for the first's response (IBTA 9.7; both count as READ/ATOMIC).
#[test]
fn atomic_writes_and_flushes_count_against_max_rd_atomic() {
    let cfg = Config {
        max_rd_atomic: 1,
        ..flush_config()
    };
    let (mut p, a, b) = connected(cfg);
    a.post_send(
        &mut p,
        SendWr::atomic_write(1, b.mr.addr, b.mr.rkey, [3; 8]).signaled(),
    );
    a.post_send(
        &mut p,
        SendWr::flush(
            2,
            b.mr.addr,
            b.mr.rkey,
            8,
            FlushPlacement::GLOBAL,
            FlushLevel::Range,
        )
        .signaled(),
    );
    p.drive();
    let t = p.trace();
    let first_response = t.iter().position(|l| l.starts_with("B->A")).unwrap();
    let flush_at = t.iter().position(|l| l.contains("RC_FLUSH")).unwrap();
    assert!(first_response < flush_at, "{t:#?}");
    let wc = a.poll(&mut p);
    assert_eq!(
        wc.iter().map(|w| (w.status, w.opcode)).collect::<Vec<_>>(),
        [
            (WcStatus::Success, WcOpcode::AtomicWrite),
            (WcStatus::Success, WcOpcode::Flush)
        ]
    );
}
