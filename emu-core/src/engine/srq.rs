//! Shared receive queues (manual 3.4.5-3.4.7, 3.6.2, 3.6.6; IBTA 10.2.9, 11.2.3).
//!
//! An SRQ is a pool of receive WQEs that any number of QPs draw from. A QP created
//! with `QpInitAttr::srq` has no receive queue of its own: `post_recv` on it is EINVAL
//! and its responder takes the next WQE from the SRQ when a SEND (FIRST or ONLY) or an
//! RDMA WRITE with immediate needs one. A WQE taken by a QP belongs to that QP from then
//! on: its completion goes to the QP's receive CQ with the QP's number, and if the QP
//! goes to the error state only that WQE is flushed; the WQEs still in the SRQ stay for
//! the other QPs. (A UC message dropped part-way keeps its WQE with the QP for the next
//! message, as kernel rxe keeps `resp.wqe`; it does not go back to the SRQ.)
//!
//! The SRQ limit ("low watermark", manual 3.4.6 and 6.1.16, IBTA 10.2): setting
//! `srq_limit` > 0 with `ibv_modify_srq` arms the SRQ; when the number of WQEs in the
//! SRQ drops below the limit, `IBV_EVENT_SRQ_LIMIT_REACHED` is raised once and the SRQ
//! disarms itself (`srq_limit` reads 0 again, manual 3.6.2), so each event needs a new
//! arming. As in kernel rxe, the check is made when a WQE leaves the SRQ: arming a limit
//! that the SRQ is already below raises nothing until the next WQE is taken.
//!
//! `IBV_EVENT_SRQ_ERR` (manual 6.1.15: the device can no longer dequeue from the SRQ)
//! has no natural cause in the emulator, whose SRQ lives in host memory it owns; it will
//! be reachable only through fault injection, which does not exist yet, so the engine
//! never raises it.

use std::collections::VecDeque;

use verbs_api::{Error, PostError, RecvWr, Result, SrqAttr, SrqAttrMask};

use super::wqe::{RecvWqe, Sges};
use super::Limits;
use verbs_api::{CqId, PdId, XrcdId};

/// One shared receive queue.
#[derive(Debug)]
pub(crate) struct SharedReceiveQueue {
    pub(crate) pd: PdId,
    /// An XRC SRQ (module `xrc`): its domain and the CQ its receives complete on.
    pub(crate) xrc: Option<(XrcdId, CqId)>,
    pub(crate) attr: SrqAttr,
    /// WQEs posted and not yet taken by a QP, oldest first.
    pub(crate) wqes: VecDeque<RecvWqe>,
    /// QPs created on this SRQ and not destroyed.
    pub(crate) users: u32,
}

impl SharedReceiveQueue {
    /// `ibv_create_srq` checks (manual 3.4.5, as kernel rxe): `max_wr` in
    /// 1..=`max_srq_wr`, `max_sge` in 1..=`max_srq_sge`; the SRQ gets exactly what was
    /// asked and starts unarmed.
    pub(crate) fn new(pd: PdId, attr: &SrqAttr, limits: &Limits) -> Result<Self> {
        if attr.max_wr == 0 || attr.max_wr > limits.max_srq_wr {
            return Err(Error::InvalidArgument("max_wr must be 1..=max_srq_wr"));
        }
        if attr.max_sge == 0 || attr.max_sge > limits.max_srq_sge {
            return Err(Error::InvalidArgument("max_sge must be 1..=max_srq_sge"));
        }
        Ok(SharedReceiveQueue {
            pd,
            xrc: None,
            attr: SrqAttr {
                max_wr: attr.max_wr,
                max_sge: attr.max_sge,
                srq_limit: 0,
            },
            wqes: VecDeque::new(),
            users: 0,
        })
    }

    /// `ibv_modify_srq` (manual 3.4.6): all or nothing. `MAX_WR` resizes: EINVAL for 0,
    /// over `max_srq_wr`, fewer than the WQEs the SRQ holds now, or below an armed
    /// limit (kernel rxe's rules). `LIMIT` arms (> 0) or disarms (0): EINVAL above
    /// `max_wr` (the new one if resized in the same call). `max_sge` cannot change.
    pub(crate) fn modify(
        &mut self,
        attr: &SrqAttr,
        mask: SrqAttrMask,
        limits: &Limits,
    ) -> Result<()> {
        if !(SrqAttrMask::MAX_WR | SrqAttrMask::LIMIT).contains(mask) {
            return Err(Error::InvalidArgument("unknown SRQ attribute mask bits"));
        }
        let max_wr = if mask.contains(SrqAttrMask::MAX_WR) {
            if attr.max_wr == 0 || attr.max_wr > limits.max_srq_wr {
                return Err(Error::InvalidArgument("max_wr must be 1..=max_srq_wr"));
            }
            if (attr.max_wr as usize) < self.wqes.len() {
                return Err(Error::InvalidArgument(
                    "max_wr smaller than the WQEs the SRQ holds",
                ));
            }
            attr.max_wr
        } else {
            self.attr.max_wr
        };
        let limit = if mask.contains(SrqAttrMask::LIMIT) {
            attr.srq_limit
        } else {
            self.attr.srq_limit
        };
        if limit > max_wr {
            return Err(Error::InvalidArgument("srq_limit larger than max_wr"));
        }
        self.attr.max_wr = max_wr;
        self.attr.srq_limit = limit;
        Ok(())
    }

    /// `ibv_post_srq_recv` (manual 3.6.6): stops at the first WR it cannot post, EINVAL
    /// for more SGEs than `max_sge`, ENOMEM when the SRQ is full.
    pub(crate) fn post(&mut self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        for (index, wr) in wrs.iter().enumerate() {
            let fail = |error| PostError { index, error };
            if wr.sg_list.len() > self.attr.max_sge as usize {
                return Err(fail(Error::InvalidArgument(
                    "more SGEs than the SRQ's max_sge",
                )));
            }
            if self.wqes.len() >= self.attr.max_wr as usize {
                return Err(fail(Error::NoMemory("shared receive queue is full")));
            }
            self.wqes.push_back(RecvWqe {
                wr_id: wr.wr_id,
                sges: Sges::from_slice(&wr.sg_list),
                length: wr.sg_list.iter().map(|s| u64::from(s.length)).sum(),
            });
        }
        Ok(())
    }

    /// Takes the oldest WQE for a QP. Returns it and whether the limit event fires: the
    /// SRQ was armed and now holds fewer WQEs than the limit; it is disarmed.
    pub(crate) fn take(&mut self) -> Option<(RecvWqe, bool)> {
        let wqe = self.wqes.pop_front()?;
        let limit = self.attr.srq_limit;
        let fire = limit > 0 && (self.wqes.len() as u64) < u64::from(limit);
        if fire {
            self.attr.srq_limit = 0;
        }
        Some((wqe, fire))
    }
}
