//! Registered memory: who owns the bytes an RDMA NIC reads and writes.
//!
//! # The ownership model
//!
//! With real verbs the application passes `ibv_reg_mr` a raw pointer (manual
//! 3.4.1 ibv_reg_mr, 2.3.4 Memory Registration); from then on the HCA may read
//! or write those bytes by DMA at any moment — a remote peer's RDMA WRITE, an
//! incoming SEND, a READ response — while the application also touches them.
//! Rust cannot express "memory someone else writes behind your back" with plain
//! references, and this crate has no `unsafe` code, so registered memory is
//! instead **owned by [`MemBuf`] and shared**:
//!
//! * A `MemBuf` is a handle to one heap block, `Arc<RwLock<Box<[u8]>>>`.
//!   Cloning the handle shares the block (it never copies the bytes); the
//!   block lives until the last handle — the application's or the NIC's — is
//!   dropped. Deregistering an MR therefore never frees memory under anyone's
//!   feet, and destroying a buffer the NIC still uses is impossible.
//! * The application registers memory by handing the device a clone of its
//!   `MemBuf`; the device's engine keeps that clone in its MR table.
//! * **Every access goes through the lock**, for the application
//!   ([`MemBuf::read`], [`MemBuf::write`], [`MemBuf::with`],
//!   [`MemBuf::with_mut`], …) and for the engine alike. A remote peer's write
//!   landing while the application holds a clone is thus an ordinary,
//!   data-race-free write under a write lock; no `unsafe` is needed anywhere.
//!   Like real RDMA, the *ordering* of such accesses is up to the protocol
//!   the application uses (poll the completion before reading a received
//!   message); the lock only guarantees each access is atomic with respect to
//!   the others, so a reader never sees a torn access.
//! * Because the lock is held for the whole closure of `with` / `with_mut`,
//!   keep those closures short, and do not call other methods of the **same**
//!   buffer from inside them (the lock is not re-entrant; that deadlocks).
//!
//! ```
//! use verbs_api::MemBuf;
//!
//! let app = MemBuf::new(4096);
//! let nic = app.clone(); // what registering the memory hands to the device
//! assert!(MemBuf::ptr_eq(&app, &nic));
//! assert_eq!(nic.addr(), app.addr()); // the address advertised to peers
//!
//! // A peer's RDMA WRITE landing, as the engine performs it:
//! let off = nic.offset_of(app.addr() + 100, 5).unwrap();
//! nic.write(off, b"hello").unwrap();
//!
//! let mut got = [0u8; 5];
//! app.read(100, &mut got).unwrap();
//! assert_eq!(&got, b"hello");
//! assert!(app.read(4092, &mut got).is_err()); // EINVAL: past the end
//! ```
//!
//! # Addresses
//!
//! RDMA names memory by virtual address: an MR covers `[addr, addr + len)`,
//! SGEs and remote addresses point into it, and peers are told the address.
//! The heap block of a `Box<[u8]>` never moves while it is alive, so the
//! address of its first byte is stable for the life of the `MemBuf` and all
//! its clones, and distinct live buffers never overlap: [`MemBuf::addr`]
//! returns that address as a `u64`, exactly as a real MR's `addr` is the
//! buffer's pointer value. It is only a number here — nothing ever
//! dereferences it; the engine translates an address back to an offset
//! ([`MemBuf::offset_of`]) and accesses the bytes through the lock.
//!
//! `addr()` of a buffer made by [`MemBuf::new`] is a multiple of [`MemBuf::ALIGN`] (64): the block is
//! over-allocated by up to 63 bytes and the buffer starts at the first
//! aligned byte. So offsets that are multiples of 8 are 8-byte-aligned
//! virtual addresses, as IBTA requires for atomic operations, just as with
//! page-aligned memory on a real host.
//!
//! A zero-length buffer still owns a (one-byte) allocation, so its `addr()` is
//! non-zero, aligned, stable and distinct from every other live buffer's, while
//! `len()` is 0 and every non-empty access is out of range.
//!
//! # Byte order
//!
//! [`MemBuf::read_u64`], [`MemBuf::write_u64`] and the atomic helpers
//! ([`MemBuf::compare_swap_u64`], [`MemBuf::fetch_add_u64`]) treat the 8 bytes
//! as a **little-endian** `u64`. That is how the CPU sees a `u64` in memory on
//! the hosts this emulator targets (x86_64, aarch64), i.e. how atomic
//! operations act on host memory there; it is fixed rather than native so
//! that results are the same on every host, and it is the order the emulator
//! engine uses for the atomics it executes.

use core::fmt;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::{Error, Result};

/// Memory that a [`MemBuf`] can stand for instead of a heap block of its own: bytes
/// whose owner is outside Rust, e.g. the buffer a C program hands `ibv_reg_mr`
/// through the C ABI (crate `capi`). The `MemBuf` reaches the bytes only through
/// these two methods, under its lock, exactly as it reaches its own block; the
/// implementor answers for the bytes staying valid, and at the same address, for as
/// long as it lives.
pub trait ExternalMemory: Send + Sync + 'static {
    /// The bytes, for reading. Must return the same address and length every time.
    fn bytes(&self) -> &[u8];
    /// The bytes, for writing. Must return the same address and length as `bytes`.
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// Copies `src` into `dst`, which must be as long (as `copy_from_slice`), at the
/// speed of the fast case whatever the two addresses.
///
/// A `memcpy` of more than about 2 KiB runs as `rep movsb` in glibc on CPUs with fast
/// string moves, and some of them (AMD EPYC, measured: docs/performance.md) run that
/// an order of magnitude slower when the destination lies less than 64 bytes past the
/// source modulo the 4 KiB page: the stores then seem to overlap the loads still to
/// come. Where they meet, as a payload copied between a packet buffer and registered
/// memory can by chance of the two addresses, the copy goes in 2 KiB pieces, which
/// glibc copies with vector loads and stores instead.
///
/// # Panics
///
/// If the lengths differ, as `copy_from_slice`.
#[inline]
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    /// The page whose offsets the aliasing compares.
    const PAGE: usize = 4096;
    /// How far past the source a destination is slow.
    const WINDOW: usize = 64;
    if dst.len() > COPY_PIECE
        && (1..WINDOW)
            .contains(&((dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) % PAGE))
    {
        copy_in_pieces(dst, src);
    } else {
        dst.copy_from_slice(src);
    }
}

/// A piece glibc copies without `rep movsb`.
const COPY_PIECE: usize = 2048;

/// `copy_bytes`'s slow placement: the copy in `COPY_PIECE`-byte pieces.
#[cold]
fn copy_in_pieces(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: the lengths differ");
    for (d, s) in dst.chunks_mut(COPY_PIECE).zip(src.chunks(COPY_PIECE)) {
        d.copy_from_slice(s);
    }
}

/// The bytes behind a [`MemBuf`]: its own heap block, or external memory.
enum Block {
    Owned(Box<[u8]>),
    External(Box<dyn ExternalMemory>),
}

impl core::ops::Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Block::Owned(b) => b,
            Block::External(m) => m.bytes(),
        }
    }
}

impl core::ops::DerefMut for Block {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Block::Owned(b) => b,
            Block::External(m) => m.bytes_mut(),
        }
    }
}

/// A shared, lock-protected, address-stable block of registrable memory. See
/// the [module documentation](self) for the ownership model.
#[derive(Clone)]
pub struct MemBuf {
    /// The shared heap block (possibly longer than `len`; see `start`).
    block: Arc<RwLock<Block>>,
    /// Index in `block` of the buffer's first byte (the first aligned byte).
    start: usize,
    /// Length of the buffer in bytes.
    len: usize,
    /// Address of the buffer's first byte (cached; the block never moves).
    addr: u64,
}

impl MemBuf {
    /// The alignment of [`MemBuf::addr`], in bytes.
    pub const ALIGN: usize = 64;

    /// A zero-filled buffer of `len` bytes.
    ///
    /// # Panics
    ///
    /// Like `vec![0; len]`, if the allocation size overflows or the
    /// allocation fails.
    #[must_use]
    pub fn new(len: usize) -> MemBuf {
        // One extra byte for empty buffers keeps addr() non-zero and unique;
        // ALIGN - 1 extra bytes let the buffer start at an aligned address.
        let total = len
            .max(1)
            .checked_add(Self::ALIGN - 1)
            .expect("MemBuf length overflows usize");
        let block: Box<[u8]> = vec![0u8; total].into_boxed_slice();
        let base = block.as_ptr() as usize;
        let start = base.wrapping_neg() % Self::ALIGN;
        let addr = (base + start) as u64;
        MemBuf {
            block: Arc::new(RwLock::new(Block::Owned(block))),
            start,
            len,
            addr,
        }
    }

    /// A buffer standing for external memory (see [`ExternalMemory`]): its address is
    /// the address of `mem.bytes()`, which need not be aligned, and its bytes are
    /// reached through the lock like any other buffer's. Nothing is copied.
    #[must_use]
    pub fn from_external(mem: Box<dyn ExternalMemory>) -> MemBuf {
        let (addr, len) = {
            let b = mem.bytes();
            (b.as_ptr() as u64, b.len())
        };
        MemBuf {
            block: Arc::new(RwLock::new(Block::External(mem))),
            start: 0,
            len,
            addr,
        }
    }

    /// A buffer holding a copy of `data` (copied once, into an aligned block).
    #[must_use]
    pub fn from_vec(data: Vec<u8>) -> MemBuf {
        MemBuf::from_slice(&data)
    }

    /// A buffer holding a copy of `data`.
    #[must_use]
    pub fn from_slice(data: &[u8]) -> MemBuf {
        let buf = MemBuf::new(data.len());
        buf.with_mut(|b| b.copy_from_slice(data));
        buf
    }

    /// The virtual address of the first byte: stable for the life of the
    /// buffer and its clones, non-zero, and (except for external memory) a multiple
    /// of [`MemBuf::ALIGN`].
    #[must_use]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the buffer has no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if both handles share the same memory.
    #[must_use]
    pub fn ptr_eq(a: &MemBuf, b: &MemBuf) -> bool {
        Arc::ptr_eq(&a.block, &b.block)
    }

    /// The offset of virtual address `va` if `[va, va + len)` lies inside the
    /// buffer, else `None`. (An empty range at the very end is inside.)
    #[must_use]
    pub fn offset_of(&self, va: u64, len: u64) -> Option<usize> {
        let off = va.checked_sub(self.addr)?;
        let end = off.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        usize::try_from(off).ok()
    }

    /// The block range of `[offset, offset + n)`, or `EINVAL` if it is not
    /// inside the buffer.
    fn range(&self, offset: usize, n: usize) -> Result<core::ops::Range<usize>> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.start + offset..self.start + end),
            _ => Err(Error::InvalidArgument("range is outside the memory buffer")),
        }
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`. Fails with
    /// `EINVAL` (and copies nothing) if the range is not inside the buffer.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let r = self.range(offset, dst.len())?;
        copy_bytes(dst, &self.block.read()[r]);
        Ok(())
    }

    /// Copies `src` into the buffer starting at `offset`. Fails with `EINVAL`
    /// (and writes nothing) if the range is not inside the buffer.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let r = self.range(offset, src.len())?;
        copy_bytes(&mut self.block.write()[r], src);
        Ok(())
    }

    /// Sets every byte to `value`.
    pub fn fill(&self, value: u8) {
        self.with_mut(|b| b.fill(value));
    }

    /// A copy of the whole buffer.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        self.with(<[u8]>::to_vec)
    }

    /// Runs `f` on the bytes under the read lock. Do not access this same
    /// buffer from inside `f`.
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let guard = self.block.read();
        f(&guard[self.start..self.start + self.len])
    }

    /// Runs `f` on the bytes under the write lock. Do not access this same
    /// buffer from inside `f`.
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut guard = self.block.write();
        f(&mut guard[self.start..self.start + self.len])
    }

    /// Reads the little-endian `u64` at `offset`. `EINVAL` if out of range.
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes `value` as a little-endian `u64` at `offset`. `EINVAL` if out of
    /// range.
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<()> {
        self.write(offset, &value.to_le_bytes())
    }

    /// Atomically (under the write lock) replaces the `u64` at `offset` with
    /// `f(old)` and returns `old`. `EINVAL` if out of range.
    fn update_u64(&self, offset: usize, f: impl FnOnce(u64) -> u64) -> Result<u64> {
        let r = self.range(offset, 8)?;
        let mut guard = self.block.write();
        let word = &mut guard[r];
        let mut b = [0u8; 8];
        b.copy_from_slice(word);
        let old = u64::from_le_bytes(b);
        word.copy_from_slice(&f(old).to_le_bytes());
        Ok(old)
    }

    /// The effect of an ATOMIC compare-and-swap on this memory (manual 2.1.5):
    /// if the `u64` at `offset` equals `compare`, it becomes `swap`. Returns
    /// the original value. Atomic with respect to every other access through
    /// any handle of this buffer. `EINVAL` if out of range.
    pub fn compare_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64> {
        self.update_u64(offset, |old| if old == compare { swap } else { old })
    }

    /// The effect of an ATOMIC fetch-and-add on this memory (manual 2.1.5):
    /// adds `add` (wrapping) to the `u64` at `offset` and returns the original
    /// value. Atomic with respect to every other access through any handle of
    /// this buffer. `EINVAL` if out of range.
    pub fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64> {
        self.update_u64(offset, |old| old.wrapping_add(add))
    }
}

impl fmt::Debug for MemBuf {
    /// The address and length only, never the contents.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBuf")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn new_is_zeroed_and_aligned() {
        for len in [0usize, 1, 7, 64, 4096, 100_000] {
            let b = MemBuf::new(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.is_empty(), len == 0);
            assert_ne!(b.addr(), 0);
            assert_eq!(b.addr() % MemBuf::ALIGN as u64, 0);
            assert!(b.to_vec().iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn zero_length_buffers_have_distinct_stable_addresses() {
        let a = MemBuf::new(0);
        let b = MemBuf::new(0);
        assert_ne!(a.addr(), b.addr());
        assert_eq!(a.clone().addr(), a.addr());
        let mut one = [0u8; 1];
        assert!(a.read(0, &mut one).is_err());
        assert!(a.read(0, &mut []).is_ok());
        assert_eq!(a.to_vec(), Vec::<u8>::new());
        assert_eq!(a.offset_of(a.addr(), 0), Some(0));
        assert_eq!(a.offset_of(a.addr(), 1), None);
    }

    #[test]
    fn round_trip_and_bounds() {
        let b = MemBuf::new(16);
        b.write(4, b"hello").unwrap();
        let mut out = [0u8; 5];
        b.read(4, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert_eq!(b.write(12, b"hello").unwrap_err().errno(), 22);
        assert_eq!(b.read(16, &mut [0u8; 1]).unwrap_err().errno(), 22);
        assert!(b.read(usize::MAX, &mut [0u8; 2]).is_err());
        assert!(b.write(16, &[]).is_ok());
        assert!(b.write(17, &[]).is_err());
        // Nothing was written by the failed call.
        assert_eq!(&b.to_vec()[12..], &[0, 0, 0, 0]);
        b.fill(0xab);
        assert!(b.to_vec().iter().all(|&x| x == 0xab));
        assert_eq!(b.with(|s| s.len()), 16);
        b.with_mut(|s| s[0] = 1);
        assert_eq!(b.to_vec()[0], 1);
    }

    #[test]
    fn from_vec_copies() {
        let b = MemBuf::from_vec(vec![1, 2, 3]);
        assert_eq!(b.to_vec(), [1, 2, 3]);
        assert_eq!(b.addr() % MemBuf::ALIGN as u64, 0);
        assert_eq!(MemBuf::from_slice(&[]).len(), 0);
    }

    #[test]
    fn u64_helpers_and_atomics() {
        let b = MemBuf::new(24);
        b.write_u64(8, 0x0102_0304_0506_0708).unwrap();
        assert_eq!(b.read_u64(8).unwrap(), 0x0102_0304_0506_0708);
        let mut raw = [0u8; 8];
        b.read(8, &mut raw).unwrap();
        assert_eq!(raw, 0x0102_0304_0506_0708u64.to_le_bytes());
        assert!(b.read_u64(17).is_err());
        assert!(b.write_u64(20, 1).is_err());
        assert_eq!(b.fetch_add_u64(0, 5).unwrap(), 0);
        assert_eq!(b.fetch_add_u64(0, u64::MAX).unwrap(), 5);
        assert_eq!(b.read_u64(0).unwrap(), 4);
        assert_eq!(b.compare_swap_u64(0, 3, 9).unwrap(), 4);
        assert_eq!(b.read_u64(0).unwrap(), 4, "no swap when unequal");
        assert_eq!(b.compare_swap_u64(0, 4, 9).unwrap(), 4);
        assert_eq!(b.read_u64(0).unwrap(), 9);
        assert!(b.fetch_add_u64(17, 1).is_err());
    }

    #[test]
    fn offset_of_translates_addresses() {
        let b = MemBuf::new(100);
        let a = b.addr();
        assert_eq!(b.offset_of(a, 100), Some(0));
        assert_eq!(b.offset_of(a + 10, 90), Some(10));
        assert_eq!(b.offset_of(a + 10, 91), None);
        assert_eq!(b.offset_of(a - 1, 1), None);
        assert_eq!(b.offset_of(a + 100, 0), Some(100));
        assert_eq!(b.offset_of(u64::MAX, 2), None);
        assert_eq!(b.offset_of(a, u64::MAX), None);
    }

    #[test]
    fn clones_share_memory_and_address() {
        let a = MemBuf::new(32);
        let b = a.clone();
        assert!(MemBuf::ptr_eq(&a, &b));
        assert!(!MemBuf::ptr_eq(&a, &MemBuf::new(32)));
        assert_eq!(a.addr(), b.addr());
        b.write(0, &[7; 4]).unwrap();
        assert_eq!(&a.to_vec()[..4], &[7; 4]);
        let addr = a.addr();
        drop(a);
        assert_eq!(b.addr(), addr);
        assert_eq!(
            &b.to_vec()[..4],
            &[7; 4],
            "memory outlives the original handle"
        );
        assert_eq!(
            format!("{b:?}"),
            format!("MemBuf {{ addr: {addr:#x}, len: 32 }}")
        );
    }

    #[test]
    fn concurrent_writers_through_clones() {
        const HALF: usize = 4096;
        let buf = MemBuf::new(2 * HALF + 8);
        let addr = buf.addr();
        let handles: Vec<_> = (0..2u8)
            .map(|t| {
                let b = buf.clone();
                std::thread::spawn(move || {
                    for i in 0..HALF {
                        b.write(usize::from(t) * HALF + i, &[t + 1]).unwrap();
                        b.fetch_add_u64(2 * HALF, 1).unwrap();
                    }
                    b.addr()
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), addr);
        }
        let v = buf.to_vec();
        assert!(v[..HALF].iter().all(|&x| x == 1));
        assert!(v[HALF..2 * HALF].iter().all(|&x| x == 2));
        assert_eq!(
            buf.read_u64(2 * HALF).unwrap(),
            2 * HALF as u64,
            "no lost updates"
        );
        assert_eq!(buf.addr(), addr);
    }

    /// Memory owned elsewhere (here: a heap block the test hands over).
    struct Foreign(Box<[u8]>);
    impl ExternalMemory for Foreign {
        fn bytes(&self) -> &[u8] {
            &self.0
        }
        fn bytes_mut(&mut self) -> &mut [u8] {
            &mut self.0
        }
    }

    #[test]
    fn external_memory_is_used_in_place() {
        let mem = vec![0u8; 32].into_boxed_slice();
        let addr = mem.as_ptr() as u64;
        let b = MemBuf::from_external(Box::new(Foreign(mem)));
        assert_eq!((b.addr(), b.len()), (addr, 32));
        b.write(3, b"abc").unwrap();
        assert_eq!(&b.clone().to_vec()[2..6], b"\0abc");
        assert_eq!(b.fetch_add_u64(8, 7).unwrap(), 0);
        assert_eq!(b.read_u64(8).unwrap(), 7);
        assert!(b.write(30, b"abc").is_err());
    }

    #[test]
    fn is_send_and_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<MemBuf>();
    }

    proptest! {
        /// Every placement of the destination against the source modulo the page,
        /// the pieces' (a gap under 64 bytes, over 2 KiB) among them, copies the same
        /// bytes and no others.
        #[test]
        fn copy_bytes_copies_every_byte_wherever_the_two_lie(
            src_at in 0usize..4096,
            gap in prop_oneof![0usize..80, 0usize..4096],
            len in prop_oneof![2040usize..2060, 0usize..9000],
        ) {
            let src: Vec<u8> = (0..src_at + len).map(|i| (i * 7 + 3) as u8).collect();
            let mut dst = vec![0u8; 2 * 4096 + len];
            let from = src.as_ptr() as usize + src_at;
            let to = (from + gap).wrapping_sub(dst.as_ptr() as usize) % 4096;
            copy_bytes(&mut dst[to..to + len], &src[src_at..]);
            prop_assert_eq!(
                (dst[to..].as_ptr() as usize).wrapping_sub(from) % 4096,
                gap % 4096
            );
            prop_assert_eq!(&dst[to..to + len], &src[src_at..]);
            prop_assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0));
        }

        #[test]
        fn range_checks_match_a_model(
            len in 0usize..256,
            offset in 0usize..320,
            data in proptest::collection::vec(any::<u8>(), 0..320),
        ) {
            let buf = MemBuf::new(len);
            let fits = offset + data.len() <= len;
            let mut model = vec![0u8; len];
            prop_assert_eq!(buf.write(offset, &data).is_ok(), fits);
            if fits {
                model[offset..offset + data.len()].copy_from_slice(&data);
            }
            prop_assert_eq!(buf.to_vec(), model.clone());
            let mut out = vec![0u8; data.len()];
            prop_assert_eq!(buf.read(offset, &mut out).is_ok(), fits);
            if fits {
                prop_assert_eq!(&out, &data);
            } else {
                prop_assert!(out.iter().all(|&x| x == 0), "failed read leaves dst untouched");
            }
            let va = buf.addr() + offset as u64;
            prop_assert_eq!(buf.offset_of(va, data.len() as u64), fits.then_some(offset));
        }
    }
}
