//! The per-QP timer table and the engine-wide index that finds the earliest deadline.
//!
//! Each QP owns a small table of `Option<Instant>` indexed by [`Timer`]; the engine keeps
//! an ordered index of every armed timer so `poll_timeout` and `handle_timeout` cost
//! O(log n) with thousands of QPs.

use std::collections::BTreeSet;
use std::time::Instant;

/// The timers a QP can arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Timer {
    /// Local ACK timeout (IBTA 9.7.6.1.3): unacknowledged requests are retransmitted.
    Retransmit = 0,
    /// RNR wait (IBTA 9.7.5.2.8): after an RNR NAK the requester waits, then retries.
    Rnr = 1,
}

const TIMERS: [Timer; 2] = [Timer::Retransmit, Timer::Rnr];

/// An engine-wide ordered index of armed timers: (deadline, QPN, timer).
pub(crate) type TimerIndex = BTreeSet<(Instant, u32, Timer)>;

/// One QP's timers, and what the engine's index currently holds for them.
#[derive(Debug, Default)]
pub(crate) struct TimerTable {
    deadlines: [Option<Instant>; 2],
    indexed: [Option<Instant>; 2],
}

impl TimerTable {
    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer as usize] = Some(at);
    }

    pub(crate) fn stop(&mut self, timer: Timer) {
        self.deadlines[timer as usize] = None;
    }

    pub(crate) fn is_armed(&self, timer: Timer) -> bool {
        self.deadlines[timer as usize].is_some()
    }

    pub(crate) fn stop_all(&mut self) {
        self.deadlines = [None; 2];
    }

    /// Disarms and returns `timer` if it is due at `now`.
    pub(crate) fn take_expired(&mut self, timer: Timer, now: Instant) -> bool {
        match self.deadlines[timer as usize] {
            Some(at) if at <= now => {
                self.deadlines[timer as usize] = None;
                true
            }
            _ => false,
        }
    }

    /// Brings the engine's index in line with this table.
    pub(crate) fn sync(&mut self, qpn: u32, index: &mut TimerIndex) {
        for timer in TIMERS {
            let i = timer as usize;
            if self.deadlines[i] != self.indexed[i] {
                if let Some(old) = self.indexed[i] {
                    index.remove(&(old, qpn, timer));
                }
                if let Some(new) = self.deadlines[i] {
                    index.insert((new, qpn, timer));
                }
                self.indexed[i] = self.deadlines[i];
            }
        }
    }

    /// Removes every entry of this table from the index (the QP is going away).
    pub(crate) fn unindex(&mut self, qpn: u32, index: &mut TimerIndex) {
        self.stop_all();
        self.sync(qpn, index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn index_follows_the_table() {
        let t0 = Instant::now();
        let mut index = TimerIndex::new();
        let mut t = TimerTable::default();
        t.set(Timer::Retransmit, t0 + Duration::from_millis(5));
        t.set(Timer::Rnr, t0 + Duration::from_millis(1));
        t.sync(7, &mut index);
        assert_eq!(index.first().map(|e| e.2), Some(Timer::Rnr));
        t.stop(Timer::Rnr);
        t.set(Timer::Retransmit, t0 + Duration::from_millis(9));
        t.sync(7, &mut index);
        assert_eq!(index.len(), 1);
        assert!(!t.take_expired(Timer::Retransmit, t0));
        assert!(t.take_expired(Timer::Retransmit, t0 + Duration::from_millis(9)));
        t.unindex(7, &mut index);
        assert!(index.is_empty());
    }
}
