//! Heartbeats of the emulated devices on this host, so that time in which a peer device
//! could not run does not use up a requester's retries (the engine's `retry` module).
//!
//! Each UDP device's thread, which wakes at least once a millisecond while the device is
//! open, writes the monotonic time and its process id into a small file named for its
//! address and port, at most every [`BEAT`], in a folder of the user's own for the
//! network namespace (`/dev/shm/rdma-emu-UID/NETNS`, or the temporary folder). A
//! requester whose ACK timer expires reads its peer's file: a peer on this host whose
//! process is alive and whose last beat is older than both the timer's start and
//! [`STALE`] has not run, so it could not answer (its host kept it off the CPU, or its
//! process is stopped, in which a NIC would still have answered). No file (a peer on
//! another host), or a process that is gone, leaves IBTA's rule as it is: the timeout
//! spends a retry.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use verbs_api::Gid;

use crate::engine::PeerLiveness;

/// How often a device's thread writes its heartbeat.
pub(crate) const BEAT: Duration = Duration::from_millis(10);
/// How long without a heartbeat before a device counts as not running: several beats,
/// and far more than the device thread ever sleeps.
pub(crate) const STALE: Duration = Duration::from_millis(50);

/// The folder of this user's heartbeats in this network namespace: one address and port
/// name different devices in different namespaces (`rdma-emu exec --netns` runs
/// several on 127.0.0.77:4791 at once), so the namespace's inode is part of the path.
fn folder() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let uid = rustix::process::getuid().as_raw();
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    let shm = PathBuf::from("/dev/shm");
    let base = if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    };
    base.join(format!("rdma-emu-{uid}")).join(netns.to_string())
}

/// The heartbeat file of the device at `ip:port`.
fn path(ip: Ipv4Addr, port: u16) -> PathBuf {
    folder().join(format!("{ip}-{port}"))
}

/// The monotonic clock, in nanoseconds: the same in every process of the host.
fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// A device's own heartbeat file; removed when dropped.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    file: File,
    path: PathBuf,
    last: Instant,
}

impl Heartbeat {
    /// Publishes the heartbeat of the device at `ip:port`; `None` where no file can be
    /// made (peers then count every timeout, as IBTA does).
    pub(crate) fn publish(ip: Ipv4Addr, port: u16) -> Option<Heartbeat> {
        let dir = folder();
        std::fs::create_dir_all(&dir).ok()?;
        let path = path(ip, port);
        let file = File::create(&path).ok()?;
        let mut h = Heartbeat {
            file,
            path,
            last: Instant::now(),
        };
        h.write();
        Some(h)
    }

    fn write(&mut self) {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&mono_ns().to_le_bytes());
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        let _ = self.file.write_at(&b, 0);
    }

    /// The device ran at `now`: writes it down if [`BEAT`] has passed since the last.
    pub(crate) fn beat(&mut self, now: Instant) {
        if now.saturating_duration_since(self.last) >= BEAT {
            self.last = now;
            self.write();
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The heartbeats of the peer devices on this host, for a device on `port` (every
/// device a device talks to uses its port).
#[derive(Debug)]
pub(crate) struct HostPeers {
    pub(crate) port: u16,
}

impl PeerLiveness for HostPeers {
    fn stalled_since(&self, peer: &Gid, since: Instant) -> bool {
        let Some(ip) = peer.to_ipv4() else {
            return false;
        };
        let mut b = [0u8; 16];
        let Ok(f) = File::open(path(ip, self.port)) else {
            return false;
        };
        if f.read_exact_at(&mut b, 0).is_err() {
            return false;
        }
        let beat = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
        let pid = u32::from_le_bytes(b[8..12].try_into().unwrap_or_default());
        if !PathBuf::from(format!("/proc/{pid}")).exists() {
            // Its process is gone: a dead peer, whose timeouts count.
            return false;
        }
        let now = mono_ns();
        let since = now.saturating_sub(since.elapsed().as_nanos() as u64);
        beat < since && now.saturating_sub(beat) > STALE.as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh heartbeat is not stalled; one that stopped beating is, once STALE has
    /// passed and the timer started after its last beat; one whose file is gone is not.
    #[test]
    fn a_peer_that_stops_beating_is_stalled() {
        let ip = Ipv4Addr::new(127, 0, 99, 7);
        let port = 40_000 + (std::process::id() % 20_000) as u16;
        let peers = HostPeers { port };
        let gid = Gid::from_ipv4(ip);
        let mut h = Heartbeat::publish(ip, port).expect("a heartbeat file");
        assert!(!peers.stalled_since(&gid, Instant::now()));
        std::thread::sleep(STALE + BEAT);
        let since = Instant::now();
        assert!(
            peers.stalled_since(&gid, since),
            "no beat for longer than STALE"
        );
        assert!(
            !peers.stalled_since(&gid, since - 2 * STALE - BEAT),
            "it beat after the timer started"
        );
        h.beat(Instant::now());
        assert!(!peers.stalled_since(&gid, since), "it beats again");
        drop(h);
        std::thread::sleep(STALE + BEAT);
        assert!(!peers.stalled_since(&gid, Instant::now()), "gone: no file");
    }

    /// A requester whose peer's heartbeat stopped (a device that cannot run) keeps
    /// retransmitting without spending retries, for several times its budget; once
    /// the peer is gone (no heartbeat), the timeouts count and the WRITE ends in
    /// RETRY_EXC_ERR as IBTA says.
    #[test]
    fn a_stalled_peer_does_not_spend_retries() {
        use crate::nic::{EmuConfig, EmuDevice};
        use verbs_api::*;
        let port = 41_000 + (std::process::id() % 20_000) as u16;
        let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 98, 1), Ipv4Addr::new(127, 0, 98, 2));
        let a = EmuDevice::open(EmuConfig {
            name: "live-a".into(),
            ip: ip_a,
            port,
            ..EmuConfig::default()
        })
        .unwrap();
        // The peer: a heartbeat that never beats, as a device whose thread cannot run.
        let stalled = Heartbeat::publish(ip_b, port).expect("a heartbeat file");
        let pd = a.alloc_pd().unwrap();
        let cq = a.create_cq(8, None).unwrap();
        let qpn = a
            .create_qp(&QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                qp_type: QpType::Rc,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
                srq: None,
            })
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
