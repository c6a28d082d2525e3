//! The one module of `hw-backend` that calls libibverbs (through rdma-sys), and so,
//! with `cm` (librdmacm) and `layout` (the struct casts), one of the three with `unsafe`
//! code. Everything above it is safe Rust over the owned wrappers defined here.
//!
//! # Safety argument
//!
//! **Object pointers.** Every libibverbs object (`ibv_context`, `ibv_pd`, `ibv_mr`,
//! `ibv_cq`, ...) is held by exactly one owned wrapper ([`Context`], [`Pd`], [`Mr`], ...)
//! that is created only here, from a non-null pointer libibverbs just returned, and that
//! frees the object at most once: by `destroy(self)`, which consumes the wrapper on
//! success and hands it back on failure, or by `Drop`. Between creation and that free the
//! pointer is valid, so the safe `&self` methods may dereference it. Wrappers of child
//! objects hold an `Arc<Context>`, so the device context is closed (`ibv_close_device`)
//! only after the last child wrapper is gone. Parent/child order among the other objects
//! (a PD with MRs, a CQ with QPs, a channel with CQs, an SRQ with QPs) is enforced by
//! libibverbs and the kernel, which refuse to free a parent that still has children
//! (EBUSY, manual 3.4 / 3.5); a refused free leaves the wrapper alive, so no wrapper ever
//! refers to a freed parent. libibverbs is thread-safe (every verb may be called from any
//! thread, manual 1.x "thread safety"), which is why the wrappers are `Send + Sync`.
//!
//! **Registered memory.** `ibv_reg_mr` hands the NIC a virtual address range it may read
//! and write by DMA until `ibv_dereg_mr` returns. The range is always the heap block of a
//! [`MemBuf`] (its `addr()` is the address of its first byte, stable for the life of the
//! block), and the [`Mr`] wrapper keeps a clone of that `MemBuf`, so the block outlives the
//! registration: it is released only after a successful `ibv_dereg_mr`. If deregistration
//! fails (in `Drop`), the clone is leaked on purpose: the memory stays valid for as long
//! as the kernel might still touch it. A successful `ibv_rereg_mr` that changes the
//! translation swaps the clone; a failed one keeps both the old and the new buffer alive
//! (libibverbs leaves the region in an unknown state then). The NIC checks every SGE and
//! every remote access against the registered ranges (lkey/rkey, bounds, access), so a
//! work request cannot make it touch memory outside a live registration. The one path
//! where *userspace* reads SGE addresses directly is `IBV_SEND_INLINE` (the provider
//! copies the bytes with `memcpy` at post time, without an lkey check); [`Qp::post_send`]
//! therefore requires, for every inline SGE, the [`Mr`] named by its lkey and refuses
//! (EINVAL) any inline SGE that is not inside that region's buffer.
//!
//! **What racing with DMA means.** The application reads and writes a registered
//! `MemBuf` through its lock; the NIC does not take that lock. As on any RDMA NIC, bytes
//! the NIC is writing (an incoming SEND, an RDMA WRITE or READ response landing, an
//! atomic) may change while the application looks at them, and bytes the NIC is reading
//! (a SEND or RDMA READ being served) may be sampled while the application writes them.
//! The bytes are plain `u8`s (every bit pattern valid), the block is never freed or moved
//! while registered, and no Rust code derives anything but byte values from them, so such
//! a race cannot break memory safety in practice: what it gives is unspecified *contents*
//! (stale or torn data), exactly as in C. Formally, a DMA write during a live Rust borrow
//! of the same bytes is outside the Rust abstract machine (the compiler may assume the
//! bytes do not change while it holds `&[u8]`); that is the standard position of every
//! DMA buffer in Rust, and the application avoids it by the same discipline C programs
//! follow (manual 2.3, 3.6): touch a receive, READ or atomic target only after its
//! completion is polled, touch a send source only before posting or after its completion,
//! and coordinate remotely-writable regions through the application protocol.
//!
//! **Structs crossing the boundary.** Attribute structs, SGEs, GIDs and completions are
//! `verbs_ffi::sys` structs, built and read by `verbs_ffi::convert` and handed to
//! rdma-sys by the casts of `crate::layout` (its safety argument). Other C structs are
//! built here from plain values with every field written (`mem::zeroed` is used only
//! for all-integer/pointer structs, for which all-zero bits are valid). Pointers inside
//! them (SGE lists, the `next` chains of work requests) point into vectors that are
//! fully built before the chain is linked and live until the call returns; libibverbs
//! does not keep them after the post verbs return (manual 3.6.4, 3.6.5: the WR lists
//! may be reused at once). C unions are read only through the member their discriminant
//! (`wc_flags`, the event type) selects.

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_int, c_uint, c_void};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as ffi;
use verbs_api::{
    AhAttr, AsyncEvent, AsyncEventType, CqId, ElementKind, Error, EventElement, Gid, MemBuf,
    MwBind, MwType, PdId, PostError, QpAttr, QpAttrMask, QpInitAttr, QpType, RecvWr, ReregMrFlags,
    Result, SendFlags, SendWr, SrqAttr, SrqAttrMask, SrqId, WorkCompletion, WrOperation,
};

use verbs_ffi::{convert, sys as c};

use crate::layout::{from_sys, sys_mut, sys_slice_mut, to_sys};
use crate::DeviceListEntry;

/// The errno of the last failed libc/libibverbs call.
fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The error for a C return value that is not 0: libibverbs returns either the errno
/// itself (positive), `-errno`, or -1 with `errno` set, depending on the verb and the
/// rdma-core version.
fn ret_error(ret: c_int, context: &'static str) -> Error {
    let errno = if ret == -1 { last_errno() } else { ret.abs() };
    Error::from_errno(if errno == 0 { libc::EIO } else { errno }, context)
}

fn check(ret: c_int, context: &'static str) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(ret_error(ret, context))
    }
}

/// The error for a NULL returned by a constructor verb (errno set by libibverbs).
fn null_error(context: &'static str) -> Error {
    let e = last_errno();
    Error::from_errno(if e == 0 { libc::ENOMEM } else { e }, context)
}

/// Makes `fd` non-blocking, so that reading an event never blocks while a lock or an
/// object reference is held; waiting is done with `poll` beforehand.
fn set_nonblocking(fd: c_int) -> Result<()> {
    // SAFETY: fcntl on an fd this process owns (libibverbs opened it) with plain flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(null_error("fcntl(F_GETFL)"));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(null_error("fcntl(F_SETFL, O_NONBLOCK)"));
    }
    Ok(())
}

/// Waits until `fd` is readable or `deadline` passes (`None`: forever). `Ok(false)` on
/// timeout. A signal handler that runs meanwhile does not end the wait.
pub(crate) fn wait_readable(fd: c_int, deadline: Option<Instant>) -> Result<bool> {
    wait_readable_until(fd, deadline, false)
}

/// [`wait_readable`], but a signal handler that runs meanwhile ends the wait with
/// `EINTR` (`Error::Os`), as it ends the read(2) of a blocking `ibv_get_cq_event`.
pub(crate) fn wait_readable_or_signal(fd: c_int, deadline: Option<Instant>) -> Result<bool> {
    wait_readable_until(fd, deadline, true)
}

fn wait_readable_until(fd: c_int, deadline: Option<Instant>, interruptible: bool) -> Result<bool> {
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                // Round up so that a wait never ends before the deadline.
                let ms = left.as_micros().div_ceil(1000);
                c_int::try_from(ms).unwrap_or(c_int::MAX)
            }
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            continue;
        }
        let e = last_errno();
        if e != libc::EINTR || interruptible {
            return Err(Error::from_errno(e, "poll on an event fd"));
        }
    }
}

/// The deadline of a wait of `timeout` starting now.
pub(crate) fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}

/// The message for an empty device list.
pub(crate) const NO_DEVICE: &str =
    "no RDMA device found; load rdma_rxe and run `rdma link add rxe0 type rxe netdev <if>`";

/// The device list, with each device's libibverbs pointer, freed on drop.
struct DeviceList {
    list: NonNull<*mut ffi::ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<DeviceList> {
        let mut n: c_int = 0;
        // SAFETY: n is a valid out pointer.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        match NonNull::new(list) {
            None => {
                let e = last_errno();
                Err(if e == libc::ENOSYS || e == 0 {
                    Error::Os {
                        errno: libc::ENOSYS,
                        context: "libibverbs found no kernel RDMA support (ib_uverbs not \
                                  loaded); load rdma_rxe and run `rdma link add`",
                    }
                } else {
                    Error::from_errno(e, "ibv_get_device_list")
                })
            }
            Some(list) => Ok(DeviceList {
                list,
                len: usize::try_from(n).unwrap_or(0),
            }),
        }
    }

    /// The device pointers (valid while `self` lives).
    fn devices(&self) -> impl Iterator<Item = *mut ffi::ibv_device> + '_ {
        // SAFETY: libibverbs returned an array of `len` valid device pointers (followed
        // by NULL), which stays valid until ibv_free_device_list in Drop.
        (0..self.len).map(move |i| unsafe { *self.list.as_ptr().add(i) })
    }

    fn entry(dev: *mut ffi::ibv_device) -> DeviceListEntry {
        // SAFETY: `dev` comes from a live device list; the name fields are NUL-terminated
        // C strings inside the device struct (or returned by libibverbs for it).
        unsafe {
            let name = ffi::ibv_get_device_name(dev);
            let name = if name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            };
            let dev_name = CStr::from_ptr((*dev).dev_name.as_ptr())
                .to_string_lossy()
                .into_owned();
            DeviceListEntry {
                name,
                guid: u64::from_be(ffi::ibv_get_device_guid(dev)),
                dev_name,
            }
        }
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { ffi::ibv_free_device_list(self.list.as_ptr()) }
    }
}

/// Every RDMA device libibverbs sees.
pub(crate) fn device_list() -> Result<Vec<DeviceListEntry>> {
    let list = DeviceList::get()?;
    Ok(list.devices().map(DeviceList::entry).collect())
}

/// An opened device (`struct ibv_context`), closed when the last wrapper that holds it
/// is dropped.
pub(crate) struct Context {
    ptr: NonNull<ffi::ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (see the module docs).
unsafe impl Send for Context {}
// SAFETY: as above; every method takes `&self` and libibverbs serializes internally.
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child wrapper holds an Arc<Context>, so none is left; the
        // context is closed once.
        unsafe {
            ffi::ibv_close_device(self.ptr.as_ptr());
        }
    }
}

impl Context {
    /// Opens device `name`, or the first device when `None`.
    pub(crate) fn open(name: Option<&str>) -> Result<Arc<Context>> {
        let list = DeviceList::get()?;
        let mut chosen = None;
        for dev in list.devices() {
            let e = DeviceList::entry(dev);
            if name.is_none_or(|n| n == e.name) {
                chosen = Some((dev, e.name));
                break;
            }
        }
        let (dev, dev_name) = match (chosen, name) {
            (Some(c), _) => c,
            (None, Some(n)) => return Err(Error::NoDevice(n.to_owned())),
            (None, None) => {
                return Err(Error::Os {
                    errno: libc::ENODEV,
                    context: NO_DEVICE,
                })
            }
        };
        // SAFETY: `dev` is from the live list; the list may be freed once the device is
        // open (libibverbs keeps its own reference).
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        let ptr = NonNull::new(ctx).ok_or_else(|| null_error("ibv_open_device"))?;
        let ctx = Arc::new(Context {
            ptr,
            name: dev_name,
        });
        set_nonblocking(ctx.async_fd())?;
        Ok(ctx)
    }

    /// The device name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn raw(&self) -> *mut ffi::ibv_context {
        self.ptr.as_ptr()
    }

    /// `ibv_context.num_comp_vectors`.
    pub(crate) fn num_comp_vectors(&self) -> u32 {
        // SAFETY: live context; libibverbs sets the field at open and never changes it.
        let n = unsafe { (*self.raw()).num_comp_vectors };
        u32::try_from(n).unwrap_or(0)
    }

    /// `ibv_query_device`.
    pub(crate) fn query_device(&self) -> Result<c::ibv_device_attr> {
        let mut attr = c::ibv_device_attr::default();
        // SAFETY: live context, valid out pointer.
        check(
            unsafe { ffi::ibv_query_device(self.raw(), sys_mut(&mut attr)) },
            "ibv_query_device",
        )?;
        Ok(attr)
    }

    /// `ibv_query_device_ex`'s `device_cap_flags_ex` (0 where the provider has no
    /// `query_device_ex`).
    pub(crate) fn device_cap_flags_ex(&self) -> Result<u64> {
        // SAFETY: an all-integer struct: all-zero is valid.
        let mut attr: ffi::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: live context; the provider's operation with no input and a valid
        // out struct of the size given.
        let ret = match unsafe { ctx_op!(self.raw(), query_device_ex) } {
            Some(f) => unsafe {
                f(
                    self.raw(),
                    ptr::null(),
                    &mut attr,
                    std::mem::size_of::<ffi::ibv_device_attr_ex>(),
                )
            },
            None => return Ok(0),
        };
        check(ret, "ibv_query_device_ex")?;
        Ok(attr.device_cap_flags_ex)
    }

    /// `ibv_query_port`.
    pub(crate) fn query_port(&self, port: u8) -> Result<c::ibv_port_attr> {
        // All zero, as the C inline wrapper memsets it before the compat call.
        let mut attr = c::ibv_port_attr::default();
        // SAFETY: live context, valid out pointer of the full struct size.
        check(
            unsafe { ffi::___ibv_query_port(self.raw(), port, sys_mut(&mut attr)) },
            "ibv_query_port",
        )?;
        Ok(attr)
    }

    /// `ibv_query_gid`.
    pub(crate) fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let index =
            c_int::try_from(index).map_err(|_| Error::InvalidArgument("GID index too large"))?;
        let mut gid = c::ibv_gid::default();
        // SAFETY: live context, valid out pointer.
        check(
            unsafe { ffi::ibv_query_gid(self.raw(), port, index, sys_mut(&mut gid)) },
            "ibv_query_gid",
        )?;
        Ok(convert::gid_from_c(&gid))
    }

    /// `ibv_query_pkey` (host order).
    pub(crate) fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        let mut pkey: u16 = 0;
        // SAFETY: live context, valid out pointer.
        check(
            unsafe { ffi::ibv_query_pkey(self.raw(), port, c_int::from(index), &mut pkey) },
            "ibv_query_pkey",
        )?;
        Ok(u16::from_be(pkey))
    }

    /// `ibv_init_ah_from_wc` (manual 3.6.11): the address vector answering the sender
    /// of the UD receive `wc`, whose buffer began with `grh`. libibverbs reads the GRH
    /// even without `IBV_WC_GRH` (for the flow label), so it always gets a full 40-byte
    /// copy; a shorter `grh` is EINVAL when the WC says it has one.
    pub(crate) fn init_ah_from_wc(
        &self,
        port: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AhAttr> {
        if wc.wc_flags.contains(verbs_api::WcFlags::GRH) && grh.len() < convert::GRH_LEN {
            return Err(Error::InvalidArgument("GRH shorter than 40 bytes"));
        }
        let mut c_wc = convert::wc_to_c(wc);
        let mut c_grh = convert::grh_to_c(grh);
        let mut attr = convert::ah_attr_to_c(&AhAttr::default());
        // SAFETY: live context; the WC, the GRH (all 40 bytes of `struct ibv_grh`) and
        // the attribute are fully initialized structs on this stack frame that
        // libibverbs reads (wc, grh) and writes (attr) only during the call.
        check(
            unsafe {
                ffi::ibv_init_ah_from_wc(
                    self.raw(),
                    port,
                    sys_mut(&mut c_wc),
                    sys_mut(&mut c_grh),
                    sys_mut(&mut attr),
                )
            },
            "ibv_init_ah_from_wc",
        )?;
        Ok(convert::ah_attr_from_c(&attr))
    }

    /// The async event fd (non-blocking).
    pub(crate) fn async_fd(&self) -> c_int {
        // SAFETY: live context; reading a plain field.
        unsafe { (*self.raw()).async_fd }
    }

    /// `ibv_get_async_event` + `ibv_ack_async_event`, without blocking: `Ok(None)` when
    /// no event is pending.
    pub(crate) fn try_get_async_event(&self) -> Result<Option<AsyncEvent>> {
        #[repr(C)]
        union Element {
            ptr: *mut c_void,
            port_num: c_int,
        }
        /// `struct ibv_async_event` with the event type read as a plain integer, so that
        /// a value this build does not know cannot be an invalid Rust enum.
        #[repr(C)]
        struct RawEvent {
            element: Element,
            event_type: c_uint,
        }
        let mut ev = RawEvent {
            element: Element {
                ptr: ptr::null_mut(),
            },
            event_type: 0,
        };
        // SAFETY: live context; RawEvent has the layout of struct ibv_async_event
        // (a pointer-sized union followed by an enum, i.e. an unsigned int).
        let ret = unsafe {
            ffi::ibv_get_async_event(self.raw(), (&raw mut ev).cast::<ffi::ibv_async_event>())
        };
        if ret != 0 {
            let e = last_errno();
            return if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
                Ok(None)
            } else {
                Err(Error::from_errno(e, "ibv_get_async_event"))
            };
        }
        let kind = AsyncEventType::try_from(ev.event_type);
        // SAFETY: the element member is the one the event type selects (verbs.h); the
        // object it points to is live until the event is acknowledged below (libibverbs
        // destroy verbs wait for their events to be acked).
        let element = kind.map(|t| unsafe {
            match t.element_kind() {
                ElementKind::Cq => EventElement::Cq((*ev.element.ptr.cast::<ffi::ibv_cq>()).handle),
                ElementKind::Qp => EventElement::Qp((*ev.element.ptr.cast::<ffi::ibv_qp>()).qp_num),
                ElementKind::Srq => {
                    EventElement::Srq((*ev.element.ptr.cast::<ffi::ibv_srq>()).handle)
                }
                ElementKind::Wq => EventElement::Wq((*ev.element.ptr.cast::<ffi::ibv_wq>()).wq_num),
                ElementKind::Port => EventElement::Port(ev.element.port_num as u8),
                ElementKind::Device => EventElement::Device,
            }
        });
        // SAFETY: acknowledges the event just obtained, once.
        unsafe { ffi::ibv_ack_async_event((&raw mut ev).cast::<ffi::ibv_async_event>()) };
        match (kind, element) {
            (Ok(event_type), Ok(element)) => Ok(Some(AsyncEvent {
                event_type,
                element,
            })),
            _ => Err(Error::Os {
                errno: libc::EPROTO,
                context: "the kernel reported an async event type libibverbs' verbs.h \
                          does not define (it was acknowledged)",
            }),
        }
    }

    /// `ibv_open_xrcd` on the file `fd` with `oflags` (`O_CREAT`, `O_EXCL`), or a
    /// private domain for fd -1.
    pub(crate) fn open_xrcd(self: &Arc<Self>, fd: c_int, oflags: c_int) -> Result<Xrcd> {
        let mut attr = ffi::ibv_xrcd_init_attr {
            comp_mask: (ffi::ibv_xrcd_init_attr_mask::IBV_XRCD_INIT_ATTR_FD
                | ffi::ibv_xrcd_init_attr_mask::IBV_XRCD_INIT_ATTR_OFLAGS)
                .0,
            fd,
            oflags,
        };
        // SAFETY: live context; the provider's operation with a valid attribute struct.
        let p = match unsafe { ctx_op!(self.raw(), open_xrcd) } {
            Some(f) => unsafe { f(self.raw(), &mut attr) },
            None => return Err(Error::Unsupported("XRC: the provider has no open_xrcd")),
        };
        Ok(Xrcd {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_open_xrcd"))?,
            _ctx: self.clone(),
            live: true,
        })
    }

    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC`: an XRC SRQ of `xrcd` checked in `pd`,
    /// completing on `cq`.
    pub(crate) fn create_xrc_srq(
        self: &Arc<Self>,
        pd: &Pd,
        xrcd: &Xrcd,
        cq: &Cq,
        attr: &SrqAttr,
    ) -> Result<Srq> {
        use ffi::ibv_srq_init_attr_mask as m;
        // SAFETY: an all-integer/pointer struct (tm_cap included): all-zero is valid.
        let mut init: ffi::ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        init.attr = to_sys(convert::srq_attr_to_c(attr));
        init.comp_mask = (m::IBV_SRQ_INIT_ATTR_TYPE
            | m::IBV_SRQ_INIT_ATTR_PD
            | m::IBV_SRQ_INIT_ATTR_XRCD
            | m::IBV_SRQ_INIT_ATTR_CQ)
            .0;
        init.srq_type = ffi::ibv_srq_type::IBV_SRQT_XRC;
        init.pd = pd.raw();
        init.xrcd = xrcd.raw();
        init.cq = cq.raw();
        // SAFETY: live context, PD, domain and CQ (borrowed for the call; the kernel
        // keeps them while the SRQ uses them); valid attribute struct.
        let p = match unsafe { ctx_op!(self.raw(), create_srq_ex) } {
            Some(f) => unsafe { f(self.raw(), &mut init) },
            None => return Err(Error::Unsupported("XRC: the provider has no create_srq_ex")),
        };
        Ok(Srq {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_create_srq_ex"))?,
            _ctx: self.clone(),
            live: true,
        })
    }

    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV` and `IBV_QP_INIT_ATTR_XRCD`.
    pub(crate) fn create_xrc_recv_qp(self: &Arc<Self>, xrcd: &Xrcd) -> Result<Qp> {
        // SAFETY: an all-integer/pointer struct: all-zero is valid.
        let mut init: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_XRC_RECV;
        init.comp_mask = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_XRCD.0;
        init.xrcd = xrcd.raw();
        // SAFETY: live context and domain; valid attribute struct.
        let p = match unsafe { ctx_op!(self.raw(), create_qp_ex) } {
            Some(f) => unsafe { f(self.raw(), &mut init) },
            None => return Err(Error::Unsupported("XRC: the provider has no create_qp_ex")),
        };
        Ok(Qp {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_create_qp_ex"))?,
            _ctx: self.clone(),
            live: true,
        })
    }

    /// `ibv_open_qp`: a handle of the XRC receive QP `qpn` of `xrcd`.
    pub(crate) fn open_qp(self: &Arc<Self>, xrcd: &Xrcd, qpn: u32) -> Result<Qp> {
        use ffi::ibv_qp_open_attr_mask as m;
        let mut attr = ffi::ibv_qp_open_attr {
            comp_mask: (m::IBV_QP_OPEN_ATTR_NUM
                | m::IBV_QP_OPEN_ATTR_XRCD
                | m::IBV_QP_OPEN_ATTR_TYPE)
                .0,
            qp_num: qpn,
            xrcd: xrcd.raw(),
            qp_context: ptr::null_mut(),
            qp_type: ffi::ibv_qp_type::IBV_QPT_XRC_RECV,
        };
        // SAFETY: live context and domain; valid attribute struct.
        let p = match unsafe { ctx_op!(self.raw(), open_qp) } {
            Some(f) => unsafe { f(self.raw(), &mut attr) },
            None => return Err(Error::Unsupported("XRC: the provider has no open_qp")),
        };
        Ok(Qp {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_open_qp"))?,
            _ctx: self.clone(),
            live: true,
        })
    }

    /// `ibv_alloc_pd`.
    pub(crate) fn alloc_pd(self: &Arc<Self>) -> Result<Pd> {
        // SAFETY: live context.
        let p = unsafe { ffi::ibv_alloc_pd(self.raw()) };
        Ok(Pd {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_alloc_pd"))?,
            _ctx: self.clone(),
            live: true,
        })
    }

    /// `ibv_create_comp_channel` (its fd made non-blocking).
    pub(crate) fn create_comp_channel(self: &Arc<Self>) -> Result<CompChannel> {
        // SAFETY: live context.
        let p = unsafe { ffi::ibv_create_comp_channel(self.raw()) };
        let ch = CompChannel {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_create_comp_channel"))?,
            _ctx: self.clone(),
            live: true,
        };
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    /// `ibv_create_cq`. The CQ keeps its channel alive.
    pub(crate) fn create_cq(
        self: &Arc<Self>,
        cqe: u32,
        channel: Option<Arc<CompChannel>>,
        comp_vector: u32,
    ) -> Result<Cq> {
        let cqe = c_int::try_from(cqe).map_err(|_| Error::InvalidArgument("cqe too large"))?;
        // An int in C: a vector past i32::MAX is the negative one the caller meant.
        let comp_vector = comp_vector as c_int;
        let ch = channel.as_ref().map_or(ptr::null_mut(), |c| c.ptr.as_ptr());
        // SAFETY: live context; the channel (if any) is live and outlives the CQ (held
        // by it below).
        let p = unsafe { ffi::ibv_create_cq(self.raw(), cqe, ptr::null_mut(), ch, comp_vector) };
        Ok(Cq {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_create_cq"))?,
            _ctx: self.clone(),
            _channel: channel,
            live: true,
        })
    }
}

/// Frees a wrapped object once, on `destroy` or on drop (errors on drop are ignored:
/// the object then lives until the context is closed, which frees everything).
macro_rules! wrapper {
    ($(#[$m:meta])* $name:ident, $cty:ty, $free:path, $what:literal $(, $field:ident: $fty:ty)*) => {
        $(#[$m])*
        pub(crate) struct $name {
            ptr: NonNull<$cty>,
            _ctx: Arc<Context>,
            live: bool,
            $($field: $fty,)*
        }

        // SAFETY: libibverbs objects may be used and freed from any thread.
        unsafe impl Send for $name {}
        // SAFETY: as above; all methods take `&self`.
        unsafe impl Sync for $name {}

        impl $name {
            fn raw(&self) -> *mut $cty {
                self.ptr.as_ptr()
            }

            /// Frees the object; on failure (e.g. EBUSY) the wrapper is handed back.
            pub(crate) fn destroy(mut self) -> std::result::Result<(), (Self, Error)> {
                // SAFETY: the pointer is live (the wrapper exists) and freed only here.
                let ret = unsafe { $free(self.raw()) };
                if ret == 0 {
                    self.live = false;
                    Ok(())
                } else {
                    let e = ret_error(ret, $what);
                    Err((self, e))
                }
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                if self.live {
                    // SAFETY: live pointer, freed once.
                    let _ = unsafe { $free(self.raw()) };
                }
            }
        }
    };
}

wrapper!(
    /// A protection domain.
    Pd, ffi::ibv_pd, ffi::ibv_dealloc_pd, "ibv_dealloc_pd"
);
wrapper!(
    /// A completion channel.
    CompChannel, ffi::ibv_comp_channel, ffi::ibv_destroy_comp_channel, "ibv_destroy_comp_channel"
);
wrapper!(
    /// A completion queue; holds its channel.
    Cq, ffi::ibv_cq, ffi::ibv_destroy_cq, "ibv_destroy_cq", _channel: Option<Arc<CompChannel>>
);
wrapper!(
    /// A queue pair.
    Qp, ffi::ibv_qp, ffi::ibv_destroy_qp, "ibv_destroy_qp"
);
wrapper!(
    /// A shared receive queue.
    Srq, ffi::ibv_srq, ffi::ibv_destroy_srq, "ibv_destroy_srq"
);
wrapper!(
    /// An address handle.
    Ah, ffi::ibv_ah, ffi::ibv_destroy_ah, "ibv_destroy_ah"
);
wrapper!(
    /// A memory window.
    Mw, ffi::ibv_mw, dealloc_mw, "ibv_dealloc_mw"
);

/// `ibv_dealloc_mw` (an inline function in verbs.h).
unsafe fn dealloc_mw(mw: *mut ffi::ibv_mw) -> c_int {
    // SAFETY: the caller passes a live MW.
    unsafe { ffi::ibv_dealloc_mw(mw) }
}

wrapper!(
    /// An XRC domain (`struct ibv_xrcd` has no handle; the backend numbers them).
    Xrcd, ffi::ibv_xrcd, close_xrcd, "ibv_close_xrcd"
);

/// `ibv_close_xrcd` (an inline function in verbs.h): the context's `close_xrcd`.
unsafe fn close_xrcd(xrcd: *mut ffi::ibv_xrcd) -> c_int {
    // SAFETY: the caller passes a live domain, so its context is live.
    match unsafe { ctx_op!((*xrcd).context, close_xrcd) } {
        // SAFETY: the provider's own operation on its own object.
        Some(f) => unsafe { f(xrcd) },
        None => libc::EOPNOTSUPP,
    }
}

/// The extended operation `$field` of context `$ctx` (verbs.h's `verbs_get_ctx_op`):
/// libibverbs marks an extended context with `abi_compat == UINTPTR_MAX` and says in
/// `sz` how many bytes of `struct verbs_context`, counted back from its end, the
/// provider filled. (rdma-sys 0.3's own inline wrappers compare `abi_compat` with
/// `u32::MAX`, which never matches on a 64-bit host, so they always say EOPNOTSUPP.)
/// Unsafe: `$ctx` must be a live context.
macro_rules! ctx_op {
    ($ctx:expr, $field:ident) => {{
        let ctx: *mut ffi::ibv_context = $ctx;
        if (*ctx).abi_compat as usize != usize::MAX {
            None
        } else {
            let vc = ctx
                .byte_sub(std::mem::offset_of!(ffi::verbs_context, context))
                .cast::<ffi::verbs_context>();
            let need = std::mem::size_of::<ffi::verbs_context>()
                - std::mem::offset_of!(ffi::verbs_context, $field);
            if (*vc).sz < need {
                None
            } else {
                (*vc).$field
            }
        }
    }};
}
use ctx_op;

impl Pd {
    /// The kernel handle, this backend's `PdId`.
    pub(crate) fn handle(&self) -> u32 {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).handle }
    }

    /// `ibv_reg_mr` over `buf[offset..offset + length]`. The region keeps `buf` alive.
    pub(crate) fn reg_mr(
        &self,
        buf: &MemBuf,
        offset: usize,
        length: usize,
        access: u32,
    ) -> Result<Mr> {
        let addr = range_addr(buf, offset, length)?;
        let access =
            c_int::try_from(access).map_err(|_| Error::InvalidArgument("unknown access flags"))?;
        // SAFETY: live PD; [addr, addr + length) lies inside `buf`'s heap block, which the
        // returned Mr keeps alive until the registration ends (module docs).
        let p = unsafe { ffi::ibv_reg_mr(self.raw(), addr as *mut c_void, length, access) };
        Ok(Mr {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_reg_mr"))?,
            _ctx: self._ctx.clone(),
            live: true,
            buf: buf.clone(),
            retained: Vec::new(),
        })
    }

    /// `ibv_alloc_mw`.
    pub(crate) fn alloc_mw(&self, mw_type: MwType) -> Result<Mw> {
        // SAFETY: live PD.
        let p =
            unsafe { ffi::ibv_alloc_mw(self.raw(), mw_type.as_u32()) }.unwrap_or(ptr::null_mut());
        Ok(Mw {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_alloc_mw"))?,
            _ctx: self._ctx.clone(),
            live: true,
        })
    }

    /// `ibv_create_ah`.
    pub(crate) fn create_ah(&self, attr: &AhAttr) -> Result<Ah> {
        let mut c = convert::ah_attr_to_c(attr);
        // SAFETY: live PD, valid attribute struct.
        let p = unsafe { ffi::ibv_create_ah(self.raw(), sys_mut(&mut c)) };
        Ok(Ah {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_create_ah"))?,
            _ctx: self._ctx.clone(),
            live: true,
        })
    }

    /// `ibv_create_srq`.
    pub(crate) fn create_srq(&self, attr: &SrqAttr) -> Result<Srq> {
        let mut init = ffi::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: to_sys(convert::srq_attr_to_c(attr)),
        };
        // SAFETY: live PD, valid attribute struct.
        let p = unsafe { ffi::ibv_create_srq(self.raw(), &mut init) };
        Ok(Srq {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_create_srq"))?,
            _ctx: self._ctx.clone(),
            live: true,
        })
    }

    /// `ibv_create_qp`.
    pub(crate) fn create_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        init: &QpInitAttr,
        atomic_write: bool,
    ) -> Result<Qp> {
        let (qp_type, cap, sq_sig_all) = (init.qp_type, &init.cap, init.sq_sig_all);
        if atomic_write {
            return self.create_qp_ex(send_cq, recv_cq, srq, init);
        }
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.raw(),
            recv_cq: recv_cq.raw(),
            srq: srq.map_or(ptr::null_mut(), Srq::raw),
            cap: to_sys(convert::cap_to_c(cap)),
            qp_type: qp_type.as_u32(),
            sq_sig_all: c_int::from(sq_sig_all),
        };
        // SAFETY: live PD, CQs and SRQ (borrowed for the call; the kernel keeps them
        // from being freed while the QP uses them); valid attribute struct.
        let p = unsafe { ffi::ibv_create_qp(self.raw(), &mut init) };
        Ok(Qp {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_create_qp"))?,
            _ctx: self._ctx.clone(),
            live: true,
        })
    }

    /// `ibv_create_qp_ex` with the send operations of `ibv_post_send` and ATOMIC
    /// WRITE, which only the `ibv_qp_ex` interface posts (`ibv_wr_atomic_write`).
    fn create_qp_ex(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        attr: &QpInitAttr,
    ) -> Result<Qp> {
        use ffi::ibv_qp_create_send_ops_flags as f;
        let (qp_type, cap, sq_sig_all) = (attr.qp_type, &attr.cap, attr.sq_sig_all);
        // SAFETY: an all-integer/pointer struct: all-zero is valid.
        let mut init: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.raw();
        init.recv_cq = recv_cq.raw();
        init.srq = srq.map_or(ptr::null_mut(), Srq::raw);
        init.cap = to_sys(convert::cap_to_c(cap));
        init.qp_type = qp_type.as_u32();
        init.sq_sig_all = c_int::from(sq_sig_all);
        init.comp_mask = (ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD
            | ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
            .0;
        init.pd = self.raw();
        init.send_ops_flags = u64::from(
            (f::IBV_QP_EX_WITH_RDMA_WRITE
                | f::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
                | f::IBV_QP_EX_WITH_SEND
                | f::IBV_QP_EX_WITH_SEND_WITH_IMM
                | f::IBV_QP_EX_WITH_RDMA_READ
                | f::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
                | f::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
                | f::IBV_QP_EX_WITH_LOCAL_INV
                | f::IBV_QP_EX_WITH_BIND_MW
                | f::IBV_QP_EX_WITH_SEND_WITH_INV
                | f::IBV_QP_EX_WITH_ATOMIC_WRITE)
                .0,
        );
        let ctx = self._ctx.raw();
        // SAFETY: live context, PD, CQs and SRQ (borrowed for the call, as in
        // `create_qp`); valid attribute struct.
        let p = match unsafe { ctx_op!(ctx, create_qp_ex) } {
            Some(op) => unsafe { op(ctx, &mut init) },
            None => return Err(Error::Unsupported("the provider has no create_qp_ex")),
        };
        Ok(Qp {
            ptr: NonNull::new(p).ok_or_else(|| null_error("ibv_create_qp_ex"))?,
            _ctx: self._ctx.clone(),
            live: true,
        })
    }
}

/// The address of `buf[offset..offset + length]`, or EINVAL if the range is not inside.
fn range_addr(buf: &MemBuf, offset: usize, length: usize) -> Result<u64> {
    match offset.checked_add(length) {
        Some(end) if end <= buf.len() => Ok(buf.addr() + offset as u64),
        _ => Err(Error::InvalidArgument("range is outside the memory buffer")),
    }
}

/// A registered memory region. Holds the `MemBuf` it covers (see the module docs).
pub(crate) struct Mr {
    ptr: NonNull<ffi::ibv_mr>,
    _ctx: Arc<Context>,
    live: bool,
    /// The buffer the region currently translates.
    buf: MemBuf,
    /// Buffers of failed re-registrations, kept alive because the kernel may still
    /// translate them (module docs).
    retained: Vec<MemBuf>,
}

// SAFETY: as for the other wrappers; MemBuf is Send + Sync.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    fn raw(&self) -> *mut ffi::ibv_mr {
        self.ptr.as_ptr()
    }

    /// `(addr, length, lkey, rkey)` as libibverbs reports them now.
    pub(crate) fn info(&self) -> (u64, u64, u32, u32) {
        // SAFETY: live pointer, plain fields.
        unsafe {
            let m = &*self.raw();
            (m.addr as u64, m.length as u64, m.lkey, m.rkey)
        }
    }

    /// True if `[addr, addr + len)` lies inside both the region and its buffer.
    fn covers(&self, addr: u64, len: u64) -> bool {
        let (start, length, _, _) = self.info();
        let in_mr = addr >= start
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= start.saturating_add(length));
        in_mr && self.buf.offset_of(addr, len).is_some()
    }

    /// `ibv_dereg_mr`; the buffer is released only on success.
    pub(crate) fn destroy(mut self) -> std::result::Result<(), (Self, Error)> {
        // SAFETY: live MR, deregistered once.
        let ret = unsafe { ffi::ibv_dereg_mr(self.raw()) };
        if ret == 0 {
            self.live = false;
            Ok(())
        } else {
            let e = ret_error(ret, "ibv_dereg_mr");
            Err((self, e))
        }
    }

    /// `ibv_rereg_mr`. `range` replaces the translation (CHANGE_TRANSLATION), `pd` the
    /// PD (CHANGE_PD).
    pub(crate) fn rereg(
        &mut self,
        flags: ReregMrFlags,
        pd: Option<&Pd>,
        range: Option<(&MemBuf, usize, usize)>,
        access: u32,
    ) -> Result<()> {
        let (addr, len) = match range {
            Some((b, off, len)) => (range_addr(b, off, len)?, len),
            None => (0, 0),
        };
        let access =
            c_int::try_from(access).map_err(|_| Error::InvalidArgument("unknown access flags"))?;
        let c_flags =
            c_int::try_from(flags.bits()).map_err(|_| Error::InvalidArgument("rereg flags"))?;
        // The new buffer must be kept alive from the moment the kernel may translate it.
        if let Some((b, _, _)) = range {
            self.retained.push(b.clone());
        }
        // SAFETY: live MR and PD; the new range lies inside a buffer held in
        // `self.retained` (moved to `self.buf` on success).
        let ret = unsafe {
            ffi::ibv_rereg_mr(
                self.raw(),
                c_flags,
                pd.map_or(ptr::null_mut(), Pd::raw),
                addr as *mut c_void,
                len,
                access,
            )
        };
        if ret != 0 {
            let e = last_errno();
            if ret == -1 {
                // IBV_REREG_MR_ERR_INPUT: nothing was changed; the new buffer is not
                // translated.
                if range.is_some() {
                    self.retained.pop();
                }
            }
            return Err(Error::from_errno(
                if e == 0 { libc::EIO } else { e },
                "ibv_rereg_mr",
            ));
        }
        if let (Some(new), true) = (
            self.retained.pop(),
            flags.contains(ReregMrFlags::CHANGE_TRANSLATION),
        ) {
            // The old translation is gone: its buffer may be released.
            self.buf = new;
        }
        Ok(())
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if self.live {
            // SAFETY: live MR, deregistered once.
            if unsafe { ffi::ibv_dereg_mr(self.raw()) } != 0 {
                // Still registered: the NIC may still write there, so the memory must
                // never be freed (module docs).
                std::mem::forget(self.buf.clone());
                for b in &self.retained {
                    std::mem::forget(b.clone());
                }
            }
        }
    }
}

impl CompChannel {
    /// The channel's fd (non-blocking).
    pub(crate) fn fd(&self) -> c_int {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).fd }
    }

    /// `ibv_get_cq_event` + `ibv_ack_cq_events(cq, 1)` without blocking: the handle of
    /// the CQ, or `None` when no event is pending.
    pub(crate) fn try_get_cq_event(&self) -> Result<Option<u32>> {
        let mut cq: *mut ffi::ibv_cq = ptr::null_mut();
        let mut cq_ctx: *mut c_void = ptr::null_mut();
        // SAFETY: live channel, valid out pointers.
        let ret = unsafe { ffi::ibv_get_cq_event(self.raw(), &mut cq, &mut cq_ctx) };
        if ret != 0 {
            let e = last_errno();
            return if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
                Ok(None)
            } else {
                Err(Error::from_errno(e, "ibv_get_cq_event"))
            };
        }
        // SAFETY: the CQ is live until its event is acknowledged (ibv_destroy_cq waits
        // for the acknowledgement); acknowledged once, here.
        let handle = unsafe {
            let h = (*cq).handle;
            ffi::ibv_ack_cq_events(cq, 1);
            h
        };
        Ok(Some(handle))
    }
}

impl Cq {
    /// The kernel handle, this backend's `CqId`.
    pub(crate) fn handle(&self) -> u32 {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).handle }
    }

    /// `ibv_poll_cq`: appends up to `max` completions to `out`.
    pub(crate) fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        const BATCH: usize = 16;
        let mut total = 0;
        while total < max {
            let want = (max - total).min(BATCH);
            let mut wcs = [c::ibv_wc::default(); BATCH];
            let raw = sys_slice_mut(&mut wcs).as_mut_ptr();
            // SAFETY: live CQ; `want` <= BATCH entries of valid storage.
            let n = unsafe { ffi::ibv_poll_cq(self.raw(), want as c_int, raw) };
            if n < 0 {
                return Err(ret_error(n, "ibv_poll_cq"));
            }
            let n = n as usize;
            out.extend(wcs[..n].iter().map(convert::wc_from_c));
            total += n;
            if n < want {
                break;
            }
        }
        Ok(total)
    }

    /// `ibv_req_notify_cq`.
    pub(crate) fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: live CQ.
        check(
            unsafe { ffi::ibv_req_notify_cq(self.raw(), c_int::from(solicited_only)) },
            "ibv_req_notify_cq",
        )
    }

    /// `ibv_resize_cq`.
    pub(crate) fn resize(&self, cqe: u32) -> Result<()> {
        let cqe = c_int::try_from(cqe).map_err(|_| Error::InvalidArgument("cqe too large"))?;
        // SAFETY: live CQ.
        check(
            unsafe { ffi::ibv_resize_cq(self.raw(), cqe) },
            "ibv_resize_cq",
        )
    }
}

impl Srq {
    /// The kernel handle, this backend's `SrqId`.
    pub(crate) fn handle(&self) -> u32 {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).handle }
    }

    /// `ibv_get_srq_num`: an XRC SRQ's number (EINVAL, from the provider, otherwise).
    pub(crate) fn srq_num(&self) -> Result<u32> {
        let mut n = 0u32;
        // SAFETY: live SRQ, so its context is live; valid out pointer.
        let ret = match unsafe { ctx_op!((*self.raw()).context, get_srq_num) } {
            Some(f) => unsafe { f(self.raw(), &mut n) },
            None => libc::EOPNOTSUPP,
        };
        check(ret, "ibv_get_srq_num")?;
        Ok(n)
    }

    /// `ibv_modify_srq`.
    pub(crate) fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        let mut c = convert::srq_attr_to_c(attr);
        let mask = c_int::try_from(mask.bits()).map_err(|_| Error::InvalidArgument("mask"))?;
        // SAFETY: live SRQ, valid attribute struct.
        check(
            unsafe { ffi::ibv_modify_srq(self.raw(), sys_mut(&mut c), mask) },
            "ibv_modify_srq",
        )
    }

    /// `ibv_query_srq`.
    pub(crate) fn query(&self) -> Result<SrqAttr> {
        let mut c = c::ibv_srq_attr::default();
        // SAFETY: live SRQ, valid out pointer.
        check(
            unsafe { ffi::ibv_query_srq(self.raw(), sys_mut(&mut c)) },
            "ibv_query_srq",
        )?;
        Ok(convert::srq_attr_from_c(&c))
    }

    /// `ibv_post_srq_recv`.
    pub(crate) fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        post_recv_list(wrs, |head, bad| {
            // SAFETY: live SRQ; the list is valid for the call (see post_recv_list).
            unsafe { ffi::ibv_post_srq_recv(self.raw(), head, bad) }
        })
    }
}

impl Ah {
    /// The kernel handle, this backend's `AhId`.
    pub(crate) fn handle(&self) -> u32 {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).handle }
    }
}

impl Mw {
    /// The kernel handle, this backend's `MwId`.
    pub(crate) fn handle(&self) -> u32 {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).handle }
    }

    /// The window's current rkey.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).rkey }
    }

    /// The window's type.
    pub(crate) fn mw_type(&self) -> u32 {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).type_ }
    }
}

/// Builds the C receive list for `wrs` and calls `post` with its head and the `bad_wr`
/// out pointer; maps `bad_wr` back to an index.
fn post_recv_list(
    wrs: &[RecvWr],
    post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> c_int,
) -> std::result::Result<(), PostError> {
    if wrs.is_empty() {
        return Ok(());
    }
    let mut sges: Vec<Vec<ffi::ibv_sge>> = wrs
        .iter()
        .map(|w| {
            w.sg_list
                .iter()
                .map(|s| to_sys(convert::sge_to_c(s)))
                .collect()
        })
        .collect();
    let mut list: Vec<ffi::ibv_recv_wr> = Vec::with_capacity(wrs.len());
    for (w, s) in wrs.iter().zip(sges.iter_mut()) {
        list.push(ffi::ibv_recv_wr {
            wr_id: w.wr_id,
            next: ptr::null_mut(),
            sg_list: s.as_mut_ptr(),
            num_sge: s.len() as c_int,
        });
    }
    // Link the chain only now: `list` no longer moves.
    let base = list.as_mut_ptr();
    for i in 0..list.len() - 1 {
        // SAFETY: i + 1 < len, inside the vector.
        list[i].next = unsafe { base.add(i + 1) };
    }
    let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
    let ret = post(base, &mut bad);
    if ret == 0 {
        return Ok(());
    }
    Err(PostError {
        index: bad_index(bad, base, list.len()),
        error: ret_error(ret, "ibv_post_recv"),
    })
}

/// The index of `bad` in the array at `base` of `len` entries (0 if libibverbs did not
/// set it to one of them).
fn bad_index<T>(bad: *mut T, base: *mut T, len: usize) -> usize {
    let off = (bad as usize).wrapping_sub(base as usize) / std::mem::size_of::<T>().max(1);
    if bad.is_null() || off >= len {
        0
    } else {
        off
    }
}

/// What a send WR refers to, resolved by the caller from its tables.
pub(crate) struct SendRefs<'a> {
    /// The UD destination's address handle.
    pub(crate) ah: Option<&'a Ah>,
    /// The window of a type 2 BIND_MW.
    pub(crate) mw: Option<&'a Mw>,
    /// The region a BIND_MW binds to.
    pub(crate) bind_mr: Option<&'a Mr>,
    /// For an INLINE WR, the region named by each SGE's lkey (`None` if unknown).
    pub(crate) inline_mrs: Vec<Option<&'a Mr>>,
}

impl Qp {
    /// The QP number.
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: live pointer, plain field.
        unsafe { (*self.raw()).qp_num }
    }

    /// `ibv_modify_qp`.
    pub(crate) fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let mut c = convert::qp_attr_to_c(attr);
        let mask = c_int::try_from(mask.bits()).map_err(|_| Error::InvalidArgument("mask"))?;
        // SAFETY: live QP, valid attribute struct.
        check(
            unsafe { ffi::ibv_modify_qp(self.raw(), sys_mut(&mut c), mask) },
            "ibv_modify_qp",
        )
    }

    /// `ibv_query_qp` of every attribute; the objects of the init attributes named by
    /// their kernel handles (this backend's ids).
    pub(crate) fn query(&self) -> Result<(QpAttr, QpInitAttr)> {
        let mut attr = c::ibv_qp_attr::default();
        // SAFETY: an all-integer / pointer struct: all-zero is valid.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // Every attribute libibverbs can query: the bits below IBV_QP_RATE_LIMIT
        // (ibv_cmd_query_qp refuses RATE_LIMIT and above with EOPNOTSUPP).
        let all = c_int::try_from(QpAttrMask::RATE_LIMIT.bits() - 1).unwrap_or(c_int::MAX);
        // SAFETY: live QP, valid out pointers.
        check(
            unsafe { ffi::ibv_query_qp(self.raw(), sys_mut(&mut attr), all, &mut init) },
            "ibv_query_qp",
        )?;
        // SAFETY: the QP's PD, CQs and SRQ are live while it is (the kernel refuses to
        // free them first), or null where the QP has none (an XRC receive QP has no
        // PD and no CQs, an XRC send QP no receive CQ): 0 then; plain fields.
        let (pd, send_cq, recv_cq, srq, qp_type) = unsafe {
            let q = &*self.raw();
            (
                q.pd.as_ref().map_or(0, |p| p.handle),
                q.send_cq.as_ref().map_or(0, |c| c.handle),
                q.recv_cq.as_ref().map_or(0, |c| c.handle),
                q.srq.as_ref().map(|s| s.handle),
                q.qp_type,
            )
        };
        let init = QpInitAttr {
            pd: PdId(pd),
            send_cq: CqId(send_cq),
            recv_cq: CqId(recv_cq),
            qp_type: QpType::try_from(qp_type)?,
            cap: convert::cap_from_c(from_sys(&init.cap)),
            sq_sig_all: init.sq_sig_all != 0,
            srq: srq.map(SrqId),
        };
        Ok((convert::qp_attr_from_query(&attr), init))
    }

    /// `ibv_post_recv`.
    pub(crate) fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        post_recv_list(wrs, |head, bad| {
            // SAFETY: live QP; the list is valid for the call (see post_recv_list).
            unsafe { ffi::ibv_post_recv(self.raw(), head, bad) }
        })
    }

    /// `ibv_wr_atomic_write` between `ibv_wr_start` and `ibv_wr_complete`: the QP must
    /// have been created with it (`Pd::create_qp` does where the device reports
    /// ATOMIC WRITE; EOPNOTSUPP otherwise).
    fn post_atomic_write(&self, w: &SendWr) -> Result<()> {
        let WrOperation::AtomicWrite {
            remote_addr,
            rkey,
            data,
        } = w.op
        else {
            return Err(Error::InvalidArgument("not an ATOMIC WRITE"));
        };
        let unsupported = Error::Unsupported(
            "ATOMIC WRITE: the QP was created without it (the device reports no ATOMIC_WRITE)",
        );
        // SAFETY: a live QP.
        let qpx = unsafe { ffi::ibv_qp_to_qp_ex(self.raw()) };
        if qpx.is_null() {
            return Err(unsupported);
        }
        // SAFETY: an extended QP's function table, filled by the provider; `data`
        // outlives the call, which copies the 8 bytes into the work request.
        unsafe {
            let (Some(start), Some(write), Some(complete)) =
                ((*qpx).wr_start, (*qpx).wr_atomic_write, (*qpx).wr_complete)
            else {
                return Err(unsupported);
            };
            start(qpx);
            (*qpx).wr_id = w.wr_id;
            (*qpx).wr_flags = w.send_flags.bits();
            write(qpx, rkey, remote_addr, data.as_ptr().cast());
            check(complete(qpx), "ibv_wr_complete")
        }
    }

    /// `ibv_post_send`. `refs[i]` holds what `wrs[i]` refers to.
    pub(crate) fn post_send(
        &self,
        wrs: &[SendWr],
        refs: &[SendRefs<'_>],
    ) -> std::result::Result<(), PostError> {
        if wrs.is_empty() {
            return Ok(());
        }
        // ATOMIC WRITE goes through the `ibv_qp_ex` interface, the rest of the list
        // through `ibv_post_send`, in the list's order.
        let atomic_write = |w: &SendWr| matches!(w.op, WrOperation::AtomicWrite { .. });
        if let Some(k) = wrs.iter().position(atomic_write) {
            self.post_send(&wrs[..k], &refs[..k])?;
            self.post_atomic_write(&wrs[k])
                .map_err(|error| PostError { index: k, error })?;
            return self
                .post_send(&wrs[k + 1..], &refs[k + 1..])
                .map_err(|e| PostError {
                    index: e.index + k + 1,
                    ..e
                });
        }
        // SAFETY: a live QP; `qp_type` is a plain field set at creation.
        let qp_type = unsafe { (*self.raw()).qp_type };
        let ud = qp_type == QpType::Ud.as_u32();
        let xrc = qp_type == QpType::XrcSend.as_u32();
        let mut sges: Vec<Vec<ffi::ibv_sge>> = Vec::with_capacity(wrs.len());
        for (i, (w, r)) in wrs.iter().zip(refs).enumerate() {
            // `wr.qp_type.xrc.remote_srqn` always holds a number in C; a WR of an XRC
            // send QP that names no SRQ is refused here, as the Device trait says.
            if xrc && w.xrc_remote_srqn.is_none() {
                return Err(PostError {
                    index: i,
                    error: Error::InvalidArgument("an XRC send needs its remote SRQ number"),
                });
            }
            // A UD send without an address handle would hand the provider a null
            // `ibv_ah` to dereference (rxe crashes): refuse it as libibverbs' contract
            // requires a valid `wr.ud.ah` (ibv_post_send(3)).
            if ud && (w.ud.is_none() || r.ah.is_none()) {
                return Err(PostError {
                    index: i,
                    error: Error::InvalidArgument(
                        "a UD send needs wr.ud with a live address handle",
                    ),
                });
            }
            if w.send_flags.contains(SendFlags::INLINE) {
                // The provider memcpys inline data from these addresses in userspace:
                // each must lie inside a live registered buffer (module docs).
                for (j, s) in w.sg_list.iter().enumerate() {
                    let ok = s.length == 0
                        || r.inline_mrs
                            .get(j)
                            .copied()
                            .flatten()
                            .is_some_and(|m| m.covers(s.addr, u64::from(s.length)));
                    if !ok {
                        return Err(PostError {
                            index: i,
                            error: Error::InvalidArgument(
                                "an IBV_SEND_INLINE SGE is not inside the region its lkey names",
                            ),
                        });
                    }
                }
            }
            sges.push(
                w.sg_list
                    .iter()
                    .map(|s| to_sys(convert::sge_to_c(s)))
                    .collect(),
            );
        }
        let mut list: Vec<ffi::ibv_send_wr> = Vec::with_capacity(wrs.len());
        for (i, ((w, r), s)) in wrs.iter().zip(refs).zip(sges.iter_mut()).enumerate() {
            let c = send_wr_to_c(w, r, s).map_err(|error| PostError { index: i, error })?;
            list.push(c);
        }
        let base = list.as_mut_ptr();
        for i in 0..list.len() - 1 {
            // SAFETY: i + 1 < len, inside the vector (which no longer moves).
            list[i].next = unsafe { base.add(i + 1) };
        }
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: live QP; the chain, its SGE arrays and the AH/MW/MR pointers in it are
        // valid for the call; inline SGEs were checked above.
        let ret = unsafe { ffi::ibv_post_send(self.raw(), base, &mut bad) };
        if ret == 0 {
            return Ok(());
        }
        Err(PostError {
            index: bad_index(bad, base, list.len()),
            error: ret_error(ret, "ibv_post_send"),
        })
    }

    /// `ibv_bind_mw` of a type 1 window; returns the window's new rkey.
    pub(crate) fn bind_mw(&self, mw: &Mw, mr: Option<&Mr>, bind: &MwBind) -> Result<u32> {
        let mut c = ffi::ibv_mw_bind {
            wr_id: bind.wr_id,
            send_flags: bind.send_flags.bits(),
            bind_info: ffi::ibv_mw_bind_info {
                mr: mr.map_or(ptr::null_mut(), Mr::raw),
                addr: bind.bind_info.addr,
                length: bind.bind_info.length,
                mw_access_flags: bind.bind_info.mw_access_flags.bits(),
            },
        };
        // SAFETY: live QP, MW and MR; valid bind struct.
        let ret = unsafe { ffi::ibv_bind_mw(self.raw(), mw.raw(), &mut c) };
        check(ret, "ibv_bind_mw")?;
        Ok(mw.rkey())
    }

    /// `ibv_attach_mcast` / `ibv_detach_mcast`.
    pub(crate) fn mcast(&self, gid: &Gid, lid: u16, attach: bool) -> Result<()> {
        let g = to_sys(convert::gid_to_c(gid));
        // SAFETY: live QP, valid GID.
        let ret = unsafe {
            if attach {
                ffi::ibv_attach_mcast(self.raw(), &g, lid)
            } else {
                ffi::ibv_detach_mcast(self.raw(), &g, lid)
            }
        };
        check(
            ret,
            if attach {
                "ibv_attach_mcast"
            } else {
                "ibv_detach_mcast"
            },
        )
    }
}

/// One `struct ibv_send_wr` (its `next` is linked by the caller).
fn send_wr_to_c(
    w: &SendWr,
    r: &SendRefs<'_>,
    sges: &mut [ffi::ibv_sge],
) -> Result<ffi::ibv_send_wr> {
    let mut imm = ffi::imm_data_invalidated_rkey_union_t { imm_data: 0 };
    let mut wr = ffi::wr_t {
        rdma: ffi::rdma_t {
            remote_addr: 0,
            rkey: 0,
        },
    };
    let mut bind = ffi::bind_mw_tso_union_t {
        bind_mw: ffi::bind_mw_t {
            mw: ptr::null_mut(),
            rkey: 0,
            bind_info: ffi::ibv_mw_bind_info {
                mr: ptr::null_mut(),
                addr: 0,
                length: 0,
                mw_access_flags: 0,
            },
        },
    };
    match w.op {
        // IBTA 1.5 operations: libibverbs posts them only through `ibv_qp_ex`
        // (`ibv_send_wr` has no field for their data). ATOMIC WRITE takes that path
        // in `Qp::post_send`; `ibv_wr_flush` came with rdma-core 45, after the
        // headers this crate builds against (Debian 12's rdma-core 44).
        WrOperation::AtomicWrite { .. } => {
            return Err(Error::InvalidArgument(
                "ATOMIC WRITE is posted through ibv_qp_ex",
            ))
        }
        WrOperation::Flush { .. } => {
            return Err(Error::Unsupported(
                "FLUSH (ibv_wr_flush: rdma-core 45; the libibverbs headers here are 44)",
            ))
        }
        WrOperation::Send => {}
        WrOperation::SendWithImm { imm_data } => imm.imm_data = imm_data.to_be(),
        WrOperation::SendWithInv { invalidate_rkey }
        | WrOperation::LocalInv { invalidate_rkey } => {
            imm.invalidated_rkey = invalidate_rkey;
        }
        WrOperation::RdmaWrite { remote_addr, rkey }
        | WrOperation::RdmaRead { remote_addr, rkey } => {
            wr.rdma = ffi::rdma_t { remote_addr, rkey };
        }
        WrOperation::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm_data,
        } => {
            wr.rdma = ffi::rdma_t { remote_addr, rkey };
            imm.imm_data = imm_data.to_be();
        }
        WrOperation::AtomicCmpAndSwp {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            wr.atomic = ffi::atomic_t {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            };
        }
        WrOperation::AtomicFetchAndAdd {
            remote_addr,
            rkey,
            add,
        } => {
            wr.atomic = ffi::atomic_t {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
        }
        WrOperation::BindMw {
            new_rkey,
            bind_info,
            ..
        } => {
            let mw = r.mw.ok_or(Error::InvalidArgument(
                "BIND_MW names no memory window of this device",
            ))?;
            bind.bind_mw = ffi::bind_mw_t {
                mw: mw.raw(),
                rkey: new_rkey,
                bind_info: ffi::ibv_mw_bind_info {
                    mr: r.bind_mr.map_or(ptr::null_mut(), Mr::raw),
                    addr: bind_info.addr,
                    length: bind_info.length,
                    mw_access_flags: bind_info.mw_access_flags.bits(),
                },
            };
        }
    }
    if let Some(ud) = w.ud {
        let ah = r.ah.ok_or(Error::InvalidArgument(
            "the UD destination names no address handle",
        ))?;
        wr.ud = ffi::ud_t {
            ah: ah.raw(),
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
        };
    }
    Ok(ffi::ibv_send_wr {
        wr_id: w.wr_id,
        next: ptr::null_mut(),
        sg_list: if sges.is_empty() {
            ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        },
        num_sge: sges.len() as c_int,
        opcode: w.op.opcode().as_u32(),
        send_flags: w.send_flags.bits(),
        imm_data_invalidated_rkey_union: imm,
        wr,
        qp_type: ffi::qp_type_t {
            xrc: ffi::xrc_t {
                remote_srqn: w.xrc_remote_srqn.unwrap_or(0),
            },
        },
        bind_mw_tso_union: bind,
    })
}
