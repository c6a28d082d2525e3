//! The inbox: what a device that shares its address (`share`) passes on to the
//! device holding a datagram's QP, and what it sends to its own address.

use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::Instant;

use socket2::{Protocol, SockRef, Socket, Type};

use crate::nic::interop::LinkOptions;
use crate::nic::share;

use super::{domain, large_recv_buffer, sock_addr, RxBufs, UdpLink, NOWHERE};

impl UdpLink {
    /// Whether a device with `opts` on `port` shares its address with other devices
    /// (`share`): not in interop mode, not when asked to keep it, not on a port the
    /// kernel picks (nobody else could name it).
    pub(crate) fn shares(port: u16, opts: &LinkOptions) -> bool {
        port != 0 && !opts.exclusive && !opts.raw_receive
    }

    /// The inbox of a device that shares its address: a non-blocking socket on the
    /// address and a port of the kernel's choice (`share`).
    pub(crate) fn open_inbox(ip: IpAddr) -> io::Result<UdpSocket> {
        let s = Socket::new(domain(ip), Type::DGRAM, Some(Protocol::UDP))?;
        if ip.is_ipv6() {
            s.set_only_v6(true)?;
        }
        large_recv_buffer(&s);
        let scope = super::interface_index(ip);
        s.bind(&sock_addr(ip, 0, scope).into())?;
        s.set_nonblocking(true)?;
        Ok(s.into())
    }

    /// Makes the device the member in `slot` of its address (`share`), routing what
    /// belongs to the others; `joined_others`: it found others there.
    pub(crate) fn join_address(&mut self, slot: u8, joined_others: bool) {
        if self.inbox.is_some() {
            self.router = Some(parking_lot::Mutex::new(share::Router::new(
                self.ip,
                self.ifindex,
                self.port,
                slot,
            )));
            if joined_others {
                self.activate_inbox();
            }
        }
    }

    /// Another device shares the address (`share`): receives look in the inbox from
    /// now on, and packets to the address go straight to their device's inbox.
    pub(crate) fn activate_inbox(&self) {
        if self.inbox.is_some() && !self.inbox_active.load(Ordering::Relaxed) {
            self.inbox_active.store(true, Ordering::Relaxed);
        }
    }

    /// Another device joined the address (its heartbeat says so, `share::Member::beat`):
    /// receives look in the inbox, and the router reads the members again.
    pub(crate) fn member_joined(&self) {
        self.activate_inbox();
        if let Some(r) = &self.router {
            r.lock().forget();
        }
    }

    /// Passes the datagrams of `range` in `rx` that belong to another device of the
    /// address on to it (`share`), each behind the header naming its sender, and
    /// takes them out of the batch (their sender becomes 0.0.0.0:0, as a bad ICRC's).
    /// What another device passed on stays here whatever the router says (no datagram
    /// goes round in circles). Returns how many went.
    pub(crate) fn pass_on(&self, rx: &mut RxBufs, range: std::ops::Range<usize>) -> u64 {
        let Some(router) = &self.router else {
            return 0;
        };
        let mut router = router.lock();
        let now = Instant::now();
        let mut passed = 0;
        for i in range {
            let d = rx.got[i];
            if d.passed_on || (d.from.port() == 0 && d.from.ip().is_unspecified()) {
                continue;
            }
            if let share::Route::To(to) = router.route(rx.bytes(&d), d.dst, now) {
                // One that cannot leave is lost, as on a link.
                self.relay(to, d.from, d.tos, rx.bytes(&d));
                rx.got[i].from = NOWHERE;
                passed += 1;
            }
        }
        if passed > 0 {
            // The device it went to may answer through this one's inbox.
            self.activate_inbox();
        }
        passed
    }

    /// Sends `bytes` behind the header naming `from` (and its TOS byte) to the inbox
    /// `to` of a device of the address, from the bound socket. Returns whether it left.
    pub(super) fn relay(&self, to: SocketAddr, from: SocketAddr, tos: u8, bytes: &[u8]) -> bool {
        let hdr = share::relay_header(from, tos);
        let iov = [IoSlice::new(&hdr), IoSlice::new(bytes)];
        SockRef::from(&self.socket)
            .send_to_vectored(&iov, &to.into())
            .is_ok()
    }

    /// Sends the `segment`-byte `packets` (the last may be shorter) that go to the
    /// device's own address while other devices share it: each straight to the inbox
    /// of the device that holds its QP (this one's included), sealed as if it left the
    /// bound socket. None goes through the kernel's pick among the address's sockets,
    /// whose queue a device takes with it when its process ends (a REJ sent just before
    /// its sender exited was lost that way). `None` when the address is not shared.
    pub(super) fn send_local(
        &self,
        dst: IpAddr,
        packets: &mut [u8],
        segment: usize,
    ) -> Option<io::Result<()>> {
        let router = self.router.as_ref()?;
        if dst != self.ip || !self.inbox_active.load(Ordering::Relaxed) {
            return None;
        }
        let seal = self.endpoints(dst, self.port);
        let from = self.sock_addr(self.ip, self.port);
        let own = self.sock_addr(self.ip, self.inbox_port);
        let tos = self.tos.load(Ordering::Relaxed);
        let now = Instant::now();
        let mut router = router.lock();
        let mut r = Ok(());
        for p in packets.chunks_mut(segment.max(1)) {
            seal.write(0, p);
            let to = match router.route(p, dst, now) {
                share::Route::To(to) => to,
                share::Route::Here => own,
            };
            if !self.relay(to, from, tos, p) {
                r = Err(io::Error::last_os_error());
            }
        }
        Some(r)
    }
}
