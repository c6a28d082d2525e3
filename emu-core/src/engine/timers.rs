//! The per-QP timer table and the engine-wide index that finds the earliest deadline.
//!
//! Each QP owns a small table of `Option<Instant>` indexed by [`Timer`]; the engine keeps
//! an index of timer entries so `poll_timeout` does not look at every QP.
//!
//! The index is a few runs, each a queue in time order. A timer is armed for "now plus
//! a delay" and the delay rarely changes, so entries mostly arrive in time order:
//! arming appends to the run whose last entry is the latest not after it (O(1) for
//! thousands of QPs, where a B-tree insert and remove per message showed in profiles
//! of 10,000 QPs), and the earliest entry is the earliest run head. Only an entry
//! earlier than every run's end, with every run in use, is inserted in the middle of
//! one.
//!
//! The index is lazy. An entry may stand for a timer that was stopped since, or be
//! earlier than its timer's deadline: stopping a timer or pushing it later (the ACK
//! timeout restarts on every ACK, IBTA 9.7.6.1.3) leaves the index alone, and only a
//! timer armed with no entry, or earlier than its entry, adds one. The engine keeps the
//! first entry exact (`Engine::prune_timers`): a stale entry that reaches the front
//! is dropped, and its timer, if still armed, indexed again at its real deadline. So
//! `poll_timeout` is exact, every armed timer has an entry at or before its deadline
//! (none fires late), and a timer fires only once its own deadline has passed
//! (`take_expired`). Entries nothing tracks any more (their QP was destroyed, or the
//! timer moved earlier) are dropped when they reach the front, or all at once when
//! they outnumber the rest.

use std::collections::VecDeque;
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

/// One index entry: (time, QPN, timer).
pub(crate) type Entry = (Instant, u32, Timer);

/// Runs the index keeps before it inserts in the middle of one: enough for every
/// delay a timer can have at once (32 local ACK timeout values, IBTA 9.7.6.1.3, and
/// 32 RNR timer codes, 9.7.5.2.8), so the O(n) insert is for a clock that went back.
const MAX_RUNS: usize = 64;

/// Untracked entries tolerated before [`TimerIndex::retain`] is due.
const DEAD_SLACK: usize = 1024;

/// The engine-wide index of timer entries (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct TimerIndex {
    /// Each run in time order.
    runs: Vec<VecDeque<Entry>>,
    /// The earliest run head (asked for after every input: kept, not searched).
    first: Option<Entry>,
    /// Entries no timer table tracks any more (an estimate that only steers
    /// [`TimerIndex::wants_retain`]).
    dead: usize,
}

impl TimerIndex {
    /// Adds an entry, keeping every run in time order.
    pub(crate) fn insert(&mut self, e: Entry) {
        // Earlier than every head: it becomes the head of whichever run takes it.
        if self.first.is_none_or(|f| e.0 < f.0) {
            self.first = Some(e);
        }
        // The run whose last entry is the latest one not after `e` (an empty run if
        // none is).
        // Runs are ordered by time only: entries due at the same instant may come in
        // any order.
        let mut best: Option<(usize, Option<Instant>)> = None;
        for (i, r) in self.runs.iter().enumerate() {
            let back = r.back().map(|b| b.0);
            if back.is_none_or(|b| b <= e.0) && best.is_none_or(|(_, bb)| back > bb) {
                best = Some((i, back));
            }
        }
        match best {
            Some((i, _)) => self.runs[i].push_back(e),
            None if self.runs.len() < MAX_RUNS => self.runs.push(VecDeque::from([e])),
            None => {
                let Some(r) = self.runs.iter_mut().min_by_key(|r| r.len()) else {
                    return;
                };
                let at = r.partition_point(|x| x.0 <= e.0);
                r.insert(at, e);
            }
        }
    }

    /// The earliest entry.
    pub(crate) fn first(&self) -> Option<Entry> {
        self.first
    }

    /// The earliest run head, searched.
    fn earliest_head(&self) -> Option<Entry> {
        self.runs
            .iter()
            .filter_map(|r| r.front().copied())
            .min_by_key(|e| e.0)
    }

    /// Removes and returns the earliest entry.
    pub(crate) fn pop_first(&mut self) -> Option<Entry> {
        let first = self.first?;
        let r = self.runs.iter_mut().find(|r| r.front() == Some(&first))?;
        r.pop_front();
        self.first = self.earliest_head();
        Some(first)
    }

    /// Entries in the index.
    pub(crate) fn len(&self) -> usize {
        self.runs.iter().map(VecDeque::len).sum()
    }

    /// Counts `n` entries that nothing tracks any more.
    fn forget(&mut self, n: usize) {
        self.dead += n;
    }

    /// An untracked entry left the index.
    pub(crate) fn dropped_dead(&mut self) {
        self.dead = self.dead.saturating_sub(1);
    }

    /// Whether untracked entries outnumber the rest (and the slack): time for
    /// [`TimerIndex::retain`].
    pub(crate) fn wants_retain(&self) -> bool {
        self.dead > DEAD_SLACK && self.dead * 2 > self.len()
    }

    /// Keeps only the entries `keep` accepts (the tracked ones).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        for r in &mut self.runs {
            r.retain(&mut keep);
        }
        self.runs.retain(|r| !r.is_empty());
        self.first = self.earliest_head();
        self.dead = 0;
    }
}

/// One QP's timers, and the entries of the engine's index it tracks.
#[derive(Debug, Default)]
pub(crate) struct TimerTable {
    deadlines: [Option<Instant>; 2],
    indexed: [Option<Instant>; 2],
}

impl TimerTable {
    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.deadlines[timer as usize] = Some(at);
    }

    /// Each timer's deadline (index: [`Timer`] as usize).
    pub(crate) fn armed(&self) -> [Option<Instant>; 2] {
        self.deadlines
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

    /// Whether `timer` is armed and due at `now`.
    pub(crate) fn is_due(&self, timer: Timer, now: Instant) -> bool {
        self.deadlines[timer as usize].is_some_and(|at| at <= now)
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

    /// Makes sure every armed timer has an entry in the index at or before its
    /// deadline (lazily: a stale or early entry is left where it is).
    pub(crate) fn sync(&mut self, qpn: u32, index: &mut TimerIndex) {
        for timer in TIMERS {
            let i = timer as usize;
            let Some(due) = self.deadlines[i] else {
                continue;
            };
            match self.indexed[i] {
                Some(at) if at <= due => {}
                old => {
                    if old.is_some() {
                        // The later entry stays behind, untracked.
                        index.forget(1);
                    }
                    index.insert((due, qpn, timer));
                    self.indexed[i] = Some(due);
                }
            }
        }
    }

    /// Whether the index entry `(at, timer)` is exact: the timer is armed for `at`.
    pub(crate) fn is_exact(&self, timer: Timer, at: Instant) -> bool {
        self.deadlines[timer as usize] == Some(at)
    }

    /// Whether this table tracks the index entry `(at, timer)`.
    pub(crate) fn tracks(&self, timer: Timer, at: Instant) -> bool {
        self.indexed[timer as usize] == Some(at)
    }

    /// The index dropped the tracked entry for `timer` (it reached the front stale,
    /// or came due): forget it, so that [`TimerTable::sync`] indexes the timer again
    /// if it is armed.
    pub(crate) fn unindexed(&mut self, timer: Timer) {
        self.indexed[timer as usize] = None;
    }

    /// Stops every timer and disowns its entries (the QP is going away; they leave
    /// the index lazily).
    pub(crate) fn unindex(&mut self, index: &mut TimerIndex) {
        self.stop_all();
        for slot in &mut self.indexed {
            if slot.take().is_some() {
                index.forget(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn entries(index: &TimerIndex) -> Vec<Entry> {
        let mut v: Vec<Entry> = index.runs.iter().flatten().copied().collect();
        v.sort();
        v
    }

    #[test]
    fn the_index_changes_only_for_a_new_or_earlier_deadline() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut index = TimerIndex::default();
        let mut t = TimerTable::default();
        t.set(Timer::Retransmit, ms(5));
        t.set(Timer::Rnr, ms(1));
        t.sync(7, &mut index);
        assert_eq!(
            entries(&index),
            [(ms(1), 7, Timer::Rnr), (ms(5), 7, Timer::Retransmit)]
        );
        assert_eq!(index.first(), Some((ms(1), 7, Timer::Rnr)));
        // Stopped, or pushed later: the entries stay where they were.
        t.stop(Timer::Rnr);
        t.set(Timer::Retransmit, ms(9));
        t.sync(7, &mut index);
        assert_eq!(index.len(), 2);
        assert!(!t.is_exact(Timer::Rnr, ms(1)) && t.tracks(Timer::Rnr, ms(1)));
        assert!(!t.is_exact(Timer::Retransmit, ms(5)));
        // Earlier than its entry: a new entry, the old one untracked.
        t.set(Timer::Retransmit, ms(3));
        t.sync(7, &mut index);
        assert_eq!(index.len(), 3);
        assert!(t.is_exact(Timer::Retransmit, ms(3)) && t.tracks(Timer::Retransmit, ms(3)));
        assert!(!t.tracks(Timer::Retransmit, ms(5)));
        assert_eq!(index.dead, 1);
        // What the engine does with a stale front entry: drop it; an armed timer
        // comes back at its deadline.
        assert_eq!(index.pop_first(), Some((ms(1), 7, Timer::Rnr)));
        t.unindexed(Timer::Rnr);
        t.sync(7, &mut index);
        assert_eq!(index.len(), 2);
        t.set(Timer::Retransmit, ms(8));
        assert_eq!(index.pop_first(), Some((ms(3), 7, Timer::Retransmit)));
        t.unindexed(Timer::Retransmit);
        t.sync(7, &mut index);
        assert!(t.tracks(Timer::Retransmit, ms(8)));
        assert_eq!(
            entries(&index),
            [(ms(5), 7, Timer::Retransmit), (ms(8), 7, Timer::Retransmit)]
        );
        assert!(!t.take_expired(Timer::Retransmit, ms(7)));
        assert!(t.take_expired(Timer::Retransmit, ms(8)));
        // Going away disowns every entry.
        t.unindex(&mut index);
        assert_eq!(index.dead, 2);
        assert!(!t.tracks(Timer::Retransmit, ms(8)));
    }

    #[test]
    fn runs_stay_in_time_order_whatever_the_arrival_order() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let mut index = TimerIndex::default();
        // Two delay classes interleaved (each in order), then arrivals in a
        // scrambled order that overflows the runs.
        let mut want = Vec::new();
        for i in 0..50u32 {
            for e in [
                (at(u64::from(i) * 10 + 1000), i, Timer::Retransmit),
                (at(u64::from(i) * 10 + 5), i, Timer::Rnr),
            ] {
                index.insert(e);
                want.push(e);
            }
        }
        assert_eq!(index.runs.len(), 2, "one run per delay class");
        for k in 0..200u64 {
            let e = (at((k * 7919) % 1500), 1000 + k as u32, Timer::Retransmit);
            index.insert(e);
            want.push(e);
        }
        // Strictly earlier and earlier: a run each, then inserts in the middle.
        for k in 0..100u64 {
            let e = (at(999 - k * 9), 3000 + k as u32, Timer::Rnr);
            index.insert(e);
            want.push(e);
        }
        assert_eq!(index.runs.len(), MAX_RUNS);
        // Ties in any order of QPN share a run.
        for q in (2000..2100u32).rev() {
            let e = (at(1500), q, Timer::Retransmit);
            index.insert(e);
            want.push(e);
        }
        assert!(index.runs.len() <= MAX_RUNS);
        for r in &index.runs {
            assert!(r.iter().zip(r.iter().skip(1)).all(|(a, b)| a.0 <= b.0));
        }
        want.sort();
        let mut got = Vec::new();
        while let Some(e) = index.pop_first() {
            got.push(e);
            assert_eq!(
                index.first().map(|f| f.0),
                index.earliest_head().map(|h| h.0)
            );
        }
        assert!(got.iter().zip(got.iter().skip(1)).all(|(a, b)| a.0 <= b.0));
        got.sort();
        assert_eq!(got, want);
        assert_eq!(index.len(), 0);
    }

    #[test]
    fn retain_drops_the_untracked_entries() {
        let t0 = Instant::now();
        let mut index = TimerIndex::default();
        for q in 0..3000u32 {
            index.insert((
                t0 + Duration::from_micros(u64::from(q)),
                q,
                Timer::Retransmit,
            ));
        }
        index.forget(2000);
        assert!(index.wants_retain());
        index.retain(|e| e.1 % 3 == 0);
        assert_eq!(index.len(), 1000);
        assert!(!index.wants_retain());
        assert_eq!(index.first().map(|e| e.1), Some(0));
    }
}
