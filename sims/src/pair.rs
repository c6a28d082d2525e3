//! Two connected hosts on a fabric, set up through `verbs_api` only (the RAII handles
//! over `Arc<dyn Device>`): what scenarios, tests and benchmarks start from.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use emu_core::nic::EmuDevice;
use verbs_api::{
    AccessFlags, AsyncEvent, Context, Cq, Device, Gid, MemBuf, Mr, Mtu, Pd, Qp, QpState, QpType,
    RecvWr, SendWr, Sge, WorkCompletion,
};

use crate::Fabric;

/// How the pair's QPs are made and connected.
#[derive(Clone, Copy, Debug)]
pub struct PairConfig {
    /// RC or UC.
    pub qp_type: QpType,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Local ACK timeout code (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Retries after a timeout or NAK.
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (7: forever).
    pub rnr_retry: u8,
    /// The RNR timer code the responder sends in its RNR NAKs.
    pub min_rnr_timer: u8,
    /// Outstanding READ/ATOMIC each side may issue and answer.
    pub rd_atomic: u8,
    /// CQ entries.
    pub cq_size: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Every send WR completes (else only SIGNALED ones).
    pub sq_sig_all: bool,
    /// Bytes of registered memory per host.
    pub mem_len: usize,
    /// Both sides' first PSN.
    pub psn: u32,
}

impl Default for PairConfig {
    fn default() -> Self {
        PairConfig {
            qp_type: QpType::Rc,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 4,
            cq_size: 256,
            max_send_wr: 128,
            max_recv_wr: 128,
            sq_sig_all: true,
            mem_len: 64 * 1024,
            psn: 100,
        }
    }
}

/// One side: a device and what a program holds.
#[derive(Debug)]
pub struct Host {
    /// Device name on the fabric.
    pub name: String,
    /// The device (for counters; use `ctx` for verbs).
    pub dev: Arc<EmuDevice>,
    /// The opened device.
    pub ctx: Context,
    /// Protection domain.
    pub pd: Pd,
    /// Registered memory.
    pub mem: MemBuf,
    /// Its region (local and remote read/write/atomic).
    pub mr: Mr,
    /// One CQ for sends and receives.
    pub cq: Cq,
    /// The QP.
    pub qp: Qp,
    fabric: Fabric,
}

/// The longest a wait lets virtual time run before giving up.
pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

impl Host {
    /// Opens device `name` at `ip` on `fabric`, with memory, a CQ and a QP.
    pub fn new(fabric: &Fabric, name: &str, ip: Ipv4Addr, cfg: &PairConfig) -> Host {
        let dev = fabric.add_device(name, ip).expect("add device");
        let ctx = Context::new(dev.clone() as Arc<dyn Device>);
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let mem = MemBuf::new(cfg.mem_len);
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = pd.reg_mr(&mem, access).expect("reg_mr");
        fabric.label(&format!("{name}.mem"), mr.info().addr, mr.info().length);
        let cq = ctx.create_cq(cfg.cq_size, None).expect("create_cq");
        let qp = pd
            .qp(cfg.qp_type, &cq)
            .max_send_wr(cfg.max_send_wr)
            .max_recv_wr(cfg.max_recv_wr)
            .max_sge(2)
            .sq_sig_all(cfg.sq_sig_all)
            .build()
            .expect("create_qp");
        Host {
            name: name.into(),
            dev,
            ctx,
            pd,
            mem,
            mr,
            cq,
            qp,
            fabric: fabric.clone(),
        }
    }

    /// An SGE over `len` bytes of this host's memory at `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        self.mr.sge(offset, len)
    }

    /// The remote address of `offset` in this host's memory.
    pub fn addr(&self, offset: u64) -> u64 {
        self.mr.addr(offset)
    }

    /// This host's rkey.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// Posts one receive of `len` bytes at `offset`.
    pub fn post_recv(&self, wr_id: u64, offset: u64, len: u32) {
        self.qp
            .post_recv(&[RecvWr::new(wr_id, vec![self.sge(offset, len)])])
            .expect("post_recv");
    }

    /// Posts send WRs.
    pub fn post(&self, wrs: &[SendWr]) {
        self.qp.post_send(wrs).expect("post_send");
    }

    /// Polls the CQ until `n` completions came, or nothing is left to happen on the
    /// fabric, or [`WAIT_LIMIT`] of virtual time passed; returns what came.
    pub fn wait(&self, n: usize) -> Vec<WorkCompletion> {
        let deadline = self.fabric.now() + WAIT_LIMIT;
        let mut out = Vec::new();
        loop {
            self.cq
                .poll(n - out.len().min(n), &mut out)
                .expect("poll_cq");
            if out.len() >= n || self.fabric.now() > deadline || !self.fabric.step() {
                // One last look: the step may have completed something.
                if out.len() < n {
                    self.cq.poll(n - out.len(), &mut out).expect("poll_cq");
                }
                return out;
            }
        }
    }

    /// Every asynchronous event queued on the device (the network moves on while
    /// none is).
    pub fn events(&self) -> Vec<AsyncEvent> {
        let mut v = Vec::new();
        while let Ok(e) = self.ctx.get_async_event(Some(Duration::ZERO)) {
            v.push(e);
        }
        v
    }

    /// The QP's state.
    pub fn state(&self) -> QpState {
        self.qp.query().expect("query_qp").qp_state
    }
}

/// Walks `me` RESET -> INIT -> RTR -> RTS towards `peer` (manual 3.5: the attributes
/// each transition requires).
pub fn connect(me: &Host, peer: &Host, cfg: &PairConfig) {
    let gid = peer.ctx.device().query_gid(1, 0).expect("query_gid");
    connect_qp(me.ctx.device(), me.qp.qpn(), gid, peer.qp.qpn(), cfg);
}

/// Walks QP `qpn` of `dev` RESET -> INIT -> RTR -> RTS towards QP `peer_qpn` at
/// `peer_gid`, through the Device trait alone.
pub fn connect_qp(dev: &dyn Device, qpn: u32, peer_gid: Gid, peer_qpn: u32, cfg: &PairConfig) {
    let rc = cfg.qp_type == QpType::Rc;
    let params = verbs_api::QpParams {
        access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | if rc {
                AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
            } else {
                AccessFlags::empty()
            },
        path_mtu: cfg.path_mtu,
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: cfg.rnr_retry,
        min_rnr_timer: cfg.min_rnr_timer,
        max_rd_atomic: cfg.rd_atomic,
        max_dest_rd_atomic: cfg.rd_atomic,
        ..verbs_api::QpParams::default()
    };
    let remote = verbs_api::Endpoint {
        qpn: peer_qpn,
        psn: cfg.psn,
        gid: peer_gid,
        ..verbs_api::Endpoint::default()
    };
    verbs_api::connect_qp(dev, qpn, cfg.qp_type, &params, cfg.psn, &remote)
        .expect("connect the QP");
}

/// Hosts `a` (192.0.2.1) and `b` (192.0.2.2, documentation addresses) on `fabric`, their QPs connected.
pub fn pair(fabric: &Fabric, cfg: &PairConfig) -> (Host, Host) {
    let a = Host::new(fabric, "a", Ipv4Addr::new(192, 0, 2, 1), cfg);
    let b = Host::new(fabric, "b", Ipv4Addr::new(192, 0, 2, 2), cfg);
    connect(&a, &b, cfg);
    connect(&b, &a, cfg);
    (a, b)
}
