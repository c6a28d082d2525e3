//! Alternate paths and path migration (IBTA 17.2.8 Automatic Path Migration; QP
//! attributes `alt_ah_attr`, `alt_timeout`, `path_mig_state`, manual 3.5 and 6.1.7-8).
//!
//! On RoCE a path is the address vector: the destination GID (and the source GID index,
//! hop limit, traffic class). A connected QP may hold an alternate path beside its
//! primary one; `path_mig_state` says whether it is armed:
//!
//! - Loading `ALT_PATH` and asking for `REARM` (or `ARMED`) arms it at once when its
//!   source GID entry holds an address; otherwise the alternate cannot be loaded, the
//!   QP raises `PATH_MIG_ERR` and stays in `REARM` (nothing armed).
//! - Migration makes the alternate path the primary one (with its timeout, P_Key index
//!   and port), sets `MIGRATED` and raises `PATH_MIG`. It happens automatically when
//!   the transport retry budget runs out on the primary path with an armed alternate
//!   (instead of failing the WQE with `RETRY_EXC_ERR`, the requester retransmits on the
//!   new path with a full budget); on the responder side when a packet arrives from the
//!   alternate destination while armed (IBTA 17.2.8: the responder follows the
//!   requester to the new path); and explicitly when the user sets `MIGRATED` while
//!   armed (manual 8.1: software-initiated migration).
//! - A migration whose alternate path has become unusable (its source GID entry was
//!   removed since it was armed) fails: `PATH_MIG_ERR`, the QP goes on with its primary
//!   path and `path_mig_state` becomes `MIGRATED` (nothing is armed any more).
//!
//! The BTH MigReq bit is not used: on RoCE the source address tells the responder which
//! path a packet took.

use verbs_api::{AsyncEventType, Error, MigState, QpAttr, QpAttrMask, Result};

use super::ctx::Ctx;
use super::qp::QueuePair;

impl QueuePair {
    /// `modify_qp` checks of `PATH_MIG_STATE` (before anything changes): arming needs an
    /// alternate path, loaded now or before.
    pub(crate) fn check_mig_state(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        if !mask.contains(QpAttrMask::PATH_MIG_STATE) {
            return Ok(());
        }
        let has_alt = mask.contains(QpAttrMask::ALT_PATH) || self.alt_loaded;
        match attr.path_mig_state {
            MigState::Rearm | MigState::Armed if !has_alt => Err(Error::InvalidArgument(
                "arming path migration needs an alternate path (ALT_PATH)",
            )),
            _ => Ok(()),
        }
    }

    /// `modify_qp` with `PATH_MIG_STATE`, once the other attributes are applied.
    pub(crate) fn apply_mig_state(&mut self, ctx: &mut Ctx<'_>, requested: MigState) {
        match requested {
            MigState::Rearm | MigState::Armed => {
                if ctx.port.gid_valid(self.attr.alt_ah_attr.grh.sgid_index) {
                    self.attr.path_mig_state = MigState::Armed;
                } else {
                    self.attr.path_mig_state = MigState::Rearm;
                    ctx.qp_event(AsyncEventType::PathMigErr, self.qpn);
                }
            }
            MigState::Migrated => {
                if self.attr.path_mig_state == MigState::Armed {
                    self.migrate(ctx);
                }
            }
        }
    }

    /// Switches to the armed alternate path. Returns false (and raises
    /// `PATH_MIG_ERR`) when the alternate is no longer usable.
    pub(crate) fn migrate(&mut self, ctx: &mut Ctx<'_>) -> bool {
        self.attr.path_mig_state = MigState::Migrated;
        if !ctx.port.gid_valid(self.attr.alt_ah_attr.grh.sgid_index) {
            ctx.qp_event(AsyncEventType::PathMigErr, self.qpn);
            return false;
        }
        let a = &mut self.attr;
        a.ah_attr = a.alt_ah_attr;
        a.pkey_index = a.alt_pkey_index;
        a.port_num = a.alt_port_num;
        a.timeout = a.alt_timeout;
        self.alt_loaded = false;
        ctx.qp_event(AsyncEventType::PathMig, self.qpn);
        true
    }

    /// The retry budget ran out on the current path: migrate if an alternate is armed.
    /// True when the requester may go on, on the new path.
    pub(crate) fn migrate_on_failure(&mut self, ctx: &mut Ctx<'_>) -> bool {
        if self.attr.path_mig_state != MigState::Armed || !self.migrate(ctx) {
            return false;
        }
        self.comp.retry.reload();
        true
    }

    /// Whether a packet from `src` came over the armed alternate path.
    pub(crate) fn came_over_alternate(&self, src: &verbs_api::Gid) -> bool {
        self.attr.path_mig_state == MigState::Armed && self.attr.alt_ah_attr.grh.dgid == *src
    }
}
