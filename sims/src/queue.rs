//! The fabric's queue of packets in flight, ordered by arrival time and then by send
//! order.
//!
//! Most packets arrive in the order they were sent (a link's latency is fixed unless
//! it has jitter or a rule delays a packet), so the queue keeps those in a FIFO, which
//! costs O(1) a packet, and only the packets that overtake or fall behind go to a
//! binary heap. The next packet is the earlier of the two heads.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

/// Something with an arrival time and a unique, increasing sequence number.
pub(crate) trait Keyed {
    /// `(arrival time, sequence number)`: the order the queue hands items out in.
    fn key(&self) -> (Duration, u64);
}

/// Orders by key alone (the heap compares nothing else).
struct ByKey<T>(T);

impl<T: Keyed> PartialEq for ByKey<T> {
    fn eq(&self, o: &Self) -> bool {
        self.0.key() == o.0.key()
    }
}
impl<T: Keyed> Eq for ByKey<T> {}
impl<T: Keyed> PartialOrd for ByKey<T> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<T: Keyed> Ord for ByKey<T> {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.key().cmp(&o.0.key())
    }
}

/// A priority queue by [`Keyed::key`], smallest first.
pub(crate) struct EventQueue<T> {
    fifo: VecDeque<T>,
    heap: BinaryHeap<Reverse<ByKey<T>>>,
}

impl<T: Keyed> EventQueue<T> {
    pub(crate) fn new() -> Self {
        EventQueue {
            fifo: VecDeque::new(),
            heap: BinaryHeap::new(),
        }
    }

    pub(crate) fn push(&mut self, item: T) {
        if self.fifo.back().is_none_or(|b| b.key() <= item.key()) {
            self.fifo.push_back(item);
        } else {
            self.heap.push(Reverse(ByKey(item)));
        }
    }

    /// Whether the FIFO's head comes before the heap's.
    fn fifo_first(&self) -> Option<bool> {
        match (self.fifo.front(), self.heap.peek()) {
            (Some(f), Some(Reverse(ByKey(h)))) => Some(f.key() <= h.key()),
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            (None, None) => None,
        }
    }

    /// The smallest key.
    pub(crate) fn peek_key(&self) -> Option<(Duration, u64)> {
        Some(if self.fifo_first()? {
            self.fifo.front()?.key()
        } else {
            self.heap.peek()?.0 .0.key()
        })
    }

    /// Takes the item with the smallest key.
    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.fifo_first()? {
            self.fifo.pop_front()
        } else {
            self.heap.pop().map(|Reverse(ByKey(x))| x)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    impl Keyed for (Duration, u64) {
        fn key(&self) -> (Duration, u64) {
            *self
        }
    }

    proptest! {
        /// Whatever the arrival times, pushes and pops interleaved, the queue hands
        /// items out exactly as a binary heap would.
        #[test]
        fn pops_in_key_order(ops in proptest::collection::vec((0u64..50, any::<bool>()), 0..300)) {
            let mut q = EventQueue::new();
            let mut model = BinaryHeap::new();
            for (seq, (at, pop)) in ops.into_iter().enumerate() {
                if pop {
                    prop_assert_eq!(q.pop(), model.pop().map(|Reverse(x)| x));
                } else {
                    let item = (Duration::from_nanos(at), seq as u64);
                    q.push(item);
                    model.push(Reverse(item));
                }
                prop_assert_eq!(q.peek_key(), model.peek().map(|Reverse(x)| *x));
            }
            while let Some(Reverse(x)) = model.pop() {
                prop_assert_eq!(q.pop(), Some(x));
            }
            prop_assert_eq!(q.pop(), None);
        }
    }
}
