//! The exported verbs: every `ibv_*` function of `libibverbs.so.1` that the emulator
//! implements, plus the per-context operations the inline verbs of `verbs.h` call
//! through `ctx->ops` and `verbs_context` (post_send, post_recv, poll_cq,
//! req_notify_cq, post_srq_recv, the MW ops, query_port, query_device_ex).
//!
//! Each function turns its pointers into objects ([`crate::objects`]), converts the C
//! structs ([`crate::convert`]), calls the [`Device`] verb of the context's
//! `EmuDevice` and writes the answer back. Errors are the errno libibverbs gives:
//! returned (positive) by the `int` verbs, in `errno` with NULL or -1 for the others.
//!
//! # Safety argument
//!
//! Every pointer argument is, by the libibverbs contract the caller keeps (the man
//! page of each verb), either null (refused with EINVAL where the contract allows
//! it) or valid for the access the verb documents: objects this library returned
//! and has not freed ([`crate::objects`]), attribute structs and arrays the caller
//! owns, of the documented type and length (`num_entries` for `ibv_poll_cq`,
//! `num_sge` for SGE lists, `attr_size` for the extended queries, NUL-terminated
//! strings for paths). Nothing here keeps a pointer to caller memory after returning
//! except registered memory ([`crate::memory`]).

#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;
use std::time::Duration;

use emu_core::nic::{EmuConfig, EmuDevice};
use parking_lot::Mutex;
use verbs_api::{
    AccessFlags, AsyncEventType, ChannelId, Device, Error, EventElement, Gid, MemBuf, MwBind,
    MwType, PortState, QpAttrMask, QpInitAttr, QpType, ReregMrFlags, SendFlags, SrqAttrMask,
    WcStatus, WorkCompletion, WrOperation,
};

use crate::config::{self, DeviceConfig};
use crate::convert;
use crate::memory::UserMemory;
use crate::objects::{
    free, from_ptr, into_ptr, Ah, Channel, Context, Cq, Device as Dev, Mr, Mw, Pd, Qp, Srq,
};
use crate::sys;

const EINVAL: c_int = libc::EINVAL;
const EOPNOTSUPP: c_int = libc::EOPNOTSUPP;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Says on stderr that `what` is not supported, and gives EOPNOTSUPP.
pub(crate) fn unsupported(what: &str) -> c_int {
    eprintln!("rdma-emu libibverbs: {what} is not supported by the emulator (EOPNOTSUPP)");
    EOPNOTSUPP
}

/// An error as the `int` verbs return it (and in errno too).
fn fail(e: &Error) -> c_int {
    let n = e.errno();
    if n == EOPNOTSUPP {
        eprintln!("rdma-emu libibverbs: not supported by the emulator: {e}");
    }
    set_errno(n);
    n
}

/// Null with errno, for the verbs that return pointers.
fn null<T>(errno: c_int) -> *mut T {
    set_errno(errno);
    std::ptr::null_mut()
}

fn status(r: verbs_api::Result<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

// ---------------------------------------------------------------- devices

/// The configured devices, made once per process.
fn devices() -> &'static [Dev] {
    // Never grows after it is made, so the entries' addresses are stable.
    static DEVICES: OnceLock<Vec<Dev>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        let cfgs = config::from_env(|k| std::env::var(k).ok()).unwrap_or_else(|e| {
            eprintln!("rdma-emu libibverbs: bad device configuration: {e}; no devices");
            Vec::new()
        });
        cfgs.into_iter()
            .enumerate()
            .map(|(index, cfg)| device_entry(cfg, index))
            .collect()
    })
}

fn device_entry(cfg: DeviceConfig, index: usize) -> Dev {
    let path = format!("/sys/class/infiniband/{}", cfg.name);
    Dev {
        raw: sys::ibv_device {
            _ops: sys::_ibv_device_ops::default(),
            node_type: sys::IBV_NODE_CA,
            transport_type: sys::IBV_TRANSPORT_IB,
            name: convert::c_string(&cfg.name),
            dev_name: convert::c_string(&format!("uverbs-{}", cfg.name)),
            dev_path: convert::c_string("/dev/null"),
            ibdev_path: convert::c_string(&path),
        },
        cfg,
        index,
        nic: Mutex::default(),
    }
}

/// The node GUID `EmuDevice` reports for the configured address (before the device
/// is opened; an automatically addressed device may end up on another address).
fn guid_of(cfg: &DeviceConfig) -> u64 {
    u64::from_be_bytes([0x02, 0, 0, 0xFF, 0xFE, 0, 0, 0]) | u64::from(u32::from(cfg.ip))
}

/// `ibv_get_device_list`: the configured emulated devices, NULL-terminated.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut sys::ibv_device {
    let devs = devices();
    let mut list: Vec<*mut sys::ibv_device> = devs
        .iter()
        .map(|d| std::ptr::addr_of!(d.raw).cast_mut())
        .collect();
    list.push(std::ptr::null_mut());
    if !num_devices.is_null() {
        // SAFETY: caller's out parameter.
        unsafe { *num_devices = (list.len() - 1) as c_int };
    }
    Box::into_raw(list.into_boxed_slice()).cast()
}

/// `ibv_free_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut sys::ibv_device) {
    if list.is_null() {
        return;
    }
    let len = devices().len() + 1;
    // SAFETY: made by ibv_get_device_list with exactly this length.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, len)) });
}

/// `ibv_get_device_name`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut sys::ibv_device) -> *const c_char {
    // SAFETY: module safety argument.
    match unsafe { from_ptr::<_, Dev>(device) } {
        Some(d) => d.raw.name.as_ptr(),
        None => null(EINVAL),
    }
}

/// `ibv_get_device_guid`: in network byte order.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut sys::ibv_device) -> u64 {
    // SAFETY: module safety argument.
    unsafe { from_ptr::<_, Dev>(device) }.map_or(0, |d| guid_of(&d.cfg).to_be())
}

/// `ibv_get_device_index`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut sys::ibv_device) -> c_int {
    // SAFETY: module safety argument.
    unsafe { from_ptr::<_, Dev>(device) }.map_or(-1, |d| d.index as c_int)
}

/// Opens the emulated NIC of `cfg`; an automatically addressed device moves on to the
/// next 127.0.0.x while the address is taken by another process.
fn open_emu(cfg: &DeviceConfig) -> verbs_api::Result<EmuDevice> {
    let open = |ip| {
        EmuDevice::open(EmuConfig {
            name: cfg.name.clone(),
            ip,
            port: cfg.port,
            ..EmuConfig::default()
        })
    };
    if !cfg.auto_ip {
        return open(cfg.ip);
    }
    let mut last = Error::InvalidArgument("no free address");
    for ip in config::auto_candidates(cfg.ip) {
        match open(ip) {
            Err(e @ Error::Os { errno, .. }) if errno == libc::EADDRINUSE => last = e,
            r => return r,
        }
    }
    Err(last)
}

/// `ibv_open_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut sys::ibv_device) -> *mut sys::ibv_context {
    // SAFETY: module safety argument.
    let Some(d) = (unsafe { from_ptr::<_, Dev>(device) }) else {
        return null(EINVAL);
    };
    let dev = {
        let mut nic = d.nic.lock();
        match nic.upgrade() {
            Some(dev) => dev,
            None => match open_emu(&d.cfg) {
                Ok(dev) => {
                    let dev = std::sync::Arc::new(dev);
                    *nic = std::sync::Arc::downgrade(&dev);
                    dev
                }
                Err(e) => {
                    eprintln!("rdma-emu libibverbs: cannot open {}: {e}", d.cfg.name);
                    return null(e.errno());
                }
            },
        }
    };
    let async_fd = dev.async_fd().unwrap_or(-1);
    let mut vctx = sys::verbs_context {
        query_port: Some(vctx_query_port),
        query_device_ex: Some(vctx_query_device_ex),
        create_cq_ex: Some(crate::cq_ex::vctx_create_cq_ex),
        create_qp_ex: Some(vctx_create_qp_ex),
        sz: std::mem::size_of::<sys::verbs_context>(),
        ..Default::default()
    };
    vctx.context.device = device;
    vctx.context.cmd_fd = -1;
    vctx.context.async_fd = async_fd;
    vctx.context.num_comp_vectors = 1;
    vctx.context.abi_compat = usize::MAX as *mut c_void;
    let ops = &mut vctx.context.ops;
    ops.poll_cq = Some(op_poll_cq);
    ops.req_notify_cq = Some(op_req_notify_cq);
    ops.post_send = Some(op_post_send);
    ops.post_recv = Some(op_post_recv);
    ops.post_srq_recv = Some(op_post_srq_recv);
    ops.alloc_mw = Some(op_alloc_mw);
    ops.bind_mw = Some(op_bind_mw);
    ops.dealloc_mw = Some(op_dealloc_mw);
    let ctx = Box::new(Context {
        vctx,
        dev,
        cqs: Mutex::default(),
        qps: Mutex::default(),
        srqs: Mutex::default(),
    });
    Box::leak(ctx).as_ptr()
}

/// `ibv_close_device`: stops the emulated NIC. Objects the program did not destroy
/// are leaked, as their pointers may still be in its hands.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut sys::ibv_context) -> c_int {
    // SAFETY: module safety argument.
    let Some(ctx) = (unsafe { Context::from_ptr(context) }) else {
        return EINVAL;
    };
    // SAFETY: made by Box::leak in ibv_open_device; the caller gives it up.
    drop(unsafe { Box::from_raw(std::ptr::from_ref(ctx).cast_mut()) });
    0
}

/// The context of a verb's first argument, or return `$err` from the verb.
macro_rules! ctx_or {
    ($p:expr, $err:expr) => {
        // SAFETY: module safety argument.
        match unsafe { Context::from_ptr($p) } {
            Some(c) => c,
            None => return $err,
        }
    };
}

/// The object behind a pointer argument, or return `$err` from the verb.
macro_rules! obj_or {
    ($t:ty, $p:expr, $err:expr) => {
        // SAFETY: module safety argument.
        match unsafe { from_ptr::<_, $t>($p) } {
            Some(o) => o,
            None => return $err,
        }
    };
}

/// Writes `value` through the out pointer `p` if it is not null.
macro_rules! out {
    ($p:expr, $value:expr) => {
        if !$p.is_null() {
            // SAFETY: caller's out parameter (module safety argument).
            unsafe { $p.write($value) };
        }
    };
}

/// Copies the first `len` bytes of `value` to `p` (for extensible structs whose
/// caller tells their size).
unsafe fn write_prefix<T>(p: *mut T, value: &T, len: usize) {
    let n = len.min(std::mem::size_of::<T>());
    // SAFETY: the caller's struct has at least `len` bytes (module safety argument).
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(value).cast::<u8>(), p.cast::<u8>(), n)
    };
}

/// `ibv_query_device`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_device_attr,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    if attr.is_null() {
        return EINVAL;
    }
    match ctx.dev.query_device() {
        Ok(a) => {
            out!(attr, convert::device_attr_to_c(&a));
            0
        }
        Err(e) => fail(&e),
    }
}

unsafe extern "C" fn vctx_query_device_ex(
    context: *mut sys::ibv_context,
    _input: *const sys::ibv_query_device_ex_input,
    attr: *mut sys::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    if attr.is_null() {
        return EINVAL;
    }
    match ctx.dev.query_device() {
        Ok(a) => {
            let ex = sys::ibv_device_attr_ex {
                orig_attr: convert::device_attr_to_c(&a),
                phys_port_cnt_ex: u32::from(a.phys_port_cnt),
                ..Default::default()
            };
            // SAFETY: the caller's struct has attr_size bytes.
            unsafe { write_prefix(attr, &ex, attr_size) };
            0
        }
        Err(e) => fail(&e),
    }
}

fn port_attr(ctx: &Context, port: u8) -> Result<sys::ibv_port_attr, c_int> {
    ctx.dev
        .query_port(port)
        .map(|p| convert::port_attr_to_c(&p))
        .map_err(|e| fail(&e))
}

/// `ibv_query_port` (the exported, old-ABI entry: `struct _compat_ibv_port_attr`).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut sys::ibv_context,
    port_num: u8,
    port_attr_out: *mut sys::ibv_port_attr,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    match port_attr(ctx, port_num) {
        Ok(a) if !port_attr_out.is_null() => {
            // SAFETY: the caller's struct is at least the compat layout.
            unsafe {
                write_prefix(
                    port_attr_out,
                    &a,
                    std::mem::size_of::<sys::_compat_ibv_port_attr>(),
                )
            };
            0
        }
        Ok(_) => EINVAL,
        Err(e) => e,
    }
}

unsafe extern "C" fn vctx_query_port(
    context: *mut sys::ibv_context,
    port_num: u8,
    attr: *mut sys::ibv_port_attr,
    attr_len: usize,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    match port_attr(ctx, port_num) {
        Ok(a) if !attr.is_null() => {
            // SAFETY: the caller's struct has attr_len bytes.
            unsafe { write_prefix(attr, &a, attr_len) };
            0
        }
        Ok(_) => EINVAL,
        Err(e) => e,
    }
}

/// `ibv_query_gid`: 0, or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut sys::ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut sys::ibv_gid,
) -> c_int {
    let ctx = ctx_or!(context, -1);
    let Ok(index) = u32::try_from(index) else {
        set_errno(EINVAL);
        return -1;
    };
    match ctx.dev.query_gid(port_num, index) {
        Ok(g) => {
            out!(gid, convert::gid_to_c(&g));
            0
        }
        Err(e) => {
            set_errno(e.errno());
            -1
        }
    }
}

/// The GID table entry `index` of `port`: RoCEv2, as every emulated GID is.
fn gid_entry(ctx: &Context, port: u8, index: u32) -> verbs_api::Result<sys::ibv_gid_entry> {
    let g = ctx.dev.query_gid(port, index)?;
    Ok(sys::ibv_gid_entry {
        gid: convert::gid_to_c(&g),
        gid_index: index,
        port_num: u32::from(port),
        gid_type: sys::IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    })
}

/// `_ibv_query_gid_ex` (what the inline `ibv_query_gid_ex` calls).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut sys::ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut sys::ibv_gid_entry,
    _flags: u32,
    entry_size: usize,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    let Ok(port) = u8::try_from(port_num) else {
        return EINVAL;
    };
    match gid_entry(ctx, port, gid_index) {
        Ok(g) if !entry.is_null() => {
            // SAFETY: the caller's entry has entry_size bytes.
            unsafe { write_prefix(entry, &g, entry_size) };
            0
        }
        Ok(_) => EINVAL,
        Err(e) => fail(&e),
    }
}

/// `_ibv_query_gid_table`: the valid GIDs of every port; the count, or -errno.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut sys::ibv_context,
    entries: *mut sys::ibv_gid_entry,
    max_entries: usize,
    _flags: u32,
    entry_size: usize,
) -> isize {
    let ctx = ctx_or!(context, -(EINVAL as isize));
    if entries.is_null() || entry_size < std::mem::size_of::<sys::ibv_gid_entry>() {
        return -(EINVAL as isize);
    }
    let len = ctx.dev.query_port(1).map_or(0, |p| p.gid_tbl_len);
    let mut n = 0usize;
    for i in 0..len {
        if n == max_entries {
            break;
        }
        if let Ok(g) = gid_entry(ctx, 1, i) {
            // SAFETY: the caller's array has max_entries entries of entry_size bytes.
            unsafe { write_prefix(entries.byte_add(n * entry_size), &g, entry_size) };
            n += 1;
        }
    }
    n as isize
}

/// `ibv_query_gid_type` (private, used by ibv_devinfo and librdmacm): every GID is
/// RoCEv2 (`IBV_GID_TYPE_SYSFS_ROCE_V2`, 1, in this function's sysfs numbering).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut sys::ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_uint,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    match ctx.dev.query_gid(port_num, index) {
        Ok(_) => {
            out!(gid_type, 1);
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_query_pkey`: the P_Key in network order; 0 or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut sys::ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    let ctx = ctx_or!(context, -1);
    match u16::try_from(index)
        .map_err(|_| Error::InvalidArgument("index"))
        .and_then(|i| ctx.dev.query_pkey(port_num, i))
    {
        Ok(p) => {
            out!(pkey, p.to_be());
            0
        }
        Err(e) => {
            set_errno(e.errno());
            -1
        }
    }
}

/// `ibv_get_pkey_index`: the index of a P_Key (network order), or -1.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut sys::ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    let ctx = ctx_or!(context, -1);
    let len = ctx.dev.query_port(port_num).map_or(0, |p| p.pkey_tbl_len);
    (0..len)
        .find(|&i| ctx.dev.query_pkey(port_num, i).ok() == Some(u16::from_be(pkey)))
        .map_or(-1, c_int::from)
}

// ---------------------------------------------------------------- PD, MR

/// `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut sys::ibv_context) -> *mut sys::ibv_pd {
    let ctx = ctx_or!(context, null(EINVAL));
    match ctx.dev.alloc_pd() {
        Ok(id) => into_ptr(Pd {
            raw: sys::ibv_pd {
                context,
                handle: id.0,
            },
            id,
        }),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_dealloc_pd`: EBUSY while objects use it.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut sys::ibv_pd) -> c_int {
    let p = obj_or!(Pd, pd, EINVAL);
    let ctx = ctx_or!(p.raw.context, EINVAL);
    match ctx.dev.dealloc_pd(p.id) {
        // SAFETY: made by ibv_alloc_pd; destroyed once.
        Ok(()) => unsafe {
            free::<_, Pd>(pd);
            0
        },
        Err(e) => fail(&e),
    }
}

fn user_membuf(addr: *mut c_void, length: usize) -> Option<MemBuf> {
    // SAFETY: the ibv_reg_mr contract (crate::memory).
    let mem = unsafe { UserMemory::new(addr.cast(), length) }?;
    Some(MemBuf::from_external(Box::new(mem)))
}

/// `ibv_reg_mr_iova2`: the emulator registers memory at its own address, so `iova`
/// must equal `addr` (EOPNOTSUPP otherwise).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut sys::ibv_mr {
    let p = obj_or!(Pd, pd, null(EINVAL));
    let ctx = ctx_or!(p.raw.context, null(EINVAL));
    if iova != addr as u64 {
        return null(unsupported(
            "ibv_reg_mr_iova with an iova other than the address",
        ));
    }
    let Some(buf) = user_membuf(addr, length) else {
        return null(EINVAL);
    };
    match ctx
        .dev
        .reg_mr(p.id, &buf, 0, length, AccessFlags::from_bits_retain(access))
    {
        Ok(info) => into_ptr(Mr {
            raw: sys::ibv_mr {
                context: p.raw.context,
                pd,
                addr,
                length,
                handle: info.lkey,
                lkey: info.lkey,
                rkey: info.rkey,
            },
        }),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

/// `ibv_reg_mr_iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut sys::ibv_mr {
    // SAFETY: same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

/// `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut sys::ibv_mr) -> c_int {
    let m = obj_or!(Mr, mr, EINVAL);
    let ctx = ctx_or!(m.raw.context, EINVAL);
    match ctx.dev.dereg_mr(m.raw.lkey) {
        // SAFETY: made by ibv_reg_mr; destroyed once.
        Ok(()) => unsafe {
            free::<_, Mr>(mr);
            0
        },
        Err(e) => fail(&e),
    }
}

/// `ibv_rereg_mr`: 0, or the IBV_REREG_MR_ERR_* code libibverbs gives.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut sys::ibv_mr,
    flags: c_int,
    pd: *mut sys::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let m = obj_or!(Mr, mr, sys::IBV_REREG_MR_ERR_INPUT);
    let ctx = ctx_or!(m.raw.context, sys::IBV_REREG_MR_ERR_INPUT);
    let flags = ReregMrFlags::from_bits_retain(flags as u32);
    let new_pd = if flags.contains(ReregMrFlags::CHANGE_PD) {
        Some(obj_or!(Pd, pd, sys::IBV_REREG_MR_ERR_INPUT).id)
    } else {
        None
    };
    let range = if flags.contains(ReregMrFlags::CHANGE_TRANSLATION) {
        match user_membuf(addr, length) {
            Some(b) => Some(b),
            None => return sys::IBV_REREG_MR_ERR_INPUT,
        }
    } else {
        None
    };
    let r = ctx.dev.rereg_mr(
        m.raw.lkey,
        flags,
        new_pd,
        range.as_ref().map(|b| (b, 0, length)),
        AccessFlags::from_bits_retain(access as u32),
    );
    match r {
        Ok(info) => {
            // SAFETY: the program's own MR object, which it does not use during the call.
            let raw = unsafe { &mut *mr };
            raw.lkey = info.lkey;
            raw.rkey = info.rkey;
            raw.handle = info.lkey;
            if new_pd.is_some() {
                raw.pd = pd;
            }
            if range.is_some() {
                raw.addr = addr;
                raw.length = length;
            }
            0
        }
        Err(e) => {
            fail(&e);
            sys::IBV_REREG_MR_ERR_CMD
        }
    }
}

// ---------------------------------------------------------------- channels, CQs

/// `ibv_create_comp_channel`: its fd is readable while an event is pending.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut sys::ibv_context,
) -> *mut sys::ibv_comp_channel {
    let ctx = ctx_or!(context, null(EINVAL));
    let made = ctx
        .dev
        .create_comp_channel()
        .and_then(|id| Ok((id, ctx.dev.comp_channel_fd(id)?)));
    match made {
        Ok((id, fd)) => into_ptr(Channel {
            raw: sys::ibv_comp_channel {
                context,
                fd,
                refcnt: 0,
            },
            id,
        }),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_destroy_comp_channel`: EBUSY while a CQ uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut sys::ibv_comp_channel) -> c_int {
    let ch = obj_or!(Channel, channel, EINVAL);
    let ctx = ctx_or!(ch.raw.context, EINVAL);
    match ctx.dev.destroy_comp_channel(ch.id) {
        // SAFETY: made by ibv_create_comp_channel; destroyed once.
        Ok(()) => unsafe {
            free::<_, Channel>(channel);
            0
        },
        Err(e) => fail(&e),
    }
}

/// Makes a CQ object for a created device CQ and records it in the context.
pub(crate) fn new_cq(
    ctx: &Context,
    id: verbs_api::CqId,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
) -> *mut sys::ibv_cq_ex {
    let mut raw = sys::ibv_cq_ex {
        context: ctx.as_ptr(),
        channel,
        cq_context,
        handle: id.0,
        cqe,
        ..Default::default()
    };
    crate::cq_ex::install(&mut raw);
    let p = into_ptr::<sys::ibv_cq_ex, Cq>(Cq {
        raw,
        id,
        polled: Mutex::default(),
    });
    ctx.cqs.lock().insert(id.0, p as usize);
    p
}

/// The channel behind a `ibv_comp_channel` pointer (None for null).
pub(crate) unsafe fn channel_id(
    channel: *mut sys::ibv_comp_channel,
) -> Result<Option<ChannelId>, c_int> {
    if channel.is_null() {
        return Ok(None);
    }
    Ok(Some(obj_or!(Channel, channel, Err(EINVAL)).id))
}

/// `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut sys::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut sys::ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut sys::ibv_cq {
    let ctx = ctx_or!(context, null(EINVAL));
    // SAFETY: module safety argument.
    let ch = match unsafe { channel_id(channel) } {
        Ok(c) => c,
        Err(e) => return null(e),
    };
    let Ok(n) = u32::try_from(cqe) else {
        return null(EINVAL);
    };
    match ctx.dev.create_cq(n, ch) {
        Ok(id) => new_cq(ctx, id, cqe, cq_context, channel).cast(),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_destroy_cq`: EBUSY while a QP uses it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut sys::ibv_cq) -> c_int {
    let c = obj_or!(Cq, cq, EINVAL);
    let ctx = ctx_or!(c.raw.context, EINVAL);
    match ctx.dev.destroy_cq(c.id) {
        Ok(()) => {
            ctx.cqs.lock().remove(&c.id.0);
            // SAFETY: made by ibv_create_cq; destroyed once.
            unsafe { free::<_, Cq>(cq) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_resize_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut sys::ibv_cq, cqe: c_int) -> c_int {
    let c = obj_or!(Cq, cq, EINVAL);
    let ctx = ctx_or!(c.raw.context, EINVAL);
    let Ok(n) = u32::try_from(cqe) else {
        return EINVAL;
    };
    match ctx.dev.resize_cq(c.id, n) {
        Ok(()) => {
            // SAFETY: the program's CQ object; `cqe` is the field it reads back.
            unsafe { (*cq).cqe = cqe };
            0
        }
        Err(e) => fail(&e),
    }
}

/// True if `fd` is in non-blocking mode (then the event calls return EAGAIN instead
/// of waiting, as rdma-core's `read()` on the fd would).
fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL only reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// `ibv_get_cq_event`: waits for a completion event on the channel; 0, or -1 with
/// errno (EAGAIN on a non-blocking channel with nothing pending).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut sys::ibv_comp_channel,
    cq: *mut *mut sys::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let ch = obj_or!(Channel, channel, {
        set_errno(EINVAL);
        -1
    });
    let ctx = ctx_or!(ch.raw.context, {
        set_errno(EINVAL);
        -1
    });
    let timeout = nonblocking(ch.raw.fd).then_some(Duration::ZERO);
    match ctx.dev.get_cq_event(ch.id, timeout) {
        Ok(id) => {
            let Some(&p) = ctx.cqs.lock().get(&id.0) else {
                set_errno(libc::EIO);
                return -1;
            };
            let p = p as *mut sys::ibv_cq;
            out!(cq, p);
            // SAFETY: a live CQ of this context (it is in the table).
            out!(cq_context, (*p).cq_context);
            0
        }
        Err(Error::TimedOut) => {
            set_errno(libc::EAGAIN);
            -1
        }
        Err(e) => {
            set_errno(e.errno());
            -1
        }
    }
}

/// `ibv_ack_cq_events`: counted in the CQ, as rdma-core does.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut sys::ibv_cq, nevents: c_uint) {
    // SAFETY: module safety argument.
    if let Some(c) = unsafe { from_ptr::<_, Cq>(cq) } {
        let _guard = c.polled.lock();
        // SAFETY: the program's CQ object; the counter is written under the CQ's lock.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
    }
}

unsafe extern "C" fn op_poll_cq(
    cq: *mut sys::ibv_cq,
    num_entries: c_int,
    wc: *mut sys::ibv_wc,
) -> c_int {
    thread_local! {
        static BUF: RefCell<Vec<WorkCompletion>> = const { RefCell::new(Vec::new()) };
    }
    let c = obj_or!(Cq, cq, -1);
    let ctx = ctx_or!(c.raw.context, -1);
    let Ok(max) = usize::try_from(num_entries) else {
        return -1;
    };
    if wc.is_null() && max > 0 {
        return -1;
    }
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        match ctx.dev.poll_cq(c.id, max, buf) {
            Ok(0) => {
                // A C program polls in a tight loop; on a loaded host that starves the
                // device thread which delivers the completion it is waiting for.
                std::thread::yield_now();
                0
            }
            Ok(n) => {
                for (i, w) in buf.iter().take(n).enumerate() {
                    // SAFETY: the caller's array has num_entries entries; n <= max.
                    unsafe { wc.add(i).write(convert::wc_to_c(w)) };
                }
                n as c_int
            }
            Err(e) => {
                set_errno(e.errno());
                -1
            }
        }
    })
}

unsafe extern "C" fn op_req_notify_cq(cq: *mut sys::ibv_cq, solicited_only: c_int) -> c_int {
    let c = obj_or!(Cq, cq, EINVAL);
    let ctx = ctx_or!(c.raw.context, EINVAL);
    status(ctx.dev.req_notify_cq(c.id, solicited_only != 0))
}

// ---------------------------------------------------------------- QPs

fn qp_type_of(t: sys::ibv_qp_type) -> Result<QpType, c_int> {
    match QpType::try_from(t) {
        Ok(q @ (QpType::Rc | QpType::Uc | QpType::Ud)) => Ok(q),
        _ => Err(unsupported("a QP type other than RC, UC and UD")),
    }
}

/// Creates a QP from the common attributes of `ibv_qp_init_attr(_ex)`.
pub(crate) unsafe fn create_qp_common(
    pd: *mut sys::ibv_pd,
    a: &mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    let p = obj_or!(Pd, pd, null(EINVAL));
    let ctx = ctx_or!(p.raw.context, null(EINVAL));
    let (qp_context, send_cq, recv_cq, srq) = (a.qp_context, a.send_cq, a.recv_cq, a.srq);
    let scq = obj_or!(Cq, send_cq, null(EINVAL));
    let rcq = obj_or!(Cq, recv_cq, null(EINVAL));
    // SAFETY: module safety argument.
    let s = unsafe { from_ptr::<_, Srq>(srq) }.map(|s| s.id);
    let qp_type = match qp_type_of(a.qp_type) {
        Ok(t) => t,
        Err(e) => return null(e),
    };
    let init = QpInitAttr {
        pd: p.id,
        send_cq: scq.id,
        recv_cq: rcq.id,
        qp_type,
        cap: convert::cap_from_c(&a.cap),
        sq_sig_all: a.sq_sig_all != 0,
        srq: s,
    };
    let qpn = match ctx.dev.create_qp(&init) {
        Ok(n) => n,
        Err(e) => return null(fail(&e)),
    };
    if let Ok((_, actual)) = ctx.dev.query_qp(qpn) {
        a.cap = convert::cap_to_c(&actual.cap);
    }
    let mut raw = sys::ibv_qp_ex {
        qp_base: sys::ibv_qp {
            context: ctx.as_ptr(),
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle: qpn,
            qp_num: qpn,
            state: sys::IBV_QPS_RESET,
            qp_type: qp_type.as_u32(),
            ..Default::default()
        },
        ..Default::default()
    };
    crate::qp_ex::install(&mut raw);
    let ptr = into_ptr::<sys::ibv_qp_ex, Qp>(Qp {
        raw,
        building: Mutex::default(),
    });
    ctx.qps.lock().insert(qpn, ptr as usize);
    ptr.cast()
}

/// `ibv_create_qp`: `init_attr->cap` is updated to what the QP got.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut sys::ibv_pd,
    init_attr: *mut sys::ibv_qp_init_attr,
) -> *mut sys::ibv_qp {
    if init_attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *init_attr };
    // SAFETY: module safety argument.
    unsafe { create_qp_common(pd, a) }
}

unsafe extern "C" fn vctx_create_qp_ex(
    context: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> *mut sys::ibv_qp {
    let _ = ctx_or!(context, null(EINVAL));
    if attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let known = sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & !known != 0 {
        return null(unsupported(
            "ibv_create_qp_ex with XRC, RSS, TSO or other extended attributes",
        ));
    }
    if a.comp_mask & sys::IBV_QP_INIT_ATTR_PD == 0 {
        return null(EINVAL);
    }
    let mut basic = sys::ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    // SAFETY: module safety argument.
    let qp = unsafe { create_qp_common(a.pd, &mut basic) };
    a.cap = basic.cap;
    qp
}

/// `ibv_qp_to_qp_ex`: every QP is an `ibv_qp_ex`.
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut sys::ibv_qp) -> *mut sys::ibv_qp_ex {
    qp.cast()
}

/// `ibv_modify_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let ctx = ctx_or!(q.raw.qp_base.context, EINVAL);
    if attr.is_null() {
        return EINVAL;
    }
    let mask = QpAttrMask::from_bits_retain(attr_mask as u32);
    // SAFETY: the caller's attributes.
    let a = match convert::qp_attr_from_c(unsafe { &*attr }, mask) {
        Ok(a) => a,
        Err(e) => return fail(&e),
    };
    match ctx.dev.modify_qp(q.raw.qp_base.qp_num, &a, mask) {
        Ok(()) => {
            if mask.contains(QpAttrMask::STATE) {
                // SAFETY: the program's QP object; `state` is the field it reads.
                unsafe { (*qp).state = a.qp_state.as_u32() };
            }
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_query_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut sys::ibv_qp,
    attr: *mut sys::ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut sys::ibv_qp_init_attr,
) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let ctx = ctx_or!(q.raw.qp_base.context, EINVAL);
    match ctx.dev.query_qp(q.raw.qp_base.qp_num) {
        Ok((a, i)) => {
            out!(attr, convert::qp_attr_to_c(&a));
            let b = &q.raw.qp_base;
            out!(
                init_attr,
                sys::ibv_qp_init_attr {
                    qp_context: b.qp_context,
                    send_cq: b.send_cq,
                    recv_cq: b.recv_cq,
                    srq: b.srq,
                    cap: convert::cap_to_c(&i.cap),
                    qp_type: b.qp_type,
                    sq_sig_all: c_int::from(i.sq_sig_all),
                }
            );
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut sys::ibv_qp) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let ctx = ctx_or!(q.raw.qp_base.context, EINVAL);
    let qpn = q.raw.qp_base.qp_num;
    match ctx.dev.destroy_qp(qpn) {
        Ok(()) => {
            ctx.qps.lock().remove(&qpn);
            // SAFETY: made by ibv_create_qp; destroyed once.
            unsafe { free::<_, Qp>(qp) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// Reads the SGE list of a work request.
unsafe fn sges(list: *const sys::ibv_sge, n: c_int) -> Result<Vec<verbs_api::Sge>, c_int> {
    let n = usize::try_from(n).map_err(|_| EINVAL)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if list.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: the caller's SGE array has num_sge entries.
    Ok(unsafe { std::slice::from_raw_parts(list, n) }
        .iter()
        .map(convert::sge_from_c)
        .collect())
}

/// Converts one `ibv_send_wr` of QP `q`.
unsafe fn send_wr(q: &Qp, w: &sys::ibv_send_wr) -> Result<verbs_api::SendWr, c_int> {
    // SAFETY: module safety argument.
    let sg = unsafe { sges(w.sg_list, w.num_sge) }?;
    let ud = if q.raw.qp_base.qp_type == sys::IBV_QPT_UD {
        let (ah, qpn, qkey) = convert::ud_fields(w);
        let ah = obj_or!(Ah, ah, Err(EINVAL));
        Some((ah.id, qpn, qkey))
    } else {
        None
    };
    let mut wr = convert::send_wr_from_c(w, sg, ud).map_err(|e| e.errno())?;
    if let WrOperation::BindMw {
        mw_rkey, bind_info, ..
    } = &mut wr.op
    {
        // SAFETY: union of plain fields (crate::convert).
        let b = unsafe { w.__bindgen_anon_2.bind_mw };
        *mw_rkey = obj_or!(Mw, b.mw, Err(EINVAL)).raw.rkey;
        bind_info.mr_lkey = obj_or!(Mr, b.bind_info.mr, Err(EINVAL)).raw.lkey;
    }
    Ok(wr)
}

/// Posts send WRs of `q`. INLINE data may sit in memory the program never registered
/// (libibverbs copies it at post time and ignores its keys), while the engine takes
/// INLINE bytes from registered memory: so each INLINE WR's bytes are copied here into
/// a private region registered for the call and deregistered once the engine has
/// copied them (it does so while posting).
pub(crate) fn post_send_staged(
    ctx: &Context,
    q: &Qp,
    mut wrs: Vec<verbs_api::SendWr>,
) -> Result<(), verbs_api::PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    let mut staged = Vec::new();
    let fail_at = |index, error| verbs_api::PostError { index, error };
    for (i, w) in wrs.iter_mut().enumerate() {
        if !w.send_flags.contains(SendFlags::INLINE) || w.sg_list.iter().all(|s| s.length == 0) {
            continue;
        }
        let mut bytes = Vec::new();
        for sge in &w.sg_list {
            if sge.length == 0 {
                continue;
            }
            if sge.addr == 0 {
                return Err(fail_at(
                    i,
                    Error::InvalidArgument("INLINE data at address 0"),
                ));
            }
            // SAFETY: the ibv_post_send contract: INLINE data is readable during the call.
            bytes.extend_from_slice(unsafe {
                std::slice::from_raw_parts(sge.addr as *const u8, sge.length as usize)
            });
        }
        // SAFETY: module safety argument.
        let Some(pd) = (unsafe { from_ptr::<_, Pd>(q.raw.qp_base.pd) }) else {
            return Err(fail_at(i, Error::InvalidArgument("QP without a PD")));
        };
        let buf = MemBuf::from_slice(&bytes);
        let mr = ctx
            .dev
            .reg_mr(pd.id, &buf, 0, bytes.len(), AccessFlags::LOCAL_WRITE)
            .map_err(|e| fail_at(i, e))?;
        w.sg_list = vec![verbs_api::Sge::new(buf.addr(), bytes.len() as u32, mr.lkey)];
        staged.push(mr.lkey);
    }
    let r = ctx.dev.post_send(q.raw.qp_base.qp_num, &wrs);
    for lkey in staged {
        let _ = ctx.dev.dereg_mr(lkey);
    }
    r
}

unsafe extern "C" fn op_post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad_wr: *mut *mut sys::ibv_send_wr,
) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let ctx = ctx_or!(q.raw.qp_base.context, EINVAL);
    let mut wrs = Vec::new();
    let mut ptrs = Vec::new();
    let mut bad = None;
    let mut p = wr;
    while !p.is_null() {
        // SAFETY: the caller's linked list of work requests.
        let w = unsafe { &*p };
        // SAFETY: as above.
        match unsafe { send_wr(q, w) } {
            Ok(x) => {
                wrs.push(x);
                ptrs.push(p);
            }
            Err(e) => {
                bad = Some((p, e));
                break;
            }
        }
        p = w.next;
    }
    if let Err(e) = post_send_staged(ctx, q, wrs) {
        out!(bad_wr, ptrs[e.index.min(ptrs.len().saturating_sub(1))]);
        return e.error.errno();
    }
    if let Some((p, e)) = bad {
        out!(bad_wr, p);
        return e;
    }
    0
}

/// Converts a chain of `ibv_recv_wr`; the first bad one ends the chain.
unsafe fn recv_wrs(
    wr: *mut sys::ibv_recv_wr,
) -> (
    Vec<verbs_api::RecvWr>,
    Vec<*mut sys::ibv_recv_wr>,
    Option<(*mut sys::ibv_recv_wr, c_int)>,
) {
    let mut wrs = Vec::new();
    let mut ptrs = Vec::new();
    let mut p = wr;
    while !p.is_null() {
        // SAFETY: the caller's linked list of work requests.
        let w = unsafe { &*p };
        // SAFETY: as above.
        match unsafe { sges(w.sg_list, w.num_sge) } {
            Ok(sg) => {
                wrs.push(convert::recv_wr(w.wr_id, sg));
                ptrs.push(p);
            }
            Err(e) => return (wrs, ptrs, Some((p, e))),
        }
        p = w.next;
    }
    (wrs, ptrs, None)
}

fn finish_recv(
    r: Result<(), verbs_api::PostError>,
    ptrs: &[*mut sys::ibv_recv_wr],
    bad: Option<(*mut sys::ibv_recv_wr, c_int)>,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    if let Err(e) = r {
        out!(bad_wr, ptrs[e.index.min(ptrs.len() - 1)]);
        return e.error.errno();
    }
    if let Some((p, e)) = bad {
        out!(bad_wr, p);
        return e;
    }
    0
}

unsafe extern "C" fn op_post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let ctx = ctx_or!(q.raw.qp_base.context, EINVAL);
    // SAFETY: module safety argument.
    let (wrs, ptrs, bad) = unsafe { recv_wrs(wr) };
    finish_recv(
        ctx.dev.post_recv(q.raw.qp_base.qp_num, &wrs),
        &ptrs,
        bad,
        bad_wr,
    )
}

unsafe extern "C" fn op_post_srq_recv(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    let s = obj_or!(Srq, srq, EINVAL);
    let ctx = ctx_or!(s.raw.context, EINVAL);
    // SAFETY: module safety argument.
    let (wrs, ptrs, bad) = unsafe { recv_wrs(wr) };
    finish_recv(ctx.dev.post_srq_recv(s.id, &wrs), &ptrs, bad, bad_wr)
}

// ---------------------------------------------------------------- SRQ

/// `ibv_create_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut sys::ibv_pd,
    init_attr: *mut sys::ibv_srq_init_attr,
) -> *mut sys::ibv_srq {
    let p = obj_or!(Pd, pd, null(EINVAL));
    let ctx = ctx_or!(p.raw.context, null(EINVAL));
    if init_attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *init_attr };
    match ctx.dev.create_srq(p.id, &convert::srq_attr_from_c(&a.attr)) {
        Ok(id) => {
            if let Ok(actual) = ctx.dev.query_srq(id) {
                a.attr.max_wr = actual.max_wr;
                a.attr.max_sge = actual.max_sge;
            }
            let ptr = into_ptr::<_, Srq>(Srq {
                raw: sys::ibv_srq {
                    context: p.raw.context,
                    srq_context: a.srq_context,
                    pd,
                    handle: id.0,
                    ..Default::default()
                },
                id,
            });
            ctx.srqs.lock().insert(id.0, ptr as usize);
            ptr
        }
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_modify_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let s = obj_or!(Srq, srq, EINVAL);
    let ctx = ctx_or!(s.raw.context, EINVAL);
    if attr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's attributes.
    let a = convert::srq_attr_from_c(unsafe { &*attr });
    status(
        ctx.dev
            .modify_srq(s.id, &a, SrqAttrMask::from_bits_retain(mask as u32)),
    )
}

/// `ibv_query_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(
    srq: *mut sys::ibv_srq,
    attr: *mut sys::ibv_srq_attr,
) -> c_int {
    let s = obj_or!(Srq, srq, EINVAL);
    let ctx = ctx_or!(s.raw.context, EINVAL);
    match ctx.dev.query_srq(s.id) {
        Ok(a) => {
            out!(attr, convert::srq_attr_to_c(&a));
            0
        }
        Err(e) => fail(&e),
    }
}

/// `ibv_destroy_srq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut sys::ibv_srq) -> c_int {
    let s = obj_or!(Srq, srq, EINVAL);
    let ctx = ctx_or!(s.raw.context, EINVAL);
    match ctx.dev.destroy_srq(s.id) {
        Ok(()) => {
            ctx.srqs.lock().remove(&s.id.0);
            // SAFETY: made by ibv_create_srq; destroyed once.
            unsafe { free::<_, Srq>(srq) };
            0
        }
        Err(e) => fail(&e),
    }
}

// ---------------------------------------------------------------- AH, multicast

/// `ibv_create_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(
    pd: *mut sys::ibv_pd,
    attr: *mut sys::ibv_ah_attr,
) -> *mut sys::ibv_ah {
    let p = obj_or!(Pd, pd, null(EINVAL));
    let ctx = ctx_or!(p.raw.context, null(EINVAL));
    if attr.is_null() {
        return null(EINVAL);
    }
    // SAFETY: the caller's attributes.
    let a = convert::ah_attr_from_c(unsafe { &*attr });
    match ctx.dev.create_ah(p.id, &a) {
        Ok(id) => into_ptr::<_, Ah>(Ah {
            raw: sys::ibv_ah {
                context: p.raw.context,
                pd,
                handle: id.0,
            },
            id,
        }),
        Err(e) => null(fail(&e)),
    }
}

/// `ibv_destroy_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut sys::ibv_ah) -> c_int {
    let a = obj_or!(Ah, ah, EINVAL);
    let ctx = ctx_or!(a.raw.context, EINVAL);
    match ctx.dev.destroy_ah(a.id) {
        // SAFETY: made by ibv_create_ah; destroyed once.
        Ok(()) => unsafe {
            free::<_, Ah>(ah);
            0
        },
        Err(e) => fail(&e),
    }
}

/// `ibv_init_ah_from_wc`: the reply path of a received UD message (its GRH, which
/// every RoCEv2 packet carries, gives the source GID).
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut sys::ibv_context,
    port_num: u8,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    ah_attr: *mut sys::ibv_ah_attr,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    if wc.is_null() || grh.is_null() || ah_attr.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's completion and GRH (the first 40 bytes of its buffer).
    let (w, g) = unsafe { (&*wc, &*grh) };
    if w.wc_flags & sys::IBV_WC_GRH == 0 {
        return unsupported("ibv_init_ah_from_wc without a GRH");
    }
    let sgid = convert::gid_from_c(&g.sgid);
    let dgid = convert::gid_from_c(&g.dgid);
    let index = (0..16u32)
        .find(|&i| ctx.dev.query_gid(port_num, i).ok() == Some(dgid))
        .unwrap_or(0);
    let flow = u32::from_be(g.version_tclass_flow);
    out!(
        ah_attr,
        convert::ah_attr_to_c(&verbs_api::AhAttr {
            grh: verbs_api::GlobalRoute {
                dgid: sgid,
                flow_label: flow & 0xf_ffff,
                sgid_index: index as u8,
                hop_limit: 0xff,
                traffic_class: ((flow >> 20) & 0xff) as u8,
            },
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            static_rate: 0,
            is_global: true,
            port_num,
        })
    );
    0
}

/// `ibv_create_ah_from_wc`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut sys::ibv_pd,
    wc: *mut sys::ibv_wc,
    grh: *mut sys::ibv_grh,
    port_num: u8,
) -> *mut sys::ibv_ah {
    let p = obj_or!(Pd, pd, null(EINVAL));
    let mut attr = sys::ibv_ah_attr::default();
    // SAFETY: module safety argument.
    let r = unsafe { ibv_init_ah_from_wc(p.raw.context, port_num, wc, grh, &mut attr) };
    if r != 0 {
        return null(r);
    }
    // SAFETY: module safety argument.
    unsafe { ibv_create_ah(pd, &mut attr) }
}

fn mcast(qp: *mut sys::ibv_qp, gid: *const sys::ibv_gid, lid: u16, attach: bool) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let ctx = ctx_or!(q.raw.qp_base.context, EINVAL);
    if gid.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's GID.
    let g: Gid = convert::gid_from_c(unsafe { &*gid });
    let qpn = q.raw.qp_base.qp_num;
    status(if attach {
        ctx.dev.attach_mcast(qpn, &g, lid)
    } else {
        ctx.dev.detach_mcast(qpn, &g, lid)
    })
}

/// `ibv_attach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut sys::ibv_qp,
    gid: *const sys::ibv_gid,
    lid: u16,
) -> c_int {
    mcast(qp, gid, lid, true)
}

/// `ibv_detach_mcast`.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut sys::ibv_qp,
    gid: *const sys::ibv_gid,
    lid: u16,
) -> c_int {
    mcast(qp, gid, lid, false)
}

// ---------------------------------------------------------------- memory windows

unsafe extern "C" fn op_alloc_mw(
    pd: *mut sys::ibv_pd,
    mw_type: sys::ibv_mw_type,
) -> *mut sys::ibv_mw {
    let p = obj_or!(Pd, pd, null(EINVAL));
    let ctx = ctx_or!(p.raw.context, null(EINVAL));
    let Ok(t) = MwType::try_from(mw_type) else {
        return null(EINVAL);
    };
    match ctx.dev.alloc_mw(p.id, t) {
        Ok(info) => into_ptr::<_, Mw>(Mw {
            raw: sys::ibv_mw {
                context: p.raw.context,
                pd,
                rkey: info.rkey,
                handle: info.id.0,
                type_: mw_type,
            },
            id: info.id,
        }),
        Err(e) => null(fail(&e)),
    }
}

unsafe extern "C" fn op_dealloc_mw(mw: *mut sys::ibv_mw) -> c_int {
    let m = obj_or!(Mw, mw, EINVAL);
    let ctx = ctx_or!(m.raw.context, EINVAL);
    match ctx.dev.dealloc_mw(m.id) {
        // SAFETY: made by ibv_alloc_mw; destroyed once.
        Ok(()) => unsafe {
            free::<_, Mw>(mw);
            0
        },
        Err(e) => fail(&e),
    }
}

unsafe extern "C" fn op_bind_mw(
    qp: *mut sys::ibv_qp,
    mw: *mut sys::ibv_mw,
    bind: *mut sys::ibv_mw_bind,
) -> c_int {
    let q = obj_or!(Qp, qp, EINVAL);
    let m = obj_or!(Mw, mw, EINVAL);
    let ctx = ctx_or!(q.raw.qp_base.context, EINVAL);
    if bind.is_null() {
        return EINVAL;
    }
    // SAFETY: the caller's bind request.
    let b = unsafe { &*bind };
    let lkey = if b.bind_info.length == 0 {
        0
    } else {
        obj_or!(Mr, b.bind_info.mr, EINVAL).raw.lkey
    };
    let req = MwBind {
        wr_id: b.wr_id,
        send_flags: SendFlags::from_bits_retain(b.send_flags),
        bind_info: convert::bind_info_from_c(&b.bind_info, lkey),
    };
    match ctx.dev.bind_mw(q.raw.qp_base.qp_num, m.id, &req) {
        Ok(rkey) => {
            // SAFETY: the program's MW object; `rkey` is the field it reads.
            unsafe { (*mw).rkey = rkey };
            0
        }
        Err(e) => fail(&e),
    }
}

// ---------------------------------------------------------------- async events

/// `ibv_get_async_event`: waits for the next asynchronous event; 0, or -1 with
/// errno (EAGAIN when `async_fd` is non-blocking and nothing is pending).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut sys::ibv_context,
    event: *mut sys::ibv_async_event,
) -> c_int {
    let ctx = ctx_or!(context, {
        set_errno(EINVAL);
        -1
    });
    if event.is_null() {
        set_errno(EINVAL);
        return -1;
    }
    let timeout = nonblocking(ctx.vctx.context.async_fd).then_some(Duration::ZERO);
    let ev = match ctx.dev.get_async_event(timeout) {
        Ok(ev) => ev,
        Err(Error::TimedOut) => {
            set_errno(libc::EAGAIN);
            return -1;
        }
        Err(e) => {
            set_errno(e.errno());
            return -1;
        }
    };
    let lookup = |m: &Mutex<std::collections::HashMap<u32, usize>>, k: u32| {
        m.lock().get(&k).copied().unwrap_or(0) as *mut c_void
    };
    let element = match ev.element {
        EventElement::Cq(n) => sys::ibv_async_event__bindgen_ty_1 {
            cq: lookup(&ctx.cqs, n).cast(),
        },
        EventElement::Qp(n) => sys::ibv_async_event__bindgen_ty_1 {
            qp: lookup(&ctx.qps, n).cast(),
        },
        EventElement::Srq(n) => sys::ibv_async_event__bindgen_ty_1 {
            srq: lookup(&ctx.srqs, n).cast(),
        },
        EventElement::Port(p) => sys::ibv_async_event__bindgen_ty_1 {
            port_num: c_int::from(p),
        },
        EventElement::Wq(_) | EventElement::Device => {
            sys::ibv_async_event__bindgen_ty_1 { port_num: 0 }
        }
    };
    out!(
        event,
        sys::ibv_async_event {
            element,
            event_type: convert::event_type_to_c(ev.event_type),
        }
    );
    0
}

/// `ibv_ack_async_event`: nothing to release in the emulator.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut sys::ibv_async_event) {}

// ---------------------------------------------------------------- strings

/// A static NUL-terminated copy of each name, made once.
fn c_name(
    table: &'static OnceLock<Vec<std::ffi::CString>>,
    names: fn() -> Vec<String>,
    i: usize,
) -> *const c_char {
    let t = table.get_or_init(|| {
        names()
            .into_iter()
            .map(|s| std::ffi::CString::new(s).unwrap_or_default())
            .collect()
    });
    t.get(i).map_or(c"unknown".as_ptr(), |s| s.as_ptr())
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: sys::ibv_wc_status) -> *const c_char {
    static T: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    c_name(
        &T,
        || {
            (0..32)
                .map(|v| WcStatus::try_from(v).map_or("unknown".into(), |s| s.to_string()))
                .collect()
        },
        status as usize,
    )
}

/// `ibv_event_type_str`.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: sys::ibv_event_type) -> *const c_char {
    static T: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    c_name(
        &T,
        || {
            (0..32)
                .map(|v| AsyncEventType::try_from(v).map_or("unknown".into(), |s| s.to_string()))
                .collect()
        },
        event as usize,
    )
}

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(state: sys::ibv_port_state) -> *const c_char {
    static T: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    c_name(
        &T,
        || {
            (0..8)
                .map(|v| PortState::try_from(v).map_or("unknown".into(), |s| s.to_string()))
                .collect()
        },
        state as usize,
    )
}

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: sys::ibv_node_type) -> *const c_char {
    static T: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    let i = usize::try_from(node_type.wrapping_add(1)).unwrap_or(0);
    c_name(
        &T,
        || {
            (-1..8)
                .map(|v: i32| {
                    verbs_api::NodeType::try_from(v as u32)
                        .map_or("unknown".into(), |s| s.to_string())
                })
                .collect()
        },
        i,
    )
}

// ---------------------------------------------------------------- sysfs, fork

/// `ibv_get_sysfs_path`.
#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` (without its trailing newline) into
/// `buf`; the length, or -1. Emulated devices have no sysfs entries, so for them it
/// fails, as for a missing attribute.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return -1;
    }
    // SAFETY: NUL-terminated strings from the caller.
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let path = std::path::Path::new(&*d.to_string_lossy()).join(&*f.to_string_lossy());
    let Ok(mut data) = std::fs::read(path) else {
        return -1;
    };
    if data.last() == Some(&b'\n') {
        data.pop();
    }
    let n = data.len().min(size - 1);
    // SAFETY: the caller's buffer has `size` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr().cast(), buf, n);
        *buf.add(n) = 0;
    }
    n as c_int
}

/// `ibv_fork_init`: nothing to do (no pages are pinned).
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_uint {
    sys::IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: nothing is pinned, so nothing to do.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`.
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
