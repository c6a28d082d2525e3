//! The emulator's backends: over UDP (loopback or any address of the host), and on the simulated fabric (with the
//! fault-injection capability).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use emu_cm::{CmConfig, EmuCm};
use emu_core::nic::{EmuConfig, EmuDevice, Management};
use emu_sims::{Action, Fabric, Kind, Match, Rule};
use verbs_api::{ConnectionManager, Device};

use crate::{Backend, CmOpener, Faults, Opened};

/// The emulator's CM over `dev`, on the clock of `fabric` when the device is on one: a
/// short response timeout (13: 33 ms) and 3 retries, so that a peer that never answers
/// is UNREACHABLE in about 130 ms.
fn emu_cm(dev: Arc<dyn Device>, fabric: Option<Fabric>) -> CmOpener {
    Arc::new(move || {
        let cfg = CmConfig {
            response_timeout: 13,
            max_retries: 3,
            ..CmConfig::default()
        };
        let cm = match &fabric {
            Some(fabric) => EmuCm::on_fabric(fabric, vec![dev.clone()], cfg)?,
            None => EmuCm::open(vec![dev.clone()], cfg)?,
        };
        Ok(Arc::new(cm) as Arc<dyn ConnectionManager>)
    })
}

/// The emulator over UDP: each case gets a device of its own on [`EmuUdp::ip`] with a
/// port picked by the OS, its QPs talking to each other through that one device.
///
/// By default the address is 127.0.0.1 (loopback). Any address of the host works: on
/// a real interface the port follows that interface (its MTU, speed and state), and
/// whatever routing the host has for datagrams to its own address carries the
/// device's traffic; `scripts/ci-netns.sh` runs the suite in a network namespace whose
/// routing sends them across a 1500-byte veth to another namespace and back.
#[derive(Clone, Debug)]
pub struct EmuUdp {
    /// The address each case's device binds (IPv4 or IPv6: `--ip ::1` runs the suite
    /// over UDP/IPv6).
    pub ip: IpAddr,
    /// The network interface that carries [`EmuUdp::ip`], if the cases may take it
    /// down and up (`ip link`, root) as their one fault: the device's port follows
    /// it, so the link-fault cases run as on hardware. `None` (the default): no fault
    /// injection, and those cases are skipped.
    pub link_faults: Option<String>,
}

impl Default for EmuUdp {
    fn default() -> Self {
        EmuUdp {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            link_faults: None,
        }
    }
}

impl Backend for EmuUdp {
    fn name(&self) -> &str {
        "emu-udp"
    }

    fn open(&self) -> Opened {
        let dev = EmuDevice::open(EmuConfig {
            ip: self.ip,
            port: 0,
            ..EmuConfig::default()
        })
        .unwrap_or_else(|e| panic!("open an emulated device on {}: {e}", self.ip));
        // The cases run on the address they were given: its GID's index (0, or 1 on a
        // device on both families, whose 0 is its interface's link-local address).
        let own = emu_core::nic::gid_of(self.ip);
        let gid_index = (0..16u8)
            .find(|&i| dev.query_gid(1, u32::from(i)).is_ok_and(|g| g == own))
            .unwrap_or(0);
        let dev: Arc<dyn Device> = Arc::new(dev);
        Opened {
            cm: Some(emu_cm(dev.clone(), None)),
            dev,
            faults: self
                .link_faults
                .as_deref()
                .map(|netdev| Arc::new(LinkFaults::on(netdev)) as Arc<dyn Faults>),
            virtual_time: false,
            gid_index,
        }
    }

    fn is_emulator(&self) -> bool {
        true
    }
}

/// The emulator on the simulated fabric of `emu-sims`: each case gets a fabric of its own
/// (seeded, virtual time) with one device; faults are fabric rules.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmuFabric;

/// The fabric of one case and its device's management handle, as the case's
/// fault-injection capability.
struct FabricFaults(Fabric, Management);

impl FabricFaults {
    /// Runs a management operation; on the fabric's own device it cannot fail but by a
    /// bug, which fails the case.
    fn manage(&self, what: &str, r: verbs_api::Result<()>) {
        if let Err(e) = r {
            panic!("management operation {what} failed: {e}");
        }
    }
}

impl Faults for FabricFaults {
    fn drop_all_acks(&self) {
        self.0.add_rule(Rule::new(
            "drop every ACK",
            Match::any().kind(Kind::Ack),
            Action::Drop,
        ));
    }

    fn truncate_next_read_response(&self, n: usize) {
        self.0.add_rule(
            Rule::new(
                "truncate the next READ response",
                Match::any().kind(Kind::ReadResponse),
                Action::Truncate(n),
            )
            .first(1),
        );
    }

    fn drop_send_tails(&self) {
        self.0.add_rule(Rule::custom("drop every SEND LAST", |p| {
            p.repr
                .bth
                .opcode
                .name()
                .contains("_SEND_LAST")
                .then_some(Action::Drop)
        }));
    }

    fn port_down(&self) {
        self.manage("port_down", self.1.port_down());
    }

    fn port_up(&self) {
        self.manage("port_up", self.1.port_up());
    }

    fn set_gid(&self, index: u32, gid: verbs_api::Gid) {
        self.manage("set_gid", self.1.set_gid(index, gid));
    }

    fn set_pkey(&self, index: u32, pkey: u16) {
        self.manage("set_pkey", self.1.set_pkey(index, pkey));
    }

    fn set_lid(&self, lid: u16) {
        self.manage("set_lid", self.1.set_lid(lid));
    }

    fn change_sm(&self, sm_lid: u16) {
        self.manage("set_sm", self.1.set_sm(sm_lid, 0));
    }

    fn client_reregister(&self) {
        self.manage("client_reregister", self.1.client_reregister());
    }

    fn drop_cm_mads(&self) {
        // The case's one device talks to itself: every packet for QP1 is a CM MAD.
        self.0.add_rule(Rule::new(
            "lose every CM MAD",
            Match::any().dest_qp(1),
            Action::Drop,
        ));
    }

    fn fail_device(&self) {
        self.manage("fail_device", self.1.fail_device());
    }

    fn fail_srq(&self, srq: verbs_api::SrqId) {
        self.manage("fail_srq", self.1.fail_srq(srq));
    }

    fn fail_qp(&self, qpn: u32, status: verbs_api::WcStatus) {
        self.manage("fail_qp", self.1.fail_qp(qpn, status));
    }
}

impl Backend for EmuFabric {
    fn name(&self) -> &str {
        "emu-fabric"
    }

    fn open(&self) -> Opened {
        let fabric = Fabric::new(1);
        let dev = fabric
            .add_device("dut", Ipv4Addr::new(192, 0, 2, 1))
            .expect("add a device to the fabric");
        let management = dev.management();
        Opened {
            cm: Some(emu_cm(dev.clone(), Some(fabric.clone()))),
            dev,
            faults: Some(Arc::new(FabricFaults(fabric, management))),
            virtual_time: true,
            gid_index: 0,
        }
    }

    fn is_emulator(&self) -> bool {
        true
    }
}

/// A real RDMA device through libibverbs (`hw-backend`, feature `hw`): each case opens
/// its own context on the device. The GID index is `$RDMA_GID_INDEX`, else 1 when port
/// 1 has a GID there (on rxe: the RoCEv2 link-local GID), else 0.
#[cfg(feature = "hw")]
#[derive(Clone, Debug, Default)]
pub struct Hw {
    /// The device name (`rxe0`, `mlx5_0`); the first device when `None`.
    pub name: Option<String>,
}

#[cfg(feature = "hw")]
impl Backend for Hw {
    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("hw")
    }

    fn open(&self) -> Opened {
        let dev = hw_backend::HwDevice::open(self.name.as_deref())
            .unwrap_or_else(|e| panic!("open the RDMA device: {e}"));
        let gid_index = std::env::var("RDMA_GID_INDEX")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| match dev.query_gid(1, 1) {
                Ok(g) if !g.is_zero() => 1,
                _ => 0,
            });
        let faults = LinkFaults::open(dev.name()).map(|f| Arc::new(f) as Arc<dyn Faults>);
        let dev = Arc::new(dev);
        let for_cm = dev.clone();
        let cm: CmOpener = Arc::new(move || {
            Ok(Arc::new(hw_backend::HwCm::new(for_cm.clone())) as Arc<dyn ConnectionManager>)
        });
        Opened {
            dev,
            faults,
            virtual_time: false,
            gid_index,
            cm: Some(cm),
        }
    }

    fn is_emulator(&self) -> bool {
        false
    }
}

/// A real port's one natural fault: its network interface taken down and up with
/// `ip link` (root), which the driver (rxe, or the emulator's device following its
/// interface) reports as PORT_ERR and PORT_ACTIVE. Hardware has it only with
/// `RDMA_TEST_LINK_FAULTS=1` (the rxe VM job sets it), the emulator over UDP only with
/// [`EmuUdp::link_faults`] (ci-netns.sh, in a network namespace): on a machine in use
/// it would cut the link. The link comes back up when the case ends, whatever
/// happened.
#[derive(Debug)]
struct LinkFaults {
    netdev: String,
    down: std::sync::atomic::AtomicBool,
}

impl LinkFaults {
    /// Faults that take `netdev` down and up.
    fn on(netdev: &str) -> LinkFaults {
        LinkFaults {
            netdev: netdev.to_string(),
            down: Default::default(),
        }
    }

    #[cfg(feature = "hw")]
    fn open(device: &str) -> Option<LinkFaults> {
        if std::env::var("RDMA_TEST_LINK_FAULTS").ok().as_deref() != Some("1") {
            return None;
        }
        // The network interface of GID entry 0 of port 1 (RoCE: the port's netdev).
        let path = format!("/sys/class/infiniband/{device}/ports/1/gid_attrs/ndevs/0");
        let netdev = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("RDMA_TEST_LINK_FAULTS=1 but {path}: {e}"));
        Some(LinkFaults::on(netdev.trim()))
    }

    /// `ip link set dev NETDEV STATE`.
    fn set_link(&self, state: &str) -> std::io::Result<std::process::ExitStatus> {
        std::process::Command::new("ip")
            .args(["link", "set", "dev", &self.netdev, state])
            .status()
    }

    fn ip_link(&self, state: &str) {
        let st = self.set_link(state).expect("run ip");
        assert!(
            st.success(),
            "ip link set dev {} {state} failed (needs root)",
            self.netdev
        );
        self.down
            .store(state == "down", std::sync::atomic::Ordering::SeqCst);
    }

    fn unsupported(&self, what: &str) -> ! {
        panic!("{what}: link faults only take the link down and up")
    }
}

impl Drop for LinkFaults {
    fn drop(&mut self) {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = self.set_link("up");
        }
    }
}

impl Faults for LinkFaults {
    fn link_only(&self) -> bool {
        true
    }
    fn port_down(&self) {
        self.ip_link("down");
    }
    fn port_up(&self) {
        self.ip_link("up");
    }
    fn drop_all_acks(&self) {
        self.unsupported("drop_all_acks")
    }
    fn truncate_next_read_response(&self, _: usize) {
        self.unsupported("truncate_next_read_response")
    }
    fn drop_send_tails(&self) {
        self.unsupported("drop_send_tails")
    }
    fn set_gid(&self, _: u32, _: verbs_api::Gid) {
        self.unsupported("set_gid")
    }
    fn set_pkey(&self, _: u32, _: u16) {
        self.unsupported("set_pkey")
    }
    fn set_lid(&self, _: u16) {
        self.unsupported("set_lid")
    }
    fn change_sm(&self, _: u16) {
        self.unsupported("change_sm")
    }
    fn client_reregister(&self) {
        self.unsupported("client_reregister")
    }
    fn drop_cm_mads(&self) {
        self.unsupported("drop_cm_mads")
    }
    fn fail_device(&self) {
        self.unsupported("fail_device")
    }
    fn fail_srq(&self, _: verbs_api::SrqId) {
        self.unsupported("fail_srq")
    }
    fn fail_qp(&self, _: u32, _: verbs_api::WcStatus) {
        self.unsupported("fail_qp")
    }
}
