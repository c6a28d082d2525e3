//! Completion queues: a bounded FIFO of work completions shared by any number of QPs and
//! by send and receive sides, with notification arming and overrun detection.
//!
//! Manual 3.5 (`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`); IBTA 11.4.2.
//! An overrun (a completion arriving at a full CQ) loses the completion, raises the
//! affiliated asynchronous event `CQ_ERR`, and moves every QP on the CQ to the error
//! state with `QP_FATAL` (IBTA 11.6.2, C11-33).

use std::collections::VecDeque;

use verbs_api::WorkCompletion;

/// What wakes a CQ's completion channel (`ibv_req_notify_cq`'s `solicited_only`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    Next,
    Solicited,
}

/// One completion queue.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    capacity: usize,
    entries: VecDeque<WorkCompletion>,
    arm: Option<Arm>,
    overrun: bool,
    /// How many QPs use this CQ (send or receive side): a CQ in use cannot be destroyed.
    pub(crate) users: u32,
    /// QP1 uses it: its notification requests are the CM agent's (see
    /// [`CompletionQueue::wakes_device`]).
    pub(crate) gsi: bool,
}

/// The result of pushing a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued; `notify` says whether the completion channel must be woken.
    Queued { notify: bool },
    /// The CQ was full: the completion is lost. `first` is true the first time.
    Overrun { first: bool },
}

impl CompletionQueue {
    pub(crate) fn new(capacity: usize) -> Self {
        CompletionQueue {
            capacity,
            entries: VecDeque::with_capacity(capacity.min(4096)),
            arm: None,
            overrun: false,
            users: 0,
            gsi: false,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Adds a completion. `solicited` is true for a receive completion of a message
    /// that had the SE bit, and for every error completion (IBTA 11.4.2.2: a solicited
    /// notification request is satisfied by solicited receives and by errors).
    pub(crate) fn push(&mut self, wc: WorkCompletion, solicited: bool) -> Pushed {
        if self.entries.len() >= self.capacity {
            let first = !self.overrun;
            self.overrun = true;
            return Pushed::Overrun { first };
        }
        self.entries.push_back(wc);
        let notify = match self.arm {
            Some(Arm::Next) => true,
            Some(Arm::Solicited) => solicited || !wc.status.is_success(),
            None => false,
        };
        if notify {
            self.arm = None;
        }
        Pushed::Queued { notify }
    }

    /// Removes up to `max` completions, oldest first.
    pub(crate) fn poll(&mut self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let n = max.min(self.entries.len());
        out.extend(self.entries.drain(..n));
        if n > 0 {
            // Room again: a later overrun is a new one and is reported again.
            self.overrun = false;
        }
        n
    }

    /// Removes the completions of QP `qpn` not yet polled (its move to RESET).
    pub(crate) fn remove_qp(&mut self, qpn: u32) {
        self.entries.retain(|wc| wc.qp_num != qpn);
    }

    /// Whether a notification request is pending (someone waits for this CQ's event).
    pub(crate) fn is_armed(&self) -> bool {
        self.arm.is_some()
    }

    /// Whether the request pending here asks the device to receive at once
    /// ([`super::Engine::cq_armed`]): an application waits on this CQ's channel
    /// instead of polling. QP1's CQ is armed for good by the CM agent, which needs
    /// no more than the device thread's usual pace.
    pub(crate) fn wakes_device(&self) -> bool {
        self.is_armed() && !self.gsi
    }

    /// `ibv_req_notify_cq`: the next (solicited) completion wakes the channel once.
    pub(crate) fn req_notify(&mut self, solicited_only: bool) {
        // A pending "next" request is not narrowed by a later solicited-only one.
        self.arm = match (self.arm, solicited_only) {
            (Some(Arm::Next), _) | (_, false) => Some(Arm::Next),
            _ => Some(Arm::Solicited),
        };
    }

    /// `ibv_resize_cq`: at least `capacity` entries; fails if the current entries do
    /// not fit.
    pub(crate) fn resize(&mut self, capacity: usize) -> bool {
        if capacity < self.entries.len() {
            return false;
        }
        self.capacity = capacity;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::{WcOpcode, WcStatus};

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion::new(id, WcStatus::Success, WcOpcode::Send, 1)
    }

    #[test]
    fn fifo_and_overrun() {
        let mut cq = CompletionQueue::new(2);
        assert_eq!(cq.push(wc(1), false), Pushed::Queued { notify: false });
        cq.push(wc(2), false);
        assert_eq!(cq.push(wc(3), false), Pushed::Overrun { first: true });
        assert_eq!(cq.push(wc(4), false), Pushed::Overrun { first: false });
        let mut out = Vec::new();
        assert_eq!(cq.poll(10, &mut out), 2);
        assert_eq!(out.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn notification_fires_once_per_arming() {
        let mut cq = CompletionQueue::new(8);
        cq.req_notify(true);
        assert_eq!(cq.push(wc(1), false), Pushed::Queued { notify: false });
        assert_eq!(cq.push(wc(2), true), Pushed::Queued { notify: true });
        assert_eq!(cq.push(wc(3), true), Pushed::Queued { notify: false });
        cq.req_notify(false);
        assert_eq!(cq.push(wc(4), false), Pushed::Queued { notify: true });
        let mut err = wc(5);
        err.status = WcStatus::RemAccessErr;
        cq.req_notify(true);
        assert_eq!(cq.push(err, false), Pushed::Queued { notify: true });
    }
}
