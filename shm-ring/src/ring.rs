//! The ring's protocol: a [`Producer`] appends records, a [`Consumer`] takes them in
//! order, and the consumer may sleep on a futex that the producer wakes.
//!
//! **Records.** A record is one header word (the packet's length in its low 32 bits,
//! [`PUBLISHED`] above) and the packet in `ceil(len / 8)` words, little-endian, the
//! last one padded with zeroes, rounded up to whole cache lines ([`LINE`] words): a
//! record starts on a line. It may wrap from the last data word to the first. `head`
//! and `tail` count words since the ring was made (mod 2^64); word `i` is
//! `data[i % words]`.
//!
//! **Publishing in the record's own line.** The producer writes the packet's words,
//! then the header (release), then `head` (release, for sleepers). The consumer looks
//! at the header word at its tail (acquire) and not at `head`: a packet that fits the
//! header's line reaches it in one cache-line transfer, where reading `head` and then
//! the record took two, one after the other (250 ns each when the two cores are far
//! apart on the host). This needs every line's first word to be zero until the
//! producer publishes there: the ring starts zeroed, and the consumer zeroes the first
//! word of each line of a record it takes before it publishes its tail (release),
//! which the producer reads (acquire) before it writes there again.
//!
//! **What is trusted.** Each side keeps its own index privately (the producer its head,
//! the consumer its tail) and the ring's geometry as read once when it attached: it
//! never reads back what only it writes. What it reads that the peer writes is checked
//! before use: the consumer checks each header word (the published bit alone above a
//! length within `max_len`) and `head` when it looks at it (no more than `words` ahead
//! of its tail, nor ahead with no header published at the tail); the
//! producer checks `tail` (not behind by more than `words`, not ahead of its head, not
//! moving back). A failed check is [`Error::Corrupt`] and poisons that side: the link
//! above treats the peer as dead. A peer that writes garbage into packet bytes makes
//! wrong bytes and nothing else (the link's ICRC check drops them).
//!
//! **Sleeping.** The word `sleeping` counts the consumer threads asleep (its low bits)
//! and the producer's publications (its high bits). A consumer thread, finding the
//! ring empty, adds itself to the count, looks at `head` again, and waits on the
//! futex only while the word is still what its addition made it; then takes itself
//! off. The producer publishes `head` (release), then adds a publication to the word
//! and wakes the futex if the count was not zero. Every write of the word is a
//! read-modify-write, so they are one chain and of a consumer's addition and the
//! producer's, one comes first: if the consumer's, the producer sees it counted and
//! wakes it (a futex wait that starts after the producer's addition returns at once,
//! the word having changed); if the producer's, the consumer's addition reads from
//! the chain it heads, synchronises with it, and its look at `head` sees the packet.
//! A count rather than a flag, because two threads of one device may sleep on one
//! word at once (its thread and one waiting for an event): with a flag, the first to
//! wake cleared it under the other, which producers then never woke. No wake-up is
//! lost (the loom model checks it, with two sleepers too: `loom_tests`). A producer
//! that never has a sleeping peer pays one uncontended read-modify-write per packet
//! and no system call. A consumer of several rings sleeps on its [`Bell`] instead,
//! whose word the producers attached with [`Producer::attach_with_bell`] count on (the
//! same protocol, see `bell`).

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::Arc;
use std::time::Duration;

use crate::bell::Bell;
use crate::region::{Region, MAGIC};
use crate::sync::{self, AtomicU64};
use crate::Error;

/// `state` bit: a producer attached.
const P_ATTACHED: u32 = 1;
/// `state` bit: a consumer attached.
const C_ATTACHED: u32 = 2;
/// `state` bit: the producer left (no more packets will come).
const P_GONE: u32 = 4;
/// `state` bit: the consumer left (packets would not be read).
const C_GONE: u32 = 8;

/// Words in a cache line: records start on one.
pub(crate) const LINE: usize = 8;

/// The bit a header word carries above the length: a line's first word is zero until
/// the producer publishes a record there.
const PUBLISHED: u64 = 1 << 32;

/// The words a record of a `len`-byte packet takes: its header word and its bytes, in
/// whole lines.
pub(crate) fn record_words(len: usize) -> usize {
    (1 + len.div_ceil(8)).next_multiple_of(LINE)
}

/// Words the producer's `head` says are published past `tail`, in a ring of `mask + 1`
/// words; `None` if that is impossible. The head may also be behind the tail, by less
/// than a ring: the consumer took a record on its header, which the producer
/// publishes before the head (nothing is past the tail then).
pub(crate) fn past(head: u64, tail: u64, mask: u64) -> Option<u64> {
    let ahead = head.wrapping_sub(tail);
    if ahead <= mask + 1 {
        Some(ahead)
    } else if tail.wrapping_sub(head) <= mask + 1 {
        Some(0)
    } else {
        None
    }
}

/// Stores `bytes` into the ring's words from word `at` on (mod the ring), the last
/// word padded with zeroes: at most two runs of whole words, with no index arithmetic
/// per word.
fn store(ring: &[AtomicU64], at: u64, bytes: &[u8]) {
    let start = (at & (ring.len() as u64 - 1)) as usize;
    let split = ((ring.len() - start) * 8).min(bytes.len());
    store_run(&ring[start..], &bytes[..split]);
    store_run(ring, &bytes[split..]);
}

fn store_run(words: &[AtomicU64], bytes: &[u8]) {
    let mut chunks = bytes.chunks_exact(8);
    let mut words = words.iter();
    // Chunks first: a zip that ends on them takes no word from `words`.
    for (c, w) in (&mut chunks).zip(words.by_ref()) {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        w.store(u64::from_le_bytes(b), Relaxed);
    }
    let rest = chunks.remainder();
    if let (false, Some(w)) = (rest.is_empty(), words.next()) {
        // The last word built in a register. Copied into a zeroed stack word, its
        // bytes came back as one load from two smaller stores, which the store buffer
        // cannot forward: the load then waited for every store before it to reach the
        // cache, this record's words in the ring among them, each waiting for the
        // consumer's copy of its line (a line's trip between cores, in the middle of
        // the push).
        let v = rest.iter().rev().fold(0, |v, &b| v << 8 | u64::from(b));
        w.store(v, Relaxed);
    }
}

/// Loads `out.len()` bytes from the ring's words from word `at` on (mod the ring).
fn load(ring: &[AtomicU64], at: u64, out: &mut [u8]) {
    let start = (at & (ring.len() as u64 - 1)) as usize;
    let split = ((ring.len() - start) * 8).min(out.len());
    let (a, b) = out.split_at_mut(split);
    load_run(&ring[start..], a);
    load_run(ring, b);
}

fn load_run(words: &[AtomicU64], out: &mut [u8]) {
    let mut chunks = out.chunks_exact_mut(8);
    let mut words = words.iter();
    for (c, w) in (&mut chunks).zip(words.by_ref()) {
        c.copy_from_slice(&w.load(Relaxed).to_le_bytes());
    }
    let rest = chunks.into_remainder();
    if let (false, Some(w)) = (rest.is_empty(), words.next()) {
        let n = rest.len();
        rest.copy_from_slice(&w.load(Relaxed).to_le_bytes()[..n]);
    }
}

/// The geometry of a region as read once from its header, and checked against the
/// memory actually mapped.
fn attach(region: &Region, bit: u32) -> Result<(u64, usize), Error> {
    let h = region.header();
    if h.ident.magic.load(Acquire) != MAGIC {
        return Err(Error::Corrupt("not a ring (magic)"));
    }
    let words = h.ident.words.load(Acquire);
    let max_len = h.ident.max_len.load(Acquire);
    if !words.is_power_of_two() || words > region.data().len() as u64 {
        return Err(Error::Corrupt("ring size"));
    }
    if max_len == 0
        || max_len > crate::MAX_LEN as u64
        || 2 * record_words(max_len as usize) as u64 > words
    {
        return Err(Error::Corrupt("ring's packet size"));
    }
    let prev = h.state.fetch_or(bit, AcqRel);
    if prev & bit != 0 {
        return Err(Error::Busy);
    }
    Ok((words - 1, max_len as usize))
}

/// The writing end of a ring: one per ring (a second attach is [`Error::Busy`]).
#[derive(Debug)]
pub struct Producer {
    region: Arc<Region>,
    /// `words - 1`.
    mask: u64,
    max_len: usize,
    /// What this side published: the truth, whatever the shared word says.
    head: u64,
    /// The consumer's tail as last read (checked).
    tail: u64,
    poisoned: bool,
    /// The consumer's doorbell, if it has one: the futex word woken instead of the
    /// ring's own (see [`Bell`]).
    bell: Option<Arc<Region>>,
    /// The caller wakes the consumer, not the futex ([`Producer::caller_wakes`]).
    caller_wakes: bool,
    /// A wake-up the caller owes ([`Producer::wake_owed`]).
    owed: bool,
}

/// The reading end of a ring: one per ring (a second attach is [`Error::Busy`]).
#[derive(Debug)]
pub struct Consumer {
    region: Arc<Region>,
    mask: u64,
    max_len: usize,
    /// What this side consumed.
    tail: u64,
    poisoned: bool,
}

impl Producer {
    /// Becomes the ring's producer. Fails with `Corrupt` if the header does not
    /// describe a ring that fits the region, `Busy` if it has a producer already.
    pub fn attach(region: Arc<Region>) -> Result<Producer, Error> {
        let (mask, max_len) = attach(&region, P_ATTACHED)?;
        let h = region.header();
        let tail = h.tail.load(Acquire);
        let head = h.head.load(Acquire);
        if head.wrapping_sub(tail) > mask + 1 {
            return Err(Error::Corrupt("head and tail further apart than the ring"));
        }
        if !head.is_multiple_of(LINE as u64) {
            return Err(Error::Corrupt("head not on a line"));
        }
        Ok(Producer {
            region,
            mask,
            max_len,
            head,
            tail,
            poisoned: false,
            bell: None,
            caller_wakes: false,
            owed: false,
        })
    }

    /// From now on the producer does not wake a sleeping consumer through the futex:
    /// it records that the consumer slept, and the caller, after each push, asks
    /// [`Producer::wake_owed`] and wakes it its own way (a consumer that sleeps in
    /// `poll(2)` on sockets, [`Bell::sleep`], is woken by a datagram). The sleeping
    /// word's protocol is the same; only the wake-up changes.
    pub fn caller_wakes(&mut self) {
        self.caller_wakes = true;
    }

    /// Whether a push since the last call found the consumer asleep (or about to
    /// sleep) and it is the caller's to wake ([`Producer::caller_wakes`]).
    pub fn wake_owed(&mut self) -> bool {
        std::mem::take(&mut self.owed)
    }

    /// Becomes the ring's producer, as [`Producer::attach`], for a consumer that sleeps
    /// on `bell` ([`Bell::wait`]) rather than on the ring: every wake-up goes to the
    /// bell's futex word.
    pub fn attach_with_bell(region: Arc<Region>, bell: &Bell) -> Result<Producer, Error> {
        let mut p = Producer::attach(region)?;
        p.bell = Some(bell.region.clone());
        Ok(p)
    }

    /// The longest packet the ring takes.
    #[must_use]
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    fn corrupt(&mut self, what: &'static str) -> Error {
        self.poisoned = true;
        Error::Corrupt(what)
    }

    /// Free words, after reading the consumer's tail if `need` does not fit in what
    /// was free at the last read.
    fn free(&mut self, need: u64) -> Result<u64, Error> {
        let words = self.mask + 1;
        let free = words - self.head.wrapping_sub(self.tail);
        if free >= need {
            return Ok(free);
        }
        let t = self.region.header().tail.load(Acquire);
        // The tail moves forward from where it was, and never past the head.
        if t.wrapping_sub(self.tail) > self.head.wrapping_sub(self.tail) {
            return Err(self.corrupt("tail moved back or past the head"));
        }
        self.tail = t;
        Ok(words - self.head.wrapping_sub(t))
    }

    /// Appends `packet` and wakes the consumer if it sleeps. `Full` if the ring has no
    /// room now (nothing is written; try again once the consumer took some), `TooBig`
    /// above [`Producer::max_len`], `Closed` if the consumer left, `Corrupt` if the
    /// consumer's tail is impossible (and from then on).
    pub fn push(&mut self, packet: &[u8]) -> Result<(), Error> {
        self.push_parts(&[packet])
    }

    /// Appends one packet made of `parts` back to back, as [`Producer::push`] does,
    /// without gathering them first. Every part but the last must be a multiple of
    /// 8 bytes long (`Invalid` otherwise).
    pub fn push_parts(&mut self, parts: &[&[u8]]) -> Result<(), Error> {
        if self.poisoned {
            return Err(Error::Corrupt("poisoned"));
        }
        if let Some((_, first)) = parts.split_last() {
            if first.iter().any(|p| p.len() % 8 != 0) {
                return Err(Error::Invalid("a part but the last is not whole words"));
            }
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.max_len {
            return Err(Error::TooBig {
                len,
                max: self.max_len,
            });
        }
        if self.region.header().state.load(Relaxed) & C_GONE != 0 {
            return Err(Error::Closed);
        }
        let need = record_words(len) as u64;
        if self.free(need)? < need {
            return Err(Error::Full);
        }
        let h = self.region.header();
        let ring = &self.region.data()[..=self.mask as usize];
        let mut at = self.head.wrapping_add(1);
        for part in parts {
            store(ring, at, part);
            at = at.wrapping_add(part.len().div_ceil(8) as u64);
        }
        // The header last: it publishes the words before it.
        ring[(self.head & self.mask) as usize].store(PUBLISHED | len as u64, Release);
        self.head = self.head.wrapping_add(need);
        h.head.store(self.head, Release);
        self.wake();
        Ok(())
    }

    /// Wakes the consumer if it sleeps (see the module's protocol), on its bell if it
    /// has one; or leaves the wake-up to the caller ([`Producer::caller_wakes`]).
    fn wake(&mut self) {
        let h = self.bell.as_deref().unwrap_or(&self.region).header();
        if sync::published(&h.sleeping) {
            if self.caller_wakes {
                self.owed = true;
            } else {
                sync::wake(&h.sleeping);
            }
        }
    }
}

impl Drop for Producer {
    /// Tells the consumer no more packets come, and wakes it.
    fn drop(&mut self) {
        self.region.header().state.fetch_or(P_GONE, AcqRel);
        self.wake();
    }
}

impl Consumer {
    /// Becomes the ring's consumer. Fails with `Corrupt` if the header does not
    /// describe a ring that fits the region, `Busy` if it has a consumer already.
    pub fn attach(region: Arc<Region>) -> Result<Consumer, Error> {
        let (mask, max_len) = attach(&region, C_ATTACHED)?;
        let tail = region.header().tail.load(Acquire);
        if !tail.is_multiple_of(LINE as u64) {
            return Err(Error::Corrupt("tail not on a line"));
        }
        Ok(Consumer {
            region,
            mask,
            max_len,
            tail,
            poisoned: false,
        })
    }

    /// How many bytes of data the ring holds, record headers and padding included.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.region.capacity()
    }

    /// The longest packet the ring holds: [`Consumer::pop`]'s buffer needs no more.
    #[must_use]
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    fn corrupt(&mut self, what: &'static str) -> Error {
        self.poisoned = true;
        Error::Corrupt(what)
    }

    /// Words published and not yet taken (checked).
    fn available(&mut self) -> Result<u64, Error> {
        if self.poisoned {
            return Err(Error::Corrupt("poisoned"));
        }
        let head = self.region.header().head.load(Acquire);
        past(head, self.tail, self.mask)
            .ok_or_else(|| self.corrupt("head further ahead than the ring"))
    }

    /// Takes the next packet into `buf` and returns its length; `None` if the ring is
    /// empty. `Closed` once the ring is empty and the producer left; `TooBig` if `buf`
    /// is shorter than the packet (it stays in the ring: a buffer of
    /// [`Consumer::max_len`] bytes always fits); `Corrupt` if what the producer wrote is
    /// impossible (and from then on).
    pub fn pop(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        if self.poisoned {
            return Err(Error::Corrupt("poisoned"));
        }
        let at = (self.tail & self.mask) as usize;
        let mut word = self.region.data()[at].load(Acquire);
        if word == 0 {
            // Nothing published here. The head (published after the header) says the
            // same unless the producer wrote in between; a head ahead with no header
            // before it is impossible. Gone is set after the last head store: looked
            // at after it, the head is final.
            let gone = self.region.header().state.load(Acquire) & P_GONE != 0;
            if self.available()? == 0 {
                return if gone { Err(Error::Closed) } else { Ok(None) };
            }
            word = self.region.data()[at].load(Acquire);
            if word == 0 {
                return Err(self.corrupt("head ahead of what was published"));
            }
        }
        let len = word & u64::from(u32::MAX);
        if word - len != PUBLISHED || len > self.max_len as u64 {
            return Err(self.corrupt("packet length"));
        }
        let len = len as usize;
        let need = record_words(len) as u64;
        let ring = &self.region.data()[..=self.mask as usize];
        let Some(out) = buf.get_mut(..len) else {
            return Err(Error::TooBig {
                len,
                max: buf.len(),
            });
        };
        load(ring, self.tail.wrapping_add(1), out);
        // Every line of the record back to zero, for the header the producer will
        // write there next time round: before the tail lets it.
        for line in (0..need).step_by(LINE) {
            ring[(self.tail.wrapping_add(line) & self.mask) as usize].store(0, Relaxed);
        }
        self.tail = self.tail.wrapping_add(need);
        self.region.header().tail.store(self.tail, Release);
        Ok(Some(len))
    }

    /// Whether a packet is waiting (`Corrupt` as [`Consumer::pop`]).
    pub fn ready(&mut self) -> Result<bool, Error> {
        Ok(self.available()? != 0)
    }

    /// Sleeps until a packet is waiting, the producer left, or `timeout` passed (`None`:
    /// no limit); may return early (the caller looks at the ring again). No system
    /// call if a packet is already waiting.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<(), Error> {
        if self.poisoned {
            return Err(Error::Corrupt("poisoned"));
        }
        self.sleeper().wait(timeout)
    }

    /// A handle to wait with ([`Sleeper::wait`]) without holding the consumer: a
    /// thread can sleep on the ring while another one, that holds the consumer, takes
    /// packets (the sleeper then wakes early).
    #[must_use]
    pub fn sleeper(&self) -> Sleeper {
        Sleeper {
            region: self.region.clone(),
            mask: self.mask,
            tail: self.tail,
        }
    }
}

/// Waits for a ring's producer on behalf of its consumer ([`Consumer::sleeper`]): for a
/// packet past the consumer's position when the sleeper was made.
#[derive(Debug)]
pub struct Sleeper {
    region: Arc<Region>,
    mask: u64,
    tail: u64,
}

impl Sleeper {
    /// Words published past the tail (checked as [`Consumer::pop`] does).
    fn available(&self) -> Result<u64, Error> {
        let head = self.region.header().head.load(Acquire);
        past(head, self.tail, self.mask).ok_or(Error::Corrupt("head further ahead than the ring"))
    }

    /// Whether a wait would return at once: a packet waits past the consumer's position
    /// when this sleeper was made, the head is impossible (the consumer's next pop
    /// says `Corrupt`), or the producer left.
    #[must_use]
    pub fn ready(&self) -> bool {
        !matches!(self.available(), Ok(0)) || self.region.header().state.load(Acquire) & P_GONE != 0
    }

    /// Whether the producer left and everything it published was taken (as of when
    /// this sleeper was made): a wait then returns at once, for ever.
    #[must_use]
    pub fn closed(&self) -> bool {
        self.region.header().state.load(Acquire) & P_GONE != 0 && self.available().ok() == Some(0)
    }

    /// Sleeps until a packet is waiting past the consumer's position when this sleeper
    /// was made, the producer left, or `timeout` passed (`None`: no limit); may return
    /// early. No system call if a packet is already waiting.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<(), Error> {
        if self.available()? != 0 {
            return Ok(());
        }
        let word = &self.region.header().sleeping;
        let value = sync::join(word);
        let looked = self.available();
        if matches!(looked, Ok(0)) && self.region.header().state.load(Acquire) & P_GONE == 0 {
            sync::wait(word, value, timeout);
        }
        // A read-modify-write, never a plain store: every write of the word is then
        // in one chain of RMWs, so the next `join` reads the producer's last
        // `published` when that came later and sees what it published. (A plain store
        // clearing the flag let the consumer's next swap read its own 0 and miss the
        // producer's leaving: loom found that deadlock.)
        sync::leave(word);
        looked.map(|_| ())
    }
}

impl Drop for Consumer {
    /// Tells the producer its packets would not be read.
    fn drop(&mut self) {
        self.region.header().state.fetch_or(C_GONE, AcqRel);
    }
}

/// A producer and a consumer of one new ring in this process's memory (see
/// [`Region::heap`]).
pub fn pair(capacity: usize, max_len: usize) -> Result<(Producer, Consumer), Error> {
    let r = Arc::new(Region::heap(capacity, max_len)?);
    Ok((Producer::attach(r.clone())?, Consumer::attach(r)?))
}
