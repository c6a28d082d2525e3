//! Memory windows (IBTA 10.6.7; manual 2.3.5; man pages `ibv_alloc_mw(3)`,
//! `ibv_bind_mw(3)`): remote access to part of a registered region, with its own R_Key,
//! range and rights.
//!
//! - **Type 1** windows belong to their PD and are bound with the bind verb
//!   (`ibv_bind_mw`), which posts a bind WQE on a QP's send queue and returns the new
//!   R_Key at once (the index stays, the low byte moves on). A bind of length 0 unbinds.
//!   Type 1 windows cannot be invalidated (IBTA o10-37.2.26) and may not be zero-based
//!   (IBTA 10.6.7).
//! - **Type 2** windows are bound with a BIND_MW work request, only while unbound, never
//!   with length 0; the window then belongs to the QP it was bound through: only that
//!   QP's peer may use it. LOCAL_INV or a remote SEND with Invalidate unbinds it. The
//!   WR names the window by its current R_Key's index (`mw_rkey`, what libibverbs'
//!   `bind_mw.mw` stands for: a handle, so the key byte it carries does not matter),
//!   and of the new R_Key only the low byte, the key the consumer owns, is taken: the
//!   index stays the window's (IBTA 10.6.7.2: the consumer supplies the key portion;
//!   kernel rxe's `rxe_do_bind_mw`, mlx5 and irdma take the low 8 bits the same way,
//!   and google/rdma-unit-test binds with R_Key 1024 whatever the window's index).
//! - A bind fails with `MW_BIND_ERR` (IBTA 10.6.7, as kernel rxe's `rxe_check_bind_mw`)
//!   when: the window or the region is unknown; a PD differs (window, region, QP); the
//!   region lacks `MW_BIND`; the window asks for REMOTE_WRITE or REMOTE_ATOMIC on a
//!   region without LOCAL_WRITE (IBTA 10.6); the range is not inside the region; a type 1
//!   window is zero-based; a type 2 window is bound already; the window's type does
//!   not match how it is bound.
//! - Remote access through a window is checked against the window's range and rights,
//!   not the region's, before a byte moves ([`MrTable::resolve_remote`]).
//! - A region cannot be deregistered while windows are bound to it (EBUSY).
//! - Bind and LOCAL_INV WQEs run in the requester when every earlier WQE of the send
//!   queue has completed, and complete with `IBV_WC_BIND_MW` / `IBV_WC_LOCAL_INV`. A
//!   failed LOCAL_INV completes with `MW_BIND_ERR` ("memory management operation
//!   error", IBTA 10.6; kernel rxe reports `LOC_QP_OP_ERR`).

use verbs_api::{AccessFlags, Error, MwBindInfo, MwType, Result, WcStatus, WrOperation};

use super::ctx::Ctx;
use super::mr::{range_in, AccessError, MrTable, Segment};
use super::qp::QueuePair;
use verbs_api::PdId;

/// What a window is bound to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WindowBinding {
    /// The key of the region.
    mr_key: u32,
    /// The region address the window starts at.
    addr: u64,
    length: u64,
    access: AccessFlags,
    zero_based: bool,
}

/// One memory window.
#[derive(Debug)]
pub(crate) struct MemoryWindow {
    pd: PdId,
    mw_type: MwType,
    /// The R_Key the window answers to now.
    rkey: u32,
    /// Type 1: the R_Key the bind verb handed out last (binds may still be queued).
    handed_out: u32,
    binding: Option<WindowBinding>,
    /// Type 2: the QP the window was bound through.
    qpn: Option<u32>,
}

/// Which window a bind WQE binds and how it was posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindOrigin {
    /// The bind verb, for the type 1 window with this index.
    Verb(u32),
    /// A BIND_MW work request (type 2).
    WorkRequest,
}

impl MrTable {
    /// `ibv_alloc_mw`: EINVAL for an unknown PD. Returns the window's index (its
    /// handle) and its first R_Key.
    pub(crate) fn alloc_mw(&mut self, pd: PdId, mw_type: MwType) -> Result<(u32, u32)> {
        if !self.pd_exists(pd) {
            return Err(Error::InvalidArgument("no such protection domain"));
        }
        let rkey = self.alloc_key();
        self.mws.insert(
            rkey >> 8,
            MemoryWindow {
                pd,
                mw_type,
                rkey,
                handed_out: rkey,
                binding: None,
                qpn: None,
            },
        );
        self.pd_ref(pd, 1);
        Ok((rkey >> 8, rkey))
    }

    /// `ibv_dealloc_mw`: EINVAL for an unknown window. A bound window is invalidated.
    pub(crate) fn dealloc_mw(&mut self, id: u32) -> Result<()> {
        let mw = self
            .mws
            .remove(&id)
            .ok_or(Error::InvalidArgument("no such memory window"))?;
        self.pd_ref(mw.pd, -1);
        Ok(())
    }

    /// The window's current R_Key and type.
    pub(crate) fn mw_info(&self, id: u32) -> Option<(u32, MwType)> {
        self.mws.get(&id).map(|w| (w.rkey, w.mw_type))
    }

    /// The bind verb's new R_Key for type 1 window `id`: the next low byte after the
    /// last one handed out (as libibverbs' `ibv_inc_rkey`). EINVAL for an unknown window
    /// or one of type 2 (those are bound with a work request).
    pub(crate) fn next_type1_rkey(&mut self, id: u32) -> Result<u32> {
        let mw = self
            .mws
            .get_mut(&id)
            .ok_or(Error::InvalidArgument("no such memory window"))?;
        if mw.mw_type != MwType::Type1 {
            return Err(Error::InvalidArgument(
                "type 2 windows are bound with a BIND_MW work request",
            ));
        }
        let tag = (mw.handed_out.wrapping_add(1)) & 0xFF;
        mw.handed_out = (mw.handed_out & !0xFF) | tag;
        Ok(mw.handed_out)
    }

    /// Whether some window is bound to the region with this key.
    pub(crate) fn windows_bound_to(&self, mr_key: u32) -> bool {
        self.mws
            .values()
            .any(|w| w.binding.is_some_and(|b| b.mr_key == mr_key))
    }

    /// Executes a bind for QP `qpn` of `qp_pd` (the checks of IBTA 10.6.7, in kernel
    /// rxe's order): of window `mw_rkey >> 8` for a work request, of the verb's window
    /// otherwise. Nothing changes unless every check passes.
    pub(crate) fn bind(
        &mut self,
        qp_pd: PdId,
        qpn: u32,
        origin: BindOrigin,
        (mw_rkey, new_rkey): (u32, u32),
        info: &MwBindInfo,
    ) -> std::result::Result<(), WcStatus> {
        let fail = Err(WcStatus::MwBindErr);
        let id = match origin {
            BindOrigin::Verb(id) => id,
            BindOrigin::WorkRequest => mw_rkey >> 8,
        };
        let Some(mw) = self.mws.get(&id) else {
            return fail;
        };
        let type1 = mw.mw_type == MwType::Type1;
        if type1 != matches!(origin, BindOrigin::Verb(_)) || mw.pd != qp_pd {
            return fail;
        }
        let zero_based = info.mw_access_flags.contains(AccessFlags::ZERO_BASED);
        if type1 && zero_based {
            return fail;
        }
        if !type1 && (mw.binding.is_some() || info.length == 0) {
            return fail;
        }
        let binding = if info.length == 0 {
            None
        } else {
            let Some(mr) = self.by_key(info.mr_lkey) else {
                return fail;
            };
            let wants_write = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
            if mr.pd != qp_pd
                || !mr.access.contains(AccessFlags::MW_BIND)
                || (info.mw_access_flags.intersects(wants_write)
                    && !mr.access.contains(AccessFlags::LOCAL_WRITE))
                || range_in(mr, info.addr, info.length).is_none()
            {
                return fail;
            }
            Some(WindowBinding {
                mr_key: mr.lkey,
                addr: info.addr,
                length: info.length,
                access: info.mw_access_flags,
                zero_based,
            })
        };
        let mw = self.mws.get_mut(&id).expect("looked up above");
        mw.binding = binding;
        // Type 1: the verb handed out an R_Key of this index already; type 2: the
        // window's index and the consumer's key byte.
        mw.rkey = (mw.rkey & !0xFF) | (new_rkey & 0xFF);
        mw.qpn = (!type1).then_some(qpn);
        Ok(())
    }

    /// Invalidates the type 2 window with R_Key `rkey` for QP `qpn` of `qp_pd` (LOCAL_INV,
    /// or a SEND with Invalidate arriving at `qpn`). Regions from `reg_mr`, type 1
    /// windows, unbound windows, windows of another PD and windows bound through
    /// another QP cannot be invalidated (IBTA 10.6.7.2: a type 2 window belongs to the
    /// QP it was bound through, which alone uses and invalidates it).
    pub(crate) fn invalidate(
        &mut self,
        qp_pd: PdId,
        qpn: u32,
        rkey: u32,
    ) -> std::result::Result<(), ()> {
        let mw = self
            .mws
            .get_mut(&(rkey >> 8))
            .filter(|w| w.rkey == rkey && w.mw_type == MwType::Type2)
            .filter(|w| w.binding.is_some() && w.pd == qp_pd && w.qpn == Some(qpn))
            .ok_or(())?;
        mw.binding = None;
        mw.qpn = None;
        Ok(())
    }

    /// A remote access through a window (IBTA 10.6.7, 9.7.4.1): the window must be bound,
    /// of the QP's PD, a type 2 window bound through this QP; its rights and range
    /// decide, and the bytes are those of the region underneath.
    pub(crate) fn resolve_window(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        va: u64,
        length: u64,
        need: AccessFlags,
    ) -> std::result::Result<Segment, AccessError> {
        let mw = self
            .mws
            .get(&(rkey >> 8))
            .filter(|w| w.rkey == rkey)
            .ok_or(AccessError::BadKey)?;
        let b = mw.binding.ok_or(AccessError::BadKey)?;
        if mw.pd != pd || (mw.mw_type == MwType::Type2 && mw.qpn != Some(qpn)) {
            return Err(AccessError::WrongPd);
        }
        if !b.access.contains(need) {
            return Err(AccessError::NotPermitted);
        }
        let start = if b.zero_based {
            va
        } else {
            va.checked_sub(b.addr).ok_or(AccessError::OutOfBounds)?
        };
        let end = start.checked_add(length).ok_or(AccessError::OutOfBounds)?;
        if end > b.length {
            return Err(AccessError::OutOfBounds);
        }
        let mr = self.by_key(b.mr_key).ok_or(AccessError::BadKey)?;
        let off = range_in(mr, b.addr + start, length).ok_or(AccessError::OutOfBounds)?;
        Ok(Segment {
            buf: mr.buf.clone(),
            offset: mr.buf_offset + off,
            len: length as usize,
        })
    }
}

impl QueuePair {
    /// Runs a bind or LOCAL_INV WQE (at the head of the send queue); returns its status.
    pub(crate) fn execute_local(&mut self, ctx: &mut Ctx<'_>, idx: usize) -> WcStatus {
        let wqe = &self.sq[idx];
        let result = match &wqe.op {
            WrOperation::BindMw {
                mw_rkey,
                new_rkey,
                bind_info,
            } => {
                let origin = wqe.bind_origin.unwrap_or(BindOrigin::WorkRequest);
                let keys = (*mw_rkey, *new_rkey);
                ctx.mrs
                    .bind(self.init.pd, self.qpn, origin, keys, bind_info)
            }
            WrOperation::LocalInv { invalidate_rkey } => ctx
                .mrs
                .invalidate(self.init.pd, self.qpn, *invalidate_rkey)
                .map_err(|()| WcStatus::MwBindErr),
            _ => unreachable!("only local operations"),
        };
        match result {
            Ok(()) => WcStatus::Success,
            Err(status) => status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::MemBuf;

    #[test]
    fn type1_rkeys_advance_and_keep_the_index() {
        let mut t = MrTable::default();
        let pd = t.alloc_pd();
        let (id, rkey) = t.alloc_mw(pd, MwType::Type1).unwrap();
        let k1 = t.next_type1_rkey(id).unwrap();
        let k2 = t.next_type1_rkey(id).unwrap();
        assert_eq!((k1 >> 8, k2 >> 8), (id, id));
        assert_ne!(k1, rkey);
        assert_ne!(k1, k2);
        let (id2, _) = t.alloc_mw(pd, MwType::Type2).unwrap();
        assert!(t.next_type1_rkey(id2).is_err());
        assert!(t.dealloc_pd(pd).is_err());
        t.dealloc_mw(id).unwrap();
        t.dealloc_mw(id2).unwrap();
        assert!(t.dealloc_mw(id2).is_err());
        t.dealloc_pd(pd).unwrap();
    }

    #[test]
    fn zero_based_type2_window_translates_into_the_region() {
        let mut t = MrTable::default();
        let pd = t.alloc_pd();
        let buf = MemBuf::new(4096);
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
        let mr = t.reg_mr(pd, &buf, 0, 4096, access, u64::MAX).unwrap();
        let (id, rkey) = t.alloc_mw(pd, MwType::Type2).unwrap();
        let new = (rkey & !0xFF) | 7;
        let info = MwBindInfo {
            mr_lkey: mr.lkey,
            addr: mr.addr + 1000,
            length: 100,
            mw_access_flags: AccessFlags::REMOTE_READ | AccessFlags::ZERO_BASED,
        };
        t.bind(pd, 0x11, BindOrigin::WorkRequest, (rkey, new), &info)
            .unwrap();
        let read = AccessFlags::REMOTE_READ;
        let seg = t.resolve_remote(pd, 0x11, new, 10, 90, read).unwrap();
        assert_eq!((seg.offset, seg.len), (1010, 90));
        assert!(t.resolve_remote(pd, 0x11, new, 10, 91, read).is_err());
        assert!(
            t.resolve_remote(pd, 0x12, new, 0, 1, read).is_err(),
            "another QP"
        );
        assert!(t
            .resolve_remote(pd, 0x11, new, 0, 1, AccessFlags::REMOTE_WRITE)
            .is_err());
        assert!(t.dereg_mr(mr.lkey).is_err(), "EBUSY while bound");
        // bound already: a second bind fails
        assert_eq!(
            t.bind(pd, 0x11, BindOrigin::WorkRequest, (rkey, new), &info),
            Err(WcStatus::MwBindErr)
        );
        assert!(t.invalidate(pd, 0x12, new).is_err(), "another QP");
        t.invalidate(pd, 0x11, new).unwrap();
        assert!(t.invalidate(pd, 0x11, new).is_err());
        assert!(t.resolve_remote(pd, 0x11, new, 0, 1, read).is_err());
        t.dereg_mr(mr.lkey).unwrap();
        let _ = id;
    }
}
