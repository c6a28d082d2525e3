//! The CM on the clock of a simulated fabric ([`emu_sims::Fabric`]), driven by the fabric.
//!
//! The CM is one of the fabric's [`Timer`]s: the fabric fires it at the CM's next
//! deadline (a REQ's response timeout, the time-wait; IBTA 12.6) and right after each
//! packet it delivers, so the CM takes a MAD at the instant it lands on QP1 and
//! answers then, in order with everything else on the fabric. A CM call that waits
//! for an event steps the fabric until the event comes or nothing can happen any more
//! (a lost REQ's retries then cost virtual time only). There is no thread: a
//! single-threaded program is deterministic.
//!
//! Taking MADs polls QP1's CQ, and an empty poll on a fabric device lets the fabric
//! take a step (`emu_core::nic::Link::receive`, which on the fabric moves it on). The
//! fabric may then ask this CM again while it is in the middle of its own work: a CM
//! that is busy (its lock held) says it is due now and does nothing when fired, so
//! such a step delivers what is due at this instant or fires another timer, and never
//! moves time on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use emu_sims::{Fabric, Timer};
use parking_lot::Mutex;
use verbs_api::{CmEvent, Device, Error, Result};

use crate::proto::State;
use crate::{agents, Clock, CmConfig, EmuCm, EventQueue, Shared};

/// The fabric's clock, and how far the CM has seen its deliveries.
struct FabricClock {
    fabric: Fabric,
    /// The fabric's delivery count when the CM last took its MADs.
    seen: AtomicU64,
}

impl FabricClock {
    /// Takes the MADs that arrived and fires the timers due at the fabric's now.
    fn pump(&self, st: &mut State) {
        self.seen
            .store(self.fabric.stats().delivered, Ordering::Relaxed);
        st.pump(self.fabric.instant());
    }

    /// Whether the fabric delivered packets since the CM last took its MADs.
    fn delivered(&self) -> bool {
        self.fabric.stats().delivered != self.seen.load(Ordering::Relaxed)
    }
}

impl Clock for FabricClock {
    fn now(&self) -> Instant {
        self.fabric.instant()
    }

    /// Steps the fabric until the event comes (the timeout is real time, which does
    /// not pass here): TimedOut when nothing can happen any more.
    fn wait(
        &self,
        cm: &Shared,
        q: &EventQueue,
        want: &dyn Fn(&CmEvent) -> bool,
        taken: &dyn Fn(&CmEvent),
        _timeout: Option<Duration>,
    ) -> Result<CmEvent> {
        loop {
            if let Some(ev) = q.try_pop_where_then(want, taken) {
                return Ok(ev);
            }
            // What the devices reported (`State::watch`) and what arrived since the
            // last step.
            self.pump(&mut cm.state.lock());
            if let Some(ev) = q.try_pop_where_then(want, taken) {
                return Ok(ev);
            }
            if !self.fabric.step() {
                return q.try_pop_where_then(want, taken).ok_or(Error::TimedOut);
            }
        }
    }
}

/// The CM as a [`Timer`] of the fabric. Weak handles: the fabric does not keep a CM
/// alive, and the CM (which holds the fabric) makes no cycle with it.
struct CmTimer {
    cm: Weak<Shared>,
    clock: Weak<FabricClock>,
}

impl Timer for CmTimer {
    fn poll_timeout(&self) -> Option<Instant> {
        let (cm, clock) = (self.cm.upgrade()?, self.clock.upgrade()?);
        if clock.delivered() {
            return Some(clock.now());
        }
        let due = match cm.state.try_lock() {
            Some(st) => st.next_deadline(),
            // Busy: see the module docs.
            None => Some(clock.now()),
        };
        due
    }

    fn handle_timeout(&self) {
        let (Some(cm), Some(clock)) = (self.cm.upgrade(), self.clock.upgrade()) else {
            return;
        };
        if let Some(mut st) = cm.state.try_lock() {
            clock.pump(&mut st);
        };
    }
}

impl EmuCm {
    /// The CM of `devices` (on `fabric`) on the fabric's clock, driven by the fabric:
    /// it fires the CM's timers and lets it take each MAD at the instant it lands; a
    /// call that waits steps the fabric (see the [crate docs](crate)). No thread; port
    /// claims stay in the process and communication IDs start from a fixed value, so
    /// runs are reproducible.
    pub fn on_fabric(
        fabric: &Fabric,
        devices: Vec<Arc<dyn Device>>,
        cfg: CmConfig,
    ) -> Result<EmuCm> {
        let clock = Arc::new(FabricClock {
            fabric: fabric.clone(),
            seen: AtomicU64::new(fabric.stats().delivered),
        });
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(agents(devices)?, cfg, 0)),
            clock: clock.clone(),
            stop: AtomicBool::new(false),
        });
        fabric.add_timer(Arc::new(CmTimer {
            cm: Arc::downgrade(&shared),
            clock: Arc::downgrade(&clock),
        }));
        Ok(EmuCm {
            shared,
            thread: None,
        })
    }
}
