//! What a case works with: one opened device and helpers that create and connect its
//! objects, post work and wait for completions. Failures panic with the reason (the
//! runner turns a panic into a failed case).

use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::{
    connect_qp, AccessFlags, AsyncEvent, CqId, Device, Endpoint, Gid, MemBuf, MrInfo, PdId, QpCap,
    QpInitAttr, QpParams, QpType, RecvWr, SendWr, Sge, WorkCompletion,
};

/// How long a case waits for a completion or an event before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// The environment of one case.
pub struct Env {
    /// The device under test.
    pub dev: Arc<dyn Device>,
    /// Whether the device is the emulator.
    pub emulator: bool,
    /// The backend's fault injection, if it has one (cases that need it are marked
    /// [`crate::Case::faulty`] and run only where it exists).
    pub faults: Option<Arc<dyn crate::Faults>>,
    /// The device runs on virtual time: polling moves it on, so no need to sleep.
    pub virtual_time: bool,
    /// The GID index of port 1 the QPs use (0 on the emulator; on rxe index 1 is the
    /// RoCEv2 link-local GID).
    pub gid_index: u8,
    /// Opens a connection manager over `dev`, if the backend has one.
    pub cm: Option<crate::CmOpener>,
}

/// One end of a connected pair: a QP with its own CQ and a registered buffer.
#[derive(Clone, Debug)]
pub struct End {
    /// QP number.
    pub qpn: u32,
    /// The CQ for both its send and receive completions.
    pub cq: CqId,
    /// Its buffer.
    pub buf: MemBuf,
    /// The buffer's registration (every access allowed).
    pub mr: MrInfo,
}

impl End {
    /// An SGE over `len` bytes of the buffer from `offset`.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.mr.addr + offset,
            length: len,
            lkey: self.mr.lkey,
        }
    }

    /// The buffer address at `offset` (for a peer's remote_addr).
    pub fn addr(&self, offset: u64) -> u64 {
        self.mr.addr + offset
    }
}

/// Two QPs of one type on one device, connected to each other.
#[derive(Clone, Debug)]
pub struct Pair {
    /// The protection domain of both.
    pub pd: PdId,
    /// The requester side, by convention.
    pub a: End,
    /// The responder side, by convention.
    pub b: End,
}

/// Size of each end's buffer.
pub const BUF: usize = 1 << 20;

/// Default queue sizes of the pairs.
pub fn default_cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// Every access flag an MR can have without MW_BIND.
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

impl Env {
    /// The device's GID at port 1 that the QPs use.
    pub fn gid(&self) -> Gid {
        self.dev
            .query_gid(1, u32::from(self.gid_index))
            .expect("query_gid")
    }

    /// [`fast_params`] with this device's GID index.
    pub fn params(&self) -> QpParams {
        QpParams {
            sgid_index: self.gid_index,
            ..fast_params()
        }
    }

    /// A new PD.
    pub fn pd(&self) -> PdId {
        self.dev.alloc_pd().expect("alloc_pd")
    }

    /// A new CQ of `cqe` entries, no channel.
    pub fn cq(&self, cqe: u32) -> CqId {
        self.dev.create_cq(cqe, None).expect("create_cq")
    }

    /// A registered buffer of `len` bytes.
    pub fn mr(&self, pd: PdId, len: usize, access: AccessFlags) -> (MemBuf, MrInfo) {
        let buf = MemBuf::new(len);
        let mr = self.dev.reg_mr(pd, &buf, 0, len, access).expect("reg_mr");
        (buf, mr)
    }

    /// A QP in RESET.
    pub fn qp(&self, pd: PdId, cq: CqId, qp_type: QpType, cap: QpCap) -> u32 {
        self.qp_signalling(pd, cq, qp_type, cap, false)
    }

    /// A QP in RESET whose every send WR completes when `sq_sig_all`.
    fn qp_signalling(
        &self,
        pd: PdId,
        cq: CqId,
        qp_type: QpType,
        cap: QpCap,
        sq_sig_all: bool,
    ) -> u32 {
        self.dev
            .create_qp(&QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                qp_type,
                cap,
                sq_sig_all,
                srq: None,
            })
            .expect("create_qp")
    }

    fn end(&self, pd: PdId, qp_type: QpType, cap: QpCap, cqe: u32, sq_sig_all: bool) -> End {
        let cq = self.cq(cqe);
        let qpn = self.qp_signalling(pd, cq, qp_type, cap, sq_sig_all);
        let (buf, mr) = self.mr(pd, BUF, all_access());
        End { qpn, cq, buf, mr }
    }

    /// Two QPs of `qp_type`, connected with `params` (UD QPs are only brought to RTS).
    pub fn pair_with(&self, qp_type: QpType, params: &QpParams, cap: QpCap, cqe: u32) -> Pair {
        self.pair_signalling(qp_type, params, cap, cqe, false)
    }

    /// [`Env::pair_with`], the requester `a` with `sq_sig_all` as given (every send WR
    /// completes, signalled or not).
    pub fn pair_signalling(
        &self,
        qp_type: QpType,
        params: &QpParams,
        cap: QpCap,
        cqe: u32,
        a_sq_sig_all: bool,
    ) -> Pair {
        let pd = self.pd();
        let a = self.end(pd, qp_type, cap, cqe, a_sq_sig_all);
        let b = self.end(pd, qp_type, cap, cqe, false);
        let gid = self.gid();
        let (pa, pb) = (0x10_0000, 0x20_0000);
        let ea = Endpoint {
            lid: 0,
            qpn: a.qpn,
            psn: pa,
            gid,
        };
        let eb = Endpoint {
            lid: 0,
            qpn: b.qpn,
            psn: pb,
            gid,
        };
        connect_qp(&*self.dev, a.qpn, qp_type, params, pa, &eb).expect("connect a");
        connect_qp(&*self.dev, b.qpn, qp_type, params, pb, &ea).expect("connect b");
        Pair { pd, a, b }
    }

    /// Two connected QPs of `qp_type` with the default parameters (every remote access
    /// allowed, short timeouts so error cases finish quickly).
    pub fn pair(&self, qp_type: QpType) -> Pair {
        self.pair_with(qp_type, &self.params(), default_cap(), 256)
    }

    /// Posts one send WR on `qpn`; panics if the post fails.
    pub fn post_send(&self, qpn: u32, wr: SendWr) {
        self.dev
            .post_send(qpn, std::slice::from_ref(&wr))
            .unwrap_or_else(|e| panic!("post_send {wr:?}: {e:?}"));
    }

    /// Posts one receive WR on `qpn`; panics if the post fails.
    pub fn post_recv(&self, qpn: u32, wr: RecvWr) {
        self.dev
            .post_recv(qpn, std::slice::from_ref(&wr))
            .unwrap_or_else(|e| panic!("post_recv {wr:?}: {e:?}"));
    }

    /// Waits for the next completion on `cq` (panics after [`WAIT`]).
    pub fn poll_one(&self, cq: CqId) -> WorkCompletion {
        self.try_poll(cq, WAIT)
            .unwrap_or_else(|| panic!("no completion on CQ {} within {WAIT:?}", cq.0))
    }

    /// The next completion on `cq`, if one comes within `within`.
    pub fn try_poll(&self, cq: CqId, within: Duration) -> Option<WorkCompletion> {
        let deadline = Instant::now() + within;
        let mut out = Vec::with_capacity(1);
        loop {
            out.clear();
            self.dev.poll_cq(cq, 1, &mut out).expect("poll_cq");
            if let Some(wc) = out.pop() {
                return Some(wc);
            }
            if Instant::now() > deadline {
                return None;
            }
            if !self.virtual_time {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Asserts that no completion arrives on `cq` within `within`.
    pub fn assert_no_completion(&self, cq: CqId, within: Duration) {
        if let Some(wc) = self.try_poll(cq, within) {
            panic!("unexpected completion {wc:?}");
        }
    }

    /// The fault-injection capability (the case is marked faulty, so it exists).
    pub fn faults(&self) -> &dyn crate::Faults {
        self.faults
            .as_deref()
            .expect("a faulty case runs only with fault injection")
    }

    /// Waits for the next async event (panics after [`WAIT`]).
    pub fn next_event(&self) -> AsyncEvent {
        self.dev
            .get_async_event(Some(WAIT))
            .expect("an async event within the wait")
    }
}

/// Parameters with every remote access allowed and short timers: a lost peer shows up
/// in milliseconds (timeout 10 = 4 ms per try), RNR waits 0.01 ms (timer code 1).
pub fn fast_params() -> QpParams {
    QpParams {
        access: all_access(),
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..QpParams::default()
    }
}
