//! The emulator's backends: over UDP loopback, and on the simulated fabric (with the
//! fault-injection capability).

use std::net::Ipv4Addr;
use std::sync::Arc;

use emu_core::nic::{EmuConfig, EmuDevice};
use sims::{Action, Fabric, Kind, Match, Rule};

use crate::{Backend, Faults, Opened};

/// The emulator over UDP loopback: each case gets a device of its own on 127.0.0.1 with
/// a port picked by the OS, its QPs talking to each other through that one device.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmuUdp;

impl Backend for EmuUdp {
    fn name(&self) -> &str {
        "emu-udp"
    }

    fn open(&self) -> Opened {
        let dev = EmuDevice::open(EmuConfig {
            port: 0,
            ..EmuConfig::default()
        })
        .expect("open an emulated device on 127.0.0.1");
        Opened {
            dev: Arc::new(dev),
            faults: None,
            virtual_time: false,
        }
    }

    fn is_emulator(&self) -> bool {
        true
    }
}

/// The emulator on the simulated fabric of `sims`: each case gets a fabric of its own
/// (seeded, virtual time) with one device; faults are fabric rules.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmuFabric;

/// The fabric of one case, as its fault-injection capability.
struct FabricFaults(Fabric);

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
        Opened {
            dev,
            faults: Some(Arc::new(FabricFaults(fabric))),
            virtual_time: true,
        }
    }

    fn is_emulator(&self) -> bool {
        true
    }
}
