//! Devices: the list, opening and closing, and the device, port, GID and P_Key queries.
//! (Safety argument: the parent module's.)

use super::*;

/// The configured devices, made once per process.
pub(crate) fn devices() -> &'static [Dev] {
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
            // The kernel's names: the uverbs character device and its sysfs class
            // directory (which `rdma-emu exec` provides; UCX looks the node up).
            dev_name: convert::c_string(&format!("uverbs{index}")),
            dev_path: convert::c_string(&format!("/sys/class/infiniband_verbs/uverbs{index}")),
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
    emu_core::nic::node_guid(cfg.ip)
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
/// next 127.0.0.x while the address is taken by another process (it does not share
/// it); a device given its address shares it.
fn open_emu(cfg: &DeviceConfig) -> verbs_api::Result<EmuDevice> {
    let interop = config::interop_from_env(|k| std::env::var(k).ok()).unwrap_or_else(|e| {
        eprintln!("rdma-emu libibverbs: {e}; loopback mode");
        false
    });
    let strict = config::flag_from_env(|k| std::env::var(k).ok(), "RDMA_EMU_STRICT_PORT")
        .unwrap_or_else(|e| {
            eprintln!("rdma-emu libibverbs: {e}; any source port");
            false
        });
    let link = config::link_from_env(|k| std::env::var(k).ok(), interop).unwrap_or_else(|e| {
        eprintln!("rdma-emu libibverbs: {e}; UDP");
        SameHost::Udp
    });
    let open = |ip| {
        let mut c = EmuConfig {
            name: cfg.name.clone(),
            ip,
            port: cfg.port,
            ..EmuConfig::default()
        };
        if interop {
            c.link = LinkOptions::interop();
            c.limits.active_mtu = verbs_api::Mtu::Mtu1024;
        }
        c.link.strict_source_port = strict;
        c.same_host = link;
        // A device given its address shares it with the other processes that open
        // it, as processes share one kernel rxe device; one left to pick its address
        // takes one of its own (the next free 127.0.0.x), so that a program's two
        // processes talk without passing packets on.
        c.link.exclusive = cfg.auto_ip;
        EmuDevice::open(c)
    };
    if !cfg.auto_ip {
        return open(cfg.ip);
    }
    let mut last = Error::InvalidArgument("no free address");
    for ip in config::auto_candidates(cfg.ip) {
        match open(ip) {
            Err(e @ Error::AddressInUse(_)) => last = e,
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
    let pid = std::process::id();
    let dev = {
        let mut nic = d.nic.lock();
        match nic.1.upgrade().filter(|_| nic.0 == pid) {
            Some(dev) => dev,
            None => match open_emu(&d.cfg) {
                Ok(dev) => {
                    let dev = std::sync::Arc::new(dev);
                    *nic = (pid, std::sync::Arc::downgrade(&dev));
                    dev
                }
                Err(e) => {
                    // Emulated devices given one address share it; one that picked its
                    // own, one in interop mode or another program's socket does not.
                    let hint = if matches!(e, Error::AddressInUse(_)) && !d.cfg.auto_ip {
                        " (RDMA_EMU_IP=127.0.0.N, or leave it unset to take the next free one)"
                    } else {
                        ""
                    };
                    eprintln!("rdma-emu libibverbs: cannot open {}: {e}{hint}", d.cfg.name);
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
        open_xrcd: Some(vctx_open_xrcd),
        close_xrcd: Some(vctx_close_xrcd),
        create_srq_ex: Some(vctx_create_srq_ex),
        get_srq_num: Some(vctx_get_srq_num),
        open_qp: Some(vctx_open_qp),
        sz: std::mem::size_of::<sys::verbs_context>(),
        ..Default::default()
    };
    // SAFETY: a NUL-terminated path; the descriptor is the context's, closed by
    // ibv_close_device.
    let cmd_fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    vctx.context.device = device;
    vctx.context.cmd_fd = cmd_fd;
    vctx.context.async_fd = async_fd;
    vctx.context.num_comp_vectors = c_int::try_from(dev.num_comp_vectors()).unwrap_or(c_int::MAX);
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
    Context::open(Context {
        vctx,
        dev,
        tables: Default::default(),
        cmd_fd,
        pid,
    })
}

/// `ibv_close_device`: destroys on the device what the context made and the program
/// did not destroy (QPs detached from their groups first), as the kernel does when a
/// verbs file closes, and stops the emulated NIC with its last context. The C objects
/// of those stay allocated, as their pointers may still be in the program's hands.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut sys::ibv_context) -> c_int {
    // SAFETY: the caller gives the context up; a pointer that is not an open
    // context gets EINVAL.
    unsafe { Context::close(context) }
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
                device_cap_flags_ex: convert::device_cap_flags_ex_to_c(&a),
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

/// The size of libibverbs' `struct _compat_ibv_port_attr`, which the exported
/// `ibv_query_port` fills: `struct ibv_port_attr` up to and including `flags`
/// (rdma-core verbs.c; verbs.h only declares the struct, so bindgen sees it empty).
pub(crate) const COMPAT_PORT_ATTR_LEN: usize = std::mem::offset_of!(sys::ibv_port_attr, flags) + 1;

/// `ibv_query_port` (the exported, old-ABI entry: `struct _compat_ibv_port_attr`, the
/// port attributes without `port_cap_flags2`; what bindings that cannot use verbs.h's
/// inline `ibv_query_port` call).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut sys::ibv_context,
    port_num: u8,
    port_attr_out: *mut sys::ibv_port_attr,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    // SAFETY: the caller's struct is at least the compat layout.
    unsafe {
        answer_into(
            port_attr(ctx, port_num),
            port_attr_out,
            COMPAT_PORT_ATTR_LEN,
        )
    }
}

unsafe extern "C" fn vctx_query_port(
    context: *mut sys::ibv_context,
    port_num: u8,
    attr: *mut sys::ibv_port_attr,
    attr_len: usize,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    // SAFETY: the caller's struct has attr_len bytes.
    unsafe { answer_into(port_attr(ctx, port_num), attr, attr_len) }
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

/// The interface index of the network interface that carries the device's address
/// (`ndev_ifindex` of its GID entries, as kernel rxe gives its netdev's); 0 if none.
fn netdev_index(ctx: &Context) -> u32 {
    let Some(name) = ctx
        .dev
        .netdev()
        .and_then(|n| std::ffi::CString::new(n).ok())
    else {
        return 0;
    };
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

/// The GID table entry `index` of `port`: RoCEv2, as every emulated GID is. ENODATA
/// for an empty slot (an all-zero GID), as the kernel answers `ibv_query_gid_ex`.
fn gid_entry(ctx: &Context, port: u8, index: u32) -> Result<sys::ibv_gid_entry, c_int> {
    let g = ctx.dev.query_gid(port, index).map_err(|e| e.errno())?;
    if g.0 == [0; 16] {
        return Err(libc::ENODATA);
    }
    Ok(sys::ibv_gid_entry {
        gid: convert::gid_to_c(&g),
        gid_index: index,
        port_num: u32::from(port),
        gid_type: sys::IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: netdev_index(ctx),
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
    // SAFETY: the caller's struct has entry_size bytes.
    unsafe { answer_into(gid_entry(ctx, port, gid_index), entry, entry_size) }
}

/// `_ibv_query_gid_table`: the valid GIDs of every port; the count, or -errno
/// (-EINVAL when they do not all fit in `max_entries`, as the kernel's
/// `rdma_query_gid_table` answers).
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
        if let Ok(g) = gid_entry(ctx, 1, i) {
            if n == max_entries {
                return -(EINVAL as isize);
            }
            // SAFETY: the caller's array has max_entries entries of entry_size bytes.
            unsafe { write_prefix(entries.byte_add(n * entry_size), &g, entry_size) };
            n += 1;
        }
    }
    n as isize
}

/// `ibv_query_gid_type` (private, used by ibv_devinfo and librdmacm): every GID is
/// RoCEv2 (`IBV_GID_TYPE_SYSFS_ROCE_V2`, 1, in this function's sysfs numbering); 0,
/// or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut sys::ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_uint,
) -> c_int {
    let ctx = ctx_or!(context, EINVAL);
    match gid_entry(ctx, port_num, index) {
        Ok(_) => {
            out!(gid_type, 1);
            0
        }
        // An empty slot reads as IB/RoCE v1 (0), as libibverbs keeps it for callers
        // of this older query.
        Err(libc::ENODATA) => {
            out!(gid_type, 0);
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
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
