//! `rdma-emu devinfo` prints what `ibv_devinfo -v` prints, in its words and layout
//! (issue 29, point 5): the key lines of a run, not a snapshot of every number.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_rdma-emu");

fn devinfo() -> String {
    let out = Command::new(BIN)
        .args(["devinfo", "--name", "emu9", "--ip", "127.0.0.9"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "devinfo failed: {stderr}");
    assert!(stderr.is_empty(), "devinfo wrote to stderr: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn devinfo_has_ibv_devinfos_key_lines() {
    let s = devinfo();
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines[0], "hca_id:\temu9", "{s}");
    for want in [
        "\ttransport:\t\t\tInfiniBand (0)",
        "\tnode_guid:\t\t\t",
        "\tvendor_id:\t\t\t0x",
        "\tphys_port_cnt:\t\t\t1",
        "\tatomic_cap:\t\t\tATOMIC_HCA (1)",
        "\t\tport:\t1",
        "\t\t\tstate:\t\t\tPORT_ACTIVE (4)",
        "\t\t\tmax_mtu:\t\t4096 (5)",
        "\t\t\tactive_mtu:\t\t",
        "\t\t\tsm_lid:\t\t\t0",
        "\t\t\tport_lid:\t\t0",
        "\t\t\tport_lmc:\t\t0x00",
        "\t\t\tlink_layer:\t\tEthernet",
        "\t\t\tphys_state:\t\tLINK_UP (5)",
        "\t\t\tGID[  0]:\t\t::ffff:127.0.0.9, RoCE v2",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(want)),
            "no line starting {want:?} in:\n{s}"
        );
    }
    // The capability flags, one a line under device_cap_flags, by their C names.
    let flags = lines
        .iter()
        .position(|l| l.starts_with("\tdevice_cap_flags:\t\t0x"))
        .unwrap_or_else(|| panic!("no device_cap_flags line in:\n{s}"));
    let names: Vec<&str> = lines[flags + 1..]
        .iter()
        .take_while(|l| l.starts_with("\t\t\t\t\t"))
        .map(|l| l.trim())
        .collect();
    assert!(names.contains(&"RC_RNR_NAK_GEN"), "{names:?}");
    assert!(names.contains(&"PORT_ACTIVE_EVENT"), "{names:?}");
    // No Rust debug names.
    for bad in ["Hca", "Active", "Mtu4096", "LinkUp"] {
        assert!(
            !lines.iter().any(|l| l.split_whitespace().any(|w| w == bad)),
            "{bad:?} in:\n{s}"
        );
    }
}
