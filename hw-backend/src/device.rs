//! [`HwDevice`]: the [`Device`] trait over libibverbs.
//!
//! Objects are named by the numbers libibverbs itself gives them: a PD, CQ, SRQ, AH or
//! MW by its kernel handle (`ibv_pd.handle`, ...), an MR by its lkey, a QP by its QP
//! number; completion channels, which have no handle, by a counter. A table maps each
//! number to the owned wrapper of [`crate::sys`].
//!
//! Locking: verbs that use objects take the tables' read lock for the duration of the
//! libibverbs call, so an object cannot be destroyed under a running call; creating and
//! destroying take the write lock. No call blocks while holding the lock: the two
//! waiting verbs (`get_cq_event`, `get_async_event`) wait with `poll` on the event fd
//! (made non-blocking) with the lock released, then read the event without blocking.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use verbs_api::{
    AccessFlags, AhAttr, AhId, AsyncEvent, ChannelId, CqId, Device, DeviceAttr, DeviceCapFlagsEx,
    Error, Gid, MemBuf, MrInfo, MwBind, MwId, MwInfo, MwType, PdId, PortAttr, PostError, QpAttr,
    QpAttrMask, QpInitAttr, QpType, RecvWr, ReregMrFlags, Result, SendFlags, SendWr, SrqAttr,
    SrqAttrMask, SrqId, WorkCompletion, WrOperation, XrcdId, XrcdOpen,
};
use verbs_ffi::convert;

use crate::sys::{self, Ah, CompChannel, Context, Cq, Mr, Mw, Pd, Qp, SendRefs, Srq, Xrcd};
use crate::DeviceListEntry;

/// Every object of one opened device, by number.
#[derive(Default)]
struct Tables {
    pds: HashMap<u32, Arc<Pd>>,
    mrs: HashMap<u32, Arc<Mr>>,
    mws: HashMap<u32, Arc<Mw>>,
    channels: HashMap<u32, Arc<CompChannel>>,
    cqs: HashMap<u32, Arc<Cq>>,
    srqs: HashMap<u32, Arc<Srq>>,
    qps: HashMap<u32, Arc<Qp>>,
    /// The further handles of an XRC receive QP this device opened or created more
    /// than once (`ibv_open_qp`); a destroy drops one of these before the first.
    qp_holds: HashMap<u32, Vec<Qp>>,
    ahs: HashMap<u32, Arc<Ah>>,
    xrcds: HashMap<u32, Arc<Xrcd>>,
}

/// A real RDMA device (kernel rxe, mlx5, ...) opened through libibverbs.
pub struct HwDevice {
    ctx: Arc<Context>,
    t: RwLock<Tables>,
    next_channel: AtomicU32,
    next_xrcd: AtomicU32,
    /// `device_cap_flags_ex`, read once: a device's capabilities do not change.
    cap_flags_ex: std::sync::OnceLock<DeviceCapFlagsEx>,
}

impl std::fmt::Debug for HwDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwDevice")
            .field("name", &self.ctx.name())
            .finish_non_exhaustive()
    }
}

/// Every RDMA device libibverbs sees (`ibv_get_device_list`). An empty list is not an
/// error here; [`HwDevice::open`] reports it.
pub fn devices() -> Result<Vec<DeviceListEntry>> {
    sys::device_list()
}

/// Waits up to `timeout` (forever for `None`) until `fd` is readable, e.g. the fd of
/// [`Device::async_fd`] or [`Device::comp_channel_fd`]; `Ok(false)` on timeout. (`poll(2)`
/// on any integer is memory-safe: an fd that is not open reports POLLNVAL, i.e. `true`.)
pub fn wait_fd_readable(fd: i32, timeout: Option<Duration>) -> Result<bool> {
    sys::wait_readable(fd, sys::deadline(timeout))
}

impl HwDevice {
    /// Keeps a handle of QP `qpn`: the first in the QP table, a further one (an XRC
    /// receive QP opened again) among its holds.
    fn hold_qp(t: &mut Tables, qpn: u32, qp: Qp) {
        if let std::collections::hash_map::Entry::Vacant(e) = t.qps.entry(qpn) {
            e.insert(Arc::new(qp));
        } else {
            t.qp_holds.entry(qpn).or_default().push(qp);
        }
    }

    /// The device's extended capabilities (`ibv_query_device_ex`), queried on first
    /// use; a failed query is not kept.
    fn cap_flags_ex(&self) -> Result<DeviceCapFlagsEx> {
        if let Some(f) = self.cap_flags_ex.get() {
            return Ok(*f);
        }
        let f = convert::device_cap_flags_ex_from_c(self.ctx.device_cap_flags_ex()?);
        Ok(*self.cap_flags_ex.get_or_init(|| f))
    }

    /// Opens device `name` (e.g. `rxe0`), or the first device libibverbs lists when
    /// `None`. ENODEV when there is no such device, with a message that says how to
    /// create a soft-RoCE one when there is none at all.
    pub fn open(name: Option<&str>) -> Result<HwDevice> {
        Ok(HwDevice {
            ctx: Context::open(name)?,
            t: RwLock::new(Tables::default()),
            next_channel: AtomicU32::new(1),
            next_xrcd: AtomicU32::new(1),
            cap_flags_ex: std::sync::OnceLock::new(),
        })
    }
}

/// Looks `id` up in `map`, or EINVAL naming the kind of object.
fn get<'a, T>(map: &'a HashMap<u32, Arc<T>>, id: u32, what: &'static str) -> Result<&'a T> {
    map.get(&id)
        .map(|a| &**a)
        .ok_or(Error::InvalidArgument(what))
}

/// Removes `id` from `map` and frees it with `free`; on failure (EBUSY from the
/// kernel, or a concurrent waiter still holding it) puts it back.
fn destroy<T>(
    map: &mut HashMap<u32, Arc<T>>,
    id: u32,
    what: &'static str,
    free: impl FnOnce(T) -> std::result::Result<(), (T, Error)>,
) -> Result<()> {
    let arc = map.remove(&id).ok_or(Error::InvalidArgument(what))?;
    match Arc::try_unwrap(arc) {
        Err(arc) => {
            map.insert(id, arc);
            Err(Error::Busy("the object is in use by a waiting verb call"))
        }
        Ok(obj) => free(obj).map_err(|(obj, e)| {
            map.insert(id, Arc::new(obj));
            e
        }),
    }
}

impl Drop for HwDevice {
    fn drop(&mut self) {
        // Children before parents, so that every free succeeds; whatever is left is
        // freed by the kernel when the context closes after the last wrapper. Windows
        // go first: a type 2 window bound through a QP holds it, and kernel rxe's
        // destroy of that QP waits (about 50 s) for the window to let go.
        let t = self.t.get_mut();
        t.mws.clear();
        t.qp_holds.clear();
        t.qps.clear();
        t.srqs.clear();
        t.xrcds.clear();
        t.ahs.clear();
        t.mrs.clear();
        t.cqs.clear();
        t.channels.clear();
        t.pds.clear();
    }
}

const NO_PD: &str = "no such protection domain";
const NO_CQ: &str = "no such completion queue";
const NO_QP: &str = "no such queue pair";
const NO_MR: &str = "no such memory region (lkey)";
const NO_MW: &str = "no such memory window";
const NO_SRQ: &str = "no such shared receive queue";
const NO_AH: &str = "no such address handle";
const NO_CHANNEL: &str = "no such completion channel";
const NO_XRCD: &str = "no such XRC domain";

/// The file whose inode stands for `inode` in `ibv_open_xrcd`: the kernel keys XRC
/// domains by a file's inode, and [`XrcdOpen`] names a domain by a number. One file
/// per number, in a folder of the host's temporary directory, so opens of one number
/// (in any process of this user) share a domain, as opens of one file do.
fn xrcd_file(inode: u64) -> Result<std::fs::File> {
    let dir = std::env::temp_dir().join("hw-backend-xrcd");
    let os = |e: std::io::Error| Error::Os {
        errno: e.raw_os_error().unwrap_or(libc::EIO),
        context: "the file of an XRC domain",
    };
    std::fs::create_dir_all(&dir).map_err(os)?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(dir.join(format!("{inode:016x}")))
        .map_err(os)
}

impl Device for HwDevice {
    fn name(&self) -> &str {
        self.ctx.name()
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        let mut a = convert::device_attr_from_c(&self.ctx.query_device()?);
        // What this backend can post: FLUSH needs `ibv_wr_flush` (rdma-core 45), which
        // the libibverbs headers it is built against (44) do not have.
        a.device_cap_flags_ex = self.cap_flags_ex()?
            - (DeviceCapFlagsEx::FLUSH_GLOBAL | DeviceCapFlagsEx::FLUSH_PERSISTENT);
        Ok(a)
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        Ok(convert::port_attr_from_c(&self.ctx.query_port(port)?))
    }

    fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        self.ctx.query_gid(port, index)
    }

    fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        self.ctx.query_pkey(port, index)
    }

    fn alloc_pd(&self) -> Result<PdId> {
        let pd = self.ctx.alloc_pd()?;
        let id = pd.handle();
        self.t.write().pds.insert(id, Arc::new(pd));
        Ok(PdId(id))
    }

    fn dealloc_pd(&self, pd: PdId) -> Result<()> {
        destroy(&mut self.t.write().pds, pd.0, NO_PD, Pd::destroy)
    }

    fn reg_mr(
        &self,
        pd: PdId,
        buf: &MemBuf,
        offset: usize,
        length: usize,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        let mut t = self.t.write();
        let mr = get(&t.pds, pd.0, NO_PD)?.reg_mr(buf, offset, length, access.bits())?;
        let info = mr_info(&mr);
        t.mrs.insert(info.lkey, Arc::new(mr));
        Ok(info)
    }

    fn dereg_mr(&self, lkey: u32) -> Result<()> {
        destroy(&mut self.t.write().mrs, lkey, NO_MR, Mr::destroy)
    }

    fn rereg_mr(
        &self,
        lkey: u32,
        flags: ReregMrFlags,
        pd: Option<PdId>,
        range: Option<(&MemBuf, usize, usize)>,
        access: AccessFlags,
    ) -> Result<MrInfo> {
        let mut t = self.t.write();
        let t = &mut *t;
        let new_pd = match (flags.contains(ReregMrFlags::CHANGE_PD), pd) {
            (true, Some(p)) => Some(get(&t.pds, p.0, NO_PD)?),
            (true, None) => return Err(Error::InvalidArgument("CHANGE_PD needs a PD")),
            (false, _) => None,
        };
        let range = match (flags.contains(ReregMrFlags::CHANGE_TRANSLATION), range) {
            (true, Some(r)) => Some(r),
            (true, None) => return Err(Error::InvalidArgument("CHANGE_TRANSLATION needs a range")),
            (false, _) => None,
        };
        let arc = t.mrs.remove(&lkey).ok_or(Error::InvalidArgument(NO_MR))?;
        let mut mr = match Arc::try_unwrap(arc) {
            Ok(mr) => mr,
            Err(arc) => {
                t.mrs.insert(lkey, arc);
                return Err(Error::Busy("the memory region is in use"));
            }
        };
        let res = mr.rereg(flags, new_pd, range, access.bits());
        let info = mr_info(&mr);
        t.mrs.insert(info.lkey, Arc::new(mr));
        res.map(|()| info)
    }

    fn alloc_mw(&self, pd: PdId, mw_type: MwType) -> Result<MwInfo> {
        let mut t = self.t.write();
        let mw = get(&t.pds, pd.0, NO_PD)?.alloc_mw(mw_type)?;
        let info = MwInfo {
            id: MwId(mw.handle()),
            rkey: mw.rkey(),
            mw_type: MwType::try_from(mw.mw_type()).unwrap_or(mw_type),
        };
        t.mws.insert(info.id.0, Arc::new(mw));
        Ok(info)
    }

    fn dealloc_mw(&self, mw: MwId) -> Result<()> {
        destroy(&mut self.t.write().mws, mw.0, NO_MW, Mw::destroy)
    }

    fn bind_mw(&self, qpn: u32, mw: MwId, bind: &MwBind) -> Result<u32> {
        let t = self.t.read();
        let qp = get(&t.qps, qpn, NO_QP)?;
        let w = get(&t.mws, mw.0, NO_MW)?;
        let mr = t.mrs.get(&bind.bind_info.mr_lkey).map(|m| &**m);
        if mr.is_none() && bind.bind_info.length != 0 {
            return Err(Error::InvalidArgument(NO_MR));
        }
        qp.bind_mw(w, mr, bind)
    }

    fn create_comp_channel(&self) -> Result<ChannelId> {
        let ch = self.ctx.create_comp_channel()?;
        let id = self.next_channel.fetch_add(1, Ordering::Relaxed);
        self.t.write().channels.insert(id, Arc::new(ch));
        Ok(ChannelId(id))
    }

    fn destroy_comp_channel(&self, channel: ChannelId) -> Result<()> {
        destroy(
            &mut self.t.write().channels,
            channel.0,
            NO_CHANNEL,
            CompChannel::destroy,
        )
    }

    fn get_cq_event(&self, channel: ChannelId, timeout: Option<Duration>) -> Result<CqId> {
        // Held (not the table lock) while waiting: the channel cannot be destroyed under
        // the wait (destroy_comp_channel reports EBUSY instead).
        let ch = self
            .t
            .read()
            .channels
            .get(&channel.0)
            .cloned()
            .ok_or(Error::InvalidArgument(NO_CHANNEL))?;
        let deadline = sys::deadline(timeout);
        loop {
            if let Some(cq) = ch.try_get_cq_event()? {
                return Ok(CqId(cq));
            }
            if !sys::wait_readable_or_signal(ch.fd(), deadline)? {
                return Err(Error::TimedOut);
            }
        }
    }

    fn comp_channel_fd(&self, channel: ChannelId) -> Result<i32> {
        Ok(get(&self.t.read().channels, channel.0, NO_CHANNEL)?.fd())
    }

    fn num_comp_vectors(&self) -> u32 {
        self.ctx.num_comp_vectors()
    }

    fn create_cq_with_vector(
        &self,
        cqe: u32,
        channel: Option<ChannelId>,
        comp_vector: u32,
    ) -> Result<CqId> {
        let mut t = self.t.write();
        let ch = match channel {
            Some(c) => Some(
                t.channels
                    .get(&c.0)
                    .cloned()
                    .ok_or(Error::InvalidArgument(NO_CHANNEL))?,
            ),
            None => None,
        };
        let cq = self.ctx.create_cq(cqe, ch, comp_vector)?;
        let id = cq.handle();
        t.cqs.insert(id, Arc::new(cq));
        Ok(CqId(id))
    }

    fn destroy_cq(&self, cq: CqId) -> Result<()> {
        destroy(&mut self.t.write().cqs, cq.0, NO_CQ, Cq::destroy)
    }

    fn resize_cq(&self, cq: CqId, cqe: u32) -> Result<()> {
        get(&self.t.read().cqs, cq.0, NO_CQ)?.resize(cqe)
    }

    fn poll_cq(&self, cq: CqId, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        get(&self.t.read().cqs, cq.0, NO_CQ)?.poll(max, out)
    }

    fn req_notify_cq(&self, cq: CqId, solicited_only: bool) -> Result<()> {
        get(&self.t.read().cqs, cq.0, NO_CQ)?.req_notify(solicited_only)
    }

    fn create_qp(&self, init: &QpInitAttr) -> Result<u32> {
        let mut t = self.t.write();
        let qp = {
            let pd = get(&t.pds, init.pd.0, NO_PD)?;
            let scq = get(&t.cqs, init.send_cq.0, NO_CQ)?;
            let rcq = get(&t.cqs, init.recv_cq.0, NO_CQ)?;
            let srq = match init.srq {
                Some(s) => Some(get(&t.srqs, s.0, NO_SRQ)?),
                None => None,
            };
            // A QP that may post ATOMIC WRITE is made through `ibv_create_qp_ex` with
            // it among its send operations, where the device has it.
            let atomic_write = matches!(init.qp_type, QpType::Rc | QpType::XrcSend)
                && self
                    .cap_flags_ex()?
                    .contains(DeviceCapFlagsEx::ATOMIC_WRITE);
            pd.create_qp(scq, rcq, srq, init, atomic_write)?
        };
        let qpn = qp.qp_num();
        t.qps.insert(qpn, Arc::new(qp));
        Ok(qpn)
    }

    fn modify_qp(&self, qpn: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        get(&self.t.read().qps, qpn, NO_QP)?.modify(attr, mask)
    }

    fn query_qp(&self, qpn: u32) -> Result<(QpAttr, QpInitAttr)> {
        get(&self.t.read().qps, qpn, NO_QP)?.query()
    }

    fn destroy_qp(&self, qpn: u32) -> Result<()> {
        let mut t = self.t.write();
        if let Some(hold) = t.qp_holds.get_mut(&qpn).and_then(Vec::pop) {
            return hold.destroy().map_err(|(qp, e)| {
                t.qp_holds.entry(qpn).or_default().push(qp);
                e
            });
        }
        destroy(&mut t.qps, qpn, NO_QP, Qp::destroy)
    }

    fn post_send(&self, qpn: u32, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        let t = self.t.read();
        let qp = get(&t.qps, qpn, NO_QP).map_err(|error| PostError { index: 0, error })?;
        let refs: Vec<SendRefs<'_>> = wrs
            .iter()
            .map(|w| {
                let (mw, bind_mr) = match &w.op {
                    WrOperation::BindMw {
                        mw_rkey, bind_info, ..
                    } => (
                        // By the R_Key's index (IBTA 10.6.7.2.2: the consumer owns only
                        // the low eight bits, the key byte): whether a provider writes a
                        // type 2 bind's new key into `ibv_mw` (capi) or not (rxe, mlx5),
                        // the window keeps its index.
                        t.mws
                            .values()
                            .find(|m| m.rkey() >> 8 == *mw_rkey >> 8)
                            .map(|m| &**m),
                        t.mrs.get(&bind_info.mr_lkey).map(|m| &**m),
                    ),
                    _ => (None, None),
                };
                SendRefs {
                    ah: w.ud.and_then(|u| t.ahs.get(&u.ah.0)).map(|a| &**a),
                    mw,
                    bind_mr,
                    inline_mrs: if w.send_flags.contains(SendFlags::INLINE) {
                        w.sg_list
                            .iter()
                            .map(|s| t.mrs.get(&s.lkey).map(|m| &**m))
                            .collect()
                    } else {
                        Vec::new()
                    },
                }
            })
            .collect();
        qp.post_send(wrs, &refs)
    }

    fn post_recv(&self, qpn: u32, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let t = self.t.read();
        get(&t.qps, qpn, NO_QP)
            .map_err(|error| PostError { index: 0, error })?
            .post_recv(wrs)
    }

    fn create_srq(&self, pd: PdId, attr: &SrqAttr) -> Result<SrqId> {
        let mut t = self.t.write();
        let srq = get(&t.pds, pd.0, NO_PD)?.create_srq(attr)?;
        let id = srq.handle();
        t.srqs.insert(id, Arc::new(srq));
        Ok(SrqId(id))
    }

    fn modify_srq(&self, srq: SrqId, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        get(&self.t.read().srqs, srq.0, NO_SRQ)?.modify(attr, mask)
    }

    fn query_srq(&self, srq: SrqId) -> Result<SrqAttr> {
        get(&self.t.read().srqs, srq.0, NO_SRQ)?.query()
    }

    fn destroy_srq(&self, srq: SrqId) -> Result<()> {
        destroy(&mut self.t.write().srqs, srq.0, NO_SRQ, Srq::destroy)
    }

    fn post_srq_recv(&self, srq: SrqId, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let t = self.t.read();
        get(&t.srqs, srq.0, NO_SRQ)
            .map_err(|error| PostError { index: 0, error })?
            .post_recv(wrs)
    }

    fn open_xrcd(&self, open: &XrcdOpen) -> Result<XrcdId> {
        use std::os::fd::AsRawFd;
        let file = open.inode.map(xrcd_file).transpose()?;
        let fd = file.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        let mut oflags = 0;
        if open.create {
            oflags |= libc::O_CREAT;
        }
        if open.exclusive {
            oflags |= libc::O_EXCL;
        }
        // The domain holds the inode, not the descriptor: the file may close after.
        let xrcd = self.ctx.open_xrcd(fd, oflags)?;
        let id = self.next_xrcd.fetch_add(1, Ordering::Relaxed);
        self.t.write().xrcds.insert(id, Arc::new(xrcd));
        Ok(XrcdId(id))
    }

    fn close_xrcd(&self, xrcd: XrcdId) -> Result<()> {
        destroy(&mut self.t.write().xrcds, xrcd.0, NO_XRCD, Xrcd::destroy)
    }

    fn create_xrc_srq(&self, pd: PdId, xrcd: XrcdId, cq: CqId, attr: &SrqAttr) -> Result<SrqId> {
        let mut t = self.t.write();
        let srq = self.ctx.create_xrc_srq(
            get(&t.pds, pd.0, NO_PD)?,
            get(&t.xrcds, xrcd.0, NO_XRCD)?,
            get(&t.cqs, cq.0, NO_CQ)?,
            attr,
        )?;
        let id = srq.handle();
        t.srqs.insert(id, Arc::new(srq));
        Ok(SrqId(id))
    }

    fn get_srq_num(&self, srq: SrqId) -> Result<u32> {
        get(&self.t.read().srqs, srq.0, NO_SRQ)?.srq_num()
    }

    fn create_xrc_recv_qp(&self, xrcd: XrcdId) -> Result<u32> {
        let mut t = self.t.write();
        let qp = self
            .ctx
            .create_xrc_recv_qp(get(&t.xrcds, xrcd.0, NO_XRCD)?)?;
        let qpn = qp.qp_num();
        Self::hold_qp(&mut t, qpn, qp);
        Ok(qpn)
    }

    fn open_qp(&self, xrcd: XrcdId, qpn: u32) -> Result<()> {
        let mut t = self.t.write();
        let qp = self.ctx.open_qp(get(&t.xrcds, xrcd.0, NO_XRCD)?, qpn)?;
        Self::hold_qp(&mut t, qpn, qp);
        Ok(())
    }

    fn create_ah(&self, pd: PdId, attr: &AhAttr) -> Result<AhId> {
        let mut t = self.t.write();
        let ah = get(&t.pds, pd.0, NO_PD)?.create_ah(attr)?;
        let id = ah.handle();
        t.ahs.insert(id, Arc::new(ah));
        Ok(AhId(id))
    }

    fn destroy_ah(&self, ah: AhId) -> Result<()> {
        destroy(&mut self.t.write().ahs, ah.0, NO_AH, Ah::destroy)
    }

    fn init_ah_from_wc(&self, port_num: u8, wc: &WorkCompletion, grh: &[u8]) -> Result<AhAttr> {
        self.ctx.init_ah_from_wc(port_num, wc, grh)
    }

    fn attach_mcast(&self, qpn: u32, gid: &Gid, lid: u16) -> Result<()> {
        get(&self.t.read().qps, qpn, NO_QP)?.mcast(gid, lid, true)
    }

    fn detach_mcast(&self, qpn: u32, gid: &Gid, lid: u16) -> Result<()> {
        get(&self.t.read().qps, qpn, NO_QP)?.mcast(gid, lid, false)
    }

    fn get_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        let deadline = sys::deadline(timeout);
        loop {
            if let Some(ev) = self.ctx.try_get_async_event()? {
                return Ok(ev);
            }
            if !sys::wait_readable(self.ctx.async_fd(), deadline)? {
                return Err(Error::TimedOut);
            }
        }
    }

    fn async_fd(&self) -> Result<i32> {
        Ok(self.ctx.async_fd())
    }
}

fn mr_info(mr: &Mr) -> MrInfo {
    let (addr, length, lkey, rkey) = mr.info();
    MrInfo {
        addr,
        length,
        lkey,
        rkey,
    }
}
