//! Protection domains and memory regions: key allocation, and the bounds and permission
//! checks every local and remote access passes before a single byte moves.
//!
//! Manual 3.4 (`ibv_alloc_pd`, `ibv_reg_mr`, `ibv_dereg_mr`); IBTA 10.6 (memory
//! management) and 9.4/9.7.4 (R_Key checks at the responder).

use super::idmap::IdMap;

use verbs_api::{AccessFlags, Error, MemBuf, ReregMrFlags, Result, WcStatus};
use verbs_api::{MrInfo, PdId};

/// One registered memory region.
#[derive(Debug)]
pub(crate) struct MemoryRegion {
    pub(crate) pd: PdId,
    pub(crate) buf: MemBuf,
    /// Offset of the region's first byte inside `buf`.
    pub(crate) buf_offset: usize,
    /// The region's start address (what `ibv_mr.addr` reports).
    pub(crate) addr: u64,
    pub(crate) length: u64,
    pub(crate) access: AccessFlags,
    /// The key; kernel rxe gives an MR the same L_Key and R_Key, and so do we.
    pub(crate) lkey: u32,
}

/// A contiguous piece of registered memory that an access resolved to.
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    pub(crate) buf: MemBuf,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// Why a remote access was refused (IBTA 9.7.4.1 R_Key checks; the responder NAKs
/// with "remote access error" for each of these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AccessError {
    /// No region has this key.
    BadKey,
    /// The region belongs to another protection domain than the QP.
    WrongPd,
    /// The range is not inside the region.
    OutOfBounds,
    /// The region does not grant the access.
    NotPermitted,
}

/// The device's protection domains and memory regions.
#[derive(Debug, Default)]
pub(crate) struct MrTable {
    pds: IdMap<u32>,
    next_pd: u32,
    mrs: IdMap<MemoryRegion>,
    /// Memory windows ([`mw`](super::mw)), in the same index space as the regions.
    pub(crate) mws: IdMap<super::mw::MemoryWindow>,
    next_index: u32,
    key_tag: u8,
}

impl MrTable {
    pub(crate) fn alloc_pd(&mut self) -> PdId {
        self.next_pd += 1;
        self.pds.insert(self.next_pd, 0);
        PdId(self.next_pd)
    }

    /// Protection domains allocated.
    pub(crate) fn pd_count(&self) -> usize {
        self.pds.len()
    }

    /// Memory regions registered.
    pub(crate) fn mr_count(&self) -> usize {
        self.mrs.len()
    }

    pub(crate) fn pd_exists(&self, pd: PdId) -> bool {
        self.pds.contains_key(&pd.0)
    }

    /// Counts one more object (MR, QP, AH, ...) that keeps `pd` alive.
    pub(crate) fn pd_ref(&mut self, pd: PdId, delta: i32) {
        if let Some(users) = self.pds.get_mut(&pd.0) {
            *users = users.saturating_add_signed(delta);
        }
    }

    /// `ibv_dealloc_pd`: EBUSY while anything still uses the PD.
    pub(crate) fn dealloc_pd(&mut self, pd: PdId) -> Result<()> {
        match self.pds.get(&pd.0) {
            None => Err(Error::InvalidArgument("no such protection domain")),
            Some(&users) if users > 0 => {
                Err(Error::Busy("protection domain still has MRs, QPs or AHs"))
            }
            Some(_) => {
                self.pds.remove(&pd.0);
                Ok(())
            }
        }
    }

    /// `ibv_reg_mr` over `buf[offset..offset + length]`.
    pub(crate) fn reg_mr(
        &mut self,
        pd: PdId,
        buf: &MemBuf,
        offset: usize,
        length: usize,
        access: AccessFlags,
        max_mr_size: u64,
    ) -> Result<MrInfo> {
        if !self.pd_exists(pd) {
            return Err(Error::InvalidArgument("no such protection domain"));
        }
        check_access_flags(access)?;
        let end = offset
            .checked_add(length)
            .ok_or(Error::InvalidArgument("region overflows"))?;
        if end > buf.len() {
            return Err(Error::InvalidArgument("region is outside the buffer"));
        }
        if length as u64 > max_mr_size {
            return Err(Error::InvalidArgument("region larger than max_mr_size"));
        }
        let key = self.alloc_key();
        let index = key >> 8;
        let info = MrInfo {
            addr: buf.addr() + offset as u64,
            length: length as u64,
            lkey: key,
            rkey: key,
        };
        self.mrs.insert(
            index,
            MemoryRegion {
                pd,
                buf: buf.clone(),
                buf_offset: offset,
                addr: info.addr,
                length: info.length,
                access,
                lkey: key,
            },
        );
        self.pd_ref(pd, 1);
        Ok(info)
    }

    /// A fresh key: a 24-bit index no region or window uses, and a low byte that
    /// changes with every allocation, so a stale key that names a reused index is still
    /// refused (IBTA 10.6: keys are opaque).
    pub(crate) fn alloc_key(&mut self) -> u32 {
        self.next_index = (self.next_index + 1) & 0x00FF_FFFF;
        if self.next_index == 0 {
            self.next_index = 1;
        }
        while self.mrs.contains_key(&self.next_index) || self.mws.contains_key(&self.next_index) {
            self.next_index = (self.next_index % 0x00FF_FFFF) + 1;
        }
        self.key_tag = self.key_tag.wrapping_add(0x25);
        (self.next_index << 8) | u32::from(self.key_tag)
    }

    /// `ibv_dereg_mr`: EBUSY while memory windows are bound to the region (manual
    /// 3.4.2, IBTA 10.6.7; kernel rxe counts them in `num_mw`).
    pub(crate) fn dereg_mr(&mut self, lkey: u32) -> Result<()> {
        let index = lkey >> 8;
        if self.by_key(lkey).is_some() && self.windows_bound_to(lkey) {
            return Err(Error::Busy("memory windows are bound to the region"));
        }
        match self.mrs.get(&index) {
            Some(mr) if mr.lkey == lkey => {
                let pd = mr.pd;
                self.mrs.remove(&index);
                self.pd_ref(pd, -1);
                Ok(())
            }
            _ => Err(Error::InvalidArgument("no memory region with this key")),
        }
    }

    /// `ibv_rereg_mr` (man page `ibv_rereg_mr(3)`; IBTA 10.6 Reregister): changes
    /// the PD (`CHANGE_PD`), the memory (`CHANGE_TRANSLATION`: `range` is the buffer,
    /// offset and length) and/or the access (`CHANGE_ACCESS`) of the region with key
    /// `lkey`, which keeps its keys: the man page lets a provider hand out new keys,
    /// kernel rxe (`rxe_rereg_user_mr`) and mlx5 (reregistration in place) keep them,
    /// and rdma-core's own tests rely on that (they reuse the rkey exchanged before the
    /// rereg). The new PD, memory and rights apply to the keys at once. EINVAL for an unknown key, no or unknown flags, a missing or bad
    /// PD or range, bad access flags, or access flags without `CHANGE_ACCESS` (as
    /// libibverbs checks); EBUSY while memory windows are bound to the region (the
    /// kernel's `usecnt` check). On error nothing changes.
    pub(crate) fn rereg_mr(
        &mut self,
        lkey: u32,
        flags: ReregMrFlags,
        pd: Option<PdId>,
        range: Option<(&MemBuf, usize, usize)>,
        access: AccessFlags,
        max_mr_size: u64,
    ) -> Result<MrInfo> {
        let bad = |what| Err(Error::InvalidArgument(what));
        let Some(old) = self.by_key(lkey) else {
            return bad("no memory region with this key");
        };
        if flags.is_empty() || !ReregMrFlags::all().contains(flags) {
            return bad("rereg flags must name CHANGE_PD, CHANGE_TRANSLATION or CHANGE_ACCESS");
        }
        if !flags.contains(ReregMrFlags::CHANGE_ACCESS) && !access.is_empty() {
            return bad("access flags given without CHANGE_ACCESS");
        }
        if self.windows_bound_to(lkey) {
            return Err(Error::Busy("memory windows are bound to the region"));
        }
        let new_pd = if flags.contains(ReregMrFlags::CHANGE_PD) {
            match pd {
                Some(p) if self.pd_exists(p) => p,
                _ => return bad("CHANGE_PD needs an existing protection domain"),
            }
        } else {
            old.pd
        };
        let (buf, buf_offset, length) = if flags.contains(ReregMrFlags::CHANGE_TRANSLATION) {
            let Some((buf, offset, length)) = range else {
                return bad("CHANGE_TRANSLATION needs the new memory");
            };
            let end = offset.checked_add(length);
            if length == 0 || end.is_none_or(|e| e > buf.len()) {
                return bad("the new range is empty or outside the buffer");
            }
            if length as u64 > max_mr_size {
                return bad("region larger than max_mr_size");
            }
            (buf.clone(), offset, length as u64)
        } else {
            (old.buf.clone(), old.buf_offset, old.length)
        };
        let new_access = if flags.contains(ReregMrFlags::CHANGE_ACCESS) {
            check_access_flags(access)?;
            access
        } else {
            old.access
        };
        let old_pd = old.pd;
        self.mrs.remove(&(lkey >> 8));
        self.pd_ref(old_pd, -1);
        let key = lkey;
        let addr = buf.addr() + buf_offset as u64;
        self.mrs.insert(
            key >> 8,
            MemoryRegion {
                pd: new_pd,
                buf,
                buf_offset,
                addr,
                length,
                access: new_access,
                lkey: key,
            },
        );
        self.pd_ref(new_pd, 1);
        Ok(MrInfo {
            addr,
            length,
            lkey: key,
            rkey: key,
        })
    }

    pub(crate) fn by_key(&self, key: u32) -> Option<&MemoryRegion> {
        self.mrs.get(&(key >> 8)).filter(|mr| mr.lkey == key)
    }

    /// Resolves a local SGE (`lkey`, `addr`, `length`) for an access by a QP of `pd`.
    /// IBTA 10.6.3.1 (L_Key checks): a bad key, a region of another PD or a range outside
    /// the region is a local protection error; writing into a region without
    /// LOCAL_WRITE is one too.
    pub(crate) fn resolve_local(
        &self,
        pd: PdId,
        lkey: u32,
        addr: u64,
        length: u32,
        write: bool,
    ) -> std::result::Result<Segment, WcStatus> {
        let mr = self.by_key(lkey).ok_or(WcStatus::LocProtErr)?;
        if mr.pd != pd {
            return Err(WcStatus::LocProtErr);
        }
        if write && !mr.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(WcStatus::LocProtErr);
        }
        let off = range_in(mr, addr, u64::from(length)).ok_or(WcStatus::LocProtErr)?;
        Ok(Segment {
            buf: mr.buf.clone(),
            offset: mr.buf_offset + off,
            len: length as usize,
        })
    }

    /// Finds the region of `pd` that holds `[addr, addr + length)`, whatever its key:
    /// the source of INLINE data, whose SGE keys libibverbs does not check.
    pub(crate) fn find_containing(&self, pd: PdId, addr: u64, length: u32) -> Option<Segment> {
        self.mrs.values().filter(|mr| mr.pd == pd).find_map(|mr| {
            range_in(mr, addr, u64::from(length)).map(|off| Segment {
                buf: mr.buf.clone(),
                offset: mr.buf_offset + off,
                len: length as usize,
            })
        })
    }

    /// Resolves a remote access (`rkey`, `va`, `length`) by QP `qpn` of `pd` that needs
    /// `need` (REMOTE_WRITE, REMOTE_READ or REMOTE_ATOMIC). IBTA 9.7.4.1.3: the R_Key
    /// must be valid, of the QP's PD, allow the operation, and the whole range must lie
    /// inside the region. An R_Key may name a memory window instead: then the window's
    /// range and access are checked, not the region's (see [`mw`](super::mw)).
    pub(crate) fn resolve_remote(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        va: u64,
        length: u64,
        need: AccessFlags,
    ) -> std::result::Result<Segment, AccessError> {
        let Some(mr) = self.by_key(rkey) else {
            return self.resolve_window(pd, qpn, rkey, va, length, need);
        };
        if mr.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(AccessError::NotPermitted);
        }
        let off = range_in(mr, va, length).ok_or(AccessError::OutOfBounds)?;
        Ok(Segment {
            buf: mr.buf.clone(),
            offset: mr.buf_offset + off,
            len: length as usize,
        })
    }
}

impl MrTable {
    /// Checks a remote access to a whole region: the R_Key must name a region of `pd`
    /// that grants `need`; no address range is looked at. A FLUSH at the memory region
    /// selectivity level asks this (IBTA 1.5 FETH: the RETH's address and length are
    /// ignored; kernel rxe skips its range check the same way). A key of a memory
    /// window is checked as [`resolve_remote`](Self::resolve_remote) does, at `va`.
    pub(crate) fn check_remote_region(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        va: u64,
        need: AccessFlags,
    ) -> std::result::Result<(), AccessError> {
        let Some(mr) = self.by_key(rkey) else {
            return self.resolve_window(pd, qpn, rkey, va, 0, need).map(|_| ());
        };
        if mr.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !mr.access.contains(need) {
            return Err(AccessError::NotPermitted);
        }
        Ok(())
    }
}

/// The offset of `[addr, addr + len)` inside the region, if it lies wholly inside.
pub(crate) fn range_in(mr: &MemoryRegion, addr: u64, len: u64) -> Option<usize> {
    let start = addr.checked_sub(mr.addr)?;
    let end = start.checked_add(len)?;
    (end <= mr.length).then_some(start as usize)
}

/// The access flags of `ibv_reg_mr` and `ibv_rereg_mr`.
///
/// - A bit that names no flag and lies outside `IBV_ACCESS_OPTIONAL_RANGE` is refused
///   (EINVAL), as the kernel's `ib_check_mr_access` does; optional bits are ignored.
/// - Manual 3.4: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE (EINVAL).
/// - `ZERO_BASED` is refused with EOPNOTSUPP. IBTA 10.6.3 gives zero-based virtual
///   addresses to regions made by the fast-register work request and to type 2
///   windows (10.6.7.2), not to the Register Memory Region verb; kernel rxe refuses the
///   flag in `reg_user_mr` and `rereg_user_mr` (EOPNOTSUPP: it is outside
///   `RXE_ACCESS_SUPPORTED_MR`, while `RXE_ACCESS_SUPPORTED_MW` has it). Accepting it
///   and then checking remote addresses against the buffer's own address would hand
///   the application a region no peer can reach; a zero-based type 2 window over an
///   ordinary region gives the same addressing (see `mw`).
pub(crate) fn check_access_flags(access: AccessFlags) -> Result<()> {
    // libibverbs and the kernel's ib_check_mr_access: a bit that names no flag is
    // refused, unless it lies in the optional range, which a device may ignore.
    let unknown = access.bits() & !AccessFlags::all().bits() & !AccessFlags::OPTIONAL_RANGE_BITS;
    if unknown != 0 {
        return Err(Error::InvalidArgument("unknown access flag"));
    }
    let needs_local_write = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if access.intersects(needs_local_write) && !access.contains(AccessFlags::LOCAL_WRITE) {
        return Err(Error::InvalidArgument(
            "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE",
        ));
    }
    if access.contains(AccessFlags::ZERO_BASED) {
        return Err(Error::Unsupported(
            "zero-based memory regions are not supported (bind a zero-based type 2 window)",
        ));
    }
    Ok(())
}

/// Copies `dst.len()` bytes of the message that `segs` describe, starting `offset`
/// bytes into it (a gather list).
pub(crate) fn gather(segs: &[Segment], mut offset: usize, mut dst: &mut [u8]) {
    for seg in segs {
        if dst.is_empty() {
            return;
        }
        if offset >= seg.len {
            offset -= seg.len;
            continue;
        }
        let n = (seg.len - offset).min(dst.len());
        let (head, tail) = dst.split_at_mut(n);
        seg.buf
            .read(seg.offset + offset, head)
            .expect("segment was bounds-checked at resolve time");
        dst = tail;
        offset = 0;
    }
}

/// Writes `src` into the message that `segs` describe, starting `offset` bytes into it
/// (a scatter list).
pub(crate) fn scatter(segs: &[Segment], mut offset: usize, mut src: &[u8]) {
    for seg in segs {
        if src.is_empty() {
            return;
        }
        if offset >= seg.len {
            offset -= seg.len;
            continue;
        }
        let n = (seg.len - offset).min(src.len());
        seg.buf
            .write(seg.offset + offset, &src[..n])
            .expect("segment was bounds-checked at resolve time");
        src = &src[n..];
        offset = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with_mr(access: AccessFlags) -> (MrTable, PdId, MemBuf, MrInfo) {
        let mut t = MrTable::default();
        let pd = t.alloc_pd();
        let buf = MemBuf::new(4096);
        let info = t.reg_mr(pd, &buf, 1024, 1024, access, u64::MAX).unwrap();
        (t, pd, buf, info)
    }

    #[test]
    fn remote_checks_refuse_every_bad_access() {
        let (t, pd, _buf, mr) = table_with_mr(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        let w = AccessFlags::REMOTE_WRITE;
        assert!(t
            .resolve_remote(pd, 0x11, mr.rkey, mr.addr, 1024, w)
            .is_ok());
        assert_eq!(
            t.resolve_remote(pd, 0x11, mr.rkey ^ 1, mr.addr, 8, w)
                .unwrap_err(),
            AccessError::BadKey
        );
        assert_eq!(
            t.resolve_remote(PdId(99), 0x11, mr.rkey, mr.addr, 8, w)
                .unwrap_err(),
            AccessError::WrongPd
        );
        assert_eq!(
            t.resolve_remote(pd, 0x11, mr.rkey, mr.addr, 8, AccessFlags::REMOTE_READ)
                .unwrap_err(),
            AccessError::NotPermitted
        );
        assert_eq!(
            t.resolve_remote(pd, 0x11, mr.rkey, mr.addr + 1, 1024, w)
                .unwrap_err(),
            AccessError::OutOfBounds
        );
        assert_eq!(
            t.resolve_remote(pd, 0x11, mr.rkey, mr.addr - 1, 2, w)
                .unwrap_err(),
            AccessError::OutOfBounds
        );
        assert_eq!(
            t.resolve_remote(pd, 0x11, mr.rkey, u64::MAX, 2, w)
                .unwrap_err(),
            AccessError::OutOfBounds
        );
    }

    #[test]
    fn same_buffer_registered_twice_gets_two_keys() {
        let (mut t, pd, buf, a) = table_with_mr(AccessFlags::LOCAL_WRITE);
        let b = t
            .reg_mr(pd, &buf, 0, 4096, AccessFlags::empty(), u64::MAX)
            .unwrap();
        assert_ne!(a.lkey, b.lkey);
        assert_eq!(t.mr_count(), 2);
        assert!(t.dealloc_pd(pd).is_err());
        t.dereg_mr(a.lkey).unwrap();
        t.dereg_mr(b.lkey).unwrap();
        assert!(t.dereg_mr(b.lkey).is_err());
        t.dealloc_pd(pd).unwrap();
    }

    #[test]
    fn remote_write_without_local_write_is_refused() {
        let mut t = MrTable::default();
        let pd = t.alloc_pd();
        let buf = MemBuf::new(64);
        let err = t
            .reg_mr(pd, &buf, 0, 64, AccessFlags::REMOTE_WRITE, u64::MAX)
            .unwrap_err();
        assert_eq!(err.errno(), 22);
    }

    #[test]
    fn gather_and_scatter_cross_segments() {
        let a = MemBuf::new(8);
        let b = MemBuf::new(8);
        let segs = [
            Segment {
                buf: a.clone(),
                offset: 2,
                len: 3,
            },
            Segment {
                buf: b.clone(),
                offset: 0,
                len: 5,
            },
        ];
        scatter(&segs, 1, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(a.to_vec(), [0, 0, 0, 1, 2, 0, 0, 0]);
        assert_eq!(b.to_vec(), [3, 4, 5, 6, 7, 0, 0, 0]);
        let mut out = [0u8; 6];
        gather(&segs, 2, &mut out);
        assert_eq!(out, [2, 3, 4, 5, 6, 7]);
    }
}
