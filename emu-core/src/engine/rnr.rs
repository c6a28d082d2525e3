//! Receiver Not Ready (IBTA 9.7.5.2.8, C9-107..C9-112).
//!
//! Responder side: a SEND (or an RDMA WRITE with immediate) that needs a receive WQE
//! when none is posted is answered with an RNR NAK carrying the QP's `min_rnr_timer`
//! code; the packet is not executed and the expected PSN does not move.
//!
//! Requester side: an RNR NAK acknowledges everything before its PSN; the requester
//! stops sending, waits the time the code stands for (see
//! [`emu_wire::rnr_timer_duration`]), then retransmits from the NAK's PSN. `rnr_retry`
//! bounds how often (7 = forever); when exhausted the WQE completes with
//! `RNR_RETRY_EXC_ERR` and the QP moves to the error state.

use std::time::{Duration, Instant};

use emu_wire::rnr_timer_duration;

use super::retry::RetryBudget;

/// The requester's RNR state: the retry budget and whether it is waiting.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RnrState {
    pub(crate) budget: RetryBudget,
    /// Set while the requester waits out an RNR delay.
    pub(crate) waiting: bool,
}

/// What the requester does with an RNR NAK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RnrAction {
    /// Wait until this instant, then retransmit from the NAK's PSN.
    WaitUntil(Instant),
    /// `rnr_retry` is exhausted: complete with `RNR_RETRY_EXC_ERR`.
    Exhausted,
}

impl RnrState {
    pub(crate) fn new(rnr_retry: u8) -> Self {
        RnrState {
            budget: RetryBudget::rnr(rnr_retry),
            waiting: false,
        }
    }

    /// An RNR NAK with timer `code` arrived at `now`.
    pub(crate) fn on_rnr_nak(&mut self, now: Instant, code: u8) -> RnrAction {
        if !self.budget.spend() {
            return RnrAction::Exhausted;
        }
        self.waiting = true;
        RnrAction::WaitUntil(now + rnr_delay(code))
    }
}

/// The wait an RNR NAK with this timer code asks for.
pub(crate) fn rnr_delay(code: u8) -> Duration {
    rnr_timer_duration(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_budget_and_delay() {
        let t0 = Instant::now();
        let mut s = RnrState::new(1);
        assert_eq!(
            s.on_rnr_nak(t0, 1),
            RnrAction::WaitUntil(t0 + Duration::from_micros(10))
        );
        assert!(s.waiting);
        assert_eq!(s.on_rnr_nak(t0, 1), RnrAction::Exhausted);
        let mut forever = RnrState::new(7);
        for _ in 0..100 {
            assert!(matches!(forever.on_rnr_nak(t0, 0), RnrAction::WaitUntil(_)));
        }
    }
}
