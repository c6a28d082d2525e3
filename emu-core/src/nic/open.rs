//! Opening an [`EmuDevice`]: on UDP (its link, extra addresses, share and thread; with
//! the same-host link beside it for `SameHost::Auto`), on the shared-memory link, or
//! on any [`Link`] without a thread (the fabric).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use verbs_api::{Error, Result};

use super::{auto, dual, liveness, netdev, share, shm, udp};
use super::{EmuConfig, EmuDevice, Inner, Link, SameHost};

impl EmuDevice {
    /// Opens a device on UDP: binds its socket and starts its thread. Devices that open
    /// one address share it, as processes share one kernel rxe device, unless
    /// [`super::interop::LinkOptions::exclusive`] keeps it to one. An address held by a
    /// socket that does not share it is [`Error::AddressInUse`], naming its holder when
    /// the host tells; other failures come back as [`Error::Os`].
    ///
    /// With [`EmuConfig::same_host`] [`SameHost::Shm`] the device sits on the
    /// shared-memory link instead: see [`SameHost::Shm`]; with [`SameHost::Auto`] on
    /// both (see there).
    pub fn open(cfg: EmuConfig) -> Result<EmuDevice> {
        if cfg.same_host == SameHost::Shm {
            return EmuDevice::open_shm(cfg);
        }
        let (udp, member) = share::bind(cfg.ip, cfg.port, &cfg.link, None)
            .map_err(|(context, e)| open_error(&cfg, e, context, share::holder))?;
        let mut cfg = cfg;
        cfg.port = udp.port();
        let ip = cfg.ip;
        let slot = member.as_ref().map_or(0, share::Member::slot);
        // An IPv4 address on an interface with IPv6 ones: the device carries them too,
        // and lists them as rxe does (`dual`).
        let extra = dual::open(&dual::candidates(ip), cfg.port, &cfg.link, slot);
        let table = dual::gid_table(ip, &extra.iter().map(|x| x.ip).collect::<Vec<_>>());
        let link = Arc::new(udp::DeviceLink::new(udp, member, extra));
        // An auto device's link is the UDP one with the same-host link beside it.
        let dev_link: Arc<dyn Link> = if cfg.same_host == SameHost::Auto {
            Arc::new(auto::AutoLink::new(link.clone(), ip, cfg.port))
        } else {
            link.clone()
        };
        let mut inner = Inner::new(cfg, dev_link)?;
        if let Some(i) = Arc::get_mut(&mut inner) {
            i.netdev = Some(Mutex::new(netdev::Follower::new(ip)));
        }
        // The port reflects its interface from the start.
        inner.watch(Instant::now());
        // Peers on this host tell whether they ran (their heartbeats), and this device
        // tells them (see `liveness`). Its QPNs are in its slot's block, starting
        // elsewhere in each process (see `crate::seed`).
        let port = inner.cfg.port;
        inner.with_engine(|e, _| {
            e.set_gid_table(&table);
            e.set_qpn_block(slot, crate::seed::instance_seed());
            e.set_peer_liveness(Some(Arc::new(liveness::HostPeers::new(port))));
        });
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}-nic", inner.cfg.name))
            .spawn(move || worker.run())
            .map_err(|_| Error::NoMemory("cannot start the device thread"))?;
        let mut dev = EmuDevice {
            inner,
            thread: Some(thread),
            extra_threads: Vec::new(),
        };
        for i in 0..link.extras() {
            let (worker, link) = (dev.inner.clone(), link.clone());
            let t = std::thread::Builder::new()
                .name(format!("{}-nic{}", dev.inner.cfg.name, i + 2))
                .spawn(move || dual::run(&link, i, &worker))
                .map_err(|_| Error::NoMemory("cannot start the device thread"))?;
            dev.extra_threads.push(t);
        }
        Ok(dev)
    }

    /// Opens a device on the same-host shared-memory link (see `nic/shm.rs`): it
    /// offers a doorbell at its address and port in the host's shared folder, and talks
    /// to any number of devices of this host opened the same way with the same port,
    /// through one ring per sender and receiver that both processes map. No UDP socket: the CM's MADs go through
    /// the rings too. A peer that dies is a dead link (its QPs' retries run out).
    fn open_shm(cfg: EmuConfig) -> Result<EmuDevice> {
        let link = shm::ShmLink::new(cfg.ip, cfg.port)
            .map_err(|e| open_error(&cfg, e, "open the shared-memory link", shm::holder))?;
        let inner = Inner::new(cfg, Arc::new(link))?;
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{}-shm", inner.cfg.name))
            .spawn(move || worker.run())
            .map_err(|_| Error::NoMemory("cannot start the device thread"))?;
        Ok(EmuDevice {
            inner,
            thread: Some(thread),
            extra_threads: Vec::new(),
        })
    }

    /// Opens a device on any [`Link`], without a thread of its own: whoever owns the
    /// link delivers packets and fires timers through [`EmuDevice::driver`] (this is
    /// how the simulated fabric of crate `emu-sims` attaches devices).
    pub fn with_link(cfg: EmuConfig, link: Arc<dyn Link>) -> Result<EmuDevice> {
        Ok(EmuDevice {
            inner: Inner::new(cfg, link)?,
            thread: None,
            extra_threads: Vec::new(),
        })
    }
}

/// The error of a device that could not take `cfg`'s address: `AddressInUse` naming
/// the process that `holder` finds holding it, or the system's error with `context`.
fn open_error(
    cfg: &EmuConfig,
    e: std::io::Error,
    context: &'static str,
    holder: fn(IpAddr, u16) -> Option<String>,
) -> Error {
    if e.kind() == std::io::ErrorKind::AddrInUse {
        Error::AddressInUse(Box::new(verbs_api::TakenAddress {
            address: SocketAddr::new(cfg.ip, cfg.port),
            holder: holder(cfg.ip, cfg.port),
        }))
    } else {
        Error::Os {
            errno: e.raw_os_error().unwrap_or(nix::errno::Errno::EIO as i32),
            context,
        }
    }
}
