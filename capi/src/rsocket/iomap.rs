//! `riomap`, `riounmap` and `riowrite`: direct writes into memory the peer mapped
//! (rdma-core `librdmacm/docs/rsocket`, "iomap").
//!
//! Each side may give a connection an iomap area (`RDMA_IOMAPSIZE` entries, after its
//! target SGL, said in the connection data). `riomap(..., PROT_WRITE, ...)`
//! registers the program's buffer for remote writes and, with the next send, writes
//! an entry (the mapping's offset, then address, rkey and length) into a slot of the
//! peer's area (a WRITE WITH IMMEDIATE, operation `IOMAP_SGL`, value the slot).
//! `riowrite` finds the peer's entry that covers an offset and writes there with a
//! plain RDMA WRITE: the peer is not told (riostream watches the last byte).

use std::ffi::{c_int, c_void};

use verbs_api::{AccessFlags, MemBuf, MrInfo};

use super::data::{msg, st, Conn, RsSge, MAX_TRANSFER, OP_IOMAP_SGL, SGE_BYTES, SGL_SIZE};
use super::{lookup, RSocket, Sock};
use crate::memory::UserMemory;
use crate::rdmacm::{cm, err, Cm};

/// Bytes of one iomap entry (`struct rs_iomap`: offset, then an `rs_sge`).
pub(crate) const IOMAP_BYTES: usize = 8 + SGE_BYTES;

/// One `riomap` of this side.
pub(crate) struct IoMap {
    /// The slot of the peer's area it goes to (remote mappings only).
    pub(crate) slot: Option<u32>,
    /// Whether its entry was written to the peer yet.
    pub(crate) sent: bool,
    pub(crate) offset: u64,
    pub(crate) mr: MrInfo,
    /// The program's memory, registered (kept alive with the region).
    pub(crate) _buf: MemBuf,
}

impl Conn {
    /// The peer's entry `i` of our iomap area, in this host's order.
    fn target_iomap(&self, i: u32) -> (u64, RsSge) {
        let mut b = [0u8; IOMAP_BYTES];
        let at = SGL_SIZE as usize * SGE_BYTES + i as usize * IOMAP_BYTES;
        let _ = self.tbuf.read(at, &mut b);
        let off = u64::from_ne_bytes(b[0..8].try_into().expect("8"));
        let sge = RsSge {
            addr: u64::from_ne_bytes(b[8..16].try_into().expect("8")),
            key: u32::from_ne_bytes(b[16..20].try_into().expect("4")),
            length: u32::from_ne_bytes(b[20..24].try_into().expect("4")),
        };
        (off, sge)
    }

    /// The peer's mapping that covers `offset` (rsocket.c `rs_find_iomap`).
    fn find_iomap(&self, offset: u64) -> Option<(u64, RsSge)> {
        (0..u32::from(self.iomap_size))
            .map(|i| self.target_iomap(i))
            .find(|(o, s)| offset >= *o && offset < o + u64::from(s.length))
    }

    /// Writes the entry of our mapping `k` into its slot at the peer.
    fn send_iomap(&mut self, k: usize) -> Result<(), c_int> {
        let m = &self.iomaps[k];
        let slot = m.slot.expect("remote mapping");
        let mut b = [0u8; IOMAP_BYTES];
        let (o, a, key, l) = (m.offset, m.mr.addr, m.mr.rkey, m.mr.length as u32);
        let (o, a, key, l) = if self.swap_sgl {
            (
                o.swap_bytes(),
                a.swap_bytes(),
                key.swap_bytes(),
                l.swap_bytes(),
            )
        } else {
            (o, a, key, l)
        };
        b[0..8].copy_from_slice(&o.to_ne_bytes());
        b[8..16].copy_from_slice(&a.to_ne_bytes());
        b[16..20].copy_from_slice(&key.to_ne_bytes());
        b[20..24].copy_from_slice(&l.to_ne_bytes());
        let sgl = self.stage(&b);
        // rsocket.c `rs_write_iomap`: a message (a receive at the peer) and ring bytes.
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= IOMAP_BYTES as u32;
        let to = self.remote_iomap.addr + u64::from(slot) * IOMAP_BYTES as u64;
        self.post_write_imm(sgl, msg(OP_IOMAP_SGL, slot), to, self.remote_iomap.key)?;
        self.iomaps[k].sent = true;
        Ok(())
    }
}

/// Sends the entries of mappings made since the last send (rsocket.c
/// `rs_send_iomaps`, run first by `rsend` and `riowrite`).
pub(crate) fn send_pending(cm: &Cm, rs: &RSocket, nonblock: bool) -> Result<(), c_int> {
    loop {
        let pending = {
            let s = rs.s.lock();
            s.conn
                .as_ref()
                .and_then(|c| c.iomaps.iter().position(|m| m.slot.is_some() && !m.sent))
        };
        let Some(k) = pending else {
            return Ok(());
        };
        let mut s = rs.process(cm, nonblock, Sock::conn_can_send)?;
        if s.state & st::WRITABLE == 0 {
            return Err(libc::ECONNRESET);
        }
        let Some(c) = s.conn.as_mut() else {
            return Err(libc::ENOTCONN);
        };
        if k < c.iomaps.len() && !c.iomaps[k].sent {
            c.send_iomap(k)?;
        }
    }
}

/// `riomap`: maps `len` bytes at `buf` for the peer's `riowrite` (PROT_WRITE) or as
/// a local mapping, at `offset` (-1: the buffer's address). The offset, or -1 with
/// errno (EINVAL unconnected or for other protections, ENOMEM with no slot left in
/// the peer's area).
#[no_mangle]
pub unsafe extern "C" fn riomap(
    socket: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    let Some(rs) = lookup(socket) else {
        return libc::off_t::from(err(super::not_stream(socket)));
    };
    let mut s = rs.s.lock();
    let Some(c) = s.conn.as_mut() else {
        return libc::off_t::from(err(libc::EINVAL));
    };
    if prot & !libc::PROT_WRITE != 0 {
        return libc::off_t::from(err(libc::EINVAL));
    }
    let remote = prot & libc::PROT_WRITE != 0;
    let slot = if remote {
        let used: Vec<u32> = c.iomaps.iter().filter_map(|m| m.slot).collect();
        match (0..c.remote_iomap.length).find(|i| !used.contains(i)) {
            Some(i) => Some(i),
            None => return libc::off_t::from(err(libc::ENOMEM)),
        }
    } else {
        None
    };
    // SAFETY: the program's buffer of len bytes, mapped until riounmap (the
    // librdmacm contract, as for ibv_reg_mr; see crate::memory).
    let Some(user) = (unsafe { UserMemory::new(buf.cast(), len) }) else {
        return libc::off_t::from(err(libc::EINVAL));
    };
    let mem = MemBuf::from_external(Box::new(user));
    let access = if remote {
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
    } else {
        AccessFlags::LOCAL_WRITE
    };
    let Some(pd) = c.res.pd else {
        return libc::off_t::from(err(libc::EINVAL));
    };
    let mr = match c.res.dev.reg_mr(pd, &mem, 0, len, access) {
        Ok(mr) => mr,
        Err(e) => return libc::off_t::from(err(e.errno())),
    };
    c.res.lkeys.push(mr.lkey);
    let offset = if offset == -1 {
        buf as libc::off_t
    } else {
        offset
    };
    c.iomaps.push(IoMap {
        slot,
        sent: false,
        offset: offset as u64,
        mr,
        _buf: mem,
    });
    offset
}

/// `riounmap`: undoes the `riomap` of exactly `buf`/`len` (EINVAL if none). The
/// peer is not told, as in librdmacm.
#[no_mangle]
pub unsafe extern "C" fn riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int {
    let Some(rs) = lookup(socket) else {
        return err(super::not_stream(socket));
    };
    let mut s = rs.s.lock();
    let Some(c) = s.conn.as_mut() else {
        return err(libc::EINVAL);
    };
    let Some(k) = c
        .iomaps
        .iter()
        .position(|m| m.mr.addr == buf as u64 && m.mr.length == len as u64)
    else {
        return err(libc::EINVAL);
    };
    let m = c.iomaps.remove(k);
    c.res.lkeys.retain(|l| *l != m.mr.lkey);
    let _ = c.res.dev.dereg_mr(m.mr.lkey);
    0
}

/// `riowrite`: writes `count` bytes at `offset` of the peer's mappings (through the
/// send ring; the bytes written, or -1 with errno if none were). Stops where no
/// mapping covers the offset.
#[no_mangle]
pub unsafe extern "C" fn riowrite(
    socket: c_int,
    buf: *const c_void,
    count: usize,
    offset: libc::off_t,
    flags: c_int,
) -> usize {
    let fail = |e| err(e) as isize as usize;
    let _in_call = super::InCall::enter();
    let cm = match cm() {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let Some(rs) = lookup(socket) else {
        return fail(super::not_stream(socket));
    };
    // SAFETY: the caller's buffer of count bytes.
    let data = unsafe { super::slice(buf, count) };
    let nonblock = rs.s.lock().nonblocking(flags);
    if let Err(e) = send_pending(cm, &rs, nonblock) {
        return fail(e);
    }
    let mut done = 0usize;
    while done < data.len() {
        let mut s = match rs.process(cm, nonblock, Sock::conn_can_send) {
            Ok(s) => s,
            Err(e) if done == 0 => return fail(e),
            Err(_) => break,
        };
        if s.state & st::WRITABLE == 0 {
            if done > 0 {
                break;
            }
            return fail(libc::ECONNRESET);
        }
        let Some(c) = s.conn.as_mut() else {
            return fail(libc::ENOTCONN);
        };
        let at = offset as u64 + done as u64;
        let Some((o, iom)) = c.find_iomap(at) else {
            break;
        };
        let room = o + u64::from(iom.length) - at;
        let n = ((data.len() - done) as u64)
            .min(u64::from(MAX_TRANSFER))
            .min(u64::from(c.sbuf_bytes_avail))
            .min(room) as u32;
        let sgl = c.stage(&data[done..done + n as usize]);
        c.sqe_avail -= 1;
        c.sbuf_bytes_avail -= n;
        if let Err(e) = c.post_direct(sgl, n, iom.addr + (at - o), iom.key) {
            s.state = st::ERROR;
            s.err = e;
            if done == 0 {
                return fail(e);
            }
            break;
        }
        done += n as usize;
    }
    done
}
