//! The data path of a connected stream rsocket: rsockets' own protocol on an RC QP
//! (rdma-core `librdmacm/docs/rsocket`, "Data Transfers" and "Flow Control").
//!
//! Every message is an RDMA WRITE WITH IMMEDIATE whose 32-bit immediate says what it
//! is: the top 3 bits the operation ([`OP_DATA`], [`OP_SGL`], [`OP_CTRL`], ...), the
//! low 29 bits its value. Data goes straight into the peer's receive buffer at the
//! place the peer's latest *target SGE* names; the immediate carries its length. The
//! receive buffer is used as a ring, granted in halves: each side writes a new
//! target SGE (16 bytes: address, rkey, length, in its own byte order unless the
//! connection said the orders differ) into the peer's target SGL array, whose
//! entries the sender uses round robin. An SGL update also carries the sender's new
//! message credit limit (the peer's receive sequence number plus its receive queue
//! size), since each message takes a receive WR at the peer. Control messages
//! (credits, shutdown, disconnect, keepalive) take one of [`CTRL_SLOTS`] send queue
//! entries kept aside for them.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

use verbs_api::{
    ChannelId, CqId, Device, MemBuf, MrInfo, RecvWr, SendWr, SgList, Sge, WcFlags, WcStatus,
    WorkCompletion, WrOperation,
};

/// The operations of the immediate data's top 3 bits.
pub(crate) const OP_DATA: u32 = 0;
/// A target SGE (and credits) was written into the SGL array.
pub(crate) const OP_SGL: u32 = 4;
/// A direct write into a peer's mapping (`riowrite`); never on the wire, only in
/// the wr_id.
pub(crate) const OP_WRITE: u32 = 2;
/// An iomap entry was written (riomap; noted, nothing to do).
pub(crate) const OP_IOMAP_SGL: u32 = 6;
/// A control message: [`CTRL_DISCONNECT`], [`CTRL_KEEPALIVE`] or [`CTRL_SHUTDOWN`].
pub(crate) const OP_CTRL: u32 = 7;
/// Control: the sender is gone (no more data either way).
pub(crate) const CTRL_DISCONNECT: u32 = 0;
/// Control: keepalive probe (consumes a receive, nothing else).
pub(crate) const CTRL_KEEPALIVE: u32 = 1;
/// Control: the sender will send no more data (`shutdown(SHUT_WR)`).
pub(crate) const CTRL_SHUTDOWN: u32 = 2;

/// Send queue entries kept for control messages (rsocket.c `RS_QP_CTRL_SIZE`).
pub(crate) const CTRL_SLOTS: u16 = 4;
/// Entries of the target SGL array (rsocket.c `RS_SGL_SIZE`).
pub(crate) const SGL_SIZE: u32 = 2;
/// Bytes of one target SGE (`struct rs_sge`).
pub(crate) const SGE_BYTES: usize = 16;
/// A sender waits for this much free send buffer before it sends (`RS_SNDLOWAT`).
pub(crate) const SNDLOWAT: u32 = 2048;
/// The largest single data message (`RS_MAX_TRANSFER`).
pub(crate) const MAX_TRANSFER: u32 = 65536;
/// A receive WR's id (rsocket.c sets bit 63 on receives).
const RECV_WR_ID: u64 = 1 << 63;

/// An immediate value from an operation and its 29-bit value.
pub(crate) fn msg(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}

/// The state bits of an rsocket (rsocket.c `enum rs_state`).
pub(crate) mod st {
    /// Bound to an address.
    pub(crate) const BOUND: u32 = 0x0001;
    /// Listening.
    pub(crate) const LISTENING: u32 = 0x0002;
    /// Connecting (resolving, or waiting for the peer's answer).
    pub(crate) const OPENING: u32 = 0x0004;
    /// Connected (the QP is usable).
    pub(crate) const CONNECTED: u32 = 0x0100;
    /// May still send.
    pub(crate) const WRITABLE: u32 = 0x0200;
    /// May still receive.
    pub(crate) const READABLE: u32 = 0x0400;
    /// A connection attempt failed.
    pub(crate) const CONNECT_ERROR: u32 = 0x0800;
    /// The connection is over (either side disconnected).
    pub(crate) const DISCONNECTED: u32 = 0x1000;
    /// The QP failed.
    pub(crate) const ERROR: u32 = 0x2000;
    /// Connected both ways.
    pub(crate) const RDWR: u32 = CONNECTED | WRITABLE | READABLE;
}

/// A remote SGE (`struct rs_sge`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RsSge {
    /// Address.
    pub(crate) addr: u64,
    /// Remote key.
    pub(crate) key: u32,
    /// Length in bytes (for the SGL of the connection data: the entry count).
    pub(crate) length: u32,
}

/// The verbs objects of a connection, released in reverse order when dropped.
pub(crate) struct Resources {
    pub(crate) dev: Arc<dyn Device>,
    pub(crate) pd: Option<verbs_api::PdId>,
    pub(crate) comp: Option<ChannelId>,
    pub(crate) cq: Option<CqId>,
    /// The registered regions (the QP is the CM's: the owner destroys it through the
    /// CM before these go).
    pub(crate) lkeys: Vec<u32>,
}

impl Resources {
    /// A PD, a completion channel and a CQ of `cqe` entries on it, on `dev`: what every
    /// rsocket's QP starts from. What was made before a failure is freed (`Drop`).
    pub(crate) fn open(
        dev: &Arc<dyn Device>,
        cqe: u32,
    ) -> verbs_api::Result<(Resources, verbs_api::PdId, ChannelId, CqId)> {
        let mut res = Resources {
            dev: dev.clone(),
            pd: None,
            comp: None,
            cq: None,
            lkeys: Vec::new(),
        };
        let pd = dev.alloc_pd()?;
        res.pd = Some(pd);
        let comp = dev.create_comp_channel()?;
        res.comp = Some(comp);
        let cq = dev.create_cq(cqe, Some(comp))?;
        res.cq = Some(cq);
        Ok((res, pd, comp, cq))
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        for k in self.lkeys.drain(..) {
            let _ = self.dev.dereg_mr(k);
        }
        if let Some(cq) = self.cq {
            let _ = self.dev.destroy_cq(cq);
        }
        if let Some(c) = self.comp {
            let _ = self.dev.destroy_comp_channel(c);
        }
        if let Some(pd) = self.pd {
            let _ = self.dev.dealloc_pd(pd);
        }
    }
}

/// A connection's buffers and protocol counters (the fields of rsocket.c's
/// `struct rsocket` that the stream data path uses).
pub(crate) struct Conn {
    pub(crate) res: Resources,
    pub(crate) qpn: u32,
    pub(crate) cq: CqId,
    pub(crate) comp: ChannelId,
    pub(crate) sq_size: u16,
    pub(crate) rq_size: u16,
    /// The receive ring (the peer writes data here).
    pub(crate) rbuf: MemBuf,
    pub(crate) rmr: MrInfo,
    pub(crate) rbuf_size: u32,
    /// The send ring, followed by [`CTRL_SLOTS`] SGE slots for credit messages.
    pub(crate) sbuf: MemBuf,
    pub(crate) smr: MrInfo,
    pub(crate) sbuf_size: u32,
    /// The target SGL array the peer writes its SGEs into.
    pub(crate) tbuf: MemBuf,
    pub(crate) tmr: MrInfo,
    /// The peer expects SGEs byte-swapped (its byte order differs).
    pub(crate) swap_sgl: bool,

    // Sending.
    pub(crate) sseq_no: u16,
    pub(crate) sseq_comp: u16,
    pub(crate) sqe_avail: u32,
    pub(crate) sbuf_bytes_avail: u32,
    /// Offset in the send ring of the next message's first byte.
    pub(crate) shead: u32,
    pub(crate) target_sge: u32,
    pub(crate) ctrl_seqno: u16,
    pub(crate) ctrl_max_seqno: u16,
    /// The peer's target SGL array and the entry our next SGE goes to.
    pub(crate) remote_sgl: RsSge,
    pub(crate) remote_sge: u32,

    // Receiving.
    /// Lengths of the data messages received and not yet read.
    pub(crate) rmsg: VecDeque<u32>,
    pub(crate) rbuf_offset: u32,
    pub(crate) rbuf_bytes_avail: u32,
    pub(crate) rbuf_free_offset: u32,
    pub(crate) rseq_no: u16,
    pub(crate) rseq_comp: u16,
    pub(crate) cq_armed: bool,

    // riomap (`iomap`).
    /// Entries of our iomap area, after the target SGL in `tbuf` (the peer writes its
    /// mappings there).
    pub(crate) iomap_size: u16,
    /// The peer's iomap area (entry count in `length`).
    pub(crate) remote_iomap: RsSge,
    /// Our mappings (`riomap`).
    pub(crate) iomaps: Vec<super::iomap::IoMap>,
}

/// What polling the CQ found that changes the socket's state.
#[derive(Default)]
pub(crate) struct Polled {
    /// New state, when a control message or a failed send changed it.
    pub(crate) state: Option<u32>,
    /// An errno to keep (`SO_ERROR`).
    pub(crate) err: Option<c_int>,
}

impl Conn {
    /// An SGE from the target SGL array entry `i`, in this host's order.
    pub(crate) fn target(&self, i: u32) -> RsSge {
        let mut b = [0u8; SGE_BYTES];
        let _ = self.tbuf.read(i as usize * SGE_BYTES, &mut b);
        RsSge {
            addr: u64::from_ne_bytes(b[0..8].try_into().expect("8")),
            key: u32::from_ne_bytes(b[8..12].try_into().expect("4")),
            length: u32::from_ne_bytes(b[12..16].try_into().expect("4")),
        }
    }

    /// Writes target SGL entry `i`.
    pub(crate) fn set_target(&self, i: u32, s: RsSge) {
        let _ = self
            .tbuf
            .write(i as usize * SGE_BYTES, &sge_bytes(s, false));
    }

    /// rsocket.c `rs_ctrl_avail`: a control slot is free.
    pub(crate) fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    /// rsocket.c `rs_can_send`.
    pub(crate) fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT.min(self.sbuf_size)
            && self.sseq_no != self.sseq_comp
            && self.target(self.target_sge).length != 0
    }

    /// Every send posted has completed (rsocket.c `rs_conn_all_sends_done`).
    pub(crate) fn all_sends_done(&self) -> bool {
        self.sqe_avail + u32::from(self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno))
            == u32::from(self.sq_size)
    }

    /// Posts one RDMA WRITE WITH IMMEDIATE (wr_id: the message, as rsocket.c).
    fn post_write(&self, sgl: SgList, imm: u32, addr: u64, rkey: u32) -> Result<(), c_int> {
        let wr = SendWr::new(
            u64::from(imm),
            sgl,
            WrOperation::RdmaWriteWithImm {
                remote_addr: addr,
                rkey,
                imm_data: imm,
            },
        );
        self.res
            .dev
            .post_send(self.qpn, &[wr])
            .map_err(|e| e.error.errno())
    }

    /// A message with no data (`rs_post_msg`: a zero-length WRITE WITH IMMEDIATE).
    pub(crate) fn post_msg(&self, imm: u32) -> Result<(), c_int> {
        self.post_write(SgList::new(), imm, 0, 0)
    }

    /// rsocket.c `rs_give_credits`: the peer should hear of free buffer or receives.
    fn give_credits(&self, state: u32) -> bool {
        (self.rbuf_bytes_avail >= self.rbuf_size >> 1
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && state & st::CONNECTED != 0
    }

    /// rsocket.c `rs_send_credits`: a new target SGE for the free half of the receive
    /// ring (when a half is free) or just the new credit limit.
    fn send_credits(&mut self) -> Result<(), c_int> {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let credits = u32::from(self.rseq_no) + u32::from(self.rq_size);
        let half = self.rbuf_size >> 1;
        if self.rbuf_bytes_avail >= half {
            let sge = RsSge {
                addr: self.rmr.addr + u64::from(self.rbuf_free_offset),
                key: self.rmr.rkey,
                length: half,
            };
            // One of the control slots after the send ring, by sequence number.
            let slot =
                self.sbuf_size as usize + usize::from(self.ctrl_seqno % CTRL_SLOTS) * SGE_BYTES;
            let _ = self.sbuf.write(slot, &sge_bytes(sge, self.swap_sgl));
            let sgl = SgList::from(Sge::new(
                self.smr.addr + slot as u64,
                SGE_BYTES as u32,
                self.smr.lkey,
            ));
            let to = self.remote_sgl.addr + u64::from(self.remote_sge) * SGE_BYTES as u64;
            self.post_write(sgl, msg(OP_SGL, credits), to, self.remote_sgl.key)?;
            self.rbuf_bytes_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge == self.remote_sgl.length {
                self.remote_sge = 0;
            }
            Ok(())
        } else {
            self.post_msg(msg(OP_SGL, credits))
        }
    }

    /// Sends credits if the peer should have them.
    pub(crate) fn update_credits(&mut self, state: u32) -> Result<(), c_int> {
        if self.give_credits(state) {
            self.send_credits()?;
        }
        Ok(())
    }

    /// rsocket.c `rs_poll_cq`: takes every completion, and reposts the receives
    /// consumed while connected.
    pub(crate) fn poll_cq(&mut self, mut state: u32) -> Polled {
        let mut out = Polled::default();
        let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(32);
        let mut rcnt = 0u32;
        'outer: loop {
            wcs.clear();
            match self.res.dev.poll_cq(self.cq, 32, &mut wcs) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            for wc in &wcs {
                if wc.wr_id & RECV_WR_ID != 0 {
                    if wc.status != WcStatus::Success {
                        continue;
                    }
                    rcnt += 1;
                    if !wc.wc_flags.contains(WcFlags::WITH_IMM) {
                        continue;
                    }
                    let m = wc.imm_data;
                    match m >> 29 {
                        OP_SGL => self.sseq_comp = (m & 0x1FFF_FFFF) as u16,
                        OP_IOMAP_SGL => {}
                        OP_CTRL => match m & 0x1FFF_FFFF {
                            CTRL_DISCONNECT => {
                                state = st::DISCONNECTED;
                                out.state = Some(state);
                                return out;
                            }
                            CTRL_SHUTDOWN => {
                                if state & st::WRITABLE != 0 {
                                    state &= !st::READABLE;
                                    out.state = Some(state);
                                } else {
                                    state = st::DISCONNECTED;
                                    out.state = Some(state);
                                    return out;
                                }
                            }
                            // A keepalive only takes a receive; an unknown control
                            // message is ignored as librdmacm ignores it.
                            CTRL_KEEPALIVE => {}
                            _ => {}
                        },
                        _ => {
                            let len = m & 0x1FFF_FFFF;
                            if len > 0 {
                                self.rmsg.push_back(len);
                            }
                        }
                    }
                } else {
                    let m = wc.wr_id as u32;
                    match m >> 29 {
                        OP_SGL => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                        // Its value is the slot; it took an iomap entry of send ring.
                        OP_IOMAP_SGL => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += super::iomap::IOMAP_BYTES as u32;
                        }
                        OP_CTRL => {
                            self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                            if m & 0x1FFF_FFFF == CTRL_DISCONNECT {
                                state = st::DISCONNECTED;
                                out.state = Some(state);
                            }
                        }
                        _ => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += m & 0x1FFF_FFFF;
                        }
                    }
                    if wc.status != WcStatus::Success && state & st::CONNECTED != 0 {
                        state = st::ERROR;
                        out.state = Some(state);
                        out.err = Some(libc::EIO);
                    }
                }
            }
            if wcs.len() < 32 {
                break 'outer;
            }
        }
        if state & st::CONNECTED != 0 {
            for _ in 0..rcnt {
                if let Err(e) = self.post_recv() {
                    out.state = Some(st::ERROR);
                    out.err = Some(e);
                    break;
                }
            }
        }
        out
    }

    /// One receive WR with no buffer (a WRITE WITH IMMEDIATE's data goes where it is
    /// written; the receive carries the immediate).
    pub(crate) fn post_recv(&self) -> Result<(), c_int> {
        self.res
            .dev
            .post_recv(self.qpn, &[RecvWr::new(RECV_WR_ID, SgList::new())])
            .map_err(|e| e.error.errno())
    }

    /// Arms the CQ for the next completion (once until an event is taken).
    pub(crate) fn arm(&mut self) {
        if !self.cq_armed && self.res.dev.req_notify_cq(self.cq, false).is_ok() {
            self.cq_armed = true;
        }
    }

    /// Takes the CQ events pending on the channel without waiting (disarms).
    pub(crate) fn take_events(&mut self) {
        while self
            .res
            .dev
            .get_cq_event(self.comp, Some(Duration::ZERO))
            .is_ok()
        {
            self.cq_armed = false;
        }
    }

    /// Whether data is waiting to be read.
    pub(crate) fn have_rdata(&self) -> bool {
        !self.rmsg.is_empty()
    }

    /// Copies `chunk` into the send ring at its head (wrapping: two SGEs) and
    /// returns the SGEs; the caller accounts for the bytes.
    pub(crate) fn stage(&mut self, chunk: &[u8]) -> SgList {
        let n = chunk.len() as u32;
        let first = n.min(self.sbuf_size - self.shead);
        let _ = self
            .sbuf
            .write(self.shead as usize, &chunk[..first as usize]);
        let mut sgl = SgList::from(Sge::new(
            self.smr.addr + u64::from(self.shead),
            first,
            self.smr.lkey,
        ));
        if first < n {
            let _ = self.sbuf.write(0, &chunk[first as usize..]);
            sgl.push(Sge::new(self.smr.addr, n - first, self.smr.lkey));
        }
        self.shead = (self.shead + n) % self.sbuf_size;
        sgl
    }

    /// Posts an RDMA WRITE (no immediate: nothing at the peer hears of it), as
    /// `riowrite` does; its wr_id says `OP_WRITE` and the length.
    pub(crate) fn post_direct(
        &self,
        sgl: SgList,
        len: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), c_int> {
        let wr = SendWr::new(
            u64::from(msg(OP_WRITE, len)),
            sgl,
            WrOperation::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
        );
        self.res
            .dev
            .post_send(self.qpn, &[wr])
            .map_err(|e| e.error.errno())
    }

    /// Posts a WRITE WITH IMMEDIATE of `sgl` to `addr` (for iomap entries).
    pub(crate) fn post_write_imm(
        &self,
        sgl: SgList,
        imm: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), c_int> {
        self.post_write(sgl, imm, addr, rkey)
    }

    /// Sends as much of `data` as can go now (one or more messages): the bytes sent.
    /// The caller checked [`Conn::can_send`] for the first message.
    pub(crate) fn send_some(&mut self, data: &[u8]) -> Result<usize, c_int> {
        let mut done = 0usize;
        while done < data.len() && self.can_send() {
            let left = (data.len() - done).min(MAX_TRANSFER as usize) as u32;
            let target = self.target(self.target_sge);
            let n = left.min(self.sbuf_bytes_avail).min(target.length);
            let sgl = self.stage(&data[done..done + n as usize]);
            // rsocket.c `rs_write_data`: the target SGE is advanced before posting.
            self.sseq_no = self.sseq_no.wrapping_add(1);
            self.sqe_avail -= 1;
            self.sbuf_bytes_avail -= n;
            let mut t = target;
            t.addr += u64::from(n);
            t.length -= n;
            self.set_target(self.target_sge, t);
            if t.length == 0 {
                self.target_sge = (self.target_sge + 1) % SGL_SIZE;
            }
            self.post_write(sgl, msg(OP_DATA, n), target.addr, target.key)?;
            done += n as usize;
        }
        Ok(done)
    }

    /// Copies received data into `buf` (up to its length), consuming it unless
    /// `peek`: the bytes copied.
    pub(crate) fn recv_some(&mut self, buf: &mut [u8], peek: bool) -> usize {
        let mut done = 0usize;
        let mut offset = self.rbuf_offset;
        let mut idx = 0usize;
        while done < buf.len() {
            let Some(&avail) = self.rmsg.get(idx) else {
                break;
            };
            let n = (avail as usize).min(buf.len() - done) as u32;
            let first = n.min(self.rbuf_size - offset);
            let _ = self
                .rbuf
                .read(offset as usize, &mut buf[done..done + first as usize]);
            if first < n {
                let _ = self
                    .rbuf
                    .read(0, &mut buf[done + first as usize..done + n as usize]);
            }
            offset = (offset + n) % self.rbuf_size;
            done += n as usize;
            if peek {
                if n < avail {
                    break;
                }
                idx += 1;
                continue;
            }
            self.rbuf_bytes_avail += n;
            if n < avail {
                self.rmsg[0] = avail - n;
            } else {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            }
        }
        if !peek {
            self.rbuf_offset = offset;
        }
        done
    }
}

/// The 16 bytes of an SGE in this host's order, or swapped.
pub(crate) fn sge_bytes(s: RsSge, swap: bool) -> [u8; SGE_BYTES] {
    let (a, k, l) = if swap {
        (
            s.addr.swap_bytes(),
            s.key.swap_bytes(),
            s.length.swap_bytes(),
        )
    } else {
        (s.addr, s.key, s.length)
    };
    let mut b = [0u8; SGE_BYTES];
    b[0..8].copy_from_slice(&a.to_ne_bytes());
    b[8..12].copy_from_slice(&k.to_ne_bytes());
    b[12..16].copy_from_slice(&l.to_ne_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediates_are_rsockets() {
        assert_eq!(msg(OP_CTRL, CTRL_SHUTDOWN), 0xE000_0002);
        assert_eq!(msg(OP_SGL, 384 + 0xFFFF), 0x8000_0000 | (384 + 0xFFFF));
        assert_eq!(msg(OP_DATA, 65536), 65536);
    }

    #[test]
    fn sge_bytes_swap() {
        let s = RsSge {
            addr: 0x0102_0304_0506_0708,
            key: 0x1122_3344,
            length: 0x8000,
        };
        let n = sge_bytes(s, false);
        let w = sge_bytes(s, true);
        assert_eq!(&n[0..8], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(
            &w[0..8],
            &0x0102_0304_0506_0708u64.swap_bytes().to_ne_bytes()
        );
        assert_eq!(&w[12..16], &0x8000u32.swap_bytes().to_ne_bytes());
    }
}
