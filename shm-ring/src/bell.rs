//! A doorbell: the one futex word a consumer of several rings sleeps on, and a
//! generation counter that tells it a new ring was made for it.
//!
//! A receiver that takes packets from any number of producers (one ring per producer,
//! each a single-producer single-consumer ring) cannot sleep on every ring's futex at
//! once. So it makes a [`Bell`] and publishes it; each producer maps it
//! ([`Bell::open_shared`]), attaches to its ring with [`Producer::attach_with_bell`]
//! (its wake-ups then go to the bell's word instead of the ring's), and calls
//! [`Bell::announce`] once the receiver can find the new ring (how it finds it is the
//! caller's: emu-core lists them in a folder).
//!
//! **Sleeping** is the ring's protocol (see `ring`) with the word moved here: a
//! consumer thread adds itself to the sleepers `sleeping` counts, then looks at every
//! ring's head and at the generation ([`Bell::wait`]), waits on the futex only while
//! the word is still what its addition made it, and takes itself off. A producer
//! publishes its head (or the generation), then adds a publication to the word and
//! wakes the futex if it counted a sleeper. Every write of the word is a
//! read-modify-write, so with several producers and several sleeping threads the
//! writes are still one chain: if a producer's addition comes before a sleeper's,
//! that sleeper's reads from the chain the producer's release heads and its look sees
//! what it published; if after, the producer counts the sleeper and wakes it. The
//! loom model checks it with two producers, and with two threads asleep on one bell
//! (`loom_tests`).
//!
//! The bell's words come from the peers' shared memory like the rings': any value is
//! safe. A generation that moves only makes the consumer look for rings again, and a
//! sleep word a peer scribbles on makes a wait return early (the caller looks again).
//!
//! [`Producer::attach_with_bell`]: crate::Producer::attach_with_bell

use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::sync::Arc;
use std::time::Duration;

use crate::region::Region;
#[cfg(not(loom))]
use crate::region::BELL_MAGIC;
use crate::ring::Sleeper;
use crate::sync;
use crate::Error;

/// A consumer's doorbell (see the module's documentation): cheap to clone, each clone
/// the same bell.
#[derive(Clone, Debug)]
pub struct Bell {
    pub(crate) region: Arc<Region>,
}

impl Bell {
    /// A bell in this process's memory (for rings within one process, and tests).
    pub fn heap() -> Result<Bell, Error> {
        Ok(Bell {
            region: Arc::new(Region::heap_bell()?),
        })
    }

    /// A bell that another process can map: a sealed memfd of one page, mapped here.
    /// Peers open it with [`Bell::open_shared`] at [`Bell::path`] while it lives.
    #[cfg(not(loom))]
    pub fn create_shared(name: &str) -> Result<Bell, Error> {
        Ok(Bell {
            region: Arc::new(Region::create_shared_bell(name)?),
        })
    }

    /// Maps the bell another process made with [`Bell::create_shared`] and published
    /// as `path` (`/proc/PID/fd/N`). Refuses (`Corrupt`) a file without the size seals,
    /// of another size, or that is not a bell.
    #[cfg(not(loom))]
    pub fn open_shared(path: &std::path::Path) -> Result<Bell, Error> {
        let region = Region::open_shared_bell(path)?;
        if region.header().ident.magic.load(Acquire) != BELL_MAGIC {
            return Err(Error::Corrupt("not a doorbell (magic)"));
        }
        Ok(Bell {
            region: Arc::new(region),
        })
    }

    /// Where a peer process opens this bell (`/proc/PID/fd/N`), if it is shared.
    #[must_use]
    pub fn path(&self) -> Option<std::path::PathBuf> {
        self.region.path()
    }

    /// The generation: how many rings were announced ([`Bell::announce`]), mod 2^64.
    /// A consumer that saw one value looks for new rings when it reads another.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.region.header().generation.load(Acquire)
    }

    /// Tells the consumer a new ring waits to be found: bumps the generation and
    /// wakes it if it sleeps.
    pub fn announce(&self) {
        if self.announce_owed() {
            sync::wake(&self.region.header().sleeping);
        }
    }

    /// Bumps the generation as [`Bell::announce`] does, but leaves the wake-up to the
    /// caller: whether the consumer slept (see [`Producer::caller_wakes`]).
    ///
    /// [`Producer::caller_wakes`]: crate::Producer::caller_wakes
    pub fn announce_owed(&self) -> bool {
        let h = self.region.header();
        h.generation.fetch_add(1, AcqRel);
        sync::published(&h.sleeping)
    }

    /// Sleeps on the futex until one of `rings` is ready ([`Sleeper::ready`]), the
    /// generation is no longer `seen`, or `timeout` passed (`None`: no limit); may
    /// return early (the caller looks again). No system call if something is ready
    /// already.
    pub fn wait(&self, rings: &[Sleeper], seen: u64, timeout: Option<Duration>) {
        let h = self.region.header();
        self.sleep_on(rings, seen, |value| sync::wait(&h.sleeping, value, timeout));
    }

    /// The protocol of [`Bell::wait`] with another way to block: `block` runs, after
    /// the thread is counted among the sleepers and nothing was ready, and must return
    /// once the producers' way to wake this consumer fired (a datagram to a socket it
    /// polls, for producers that were told [`Producer::caller_wakes`]), or earlier.
    /// Returns whether `block` ran.
    ///
    /// [`Producer::caller_wakes`]: crate::Producer::caller_wakes
    pub fn sleep(&self, rings: &[Sleeper], seen: u64, block: impl FnOnce()) -> bool {
        self.sleep_on(rings, seen, |_| block())
    }

    /// The protocol of [`Bell::wait`] and [`Bell::sleep`]: `block` gets the word's
    /// value to wait on.
    fn sleep_on(&self, rings: &[Sleeper], seen: u64, block: impl FnOnce(u32)) -> bool {
        let ready = || self.generation() != seen || rings.iter().any(Sleeper::ready);
        if ready() {
            return false;
        }
        let h = self.region.header();
        let value = sync::join(&h.sleeping);
        let slept = !ready();
        if slept {
            block(value);
        }
        // A read-modify-write, not a store: see the module's documentation.
        sync::leave(&h.sleeping);
        slept
    }
}
