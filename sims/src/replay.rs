//! What each device's host side holds at each step of a trace, rebuilt from its
//! engine's notes: every QP's state, the work requests on its send and receive queues,
//! the completions delivered to its CQs and the async events raised. The HTML
//! step-through ([`html`](crate::html)) shows it beside each packet.
//!
//! The rules it replays:
//! - A posted WR joins the end of its queue (`post_send`, `post_recv`).
//! - A send queue completes in order (IBTA 10.8.3, manual 3.6.5 on unsignaled WRs):
//!   the completion of a WR retires it and every WR posted before it on that queue,
//!   which is how an unsignaled WR, which has no completion of its own, leaves.
//! - A receive completion retires its own WR, from the QP's receive queue or, for a QP
//!   on an SRQ, from the SRQ that holds it.
//! - A flushed WR (`WR_FLUSH_ERR`, IBTA 10.3.1) carries no valid opcode: it retires
//!   the WR of that `wr_id` from whichever queue holds it.
//! - Completions are listed as delivered, oldest first, including those a full CQ
//!   lost (the note says so; the trace does not see the program's `poll_cq`).

use std::collections::BTreeMap;

use emu_core::engine::Note;
use verbs_api::{QpState, WcStatus};

use crate::trace::{Entry, HostNote, Trace};

/// A work request on a queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wqe {
    /// Its identifier.
    pub wr_id: u64,
    /// What it is: `SEND len=17`, `len=64` for a receive.
    pub what: String,
}

/// One QP of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QpView {
    /// The QP number.
    pub qpn: u32,
    /// Its state, once a transition was seen.
    pub state: Option<QpState>,
    /// WRs posted to its send queue and not yet retired.
    pub send_queue: Vec<Wqe>,
    /// WRs posted to its receive queue and not yet retired.
    pub recv_queue: Vec<Wqe>,
}

/// A device's host side at one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SideView {
    /// Its QPs, by number.
    pub qps: BTreeMap<u32, QpView>,
    /// Its SRQs, by number: the WRs posted and not yet taken by a receive.
    pub srqs: BTreeMap<u32, Vec<Wqe>>,
    /// Every completion delivered so far, oldest first (`qp=0x000011 completion
    /// wr_id=1 SUCCESS SEND len=17`).
    pub completions: Vec<String>,
    /// Every async event so far, oldest first.
    pub events: Vec<String>,
}

impl SideView {
    fn qp(&mut self, qpn: u32) -> &mut QpView {
        self.qps.entry(qpn).or_insert_with(|| QpView {
            qpn,
            ..QpView::default()
        })
    }

    /// Applies one of this device's notes.
    pub fn apply(&mut self, note: &Note) {
        match note {
            Note::PostSend {
                qpn,
                wr_id,
                opcode,
                len,
            } => self.qp(*qpn).send_queue.push(Wqe {
                wr_id: *wr_id,
                what: format!(
                    "{} len={len}",
                    emu_core::engine::upper_snake(&format!("{opcode:?}"))
                ),
            }),
            Note::PostRecv { qpn, wr_id, len } => self.qp(*qpn).recv_queue.push(Wqe {
                wr_id: *wr_id,
                what: format!("len={len}"),
            }),
            Note::PostSrqRecv { srq, wr_id, len } => {
                self.srqs.entry(*srq).or_default().push(Wqe {
                    wr_id: *wr_id,
                    what: format!("len={len}"),
                });
            }
            Note::Completion {
                qpn,
                wr_id,
                opcode,
                status,
                ..
            } => {
                self.completions.push(format!("qp={qpn:#08x} {note}"));
                let qp = self.qp(*qpn);
                let recv_first = *status == WcStatus::Success && opcode.is_recv()
                    || *status != WcStatus::Success
                        && !qp.send_queue.iter().any(|w| w.wr_id == *wr_id);
                if recv_first {
                    if let Some(i) = qp.recv_queue.iter().position(|w| w.wr_id == *wr_id) {
                        qp.recv_queue.remove(i);
                    } else {
                        // A QP on an SRQ: its receive came from there (the notes do not
                        // say which SRQ a QP uses: the first that holds the wr_id).
                        for q in self.srqs.values_mut() {
                            if let Some(i) = q.iter().position(|w| w.wr_id == *wr_id) {
                                q.remove(i);
                                break;
                            }
                        }
                    }
                } else if let Some(i) = qp.send_queue.iter().position(|w| w.wr_id == *wr_id) {
                    qp.send_queue.drain(..=i);
                }
            }
            Note::Event(_) => self.events.push(note.to_string()),
            Note::State { qpn, to, .. } => self.qp(*qpn).state = Some(*to),
            Note::TimerArmed { .. } | Note::TimerFired { .. } | Note::Discard { .. } => {}
        }
    }
}

/// Every device's host side after each entry of [`Trace::entries`] (one vector of
/// [`SideView`]s per entry, one view per device).
pub fn snapshots(trace: &Trace) -> Vec<Vec<SideView>> {
    let mut sides = vec![SideView::default(); trace.devices.len()];
    trace
        .entries()
        .into_iter()
        .map(|e| {
            if let Entry::Host(HostNote { device, note, .. }) = e {
                if let Some(side) = sides.get_mut(*device) {
                    side.apply(note);
                }
            }
            sides.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::{WcOpcode, WrOpcode};

    fn send(wr_id: u64) -> Note {
        Note::PostSend {
            qpn: 17,
            wr_id,
            opcode: WrOpcode::Send,
            len: 8,
        }
    }

    fn done(wr_id: u64, opcode: WcOpcode, status: WcStatus) -> Note {
        Note::Completion {
            qpn: 17,
            wr_id,
            opcode,
            status,
            byte_len: 8,
        }
    }

    fn ids(q: &[Wqe]) -> Vec<u64> {
        q.iter().map(|w| w.wr_id).collect()
    }

    #[test]
    fn a_send_completion_retires_the_unsignaled_wrs_before_it() {
        let mut s = SideView::default();
        for id in 1..=4 {
            s.apply(&send(id));
        }
        s.apply(&done(3, WcOpcode::Send, WcStatus::Success));
        assert_eq!(ids(&s.qps[&17].send_queue), [4]);
        assert_eq!(s.completions.len(), 1);
    }

    #[test]
    fn a_receive_completion_retires_its_own_wr_and_a_flush_finds_its_queue() {
        let mut s = SideView::default();
        s.apply(&send(9));
        for id in [1, 2] {
            s.apply(&Note::PostRecv {
                qpn: 17,
                wr_id: id,
                len: 64,
            });
        }
        s.apply(&done(1, WcOpcode::Recv, WcStatus::Success));
        assert_eq!(ids(&s.qps[&17].recv_queue), [2]);
        // Flushed: the opcode is not valid (here it says SEND); wr_id 2 is a receive.
        s.apply(&done(2, WcOpcode::Send, WcStatus::WrFlushErr));
        assert!(s.qps[&17].recv_queue.is_empty());
        assert_eq!(ids(&s.qps[&17].send_queue), [9]);
        s.apply(&done(9, WcOpcode::Send, WcStatus::WrFlushErr));
        assert!(s.qps[&17].send_queue.is_empty());
    }

    #[test]
    fn a_receive_on_an_srq_comes_off_the_srq() {
        let mut s = SideView::default();
        for id in [5, 6] {
            s.apply(&Note::PostSrqRecv {
                srq: 1,
                wr_id: id,
                len: 64,
            });
        }
        s.apply(&done(6, WcOpcode::Recv, WcStatus::Success));
        assert_eq!(ids(&s.srqs[&1]), [5]);
        assert!(s.qps[&17].recv_queue.is_empty());
    }

    #[test]
    fn the_state_is_the_last_transition() {
        let mut s = SideView::default();
        assert!(s.qps.is_empty());
        s.apply(&Note::State {
            qpn: 17,
            from: QpState::Reset,
            to: QpState::Init,
        });
        s.apply(&Note::State {
            qpn: 17,
            from: QpState::Init,
            to: QpState::Err,
        });
        assert_eq!(s.qps[&17].state, Some(QpState::Err));
    }
}
