//! The local ACK timeout and the transport retry counter (IBTA 9.7.6.1.3, 9.7.6.1.4).
//!
//! The timeout is 4.096 us * 2^`timeout`; `timeout` 0 means "infinite" (no timer). The
//! retry counter (`retry_cnt`, 3 bits) counts retransmissions caused by ACK timeouts and
//! by PSN sequence error NAKs; it is reloaded whenever an acknowledgement makes forward
//! progress. When it is exhausted the WQE completes with `RETRY_EXC_ERR` and the QP
//! moves to the error state. Unlike `rnr_retry`, IBTA gives 7 no special meaning here
//! (kernel rxe treats 7 as infinite for both: a deviation recorded in the conformance
//! notes).
//!
//! An emulated device is not a NIC: its host can deschedule it. A driver that can tell
//! that a peer device on the same host has not run (a [`PeerLiveness`]) makes an
//! expiry during which the peer could not answer retransmit without spending a retry:
//! the budget is for loss and delay on the path (and a dead peer), as IBTA means it, not
//! for time the peer's host kept it off the CPU. A NIC's peer answers even while its
//! process is stopped; so does an emulated one that is merely starved, once it runs.

use std::time::{Duration, Instant};

use verbs_api::Gid;

/// What a driver knows of its peers' devices (see the module docs): whether the device
/// that holds QP `qpn` at `peer` is on this host, alive, and has not run since `since`.
/// `false` when the driver cannot tell (a peer on another host), which leaves IBTA's
/// rule as it is.
pub trait PeerLiveness: Send + Sync + std::fmt::Debug {
    /// Whether the peer device at `peer` holding QP `qpn` could not run since `since`.
    fn stalled_since(&self, peer: &Gid, qpn: u32, since: Instant) -> bool;
}

/// The local ACK timeout for the QP attribute `timeout`, or `None` for "infinite".
pub(crate) fn local_ack_timeout(timeout: u8) -> Option<Duration> {
    if timeout == 0 {
        return None;
    }
    Some(Duration::from_nanos(4096u64 << u32::from(timeout.min(31))))
}

/// A 3-bit retry budget that forward progress reloads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RetryBudget {
    initial: u8,
    left: u8,
    infinite_at_seven: bool,
}

impl RetryBudget {
    /// `retry_cnt`: 7 retries are 7 retries.
    pub(crate) fn transport(initial: u8) -> Self {
        RetryBudget {
            initial,
            left: initial,
            infinite_at_seven: false,
        }
    }

    /// `rnr_retry`: 7 means retry forever (IBTA 9.7.5.2.8, table 49).
    pub(crate) fn rnr(initial: u8) -> Self {
        RetryBudget {
            initial,
            left: initial,
            infinite_at_seven: true,
        }
    }

    /// Spends one retry; false when none is left.
    pub(crate) fn spend(&mut self) -> bool {
        if self.infinite_at_seven && self.initial == 7 {
            return true;
        }
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }

    /// Forward progress: the budget is full again.
    pub(crate) fn reload(&mut self) {
        self.left = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_values() {
        assert_eq!(local_ack_timeout(0), None);
        assert_eq!(local_ack_timeout(1), Some(Duration::from_nanos(8192)));
        assert_eq!(
            local_ack_timeout(14),
            Some(Duration::from_nanos(4096 << 14))
        );
    }

    #[test]
    fn budgets() {
        let mut b = RetryBudget::transport(2);
        assert!(b.spend() && b.spend() && !b.spend());
        b.reload();
        assert!(b.spend());
        let mut seven = RetryBudget::transport(7);
        for _ in 0..7 {
            assert!(seven.spend());
        }
        assert!(!seven.spend());
        let mut forever = RetryBudget::rnr(7);
        for _ in 0..1000 {
            assert!(forever.spend());
        }
        let mut zero = RetryBudget::rnr(0);
        assert!(!zero.spend());
    }
}
