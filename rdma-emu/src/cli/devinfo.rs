//! `rdma-emu devinfo`: what `ibv_devinfo -v` prints, for an emulated device opened on
//! UDP for the occasion.
//!
//! The layout is rdma-core's: the same keys in the same order, the same names for
//! enumerations (`PORT_ACTIVE (4)`, `4096 (5)`, `ATOMIC_HCA (1)`), the capability flags
//! one a line under `device_cap_flags`, and tabs that put device values in column 40
//! and port values in column 48. What the verbs API has no field for (the extended
//! attributes of `ibv_query_device_ex`: ODP, TSO, RSS, tag matching, and a port's
//! `port_cap_flags2`) is left out rather than printed as zeros.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use clap::Args;
use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::{AtomicCap, Device, DeviceCapFlags, LinkLayer, Mtu, PortState};

/// Options of `rdma-emu devinfo`.
#[derive(Args, Debug)]
pub(crate) struct DevinfoOpts {
    /// The device's name.
    #[arg(long, default_value = "emu0")]
    name: String,
    /// The device's IPv4 address (its GID is ::ffff:ADDR).
    #[arg(long, default_value = "127.0.0.1")]
    ip: Ipv4Addr,
    /// UDP port (0: any free one, so a running device on 4791 is no obstacle).
    #[arg(long, default_value_t = 0)]
    port: u16,
}

/// Opens the device and prints its attributes, port 1's, and its GID table.
pub(crate) fn run(o: DevinfoOpts) -> Result<(), String> {
    let dev = EmuDevice::open(EmuConfig {
        name: o.name,
        ip: o.ip.into(),
        port: o.port,
        ..EmuConfig::default()
    })
    .map_err(|e| format!("cannot open an emulated device on {}: {e}", o.ip))?;
    print!("{}", render(&dev).map_err(|e| e.to_string())?);
    Ok(())
}

/// `IBV_TRANSPORT_IB`: RoCE devices report the InfiniBand transport.
const TRANSPORT_IB: u32 = 0;

/// The text `ibv_devinfo` prints for a GUID: four groups of four hex digits.
fn guid(g: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        g >> 48,
        (g >> 32) & 0xffff,
        (g >> 16) & 0xffff,
        g & 0xffff
    )
}

fn port_state_name(s: PortState) -> &'static str {
    match s {
        PortState::Down => "PORT_DOWN",
        PortState::Init => "PORT_INIT",
        PortState::Armed => "PORT_ARMED",
        PortState::Active => "PORT_ACTIVE",
        PortState::Nop | PortState::ActiveDefer => "invalid state",
    }
}

fn atomic_cap_name(a: AtomicCap) -> &'static str {
    match a {
        AtomicCap::None => "ATOMIC_NONE",
        AtomicCap::Hca => "ATOMIC_HCA",
        AtomicCap::Glob => "ATOMIC_GLOB",
    }
}

/// An MTU as `ibv_devinfo` shows it: bytes, then the enumeration's value.
fn mtu(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m.as_u32())
}

/// The IBTA encoding of a port's physical state, by name.
fn phys_state_name(s: u8) -> &'static str {
    match s {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}

/// The IBTA encoding of a link width: the lane count.
fn width_name(w: u8) -> &'static str {
    match w {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

/// The IBTA encoding of a lane's speed.
fn speed_name(s: u8) -> &'static str {
    match s {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        _ => "invalid speed",
    }
}

/// The encoding of `max_vl_num`: the number of data VLs.
fn vl_name(v: u8) -> &'static str {
    match v {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

fn link_layer_name(l: LinkLayer) -> &'static str {
    match l {
        LinkLayer::Unspecified => "Unspecified",
        LinkLayer::InfiniBand => "InfiniBand",
        LinkLayer::Ethernet => "Ethernet",
    }
}

/// Text in `ibv_devinfo`'s layout: a line is `indent` tabs, the key, then tabs up to
/// column `col` (tab stops every 8 columns, at least one tab).
struct Out {
    s: String,
}

impl Out {
    fn line(&mut self, indent: usize, col: usize, key: &str, value: impl std::fmt::Display) {
        let used = indent * 8 + key.len();
        let tabs = col.saturating_sub(used).div_ceil(8).max(1);
        let _ = writeln!(
            self.s,
            "{}{key}{}{value}",
            "\t".repeat(indent),
            "\t".repeat(tabs)
        );
    }

    /// A device attribute: one tab in, value in column 40.
    fn dev(&mut self, key: &str, value: impl std::fmt::Display) {
        self.line(1, 40, key, value);
    }

    /// A port attribute: three tabs in, value in column 48.
    fn port(&mut self, key: &str, value: impl std::fmt::Display) {
        self.line(3, 48, key, value);
    }

    /// A flag's name under the attribute that holds it: five tabs in.
    fn flag(&mut self, name: &str) {
        let _ = writeln!(self.s, "\t\t\t\t\t{name}");
    }
}

/// The text `devinfo` prints, in the layout of `ibv_devinfo -v`.
pub(crate) fn render(dev: &dyn Device) -> verbs_api::Result<String> {
    let a = dev.query_device()?;
    let mut o = Out {
        s: format!("hca_id:\t{}\n", dev.name()),
    };
    o.dev("transport:", format!("InfiniBand ({TRANSPORT_IB})"));
    if !a.fw_ver.is_empty() {
        o.dev("fw_ver:", &a.fw_ver);
    }
    o.dev("node_guid:", guid(a.node_guid));
    o.dev("sys_image_guid:", guid(a.sys_image_guid));
    o.dev("vendor_id:", format!("0x{:04x}", a.vendor_id));
    o.dev("vendor_part_id:", a.vendor_part_id);
    o.dev("hw_ver:", format!("0x{:X}", a.hw_ver));
    o.dev("phys_port_cnt:", a.phys_port_cnt);
    o.dev("max_mr_size:", format!("0x{:x}", a.max_mr_size));
    o.dev("page_size_cap:", format!("0x{:x}", a.page_size_cap));
    o.dev("max_qp:", a.max_qp);
    o.dev("max_qp_wr:", a.max_qp_wr);
    let flags = a.device_cap_flags;
    o.dev("device_cap_flags:", format!("0x{:08x}", flags.bits()));
    for (name, _) in flags.iter_names() {
        o.flag(name);
    }
    let unknown = flags.bits() & !DeviceCapFlags::all().bits();
    if unknown != 0 {
        o.flag(&format!("Unknown flags: 0x{unknown:X}"));
    }
    o.dev("max_sge:", a.max_sge);
    o.dev("max_sge_rd:", a.max_sge_rd);
    o.dev("max_cq:", a.max_cq);
    o.dev("max_cqe:", a.max_cqe);
    o.dev("max_mr:", a.max_mr);
    o.dev("max_pd:", a.max_pd);
    o.dev("max_qp_rd_atom:", a.max_qp_rd_atom);
    o.dev("max_ee_rd_atom:", a.max_ee_rd_atom);
    o.dev("max_res_rd_atom:", a.max_res_rd_atom);
    o.dev("max_qp_init_rd_atom:", a.max_qp_init_rd_atom);
    o.dev("max_ee_init_rd_atom:", a.max_ee_init_rd_atom);
    o.dev(
        "atomic_cap:",
        format!(
            "{} ({})",
            atomic_cap_name(a.atomic_cap),
            a.atomic_cap.as_u32()
        ),
    );
    o.dev("max_ee:", a.max_ee);
    o.dev("max_rdd:", a.max_rdd);
    o.dev("max_mw:", a.max_mw);
    o.dev("max_raw_ipv6_qp:", a.max_raw_ipv6_qp);
    o.dev("max_raw_ethy_qp:", a.max_raw_ethy_qp);
    o.dev("max_mcast_grp:", a.max_mcast_grp);
    o.dev("max_mcast_qp_attach:", a.max_mcast_qp_attach);
    o.dev("max_total_mcast_qp_attach:", a.max_total_mcast_qp_attach);
    o.dev("max_ah:", a.max_ah);
    o.dev("max_fmr:", a.max_fmr);
    if a.max_fmr != 0 {
        o.dev("max_map_per_fmr:", a.max_map_per_fmr);
    }
    o.dev("max_srq:", a.max_srq);
    if a.max_srq != 0 {
        o.dev("max_srq_wr:", a.max_srq_wr);
        o.dev("max_srq_sge:", a.max_srq_sge);
    }
    o.dev("max_pkeys:", a.max_pkeys);
    o.dev("local_ca_ack_delay:", a.local_ca_ack_delay);
    for port in 1..=a.phys_port_cnt {
        let p = dev.query_port(port)?;
        let _ = writeln!(o.s, "\t\tport:\t{port}");
        o.port(
            "state:",
            format!("{} ({})", port_state_name(p.state), p.state.as_u32()),
        );
        o.port("max_mtu:", mtu(p.max_mtu));
        o.port("active_mtu:", mtu(p.active_mtu));
        o.port("sm_lid:", p.sm_lid);
        o.port("port_lid:", p.lid);
        o.port("port_lmc:", format!("0x{:02x}", p.lmc));
        o.port("link_layer:", link_layer_name(p.link_layer));
        o.port("max_msg_sz:", format!("0x{:x}", p.max_msg_sz));
        o.port("port_cap_flags:", format!("0x{:08x}", p.port_cap_flags));
        o.port(
            "max_vl_num:",
            format!("{} ({})", vl_name(p.max_vl_num), p.max_vl_num),
        );
        o.port("bad_pkey_cntr:", format!("0x{:x}", p.bad_pkey_cntr));
        o.port("qkey_viol_cntr:", format!("0x{:x}", p.qkey_viol_cntr));
        o.port("sm_sl:", p.sm_sl);
        o.port("pkey_tbl_len:", p.pkey_tbl_len);
        o.port("gid_tbl_len:", p.gid_tbl_len);
        o.port("subnet_timeout:", p.subnet_timeout);
        o.port("init_type_reply:", p.init_type_reply);
        o.port(
            "active_width:",
            format!("{}X ({})", width_name(p.active_width), p.active_width),
        );
        o.port(
            "active_speed:",
            format!("{} ({})", speed_name(p.active_speed), p.active_speed),
        );
        // Printed for the InfiniBand transport, which RoCE reports.
        o.port(
            "phys_state:",
            format!("{} ({})", phys_state_name(p.phys_state), p.phys_state),
        );
        // Every entry that holds an address; the emulator's GIDs are all RoCE v2,
        // shown as IPv6 text.
        for i in 0..p.gid_tbl_len {
            let gid = dev.query_gid(port, i)?;
            if !gid.is_zero() {
                let key = format!("GID[{i:3}]:");
                if p.link_layer == LinkLayer::Ethernet {
                    o.port(&key, format!("{}, RoCE v2", gid.to_ipv6()));
                } else {
                    o.port(&key, gid.to_ipv6());
                }
            }
        }
        o.s.push('\n');
    }
    Ok(o.s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_line_up_at_ibv_devinfos_tab_stops() {
        let mut o = Out { s: String::new() };
        o.dev("max_qp:", 1);
        o.dev("max_qp_wr:", 2);
        o.dev("max_total_mcast_qp_attach:", 3);
        o.port("state:", 4);
        o.port("port_cap_flags:", 5);
        o.port("GID[  0]:", 6);
        assert_eq!(
            o.s,
            "\tmax_qp:\t\t\t\t1\n\tmax_qp_wr:\t\t\t2\n\tmax_total_mcast_qp_attach:\t3\n\
             \t\t\tstate:\t\t\t4\n\t\t\tport_cap_flags:\t\t5\n\t\t\tGID[  0]:\t\t6\n"
        );
    }

    #[test]
    fn guids_are_four_groups_of_four_hex_digits() {
        assert_eq!(guid(0x0200_fffe_7f00_0001), "0200:fffe:7f00:0001");
    }
}
