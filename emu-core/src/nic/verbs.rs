//! [`Device`] for [`EmuDevice`]: each verb takes the engine's lock, calls the engine
//! and sends what it wants sent (see `transmit`).

use std::time::{Duration, Instant};

use verbs_api::{
    AccessFlags, AhAttr, AhId, AsyncEvent, AtomicCap, ChannelId, CqId, Device, DeviceAttr,
    DeviceCapFlags, DeviceCapFlagsEx, Error, Gid, MemBuf, MrInfo, MwBind, MwId, MwInfo, MwType,
    PdId, PortAttr, PostError, QpAttr, QpAttrMask, QpInitAttr, RecvWr, ReregMrFlags, Result,
    SendWr, SrqAttr, SrqAttrMask, SrqId, WcFlags, WorkCompletion,
};

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{node_guid, EmuDevice, EMU_VENDOR_ID};
use crate::engine::{self, Engine, GSI_QPN};
use crate::notify::Notifier;

/// The glue every verb goes through.
impl EmuDevice {
    pub(super) fn with_engine<R>(&self, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        self.inner.with_engine(f)
    }

    /// Tells the link whether to read each datagram's TOS byte: while the device has
    /// UD QPs, whose receives show it in the GRH (IBTA 8.3, Annex A17.4.5.1); other
    /// receives need not pay for the control message.
    pub(super) fn receive_traffic_class(&self) {
        let link = &self.inner.link;
        // Under the engine's lock, so that two threads' creates and destroys leave the
        // link as the last of them left the engine.
        self.with_engine(|e, _| link.receive_traffic_class(e.has_ud_qps()));
    }

    /// [`EmuDevice::with_engine`] for a verb that creates, changes or posts: EIO once
    /// the device had a fatal error (manual 6.1.9; see [`Engine::fail_device`]).
    pub(super) fn live<R>(&self, f: impl FnOnce(&mut Engine, Instant) -> Result<R>) -> Result<R> {
        self.inner.with_engine(|e, now| {
            e.check_alive()?;
            f(e, now)
        })
    }

    /// [`EmuDevice::live`] for the post verbs: the first WR is the one not posted. What
    /// the post makes is sent at once unless `may_defer` and the device allows it (see
    /// `Inner::may_defer`).
    pub(super) fn live_post(
        &self,
        may_defer: bool,
        f: impl FnOnce(&mut Engine, Instant) -> std::result::Result<(), PostError>,
    ) -> std::result::Result<(), PostError> {
        let inner = &self.inner;
        let _at = inner.at_verbs(&inner.posts);
        let mut core = inner.core.lock();
        let now = inner.link.now();
        let r = core
            .engine
            .check_alive()
            .map_err(|error| PostError { index: 0, error })
            .and_then(|()| f(&mut core.engine, now));
        inner.flush(&mut core, now, may_defer && inner.may_defer());
        if core.holds_packets() {
            super::deferred::left_in(inner);
        }
        super::transmit::drain_notes(&mut core);
        inner.unlock_waking(core);
        r
    }

    /// Destroys QP `qpn` as closing its verbs context does (the kernel's cleanup of
    /// a closed uverbs file): it is detached from its multicast groups first, where
    /// `ibv_destroy_qp` would refuse with EBUSY, and a group it was the last member of
    /// is left on the link.
    pub fn release_qp(&self, qpn: u32) -> Result<()> {
        let groups = self.with_engine(|e, _| e.mcast_groups_of(qpn));
        for g in groups {
            self.detach_mcast(qpn, &g, 0)?;
        }
        self.destroy_qp(qpn)
    }

    /// Joins `gid` on the link: the IPv4 group of an IPv4-mapped MGID, or the IPv6
    /// group that is the MGID (ff00::/8), on a device of the group's family.
    fn join_group(&self, gid: &Gid) -> Result<()> {
        let group = super::ip_of(gid);
        if group.is_ipv4() != self.inner.cfg.ip.is_ipv4() {
            return Err(Error::Unsupported(
                "a multicast group of the other address family than the device's",
            ));
        }
        self.inner
            .link
            .join_multicast_group(group)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::Unsupported => {
                    Error::Unsupported("this link does not carry multicast")
                }
                _ => Error::Os {
                    errno: e.raw_os_error().unwrap_or(5),
                    context: "join the multicast group",
                },
            })
    }
}

impl Device for EmuDevice {
    fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        let l = self.inner.cfg.limits;
        let guid = node_guid(self.inner.cfg.ip);
        Ok(DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").into(),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: l.max_mr_size,
            page_size_cap: 0xFFFF_F000,
            vendor_id: EMU_VENDOR_ID,
            max_qp: l.max_qp,
            max_qp_wr: l.max_qp_wr,
            max_sge: l.max_sge,
            max_sge_rd: l.max_sge,
            max_cq: l.max_cq,
            max_cqe: l.max_cqe,
            max_mr: l.max_mr,
            max_pd: l.max_pd,
            max_mw: l.max_mw,
            max_ah: l.max_ah,
            max_srq: l.max_srq,
            max_srq_wr: l.max_srq_wr,
            max_srq_sge: l.max_srq_sge,
            max_mcast_grp: l.max_mcast_grp,
            max_mcast_qp_attach: l.max_mcast_qp_attach,
            max_total_mcast_qp_attach: l.max_total_mcast_qp_attach,
            max_qp_rd_atom: l.max_qp_rd_atom,
            max_res_rd_atom: l.max_qp_rd_atom * 1024,
            max_qp_init_rd_atom: l.max_qp_init_rd_atom,
            atomic_cap: AtomicCap::Hca,
            max_pkeys: l.pkey_tbl_len as u16,
            phys_port_cnt: 1,
            // PORT_ACTIVE is generated (manual 6.1.10); alternate paths migrate
            // automatically (engine module `apm`); the port counts P_Key and Q_Key
            // violations; RNR NAKs are sent (module `rnr`);
            // `modify_srq` resizes; windows of type 1 and 2B (module `mw`); XRC
            // (engine module `xrc`).
            device_cap_flags: DeviceCapFlags::BAD_PKEY_CNTR
                | DeviceCapFlags::XRC
                | DeviceCapFlags::BAD_QKEY_CNTR
                | DeviceCapFlags::PORT_ACTIVE_EVENT
                | DeviceCapFlags::AUTO_PATH_MIG
                | DeviceCapFlags::RC_RNR_NAK_GEN
                | DeviceCapFlags::SRQ_RESIZE
                | DeviceCapFlags::MEM_WINDOW
                | DeviceCapFlags::MEM_WINDOW_TYPE_2B,
            // IBTA 1.5 FLUSH (both placement types: the emulator's memory is the
            // placement target) and ATOMIC WRITE, as kernel rxe since 6.2.
            device_cap_flags_ex: DeviceCapFlagsEx::FLUSH_GLOBAL
                | DeviceCapFlagsEx::FLUSH_PERSISTENT
                | DeviceCapFlagsEx::ATOMIC_WRITE,
            ..DeviceAttr::default()
        })
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        self.inner.core.lock().engine.query_port(port)
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.inner.core.lock().engine.query_gid(port, index)
    }

    fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        self.inner.core.lock().engine.query_pkey(port, index)
    }

    fn alloc_pd(&self) -> Result<PdId> {
        self.live(|e, _| e.alloc_pd())
    }

    fn dealloc_pd(&self, p: PdId) -> Result<()> {
        self.with_engine(|e, _| e.dealloc_pd(p))
    }

    fn reg_mr(
        &self,
        p: PdId,
        buf: &MemBuf,
        offset: usize,
        length: usize,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        self.live(|e, _| e.reg_mr(p, buf, offset, length, access))
    }

    fn dereg_mr(&self, lkey: u32) -> Result<()> {
        self.with_engine(|e, _| e.dereg_mr(lkey))
    }

    fn create_comp_channel(&self) -> Result<ChannelId> {
        let id = self.inner.next_channel.fetch_add(1, Ordering::Relaxed) as u32;
        self.inner
            .channels
            .lock()
            .insert(id, Arc::new(Notifier::new()?));
        Ok(ChannelId(id))
    }

    fn destroy_comp_channel(&self, channel: ChannelId) -> Result<()> {
        if self
            .inner
            .cq_channel
            .lock()
            .values()
            .any(|c| *c == channel.0)
        {
            return Err(Error::Busy("a CQ uses the channel"));
        }
        self.inner
            .channels
            .lock()
            .remove(&channel.0)
            .map(|_| ())
            .ok_or(Error::InvalidArgument("no such channel"))
    }

    fn get_cq_event(&self, channel: ChannelId, timeout: Option<Duration>) -> Result<CqId> {
        let ch = self
            .inner
            .channels
            .lock()
            .get(&channel.0)
            .cloned()
            .ok_or(Error::InvalidArgument("no such channel"))?;
        // A call that does not wait (a program that learns of events from the fd, with
        // O_NONBLOCK) only takes what is there.
        if self.inner.link.waitable() && timeout != Some(Duration::ZERO) {
            // The CM agent waits on QP1's channel all the time: it leaves the socket
            // to the device thread and the application (see `Engine::cq_armed`).
            let gsi = {
                let core = self.inner.core.lock();
                let map = self.inner.cq_channel.lock();
                map.iter()
                    .any(|(&c, &chan)| chan == channel.0 && core.engine.cq_is_gsi(CqId(c)))
            };
            if !gsi {
                return self.wait_receiving(&ch, timeout);
            }
        }
        self.wait(&ch, timeout)
    }

    fn comp_channel_fd(&self, channel: ChannelId) -> Result<i32> {
        self.inner
            .channels
            .lock()
            .get(&channel.0)
            .map(|c| c.fd())
            .ok_or(Error::InvalidArgument("no such channel"))
    }

    fn create_cq_with_vector(
        &self,
        cqe: u32,
        channel: Option<ChannelId>,
        comp_vector: u32,
    ) -> Result<CqId> {
        if comp_vector >= self.num_comp_vectors() {
            return Err(Error::InvalidArgument(
                "comp_vector is not below num_comp_vectors",
            ));
        }
        if let Some(ch) = channel {
            if !self.inner.channels.lock().contains_key(&ch.0) {
                return Err(Error::InvalidArgument("no such channel"));
            }
        }
        let c = self.live(|e, _| e.create_cq(cqe))?;
        if let Some(ch) = channel {
            self.inner.cq_channel.lock().insert(c.0, ch.0);
        }
        Ok(c)
    }

    /// One: the device thread raises every completion event.
    fn num_comp_vectors(&self) -> u32 {
        1
    }

    fn destroy_cq(&self, c: CqId) -> Result<()> {
        self.with_engine(|e, _| e.destroy_cq(c))?;
        // An event of the CQ still unread on its channel goes with it, as the kernel's
        // ib_uverbs_release_ucq drops it: nobody could acknowledge it any more.
        let channel = self.inner.cq_channel.lock().remove(&c.0);
        if let Some(ch) = channel.and_then(|ch| self.inner.channels.lock().get(&ch).cloned()) {
            while ch.try_pop_where(&|e| *e == c).is_some() {}
        }
        Ok(())
    }

    fn resize_cq(&self, c: CqId, cqe: u32) -> Result<()> {
        self.live(|e, _| e.resize_cq(c, cqe))
    }

    fn poll_cq(&self, c: CqId, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        self.inner.poll_cq(c, max, out)
    }

    fn req_notify_cq(&self, c: CqId, solicited_only: bool) -> Result<()> {
        self.live(|e, _| e.req_notify_cq(c, solicited_only))?;
        // The application will wait for the event, not poll: a napping device thread
        // must go back to the socket now (see `Inner::run`). Unparked even when it is
        // not napping yet: it may be about to, having looked before the arming. Not
        // when the application waits in `get_cq_event`, which receives itself.
        if let Some(t) = &self.thread {
            if !self.inner.waiter_mode.load(Ordering::Acquire) {
                t.thread().unpark();
            }
        }
        Ok(())
    }

    fn create_qp(&self, init: &QpInitAttr) -> Result<u32> {
        let qpn = self.live(|e, _| e.create_qp(*init))?;
        self.receive_traffic_class();
        Ok(qpn)
    }

    fn modify_qp(&self, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.live(|e, now| e.modify_qp(now, qpn, attr, mask))?;
        // A QP reset or (re)connected learns its peer's source port again.
        if mask.contains(QpAttrMask::STATE)
            && matches!(
                attr.qp_state,
                verbs_api::QpState::Reset | verbs_api::QpState::Init | verbs_api::QpState::Rtr
            )
        {
            self.inner.core.lock().peers.remove(&qpn);
        }
        Ok(())
    }

    fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr)> {
        self.inner.core.lock().engine.query_qp(qpn)
    }

    fn destroy_qp(&self, qpn: u32) -> Result<()> {
        // An XRC receive QP outlives a destroy while another holder has it open.
        let gone = self.with_engine(|e, _| e.destroy_qp(qpn).map(|()| e.query_qp(qpn).is_err()))?;
        if !gone {
            return Ok(());
        }
        self.inner.core.lock().peers.remove(&qpn);
        self.receive_traffic_class();
        Ok(())
    }

    fn post_send(&self, qpn: u32, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        // A MAD on QP1 is never held back for a batch: the CM sends one at a time,
        // waits for its answer, and sends its last (a DREQ as the process exits) with
        // nothing after it that would carry it out.
        self.live_post(qpn != GSI_QPN, |e, now| e.post_send(now, qpn, wrs))
    }

    fn post_recv(&self, qpn: u32, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        self.live_post(true, |e, now| e.post_recv(now, qpn, wrs))
    }

    fn rereg_mr(
        &self,
        lkey: u32,
        flags: ReregMrFlags,
        p: Option<PdId>,
        range: Option<(&MemBuf, usize, usize)>,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        self.live(|e, _| e.rereg_mr(lkey, flags, p, range, access))
    }

    fn alloc_mw(&self, p: PdId, mw_type: MwType) -> Result<MwInfo> {
        let (id, rkey) = self.live(|e, _| e.alloc_mw(p, mw_type))?;
        Ok(MwInfo { id, rkey, mw_type })
    }

    fn dealloc_mw(&self, mw: MwId) -> Result<()> {
        self.with_engine(|e, _| e.dealloc_mw(mw))
    }

    fn bind_mw(&self, qpn: u32, mw: MwId, bind: &MwBind) -> Result<u32> {
        self.live(|e, now| e.bind_mw(now, qpn, mw, bind))
    }

    fn create_srq(&self, p: PdId, attr: &SrqAttr) -> Result<SrqId> {
        self.live(|e, _| e.create_srq(p, *attr))
    }

    fn modify_srq(&self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.live(|e, _| e.modify_srq(srq, attr, mask))
    }

    fn query_srq(&self, srq: SrqId) -> Result<SrqAttr> {
        self.inner.core.lock().engine.query_srq(srq)
    }

    fn destroy_srq(&self, srq: SrqId) -> Result<()> {
        self.with_engine(|e, _| e.destroy_srq(srq))
    }

    fn post_srq_recv(&self, srq: SrqId, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        self.live_post(true, |e, now| e.post_srq_recv(now, srq, wrs))
    }

    fn open_xrcd(&self, open: &verbs_api::XrcdOpen) -> Result<verbs_api::XrcdId> {
        self.live(|e, _| e.open_xrcd(open))
    }

    fn close_xrcd(&self, xrcd: verbs_api::XrcdId) -> Result<()> {
        self.with_engine(|e, _| e.close_xrcd(xrcd))
    }

    fn create_xrc_srq(
        &self,
        p: PdId,
        xrcd: verbs_api::XrcdId,
        cq: CqId,
        attr: &SrqAttr,
    ) -> Result<SrqId> {
        self.live(|e, _| e.create_xrc_srq(p, xrcd, cq, *attr))
    }

    fn get_srq_num(&self, srq: SrqId) -> Result<u32> {
        self.inner.core.lock().engine.get_srq_num(srq)
    }

    fn create_xrc_recv_qp(&self, xrcd: verbs_api::XrcdId) -> Result<u32> {
        self.live(|e, _| e.create_xrc_recv_qp(xrcd))
    }

    fn open_qp(&self, xrcd: verbs_api::XrcdId, qpn: u32) -> Result<()> {
        self.live(|e, _| e.open_qp(xrcd, qpn))
    }

    fn create_ah(&self, p: PdId, attr: &AhAttr) -> Result<AhId> {
        self.live(|e, _| e.create_ah(p, attr))
    }

    fn destroy_ah(&self, ah: AhId) -> Result<()> {
        self.with_engine(|e, _| e.destroy_ah(ah))
    }

    /// [`engine::init_ah_from_wc`] over the port's GID table (read only when the WC has
    /// a GRH: without one libibverbs looks at no table, nor at the port).
    fn init_ah_from_wc(&self, port_num: u8, wc: &WorkCompletion, grh: &[u8]) -> Result<AhAttr> {
        let gids = if wc.wc_flags.contains(WcFlags::GRH) {
            let core = self.inner.core.lock();
            let len = core.engine.query_port(port_num)?.gid_tbl_len;
            (0..len)
                .map(|i| core.engine.query_gid(port_num, i))
                .collect::<Result<Vec<Gid>>>()?
        } else {
            Vec::new()
        };
        engine::init_ah_from_wc(port_num, wc, grh, &gids)
    }

    fn attach_mcast(&self, qpn: u32, gid: &Gid, lid: u16) -> Result<()> {
        let _serial = self.inner.mcast.lock();
        let fresh = self.live(|e, _| {
            let fresh = !e.has_mcast_group(gid);
            e.attach_mcast(qpn, gid, lid).map(|()| fresh)
        })?;
        if fresh {
            if let Err(err) = self.join_group(gid) {
                let _ = self.with_engine(|e, _| e.detach_mcast(qpn, gid, lid));
                return Err(err);
            }
        }
        Ok(())
    }

    fn detach_mcast(&self, qpn: u32, gid: &Gid, lid: u16) -> Result<()> {
        let _serial = self.inner.mcast.lock();
        let gone = self.with_engine(|e, _| {
            e.detach_mcast(qpn, gid, lid)
                .map(|()| !e.has_mcast_group(gid))
        })?;
        if gone {
            self.inner.link.leave_multicast_group(super::ip_of(gid));
        }
        Ok(())
    }

    fn get_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        self.wait(&self.inner.events, timeout)
    }

    fn async_fd(&self) -> Result<i32> {
        Ok(self.inner.events.fd())
    }

    fn qpn_block(&self) -> u8 {
        self.inner.core.lock().engine.qpn_block()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::EmuConfig;
    use std::net::Ipv4Addr;

    /// The 40 bytes a UD receive buffer starts with for a datagram from `src` to `dst`
    /// (the IPv4 layout: 20 zero bytes, then the IPv4 header).
    fn grh(src: Ipv4Addr, dst: Ipv4Addr) -> [u8; 40] {
        let mut out = [0u8; 40];
        emu_wire::GrhRepr::for_ipv4(src, dst, 20 + 8 + 12 + 8 + 4)
            .emit(&mut emu_wire::GrhPacket::new_unchecked(&mut out[..]));
        out
    }

    /// `Device::init_ah_from_wc` and `create_ah_from_wc` (manual 3.6.11, 3.6.12) read
    /// the device's GID table: a GRH addressed to one of its GIDs answers the sender
    /// from that GID's index; one addressed elsewhere, a short one, one on another
    /// port, and a WC without IBV_WC_GRH (whose vector is not global, which RoCE
    /// refuses) are EINVAL and create no AH.
    #[test]
    fn ah_from_wc_reads_the_device_gid_table() {
        const EINVAL: i32 = 22;
        let dev = EmuDevice::open(EmuConfig {
            ip: (Ipv4Addr::LOCALHOST).into(),
            port: 0,
            ..EmuConfig::default()
        })
        .expect("open a device on loopback");
        let pd = dev.alloc_pd().unwrap();
        let peer = Ipv4Addr::new(10, 0, 0, 9);
        let mut wc = WorkCompletion::new(
            1,
            verbs_api::WcStatus::Success,
            verbs_api::WcOpcode::Recv,
            5,
        );
        (wc.wc_flags, wc.src_qp, wc.sl) = (WcFlags::GRH, 0x77, 2);

        let ours = grh(peer, Ipv4Addr::LOCALHOST);
        let attr = dev.init_ah_from_wc(1, &wc, &ours).unwrap();
        assert!(attr.is_global);
        assert_eq!(
            (attr.grh.dgid, attr.grh.sgid_index, attr.port_num, attr.sl),
            (Gid::from_ipv4(peer), 0, 1, 2)
        );
        assert_eq!(dev.query_gid(1, 0).unwrap(), dev.gid());
        let ah = dev.create_ah_from_wc(pd, &wc, &ours, 1).unwrap();
        let errno = |r: Result<AhAttr>| r.expect_err("accepted").errno();
        let ah_errno = |r: Result<AhId>| r.expect_err("created an AH").errno();
        // Addressed to a GID the device does not have.
        let theirs = grh(peer, Ipv4Addr::new(10, 0, 0, 7));
        assert_eq!(errno(dev.init_ah_from_wc(1, &wc, &theirs)), EINVAL);
        assert_eq!(ah_errno(dev.create_ah_from_wc(pd, &wc, &theirs, 1)), EINVAL);
        // Shorter than a GRH, not a GRH at all, or another port.
        assert_eq!(errno(dev.init_ah_from_wc(1, &wc, &ours[..39])), EINVAL);
        assert_eq!(errno(dev.init_ah_from_wc(1, &wc, &[0; 40])), EINVAL);
        assert_eq!(errno(dev.init_ah_from_wc(2, &wc, &ours)), EINVAL);
        // No GRH in the WC: a local (non-global) vector, which a RoCE AH cannot use.
        wc.wc_flags = WcFlags::empty();
        assert!(!dev.init_ah_from_wc(1, &wc, &ours).unwrap().is_global);
        assert_eq!(ah_errno(dev.create_ah_from_wc(pd, &wc, &ours, 1)), EINVAL);
        // Only the first AH exists: the PD is busy until it goes.
        dev.destroy_ah(ah).unwrap();
        dev.dealloc_pd(pd).unwrap();
    }
}
