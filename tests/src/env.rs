//! What a case works with: one opened device and helpers that create and connect its
//! objects, post work and wait for completions. Failures panic with the reason (the
//! runner turns a panic into a failed case).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::{
    connect_qp, AccessFlags, AsyncEvent, AsyncEventType, ChannelId, CqId, Device, Endpoint,
    EventElement, Gid, MemBuf, MrInfo, PdId, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpParams,
    QpState, QpType, RecvWr, SendWr, Sge, SrqAttr, SrqId, UdDest, WorkCompletion,
};

/// How long a case waits for a completion or an event before failing.
pub const WAIT: Duration = Duration::from_secs(10);

/// The environment of one case. A clone shares the device (for the threads of a case).
#[derive(Clone)]
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
    /// The SRQ `b` takes its receives from, if it has one ([`PairSpec::b_srq`]).
    pub srq: Option<SrqId>,
}

/// Size of each end's buffer.
pub const BUF: usize = 1 << 20;

/// The first PSN the requester `a` of a pair sends.
pub const PSN_A: u32 = 0x10_0000;
/// The first PSN the responder `b` of a pair sends.
pub const PSN_B: u32 = 0x20_0000;

/// The states a QP passes through on its way from RESET to RTS, in order.
const STEPS: [QpState; 3] = [QpState::Init, QpState::Rtr, QpState::Rts];

/// How far each QP of a pair is brought up, and what else it is built with.
#[derive(Clone, Copy, Debug)]
pub struct PairSpec {
    /// The state `a` stops in (INIT, RTR or RTS).
    pub a_upto: QpState,
    /// The state `b` stops in (INIT, RTR or RTS).
    pub b_upto: QpState,
    /// `a` completes every send WR (`sq_sig_all`).
    pub a_sq_sig_all: bool,
    /// The SRQ `b` takes its receives from, created in the pair's PD with these sizes.
    pub b_srq: Option<SrqAttr>,
}

impl Default for PairSpec {
    fn default() -> Self {
        PairSpec {
            a_upto: QpState::Rts,
            b_upto: QpState::Rts,
            a_sq_sig_all: false,
            b_srq: None,
        }
    }
}

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
    /// The environment of a device `backend` opened.
    pub fn from_opened(opened: crate::Opened, backend: &dyn crate::Backend) -> Env {
        Env {
            dev: opened.dev,
            emulator: backend.is_emulator(),
            faults: opened.faults,
            virtual_time: opened.virtual_time,
            gid_index: opened.gid_index,
            cm: opened.cm,
        }
    }

    /// The device's GID at port 1 that the QPs use.
    pub fn gid(&self) -> Gid {
        self.dev
            .query_gid(1, u32::from(self.gid_index))
            .expect("query_gid")
    }

    /// The IP address of the device's GID ([`Env::gid`]): IPv4 for an IPv4-mapped GID,
    /// IPv6 otherwise (IBTA Vol 1 Annex A17: a RoCEv2 GID is the interface's address).
    pub fn ip(&self) -> IpAddr {
        let g = self.gid();
        match g.to_ipv4() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(g.to_ipv6()),
        }
    }

    /// A multicast group of the device's address family, named by an IPv4 group:
    /// `v4` itself on an IPv4 device; on an IPv6 device the site-local group
    /// `ff05::` with `v4`'s 32 bits at the end (ff05::239.1.2.3 for 239.1.2.3), so a
    /// case's groups stay distinct in either family.
    pub fn mcast_ip(&self, v4: Ipv4Addr) -> IpAddr {
        match self.ip() {
            IpAddr::V4(_) => IpAddr::V4(v4),
            IpAddr::V6(_) => {
                let [a, b, c, d] = v4.octets();
                IpAddr::V6(Ipv6Addr::new(
                    0xff05,
                    0,
                    0,
                    0,
                    0,
                    0,
                    u16::from_be_bytes([a, b]),
                    u16::from_be_bytes([c, d]),
                ))
            }
        }
    }

    /// [`Env::mcast_ip`] as a RoCEv2 GID (`::ffff:239.1.2.3` or `ff05::ef01:203`).
    pub fn mcast_gid(&self, v4: Ipv4Addr) -> Gid {
        match self.mcast_ip(v4) {
            IpAddr::V4(v4) => Gid::from_ipv4(v4),
            IpAddr::V6(v6) => Gid::from_ipv6(v6),
        }
    }

    /// Why a datagram sent to a multicast group cannot reach this host's members, if it
    /// cannot: Linux's `lo` carries no IPv6 multicast (a send out of it is
    /// ENETUNREACH), so an emulated device on the IPv6 loopback address joins groups but
    /// never hears them. On an IPv6 address of any other interface (a veth, as
    /// `scripts/ci-ipv6.sh` runs the suite) delivery works.
    pub fn no_multicast_delivery(&self) -> Option<String> {
        match self.ip() {
            IpAddr::V6(v6) if self.emulator && v6.is_loopback() => Some(format!(
                "Linux's lo carries no IPv6 multicast: a device on {v6} never hears a group \
                 (run on an IPv6 address of another interface)"
            )),
            _ => None,
        }
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
        self.qp_signalling(pd, cq, qp_type, cap, false, None)
    }

    /// A QP in RESET whose every send WR completes when `sq_sig_all`, taking its
    /// receives from `srq` if given.
    fn qp_signalling(
        &self,
        pd: PdId,
        cq: CqId,
        qp_type: QpType,
        cap: QpCap,
        sq_sig_all: bool,
        srq: Option<SrqId>,
    ) -> u32 {
        self.dev
            .create_qp(
                &QpInitAttr::new(pd, cq, qp_type, cap)
                    .sq_sig_all(sq_sig_all)
                    .srq(srq),
            )
            .expect("create_qp")
    }

    fn end(
        &self,
        pd: PdId,
        qp_type: QpType,
        cap: QpCap,
        cqe: u32,
        sq_sig_all: bool,
        srq: Option<SrqId>,
    ) -> End {
        let cq = self.cq(cqe);
        let qpn = self.qp_signalling(pd, cq, qp_type, cap, sq_sig_all, srq);
        let (buf, mr) = self.mr(pd, BUF, all_access());
        End { qpn, cq, buf, mr }
    }

    /// The endpoint a peer of QP `qpn` connects to: its number, the PSN it sends
    /// first, this device's GID.
    pub fn endpoint(&self, qpn: u32, psn: u32) -> Endpoint {
        Endpoint {
            lid: 0,
            qpn,
            psn,
            gid: self.gid(),
        }
    }

    /// Moves QP `qpn` of `qp_type`, now in `from` (RESET, INIT or RTR), up the
    /// connection steps to `to` (manual 3.5.2-3.5.4): connected to `remote`, sending
    /// from PSN `sq_psn`.
    #[allow(clippy::too_many_arguments)]
    pub fn raise(
        &self,
        qpn: u32,
        qp_type: QpType,
        params: &QpParams,
        sq_psn: u32,
        remote: &Endpoint,
        from: QpState,
        to: QpState,
    ) {
        let start = STEPS.iter().position(|&s| s == from).map_or(0, |i| i + 1);
        for &s in STEPS[start..]
            .iter()
            .take_while(|&&s| s.as_u32() <= to.as_u32())
        {
            let (attr, mask) = match s {
                QpState::Init => params.init(qp_type),
                QpState::Rtr => params.rtr(qp_type, remote),
                _ => params.rts(qp_type, sq_psn),
            };
            self.dev
                .modify_qp(qpn, &attr, mask)
                .unwrap_or_else(|e| panic!("QP {qpn} from {from:?} to {s:?}: {e:?}"));
        }
    }

    /// Moves end `a` (or `b`, when `a` is false) of pair `p`, now in `from`, up to
    /// `to`, connected to the other end as [`Env::pair_spec`] connects them.
    pub fn raise_end(
        &self,
        p: &Pair,
        qp_type: QpType,
        params: &QpParams,
        a: bool,
        from: QpState,
        to: QpState,
    ) {
        let (me, psn, peer, peer_psn) = if a {
            (p.a.qpn, PSN_A, p.b.qpn, PSN_B)
        } else {
            (p.b.qpn, PSN_B, p.a.qpn, PSN_A)
        };
        self.raise(
            me,
            qp_type,
            params,
            psn,
            &self.endpoint(peer, peer_psn),
            from,
            to,
        );
    }

    /// Two QPs of `qp_type` in one PD, connected to each other with `params` as far
    /// as `spec` says (UD QPs are only brought up).
    pub fn pair_spec(
        &self,
        qp_type: QpType,
        params: &QpParams,
        cap: QpCap,
        cqe: u32,
        spec: &PairSpec,
    ) -> Pair {
        let pd = self.pd();
        let srq = spec
            .b_srq
            .map(|attr| self.dev.create_srq(pd, &attr).expect("create_srq"));
        let a = self.end(pd, qp_type, cap, cqe, spec.a_sq_sig_all, None);
        let b = self.end(pd, qp_type, cap, cqe, false, srq);
        let p = Pair { pd, a, b, srq };
        self.raise_end(&p, qp_type, params, true, QpState::Reset, spec.a_upto);
        self.raise_end(&p, qp_type, params, false, QpState::Reset, spec.b_upto);
        p
    }

    /// Two RC QPs of PD `pd` connected with the default parameters, the responder `b`
    /// taking its receives from `srq`.
    pub fn pair_on_srq(&self, pd: PdId, srq: SrqId, cap: QpCap, cqe: u32) -> Pair {
        let a = self.end(pd, QpType::Rc, cap, cqe, false, None);
        let b = self.end(pd, QpType::Rc, cap, cqe, false, Some(srq));
        let p = Pair {
            pd,
            a,
            b,
            srq: Some(srq),
        };
        let params = self.params();
        self.raise_end(&p, QpType::Rc, &params, true, QpState::Reset, QpState::Rts);
        self.raise_end(&p, QpType::Rc, &params, false, QpState::Reset, QpState::Rts);
        p
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
        let spec = PairSpec {
            a_sq_sig_all,
            ..PairSpec::default()
        };
        self.pair_spec(qp_type, params, cap, cqe, &spec)
    }

    /// [`Env::pair_signalling`] in PD `pd` (another pair's, for cases that need two
    /// connections in one PD).
    pub fn pair_in(
        &self,
        pd: PdId,
        qp_type: QpType,
        params: &QpParams,
        cap: QpCap,
        cqe: u32,
        a_sq_sig_all: bool,
    ) -> Pair {
        let a = self.end(pd, qp_type, cap, cqe, a_sq_sig_all, None);
        let b = self.end(pd, qp_type, cap, cqe, false, None);
        let p = Pair {
            pd,
            a,
            b,
            srq: None,
        };
        self.raise_end(&p, qp_type, params, true, QpState::Reset, QpState::Rts);
        self.raise_end(&p, qp_type, params, false, QpState::Reset, QpState::Rts);
        p
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

    /// Moves QP `qpn` to `state` with a modify that carries the state alone (RESET,
    /// ERR, SQD->RTS, SQE->RTS); panics if it is refused.
    pub fn set_state(&self, qpn: u32, state: QpState) {
        let attr = QpAttr {
            qp_state: state,
            ..QpAttr::default()
        };
        self.dev
            .modify_qp(qpn, &attr, QpAttrMask::STATE)
            .unwrap_or_else(|e| panic!("QP {qpn} to {state:?}: {e:?}"));
    }

    /// The state QP `qpn` reports.
    pub fn state_of(&self, qpn: u32) -> QpState {
        self.dev.query_qp(qpn).expect("query_qp").0.qp_state
    }

    /// Waits until QP `qpn` reports `state` (a device may move a QP just after it
    /// writes the completion that caused the move); panics after [`WAIT`].
    pub fn wait_state(&self, qpn: u32, state: QpState) {
        let deadline = Instant::now() + WAIT;
        loop {
            let now = self.state_of(qpn);
            if now == state {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "QP {qpn} is in {now:?}, not {state:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Moves QP `qpn` from RTS to SQD asking for the SQ_DRAINED event, and waits for
    /// it (IBTA 10.3.1: only a drained QP may go back to RTS).
    pub fn drain_to_sqd(&self, qpn: u32) {
        let attr = QpAttr {
            qp_state: QpState::Sqd,
            en_sqd_async_notify: true,
            ..QpAttr::default()
        };
        self.dev
            .modify_qp(
                qpn,
                &attr,
                QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY,
            )
            .unwrap_or_else(|e| panic!("QP {qpn} to SQD: {e:?}"));
        let ev = self.next_event();
        assert_eq!(
            (ev.event_type, ev.element),
            (AsyncEventType::SqDrained, EventElement::Qp(qpn)),
            "{ev:?}"
        );
    }

    /// The destination of a UD send to QP `remote_qpn` of this device: an AH in `pd`
    /// and the Q_Key of [`Env::params`].
    pub fn ud_dest(&self, pd: PdId, remote_qpn: u32) -> UdDest {
        let ah = self
            .dev
            .create_ah(pd, &self.params().ah_attr(self.gid()))
            .expect("create_ah");
        UdDest {
            ah,
            remote_qpn,
            remote_qkey: self.params().qkey,
        }
    }

    /// Runs `f(env, i)` for `i` in `0..n`, each on a thread of its own with a clone of
    /// this environment, and returns the results in the order of `i`. A thread that
    /// panics fails the case with its message; threads not done within `within` (a
    /// deadlock, a lost completion) fail it too, without waiting for them: they are left
    /// behind, so the suite goes on.
    pub fn on_threads<R: Send + 'static>(
        &self,
        n: usize,
        within: Duration,
        f: impl Fn(&Env, usize) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        let f = Arc::new(f);
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..n {
            let (env, f, tx) = (self.clone(), f.clone(), tx.clone());
            std::thread::spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&env, i)));
                let _ = tx.send((i, r));
            });
        }
        let deadline = Instant::now() + within;
        let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
        for _ in 0..n {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((i, Ok(r))) => out[i] = Some(r),
                Ok((i, Err(p))) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".into());
                    panic!("thread {i} of {n}: {msg}");
                }
                Err(_) => {
                    let stuck: Vec<_> = (0..n).filter(|&i| out[i].is_none()).collect();
                    panic!("threads {stuck:?} of {n} not done within {within:?} (deadlock?)");
                }
            }
        }
        out.into_iter()
            .map(|r| r.expect("every thread reported"))
            .collect()
    }

    /// An RC QP connected to itself (its WRs complete on its own CQ), the CQ of 64
    /// entries on a new completion channel, and a region of 4 KiB in the QP's PD with
    /// every access: (channel, CQ, QP number, buffer, region).
    pub fn self_loop(&self) -> (ChannelId, CqId, u32, MemBuf, MrInfo) {
        let ch = self.dev.create_comp_channel().expect("create_comp_channel");
        let cq = self
            .dev
            .create_cq(64, Some(ch))
            .expect("create_cq on channel");
        let pd = self.pd();
        let qpn = self.loop_qp(pd, cq);
        let (buf, mr) = self.mr(pd, 4096, all_access());
        (ch, cq, qpn, buf, mr)
    }

    /// An RC QP of `pd` on `cq` (for both queues) connected to itself; its number.
    pub fn loop_qp(&self, pd: PdId, cq: CqId) -> u32 {
        let qpn = self.qp(pd, cq, QpType::Rc, default_cap());
        self.connect_self(qpn);
        qpn
    }

    /// Connects RC QP `qpn` (in RESET) to itself and brings it to RTS.
    pub fn connect_self(&self, qpn: u32) {
        let me = Endpoint {
            lid: 0,
            qpn,
            psn: 1,
            gid: self.gid(),
        };
        connect_qp(&*self.dev, qpn, QpType::Rc, &self.params(), 1, &me).expect("connect");
    }

    /// An RC QP in RESET of `pd` on `cq` that takes its receives from `srq`.
    pub fn srq_qp(&self, pd: PdId, cq: CqId, srq: verbs_api::SrqId) -> u32 {
        self.dev
            .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, default_cap()).srq(srq))
            .expect("create_qp on the SRQ")
    }

    /// Sends 64 bytes from `p.a` (wr_id 1) into the receive b has posted (wr_id 9),
    /// which must fail locally: the receive completes with LOC_PROT_ERR and the SEND
    /// with REM_OP_ERR (IBTA 9.9: the responder's local error is a remote operational
    /// error for the requester; manual 6.2.5, 6.2.12).
    pub fn send_fails_the_receive(&self, p: &Pair) {
        self.post_send(p.a.qpn, SendWr::send(1, vec![p.a.sge(0, 64)]).signaled());
        let wc = self.poll_one(p.a.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (1, verbs_api::WcStatus::RemOpErr),
            "sender: {wc:?}"
        );
        let wc = self.poll_one(p.b.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (9, verbs_api::WcStatus::LocProtErr),
            "receiver: {wc:?}"
        );
    }

    /// Moves QP `qpn` to ERR (manual 3.5.2 ibv_modify_qp; any state may go there).
    pub fn to_err(&self, qpn: u32) {
        let attr = verbs_api::QpAttr {
            qp_state: verbs_api::QpState::Err,
            ..verbs_api::QpAttr::default()
        };
        self.dev
            .modify_qp(qpn, &attr, verbs_api::QpAttrMask::STATE)
            .expect("modify_qp to ERR");
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
