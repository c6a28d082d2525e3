//! RAII handles over any [`Device`]: what user code holds.
//!
//! [`Context`] is an opened device; [`Pd`], [`Mr`], [`CompChannel`], [`Cq`] and [`Qp`]
//! free their object when dropped. Each child keeps its parents alive (an MR holds its
//! PD, a QP its PD and CQs, a CQ its channel), so an object is never freed while
//! something still uses it and nothing dangles: dropping a PD while its MRs live only
//! drops the handle, and the PD is deallocated with the last of them. The explicit
//! `dealloc`/`destroy` methods return the error libibverbs gives (EBUSY while children
//! live, manual 3.4) and hand the handle back, so nothing leaks either.
//!
//! ```no_run
//! # fn demo(dev: std::sync::Arc<dyn verbs_api::Device>) -> verbs_api::Result<()> {
//! use verbs_api::*;
//! let ctx = Context::new(dev);
//! let pd = ctx.alloc_pd()?;
//! let buf = MemBuf::new(4096);
//! let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE)?;
//! let cq = ctx.create_cq(64, None)?;
//! let qp = pd.qp(QpType::Rc, &cq).build()?;
//! # let _ = (mr, qp); Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use crate::{
    AccessFlags, AsyncEvent, ChannelId, CqId, Device, Error, MemBuf, MrInfo, PdId, PostError,
    QpAttr, QpAttrMask, QpCap, QpInitAttr, QpType, RecvWr, Result, SendWr, WorkCompletion,
};

/// An opened device.
#[derive(Clone)]
pub struct Context {
    dev: Arc<dyn Device>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.dev.name())
            .finish()
    }
}

impl Context {
    /// Wraps an opened device.
    pub fn new(dev: Arc<dyn Device>) -> Context {
        Context { dev }
    }

    /// The device, for the verbs the handles do not wrap (queries, async events).
    pub fn device(&self) -> &dyn Device {
        &*self.dev
    }

    /// The GID a peer reaches this device at: port 1, index 0 (`ibv_query_gid`).
    pub fn gid(&self) -> Result<crate::Gid> {
        self.dev.query_gid(1, 0)
    }

    /// The GID index of port 1 a program picks when not told, as perftest picks it
    /// (`get_best_gid_index`): the first IPv4-mapped entry when entry 0 is not one,
    /// else 0. On kernel rxe, and on an emulated device on both address families,
    /// entry 0 is the interface's IPv6 link-local address and this is 1, the IPv4
    /// address, which a peer across a router (or one that uses its own IPv4 entry)
    /// reaches; a device on one address has it at 0.
    pub fn default_gid_index(&self) -> Result<u8> {
        if self.dev.query_gid(1, 0)?.to_ipv4().is_some() {
            return Ok(0);
        }
        let len = self.dev.query_port(1)?.gid_tbl_len.min(256);
        for i in 1..len {
            if self.dev.query_gid(1, i)?.to_ipv4().is_some() {
                return Ok(i as u8);
            }
        }
        Ok(0)
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<Pd> {
        let id = self.dev.alloc_pd()?;
        Ok(Pd(Arc::new(PdInner {
            dev: self.dev.clone(),
            id,
            live: true,
        })))
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        let id = self.dev.create_comp_channel()?;
        Ok(CompChannel(Arc::new(ChannelInner {
            dev: self.dev.clone(),
            id,
            live: true,
        })))
    }

    /// `ibv_create_cq` on completion vector 0.
    pub fn create_cq(&self, cqe: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        self.create_cq_with_vector(cqe, channel, 0)
    }

    /// `ibv_create_cq` on completion vector `comp_vector` (below
    /// [`num_comp_vectors`](Self::num_comp_vectors), else EINVAL).
    pub fn create_cq_with_vector(
        &self,
        cqe: u32,
        channel: Option<&CompChannel>,
        comp_vector: u32,
    ) -> Result<Cq> {
        let id = self
            .dev
            .create_cq_with_vector(cqe, channel.map(|c| c.0.id), comp_vector)?;
        Ok(Cq(Arc::new(CqInner {
            dev: self.dev.clone(),
            id,
            _channel: channel.map(|c| c.0.clone()),
            live: true,
        })))
    }

    /// `ibv_context.num_comp_vectors`.
    pub fn num_comp_vectors(&self) -> u32 {
        self.dev.num_comp_vectors()
    }

    /// `ibv_get_async_event`.
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        self.dev.get_async_event(timeout)
    }
}

/// Frees an object once, from `destroy` or from `Drop`, whichever comes first.
macro_rules! owned {
    ($inner:ident, $id:ty, $free:expr, { $($field:ident: $ty:ty),* }) => {
        struct $inner {
            dev: Arc<dyn Device>,
            id: $id,
            live: bool,
            $($field: $ty),*
        }

        impl Drop for $inner {
            fn drop(&mut self) {
                if self.live {
                    // Children hold their parents, so this runs after every child is
                    // gone: the free cannot be refused for EBUSY.
                    let free: fn(&dyn Device, $id) -> Result<()> = $free;
                    let _ = free(&*self.dev, self.id);
                }
            }
        }
    };
}

owned!(PdInner, PdId, |d, id| d.dealloc_pd(id), {});
owned!(
    ChannelInner,
    ChannelId,
    |d, id| d.destroy_comp_channel(id),
    {}
);
owned!(CqInner, CqId, |d, id| d.destroy_cq(id), { _channel: Option<Arc<ChannelInner>> });
owned!(MrInner, u32, |d, lkey| d.dereg_mr(lkey), { info: MrInfo, _pd: Arc<PdInner>, _buf: MemBuf });
owned!(SrqInner, crate::SrqId, |d, id| d.destroy_srq(id), { _pd: Arc<PdInner> });
owned!(AhInner, crate::AhId, |d, id| d.destroy_ah(id), { _pd: Arc<PdInner> });
owned!(MwInner, crate::MwId, |d, id| d.dealloc_mw(id), { mw_type: crate::MwType, _pd: Arc<PdInner> });
owned!(QpInner, u32, |d, qpn| d.destroy_qp(qpn), {
    _pd: Arc<PdInner>,
    _cqs: [Arc<CqInner>; 2],
    _srq: Option<Arc<SrqInner>>
});

/// Takes the object out of an `Arc` for an explicit destroy: only possible when this is
/// the last handle; otherwise the object is in use (EBUSY) and the handle comes back.
fn destroy_now<T>(
    inner: Arc<T>,
    live: impl FnOnce(&mut T) -> &mut bool,
    free: impl FnOnce(&T) -> Result<()>,
) -> std::result::Result<(), (Arc<T>, Error)> {
    match Arc::try_unwrap(inner) {
        Ok(mut t) => match free(&t) {
            Ok(()) => {
                *live(&mut t) = false;
                Ok(())
            }
            Err(e) => {
                // The backend refused (its own children): keep it alive and give it back.
                Err((Arc::new(t), e))
            }
        },
        Err(shared) => Err((
            shared,
            Error::Busy("the object is still used by other objects"),
        )),
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct Pd(Arc<PdInner>);

impl std::fmt::Debug for Pd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pd({})", self.0.id.0)
    }
}

impl Pd {
    /// The PD's number.
    pub fn id(&self) -> PdId {
        self.0.id
    }

    /// `ibv_reg_mr` over the whole buffer.
    pub fn reg_mr(&self, buf: &MemBuf, access: AccessFlags) -> Result<Mr> {
        self.reg_mr_range(buf, 0, buf.len(), access)
    }

    /// `ibv_reg_mr` over `length` bytes from `offset`.
    pub fn reg_mr_range(
        &self,
        buf: &MemBuf,
        offset: usize,
        length: usize,
        access: AccessFlags,
    ) -> Result<Mr> {
        let info = self.0.dev.reg_mr(self.0.id, buf, offset, length, access)?;
        Ok(Mr(Arc::new(MrInner {
            dev: self.0.dev.clone(),
            id: info.lkey,
            live: true,
            info,
            _pd: self.0.clone(),
            _buf: buf.clone(),
        })))
    }

    /// A QP of `qp_type` in this PD whose sends and receives complete on `cq`, with
    /// defaults that work: 128 send and 128 receive WRs of one SGE each, no inline
    /// data, every send WR signaled. [`QpBuilder`] changes any of them.
    ///
    /// ```no_run
    /// # fn demo(pd: &verbs_api::Pd, cq: &verbs_api::Cq) -> verbs_api::Result<()> {
    /// use verbs_api::QpType;
    /// let qp = pd.qp(QpType::Rc, cq).max_send_wr(16).build()?;
    /// # let _ = qp; Ok(()) }
    /// ```
    pub fn qp<'a>(&'a self, qp_type: QpType, cq: &'a Cq) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            qp_type,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: QpBuilder::DEFAULT_CAP,
            sq_sig_all: true,
        }
    }

    /// `ibv_create_qp` in this PD.
    pub fn create_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        qp_type: QpType,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<Qp> {
        self.create_qp_on(send_cq, recv_cq, None, qp_type, cap, sq_sig_all)
    }

    /// `ibv_create_qp` in this PD, taking its receives from `srq` when given.
    pub fn create_qp_on(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        qp_type: QpType,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> Result<Qp> {
        let init = QpInitAttr {
            pd: self.0.id,
            send_cq: send_cq.0.id,
            recv_cq: recv_cq.0.id,
            qp_type,
            cap,
            sq_sig_all,
            srq: srq.map(|s| s.0.id),
        };
        let qpn = self.0.dev.create_qp(&init)?;
        Ok(Qp(Arc::new(QpInner {
            dev: self.0.dev.clone(),
            id: qpn,
            live: true,
            _pd: self.0.clone(),
            _cqs: [send_cq.0.clone(), recv_cq.0.clone()],
            _srq: srq.map(|s| s.0.clone()),
        })))
    }

    /// `ibv_create_srq` in this PD.
    pub fn create_srq(&self, attr: &crate::SrqAttr) -> Result<Srq> {
        let id = self.0.dev.create_srq(self.0.id, attr)?;
        Ok(Srq(Arc::new(SrqInner {
            dev: self.0.dev.clone(),
            id,
            live: true,
            _pd: self.0.clone(),
        })))
    }

    /// `ibv_create_ah` in this PD.
    pub fn create_ah(&self, attr: &crate::AhAttr) -> Result<Ah> {
        let id = self.0.dev.create_ah(self.0.id, attr)?;
        Ok(Ah(Arc::new(AhInner {
            dev: self.0.dev.clone(),
            id,
            live: true,
            _pd: self.0.clone(),
        })))
    }

    /// `ibv_create_ah_from_wc` (manual 3.6.12) in this PD: an AH that answers the
    /// sender of the UD receive `wc`, whose buffer began with `grh` (see
    /// [`Device::init_ah_from_wc`]).
    pub fn create_ah_from_wc(&self, wc: &WorkCompletion, grh: &[u8], port_num: u8) -> Result<Ah> {
        let id = self.0.dev.create_ah_from_wc(self.0.id, wc, grh, port_num)?;
        Ok(Ah(Arc::new(AhInner {
            dev: self.0.dev.clone(),
            id,
            live: true,
            _pd: self.0.clone(),
        })))
    }

    /// `ibv_alloc_mw` in this PD; returns the window and its first rkey.
    pub fn alloc_mw(&self, mw_type: crate::MwType) -> Result<(Mw, u32)> {
        let info = self.0.dev.alloc_mw(self.0.id, mw_type)?;
        Ok((
            Mw(Arc::new(MwInner {
                dev: self.0.dev.clone(),
                id: info.id,
                live: true,
                mw_type: info.mw_type,
                _pd: self.0.clone(),
            })),
            info.rkey,
        ))
    }

    /// `ibv_dealloc_pd` now: EBUSY (and the handle back) while MRs or QPs use it.
    pub fn dealloc(self) -> std::result::Result<(), (Pd, Error)> {
        destroy_now(self.0, |t| &mut t.live, |t| t.dev.dealloc_pd(t.id))
            .map_err(|(a, e)| (Pd(a), e))
    }
}

/// A registered memory region; it keeps its buffer and PD alive.
#[derive(Clone)]
pub struct Mr(Arc<MrInner>);

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mr({:?})", self.0.info)
    }
}

impl Mr {
    /// Address, length and keys.
    pub fn info(&self) -> MrInfo {
        self.0.info
    }
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.0.info.lkey
    }
    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.0.info.rkey
    }
    /// The address a peer names to reach `offset` into the region (with
    /// [`Mr::rkey`]), or a local SGE starts at.
    pub fn addr(&self, offset: u64) -> u64 {
        self.0.info.addr + offset
    }
    /// An SGE over `length` bytes at `offset` into the region.
    pub fn sge(&self, offset: u64, length: u32) -> crate::Sge {
        crate::Sge {
            addr: self.0.info.addr + offset,
            length,
            lkey: self.0.info.lkey,
        }
    }
    /// `ibv_dereg_mr` now.
    pub fn dereg(self) -> std::result::Result<(), (Mr, Error)> {
        destroy_now(self.0, |t| &mut t.live, |t| t.dev.dereg_mr(t.id)).map_err(|(a, e)| (Mr(a), e))
    }
}

/// A completion channel.
#[derive(Clone)]
pub struct CompChannel(Arc<ChannelInner>);

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompChannel({})", self.0.id.0)
    }
}

impl CompChannel {
    /// `ibv_get_cq_event`: the CQ that got a completion since it was armed.
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<CqId> {
        self.0.dev.get_cq_event(self.0.id, timeout)
    }
    /// The fd, readable while an event is pending (poll/epoll).
    pub fn fd(&self) -> Result<i32> {
        self.0.dev.comp_channel_fd(self.0.id)
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq(Arc<CqInner>);

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cq({})", self.0.id.0)
    }
}

impl Cq {
    /// The CQ's number.
    pub fn id(&self) -> CqId {
        self.0.id
    }
    /// `ibv_poll_cq` into `out`.
    pub fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        self.0.dev.poll_cq(self.0.id, max, out)
    }
    /// `ibv_req_notify_cq`.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.0.dev.req_notify_cq(self.0.id, solicited_only)
    }
    /// The next completion, polling until one comes or `timeout` passes
    /// ([`Error::TimedOut`]). On a simulated fabric each empty poll moves the
    /// network on, so `timeout` is real time and virtual time runs as needed.
    pub fn wait(&self, timeout: Duration) -> Result<WorkCompletion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(1);
        loop {
            if self.poll(1, &mut out)? > 0 {
                return Ok(out[0]);
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::TimedOut);
            }
            std::thread::yield_now();
        }
    }
    /// The completions in the CQ now, oldest first, taken as the iterator is advanced
    /// (polled in batches); it ends when the CQ is empty. A failed poll is its last
    /// item.
    pub fn completions(&self) -> Completions<'_> {
        Completions {
            cq: self,
            batch: Vec::new(),
            next: 0,
            done: false,
        }
    }
    /// `ibv_resize_cq`: room for at least `cqe` completions (EINVAL below those queued).
    pub fn resize(&self, cqe: u32) -> Result<()> {
        self.0.dev.resize_cq(self.0.id, cqe)
    }
    /// `ibv_destroy_cq` now: EBUSY (and the handle back) while a QP uses it.
    pub fn destroy(self) -> std::result::Result<(), (Cq, Error)> {
        destroy_now(self.0, |t| &mut t.live, |t| t.dev.destroy_cq(t.id))
            .map_err(|(a, e)| (Cq(a), e))
    }
}

/// A shared receive queue; it keeps its PD alive, and the QPs on it keep it alive.
#[derive(Clone)]
pub struct Srq(Arc<SrqInner>);

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Srq({})", self.0.id.0)
    }
}

impl Srq {
    /// The SRQ's number.
    pub fn id(&self) -> crate::SrqId {
        self.0.id
    }
    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        self.0.dev.post_srq_recv(self.0.id, wrs)
    }
    /// `ibv_modify_srq`.
    pub fn modify(&self, attr: &crate::SrqAttr, mask: crate::SrqAttrMask) -> Result<()> {
        self.0.dev.modify_srq(self.0.id, attr, mask)
    }
    /// `ibv_query_srq`.
    pub fn query(&self) -> Result<crate::SrqAttr> {
        self.0.dev.query_srq(self.0.id)
    }
    /// `ibv_destroy_srq` now: EBUSY (and the handle back) while a QP uses it.
    pub fn destroy(self) -> std::result::Result<(), (Srq, Error)> {
        destroy_now(self.0, |t| &mut t.live, |t| t.dev.destroy_srq(t.id))
            .map_err(|(a, e)| (Srq(a), e))
    }
}

/// An address handle (UD destinations); it keeps its PD alive.
#[derive(Clone)]
pub struct Ah(Arc<AhInner>);

impl std::fmt::Debug for Ah {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ah({})", self.0.id.0)
    }
}

impl Ah {
    /// The handle's number, for [`crate::UdDest::ah`].
    pub fn id(&self) -> crate::AhId {
        self.0.id
    }
    /// `ibv_destroy_ah` now.
    pub fn destroy(self) -> std::result::Result<(), (Ah, Error)> {
        destroy_now(self.0, |t| &mut t.live, |t| t.dev.destroy_ah(t.id))
            .map_err(|(a, e)| (Ah(a), e))
    }
}

/// A memory window; it keeps its PD alive.
#[derive(Clone)]
pub struct Mw(Arc<MwInner>);

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mw({}, {:?})", self.0.id.0, self.0.mw_type)
    }
}

impl Mw {
    /// The window's handle.
    pub fn id(&self) -> crate::MwId {
        self.0.id
    }
    /// `ibv_bind_mw` (type 1) through `qp`'s send queue; returns the new rkey.
    pub fn bind(&self, qp: &Qp, bind: &crate::MwBind) -> Result<u32> {
        self.0.dev.bind_mw(qp.qpn(), self.0.id, bind)
    }
    /// `ibv_dealloc_mw` now.
    pub fn dealloc(self) -> std::result::Result<(), (Mw, Error)> {
        destroy_now(self.0, |t| &mut t.live, |t| t.dev.dealloc_mw(t.id))
            .map_err(|(a, e)| (Mw(a), e))
    }
}

/// A queue pair.
#[derive(Clone)]
pub struct Qp(Arc<QpInner>);

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Qp(0x{:06x})", self.0.id)
    }
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.0.id
    }
    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.0.dev.modify_qp(self.0.id, attr, mask)
    }
    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.0.dev.query_qp(self.0.id)?.0)
    }
    /// RESET -> INIT -> RTR -> RTS, connected to `remote` (see [`crate::connect_qp`]).
    pub fn connect(
        &self,
        params: &crate::QpParams,
        sq_psn: u32,
        remote: &crate::Endpoint,
    ) -> Result<()> {
        let qp_type = self.0.dev.query_qp(self.0.id)?.1.qp_type;
        crate::connect_qp(&*self.0.dev, self.0.id, qp_type, params, sq_psn, remote)
    }
    /// `ibv_post_send`.
    pub fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        self.0.dev.post_send(self.0.id, wrs)
    }
    /// `ibv_post_recv`.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        self.0.dev.post_recv(self.0.id, wrs)
    }
    /// `ibv_destroy_qp` now.
    pub fn destroy(self) -> std::result::Result<(), (Qp, Error)> {
        destroy_now(self.0, |t| &mut t.live, |t| t.dev.destroy_qp(t.id))
            .map_err(|(a, e)| (Qp(a), e))
    }
}

/// [`Cq::completions`]: what a CQ holds, oldest first.
#[derive(Debug)]
pub struct Completions<'a> {
    cq: &'a Cq,
    batch: Vec<WorkCompletion>,
    next: usize,
    done: bool,
}

impl Iterator for Completions<'_> {
    type Item = Result<WorkCompletion>;

    fn next(&mut self) -> Option<Result<WorkCompletion>> {
        if self.next == self.batch.len() {
            if self.done {
                return None;
            }
            self.batch.clear();
            self.next = 0;
            match self.cq.poll(16, &mut self.batch) {
                Ok(0) => {
                    self.done = true;
                    return None;
                }
                Ok(_) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
        self.next += 1;
        Some(Ok(self.batch[self.next - 1]))
    }
}

/// Builds a QP: [`Pd::qp`] gives one with working defaults, each method changes one.
#[derive(Debug)]
#[must_use = "a builder does nothing until build()"]
pub struct QpBuilder<'a> {
    pd: &'a Pd,
    qp_type: QpType,
    send_cq: &'a Cq,
    recv_cq: &'a Cq,
    srq: Option<&'a Srq>,
    cap: QpCap,
    sq_sig_all: bool,
}

impl<'a> QpBuilder<'a> {
    /// The queue sizes a QP gets unless told otherwise.
    pub const DEFAULT_CAP: QpCap = QpCap::new(128, 128);

    /// Receives complete on `cq` instead of the send CQ.
    pub fn recv_cq(mut self, cq: &'a Cq) -> Self {
        self.recv_cq = cq;
        self
    }
    /// Receives come from `srq` (then `post_recv` on the QP is EINVAL).
    pub fn srq(mut self, srq: &'a Srq) -> Self {
        self.srq = Some(srq);
        self
    }
    /// All queue sizes at once.
    pub fn cap(mut self, cap: QpCap) -> Self {
        self.cap = cap;
        self
    }
    /// Send WRs outstanding at most.
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.cap.max_send_wr = n;
        self
    }
    /// Receive WRs outstanding at most.
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.cap.max_recv_wr = n;
        self
    }
    /// SGEs per send and per receive WR.
    pub fn max_sge(mut self, n: u32) -> Self {
        self.cap.max_send_sge = n;
        self.cap.max_recv_sge = n;
        self
    }
    /// Bytes a send WR may carry inline.
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.cap.max_inline_data = n;
        self
    }
    /// Whether every send WR completes (true by default), or only those posted with
    /// `SendFlags::SIGNALED` (`sq_sig_all` 0, libibverbs' default).
    pub fn sq_sig_all(mut self, all: bool) -> Self {
        self.sq_sig_all = all;
        self
    }
    /// `ibv_create_qp`.
    pub fn build(self) -> Result<Qp> {
        self.pd.create_qp_on(
            self.send_cq,
            self.recv_cq,
            self.srq,
            self.qp_type,
            self.cap,
            self.sq_sig_all,
        )
    }
}
