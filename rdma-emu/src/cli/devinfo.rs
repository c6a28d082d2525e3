//! `rdma-emu devinfo`: what `ibv_devinfo -v` prints, for an emulated device opened on
//! UDP for the occasion.

use std::net::Ipv4Addr;

use clap::Args;
use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::Device;

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
        ip: o.ip,
        port: o.port,
        ..EmuConfig::default()
    })
    .map_err(|e| format!("cannot open an emulated device on {}: {e}", o.ip))?;
    print!("{}", render(&dev).map_err(|e| e.to_string())?);
    Ok(())
}

/// The text `devinfo` prints, in the layout of `ibv_devinfo -v`.
pub(crate) fn render(dev: &dyn Device) -> verbs_api::Result<String> {
    let a = dev.query_device()?;
    let g = a.node_guid.to_be_bytes();
    let guid = |b: &[u8; 8]| {
        format!(
            "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
        )
    };
    let mut s = String::new();
    let mut kv = |k: &str, v: String| s.push_str(&format!("\t{k:<32}{v}\n"));
    kv("hca_id:", dev.name().to_string());
    kv("transport:", "InfiniBand (0)".into());
    kv("fw_ver:", a.fw_ver.clone());
    kv("node_guid:", guid(&g));
    kv("sys_image_guid:", guid(&a.sys_image_guid.to_be_bytes()));
    kv("vendor_id:", format!("{:#06x}", a.vendor_id));
    kv("vendor_part_id:", a.vendor_part_id.to_string());
    kv("hw_ver:", format!("{:#x}", a.hw_ver));
    kv("phys_port_cnt:", a.phys_port_cnt.to_string());
    kv("max_mr_size:", format!("{:#x}", a.max_mr_size));
    kv("page_size_cap:", format!("{:#x}", a.page_size_cap));
    kv("max_qp:", a.max_qp.to_string());
    kv("max_qp_wr:", a.max_qp_wr.to_string());
    kv("max_sge:", a.max_sge.to_string());
    kv("max_sge_rd:", a.max_sge_rd.to_string());
    kv("max_cq:", a.max_cq.to_string());
    kv("max_cqe:", a.max_cqe.to_string());
    kv("max_mr:", a.max_mr.to_string());
    kv("max_pd:", a.max_pd.to_string());
    kv("max_qp_rd_atom:", a.max_qp_rd_atom.to_string());
    kv("max_res_rd_atom:", a.max_res_rd_atom.to_string());
    kv("max_qp_init_rd_atom:", a.max_qp_init_rd_atom.to_string());
    kv("atomic_cap:", format!("{:?}", a.atomic_cap));
    kv("max_pkeys:", a.max_pkeys.to_string());
    for port in 1..=a.phys_port_cnt {
        let p = dev.query_port(port)?;
        s.push_str(&format!("\t\tport:\t{port}\n"));
        let mut pk = |k: &str, v: String| s.push_str(&format!("\t\t\t{k:<24}{v}\n"));
        pk("state:", format!("{:?}", p.state));
        pk(
            "max_mtu:",
            format!("{} ({:?})", p.max_mtu.bytes(), p.max_mtu),
        );
        pk(
            "active_mtu:",
            format!("{} ({:?})", p.active_mtu.bytes(), p.active_mtu),
        );
        pk("max_msg_sz:", format!("{:#x}", p.max_msg_sz));
        pk("gid_tbl_len:", p.gid_tbl_len.to_string());
        pk("pkey_tbl_len:", p.pkey_tbl_len.to_string());
        pk("phys_state:", format!("{} (LinkUp)", p.phys_state));
        pk("link_layer:", format!("{:?}", p.link_layer));
        let gid = dev.query_gid(port, 0)?;
        pk("GID[  0]:", format!("{gid}, RoCE v2"));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devinfo_names_the_device_its_limits_and_gid() {
        let dev = EmuDevice::open(EmuConfig {
            name: "emu7".into(),
            ip: Ipv4Addr::new(127, 0, 0, 7),
            port: 0,
            ..EmuConfig::default()
        })
        .unwrap();
        let s = render(&dev).unwrap();
        assert!(s.contains("hca_id:") && s.contains("emu7"), "{s}");
        assert!(s.contains("max_qp_wr:"), "{s}");
        assert!(s.contains("::ffff:127.0.0.7"), "{s}");
        assert!(s.contains("RoCE v2"), "{s}");
    }
}
