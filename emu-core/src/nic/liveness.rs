//! Heartbeats of the emulated devices on this host, so that time in which a peer device
//! could not run does not use up a requester's retries (the engine's `retry` module).
//!
//! Each UDP device's thread, which wakes at least once a millisecond while the device is
//! open, writes the monotonic time into the record of its share of its address
//! (`share::Member`, in the host's shared folder), at most every `share::BEAT`. A
//! requester whose ACK timer expires reads its peer's record: a peer on this host whose
//! process is alive and whose last beat is older than both the timer's start and
//! [`STALE`] has not run, so it could not answer (its host kept it off the CPU, or its
//! process is stopped, in which a NIC would still have answered). No file (a peer on
//! another host), or a process that is gone, leaves IBTA's rule as it is: the timeout
//! spends a retry.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use verbs_api::Gid;

use super::share;
use crate::engine::{PeerLiveness, QPN_BLOCK_SHIFT};
use crate::host::mono_ns;

/// How long without a heartbeat before a device counts as not running: several beats
/// ([`share::BEAT`]), and far more than the device thread ever sleeps.
pub(crate) const STALE: Duration = Duration::from_millis(50);

/// How long a peer's record, once read, answers for it: far below [`share::BEAT`], so
/// a cached beat is at most this much older than the file's. With thousands of QPs
/// timing out together (`bench write_bw --qps 100000`) each would otherwise open the
/// slot file, lock it and look up the process: some 20 us a QP, which slowed the
/// device enough to make more timers expire.
const RECORD_TTL: Duration = Duration::from_millis(1);

/// The heartbeats of the peer devices on this host, for a device on `port` (every
/// device a device talks to uses its port). A peer's heartbeat is in the record of
/// its member of its address (`share`): the one whose block holds the peer's QPN.
#[derive(Debug)]
pub(crate) struct HostPeers {
    pub(crate) port: u16,
    /// The records read in the last [`RECORD_TTL`], by address and slot, with when
    /// they were read (monotonic ns).
    recent: parking_lot::Mutex<HashMap<(IpAddr, u8), Read>>,
}

/// A member's record as read at a time (monotonic ns); `None`: no live member.
type Read = (u64, Option<share::Record>);

impl HostPeers {
    /// The peers of a device on `port`.
    pub(crate) fn new(port: u16) -> Self {
        HostPeers {
            port,
            recent: parking_lot::Mutex::default(),
        }
    }

    /// The record of `slot` of `ip` (see `share::read_member`), read again once the
    /// one at hand is older than [`RECORD_TTL`].
    fn member(&self, ip: IpAddr, slot: u8, now_ns: u64) -> Option<share::Record> {
        let mut recent = self.recent.lock();
        if let Some(&(at, r)) = recent.get(&(ip, slot)) {
            if now_ns.saturating_sub(at) < RECORD_TTL.as_nanos() as u64 {
                return r;
            }
        }
        let r = share::read_member(ip, self.port, slot);
        recent.insert((ip, slot), (now_ns, r));
        r
    }
}

impl PeerLiveness for HostPeers {
    fn stalled_since(&self, peer: &Gid, qpn: u32, since: Instant) -> bool {
        let ip = super::ip_of(peer);
        // No record (a peer on another host) or its process is gone (a dead peer,
        // whose timeouts count).
        let now = mono_ns();
        let Some(r) = self.member(ip, (qpn >> QPN_BLOCK_SHIFT) as u8, now) else {
            return false;
        };
        let since = now.saturating_sub(since.elapsed().as_nanos() as u64);
        r.beat_ns < since && now.saturating_sub(r.beat_ns) > STALE.as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::share::{Member, BEAT};
    use super::*;
    use std::net::Ipv4Addr;

    /// A fresh heartbeat is not stalled; one that stopped beating is, once STALE has
    /// passed and the timer started after its last beat; one whose member closed is
    /// not; nor is a QPN in another member's block.
    #[test]
    fn a_peer_that_stops_beating_is_stalled() {
        let ip = Ipv4Addr::new(127, 0, 99, 7);
        let port = 9_000 + (std::process::id() % 20_000) as u16;
        let peers = HostPeers::new(port);
        let gid = Gid::from_ipv4(ip);
        let mut h = Member::join(ip.into(), port, 0).expect("a member record");
        let qpn = (u32::from(h.slot()) << QPN_BLOCK_SHIFT) | 0x11;
        assert!(!peers.stalled_since(&gid, qpn, Instant::now()));
        std::thread::sleep(STALE + BEAT);
        let since = Instant::now();
        assert!(
            peers.stalled_since(&gid, qpn, since),
            "no beat for longer than STALE"
        );
        assert!(
            !peers.stalled_since(&gid, qpn + (1 << QPN_BLOCK_SHIFT), since),
            "another member's QP"
        );
        assert!(
            !peers.stalled_since(&gid, qpn, since - 2 * STALE - BEAT),
            "it beat after the timer started"
        );
        h.beat(Instant::now());
        // A record read less than RECORD_TTL ago answers for the member.
        std::thread::sleep(RECORD_TTL);
        assert!(!peers.stalled_since(&gid, qpn, since), "it beats again");
        drop(h);
        std::thread::sleep(STALE + BEAT);
        assert!(
            !peers.stalled_since(&gid, qpn, Instant::now()),
            "gone: no member"
        );
    }

    /// A requester whose peer's heartbeat stopped (a device that cannot run) keeps
    /// retransmitting without spending retries, for several times its budget; once
    /// the peer is gone (no heartbeat), the timeouts count and the WRITE ends in
    /// RETRY_EXC_ERR as IBTA says.
    #[test]
    fn a_stalled_peer_does_not_spend_retries() {
        use crate::nic::{EmuConfig, EmuDevice};
        use verbs_api::*;
        let port = 10_000 + (std::process::id() % 20_000) as u16;
        let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 98, 1), Ipv4Addr::new(127, 0, 98, 2));
        let a = EmuDevice::open(EmuConfig {
            name: "live-a".into(),
            ip: ip_a.into(),
            port,
            ..EmuConfig::default()
        })
        .unwrap();
        // The peer: a member that never beats, as a device whose thread cannot run
        // (the first of its address: QPN 0x123 is in its block).
        let stalled = Member::join(ip_b.into(), port, 0).expect("a member record");
        assert_eq!(stalled.slot(), 0);
        let pd = a.alloc_pd().unwrap();
        let cq = a.create_cq(8, None).unwrap();
        let qpn = a
            .create_qp(&QpInitAttr::new(pd, cq, QpType::Rc, QpCap::new(4, 4)).sq_sig_all(true))
            .unwrap();
        let buf = MemBuf::new(64);
        let mr = a.reg_mr(pd, &buf, 0, 64, AccessFlags::LOCAL_WRITE).unwrap();
        let params = QpParams {
            timeout: 12, // 16.8 ms: a budget of about 0.12 s
            retry_cnt: 7,
            ..QpParams::default()
        };
        let remote = Endpoint {
            qpn: 0x123,
            gid: Gid::from_ipv4(ip_b),
            ..Endpoint::default()
        };
        connect_qp(&a, qpn, QpType::Rc, &params, 0, &remote).unwrap();
        let wr = SendWr::new(
            1,
            vec![Sge::new(mr.addr, 64, mr.lkey)],
            WrOperation::RdmaWrite {
                remote_addr: 0x1000,
                rkey: 7,
            },
        );
        a.post_send(qpn, &[wr]).unwrap();
        let mut wcs = Vec::new();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(600) {
            a.poll_cq(cq, 1, &mut wcs).unwrap();
            assert!(
                wcs.is_empty(),
                "ended while its peer could not run: {wcs:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let free = a.counters().stalled_peer_timeouts;
        assert!(free > 8, "{free} timeouts spent no retry");
        // The peer is gone: its timeouts count again.
        drop(stalled);
        let t = Instant::now();
        while wcs.is_empty() && t.elapsed() < Duration::from_secs(5) {
            a.poll_cq(cq, 1, &mut wcs).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(wcs.first().map(|w| w.status), Some(WcStatus::RetryExcErr));
    }
}
