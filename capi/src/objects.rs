//! The objects behind the pointers the C API hands out, and the way back from a
//! pointer to its object.
//!
//! Each object is a `#[repr(C)]` struct whose first field is the libibverbs struct
//! the program sees (`ibv_pd`, `ibv_cq_ex`, `ibv_qp_ex`, ...), followed by what the
//! emulator needs (the `verbs_api` handle). The pointer given to the program is the
//! address of that first field, which is the address of the whole object, so turning
//! it back is a cast. A context is a `verbs_context` (whose last field is the
//! `ibv_context` the program sees, at offset 320) followed by the opened
//! [`EmuDevice`]. Objects live in a `Box` from their create call to their destroy
//! call.
//!
//! # Safety argument
//!
//! The casts in [`from_ptr`] and [`Context::from_ptr`] are sound for the pointers the
//! libibverbs contract allows a program to pass: pointers this library returned and
//! that were not destroyed since (man pages `ibv_*`: passing anything else is
//! undefined behaviour in rdma-core too). Null pointers are refused. The object is
//! only ever read through a shared reference; everything the emulator changes in it
//! after creation sits behind a lock or is a field the program itself owns (e.g.
//! `cq_context`), exactly as in rdma-core's own objects.
//!
//! # What a handle names
//!
//! With a kernel driver, every control verb (create, modify, query, destroy) passes the
//! object's `handle` and its context's command fd to the kernel, which looks the handle
//! up in that context's table and fails the call when it is not there: ENOENT for a
//! destroy (`rdma_lookup_get_uobject`), EINVAL for an object named as another verb's
//! argument (`uobj_get_obj_read` returning NULL). A program whose object's `handle` or
//! `context` was overwritten (as a stale or foreign pointer looks) therefore gets an
//! error, not a freed object that its later clean-up frees again. This library does
//! the same: [`Context::from_ptr`] accepts only the live contexts of the process, each
//! context keeps a table per [`Kind`] from handle to object address, and [`live`]
//! checks an object against them before a control verb uses it. The data path (post,
//! poll), which providers run in user space without the kernel, does not look up.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_int;

use emu_core::nic::EmuDevice;
use parking_lot::Mutex;
use verbs_api::{AhId, ChannelId, CqId, Device as _, MwId, PdId, SrqId, WorkCompletion, XrcdId};

use crate::config::DeviceConfig;
use crate::sys;

/// An emulated device as `ibv_get_device_list` lists it.
#[repr(C)]
pub(crate) struct Device {
    /// What the program sees.
    pub(crate) raw: sys::ibv_device,
    /// How to open it.
    pub(crate) cfg: DeviceConfig,
    /// Its index in the list (`ibv_get_device_index`).
    pub(crate) index: usize,
    /// The NIC while any context of this process has it open, and the process that
    /// opened it: every `ibv_open_device` of one device in that process shares it, as
    /// contexts share one real NIC. A child made by `fork` opens a NIC of its own (the
    /// parent's has no thread in the child); both then share the device's address
    /// (emu-core's `share`), as a parent and child share one kernel device.
    pub(crate) nic: Mutex<(u32, std::sync::Weak<EmuDevice>)>,
}

/// An opened device (`ibv_context`).
#[repr(C)]
pub(crate) struct Context {
    /// What the program sees; `vctx.context` is the `ibv_context`.
    pub(crate) vctx: sys::verbs_context,
    /// The emulated NIC (shared by the contexts of one device).
    pub(crate) dev: std::sync::Arc<EmuDevice>,
    /// Per [`Kind`]: handle -> the object's address. The objects made through this
    /// context, to check the handles programs pass ([`live`]) and to answer
    /// `ibv_get_cq_event` and async events with the program's pointers.
    pub(crate) tables: [Mutex<HashMap<u32, usize>>; Kind::COUNT],
    /// The context's command fd (`ibv_context::cmd_fd`): an open descriptor of
    /// `/dev/null`, so a program that duplicates or polls it (pyverbs'
    /// `os.dup(ctx.cmd_fd)`) gets a real fd; -1 if none could be opened.
    pub(crate) cmd_fd: c_int,
    /// The process that opened it (see [`Device::nic`]).
    pub(crate) pid: u32,
}

/// The kinds of object a program names by handle (one table each per context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Pd,
    Mr,
    Cq,
    Qp,
    Srq,
    Ah,
    Mw,
    Xrcd,
}

impl Kind {
    /// How many kinds there are.
    pub(crate) const COUNT: usize = 8;
}

/// A protection domain.
#[repr(C)]
pub(crate) struct Pd {
    pub(crate) raw: sys::ibv_pd,
    pub(crate) id: PdId,
}

/// A memory region (keys in `raw`).
#[repr(C)]
pub(crate) struct Mr {
    pub(crate) raw: sys::ibv_mr,
}

/// A completion channel.
#[repr(C)]
pub(crate) struct Channel {
    pub(crate) raw: sys::ibv_comp_channel,
    pub(crate) id: ChannelId,
}

/// A completion queue; always an `ibv_cq_ex`, whose first fields are `ibv_cq`.
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) raw: sys::ibv_cq_ex,
    pub(crate) id: CqId,
    /// Extended polling (`ibv_start_poll`): the completions taken from the device and
    /// not yet stepped past; the front one is current.
    pub(crate) polled: Mutex<std::collections::VecDeque<WorkCompletion>>,
}

/// A queue pair; always an `ibv_qp_ex`, whose first field is `ibv_qp`.
#[repr(C)]
pub(crate) struct Qp {
    pub(crate) raw: sys::ibv_qp_ex,
    /// `ibv_qp_ex.wr_flush`: rdma-core 45 appended it to `struct ibv_qp_ex`, after
    /// `wr_atomic_write`, the last member of the v44 headers the C structs are generated
    /// from; it sits right behind `raw`, where a program built with the newer headers
    /// reads it (`ibv_wr_flush`).
    pub(crate) wr_flush: crate::qp_ex::WrFlushFn,
    /// Work requests being built with `ibv_wr_*` between `ibv_wr_start` and
    /// `ibv_wr_complete`.
    pub(crate) building: Mutex<crate::qp_ex::Batch>,
    /// The send and receive queues' sizes (`cap.max_send_wr`, `cap.max_recv_wr` as
    /// created): a posted list is read no further than a queue can hold.
    pub(crate) sq_cap: u32,
    pub(crate) rq_cap: u32,
}

/// A shared receive queue.
#[repr(C)]
pub(crate) struct Srq {
    pub(crate) raw: sys::ibv_srq,
    pub(crate) id: SrqId,
    /// The queue's size (`max_wr`, as created or resized): a posted list is read no
    /// further than it can hold.
    pub(crate) max_wr: std::sync::atomic::AtomicU32,
}

/// An XRC domain (`ibv_xrcd`, which has no `handle` field: the object keeps its own,
/// a number of this process, as the key of its context's table).
#[repr(C)]
pub(crate) struct Xrcd {
    pub(crate) raw: sys::ibv_xrcd,
    pub(crate) id: XrcdId,
    pub(crate) handle: u32,
}

/// An address handle.
#[repr(C)]
pub(crate) struct Ah {
    pub(crate) raw: sys::ibv_ah,
    pub(crate) id: AhId,
}

/// A memory window.
#[repr(C)]
pub(crate) struct Mw {
    pub(crate) raw: sys::ibv_mw,
    pub(crate) id: MwId,
}

/// Marks the objects whose first field is the C struct `C`.
///
/// # Safety
///
/// `Self` must be `#[repr(C)]` with a `C` as its first field.
pub(crate) unsafe trait Wraps<C> {}
// SAFETY: each is #[repr(C)] with the named struct first (definitions above).
unsafe impl Wraps<sys::ibv_pd> for Pd {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_mr> for Mr {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_comp_channel> for Channel {}
// SAFETY: ibv_cq_ex begins with the fields of ibv_cq (verbs.h keeps them identical).
unsafe impl Wraps<sys::ibv_cq> for Cq {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_cq_ex> for Cq {}
// SAFETY: ibv_qp_ex begins with qp_base, an ibv_qp.
unsafe impl Wraps<sys::ibv_qp> for Qp {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_qp_ex> for Qp {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_srq> for Srq {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_ah> for Ah {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_xrcd> for Xrcd {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_mw> for Mw {}
// SAFETY: as above.
unsafe impl Wraps<sys::ibv_device> for Device {}

/// The object behind a pointer this library handed out; `None` for null.
///
/// # Safety
///
/// `p` is null or a live object's pointer (module safety argument).
pub(crate) unsafe fn from_ptr<'a, C, T: Wraps<C>>(p: *mut C) -> Option<&'a T> {
    // SAFETY: caller's contract; T starts with C (Wraps).
    unsafe { p.cast::<T>().as_ref() }
}

/// Moves `obj` to the heap and returns the pointer the program gets.
pub(crate) fn into_ptr<C, T: Wraps<C>>(obj: T) -> *mut C {
    Box::into_raw(Box::new(obj)).cast::<C>()
}

/// Frees an object made by [`into_ptr`].
///
/// # Safety
///
/// `p` came from `into_ptr::<C, T>`, is freed once, and no reference to it is used
/// afterwards.
pub(crate) unsafe fn free<C, T: Wraps<C>>(p: *mut C) {
    // SAFETY: caller's contract.
    drop(unsafe { Box::from_raw(p.cast::<T>()) });
}

/// The `ibv_context` pointers of the open contexts of this process.
static CONTEXTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

impl Context {
    /// The context behind an `ibv_context` pointer; `None` for null or for a pointer
    /// that is not an open context of this process.
    ///
    /// # Safety
    ///
    /// None beyond the module's: the pointer is checked against the open contexts
    /// before it is read.
    pub(crate) unsafe fn from_ptr<'a>(p: *mut sys::ibv_context) -> Option<&'a Context> {
        if p.is_null() || !CONTEXTS.lock().contains(&(p as usize)) {
            return None;
        }
        // SAFETY: an open context (checked above).
        unsafe { Self::from_ptr_unchecked(p) }
    }

    /// [`Context::from_ptr`] without the look-up, for the data path (posting and
    /// polling), which providers run in user space without checking.
    ///
    /// # Safety
    ///
    /// `p` is null or a live context's pointer from `ibv_open_device`.
    pub(crate) unsafe fn from_ptr_unchecked<'a>(p: *mut sys::ibv_context) -> Option<&'a Context> {
        if p.is_null() {
            return None;
        }
        let off = std::mem::offset_of!(sys::verbs_context, context);
        // SAFETY: the ibv_context is the field at `off` of the Context's verbs_context,
        // which is the Context's first field.
        unsafe { p.byte_sub(off).cast::<Context>().as_ref() }
    }

    /// Moves a new context to the heap, records it as open and returns the pointer
    /// the program gets.
    pub(crate) fn open(ctx: Context) -> *mut sys::ibv_context {
        let p = Box::leak(Box::new(ctx)).as_ptr();
        CONTEXTS.lock().push(p as usize);
        p
    }

    /// Closes an open context: EINVAL for a pointer that is not one.
    ///
    /// # Safety
    ///
    /// No reference to the context is used afterwards (the program gives it up).
    pub(crate) unsafe fn close(p: *mut sys::ibv_context) -> c_int {
        let ctx = {
            let mut open = CONTEXTS.lock();
            let Some(i) = open.iter().position(|&c| c == p as usize) else {
                return libc::EINVAL;
            };
            open.swap_remove(i);
            // SAFETY: it was open (checked under the lock that guards the set).
            unsafe { Self::from_ptr_unchecked(p) }
        };
        if let Some(ctx) = ctx {
            if ctx.cmd_fd >= 0 {
                // SAFETY: the context's own descriptor, closed once here.
                unsafe { libc::close(ctx.cmd_fd) };
            }
            // The last context of a device takes its NIC down (thread, socket) as it
            // goes: under the device's lock, so that an `ibv_open_device` of the same
            // device meanwhile waits for the socket to close instead of failing to
            // bind its address (EADDRINUSE).
            // SAFETY: the context's device is one of the list's (ibv_open_device).
            let dev = unsafe { from_ptr::<_, Device>(ctx.vctx.context.device) };
            let _held = dev.map(|d| d.nic.lock());
            // SAFETY: made by Box::leak in `open`; removed from the set above, so
            // this is the only release.
            let ctx = unsafe { Box::from_raw(std::ptr::from_ref(ctx).cast_mut()) };
            if ctx.pid == std::process::id() {
                ctx.release_objects();
                drop(ctx);
            } else {
                // A context the parent opened before `fork`: its NIC's thread is the
                // parent's, so taking the NIC down here would wait for a thread this
                // process does not have. It stays as it is (its socket is the
                // parent's too).
                std::mem::forget(ctx);
            }
        }
        0
    }

    /// Destroys on the device every object made through this context and not
    /// destroyed, as the kernel does when a process closes its verbs file: another
    /// context of the same device (librdmacm keeps its own open) keeps the NIC up, and
    /// its QPs, registrations and multicast attachments must not outlive the context
    /// that made them. Dependents go first (QPs before their CQs, SRQs and PD). The C
    /// objects themselves stay allocated: the program may still hold their pointers.
    fn release_objects(&self) {
        let taken = |kind: Kind| -> Vec<usize> {
            std::mem::take(&mut *self.table(kind).lock())
                .into_values()
                .collect()
        };
        let dev = &self.dev;
        // SAFETY (every read below): each address was recorded by the verb that made
        // the object, of the type its table names, and objects are never freed while
        // they are in a table (their destroy verbs forget them first).
        for p in taken(Kind::Qp) {
            let _ = dev.release_qp(unsafe { (*(p as *const Qp)).raw.qp_base.qp_num });
        }
        for p in taken(Kind::Ah) {
            let _ = dev.destroy_ah(unsafe { (*(p as *const Ah)).id });
        }
        for p in taken(Kind::Mw) {
            let _ = dev.dealloc_mw(unsafe { (*(p as *const Mw)).id });
        }
        for p in taken(Kind::Srq) {
            let _ = dev.destroy_srq(unsafe { (*(p as *const Srq)).id });
        }
        for p in taken(Kind::Mr) {
            let _ = dev.dereg_mr(unsafe { (*(p as *const Mr)).raw.lkey });
        }
        for p in taken(Kind::Cq) {
            let _ = dev.destroy_cq(unsafe { (*(p as *const Cq)).id });
        }
        for p in taken(Kind::Xrcd) {
            let _ = dev.close_xrcd(unsafe { (*(p as *const Xrcd)).id });
        }
        for p in taken(Kind::Pd) {
            let _ = dev.dealloc_pd(unsafe { (*(p as *const Pd)).id });
        }
    }

    /// The pointer the program sees.
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        std::ptr::addr_of!(self.vctx.context).cast_mut()
    }

    /// The table of objects of `kind` (handle -> address).
    pub(crate) fn table(&self, kind: Kind) -> &Mutex<HashMap<u32, usize>> {
        &self.tables[kind as usize]
    }

    /// Records an object of `kind` made through this context.
    pub(crate) fn record<C>(&self, kind: Kind, handle: u32, p: *mut C) {
        self.table(kind).lock().insert(handle, p as usize);
    }

    /// Forgets an object of `kind` (it is being destroyed).
    pub(crate) fn forget(&self, kind: Kind, handle: u32) {
        self.table(kind).lock().remove(&handle);
    }

    /// The address of the object of `kind` with `handle`, if it is one of this context's.
    pub(crate) fn lookup(&self, kind: Kind, handle: u32) -> Option<usize> {
        self.table(kind).lock().get(&handle).copied()
    }
}

/// The objects a program names by their `handle`, with the fields the kernel's
/// look-up reads.
pub(crate) trait Named: Wraps<Self::C> + Sized {
    /// The C struct the program sees.
    type C;
    /// The table the handle is looked up in.
    const KIND: Kind;
    /// The object's `context` field, as the program left it.
    fn context(&self) -> *mut sys::ibv_context;
    /// The object's `handle` field, as the program left it.
    fn handle(&self) -> u32;
}

macro_rules! named {
    ($t:ty, $c:ty, $kind:ident, |$o:ident| $base:expr) => {
        impl Named for $t {
            type C = $c;
            const KIND: Kind = Kind::$kind;
            fn context(&self) -> *mut sys::ibv_context {
                let $o = self;
                $base.context
            }
            fn handle(&self) -> u32 {
                let $o = self;
                $base.handle
            }
        }
    };
}
named!(Pd, sys::ibv_pd, Pd, |o| o.raw);
named!(Mr, sys::ibv_mr, Mr, |o| o.raw);
named!(Cq, sys::ibv_cq, Cq, |o| o.raw);
named!(Qp, sys::ibv_qp, Qp, |o| o.raw.qp_base);
named!(Srq, sys::ibv_srq, Srq, |o| o.raw);
named!(Ah, sys::ibv_ah, Ah, |o| o.raw);
named!(Mw, sys::ibv_mw, Mw, |o| o.raw);

impl Named for Xrcd {
    type C = sys::ibv_xrcd;
    const KIND: Kind = Kind::Xrcd;
    fn context(&self) -> *mut sys::ibv_context {
        self.raw.context
    }
    fn handle(&self) -> u32 {
        self.handle
    }
}

/// The object behind `p` and its context, checked as the kernel checks a handle: its
/// `context` is an open context of this process and that context's table maps its
/// `handle` to `p`. EINVAL for null; ENOENT otherwise (what a destroy returns; verbs
/// that take the object as an argument return EINVAL instead, as the kernel does).
///
/// # Safety
///
/// `p` is null or points to a live object of type `T` (the module's argument); its
/// `context` and `handle` fields may hold anything.
pub(crate) unsafe fn live<'a, T: Named>(p: *mut T::C) -> Result<(&'a T, &'a Context), c_int> {
    // SAFETY: caller's contract.
    let Some(o) = (unsafe { from_ptr::<T::C, T>(p) }) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: checked against the open contexts before it is read.
    let Some(ctx) = (unsafe { Context::from_ptr(o.context()) }) else {
        return Err(libc::ENOENT);
    };
    if ctx.lookup(T::KIND, o.handle()) != Some(p as usize) {
        return Err(libc::ENOENT);
    }
    Ok((o, ctx))
}
