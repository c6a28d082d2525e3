//! Memory registration types: access flags, re-registration flags and memory
//! window types (manual 2.3.4 Memory Registration, 2.3.5 Memory Window, 3.4.1
//! ibv_reg_mr).
//!
//! The memory itself is [`crate::MemBuf`]; see the `membuf` module for the
//! ownership model.

use crate::error::{Error, Result};

bitflags::bitflags! {
    /// `enum ibv_access_flags`: what an MR, MW or QP allows (manual 3.4.1
    /// ibv_reg_mr; also `qp_access_flags` of ibv_modify_qp, manual 3.5.2).
    ///
    /// Local read access is always implied. With `REMOTE_WRITE` or
    /// `REMOTE_ATOMIC`, `LOCAL_WRITE` must be set too (manual 3.4.1; see
    /// [`AccessFlags::check_mr_access`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: allow local host write access.
        const LOCAL_WRITE = 1 << 0;
        /// `IBV_ACCESS_REMOTE_WRITE`: allow remote hosts write access.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: allow remote hosts read access.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: allow remote hosts atomic access.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: allow memory windows on this MR.
        const MW_BIND = 1 << 4;
        /// `IBV_ACCESS_ZERO_BASED`: addresses of the MR/MW are offsets from 0.
        const ZERO_BASED = 1 << 5;
        /// `IBV_ACCESS_ON_DEMAND`: on-demand paging.
        const ON_DEMAND = 1 << 6;
        /// `IBV_ACCESS_HUGETLB`: the memory is backed by huge pages.
        const HUGETLB = 1 << 7;
        /// `IBV_ACCESS_FLUSH_GLOBAL`: allow RDMA FLUSH to global visibility.
        const FLUSH_GLOBAL = 1 << 8;
        /// `IBV_ACCESS_FLUSH_PERSISTENT`: allow RDMA FLUSH to persistence.
        const FLUSH_PERSISTENT = 1 << 9;
        /// `IBV_ACCESS_RELAXED_ORDERING`: allow relaxed PCIe ordering. This is
        /// the first of libibverbs' "optional" flags (bit 20 and up), which a
        /// device may ignore.
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl AccessFlags {
    /// The optional-flag range of libibverbs (`IBV_ACCESS_OPTIONAL_RANGE`,
    /// bits 20..=29): devices that do not know a flag in it ignore it instead
    /// of failing.
    pub const OPTIONAL_RANGE_BITS: u32 = 0x3ff0_0000;

    /// True if any remote access (read, write or atomic) is allowed.
    #[must_use]
    pub const fn allows_remote(self) -> bool {
        self.intersects(
            AccessFlags::REMOTE_READ
                .union(AccessFlags::REMOTE_WRITE)
                .union(AccessFlags::REMOTE_ATOMIC),
        )
    }

    /// Checks the rule of manual 3.4.1 ibv_reg_mr: "If IBV_ACCESS_REMOTE_WRITE
    /// or IBV_ACCESS_REMOTE_ATOMIC is set, then IBV_ACCESS_LOCAL_WRITE must be
    /// set as well." Returns `EINVAL` otherwise.
    pub fn check_mr_access(self) -> Result<()> {
        let needs_local = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if self.intersects(needs_local) && !self.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::InvalidArgument(
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE",
            ));
        }
        Ok(())
    }
}

bitflags::bitflags! {
    /// `enum ibv_rereg_mr_flags`: what `ibv_rereg_mr` changes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct ReregMrFlags: u32 {
        /// `IBV_REREG_MR_CHANGE_TRANSLATION`: new address and length.
        const CHANGE_TRANSLATION = 1 << 0;
        /// `IBV_REREG_MR_CHANGE_PD`: new protection domain.
        const CHANGE_PD = 1 << 1;
        /// `IBV_REREG_MR_CHANGE_ACCESS`: new access flags.
        const CHANGE_ACCESS = 1 << 2;
    }
}

/// The name used for [`ReregMrFlags`] in the original API brief
/// (libibverbs spells it `ibv_rereg_mr_flags`).
pub type RereqMrFlags = ReregMrFlags;

verbs_enum! {
    /// `enum ibv_mw_type`: memory window type (manual 2.3.5 Memory Window).
    /// Type 1 windows are bound with `ibv_bind_mw` and belong to a PD; type 2
    /// windows are bound with a BIND_MW work request and belong to a QP.
    pub enum MwType ("ibv_mw_type") {
        /// `IBV_MW_TYPE_1`.
        Type1 = 1,
        /// `IBV_MW_TYPE_2`.
        Type2 = 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_values_match_libibverbs() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::MW_BIND.bits(), 16);
        assert_eq!(AccessFlags::ZERO_BASED.bits(), 32);
        assert_eq!(AccessFlags::ON_DEMAND.bits(), 64);
        assert_eq!(AccessFlags::HUGETLB.bits(), 128);
        assert_eq!(AccessFlags::FLUSH_GLOBAL.bits(), 256);
        assert_eq!(AccessFlags::FLUSH_PERSISTENT.bits(), 512);
        assert_eq!(AccessFlags::RELAXED_ORDERING.bits(), 1 << 20);
        assert_ne!(
            AccessFlags::RELAXED_ORDERING.bits() & AccessFlags::OPTIONAL_RANGE_BITS,
            0
        );
    }

    #[test]
    fn remote_write_needs_local_write() {
        assert!(AccessFlags::REMOTE_READ.check_mr_access().is_ok());
        assert!(AccessFlags::empty().check_mr_access().is_ok());
        assert_eq!(
            AccessFlags::REMOTE_WRITE
                .check_mr_access()
                .unwrap_err()
                .errno(),
            22
        );
        assert_eq!(
            AccessFlags::REMOTE_ATOMIC
                .check_mr_access()
                .unwrap_err()
                .errno(),
            22
        );
        assert!((AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE)
            .check_mr_access()
            .is_ok());
        assert!(AccessFlags::REMOTE_READ.allows_remote());
        assert!(!(AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND).allows_remote());
    }

    #[test]
    fn rereg_and_mw_values() {
        assert_eq!(ReregMrFlags::all().bits(), 7);
        assert_eq!(RereqMrFlags::CHANGE_PD.bits(), 2);
        assert_eq!(MwType::try_from(2), Ok(MwType::Type2));
        assert!(MwType::try_from(0).is_err());
    }
}
