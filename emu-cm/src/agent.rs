//! The GSI agent of one device: its QP1 (see `engine::gsi`), the buffers MADs are
//! received into and sent from, and an address handle per peer, all made through the
//! plain [`Device`] verbs. RoCEv2 carries a MAD as a UD SEND to destination QP 1 with
//! the GSI Q_Key (IBTA 13.5.1, Annex A17), exactly as kernel rxe sends rdma_cm's.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use verbs_api::{
    AhId, ChannelId, Context, CqId, Device, Endpoint, Error, Gid, MemBuf, MrInfo, Mtu, PdId, QpCap,
    QpInitAttr, QpParams, QpType, RecvWr, Result, SendWr, Sge, UdDest, WcStatus, WorkCompletion,
};

use emu_core::engine::{init_ah_from_wc, GRH_LEN, GSI_QKEY, GSI_QPN};
use emu_wire::mad::MAD_LEN;

/// Receive buffers kept posted on QP1.
const RECV_SLOTS: usize = 128;
/// Send buffers, used round-robin (a UD send is on the wire when `post_send` returns
/// on the emulator, so a slot is free again long before it comes round).
const SEND_SLOTS: usize = 64;
/// Bytes per slot: GRH plus MAD, rounded up.
const SLOT: usize = 512;
/// wr_id bit that marks a send.
const SEND_TAG: u64 = 1 << 63;
/// EIO: what the verbs of a device that had a fatal error return.
pub(crate) const EIO: i32 = 5;

/// One device's QP1 and what it needs.
pub(crate) struct Agent {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) gid: Gid,
    /// Where `gid` is in port 1's GID table: the first IPv4-mapped entry when entry
    /// 0 is not one, else 0 (as perftest picks it). A device on both address
    /// families has its interface's link-local address at 0 and its IPv4 one at 1,
    /// as kernel rxe does: the CM works on the IPv4 address, and its MADs and the
    /// QPs it connects send from this index.
    pub(crate) sgid_index: u8,
    pub(crate) ip: IpAddr,
    pub(crate) guid: u64,
    pub(crate) mtu: Mtu,
    /// The device's block of QPNs ([`Device::qpn_block`]): the top bits of the
    /// communication IDs of this device's connections.
    pub(crate) block: u8,
    pd: PdId,
    cq: CqId,
    pub(crate) channel: ChannelId,
    buf: MemBuf,
    mr: MrInfo,
    ahs: HashMap<Gid, AhId>,
    next_send: usize,
    wcs: Vec<WorkCompletion>,
    /// A verb returned EIO: the device is gone (`DEVICE_REMOVAL` was reported).
    pub(crate) dead: bool,
    /// The address was missing from the GID table at the last look (`ADDR_CHANGE`
    /// was reported; re-armed when it comes back).
    pub(crate) addr_gone: bool,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("device", &self.dev.name())
            .field("ip", &self.ip)
            .finish()
    }
}

impl Agent {
    /// Makes QP1 on `dev` and brings it to RTS with every receive buffer posted.
    pub(crate) fn open(dev: Arc<dyn Device>) -> Result<Agent> {
        let sgid_index = Context::new(dev.clone()).default_gid_index()?;
        let gid = dev.query_gid(1, u32::from(sgid_index))?;
        // An IPv4-mapped GID names an IPv4 address, any other an IPv6 one.
        let ip = emu_core::nic::ip_of(&gid);
        let guid = dev.query_device()?.node_guid;
        let mtu = dev.query_port(1)?.active_mtu;
        let dev_block = dev.qpn_block();
        let pd = dev.alloc_pd()?;
        let channel = dev.create_comp_channel()?;
        let cq = dev.create_cq(4 * (RECV_SLOTS + SEND_SLOTS) as u32, Some(channel))?;
        let qpn = dev.create_qp(
            &QpInitAttr::new(
                pd,
                cq,
                QpType::Driver,
                QpCap::new(2 * SEND_SLOTS as u32, RECV_SLOTS as u32),
            )
            .sq_sig_all(true),
        )?;
        if qpn != GSI_QPN {
            let _ = dev.destroy_qp(qpn);
            return Err(Error::Unsupported("the device has no GSI QP"));
        }
        let params = QpParams {
            qkey: GSI_QKEY,
            ..QpParams::default()
        };
        for (attr, mask) in [
            params.init(QpType::Ud),
            params.rtr(QpType::Ud, &Endpoint::default()),
            params.rts(QpType::Ud, 0),
        ] {
            dev.modify_qp(qpn, &attr, mask)?;
        }
        let buf = MemBuf::new((RECV_SLOTS + SEND_SLOTS) * SLOT);
        let mr = dev.reg_mr(pd, &buf, 0, buf.len(), verbs_api::AccessFlags::LOCAL_WRITE)?;
        let agent = Agent {
            dev,
            gid,
            sgid_index,
            ip,
            guid,
            mtu,
            pd,
            cq,
            channel,
            buf,
            mr,
            ahs: HashMap::new(),
            next_send: 0,
            wcs: Vec::with_capacity(64),
            dead: false,
            addr_gone: false,
            block: dev_block,
        };
        for slot in 0..RECV_SLOTS {
            agent.post_recv(slot)?;
        }
        agent.dev.req_notify_cq(cq, false)?;
        Ok(agent)
    }

    fn post_recv(&self, slot: usize) -> Result<()> {
        let sge = Sge {
            addr: self.mr.addr + (slot * SLOT) as u64,
            length: SLOT as u32,
            lkey: self.mr.lkey,
        };
        self.dev
            .post_recv(GSI_QPN, &[RecvWr::new(slot as u64, vec![sge])])
            .map_err(|e| e.error)
    }

    /// Sends one MAD to QP1 of `dst`.
    pub(crate) fn send(&mut self, dst: Gid, mad: &[u8; MAD_LEN]) -> Result<()> {
        let ah = match self.ahs.get(&dst) {
            Some(ah) => *ah,
            None => {
                let ah = self.dev.create_ah(self.pd, &self.params().ah_attr(dst))?;
                self.ahs.insert(dst, ah);
                ah
            }
        };
        let slot = RECV_SLOTS + self.next_send;
        self.next_send = (self.next_send + 1) % SEND_SLOTS;
        self.buf.write(slot * SLOT, mad)?;
        let sge = Sge {
            addr: self.mr.addr + (slot * SLOT) as u64,
            length: MAD_LEN as u32,
            lkey: self.mr.lkey,
        };
        let wr = SendWr::send(SEND_TAG | slot as u64, vec![sge]).with_ud(UdDest {
            ah,
            remote_qpn: GSI_QPN,
            remote_qkey: GSI_QKEY,
        });
        self.dev.post_send(GSI_QPN, &[wr]).map_err(|e| e.error)
    }

    /// Takes every MAD that arrived (sender's GID and bytes), reposting the buffers,
    /// and re-arms the CQ. Send completions are only counted away. Returns the number of
    /// receive completions that were not a MAD (short, or in error).
    pub(crate) fn poll(&mut self, out: &mut Vec<(Gid, [u8; MAD_LEN])>) -> Result<u64> {
        let mut bad = 0;
        loop {
            self.wcs.clear();
            if self.dev.poll_cq(self.cq, 64, &mut self.wcs)? == 0 {
                break;
            }
            for wc in std::mem::take(&mut self.wcs) {
                if wc.wr_id & SEND_TAG != 0 {
                    continue;
                }
                let slot = wc.wr_id as usize;
                if wc.status == WcStatus::Success && wc.byte_len as usize >= GRH_LEN + MAD_LEN {
                    let mut bytes = [0u8; GRH_LEN + MAD_LEN];
                    self.buf.read(slot * SLOT, &mut bytes)?;
                    match init_ah_from_wc(1, &wc, &bytes[..GRH_LEN], &[self.gid]) {
                        Ok(ah) => {
                            let mut mad = [0u8; MAD_LEN];
                            mad.copy_from_slice(&bytes[GRH_LEN..]);
                            out.push((ah.grh.dgid, mad));
                        }
                        Err(_) => bad += 1,
                    }
                } else {
                    bad += 1;
                }
                if wc.status != WcStatus::WrFlushErr {
                    self.post_recv(slot)?;
                }
            }
        }
        self.dev.req_notify_cq(self.cq, false)?;
        Ok(bad)
    }

    /// Whether the device still works: re-arming QP1's CQ (harmless when armed) fails
    /// with EIO once the device had a fatal error (manual 6.1.9).
    pub(crate) fn alive(&self) -> bool {
        !matches!(self.dev.req_notify_cq(self.cq, false), Err(e) if e.errno() == EIO)
    }

    /// The default path parameters from the agent's address (its `sgid_index`).
    pub(crate) fn params(&self) -> QpParams {
        QpParams {
            sgid_index: self.sgid_index,
            ..QpParams::default()
        }
    }

    /// Whether the agent's address is still in port 1's GID table.
    pub(crate) fn addr_present(&self) -> bool {
        let len = self.dev.query_port(1).map_or(0, |p| p.gid_tbl_len);
        (0..len).any(|i| self.dev.query_gid(1, i).is_ok_and(|g| g == self.gid))
    }

    /// Frees QP1 and everything made for it.
    pub(crate) fn close(&mut self) {
        let _ = self.dev.destroy_qp(GSI_QPN);
        for (_, ah) in self.ahs.drain() {
            let _ = self.dev.destroy_ah(ah);
        }
        let _ = self.dev.dereg_mr(self.mr.lkey);
        let _ = self.dev.destroy_cq(self.cq);
        let _ = self.dev.destroy_comp_channel(self.channel);
        let _ = self.dev.dealloc_pd(self.pd);
    }
}
