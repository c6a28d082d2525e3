//! The soak's traffic: RC pairs that WRITE, READ, SEND and FETCH_ADD in seeded batches
//! and check every byte against a shadow of the responder's memory, and one UC and one
//! UD stream of numbered messages whose every delivered byte is checked. Each flow is a
//! state machine the driver steps from one thread (so on the fabric the whole run is
//! deterministic).

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use emu_core::nic::EmuDevice;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use verbs_api::*;

use super::faults::mix;
use super::junk::{Junk, Target};

/// Bytes of one slot: each op of a batch works in its own slot.
const SLOT: usize = 16 * 1024;
/// Ops in a batch at most (slots).
const SLOTS: usize = 4;
/// The active side's buffer: the op slots, then 8 bytes per slot for atomic results.
const ACTIVE_LEN: usize = SLOTS * SLOT + 8 * SLOTS;
/// The passive side's buffer: the RDMA slots, the receive slots, the atomic counter.
const RECV_AT: usize = SLOTS * SLOT;
const COUNTER_AT: usize = 2 * SLOTS * SLOT;
const PASSIVE_LEN: usize = COUNTER_AT + 8;
/// The path MTU's bytes (IBV_MTU_1024): PSNs per message.
const MTU: usize = 1024;

/// Statuses an RC completion may end with under the soak's faults and restart: the
/// retries ran out (the peer is gone, or the path lost too much) and the flush of what
/// was queued behind. Anything else is a failure.
pub(crate) fn clean_error(s: WcStatus) -> bool {
    matches!(
        s,
        WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr | WcStatus::WrFlushErr
    )
}

/// What the flows counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// RC batches completed (successfully or not).
    pub batches: u64,
    /// Work requests that completed successfully and were checked.
    pub ops: u64,
    /// Bytes checked (written, read, sent or delivered).
    pub bytes: u64,
    /// Completions by status (name, count), in first-seen order.
    pub statuses: Vec<(WcStatus, u64)>,
    /// RC connections that failed (and were made anew) though no peer restarted.
    pub lost_connections: u64,
    /// RC connections that failed because their peer restarted.
    pub restart_failures: u64,
    /// Longest time from a restart to the failure of a survivor's QP.
    pub restart_detect: Duration,
    /// UC/UD messages sent.
    pub dg_sent: u64,
    /// UC/UD messages delivered (and checked).
    pub dg_delivered: u64,
    /// UC/UD messages delivered again (a duplicated or delayed packet: neither
    /// transport detects duplicates).
    pub dg_duplicates: u64,
}

impl FlowStats {
    pub(crate) fn status(&mut self, s: WcStatus) {
        match self.statuses.iter_mut().find(|(k, _)| *k == s) {
            Some((_, n)) => *n += 1,
            None => self.statuses.push((s, 1)),
        }
    }
}

/// What a flow needs of the run.
pub(crate) struct Ctx<'a> {
    pub(crate) devs: &'a [Option<Arc<EmuDevice>>],
    pub(crate) ips: &'a [Ipv4Addr],
    pub(crate) now: Duration,
    /// No new batches: the run is ending.
    pub(crate) draining: bool,
    pub(crate) junk: Option<&'a Junk>,
    pub(crate) stats: &'a mut FlowStats,
    /// How long a batch may take before the run calls it a hang.
    pub(crate) hang: Duration,
}

/// One side of a connection: its objects on one device.
struct Side {
    pd: PdId,
    cq: CqId,
    qpn: u32,
    mr: MrInfo,
    buf: MemBuf,
}

fn side(dev: &EmuDevice, qp_type: QpType, len: usize) -> Result<Side> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(256, None)?;
    let qpn =
        dev.create_qp(&QpInitAttr::new(pd, cq, qp_type, QpCap::new(32, 32)).sq_sig_all(true))?;
    let buf = MemBuf::new(len);
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = dev.reg_mr(pd, &buf, 0, len, access)?;
    Ok(Side {
        pd,
        cq,
        qpn,
        mr,
        buf,
    })
}

/// Frees a side's objects (errors ignored: the device may be failing; a closed device
/// frees everything anyway).
fn free(dev: &EmuDevice, s: &Side) {
    let _ = dev.destroy_qp(s.qpn);
    let _ = dev.dereg_mr(s.mr.lkey);
    let _ = dev.destroy_cq(s.cq);
    let _ = dev.dealloc_pd(s.pd);
}

fn params() -> QpParams {
    QpParams {
        access: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        path_mtu: Mtu::Mtu1024,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        qkey: 0x5011_ca05,
        ..QpParams::default()
    }
}

fn connect(
    dev: &EmuDevice,
    me: &Side,
    qp_type: QpType,
    my_psn: u32,
    peer: &Side,
    peer_psn: u32,
    peer_ip: Ipv4Addr,
) -> Result<()> {
    let remote = verbs_api::Endpoint {
        qpn: peer.qpn,
        psn: peer_psn,
        gid: Gid::from_ipv4(peer_ip),
        ..verbs_api::Endpoint::default()
    };
    connect_qp(dev, me.qpn, qp_type, &params(), my_psn, &remote)
}

/// One op of a batch, in its slot.
#[derive(Clone, Debug)]
enum Op {
    Write { off: usize, data: Vec<u8> },
    Read { off: usize, len: usize },
    Send { data: Vec<u8> },
    FetchAdd { add: u64 },
}

impl Op {
    fn psns(&self) -> u32 {
        let len = match self {
            Op::Write { data, .. } | Op::Send { data } => data.len(),
            Op::Read { len, .. } => *len,
            Op::FetchAdd { .. } => 0,
        };
        len.div_ceil(MTU).max(1) as u32
    }
}

struct Batch {
    ops: Vec<Op>,
    posted_at: Duration,
    /// The requester's completion of each op.
    done: Vec<Option<WorkCompletion>>,
    /// The responder's receive completion of each SEND.
    recvd: Vec<Option<WorkCompletion>>,
    /// An error was seen: the QPs are being torn down.
    failed: bool,
}

impl Batch {
    fn requester_done(&self) -> bool {
        self.done.iter().all(Option::is_some)
    }
    fn receives_done(&self) -> bool {
        self.ops
            .iter()
            .zip(&self.recvd)
            .all(|(op, r)| !matches!(op, Op::Send { .. }) || r.is_some())
    }
}

/// An RC connection between an active side (which posts every op) and a passive
/// side (which posts receives for the SENDs), remade whenever it fails.
pub(crate) struct RcFlow {
    id: usize,
    seed: u64,
    active: usize,
    passive: usize,
    gen: u32,
    rng: ChaCha8Rng,
    conn: Option<(Side, Side)>,
    /// The passive device closed under this connection: its objects are gone, its
    /// memory is still ours to check.
    passive_gone: bool,
    /// When the passive device restarted, while the survivor's QP has not failed yet.
    restarted_at: Option<Duration>,
    /// What the responder's RDMA slots and counter must hold.
    shadow: Vec<u8>,
    counter: u64,
    batch: Option<Batch>,
    /// The PSN the requester sends next (for the junk's wrong PSNs).
    psn: Arc<AtomicU32>,
}

impl RcFlow {
    pub(crate) fn new(id: usize, seed: u64, active: usize, passive: usize) -> RcFlow {
        RcFlow {
            id,
            seed,
            active,
            passive,
            gen: 0,
            rng: ChaCha8Rng::seed_from_u64(0),
            conn: None,
            passive_gone: false,
            restarted_at: None,
            shadow: vec![0; RECV_AT],
            counter: 0,
            batch: None,
            psn: Arc::new(AtomicU32::new(0)),
        }
    }

    /// The devices it runs between (active, passive).
    pub(crate) fn devices(&self) -> (usize, usize) {
        (self.active, self.passive)
    }

    /// Whether it has work outstanding.
    pub(crate) fn busy(&self) -> bool {
        self.batch.is_some() || self.restarted_at.is_some()
    }

    /// Device `d` closed.
    pub(crate) fn closed(&mut self, d: usize, now: Duration) {
        if d == self.passive && self.conn.is_some() {
            self.passive_gone = true;
            self.restarted_at = Some(now);
        }
        assert_ne!(d, self.active, "the soak never restarts an active side");
    }

    fn make(&mut self, cx: &mut Ctx<'_>) -> std::result::Result<(), String> {
        let (Some(a), Some(p)) = (&cx.devs[self.active], &cx.devs[self.passive]) else {
            return Ok(());
        };
        self.gen += 1;
        self.rng = ChaCha8Rng::seed_from_u64(mix(self.seed
            ^ (self.id as u64) << 40
            ^ u64::from(self.gen)));
        let err = |e: Error| format!("RC flow {}: setting up: {e}", self.id);
        let sa = side(a, QpType::Rc, ACTIVE_LEN).map_err(err)?;
        let sp = side(p, QpType::Rc, PASSIVE_LEN).map_err(err)?;
        let (psn_a, psn_p) = (
            self.rng.gen_range(0..1 << 24),
            self.rng.gen_range(0..1 << 24),
        );
        connect(a, &sa, QpType::Rc, psn_a, &sp, psn_p, cx.ips[self.passive]).map_err(err)?;
        connect(p, &sp, QpType::Rc, psn_p, &sa, psn_a, cx.ips[self.active]).map_err(err)?;
        // The responder's memory starts as a known pattern.
        let init: Vec<u8> = (0..RECV_AT).map(|_| self.rng.gen()).collect();
        sp.buf.write(0, &init).map_err(err)?;
        self.shadow = init;
        self.counter = self.rng.gen();
        sp.buf.write_u64(COUNTER_AT, self.counter).map_err(err)?;
        self.psn.store(psn_a, Ordering::Relaxed);
        if let Some(j) = cx.junk {
            j.add_qpn(self.active, sa.qpn);
            j.add_qpn(self.passive, sp.qpn);
            j.set_target(
                self.passive,
                Target {
                    flow: self.id,
                    qpn: sp.qpn,
                    rkey: sp.mr.rkey,
                    addr: sp.mr.addr,
                    peer: cx.ips[self.active],
                    psn: self.psn.clone(),
                },
            );
        }
        self.passive_gone = false;
        self.conn = Some((sa, sp));
        Ok(())
    }

    /// Posts the next batch.
    fn post(&mut self, cx: &mut Ctx<'_>) -> std::result::Result<(), String> {
        let (a, p) = self.conn.as_ref().expect("connected");
        let n = self.rng.gen_range(1..=SLOTS);
        let mut ops = Vec::with_capacity(n);
        for _ in 0..n {
            let len = match self.rng.gen_range(0..100) {
                0..=2 => 0,
                3..=52 => self.rng.gen_range(1..=256),
                53..=82 => self.rng.gen_range(257..=4096),
                _ => self.rng.gen_range(4097..=SLOT),
            };
            let off = self.rng.gen_range(0..=SLOT - len);
            let op = match self.rng.gen_range(0..100) {
                0..=34 => Op::Write {
                    off,
                    data: (0..len).map(|_| self.rng.gen()).collect(),
                },
                35..=59 => Op::Read { off, len },
                60..=84 => Op::Send {
                    data: (0..len).map(|_| self.rng.gen()).collect(),
                },
                _ => Op::FetchAdd {
                    add: self.rng.gen_range(1..1 << 20),
                },
            };
            ops.push(op);
        }
        let mut recvs = Vec::new();
        let mut wrs = Vec::new();
        let mut psns = 0;
        for (slot, op) in ops.iter().enumerate() {
            let local = a.mr.addr + (slot * SLOT) as u64;
            let remote = p.mr.addr + (slot * SLOT) as u64;
            let id = slot as u64;
            psns += op.psns();
            let wr = match op {
                Op::Write { off, data } => {
                    a.buf
                        .write(slot * SLOT + off, data)
                        .map_err(|e| e.to_string())?;
                    let sge = Sge::new(local + *off as u64, data.len() as u32, a.mr.lkey);
                    SendWr::rdma_write(id, vec![sge], remote + *off as u64, p.mr.rkey)
                }
                Op::Read { off, len } => {
                    // Scribble over the destination, so a READ that moves nothing shows.
                    a.buf
                        .write(slot * SLOT + off, &vec![0xA5; *len])
                        .map_err(|e| e.to_string())?;
                    let sge = Sge::new(local + *off as u64, *len as u32, a.mr.lkey);
                    SendWr::rdma_read(id, vec![sge], remote + *off as u64, p.mr.rkey)
                }
                Op::Send { data } => {
                    a.buf.write(slot * SLOT, data).map_err(|e| e.to_string())?;
                    let rsge = Sge::new(
                        p.mr.addr + (RECV_AT + slot * SLOT) as u64,
                        SLOT as u32,
                        p.mr.lkey,
                    );
                    recvs.push(RecvWr::new(id, vec![rsge]));
                    SendWr::send(id, vec![Sge::new(local, data.len() as u32, a.mr.lkey)])
                }
                Op::FetchAdd { add } => {
                    let at = SLOTS * SLOT + 8 * slot;
                    a.buf.write_u64(at, 0).map_err(|e| e.to_string())?;
                    let sge = Sge::new(a.mr.addr + at as u64, 8, a.mr.lkey);
                    SendWr::atomic_fetch_add(
                        id,
                        sge,
                        p.mr.addr + COUNTER_AT as u64,
                        p.mr.rkey,
                        *add,
                    )
                }
            };
            wrs.push(wr);
        }
        let (Some(ad), Some(pd)) = (&cx.devs[self.active], &cx.devs[self.passive]) else {
            return Err("posting without devices".into());
        };
        if !recvs.is_empty() && !self.passive_gone {
            pd.post_recv(p.qpn, &recvs)
                .map_err(|e| format!("RC flow {}: post_recv: {e}", self.id))?;
        }
        // A QP the engine moved to the error state takes the posts and flushes them.
        ad.post_send(a.qpn, &wrs)
            .map_err(|e| format!("RC flow {}: post_send: {e}", self.id))?;
        self.psn.fetch_add(psns, Ordering::Relaxed);
        self.batch = Some(Batch {
            done: vec![None; ops.len()],
            recvd: vec![None; ops.len()],
            ops,
            posted_at: cx.now,
            failed: false,
        });
        Ok(())
    }

    /// One step: connect, post, poll, check. True if anything happened.
    pub(crate) fn step(&mut self, cx: &mut Ctx<'_>) -> std::result::Result<bool, String> {
        if self.conn.is_none() {
            if cx.draining || cx.devs[self.active].is_none() || cx.devs[self.passive].is_none() {
                return Ok(false);
            }
            self.make(cx)?;
            return Ok(true);
        }
        if self.batch.is_none() {
            if cx.draining && self.restarted_at.is_none() {
                return Ok(false);
            }
            self.post(cx)?;
            return Ok(true);
        }
        let mut progress = false;
        let mut wcs = Vec::new();
        let (a, p) = self.conn.as_ref().expect("connected");
        let ad = cx.devs[self.active]
            .clone()
            .expect("the active side never closes");
        ad.poll_cq(a.cq, 16, &mut wcs).map_err(|e| e.to_string())?;
        let from_active = wcs.len();
        if !self.passive_gone {
            if let Some(pd) = &cx.devs[self.passive] {
                pd.poll_cq(p.cq, 16, &mut wcs).map_err(|e| e.to_string())?;
            }
        }
        let batch = self.batch.as_mut().expect("a batch");
        for (i, wc) in wcs.into_iter().enumerate() {
            progress = true;
            cx.stats.status(wc.status);
            let slot = wc.wr_id as usize;
            let list = if i < from_active {
                &mut batch.done
            } else {
                &mut batch.recvd
            };
            let Some(entry) = list.get_mut(slot).filter(|e| e.is_none()) else {
                return Err(format!(
                    "RC flow {}: a completion for no outstanding work request: {wc:?}",
                    self.id
                ));
            };
            if wc.status != WcStatus::Success {
                if !clean_error(wc.status) {
                    return Err(format!(
                        "RC flow {}: a completion with status {:?} (not a clean error): {wc:?}",
                        self.id, wc.status
                    ));
                }
                if !batch.failed {
                    batch.failed = true;
                    // The responder's receives are flushed by moving its QP to ERR.
                    if !self.passive_gone {
                        if let Some(pd) = &cx.devs[self.passive] {
                            let attr = QpAttr {
                                qp_state: QpState::Err,
                                ..QpAttr::default()
                            };
                            pd.modify_qp(p.qpn, &attr, QpAttrMask::STATE)
                                .map_err(|e| format!("RC flow {}: to ERR: {e}", self.id))?;
                        }
                    }
                }
            }
            *entry = Some(wc);
        }
        // After a failure the responder's QP is in ERR, so its receives flush.
        let complete = batch.requester_done() && (self.passive_gone || batch.receives_done());
        if complete {
            self.finish(cx)?;
            return Ok(true);
        }
        let waited = cx.now.saturating_sub(batch.posted_at);
        if waited > cx.hang {
            return Err(format!(
                "RC flow {} (devices {} -> {}): a batch of {} ops got no completion in {:?} (hang): requester {:?}, receives {:?}",
                self.id,
                cx.ips[self.active],
                cx.ips[self.passive],
                batch.ops.len(),
                waited,
                batch.done.iter().map(|d| d.as_ref().map(|w| w.status)).collect::<Vec<_>>(),
                batch.recvd.iter().map(|d| d.as_ref().map(|w| w.status)).collect::<Vec<_>>(),
            ));
        }
        Ok(progress)
    }

    /// Checks a completed batch; tears the connection down if it failed.
    fn finish(&mut self, cx: &mut Ctx<'_>) -> std::result::Result<(), String> {
        let batch = self.batch.take().expect("a batch");
        let (a, p) = self.conn.as_ref().expect("connected");
        cx.stats.batches += 1;
        let id = self.id;
        let bad = |what: String| format!("RC flow {id}: {what}");
        // A failed batch leaves the slots of its failed ops unknown; its successes
        // are checked like any others.
        for (slot, (op, wc)) in batch.ops.iter().zip(&batch.done).enumerate() {
            let wc = wc.as_ref().expect("done");
            let rslot = slot * SLOT;
            if wc.status != WcStatus::Success {
                match op {
                    Op::Write { .. } => {
                        let mut now = vec![0; SLOT];
                        p.buf.read(rslot, &mut now).map_err(|e| e.to_string())?;
                        self.shadow[rslot..rslot + SLOT].copy_from_slice(&now);
                    }
                    Op::FetchAdd { .. } => {
                        self.counter = p.buf.read_u64(COUNTER_AT).map_err(|e| e.to_string())?;
                    }
                    Op::Read { .. } | Op::Send { .. } => {}
                }
                continue;
            }
            let want_op = match op {
                Op::Write { .. } => WcOpcode::RdmaWrite,
                Op::Read { .. } => WcOpcode::RdmaRead,
                Op::Send { .. } => WcOpcode::Send,
                Op::FetchAdd { .. } => WcOpcode::FetchAdd,
            };
            if wc.opcode != want_op {
                return Err(bad(format!("{op:?} completed as {:?}", wc.opcode)));
            }
            match op {
                Op::Write { off, data } => {
                    self.shadow[rslot + off..rslot + off + data.len()].copy_from_slice(data);
                    cx.stats.bytes += data.len() as u64;
                }
                Op::Read { off, len } => {
                    let mut got = vec![0; *len];
                    a.buf
                        .read(rslot + off, &mut got)
                        .map_err(|e| e.to_string())?;
                    let want = &self.shadow[rslot + off..rslot + off + len];
                    if let Some(i) = first_difference(&got, want) {
                        return Err(bad(format!(
                            "READ of {len} bytes at slot {slot} offset {off}: byte {i} is {:#04x}, the responder's memory holds {:#04x}",
                            got[i], want[i]
                        )));
                    }
                    if wc.byte_len as usize != *len {
                        return Err(bad(format!(
                            "READ of {len} bytes completed with byte_len {}",
                            wc.byte_len
                        )));
                    }
                    cx.stats.bytes += *len as u64;
                }
                Op::Send { data } => {
                    // The ACK means the data was placed (and the receive completed).
                    let r = batch.recvd[slot].as_ref();
                    if let Some(r) = r {
                        if r.status == WcStatus::Success
                            && (r.opcode != WcOpcode::Recv || r.byte_len as usize != data.len())
                        {
                            return Err(bad(format!(
                                "SEND of {} bytes received as {:?} of {} bytes",
                                data.len(),
                                r.opcode,
                                r.byte_len
                            )));
                        }
                    } else if !self.passive_gone {
                        return Err(bad("a SEND's receive never completed".into()));
                    }
                    let mut got = vec![0; data.len()];
                    p.buf
                        .read(RECV_AT + rslot, &mut got)
                        .map_err(|e| e.to_string())?;
                    if let Some(i) = first_difference(&got, data) {
                        return Err(bad(format!(
                            "SEND of {} bytes: byte {i} arrived as {:#04x}, sent {:#04x}",
                            data.len(),
                            got[i],
                            data[i]
                        )));
                    }
                    cx.stats.bytes += data.len() as u64;
                }
                Op::FetchAdd { add } => {
                    let got = a
                        .buf
                        .read_u64(SLOTS * SLOT + 8 * slot)
                        .map_err(|e| e.to_string())?;
                    if got != self.counter {
                        return Err(bad(format!(
                            "FETCH_ADD returned {got:#x}, the counter held {:#x}",
                            self.counter
                        )));
                    }
                    self.counter = self.counter.wrapping_add(*add);
                    cx.stats.bytes += 8;
                }
            }
            cx.stats.ops += 1;
        }
        // Receives that succeeded for SENDs that failed at the requester (the ACK was
        // lost): the data must still be right.
        for (slot, (op, r)) in batch.ops.iter().zip(&batch.recvd).enumerate() {
            if let (Op::Send { data }, Some(r)) = (op, r) {
                if r.status == WcStatus::Success
                    && batch.done[slot]
                        .as_ref()
                        .is_some_and(|w| w.status != WcStatus::Success)
                {
                    let mut got = vec![0; data.len()];
                    p.buf
                        .read(RECV_AT + slot * SLOT, &mut got)
                        .map_err(|e| e.to_string())?;
                    if got != *data || r.byte_len as usize != data.len() {
                        return Err(bad(
                            "a SEND whose requester failed was received wrong".into()
                        ));
                    }
                }
            }
        }
        // The whole RDMA area and the counter, against the shadow: a stray write
        // anywhere (a stale or junk packet taken) shows here.
        let mut mem = vec![0; RECV_AT];
        p.buf.read(0, &mut mem).map_err(|e| e.to_string())?;
        if let Some(i) = first_difference(&mem, &self.shadow) {
            return Err(bad(format!(
                "the responder's byte {i} (slot {}, offset {}) is {:#04x}, expected {:#04x}",
                i / SLOT,
                i % SLOT,
                mem[i],
                self.shadow[i]
            )));
        }
        let counter = p.buf.read_u64(COUNTER_AT).map_err(|e| e.to_string())?;
        if counter != self.counter {
            return Err(bad(format!(
                "the responder's counter is {counter:#x}, expected {:#x}",
                self.counter
            )));
        }
        if batch.failed {
            self.teardown(cx);
        }
        Ok(())
    }

    fn teardown(&mut self, cx: &mut Ctx<'_>) {
        let (a, p) = self.conn.take().expect("connected");
        match self.restarted_at.take() {
            Some(at) => {
                cx.stats.restart_failures += 1;
                cx.stats.restart_detect = cx.stats.restart_detect.max(cx.now.saturating_sub(at));
            }
            None => cx.stats.lost_connections += 1,
        }
        if let Some(ad) = &cx.devs[self.active] {
            free(ad, &a);
        }
        if !self.passive_gone {
            if let Some(pd) = &cx.devs[self.passive] {
                free(pd, &p);
            }
        }
        if let Some(j) = cx.junk {
            j.clear_target(self.passive, self.id);
        }
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Receives kept posted on a UC/UD receiver.
const DEPTH: usize = 16;
/// Bytes of one receive buffer.
const RBUF: usize = 4096;
/// The GRH a UD receive starts with.
const GRH: usize = 40;

/// A stream of numbered messages on UC or UD: each message's bytes are a function of
/// the seed and its number, so the receiver checks every byte it gets; lost messages
/// are allowed (neither transport retransmits), wrong bytes are not.
pub(crate) struct DgFlow {
    seed: u64,
    qp_type: QpType,
    sender: usize,
    receiver: usize,
    conn: Option<(Side, Side, Option<AhId>)>,
    next: u64,
    /// Sends outstanding.
    outstanding: usize,
    last_post: Duration,
    /// The numbers delivered so far.
    seen: std::collections::HashSet<u64>,
}

impl DgFlow {
    pub(crate) fn new(seed: u64, qp_type: QpType, sender: usize, receiver: usize) -> DgFlow {
        DgFlow {
            seed,
            qp_type,
            sender,
            receiver,
            conn: None,
            next: 0,
            outstanding: 0,
            last_post: Duration::ZERO,
            seen: Default::default(),
        }
    }

    fn name(&self) -> &'static str {
        if self.qp_type == QpType::Ud {
            "UD"
        } else {
            "UC"
        }
    }

    /// Message `n`: its length and bytes (the number first, little-endian).
    fn message(&self, n: u64) -> Vec<u8> {
        let h =
            mix(self.seed ^ n.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (self.qp_type as u64) << 60);
        let max = if self.qp_type == QpType::Ud {
            MTU
        } else {
            3 * MTU
        };
        let len = 8 + (h as usize % (max - 7));
        let mut rng = ChaCha8Rng::seed_from_u64(h);
        let mut m: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        m[..8].copy_from_slice(&n.to_le_bytes());
        m
    }

    fn make(&mut self, cx: &mut Ctx<'_>) -> std::result::Result<(), String> {
        let (Some(s), Some(r)) = (&cx.devs[self.sender], &cx.devs[self.receiver]) else {
            return Ok(());
        };
        let err = |e: Error| format!("{} flow: setting up: {e}", self.name());
        let ss = side(s, self.qp_type, DEPTH * RBUF).map_err(err)?;
        let sr = side(r, self.qp_type, DEPTH * RBUF).map_err(err)?;
        let ah = if self.qp_type == QpType::Ud {
            for (d, x) in [(s, &ss), (r, &sr)] {
                connect_qp(
                    &**d,
                    x.qpn,
                    QpType::Ud,
                    &params(),
                    0,
                    &verbs_api::Endpoint::default(),
                )
                .map_err(err)?;
            }
            let attr = AhAttr {
                grh: GlobalRoute {
                    dgid: Gid::from_ipv4(cx.ips[self.receiver]),
                    hop_limit: 64,
                    ..GlobalRoute::default()
                },
                is_global: true,
                port_num: 1,
                ..AhAttr::default()
            };
            Some(s.create_ah(ss.pd, &attr).map_err(err)?)
        } else {
            connect(s, &ss, QpType::Uc, 0, &sr, 0, cx.ips[self.receiver]).map_err(err)?;
            connect(r, &sr, QpType::Uc, 0, &ss, 0, cx.ips[self.sender]).map_err(err)?;
            None
        };
        let recvs: Vec<RecvWr> = (0..DEPTH)
            .map(|i| {
                RecvWr::new(
                    i as u64,
                    vec![Sge::new(
                        sr.mr.addr + (i * RBUF) as u64,
                        RBUF as u32,
                        sr.mr.lkey,
                    )],
                )
            })
            .collect();
        r.post_recv(sr.qpn, &recvs).map_err(|e| e.to_string())?;
        if let Some(j) = cx.junk {
            j.add_qpn(self.sender, ss.qpn);
            j.add_qpn(self.receiver, sr.qpn);
        }
        self.conn = Some((ss, sr, ah));
        Ok(())
    }

    pub(crate) fn busy(&self) -> bool {
        self.outstanding > 0
    }

    /// One step. True if anything happened.
    pub(crate) fn step(&mut self, cx: &mut Ctx<'_>) -> std::result::Result<bool, String> {
        if self.conn.is_none() {
            if cx.draining {
                return Ok(false);
            }
            self.make(cx)?;
            return Ok(true);
        }
        let name = self.name();
        let (Some(sd), Some(rd)) = (cx.devs[self.sender].clone(), cx.devs[self.receiver].clone())
        else {
            return Ok(false);
        };
        let mut progress = false;
        // Pace: a batch at most every millisecond, once the last one completed.
        if self.outstanding == 0
            && !cx.draining
            && cx.now >= self.last_post + Duration::from_millis(1)
        {
            let (ss, _, ah) = self.conn.as_ref().expect("connected");
            let n = 1 + (mix(self.seed ^ self.next) % 4) as usize;
            let mut wrs = Vec::new();
            for i in 0..n {
                let m = self.message(self.next + i as u64);
                ss.buf.write(i * RBUF, &m).map_err(|e| e.to_string())?;
                let mut wr = SendWr::send(
                    i as u64,
                    vec![Sge::new(
                        ss.mr.addr + (i * RBUF) as u64,
                        m.len() as u32,
                        ss.mr.lkey,
                    )],
                );
                if let Some(ah) = ah {
                    wr = wr.with_ud(UdDest {
                        ah: *ah,
                        remote_qpn: self.conn.as_ref().expect("connected").1.qpn,
                        remote_qkey: params().qkey,
                    });
                }
                wrs.push(wr);
            }
            sd.post_send(ss.qpn, &wrs)
                .map_err(|e| format!("{name} flow: post_send: {e}"))?;
            self.next += n as u64;
            self.outstanding = n;
            self.last_post = cx.now;
            cx.stats.dg_sent += n as u64;
            progress = true;
        }
        let (ss, sr, _) = self.conn.as_ref().expect("connected");
        let mut wcs = Vec::new();
        sd.poll_cq(ss.cq, 16, &mut wcs).map_err(|e| e.to_string())?;
        for wc in wcs.drain(..) {
            progress = true;
            cx.stats.status(wc.status);
            if wc.status != WcStatus::Success
                || wc.opcode != WcOpcode::Send
                || self.outstanding == 0
            {
                return Err(format!("{name} flow: a send completed as {wc:?}"));
            }
            self.outstanding -= 1;
        }
        rd.poll_cq(sr.cq, 16, &mut wcs).map_err(|e| e.to_string())?;
        let mut repost = Vec::new();
        for wc in wcs {
            progress = true;
            cx.stats.status(wc.status);
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                return Err(format!("{name} flow: a receive completed as {wc:?}"));
            }
            let slot = wc.wr_id as usize;
            let skip = if self.qp_type == QpType::Ud { GRH } else { 0 };
            let len = (wc.byte_len as usize)
                .checked_sub(skip)
                .filter(|&l| l >= 8 && l + skip <= RBUF);
            let Some(len) = len else {
                return Err(format!("{name} flow: a receive of {} bytes", wc.byte_len));
            };
            let mut got = vec![0; len];
            sr.buf
                .read(slot * RBUF + skip, &mut got)
                .map_err(|e| e.to_string())?;
            let n = u64::from_le_bytes(got[..8].try_into().expect("8 bytes"));
            if n >= self.next {
                return Err(format!(
                    "{name} flow: message {n} received, only {} sent",
                    self.next
                ));
            }
            let want = self.message(n);
            if got != want {
                let i = first_difference(&got, &want).unwrap_or(got.len().min(want.len()));
                return Err(format!(
                    "{name} flow: message {n} ({} bytes) arrived as {len} bytes, first wrong byte {i}",
                    want.len()
                ));
            }
            // Neither transport drops a duplicate: UD has no PSN check, and a UC
            // responder takes any FIRST or ONLY packet as a new message, whatever its
            // PSN (IBTA 9.8.3; rxe's check_psn), so a duplicated or delayed one-packet
            // message is delivered again, out of order.
            if !self.seen.insert(n) {
                cx.stats.dg_duplicates += 1;
            }
            cx.stats.dg_delivered += 1;
            cx.stats.bytes += len as u64;
            repost.push(RecvWr::new(
                wc.wr_id,
                vec![Sge::new(
                    sr.mr.addr + (slot * RBUF) as u64,
                    RBUF as u32,
                    sr.mr.lkey,
                )],
            ));
        }
        if !repost.is_empty() {
            rd.post_recv(sr.qpn, &repost)
                .map_err(|e| format!("{name} flow: post_recv: {e}"))?;
        }
        if self.outstanding > 0 && cx.now.saturating_sub(self.last_post) > cx.hang {
            return Err(format!(
                "{name} flow: sends not completed in {:?} (hang)",
                cx.hang
            ));
        }
        Ok(progress)
    }
}
