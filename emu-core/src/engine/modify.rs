//! QP state transitions (`ibv_modify_qp`, manual 3.5; IBTA 10.3).
//!
//! Each legal transition names, per QP type, the attributes it requires and the ones it
//! allows. A call with a required attribute missing, a forbidden one present, an illegal
//! transition or an out-of-range value fails with EINVAL and leaves the QP unchanged.
//! Without `STATE` in the mask the call is a transition from the current state to
//! itself (so RTS->RTS may change the allowed attributes, and RTR->RTR is illegal).

use verbs_api::{AccessFlags, Error, QpAttr, QpAttrMask, QpState, QpType, Result};

use super::ctx::Ctx;
use super::port::Port;
use super::qp::QueuePair;
use super::retry::RetryBudget;
use super::rnr::RnrState;
use super::Limits;

type M = QpAttrMask;

/// (required, optional) attributes of a transition for a QP type, or `None` when the
/// transition is illegal.
pub(crate) fn transition_rules(qp_type: QpType, cur: QpState, next: QpState) -> Option<(M, M)> {
    use QpState::*;
    use QpType::*;
    let none = M::empty();
    // The XRC halves follow RC (XRC annex), but for the three transitions below.
    let per = |rc: M, uc: M, ud: M| match qp_type {
        Rc | XrcSend | XrcRecv => Some(rc),
        Uc => Some(uc),
        Ud => Some(ud),
        _ => None,
    };
    let rts_opt_ud = M::CUR_STATE | M::QKEY;
    let rts_opt_uc = M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::PATH_MIG_STATE;
    let rts_opt_rc = rts_opt_uc | M::MIN_RNR_TIMER;
    // XRC (the kernel's qp_state_table for XRC_INI and XRC_TGT): the initiator has no
    // receive side, so INIT needs no access flags and RTR no responder resources or
    // RNR timer; the target sends nothing of its own, so RTS needs only the ACK
    // timeout and the SQ PSN. What RC requires there is allowed.
    let rtr_rc = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    let rts_rc = M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
    let rtr_opt = M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX;
    match (qp_type, cur, next) {
        (XrcSend, Reset, Init) => return Some((M::PKEY_INDEX | M::PORT, M::ACCESS_FLAGS)),
        (XrcSend, Init, Rtr) => {
            return Some((rtr_rc, rtr_opt | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER))
        }
        (XrcRecv, Rtr, Rts) => {
            return Some((
                M::TIMEOUT | M::SQ_PSN,
                rts_opt_rc | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
            ))
        }
        _ => {}
    }
    match (cur, next) {
        // Any state may go to RESET, and any state but RESET to ERR, with no further
        // attributes (IBTA 10.3.1 figure 124; the kernel's qp_state_table agrees, and
        // kernel rxe refuses RESET -> ERR with EINVAL).
        (Reset | Init | Rtr | Rts | Sqd | Sqe | Err, Reset)
        | (Init | Rtr | Rts | Sqd | Sqe | Err, Err) => Some((none, none)),
        (Reset, Init) => {
            let rc = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
            Some((per(rc, rc, M::PKEY_INDEX | M::PORT | M::QKEY)?, none))
        }
        (Init, Init) => {
            let rc = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
            Some((none, per(rc, rc, M::PKEY_INDEX | M::PORT | M::QKEY)?))
        }
        (Init, Rtr) => {
            let uc = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
            let rc = uc | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
            let opt = M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX;
            Some((per(rc, uc, none)?, per(opt, opt, M::PKEY_INDEX | M::QKEY)?))
        }
        (Rtr, Rts) => {
            let rc = rts_rc;
            Some((
                per(rc, M::SQ_PSN, M::SQ_PSN)?,
                per(rts_opt_rc, rts_opt_uc, rts_opt_ud)?,
            ))
        }
        (Rts, Rts) | (Sqd, Rts) => Some((none, per(rts_opt_rc, rts_opt_uc, rts_opt_ud)?)),
        (Rts, Sqd) => Some((none, M::EN_SQD_ASYNC_NOTIFY)),
        (Sqd, Sqd) => {
            let uc = M::AV | M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX | M::PATH_MIG_STATE;
            let rc = uc
                | M::PORT
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::MAX_QP_RD_ATOMIC
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER;
            Some((none, per(rc, uc, M::PKEY_INDEX | M::QKEY)?))
        }
        // SQE exists only for UC and UD (IBTA 10.3).
        (Sqe, Rts) => match qp_type {
            Uc => Some((none, M::CUR_STATE | M::ACCESS_FLAGS)),
            Ud => Some((none, M::CUR_STATE | M::QKEY)),
            _ => None,
        },
        _ => None,
    }
}

/// The access rights a QP may grant its peer (manual 3.5 `qp_access_flags`), with
/// the FLUSH placement types of IBTA 1.5 (kernel rxe checks them on the QP too).
const QP_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC)
    .union(AccessFlags::MW_BIND)
    .union(AccessFlags::FLUSH_GLOBAL)
    .union(AccessFlags::FLUSH_PERSISTENT);

/// Checks the values of the attributes in `mask` (manual 3.5, `struct ibv_qp_attr`).
fn check_values(attr: &QpAttr, mask: M, limits: &Limits, port: &Port) -> Result<()> {
    let active_mtu = port.link.active_mtu;
    let bad = |what| Err(Error::InvalidArgument(what));
    if mask.contains(M::PORT) && attr.port_num != 1 {
        return bad("port_num must be 1");
    }
    if mask.contains(M::PKEY_INDEX) && u32::from(attr.pkey_index) >= limits.pkey_tbl_len {
        return bad("pkey_index outside the P_Key table");
    }
    if mask.contains(M::ACCESS_FLAGS) && !QP_ACCESS.contains(attr.qp_access_flags) {
        return bad("qp_access_flags has unknown bits");
    }
    if mask.contains(M::PATH_MTU) && attr.path_mtu.bytes() > active_mtu.bytes() {
        return bad("path_mtu larger than the port's active MTU");
    }
    if mask.contains(M::AV) {
        let ah = &attr.ah_attr;
        if !ah.is_global {
            return bad("RoCE address vectors need a GRH (is_global)");
        }
        if u32::from(ah.grh.sgid_index) >= limits.gid_tbl_len {
            return bad("sgid_index outside the GID table");
        }
        if !port.gid_valid(ah.grh.sgid_index) {
            return Err(super::empty_sgid());
        }
        if ah.port_num > 1 {
            return bad("ah_attr.port_num must be 1");
        }
    }
    if mask.contains(M::ALT_PATH) {
        // The alternate path obeys the primary path's rules (IBTA 17.2.8).
        let ah = &attr.alt_ah_attr;
        if !ah.is_global {
            return bad("RoCE alternate address vectors need a GRH (is_global)");
        }
        if u32::from(ah.grh.sgid_index) >= limits.gid_tbl_len {
            return bad("alternate sgid_index outside the GID table");
        }
        if attr.alt_port_num != 1 || ah.port_num > 1 {
            return bad("alt_port_num must be 1");
        }
        if u32::from(attr.alt_pkey_index) >= limits.pkey_tbl_len {
            return bad("alt_pkey_index outside the P_Key table");
        }
        if attr.alt_timeout > 31 {
            return bad("alt_timeout is 5 bits");
        }
    }
    if mask.contains(M::DEST_QPN) && attr.dest_qp_num > 0x00FF_FFFF {
        return bad("dest_qp_num has more than 24 bits");
    }
    if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
        return bad("timeout is 5 bits");
    }
    if mask.contains(M::RETRY_CNT) && attr.retry_cnt > 7 {
        return bad("retry_cnt is 3 bits");
    }
    if mask.contains(M::RNR_RETRY) && attr.rnr_retry > 7 {
        return bad("rnr_retry is 3 bits");
    }
    if mask.contains(M::MIN_RNR_TIMER) && attr.min_rnr_timer > 31 {
        return bad("min_rnr_timer is 5 bits");
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC)
        && u32::from(attr.max_rd_atomic) > limits.max_qp_init_rd_atom
    {
        return bad("max_rd_atomic larger than max_qp_init_rd_atom");
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC)
        && u32::from(attr.max_dest_rd_atomic) > limits.max_qp_rd_atom
    {
        return bad("max_dest_rd_atomic larger than max_qp_rd_atom");
    }
    Ok(())
}

impl QueuePair {
    /// `ibv_modify_qp`. On error nothing changes.
    pub(crate) fn modify(&mut self, ctx: &mut Ctx<'_>, attr: &QpAttr, mask: M) -> Result<()> {
        let cur = self.state();
        let next = if mask.contains(M::STATE) {
            attr.qp_state
        } else {
            cur
        };
        let (required, optional) = transition_rules(self.init.qp_type, cur, next)
            .ok_or(Error::InvalidArgument("illegal QP state transition"))?;
        if !mask.contains(required) {
            return Err(Error::InvalidArgument("a required attribute is missing"));
        }
        if !(required | optional | M::STATE).contains(mask) {
            return Err(Error::InvalidArgument(
                "an attribute not allowed in this transition",
            ));
        }
        if mask.contains(M::CUR_STATE) && attr.cur_qp_state != cur {
            return Err(Error::InvalidArgument("cur_qp_state is not the QP's state"));
        }
        check_values(attr, mask, ctx.limits, ctx.port)?;
        self.check_mig_state(attr, mask)?;

        self.apply(attr, mask);
        match (cur, next) {
            (_, QpState::Reset) => {
                // A QP in RESET starts clean: its completions not yet polled leave its
                // CQs too, as libmlx4/libmlx5 clean them on this transition
                // (`mlx5_cq_clean`). Otherwise flush completions of the QP's last
                // life would be polled as the first completions of its next one.
                for cq in [self.init.send_cq, self.init.recv_cq] {
                    if let Some(c) = ctx.cqs.get_mut(&cq.0) {
                        c.remove_qp(self.qpn);
                    }
                }
                self.reset();
            }
            (_, QpState::Err) => self.enter_error(ctx),
            (QpState::Init, QpState::Rtr) => {
                self.attr.qp_state = QpState::Rtr;
                self.resp.epsn = emu_wire::Psn::new(self.attr.rq_psn);
            }
            (QpState::Rtr, QpState::Rts) => {
                self.attr.qp_state = QpState::Rts;
                let psn = emu_wire::Psn::new(self.attr.sq_psn);
                self.req.next_psn = psn;
                self.req.sent_end = psn;
                self.comp.psn = psn;
            }
            (QpState::Rts, QpState::Sqd) => {
                self.attr.qp_state = QpState::Sqd;
                self.attr.sq_draining = true;
                self.check_drained(ctx);
            }
            (_, next) => {
                self.attr.qp_state = next;
                if next == QpState::Rts {
                    self.attr.sq_draining = false;
                }
            }
        }
        if mask.contains(M::PATH_MIG_STATE) {
            self.apply_mig_state(ctx, attr.path_mig_state);
        }
        Ok(())
    }

    /// Copies the attributes named in `mask` into the QP.
    fn apply(&mut self, a: &QpAttr, mask: M) {
        for &(bit, copy) in COPIES {
            if mask.contains(bit) {
                copy(&mut self.attr, a);
            }
        }
        if mask.contains(M::ALT_PATH) {
            self.alt_loaded = true;
        }
        if mask.contains(M::RETRY_CNT) {
            self.comp.retry = RetryBudget::transport(a.retry_cnt);
        }
        if mask.contains(M::RNR_RETRY) {
            self.comp.rnr = RnrState::new(a.rnr_retry);
        }
    }
}

/// Copies one attribute (or group) from a modify's attributes into the QP's.
type CopyAttr = fn(&mut QpAttr, &QpAttr);

/// What each attribute-mask bit copies from the modify's attributes into the QP's
/// (`ibv_qp_attr_mask`, manual 3.5.1): PSNs are kept to their 24 bits.
const COPIES: &[(M, CopyAttr)] = &[
    (M::EN_SQD_ASYNC_NOTIFY, |s, a| {
        s.en_sqd_async_notify = a.en_sqd_async_notify
    }),
    (M::ACCESS_FLAGS, |s, a| {
        s.qp_access_flags = a.qp_access_flags
    }),
    (M::PKEY_INDEX, |s, a| s.pkey_index = a.pkey_index),
    (M::PORT, |s, a| s.port_num = a.port_num),
    (M::QKEY, |s, a| s.qkey = a.qkey),
    (M::AV, |s, a| s.ah_attr = a.ah_attr),
    (M::PATH_MTU, |s, a| s.path_mtu = a.path_mtu),
    (M::TIMEOUT, |s, a| s.timeout = a.timeout),
    (M::RETRY_CNT, |s, a| s.retry_cnt = a.retry_cnt),
    (M::RNR_RETRY, |s, a| s.rnr_retry = a.rnr_retry),
    (M::RQ_PSN, |s, a| s.rq_psn = a.rq_psn & 0x00FF_FFFF),
    (M::MAX_QP_RD_ATOMIC, |s, a| {
        s.max_rd_atomic = a.max_rd_atomic
    }),
    (M::ALT_PATH, |s, a| {
        s.alt_ah_attr = a.alt_ah_attr;
        s.alt_pkey_index = a.alt_pkey_index;
        s.alt_port_num = a.alt_port_num;
        s.alt_timeout = a.alt_timeout;
    }),
    (M::MIN_RNR_TIMER, |s, a| s.min_rnr_timer = a.min_rnr_timer),
    (M::SQ_PSN, |s, a| s.sq_psn = a.sq_psn & 0x00FF_FFFF),
    (M::MAX_DEST_RD_ATOMIC, |s, a| {
        s.max_dest_rd_atomic = a.max_dest_rd_atomic
    }),
    (M::DEST_QPN, |s, a| s.dest_qp_num = a.dest_qp_num),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_connect_path_and_illegal_jumps() {
        use QpState::*;
        assert!(transition_rules(QpType::Rc, Reset, Init).is_some());
        assert!(transition_rules(QpType::Rc, Reset, Rtr).is_none());
        assert!(transition_rules(QpType::Rc, Init, Rts).is_none());
        assert!(transition_rules(QpType::Rc, Rtr, Rtr).is_none());
        assert!(transition_rules(QpType::Rc, Sqe, Rts).is_none());
        assert!(transition_rules(QpType::Uc, Sqe, Rts).is_some());
        assert!(transition_rules(QpType::Rc, Err, Rts).is_none());
        assert!(transition_rules(QpType::Rc, Reset, Err).is_none());
        let (req, _) = transition_rules(QpType::Rc, Init, Rtr).unwrap();
        assert!(req.contains(M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER));
        let (req, _) = transition_rules(QpType::Uc, Init, Rtr).unwrap();
        assert!(!req.contains(M::MAX_DEST_RD_ATOMIC));
    }
}
