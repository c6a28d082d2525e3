//! XRC, eXtended Reliable Connected transport (IBTA vol. 1 annex A14; manual 3.4.8 to
//! 3.4.14; libibverbs `ibv_open_xrcd(3)`, `ibv_create_srq_ex(3)`, `ibv_open_qp(3)`).
//!
//! XRC splits an RC connection's two halves into two QP types and shares the receive
//! side: an *XRC send QP* (initiator, `IBV_QPT_XRC_SEND`) has a send queue only, and
//! each of its work requests names an XRC SRQ at the target
//! (`SendWr::xrc_remote_srqn`), carried in the XRCETH of every request packet; an
//! *XRC receive QP* (target, `IBV_QPT_XRC_RECV`) has no queues, no PD and no CQs of
//! its own and belongs to an *XRC domain*. It runs RC's responder (PSNs, ACKs, NAKs,
//! duplicates, READ and ATOMIC resources) and delivers each incoming SEND to the XRC
//! SRQ the packet names, which must be of the same domain; the receive completes on
//! that SRQ's CQ, with the receive QP's number in `qp_num`. The PD in which a request's
//! keys are checked, the receive WQE's L_Keys and an RDMA request's R_Key alike, is the
//! named XRC SRQ's (the receive QP has none).
//!
//! A request naming an SRQ that does not exist, is not an XRC SRQ, or belongs to
//! another domain is an invalid request (NAK Invalid Request: the initiator's WR
//! completes with `REM_INV_REQ_ERR`; the receive QP raises `QP_REQ_ERR` and goes to the
//! error state), as is a MIDDLE or LAST packet naming another SRQ than its message's
//! FIRST.
//!
//! Domains are opened by inode (`ibv_open_xrcd` with a file's `fd`) or privately
//! (`fd == -1`); each open takes a reference, the last close destroys the domain, which
//! is EBUSY while an XRC SRQ or XRC receive QP belongs to it. An XRC receive QP is
//! created by one user of the domain and opened by others (`ibv_open_qp`); it lives
//! until every holder has destroyed its handle.

use std::collections::HashMap;

use verbs_api::{Error, Result, XrcdId, XrcdOpen};

/// One XRC domain.
#[derive(Debug)]
struct Domain {
    /// Opens not yet closed.
    refs: u32,
    /// The inode it is tied to, if any.
    inode: Option<u64>,
    /// XRC SRQs and XRC receive QPs that belong to it.
    users: u32,
}

/// The device's XRC domains.
#[derive(Debug, Default)]
pub(crate) struct XrcdTable {
    domains: HashMap<u32, Domain>,
    by_inode: HashMap<u64, u32>,
    next: u32,
}

impl XrcdTable {
    /// `ibv_open_xrcd` (man page `ibv_open_xrcd(3)`; the kernel's `ib_uverbs_open_xrcd`
    /// rules): an inode with a domain is joined (EINVAL with `O_EXCL`); an inode
    /// without one gets a new one with `O_CREAT` (EINVAL without); no inode (`fd ==
    /// -1`) always makes a private domain.
    pub(crate) fn open(&mut self, open: &XrcdOpen) -> Result<XrcdId> {
        if let Some(inode) = open.inode {
            if let Some(&id) = self.by_inode.get(&inode) {
                if open.create && open.exclusive {
                    return Err(Error::InvalidArgument(
                        "O_EXCL: the inode has an XRC domain already",
                    ));
                }
                let d = self.domains.get_mut(&id).expect("indexed domains exist");
                d.refs += 1;
                return Ok(XrcdId(id));
            }
            if !open.create {
                return Err(Error::InvalidArgument(
                    "the inode has no XRC domain and O_CREAT is not set",
                ));
            }
        }
        self.next += 1;
        while self.domains.contains_key(&self.next) || self.next == 0 {
            self.next = self.next.wrapping_add(1);
        }
        let id = self.next;
        self.domains.insert(
            id,
            Domain {
                refs: 1,
                inode: open.inode,
                users: 0,
            },
        );
        if let Some(inode) = open.inode {
            self.by_inode.insert(inode, id);
        }
        Ok(XrcdId(id))
    }

    /// `ibv_close_xrcd`: drops a reference; the last one destroys the domain, EBUSY
    /// while it has SRQs or receive QPs (the reference is then kept).
    pub(crate) fn close(&mut self, xrcd: XrcdId) -> Result<()> {
        let d = self
            .domains
            .get_mut(&xrcd.0)
            .ok_or(Error::InvalidArgument("no such XRC domain"))?;
        if d.refs > 1 {
            d.refs -= 1;
            return Ok(());
        }
        if d.users > 0 {
            return Err(Error::Busy(
                "the XRC domain has XRC SRQs or XRC receive QPs",
            ));
        }
        if let Some(inode) = d.inode {
            self.by_inode.remove(&inode);
        }
        self.domains.remove(&xrcd.0);
        Ok(())
    }

    /// Whether `xrcd` is an open domain.
    pub(crate) fn exists(&self, xrcd: XrcdId) -> bool {
        self.domains.contains_key(&xrcd.0)
    }

    /// Counts one more (`delta` 1) or one fewer (-1) SRQ or QP of `xrcd`.
    pub(crate) fn user(&mut self, xrcd: XrcdId, delta: i32) {
        if let Some(d) = self.domains.get_mut(&xrcd.0) {
            d.users = d.users.saturating_add_signed(delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_domains_are_shared_private_ones_are_not() {
        let mut t = XrcdTable::default();
        let file = |create, exclusive| XrcdOpen {
            inode: Some(7),
            create,
            exclusive,
        };
        assert_eq!(t.open(&file(false, false)).unwrap_err().errno(), 22);
        let a = t.open(&file(true, false)).unwrap();
        assert_eq!(t.open(&file(false, false)).unwrap(), a);
        assert_eq!(t.open(&file(true, true)).unwrap_err().errno(), 22);
        let p = XrcdOpen {
            inode: None,
            create: true,
            exclusive: false,
        };
        let (p1, p2) = (t.open(&p).unwrap(), t.open(&p).unwrap());
        assert!(p1 != p2 && p1 != a);
        // Two references on `a`: the first close keeps it.
        t.user(a, 1);
        t.close(a).unwrap();
        assert!(t.exists(a));
        assert_eq!(t.close(a).unwrap_err().errno(), 16, "EBUSY with a user");
        t.user(a, -1);
        t.close(a).unwrap();
        assert!(!t.exists(a));
        assert_eq!(t.close(a).unwrap_err().errno(), 22);
        // The inode is free again: without O_CREAT it has no domain.
        assert_eq!(t.open(&file(false, false)).unwrap_err().errno(), 22);
    }
}
