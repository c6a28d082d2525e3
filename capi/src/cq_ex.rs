//! Extended completion queues (`ibv_create_cq_ex` + `ibv_start_poll` /
//! `ibv_next_poll` / `ibv_end_poll` and the `ibv_wc_read_*` accessors, man page
//! `ibv_create_cq_ex(3)`). Every CQ is an `ibv_cq_ex`; polling takes one completion
//! at a time from the device with the same `Device::poll_cq` as `ibv_poll_cq`, and
//! the current one's `wr_id` and `status` sit in the `ibv_cq_ex` fields, as the
//! inline accessors expect.
//!
//! Safety argument: the `ibv_cq_ex` pointers are ones this library made
//! ([`crate::objects`]); the attribute struct follows the `ibv_create_cq_ex`
//! contract ([`crate::verbs`]).

#![allow(unsafe_code)]

use std::ffi::c_int;

use verbs_api::{Device, WcFlags, WorkCompletion};

use crate::objects::{from_ptr, Context, Cq};
use crate::sys;

/// Fills the polling function pointers of a new CQ.
pub(crate) fn install(raw: &mut sys::ibv_cq_ex) {
    raw.start_poll = Some(start_poll);
    raw.next_poll = Some(next_poll);
    raw.end_poll = Some(end_poll);
    raw.read_opcode = Some(read_opcode);
    raw.read_vendor_err = Some(read_vendor_err);
    raw.read_byte_len = Some(read_byte_len);
    raw.read_imm_data = Some(read_imm_data);
    raw.read_qp_num = Some(read_qp_num);
    raw.read_src_qp = Some(read_src_qp);
    raw.read_wc_flags = Some(read_wc_flags);
    raw.read_slid = Some(read_slid);
    raw.read_sl = Some(read_sl);
    raw.read_dlid_path_bits = Some(read_dlid_path_bits);
}

/// The completion fields a CQ created with `wc_flags` outside these cannot report.
const SUPPORTED_WC_FLAGS: u64 = (sys::IBV_WC_EX_WITH_BYTE_LEN
    | sys::IBV_WC_EX_WITH_IMM
    | sys::IBV_WC_EX_WITH_QP_NUM
    | sys::IBV_WC_EX_WITH_SRC_QP
    | sys::IBV_WC_EX_WITH_SLID
    | sys::IBV_WC_EX_WITH_SL
    | sys::IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

pub(crate) unsafe extern "C" fn vctx_create_cq_ex(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_cq_init_attr_ex,
) -> *mut sys::ibv_cq_ex {
    // SAFETY: module safety argument.
    let (Some(ctx), Some(a)) = (unsafe { Context::from_ptr(context) }, unsafe {
        attr.as_ref()
    }) else {
        crate::verbs::set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    if a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
        crate::verbs::set_errno(crate::verbs::unsupported(
            "ibv_create_cq_ex with completion timestamps, flow tags or other extra fields",
        ));
        return std::ptr::null_mut();
    }
    // SAFETY: module safety argument.
    let ch = match unsafe { crate::verbs::channel_id(a.channel) } {
        Ok(c) => c,
        Err(e) => {
            crate::verbs::set_errno(e);
            return std::ptr::null_mut();
        }
    };
    match ctx.dev.create_cq_with_vector(a.cqe, ch, a.comp_vector) {
        Ok(id) => crate::verbs::new_cq(ctx, id, a.cqe as c_int, a.cq_context, a.channel),
        Err(e) => {
            crate::verbs::set_errno(e.errno());
            std::ptr::null_mut()
        }
    }
}

/// Takes the next completion into the CQ's current slot; ENOENT when empty.
fn advance(cq: *mut sys::ibv_cq_ex, first: bool) -> c_int {
    // SAFETY: module safety argument.
    let Some(c) = (unsafe { from_ptr::<_, Cq>(cq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the CQ's context pointer is its live context. Polling is the data path:
    // not looked up among the open contexts (crate::objects).
    let Some(ctx) = (unsafe { Context::from_ptr_unchecked(c.raw.context) }) else {
        return libc::EINVAL;
    };
    let mut q = c.polled.lock();
    if !first {
        q.pop_front();
    }
    if q.is_empty() {
        let mut v = Vec::with_capacity(16);
        if let Err(e) = ctx.dev.poll_cq(c.id, 16, &mut v) {
            return e.errno();
        }
        q.extend(v);
    }
    match q.front() {
        Some(w) => {
            // SAFETY: the program's CQ; these two fields are what the inline
            // accessors read, written while it waits in start/next_poll.
            unsafe {
                (*cq).wr_id = w.wr_id;
                (*cq).status = w.status.as_u32();
            }
            0
        }
        None => libc::ENOENT,
    }
}

unsafe extern "C" fn start_poll(
    cq: *mut sys::ibv_cq_ex,
    _attr: *mut sys::ibv_poll_cq_attr,
) -> c_int {
    advance(cq, true)
}

unsafe extern "C" fn next_poll(cq: *mut sys::ibv_cq_ex) -> c_int {
    advance(cq, false)
}

unsafe extern "C" fn end_poll(cq: *mut sys::ibv_cq_ex) {
    // SAFETY: module safety argument.
    if let Some(c) = unsafe { from_ptr::<_, Cq>(cq) } {
        c.polled.lock().pop_front();
    }
}

fn current<T: Default>(cq: *mut sys::ibv_cq_ex, f: impl FnOnce(&WorkCompletion) -> T) -> T {
    // SAFETY: module safety argument.
    unsafe { from_ptr::<_, Cq>(cq) }
        .and_then(|c| c.polled.lock().front().map(f))
        .unwrap_or_default()
}

unsafe extern "C" fn read_opcode(cq: *mut sys::ibv_cq_ex) -> sys::ibv_wc_opcode {
    current(cq, |w| w.opcode.as_u32())
}
unsafe extern "C" fn read_vendor_err(cq: *mut sys::ibv_cq_ex) -> u32 {
    current(cq, |w| w.vendor_err)
}
unsafe extern "C" fn read_byte_len(cq: *mut sys::ibv_cq_ex) -> u32 {
    current(cq, |w| w.byte_len)
}
/// Also `ibv_wc_read_invalidated_rkey` (the same function, its result in host
/// order): the union of `ibv_wc`, as `convert::wc_to_c` fills it.
unsafe extern "C" fn read_imm_data(cq: *mut sys::ibv_cq_ex) -> u32 {
    current(cq, |w| {
        if w.wc_flags.contains(WcFlags::WITH_INV) {
            w.invalidated_rkey
        } else {
            w.imm_data.to_be()
        }
    })
}
unsafe extern "C" fn read_qp_num(cq: *mut sys::ibv_cq_ex) -> u32 {
    current(cq, |w| w.qp_num)
}
unsafe extern "C" fn read_src_qp(cq: *mut sys::ibv_cq_ex) -> u32 {
    current(cq, |w| w.src_qp)
}
unsafe extern "C" fn read_wc_flags(cq: *mut sys::ibv_cq_ex) -> std::ffi::c_uint {
    current(cq, |w| w.wc_flags.bits())
}
unsafe extern "C" fn read_slid(cq: *mut sys::ibv_cq_ex) -> u32 {
    current(cq, |w| u32::from(w.slid))
}
unsafe extern "C" fn read_sl(cq: *mut sys::ibv_cq_ex) -> u8 {
    current(cq, |w| w.sl)
}
unsafe extern "C" fn read_dlid_path_bits(cq: *mut sys::ibv_cq_ex) -> u8 {
    current(cq, |w| w.dlid_path_bits)
}
