//! The memory a ring lives in: its header and its data words, in a sealed memfd that
//! two processes map, or on this process's heap (tests, Miri). This is the crate's one
//! module with `unsafe` code.
//!
//! # Safety argument
//!
//! The only unsafe operations are: mapping and unmapping the memfd (`mmap`, `munmap`),
//! allocating and freeing the heap variant, turning the region's base pointer into
//! `&Header` and `&[AtomicU64]` ([`Region::header`], [`Region::data`]), and the futex
//! system call on a word of the header ([`futex_wait`], [`futex_wake`]; argued there).
//! Those references are sound because:
//!
//! 1. **Valid for the borrow.** The base is the start of an allocation or mapping of
//!    `len` bytes that lives exactly as long as the `Region` (freed or unmapped in its
//!    `Drop`), and the references borrow `&self`. `len >= HEADER_BYTES + 8 * words` is
//!    checked when the region is made (for a mapping, against the file's size at map
//!    time). A doorbell (`crate::bell`) is a region of no data words: its `data` is
//!    the empty slice at the end of the header, which is valid for no access.
//! 2. **Stays valid while mapped.** A mapping of a file that shrinks under it faults
//!    (SIGBUS) when touched past the new end: that is how a hostile peer could crash us
//!    without writing one wrong byte. So the file is a memfd sealed with
//!    `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL` by its creator before anyone else can
//!    open it, and [`Region::open_shared`] refuses a file without those seals: no
//!    process can change its size again.
//! 3. **Aligned.** A mapping starts on a page; the heap variant is allocated with
//!    4096-byte alignment; `Header` needs 128 and its size is [`HEADER_BYTES`], a
//!    multiple of 8, so the data words are 8-byte aligned.
//! 4. **Initialised, every bit pattern valid.** A fresh memfd and `alloc_zeroed` give
//!    zeroes; `Header` is atomics and padding-free wrappers of atomics, `AtomicU64` and
//!    `AtomicU32` accept any bits, so whatever a peer writes is a valid value.
//! 5. **No data race in this process.** Every access this process makes to the shared
//!    bytes goes through these atomics (the ring copies packets in and out a word at a
//!    time with relaxed atomic loads and stores, never with a plain or `memcpy` access),
//!    and no `&mut` to the memory is ever made. A peer process writing concurrently,
//!    even garbage and even non-atomically, is outside this program's abstract machine:
//!    to us its writes are atomic stores of arbitrary values (x86-64 and AArch64 do not
//!    tear an aligned 8-byte access), which (4) makes harmless. What the ring then does
//!    with such values (indices, lengths) is checked in `ring`, which has no unsafe code.
//!
//! The `Send`/`Sync` impls: the region owns its memory (no thread affinity) and shares
//! it only through atomics.
#![allow(unsafe_code)]

use std::path::PathBuf;
#[cfg(not(loom))]
use std::{
    alloc::Layout,
    fs::File,
    io,
    num::NonZeroUsize,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    path::Path,
    ptr::NonNull,
};

use crate::sync::{AtomicU32, AtomicU64};
use crate::Error;

/// The bytes before the data words: the header, padded to a page so the data starts on
/// one.
pub const HEADER_BYTES: usize = 4096;

/// "shmring2", little-endian: the first word of a ring's memory (2: records on cache
/// lines, published by their header; a ring of the first layout is not taken).
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"shmring2");

/// "shmbell1", little-endian: the first word of a doorbell's memory (a header and no
/// data words, see `crate::bell`).
pub(crate) const BELL_MAGIC: u64 = u64::from_le_bytes(*b"shmbell1");

/// One cache line pair to itself (adjacent-line prefetch pulls 128 bytes), so the
/// producer's and the consumer's words never share a line.
#[repr(C, align(128))]
#[derive(Default)]
pub(crate) struct Line<T>(pub(crate) T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// What the creator writes once, before any peer attaches; each side reads it once
/// when it attaches and checks it against the region it mapped.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Ident {
    /// [`MAGIC`].
    pub(crate) magic: AtomicU64,
    /// The data words, a power of two.
    pub(crate) words: AtomicU64,
    /// The longest packet, in bytes.
    pub(crate) max_len: AtomicU64,
}

/// The ring's shared words, each on its own line.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Header {
    pub(crate) ident: Line<Ident>,
    /// Words the producer has published (only it writes it; it only grows, mod 2^64).
    pub(crate) head: Line<AtomicU64>,
    /// Words the consumer has taken (only it writes it).
    pub(crate) tail: Line<AtomicU64>,
    /// The futex word: 1 while the consumer sleeps or is about to (see `ring`).
    pub(crate) sleeping: Line<AtomicU32>,
    /// Who attached and who left (`ring::P_ATTACHED` ...).
    pub(crate) state: Line<AtomicU32>,
    /// A doorbell's generation: bumped by a producer that announces a new ring for
    /// the bell's consumer (unused in a ring).
    pub(crate) generation: Line<AtomicU64>,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// The memory of one ring: a header and `words` data words.
pub struct Region {
    #[cfg(not(loom))]
    base: NonNull<u8>,
    #[cfg(not(loom))]
    len: usize,
    #[cfg(not(loom))]
    backing: Backing,
    #[cfg(loom)]
    model: (Box<Header>, Box<[AtomicU64]>),
    words: usize,
}

#[cfg(not(loom))]
enum Backing {
    /// This process's heap, allocated with this layout.
    Heap(Layout),
    /// A mapping of this memfd (kept open so that peers can open it by its /proc path).
    Shared(OwnedFd),
}

// SAFETY: see the module's safety argument: the region owns its memory and every
// access to it is atomic.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("words", &self.words)
            .field("path", &self.path())
            .finish()
    }
}

/// The data words for a ring of at least `capacity` bytes that holds packets up to
/// `max_len` bytes: a power of two, room for two of the longest packets at least.
pub(crate) fn geometry(capacity: usize, max_len: usize) -> Result<usize, Error> {
    if max_len == 0 || max_len > crate::MAX_LEN {
        return Err(Error::Invalid("max_len is 0 or above MAX_LEN"));
    }
    let record = crate::ring::record_words(max_len);
    let words = (capacity.div_ceil(8)).max(2 * record);
    let words = words
        .checked_next_power_of_two()
        .filter(|w| *w <= crate::MAX_WORDS)
        .ok_or(Error::Invalid("capacity above MAX_WORDS words"))?;
    Ok(words)
}

impl Region {
    /// A ring's memory on this process's heap (for a ring within one process, and for
    /// testing: Miri runs it): at least `capacity` bytes of data for packets up to
    /// `max_len` bytes.
    pub fn heap(capacity: usize, max_len: usize) -> Result<Region, Error> {
        let words = geometry(capacity, max_len)?;
        let r = Region::heap_words(words)?;
        r.init(words, max_len);
        Ok(r)
    }

    #[cfg(not(loom))]
    fn heap_words(words: usize) -> Result<Region, Error> {
        let len = HEADER_BYTES + 8 * words;
        let layout = Layout::from_size_align(len, 4096).map_err(|_| Error::Invalid("size"))?;
        // SAFETY: the layout's size is not zero (HEADER_BYTES > 0).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(p).ok_or(Error::Io(io::ErrorKind::OutOfMemory.into()))?;
        Ok(Region {
            base,
            len,
            backing: Backing::Heap(layout),
            words,
        })
    }

    #[cfg(loom)]
    fn heap_words(words: usize) -> Result<Region, Error> {
        let data = (0..words).map(|_| AtomicU64::new(0)).collect();
        Ok(Region {
            model: (Box::default(), data),
            words,
        })
    }

    /// A doorbell's memory on this process's heap: a header and no data words.
    pub(crate) fn heap_bell() -> Result<Region, Error> {
        let r = Region::heap_words(0)?;
        r.header()
            .ident
            .magic
            .store(BELL_MAGIC, std::sync::atomic::Ordering::Release);
        Ok(r)
    }

    /// Writes the identity of a fresh region (zeroes everywhere else).
    fn init(&self, words: usize, max_len: usize) {
        use std::sync::atomic::Ordering::Release;
        let id = &self.header().ident;
        id.words.store(words as u64, Release);
        id.max_len.store(max_len as u64, Release);
        id.magic.store(MAGIC, Release);
    }

    /// The header.
    #[cfg(not(loom))]
    pub(crate) fn header(&self) -> &Header {
        // SAFETY: points (1)-(5) of the module's safety argument: the base is valid,
        // 4096-aligned, initialised memory of at least HEADER_BYTES for as long as
        // `self`, accessed only through these atomics.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    /// The data words.
    #[cfg(not(loom))]
    pub(crate) fn data(&self) -> &[AtomicU64] {
        // SAFETY: as for `header`: `len >= HEADER_BYTES + 8 * words` was checked when
        // the region was made, HEADER_BYTES keeps the words 8-aligned.
        unsafe {
            let p = self.base.as_ptr().add(HEADER_BYTES).cast::<AtomicU64>();
            std::slice::from_raw_parts(p, self.words)
        }
    }

    #[cfg(loom)]
    pub(crate) fn header(&self) -> &Header {
        &self.model.0
    }

    #[cfg(loom)]
    pub(crate) fn data(&self) -> &[AtomicU64] {
        &self.model.1
    }

    /// How many bytes of data the ring holds, record headers and padding included.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.words * 8
    }
}

#[cfg(not(loom))]
impl Region {
    /// A ring's memory that another process can map: a memfd of at least `capacity`
    /// bytes of data for packets up to `max_len` bytes, sealed against any change of
    /// size, and mapped here. The peer opens it with [`Region::open_shared`] at
    /// [`Region::path`] while this region lives.
    pub fn create_shared(name: &str, capacity: usize, max_len: usize) -> Result<Region, Error> {
        let words = geometry(capacity, max_len)?;
        let r = Region::create_sealed(name, words)?;
        r.init(words, max_len);
        Ok(r)
    }

    /// A doorbell's memory that another process can map (see [`Region::create_shared`]):
    /// a header and no data words.
    pub(crate) fn create_shared_bell(name: &str) -> Result<Region, Error> {
        let r = Region::create_sealed(name, 0)?;
        r.header()
            .ident
            .magic
            .store(BELL_MAGIC, std::sync::atomic::Ordering::Release);
        Ok(r)
    }

    /// A memfd of a header and `words` data words, sealed against any change of size
    /// before anyone else can open it, and mapped here.
    fn create_sealed(name: &str, words: usize) -> Result<Region, Error> {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        use nix::sys::memfd::{memfd_create, MFdFlags};
        let len = HEADER_BYTES + 8 * words;
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(io::Error::from)?;
        // (`geometry` bounds `len` far below `i64::MAX`.)
        nix::unistd::ftruncate(&fd, len as i64).map_err(io::Error::from)?;
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).map_err(io::Error::from)?;
        Region::map(fd, len, words)
    }

    /// Maps the ring memory another process made with [`Region::create_shared`] and
    /// published as `path` (`/proc/PID/fd/N`). Refuses (`Corrupt`) a file without the
    /// size seals, or one whose header does not describe a ring that fits it.
    pub fn open_shared(path: &Path) -> Result<Region, Error> {
        let (fd, len) = Region::open_sealed(path)?;
        if !(HEADER_BYTES + 8 * 2..=HEADER_BYTES + 8 * crate::MAX_WORDS).contains(&len) {
            return Err(Error::Corrupt("the ring's file has the wrong size"));
        }
        let words = (len - HEADER_BYTES) / 8;
        Region::map(fd, len, words)
    }

    /// Maps the doorbell memory another process made with
    /// [`Region::create_shared_bell`]: a sealed file of exactly a header.
    pub(crate) fn open_shared_bell(path: &Path) -> Result<Region, Error> {
        let (fd, len) = Region::open_sealed(path)?;
        if len != HEADER_BYTES {
            return Err(Error::Corrupt("the doorbell's file has the wrong size"));
        }
        Region::map(fd, len, 0)
    }

    /// Opens `path` and checks that it is sealed against resizing; its size.
    fn open_sealed(path: &Path) -> Result<(OwnedFd, usize), Error> {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        let file = File::options().read(true).write(true).open(path)?;
        let fd = OwnedFd::from(file);
        let seals = fcntl(&fd, FcntlArg::F_GET_SEALS).map_err(io::Error::from)?;
        let seals = SealFlag::from_bits_retain(seals);
        if !seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL)
        {
            return Err(Error::Corrupt(
                "the ring's file is not sealed against resizing",
            ));
        }
        let size = nix::sys::stat::fstat(&fd).map_err(io::Error::from)?.st_size;
        let len = usize::try_from(size).map_err(|_| Error::Corrupt("file size"))?;
        Ok((fd, len))
    }

    fn map(fd: OwnedFd, len: usize, words: usize) -> Result<Region, Error> {
        use nix::sys::mman::{MapFlags, ProtFlags};
        let length = NonZeroUsize::new(len).ok_or(Error::Corrupt("file size"))?;
        // SAFETY: a new shared mapping chosen by the kernel (no address hint) of a file
        // we hold open; it overlaps nothing of ours. Its validity afterwards is the
        // module's safety argument (the file is sealed against resizing).
        let p = unsafe {
            nix::sys::mman::mmap(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }
        .map_err(io::Error::from)?;
        let base = p.cast::<u8>();
        Ok(Region {
            base,
            len,
            backing: Backing::Shared(fd),
            words,
        })
    }

    /// Where a peer process opens this region (`/proc/PID/fd/N`), if it is shared.
    #[must_use]
    pub fn path(&self) -> Option<PathBuf> {
        match &self.backing {
            Backing::Shared(fd) => Some(PathBuf::from(format!(
                "/proc/{}/fd/{}",
                std::process::id(),
                fd.as_raw_fd()
            ))),
            Backing::Heap(_) => None,
        }
    }
}

#[cfg(loom)]
impl Region {
    /// Where a peer process opens this region: never, in the model.
    #[must_use]
    pub fn path(&self) -> Option<PathBuf> {
        None
    }
}

#[cfg(not(loom))]
impl Drop for Region {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: allocated in `heap_words` with this layout; no borrow of it
            // outlives `&self`.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.base.as_ptr(), *layout) },
            // SAFETY: mapped in `map` with this length; no borrow outlives `&self`.
            Backing::Shared(_) => unsafe {
                let _ = nix::sys::mman::munmap(self.base.cast(), self.len);
            },
        }
    }
}

/// The futex of [`crate::sync`]: sleeps while `word` holds `expected`, until a
/// [`futex_wake`] on it, `timeout`, a signal or a spurious wake-up. Not
/// process-private: the word lives in memory other processes map.
///
/// # Safety argument
///
/// `syscall(SYS_futex, ..)` reads the 4-byte word at its address atomically and the
/// `timespec` the last argument points to, and writes neither. Both pointers come
/// from references that outlive the call (`word.as_ptr()` of the borrowed atomic,
/// aligned to 4 as futex(2) requires; the `timespec` on this stack, or null for none).
/// The call makes no Rust reference to anything and takes no ownership; its result (an
/// error for EAGAIN, EINTR, ETIMEDOUT) only tells the caller to look again, which it
/// does whatever the outcome.
#[cfg(not(loom))]
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<std::time::Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(t.subsec_nanos()),
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: see the function's safety argument.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
        )
    };
}

/// Wakes every sleeper of `word` ([`futex_wait`]).
///
/// # Safety argument
///
/// `FUTEX_WAKE` only looks up the waiters queued on the word's address (its value is
/// not even read); the address comes from the borrowed atomic, as in [`futex_wait`].
#[cfg(not(loom))]
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: see the function's safety argument.
    let _ = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}
