//! The structs of `verbs_ffi::sys` handed to rdma-sys's functions as rdma-sys's own
//! structs, and back, so that the conversions to and from `verbs_api` types exist once
//! (in `verbs_ffi::convert`, shared with capi) although rdma-sys makes its own Rust
//! types for the same C structs.
//!
//! # Safety argument
//!
//! [`SameLayout`] pairs a `verbs_ffi::sys` struct `C` with the rdma-sys struct `S` of
//! the same C name. Each pair is declared by [`same_layout!`], which proves, at compile
//! time, against the headers rdma-sys was generated from (the installed ones):
//!
//! * `size_of::<C>() == size_of::<S>()` and `align_of::<C>() == align_of::<S>()`;
//! * every field of `C` and of `S` is named (a struct pattern without `..` over each),
//!   and each field of `C` lies at the offset of its twin in `S`;
//! * each pair of twin fields has one Rust type (type inference makes both field
//!   accessors return `&F` for one `F`), or types that are themselves a declared pair
//!   (the trait bound `SameLayout<Sys = ..>`), which recursively have equal layouts.
//!
//! Every field so named is an integer, an array of integers, a declared pair, or (the
//! `private_data` of `rdma_conn_param` and `rdma_ud_param`) a `*const c_void`, one
//! type on both sides, which is only copied by the cast, never followed; the only
//! pairs declared with [`same_layout!`]'s `union` form (size and alignment checked, no
//! fields) are `ibv_gid` (16 bytes, or two `u64`s) and the `imm_data` /
//! `invalidated_rkey` word of `ibv_wc` (two `u32`s), unions whose members are all
//! integers. So the two types have the same bytes in the same places, their padding
//! coincides, and every bit pattern is a valid value of both (integers and raw
//! pointers; no references, no Rust enums, no `bool`s): reading a `C` as an `S` or an
//! `S` as a `C`, by value or through a reference of equal alignment, reads the same
//! valid value. The four functions below are the only casts.

#![allow(unsafe_code)]

use std::mem::{align_of, offset_of, size_of};

use rdma_sys as ffi;

/// The `verbs_ffi::sys` structs paired here, `<rdma/rdma_cma.h>`'s among them.
mod c {
    pub(super) use verbs_ffi::sys::rdma::{rdma_conn_param, rdma_ud_param};
    pub(super) use verbs_ffi::sys::*;
}

/// `Self` (a `verbs_ffi::sys` struct) and `Self::Sys` (its rdma-sys twin) have the
/// same layout and both accept every bit pattern.
///
/// # Safety
///
/// Implemented only by [`same_layout!`], which checks the layout at compile time (the
/// module's safety argument).
pub(crate) unsafe trait SameLayout {
    /// rdma-sys's struct of the same C name.
    type Sys;
}

/// The rdma-sys struct with the bytes of `t`, to embed in a struct rdma-sys declares
/// (`ibv_qp_init_attr.cap`, a work request's SGE list).
pub(crate) fn to_sys<T: SameLayout + Copy>(t: T) -> T::Sys {
    // SAFETY: same size and every bit pattern valid for both (module docs).
    unsafe { std::mem::transmute_copy(&t) }
}

/// `s`, an rdma-sys struct libibverbs or librdmacm filled in, as its verbs-ffi twin.
pub(crate) fn from_sys<T: SameLayout>(s: &T::Sys) -> &T {
    // SAFETY: same size and alignment, every bit pattern valid for both (module docs);
    // the borrow of `s` is carried over.
    unsafe { &*(s as *const T::Sys).cast::<T>() }
}

/// `t` as its rdma-sys twin, for a call that reads or fills it in.
pub(crate) fn sys_mut<T: SameLayout>(t: &mut T) -> &mut T::Sys {
    // SAFETY: as in `from_sys`; what the callee writes is valid for `T` too.
    unsafe { &mut *(t as *mut T).cast::<T::Sys>() }
}

/// `t` as a slice of its rdma-sys twins (the array `ibv_poll_cq` fills in).
pub(crate) fn sys_slice_mut<T: SameLayout>(t: &mut [T]) -> &mut [T::Sys] {
    // SAFETY: as in `sys_mut`; equal sizes give equal strides, so the slice covers the
    // same bytes.
    unsafe { std::slice::from_raw_parts_mut(t.as_mut_ptr().cast::<T::Sys>(), t.len()) }
}

/// True (for a compile-time check) when the two fields have one type: both accessors
/// return `&F`.
const fn same<C, S, F>(_: fn(&C) -> &F, _: fn(&S) -> &F) -> bool {
    true
}

/// True when the field of `C` has a type declared [`SameLayout`] with the type of the
/// field of `S`.
const fn nested<C, S, FC: SameLayout<Sys = FS>, FS>(_: fn(&C) -> &FC, _: fn(&S) -> &FS) -> bool {
    true
}

/// Declares [`SameLayout`] for structs of one name in `verbs_ffi::sys` and rdma-sys:
/// `name { field, field: nested, field as sys_name: nested, .. }` lists every field
/// (`nested`: a field whose type is a declared pair; `as`: the field's name in
/// rdma-sys where it differs) and checks what the module's safety argument says;
/// `union c_name = sys_name` declares a pair of unions of integers by their size and
/// alignment.
macro_rules! same_layout {
    (union $c:ident = $s:ident) => {
        const _: () = assert!(size_of::<c::$c>() == size_of::<ffi::$s>());
        const _: () = assert!(align_of::<c::$c>() == align_of::<ffi::$s>());
        // SAFETY: size and alignment checked above; both are unions of integers.
        unsafe impl SameLayout for c::$c {
            type Sys = ffi::$s;
        }
    };
    // Normalises each field to `(c_name sys_name check)`.
    (@fields $t:ident [$($done:tt)*] $f:ident as $s:ident: nested $(, $($rest:tt)*)?) => {
        same_layout!(@fields $t [$($done)* ($f $s nested)] $($($rest)*)?);
    };
    (@fields $t:ident [$($done:tt)*] $f:ident: nested $(, $($rest:tt)*)?) => {
        same_layout!(@fields $t [$($done)* ($f $f nested)] $($($rest)*)?);
    };
    (@fields $t:ident [$($done:tt)*] $f:ident $(, $($rest:tt)*)?) => {
        same_layout!(@fields $t [$($done)* ($f $f same)] $($($rest)*)?);
    };
    (@fields $t:ident [$(($f:ident $s:ident $check:ident))*]) => {
        const _: () = {
            assert!(size_of::<c::$t>() == size_of::<ffi::$t>());
            assert!(align_of::<c::$t>() == align_of::<ffi::$t>());
            $(
                assert!(offset_of!(c::$t, $f) == offset_of!(ffi::$t, $s));
                assert!($check(|x: &c::$t| &x.$f, |x: &ffi::$t| &x.$s));
            )*
        };
        const _: () = {
            /// Every field is named: a struct pattern without `..` does not compile
            /// when either struct has a field the list leaves out.
            #[allow(dead_code)]
            fn every_field_is_listed(x: &c::$t, y: &ffi::$t) {
                let c::$t { $($f: _),* } = x;
                let ffi::$t { $($s: _),* } = y;
            }
        };
        // SAFETY: layout checked above (module docs).
        unsafe impl SameLayout for c::$t {
            type Sys = ffi::$t;
        }
    };
    ($($t:ident { $($fields:tt)* })*) => {
        $(same_layout!(@fields $t [] $($fields)*);)*
    };
}

same_layout!(union ibv_gid = ibv_gid);
same_layout!(union ibv_wc__bindgen_ty_1 = imm_data_invalidated_rkey_union_t);

same_layout! {
    ibv_sge { addr, length, lkey }
    ibv_global_route { dgid: nested, flow_label, sgid_index, hop_limit, traffic_class }
    ibv_ah_attr { grh: nested, dlid, sl, src_path_bits, static_rate, is_global, port_num }
    ibv_grh { version_tclass_flow, paylen, next_hdr, hop_limit, sgid: nested, dgid: nested }
    ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
    ibv_srq_attr { max_wr, max_sge, srq_limit }
    ibv_qp_attr {
        qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, cap: nested, ah_attr: nested, alt_ah_attr: nested, pkey_index,
        alt_pkey_index, en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic,
        min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout,
        rate_limit
    }
    ibv_wc {
        wr_id, status, opcode, vendor_err, byte_len,
        __bindgen_anon_1 as imm_data_invalidated_rkey_union: nested, qp_num, src_qp, wc_flags,
        pkey_index, slid, sl, dlid_path_bits
    }
    ibv_device_attr {
        fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap, vendor_id,
        vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge, max_sge_rd,
        max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
        max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw,
        max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach,
        max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr, max_srq, max_srq_wr,
        max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt
    }
    rdma_conn_param {
        private_data, private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num
    }
    rdma_ud_param { private_data, private_data_len, ah_attr: nested, qp_num, qkey }
    ibv_port_attr {
        state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr,
        qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout,
        init_type_reply, active_width, active_speed, phys_state, link_layer, flags,
        port_cap_flags2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::{ConnParam, QpAttr, UdParam, WcFlags, WcOpcode, WcStatus, WorkCompletion};
    use verbs_ffi::{cm, convert};

    #[test]
    fn a_struct_reads_the_same_through_either_type() {
        let mut q = QpAttr {
            qkey: 0x1111_2222,
            rate_limit: 77,
            ..QpAttr::default()
        };
        q.alt_ah_attr.grh.dgid.0[15] = 9;
        let mut cq = convert::qp_attr_to_c(&q);
        let s = sys_mut(&mut cq);
        assert_eq!((s.qkey, s.rate_limit), (0x1111_2222, 77));
        s.rate_limit = 78;
        q.rate_limit = 78;
        assert_eq!(convert::qp_attr_from_query(from_sys(s)), q);
        let mut w = WorkCompletion::new(5, WcStatus::Success, WcOpcode::Recv, 6);
        (w.wc_flags, w.imm_data) = (WcFlags::WITH_IMM, 0x0102_0304);
        let mut ws = [convert::wc_to_c(&w); 2];
        let sys = sys_slice_mut(&mut ws);
        // SAFETY: a union of two u32s.
        assert_eq!(
            unsafe { sys[1].imm_data_invalidated_rkey_union.imm_data },
            0x0102_0304u32.to_be()
        );
        assert_eq!(convert::wc_from_c(from_sys(&sys[1])), w);
        assert_eq!(
            to_sys(convert::cap_to_c(&q.cap)).max_send_wr,
            q.cap.max_send_wr
        );
    }

    #[test]
    fn cm_parameters_read_the_same_through_either_type() {
        let p = ConnParam {
            private_data: vec![1, 2, 3],
            rnr_retry_count: 6,
            qp_num: 0x12_3456,
            ..ConnParam::default()
        };
        let mut c = cm::conn_param_to_c(&p).unwrap();
        let s = sys_mut(&mut c);
        assert_eq!(
            (s.private_data_len, s.rnr_retry_count, s.qp_num),
            (3, 6, 0x12_3456)
        );
        // SAFETY: points into p.private_data, alive and unchanged.
        let data = unsafe { cm::private_data(s.private_data, s.private_data_len) };
        assert_eq!(cm::conn_param_from_c(from_sys(s), data), p);
        let mut u = UdParam {
            qkey: 0x1111_1111,
            qp_num: 7,
            ..UdParam::default()
        };
        u.ah_attr.grh.dgid.0[15] = 9;
        let mut c = cm::ud_param_to_c(&u).unwrap();
        let s = sys_mut(&mut c);
        assert_eq!((s.qkey, s.qp_num), (0x1111_1111, 7));
        assert_eq!(cm::ud_param_from_c(from_sys(s), &[]), u);
    }
}
