//! Registered memory of a C program, as a [`MemBuf`](verbs_api::MemBuf).
//!
//! `ibv_reg_mr(pd, addr, length, access)` hands the NIC a pointer into the program's
//! memory. The engine reaches registered bytes only through `MemBuf`; a `MemBuf` made
//! with [`MemBuf::from_external`](verbs_api::MemBuf::from_external) over
//! [`UserMemory`] reaches exactly those bytes, in place, under its lock, and its address
//! is `addr`, so the keys and addresses the program advertises are the real ones.
//!
//! # Safety argument
//!
//! `UserMemory` turns `(addr, length)` into a slice. That is sound under the contract
//! every libibverbs program already keeps with a real NIC (man page `ibv_reg_mr(3)`):
//! the range is mapped, readable (and writable when the access flags say the NIC may
//! write) and stays so until `ibv_dereg_mr`, and the program does not free it while
//! work requests that use it are outstanding. `UserMemory::new` refuses a null pointer
//! and a range that wraps the address space; a zero-length range makes an empty slice
//! at a non-null pointer, which reads nothing (sound for any non-null pointer to
//! bytes). The program may
//! touch the bytes itself while the NIC also does (for instance `ib_write_lat` polls
//! the last byte a peer's RDMA WRITE lands in); those are plain bytes, any value is
//! valid, and a real NIC's DMA races with the CPU the same way.

#![allow(unsafe_code)]

use verbs_api::ExternalMemory;

/// `length` bytes at `addr` in the calling program.
#[derive(Debug)]
pub(crate) struct UserMemory {
    addr: *mut u8,
    len: usize,
}

// SAFETY: the bytes belong to the program, which shares them with the NIC (any
// thread may post a work request that reads them); see the module's safety argument.
unsafe impl Send for UserMemory {}
// SAFETY: as for Send; every access goes through the owning MemBuf's lock.
unsafe impl Sync for UserMemory {}

impl UserMemory {
    /// The memory `[addr, addr + len)`; `None` for a null pointer or a range past the
    /// end of the address space. A zero-length range is an empty region at `addr`
    /// (kernel rxe registers zero-length regions too).
    ///
    /// # Safety
    ///
    /// The range must stay mapped and valid for the life of the returned value (the
    /// `ibv_reg_mr` contract, module docs).
    pub(crate) unsafe fn new(addr: *mut u8, len: usize) -> Option<UserMemory> {
        (!addr.is_null() && (addr as usize).checked_add(len).is_some())
            .then_some(UserMemory { addr, len })
    }
}

impl ExternalMemory for UserMemory {
    fn bytes(&self) -> &[u8] {
        // SAFETY: non-null, in bounds and valid for the value's life (`new`'s contract).
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; the MemBuf's write lock makes this the only Rust
        // reference to the range while it lives.
        unsafe { std::slice::from_raw_parts_mut(self.addr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::MemBuf;

    #[test]
    fn membuf_over_user_memory_writes_in_place() {
        let mut mem = vec![0u8; 64];
        let addr = mem.as_mut_ptr();
        // SAFETY: `mem` outlives `buf` (dropped first, below).
        let user = unsafe { UserMemory::new(addr, 64) }.unwrap();
        let buf = MemBuf::from_external(Box::new(user));
        assert_eq!(buf.addr(), addr as u64);
        buf.write(10, b"rdma").unwrap();
        drop(buf);
        assert_eq!(&mem[10..14], b"rdma");
        // SAFETY: never dereferenced: rejected.
        assert!(unsafe { UserMemory::new(std::ptr::null_mut(), 8) }.is_none());
        // SAFETY: never dereferenced: rejected.
        assert!(unsafe { UserMemory::new(addr, usize::MAX) }.is_none());
        // A zero-length region is empty memory at its address.
        // SAFETY: `mem` outlives `empty`; nothing is read.
        let empty = unsafe { UserMemory::new(addr, 0) }.unwrap();
        let buf = MemBuf::from_external(Box::new(empty));
        assert_eq!((buf.addr(), buf.len()), (addr as u64, 0));
    }
}
