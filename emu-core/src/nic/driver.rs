//! [`DeviceDriver`]: how a link without sockets (the simulated fabric) feeds an
//! [`EmuDevice`](super::EmuDevice), and the ICRC-checking delivery it shares with a
//! link's [`Inbound`](super::Inbound) (the shared-memory link's).

use std::net::IpAddr;
use std::sync::Weak;
use std::time::Instant;

use std::sync::atomic::Ordering;

use emu_wire::{check_icrc, check_icrc_v6, Ipv4Endpoints, Ipv6Endpoints};
use smallvec::SmallVec;

use super::{gid_of, Inner};

/// Feeds an [`EmuDevice`](super::EmuDevice) that sits on a link without sockets: the owner of the link
/// delivers datagrams and fires timers through it. It holds the device weakly: once
/// the device is dropped, every call does nothing.
#[derive(Clone, Debug)]
pub struct DeviceDriver(pub(super) Weak<Inner>);

impl DeviceDriver {
    /// Delivers one RoCEv2 UDP payload that `src` sent to this device (both on the
    /// device port). A wrong ICRC drops it and counts it, as on UDP. Returns false if
    /// the device is gone. Addresses are `Ipv4Addr`, `Ipv6Addr` or `IpAddr`.
    pub fn handle_datagram(&self, src: impl Into<IpAddr>, packet: &[u8]) -> bool {
        match self.ip() {
            Some(ip) => self.handle_datagram_to(src.into(), ip, packet),
            None => false,
        }
    }

    /// Delivers a datagram that `src` sent to `dst`: this device's address, or a
    /// multicast group one of its QPs joined (the ICRC covers the destination address,
    /// and multicast routing needs it). Its TOS byte counts as 0: see
    /// [`DeviceDriver::handle_datagram_tos`].
    pub fn handle_datagram_to(
        &self,
        src: impl Into<IpAddr>,
        dst: impl Into<IpAddr>,
        packet: &[u8],
    ) -> bool {
        self.handle_datagram_tos(src.into(), dst.into(), 0, packet)
    }

    /// [`DeviceDriver::handle_datagram_to`] for a link that carries the IPv4 header's
    /// TOS byte `tos` (the traffic class the sender's path gave it, which the device
    /// sends with ([`Route::tos`](super::Route)): a UD receive's GRH shows it.
    pub fn handle_datagram_tos(
        &self,
        src: impl Into<IpAddr>,
        dst: impl Into<IpAddr>,
        tos: u8,
        packet: &[u8],
    ) -> bool {
        self.deliver(std::iter::once((src.into(), dst.into(), tos, packet)))
    }

    /// Delivers a batch of datagrams, each `(src, dst, packet)` as in
    /// [`DeviceDriver::handle_datagram_to`]: every ICRC is checked first (a wrong one
    /// is dropped and counted, the rest of the batch still goes in), then the good ones
    /// go to the engine in order under one lock and the output is sent once, as the UDP
    /// device thread does with a `recvmmsg` batch. Responses coalesce across the batch
    /// (e.g. one ACK for several requests, IBTA 9.7.5.1). Returns false if the device
    /// is gone.
    pub fn handle_datagrams<A: Into<IpAddr> + Copy>(&self, batch: &[(A, A, &[u8])]) -> bool {
        self.deliver(
            batch
                .iter()
                .map(|&(src, dst, p)| (src.into(), dst.into(), 0, p)),
        )
    }

    /// [`DeviceDriver::handle_datagrams`] with each datagram's TOS byte, as in
    /// [`DeviceDriver::handle_datagram_tos`].
    pub fn handle_datagrams_tos<A: Into<IpAddr> + Copy>(
        &self,
        batch: &[(A, A, u8, &[u8])],
    ) -> bool {
        self.deliver(
            batch
                .iter()
                .map(|&(src, dst, tos, p)| (src.into(), dst.into(), tos, p)),
        )
    }

    /// Checks the ICRCs of `batch` (`(src, dst, tos, packet)`), then hands the good
    /// datagrams to the engine in order under one lock and sends the output once.
    fn deliver<'p>(
        &self,
        batch: impl Iterator<Item = (IpAddr, IpAddr, u8, &'p [u8])> + Clone,
    ) -> bool {
        let Some(inner) = self.0.upgrade() else {
            return false;
        };
        inner.deliver(batch);
        true
    }

    /// When the device's next timer is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.0.upgrade()?.core.lock().engine.poll_timeout()
    }

    /// Fires the timers that are due at the link's `now`.
    pub fn handle_timeout(&self) {
        if let Some(inner) = self.0.upgrade() {
            inner.with_engine(|e, now| e.handle_timeout(now));
        }
    }

    /// The device's address, while it exists.
    pub fn ip(&self) -> Option<IpAddr> {
        Some(self.0.upgrade()?.cfg.ip)
    }
}

impl Inner {
    /// [`DeviceDriver::handle_datagrams_tos`] on the device itself (also a link's
    /// [`Inbound::deliver`](super::Inbound::deliver)): checks the ICRCs of `batch`,
    /// then hands the good datagrams to the engine in order under one lock and sends
    /// the output once.
    pub(super) fn deliver<'p>(
        &self,
        batch: impl Iterator<Item = (IpAddr, IpAddr, u8, &'p [u8])> + Clone,
    ) {
        let port = self.cfg.port;
        let good = |&(src, dst, _, packet): &(IpAddr, IpAddr, u8, &[u8])| match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let ep = Ipv4Endpoints {
                    src,
                    dst,
                    ip_id: 0,
                    src_port: port,
                    dst_port: port,
                };
                check_icrc(&ep, packet)
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                let ep = Ipv6Endpoints {
                    src,
                    dst,
                    src_port: port,
                    dst_port: port,
                };
                check_icrc_v6(&ep, packet)
            }
            // No datagram crosses address families.
            _ => false,
        };
        let ok: SmallVec<[bool; 16]> = batch.clone().map(|d| good(&d)).collect();
        let bad = ok.iter().filter(|g| !**g).count() as u64;
        if bad > 0 {
            self.link_counters
                .icrc_errors
                .fetch_add(bad, Ordering::Relaxed);
        }
        self.with_engine(|e, now| {
            for ((src, dst, tos, packet), _) in batch.zip(&ok).filter(|(_, g)| **g) {
                e.handle_datagram_tos(now, gid_of(src), gid_of(dst), tos, packet);
            }
        });
    }
}
