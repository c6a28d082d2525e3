//! What a queue pair reaches outside itself while it handles an input: the memory
//! tables, the CQs, the shared receive queues, the event queues and the counters.

use std::collections::VecDeque;

use super::idmap::IdMap;
use std::time::Instant;

use verbs_api::{AsyncEvent, AsyncEventType, EventElement, WorkCompletion};

use super::ah::AhTable;
use super::counters::Counters;
use super::cq::{CompletionQueue, Pushed};
use super::mr::MrTable;
use super::port::Port;
use super::srq::SharedReceiveQueue;
use super::Limits;
use verbs_api::{CqId, SrqId};

/// Borrowed engine state handed to a QP for one input.
pub(crate) struct Ctx<'a> {
    pub(crate) now: Instant,
    pub(crate) mrs: &'a mut MrTable,
    pub(crate) ahs: &'a AhTable,
    pub(crate) cqs: &'a mut IdMap<CompletionQueue>,
    pub(crate) srqs: &'a mut IdMap<SharedReceiveQueue>,
    pub(crate) events: &'a mut VecDeque<AsyncEvent>,
    pub(crate) cq_events: &'a mut VecDeque<CqId>,
    /// How many CQs wake the device (a completion that fires the event disarms its
    /// CQ; see `CompletionQueue::wakes_device`).
    pub(crate) armed_cqs: &'a mut usize,
    /// CQs that overran during this input; the engine moves their QPs to error after.
    pub(crate) overrun: &'a mut Vec<CqId>,
    pub(crate) counters: &'a mut Counters,
    pub(crate) limits: &'a Limits,
    /// The port: its GID table decides whether an alternate path is usable.
    pub(crate) port: &'a Port,
    /// What the driver knows of peer devices on this host (`retry`).
    pub(crate) liveness: Option<&'a dyn super::retry::PeerLiveness>,
    /// What the engine did, for a trace (module `note`).
    pub(crate) notes: &'a mut super::note::Notes,
    /// Buffers of emptied send queues (module `wqe`).
    pub(crate) send_queues: &'a mut super::wqe::SendQueuePool,
}

impl Ctx<'_> {
    /// Delivers a work completion to `cq`.
    pub(crate) fn complete(&mut self, cq: CqId, wc: WorkCompletion, solicited: bool) {
        let Some(queue) = self.cqs.get_mut(&cq.0) else {
            return;
        };
        self.notes.add(|| super::note::Note::Completion {
            qpn: wc.qp_num,
            wr_id: wc.wr_id,
            opcode: wc.opcode,
            status: wc.status,
            byte_len: wc.byte_len,
        });
        match queue.push(wc, solicited) {
            Pushed::Queued { notify } => {
                if notify {
                    if !queue.gsi {
                        *self.armed_cqs -= 1;
                    }
                    self.cq_events.push_back(cq);
                }
            }
            Pushed::Overrun { first } => {
                self.counters.cq_overruns += 1;
                if first {
                    self.events.push_back(AsyncEvent {
                        event_type: AsyncEventType::CqErr,
                        element: EventElement::Cq(cq.0),
                    });
                    self.overrun.push(cq);
                }
            }
        }
    }

    /// Raises an asynchronous event affiliated with QP `qpn`.
    pub(crate) fn qp_event(&mut self, event_type: AsyncEventType, qpn: u32) {
        self.events.push_back(AsyncEvent {
            event_type,
            element: EventElement::Qp(qpn),
        });
    }

    /// Raises an asynchronous event affiliated with SRQ `srq`.
    pub(crate) fn srq_event(&mut self, event_type: AsyncEventType, srq: SrqId) {
        self.events.push_back(AsyncEvent {
            event_type,
            element: EventElement::Srq(srq.0),
        });
    }
}
