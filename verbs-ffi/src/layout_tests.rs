//! The offsets the stock binaries' inline verbs read (measured on rdma-core 44,
//! x86-64; `docs` of the crate README): if a regenerated `bindings.rs` moved any of
//! them, binaries built against the installed headers would call the wrong pointers.

use std::mem::{offset_of, size_of};

use crate::sys::*;

#[test]
#[cfg(target_arch = "x86_64")]
fn ibv_context_layout() {
    assert_eq!(offset_of!(ibv_context, device), 0);
    assert_eq!(offset_of!(ibv_context, ops), 8);
    assert_eq!(offset_of!(ibv_context, cmd_fd), 0x108);
    assert_eq!(offset_of!(ibv_context, async_fd), 0x10c);
    assert_eq!(offset_of!(ibv_context, num_comp_vectors), 0x110);
    assert_eq!(offset_of!(ibv_context, mutex), 0x118);
    assert_eq!(offset_of!(ibv_context, abi_compat), 0x140);
    assert_eq!(size_of::<ibv_context>(), 328);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn context_ops_the_inline_verbs_call() {
    let ops = offset_of!(ibv_context, ops);
    assert_eq!(ops + offset_of!(ibv_context_ops, poll_cq), 0x60);
    assert_eq!(ops + offset_of!(ibv_context_ops, req_notify_cq), 0x68);
    assert_eq!(ops + offset_of!(ibv_context_ops, post_srq_recv), 0xa8);
    assert_eq!(ops + offset_of!(ibv_context_ops, post_send), 0xd0);
    assert_eq!(ops + offset_of!(ibv_context_ops, post_recv), 0xd8);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn verbs_context_layout() {
    assert_eq!(offset_of!(verbs_context, query_port), 0);
    assert_eq!(offset_of!(verbs_context, create_cq_ex), 200);
    assert_eq!(offset_of!(verbs_context, query_device_ex), 216);
    assert_eq!(offset_of!(verbs_context, create_qp_ex), 264);
    assert_eq!(offset_of!(verbs_context, sz), 312);
    assert_eq!(offset_of!(verbs_context, context), 320);
    assert_eq!(size_of::<verbs_context>(), 648);
}

#[test]
#[cfg(target_arch = "x86_64")]
fn objects_and_device() {
    assert_eq!(offset_of!(ibv_cq, context), 0);
    assert_eq!(offset_of!(ibv_qp, context), 0);
    assert_eq!(offset_of!(ibv_srq, context), 0);
    assert_eq!(offset_of!(ibv_device, transport_type), 20);
    assert_eq!(offset_of!(ibv_device, name), 24);
    assert_eq!(offset_of!(ibv_device, ibdev_path), 408);
    // ibv_cq_ex begins with exactly the fields of ibv_cq; ibv_qp_ex with an ibv_qp.
    assert_eq!(
        offset_of!(ibv_cq_ex, async_events_completed),
        offset_of!(ibv_cq, async_events_completed)
    );
    assert_eq!(offset_of!(ibv_qp_ex, qp_base), 0);
}

/// The librdmacm structs the programs read directly (measured with the installed
/// `<rdma/rdma_cma.h>`, rdma-core 44, x86-64): `id->verbs`, `id->qp`, `id->pd`, the
/// CQs, `event->param`, `rdma_addrinfo`'s addresses.
#[test]
#[cfg(target_arch = "x86_64")]
fn librdmacm_structs() {
    use crate::sys::rdma::*;
    assert_eq!(offset_of!(rdma_cm_id, verbs), 0);
    assert_eq!(offset_of!(rdma_cm_id, channel), 8);
    assert_eq!(offset_of!(rdma_cm_id, context), 16);
    assert_eq!(offset_of!(rdma_cm_id, qp), 24);
    assert_eq!(offset_of!(rdma_cm_id, route), 32);
    assert_eq!(offset_of!(rdma_cm_id, ps), 344);
    assert_eq!(offset_of!(rdma_cm_id, port_num), 348);
    assert_eq!(offset_of!(rdma_cm_id, event), 352);
    assert_eq!(offset_of!(rdma_cm_id, send_cq_channel), 360);
    assert_eq!(offset_of!(rdma_cm_id, send_cq), 368);
    assert_eq!(offset_of!(rdma_cm_id, recv_cq_channel), 376);
    assert_eq!(offset_of!(rdma_cm_id, recv_cq), 384);
    assert_eq!(offset_of!(rdma_cm_id, srq), 392);
    assert_eq!(offset_of!(rdma_cm_id, pd), 400);
    assert_eq!(offset_of!(rdma_cm_id, qp_type), 408);
    assert_eq!(size_of::<rdma_cm_id>(), 416);
    assert_eq!(offset_of!(rdma_cm_event, event), 16);
    assert_eq!(offset_of!(rdma_cm_event, status), 20);
    assert_eq!(offset_of!(rdma_cm_event, param), 24);
    assert_eq!(size_of::<rdma_cm_event>(), 80);
    assert_eq!(offset_of!(rdma_conn_param, qp_num), 16);
    assert_eq!(offset_of!(rdma_ud_param, qp_num), 48);
    assert_eq!(offset_of!(rdma_ud_param, qkey), 52);
    assert_eq!(offset_of!(rdma_addrinfo, ai_src_addr), 24);
    assert_eq!(offset_of!(rdma_addrinfo, ai_dst_addr), 32);
    assert_eq!(offset_of!(rdma_addrinfo, ai_next), 88);
    assert_eq!(size_of::<rdma_addrinfo>(), 96);
}
