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

#![allow(unsafe_code)]

use std::collections::HashMap;

use emu_core::nic::EmuDevice;
use parking_lot::Mutex;
use verbs_api::{AhId, ChannelId, CqId, MwId, PdId, SrqId, WorkCompletion};

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
    /// The NIC while any context of this process has it open: every
    /// `ibv_open_device` of one device shares it, as contexts share one real NIC.
    pub(crate) nic: Mutex<std::sync::Weak<EmuDevice>>,
}

/// An opened device (`ibv_context`).
#[repr(C)]
pub(crate) struct Context {
    /// What the program sees; `vctx.context` is the `ibv_context`.
    pub(crate) vctx: sys::verbs_context,
    /// The emulated NIC (shared by the contexts of one device).
    pub(crate) dev: std::sync::Arc<EmuDevice>,
    /// CQ handle -> the `Cq` object's address (to answer `ibv_get_cq_event` and
    /// async events with the program's pointers).
    pub(crate) cqs: Mutex<HashMap<u32, usize>>,
    /// QP number -> the `Qp` object's address.
    pub(crate) qps: Mutex<HashMap<u32, usize>>,
    /// SRQ handle -> the `Srq` object's address.
    pub(crate) srqs: Mutex<HashMap<u32, usize>>,
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
    /// Work requests being built with `ibv_wr_*` between `ibv_wr_start` and
    /// `ibv_wr_complete`.
    pub(crate) building: Mutex<crate::qp_ex::Batch>,
}

/// A shared receive queue.
#[repr(C)]
pub(crate) struct Srq {
    pub(crate) raw: sys::ibv_srq,
    pub(crate) id: SrqId,
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

impl Context {
    /// The context behind an `ibv_context` pointer; `None` for null.
    ///
    /// # Safety
    ///
    /// `p` is null or a live context's pointer from `ibv_open_device`.
    pub(crate) unsafe fn from_ptr<'a>(p: *mut sys::ibv_context) -> Option<&'a Context> {
        if p.is_null() {
            return None;
        }
        let off = std::mem::offset_of!(sys::verbs_context, context);
        // SAFETY: the ibv_context is the field at `off` of the Context's verbs_context,
        // which is the Context's first field.
        unsafe { p.byte_sub(off).cast::<Context>().as_ref() }
    }

    /// The pointer the program sees.
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        std::ptr::addr_of!(self.vctx.context).cast_mut()
    }
}
