//! The verbs themselves: the [`Device`] trait that every backend implements (the
//! emulator's `EmuDevice`, the hardware `HwDevice`), so that code written once against
//! it runs on either by changing only how the device is opened.
//!
//! The trait is object-safe and names objects by number, as the wire and the C API do:
//! a PD or CQ by a small handle, an MR by its keys, a QP by its QP number. Errors are
//! those libibverbs returns (manual chapter 3), as [`Error`](crate::Error) values with their errno.

use std::time::Duration;

use crate::{
    AccessFlags, AhAttr, AsyncEvent, DeviceAttr, Gid, MemBuf, MwBindInfo, MwType, PortAttr,
    PostError, QpAttr, QpAttrMask, QpCap, QpType, RecvWr, ReregMrFlags, Result, SendFlags, SendWr,
    SrqAttr, SrqAttrMask, WorkCompletion,
};

/// A protection domain (`struct ibv_pd`, manual 3.4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// A completion queue (`struct ibv_cq`, manual 3.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// A completion channel (`struct ibv_comp_channel`, manual 3.3.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelId(pub u32);

/// A shared receive queue (`struct ibv_srq`, manual 3.4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// An XRC domain (`struct ibv_xrcd`, manual 3.4.8; man page `ibv_open_xrcd(3)`): the
/// scope in which XRC receive QPs and XRC SRQs are shared, so that an XRC receive QP
/// delivers to any XRC SRQ of its domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct XrcdId(pub u32);

/// How `ibv_open_xrcd` opens a domain (`struct ibv_xrcd_init_attr`: `fd` and `oflags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct XrcdOpen {
    /// The inode the domain is tied to (the file of `fd`; the caller reduces its device
    /// and inode numbers to one value), or `None` for `fd == -1`: a private domain that
    /// no other open joins.
    pub inode: Option<u64>,
    /// `O_CREAT`: make the domain if the inode has none yet (without it, opening an
    /// inode with no domain is EINVAL).
    pub create: bool,
    /// `O_EXCL` (with `O_CREAT`): EINVAL if the inode has a domain already.
    pub exclusive: bool,
}

/// An address handle (`struct ibv_ah`, manual 3.4.15).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct AhId(pub u32);

/// A memory window (`struct ibv_mw`, manual 2.3.5; man page `ibv_alloc_mw(3)`). Its rkey changes with every bind,
/// so it is named by a handle of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MwId(pub u32);

/// A memory window as `ibv_alloc_mw` returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwInfo {
    /// The window's handle.
    pub id: MwId,
    /// Its current remote key (changed by every bind).
    pub rkey: u32,
    /// Its type.
    pub mw_type: MwType,
}

/// `struct ibv_mw_bind` (man page `ibv_bind_mw(3)`): binding a type 1 window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwBind {
    /// Returned in the bind's work completion.
    pub wr_id: u64,
    /// SIGNALED (a completion even when the QP does not signal every WR), FENCE.
    pub send_flags: SendFlags,
    /// The MR, range and access the window is bound to (length 0 unbinds).
    pub bind_info: MwBindInfo,
}

/// A registered memory region as `ibv_reg_mr` returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrInfo {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// Local key, for SGEs.
    pub lkey: u32,
    /// Remote key, for peers.
    pub rkey: u32,
}

/// What `ibv_create_qp` takes (`struct ibv_qp_init_attr`, manual 3.4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInitAttr {
    /// The protection domain.
    pub pd: PdId,
    /// The CQ for send completions.
    pub send_cq: CqId,
    /// The CQ for receive completions.
    pub recv_cq: CqId,
    /// The transport service.
    pub qp_type: QpType,
    /// Queue sizes.
    pub cap: QpCap,
    /// Every send WR completes with a work completion.
    pub sq_sig_all: bool,
    /// The shared receive queue the QP takes its receives from (then `post_recv` on
    /// the QP is EINVAL and `cap.max_recv_wr` is ignored).
    pub srq: Option<SrqId>,
}

impl QpInitAttr {
    /// The attributes most QPs are created with: `pd`, one CQ `cq` for both send and
    /// receive completions, `qp_type` and the queue sizes `cap`; no SRQ, and
    /// `sq_sig_all` off, so that only send WRs posted with [`SendFlags::SIGNALED`]
    /// complete with a work completion. That is what a C program gets from an
    /// `ibv_qp_init_attr` it zeroed and then filled in the same four fields of
    /// (`srq` NULL, `sq_sig_all` 0). The builders [`recv_cq`](Self::recv_cq),
    /// [`srq`](Self::srq) and [`sq_sig_all`](Self::sq_sig_all) change the rest.
    ///
    /// ```
    /// use verbs_api::{CqId, PdId, QpCap, QpInitAttr, QpType};
    /// let cap = QpCap { max_send_wr: 16, max_recv_wr: 16, ..QpCap::default() };
    /// let init = QpInitAttr::new(PdId(1), CqId(2), QpType::Rc, cap).sq_sig_all(true);
    /// assert_eq!((init.send_cq, init.recv_cq, init.srq), (CqId(2), CqId(2), None));
    /// assert!(init.sq_sig_all);
    /// ```
    pub fn new(pd: PdId, cq: CqId, qp_type: QpType, cap: QpCap) -> Self {
        QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            qp_type,
            cap,
            sq_sig_all: false,
            srq: None,
        }
    }

    /// The same attributes with receive completions going to `cq` (send completions
    /// stay on the CQ given to [`new`](Self::new)).
    #[must_use]
    pub fn recv_cq(self, cq: CqId) -> Self {
        QpInitAttr {
            recv_cq: cq,
            ..self
        }
    }

    /// The same attributes with the QP taking its receives from `srq` (an [`SrqId`],
    /// or an `Option` of one, where `None` means the QP's own receive queue).
    #[must_use]
    pub fn srq(self, srq: impl Into<Option<SrqId>>) -> Self {
        QpInitAttr {
            srq: srq.into(),
            ..self
        }
    }

    /// The same attributes with `sq_sig_all` set to `all`: `true` makes every send WR
    /// complete with a work completion, signaled or not.
    #[must_use]
    pub fn sq_sig_all(self, all: bool) -> Self {
        QpInitAttr {
            sq_sig_all: all,
            ..self
        }
    }
}

/// One RDMA device, opened (`struct ibv_context`). Every method may be called from any
/// thread.
pub trait Device: Send + Sync {
    /// The device name (`ibv_get_device_name`), e.g. `emu0` or `rxe0`.
    fn name(&self) -> &str;

    /// `ibv_query_device` (manual 3.3.1).
    fn query_device(&self) -> Result<DeviceAttr>;
    /// `ibv_query_port`; ports are numbered from 1 (EINVAL otherwise).
    fn query_port(&self, port: u8) -> Result<PortAttr>;
    /// `ibv_query_gid`.
    fn query_gid(&self, port: u8, index: u32) -> Result<Gid>;
    /// `ibv_query_pkey`.
    fn query_pkey(&self, port: u8, index: u16) -> Result<u16>;

    /// `ibv_alloc_pd`.
    fn alloc_pd(&self) -> Result<PdId>;
    /// `ibv_dealloc_pd`: EBUSY while MRs or QPs use it.
    fn dealloc_pd(&self, pd: PdId) -> Result<()>;

    /// `ibv_reg_mr` over `length` bytes of `buf` from `offset`.
    fn reg_mr(
        &self,
        pd: PdId,
        buf: &MemBuf,
        offset: usize,
        length: usize,
        access: AccessFlags,
    ) -> Result<MrInfo>;
    /// `ibv_dereg_mr`: EBUSY while memory windows are bound to the region.
    fn dereg_mr(&self, lkey: u32) -> Result<()>;
    /// `ibv_rereg_mr` (man page `ibv_rereg_mr(3)`): changes what `flags` names: the PD
    /// (`CHANGE_PD`), the range (`CHANGE_TRANSLATION`: `range` is the new buffer,
    /// offset and length) and the access (`CHANGE_ACCESS`). Returns the region with
    /// its new keys.
    fn rereg_mr(
        &self,
        lkey: u32,
        flags: ReregMrFlags,
        pd: Option<PdId>,
        range: Option<(&MemBuf, usize, usize)>,
        access: AccessFlags,
    ) -> Result<MrInfo>;

    /// `ibv_alloc_mw` (man page `ibv_alloc_mw(3)`; manual 2.3.5).
    fn alloc_mw(&self, pd: PdId, mw_type: MwType) -> Result<MwInfo>;
    /// `ibv_dealloc_mw`.
    fn dealloc_mw(&self, mw: MwId) -> Result<()>;
    /// `ibv_bind_mw` (man page `ibv_bind_mw(3)`): binds a type 1 window through the send queue of
    /// `qpn`; returns the window's new rkey. The bind completes on the QP's send CQ
    /// (`IBV_WC_BIND_MW`, or `MW_BIND_ERR`). A window that does not exist: the emulator
    /// posts the bind and completes it with `MW_BIND_ERR`, as kernel rxe does for an
    /// R_Key that names no window; a backend that names windows by their `ibv_mw`
    /// refuses it (EINVAL).
    fn bind_mw(&self, qpn: u32, mw: MwId, bind: &MwBind) -> Result<u32>;

    /// `ibv_create_comp_channel`.
    fn create_comp_channel(&self) -> Result<ChannelId>;
    /// `ibv_destroy_comp_channel`: EBUSY while a CQ uses it.
    fn destroy_comp_channel(&self, channel: ChannelId) -> Result<()>;
    /// `ibv_get_cq_event`: waits (up to `timeout`, forever for `None`) for a CQ on the
    /// channel that was armed with `req_notify_cq` to get a completion. ETIMEDOUT when
    /// the time runs out; EINTR (`Error::Os`) when a signal handler ran in the waiting
    /// thread, as libibverbs' read(2) of the channel gives it to a handler installed
    /// without `SA_RESTART` (the caller decides whether to wait again).
    fn get_cq_event(&self, channel: ChannelId, timeout: Option<Duration>) -> Result<CqId>;
    /// The channel's file descriptor: readable while an event is pending, usable with
    /// poll/epoll (`ibv_comp_channel.fd`).
    fn comp_channel_fd(&self, channel: ChannelId) -> Result<i32>;

    /// `ibv_create_cq` with at least `cqe` entries, optionally on a completion channel,
    /// on completion vector 0.
    fn create_cq(&self, cqe: u32, channel: Option<ChannelId>) -> Result<CqId> {
        self.create_cq_with_vector(cqe, channel, 0)
    }
    /// `ibv_create_cq` with its completion vector (manual 3.3.7: the vector whose
    /// interrupts signal the CQ's events): EINVAL unless `comp_vector` is below
    /// [`num_comp_vectors`](Self::num_comp_vectors).
    fn create_cq_with_vector(
        &self,
        cqe: u32,
        channel: Option<ChannelId>,
        comp_vector: u32,
    ) -> Result<CqId>;
    /// `ibv_context.num_comp_vectors`: how many completion vectors a CQ may choose from
    /// (at least 1 on an open device).
    fn num_comp_vectors(&self) -> u32;
    /// `ibv_destroy_cq`: EBUSY while a QP uses it.
    fn destroy_cq(&self, cq: CqId) -> Result<()>;
    /// `ibv_resize_cq`.
    fn resize_cq(&self, cq: CqId, cqe: u32) -> Result<()>;
    /// `ibv_poll_cq`: appends up to `max` completions to `out`, oldest first.
    fn poll_cq(&self, cq: CqId, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize>;
    /// `ibv_req_notify_cq`.
    fn req_notify_cq(&self, cq: CqId, solicited_only: bool) -> Result<()>;

    /// `ibv_create_qp`: returns the QP number.
    fn create_qp(&self, init: &QpInitAttr) -> Result<u32>;
    /// `ibv_modify_qp`.
    fn modify_qp(&self, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()>;
    /// `ibv_query_qp`.
    fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr)>;
    /// `ibv_destroy_qp`.
    fn destroy_qp(&self, qpn: u32) -> Result<()>;
    /// `ibv_post_send`: on failure, the index of the first WR not posted.
    fn post_send(&self, qpn: u32, wrs: &[SendWr]) -> std::result::Result<(), PostError>;
    /// `ibv_post_recv`: on failure, the index of the first WR not posted.
    fn post_recv(&self, qpn: u32, wrs: &[RecvWr]) -> std::result::Result<(), PostError>;

    /// `ibv_create_srq` (manual 3.4.5); `attr.srq_limit` is ignored.
    fn create_srq(&self, pd: PdId, attr: &SrqAttr) -> Result<SrqId>;
    /// `ibv_modify_srq` (manual 3.4.6): resize (`MAX_WR`) or arm the limit (`LIMIT`).
    fn modify_srq(&self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()>;
    /// `ibv_query_srq` (manual 3.6.2).
    fn query_srq(&self, srq: SrqId) -> Result<SrqAttr>;
    /// `ibv_destroy_srq` (manual 3.4.7): EBUSY while a QP uses it.
    fn destroy_srq(&self, srq: SrqId) -> Result<()>;
    /// `ibv_post_srq_recv` (manual 3.6.6): on failure, the index of the first WR not
    /// posted.
    fn post_srq_recv(&self, srq: SrqId, wrs: &[RecvWr]) -> std::result::Result<(), PostError>;

    /// `ibv_open_xrcd` (manual 3.4.8, man page `ibv_open_xrcd(3)`): opens the XRC
    /// domain tied to `open.inode`, making it when asked, or a private one. Each open
    /// takes a reference that [`Device::close_xrcd`] gives back. EINVAL for an inode
    /// without a domain and no `create`, or one with a domain and `exclusive`.
    /// EOPNOTSUPP where the device has no XRC (the default).
    fn open_xrcd(&self, open: &XrcdOpen) -> Result<XrcdId> {
        let _ = open;
        Err(crate::Error::Unsupported(
            "XRC is not supported by this device",
        ))
    }
    /// `ibv_close_xrcd` (manual 3.4.10): drops one reference; the last one destroys
    /// the domain, which is EBUSY while an XRC SRQ or XRC receive QP belongs to it.
    fn close_xrcd(&self, xrcd: XrcdId) -> Result<()> {
        let _ = xrcd;
        Err(crate::Error::Unsupported(
            "XRC is not supported by this device",
        ))
    }
    /// `ibv_create_srq_ex` with `IBV_SRQT_XRC` (manual 3.4.9): an XRC SRQ in domain
    /// `xrcd` whose receives complete on `cq`; its WQEs' L_Keys, and the R_Keys of the
    /// RDMA requests addressed to it, are checked in `pd`. EINVAL for an unknown PD,
    /// domain or CQ, or sizes as [`Device::create_srq`].
    fn create_xrc_srq(&self, pd: PdId, xrcd: XrcdId, cq: CqId, attr: &SrqAttr) -> Result<SrqId> {
        let _ = (pd, xrcd, cq, attr);
        Err(crate::Error::Unsupported(
            "XRC is not supported by this device",
        ))
    }
    /// `ibv_get_srq_num`: the number an XRC initiator puts in its work requests
    /// ([`SendWr::xrc_remote_srqn`]) to reach this XRC SRQ. EINVAL for an SRQ that is
    /// not an XRC SRQ.
    fn get_srq_num(&self, srq: SrqId) -> Result<u32> {
        let _ = srq;
        Err(crate::Error::Unsupported(
            "XRC is not supported by this device",
        ))
    }
    /// `ibv_create_qp_ex` with `IBV_QPT_XRC_RECV` and `IBV_QP_INIT_ATTR_XRCD`: an XRC
    /// target QP in domain `xrcd`. It has no queues, PD or CQs: the SENDs it receives go
    /// to the XRC SRQ each names. Brought up with `modify_qp` as an RC QP's receive
    /// side; [`Device::destroy_qp`] drops the creator's hold. (An `IBV_QPT_XRC_SEND`
    /// QP is made with [`Device::create_qp`]: a send queue only.)
    fn create_xrc_recv_qp(&self, xrcd: XrcdId) -> Result<u32> {
        let _ = xrcd;
        Err(crate::Error::Unsupported(
            "XRC is not supported by this device",
        ))
    }
    /// `ibv_open_qp` (`struct ibv_qp_open_attr`): takes a hold on the XRC receive QP
    /// `qpn` of domain `xrcd`, made by another user of the domain. The QP lives while
    /// any holder has not destroyed it ([`Device::destroy_qp`] drops one hold). EINVAL
    /// when `qpn` is not an XRC receive QP of that domain.
    fn open_qp(&self, xrcd: XrcdId, qpn: u32) -> Result<()> {
        let _ = (xrcd, qpn);
        Err(crate::Error::Unsupported(
            "XRC is not supported by this device",
        ))
    }

    /// `ibv_create_ah` (manual 3.4.15).
    fn create_ah(&self, pd: PdId, attr: &AhAttr) -> Result<AhId>;
    /// `ibv_destroy_ah` (manual 3.4.16).
    fn destroy_ah(&self, ah: AhId) -> Result<()>;
    /// `ibv_init_ah_from_wc` (manual 3.6.11): the address vector that answers the
    /// sender of the UD receive completion `wc` received on port `port_num`. `grh` is
    /// the first 40 bytes of that receive's buffer (IBTA 11.4: the GRH, or on RoCEv2
    /// over IPv4 20 bytes and then the IPv4 header).
    ///
    /// As libibverbs: `dlid`, `sl` and `src_path_bits` come from the WC's `slid`, `sl`
    /// and `dlid_path_bits`. Without [`WcFlags::GRH`](crate::WcFlags::GRH) in
    /// `wc.wc_flags` the vector is not global (RoCE needs a GRH, so `create_ah` refuses
    /// it). With it, `is_global` is set, `grh.dgid` is the GRH's source GID and
    /// `grh.sgid_index` the index in the port's GID table of the GRH's destination GID
    /// (the GID the datagram was sent to), and the traffic class and flow label are
    /// copied, and so is the received hop limit (IPv4: TTL), as rdma-core does (old
    /// libibverbs 1.x set 0xFF; rxe measured: 64, the sender's). An error (EINVAL on the emulator) when the GRH is
    /// shorter than 40 bytes, is neither layout, or is addressed to a GID that is not
    /// in the table (libibverbs then returns the errno of its GID-table read that ran
    /// past the end).
    fn init_ah_from_wc(&self, port_num: u8, wc: &WorkCompletion, grh: &[u8]) -> Result<AhAttr>;
    /// `ibv_create_ah_from_wc` (manual 3.6.12): an AH in `pd` that answers the sender
    /// of `wc`: [`Device::init_ah_from_wc`] and then [`Device::create_ah`], as
    /// libibverbs composes them.
    fn create_ah_from_wc(
        &self,
        pd: PdId,
        wc: &WorkCompletion,
        grh: &[u8],
        port_num: u8,
    ) -> Result<AhId> {
        let attr = self.init_ah_from_wc(port_num, wc, grh)?;
        self.create_ah(pd, &attr)
    }
    /// `ibv_attach_mcast` (manual 3.6.13): the UD QP receives what is sent to `gid`.
    fn attach_mcast(&self, qpn: u32, gid: &Gid, lid: u16) -> Result<()>;
    /// `ibv_detach_mcast` (manual 3.6.14).
    fn detach_mcast(&self, qpn: u32, gid: &Gid, lid: u16) -> Result<()>;

    /// `ibv_get_async_event`: waits (up to `timeout`) for the next asynchronous event.
    fn get_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent>;
    /// The async event file descriptor (`ibv_context.async_fd`): readable while an
    /// event is pending.
    fn async_fd(&self) -> Result<i32>;

    /// The block of QP numbers this opened device hands out: the top six bits of every
    /// QPN it gives. Several processes open one emulated device the way they open one
    /// kernel rxe device, each with a block of its own, so that a packet reaches the
    /// process that holds its QP; a connection manager numbers its connections in the
    /// same block for the same reason. 0 where one device serves every process (a
    /// kernel driver, the simulated fabric).
    fn qpn_block(&self) -> u8 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap() -> QpCap {
        QpCap {
            max_send_wr: 16,
            max_recv_wr: 8,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }

    #[test]
    fn qp_init_attr_new_is_one_cq_unsignaled_without_srq() {
        let init = QpInitAttr::new(PdId(3), CqId(5), QpType::Uc, cap());
        assert_eq!(
            init,
            QpInitAttr {
                pd: PdId(3),
                send_cq: CqId(5),
                recv_cq: CqId(5),
                qp_type: QpType::Uc,
                cap: cap(),
                sq_sig_all: false,
                srq: None,
            }
        );
    }

    #[test]
    fn qp_init_attr_builders_change_only_their_field() {
        let base = QpInitAttr::new(PdId(3), CqId(5), QpType::Rc, cap());
        assert_eq!(
            base.recv_cq(CqId(7)),
            QpInitAttr {
                recv_cq: CqId(7),
                ..base
            }
        );
        assert_eq!(base.recv_cq(CqId(7)).send_cq, CqId(5));
        assert_eq!(
            base.srq(SrqId(9)),
            QpInitAttr {
                srq: Some(SrqId(9)),
                ..base
            }
        );
        assert_eq!(base.srq(SrqId(9)).srq(None), base);
        assert_eq!(base.srq(Some(SrqId(9))).srq, Some(SrqId(9)));
        assert_eq!(
            base.sq_sig_all(true),
            QpInitAttr {
                sq_sig_all: true,
                ..base
            }
        );
        assert_eq!(base.sq_sig_all(true).sq_sig_all(false), base);
    }
}
