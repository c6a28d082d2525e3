//! Exports the emulator does not implement, so every program linked against
//! rdma-core's libibverbs loads (binaries are linked BIND_NOW): each fails cleanly
//! with EOPNOTSUPP (public verbs) or ENOSYS (the IBVERBS_PRIVATE_34 provider
//! interface, which only providers such as libmlx5 call), saying so on stderr, and
//! never crashes. `verbs_register_driver_34`, which providers call from their
//! constructors, accepts and ignores the driver. Also the pure rate conversions of
//! libibverbs, which need no device.
//!
//! Safety: these functions take no pointers they follow; the x86-64 and aarch64 C
//! calling conventions let a function declared with fewer parameters than its
//! callers pass ignore the rest (the caller cleans up), so one shape serves each
//! return type.
//!
//! (`unsafe_code` is allowed here only because `#[no_mangle]` counts as unsafe: the
//! exported names must be exactly libibverbs' names.)

#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::AtomicBool;

use crate::verbs::{set_errno, unsupported};

fn private(name: &str) -> c_int {
    eprintln!("rdma-emu libibverbs: {name} (provider interface) is not supported (ENOSYS)");
    libc::ENOSYS
}

/// Functions returning an errno (`int`): EOPNOTSUPP.
macro_rules! unsupported_int {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported, EOPNOTSUPP.")]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            let e = unsupported(stringify!($name));
            set_errno(e);
            e
        }
    )*};
}

/// Functions returning a pointer: NULL with errno EOPNOTSUPP.
macro_rules! unsupported_ptr {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported, NULL with errno EOPNOTSUPP.")]
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            set_errno(unsupported(stringify!($name)));
            std::ptr::null_mut()
        }
    )*};
}

/// Functions returning nothing: a message only.
macro_rules! unsupported_void {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported; does nothing.")]
        #[no_mangle]
        pub extern "C" fn $name() {
            unsupported(stringify!($name));
        }
    )*};
}

/// Private provider-interface functions returning an errno: ENOSYS.
macro_rules! private_int {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "` (IBVERBS_PRIVATE_34): ENOSYS.")]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            let e = private(stringify!($name));
            set_errno(e);
            e
        }
    )*};
}

/// Private provider-interface functions returning a pointer: NULL, errno ENOSYS.
macro_rules! private_ptr {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "` (IBVERBS_PRIVATE_34): NULL, errno ENOSYS.")]
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            set_errno(private(stringify!($name)));
            std::ptr::null_mut()
        }
    )*};
}

/// Private provider-interface functions returning nothing.
macro_rules! private_void {
    ($($name:ident),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($name), "` (IBVERBS_PRIVATE_34): does nothing.")]
        #[no_mangle]
        pub extern "C" fn $name() {
            private(stringify!($name));
        }
    )*};
}

unsupported_int!(ibv_resolve_eth_l2_from_gid, ibv_query_ece, ibv_set_ece,);
unsupported_ptr!(
    ibv_import_device,
    ibv_import_pd,
    ibv_import_mr,
    ibv_import_dm,
    ibv_reg_dmabuf_mr
);
unsupported_void!(
    ibv_unimport_pd,
    ibv_unimport_mr,
    ibv_unimport_dm,
    ibv_copy_qp_attr_from_kern,
    ibv_copy_ah_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
);

private_int!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_poll_cq,
    ibv_cmd_post_recv,
    ibv_cmd_post_send,
    ibv_cmd_post_srq_recv,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_req_notify_cq,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    ibv_read_ibdev_sysfs_file,
    __ioctl_final_num_attrs,
);
private_ptr!(_verbs_init_and_alloc_context, verbs_open_device);
private_void!(verbs_init_cq, verbs_set_ops, verbs_uninit_context);

/// `verbs_register_driver_34`: providers (libmlx5, libefa) register from their
/// constructors when perftest loads them; the emulator has no use for them.
#[no_mangle]
pub extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// `ibv_register_driver` (IBVERBS_1.1): the provider registration of libibverbs
/// before rdma-core, which an old provider's constructor calls; rdma-core has only
/// warned since. The emulator has no use for the driver either: it says so and
/// ignores it.
#[no_mangle]
pub extern "C" fn ibv_register_driver(_name: *const c_void, _init: *const c_void) {
    eprintln!(
        "rdma-emu libibverbs: ibv_register_driver: an old-style provider is ignored \
         (the emulator is the only device)"
    );
}

/// `__verbs_log`: a provider's debug log; dropped.
#[no_mangle]
pub extern "C" fn __verbs_log() {}

/// `verbs_allow_disassociate_destroy` (a data symbol of the provider interface).
#[no_mangle]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);

/// `enum ibv_rate` values and what they mean: (rate, multiple of 2.5 Gb/s, Mb/s).
const RATES: &[(c_int, c_int, c_int)] = &[
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 6, 14062),
    (12, 22, 56250),
    (13, 45, 112500),
    (14, 67, 168750),
    (15, 10, 25781),
    (16, 40, 103125),
    (17, 80, 206250),
    (18, 120, 309375),
    (19, 160, 412500),
    (20, 20, 50000),
    (21, 160, 400000),
    (22, 240, 600000),
    (23, 320, 800000),
    (24, 480, 1200000),
];

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s; 0 for unknown.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(0, |r| r.1)
}

/// `mult_to_ibv_rate`.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .take(10)
        .find(|r| r.1 == mult)
        .map_or(0, |r| r.0)
}

/// `ibv_rate_to_mbps`.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(0, |r| r.2)
}

/// `mbps_to_ibv_rate`.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_round_trip() {
        assert_eq!(ibv_rate_to_mult(3), 4); // IBV_RATE_10_GBPS
        assert_eq!(mult_to_ibv_rate(4), 3);
        assert_eq!(ibv_rate_to_mbps(7), 40000);
        assert_eq!(mbps_to_ibv_rate(100), 0);
    }

    #[test]
    fn unsupported_calls_fail_cleanly() {
        assert_eq!(ibv_query_ece(), libc::EOPNOTSUPP);
        assert!(ibv_import_device().is_null());
        assert_eq!(ibv_cmd_alloc_pd(), libc::ENOSYS);
        verbs_register_driver_34(std::ptr::null());
    }
}
