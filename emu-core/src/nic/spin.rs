//! How the device thread looks again for traffic between the batches of a stream (the
//! `SPIN` window of `nic/thread.rs`): it yields the core while a yield is cheap, and
//! spins with the CPU's pause hint while a yield costs a time slice.
//!
//! A yield hands the core to a thread waiting for it. When that thread makes the
//! traffic (the application posting on the same core), that is what the receiver
//! needs: 10,000 QPs lost a fifth of their rate without it. When it is a CPU-bound
//! thread that has nothing to do with the traffic (a build or a test beside, a
//! program that spins), the scheduler (EEVDF) lets it run its whole slice,
//! milliseconds, before the yielder runs again: beside two CPU hogs `rdma-emu bench
//! write_bw` fell to 46-190 MB/s on every link. A yield that took longer than
//! [`LONG_YIELD`] shows such a thread; for [`NO_YIELD`] after it the thread spins
//! instead (for at most `SPIN`, then it sleeps, and a sleeper is woken ahead of a
//! CPU-bound thread), then tries a yield again.

use std::time::{Duration, Instant};

/// A yield that gave the core away this long met a thread that runs whole slices: a
/// thread that makes our traffic posts and polls and gives the core back sooner.
const LONG_YIELD: Duration = Duration::from_micros(500);

/// How long the thread spins instead of yielding after a long yield.
const NO_YIELD: Duration = Duration::from_millis(100);

/// The device thread's choice between yielding and spinning (see the module).
#[derive(Debug, Default)]
pub(super) struct Between {
    /// Spin, not yield, until then: a yield took [`LONG_YIELD`] or more.
    spin_until: Option<Instant>,
}

impl Between {
    /// Waits once between two looks for traffic: a yield, or a pause in a spin.
    pub(super) fn wait(&mut self) {
        let now = Instant::now();
        if self.yields(now) {
            std::thread::yield_now();
            self.yielded(now, Instant::now());
        } else {
            std::hint::spin_loop();
        }
    }

    /// Whether a wait at `now` yields.
    fn yields(&self, now: Instant) -> bool {
        self.spin_until.is_none_or(|t| now >= t)
    }

    /// A yield from `start` returned at `end`.
    fn yielded(&mut self, start: Instant, end: Instant) {
        if end.saturating_duration_since(start) >= LONG_YIELD {
            self.spin_until = Some(end + NO_YIELD);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn short_yields_keep_yielding() {
        let t0 = Instant::now();
        let mut b = Between::default();
        for i in 0..100 {
            let t = t0 + us(10 * i);
            assert!(b.yields(t));
            b.yielded(t, t + us(9));
        }
    }

    #[test]
    fn a_long_yield_spins_for_a_while_then_yields_again() {
        let t0 = Instant::now();
        let mut b = Between::default();
        b.yielded(t0, t0 + LONG_YIELD);
        let end = t0 + LONG_YIELD;
        assert!(!b.yields(end));
        assert!(!b.yields(end + NO_YIELD - us(1)));
        assert!(b.yields(end + NO_YIELD));
        // A short yield then leaves it yielding.
        b.yielded(end + NO_YIELD, end + NO_YIELD + us(5));
        assert!(b.yields(end + NO_YIELD + us(6)));
        // One just under the line does not count as long.
        let t = end + NO_YIELD + us(10);
        b.yielded(t, t + LONG_YIELD - us(1));
        assert!(b.yields(t + LONG_YIELD));
    }
}
