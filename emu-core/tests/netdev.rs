//! A UDP device's port follows the network interface that carries its address, as
//! kernel rxe follows its netdev: the active MTU from the interface's MTU (1500 gives
//! 1024, 9000 gives 4096), width and speed from its speed, and the port's state from
//! the interface's (down: PORT_ERR; up again: PORT_ACTIVE).
//!
//! Runs in a child process inside new user, network and mount namespaces (`unshare
//! -Urnm`, unprivileged), where it makes a veth pair and remounts sysfs for that
//! network namespace; skips, saying so, where namespaces cannot be had.

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use emu_core::nic::{EmuConfig, EmuDevice};
use verbs_api::{AsyncEventType, Device, Mtu, PortAttr, PortState, QpAttr, QpAttrMask, QpType};

mod netns_util;

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-c", cmd]).status().unwrap();
    assert!(st.success(), "{cmd}");
}

/// Polls the port until `want` holds (the device thread looks once a second).
fn port_until(dev: &EmuDevice, want: impl Fn(&PortAttr) -> bool) -> PortAttr {
    let t = Instant::now();
    loop {
        let p = dev.query_port(1).unwrap();
        if want(&p) || t.elapsed() > Duration::from_secs(5) {
            return p;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn next_event(dev: &EmuDevice) -> AsyncEventType {
    dev.get_async_event(Some(Duration::from_secs(5)))
        .expect("an async event")
        .event_type
}

#[test]
fn the_port_follows_its_interface() {
    if netns_util::is_child() {
        return in_namespaces();
    }
    let Some((ok, text)) = netns_util::run_child("the_port_follows_its_interface", true) else {
        return;
    };
    assert!(ok && text.contains("netdev: all checks passed"), "{text}");
}

fn in_namespaces() {
    sh("mount -t sysfs sysfs /sys");
    sh("ip link set lo up");
    sh("ip link add v0 type veth peer name v1");
    sh("ip addr add 10.77.0.1/24 dev v0");
    sh("ip link set v0 up && ip link set v1 up");
    let dev = EmuDevice::open(EmuConfig {
        ip: Ipv4Addr::new(10, 77, 0, 1).into(),
        port: 0,
        ..EmuConfig::default()
    })
    .unwrap();

    // 1500 bytes: 1024, as rxe derives it; a veth says 10 Gb/s: 1X FDR10.
    let p = port_until(&dev, |p| p.state == PortState::Active);
    assert_eq!(p.active_mtu, Mtu::Mtu1024);
    assert_eq!(p.max_mtu, Mtu::Mtu4096);
    assert_eq!((p.active_width, p.active_speed), (1, 8));

    // A path MTU above the active MTU is refused; the active one is taken.
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16, None).unwrap();
    let qpn = dev
        .create_qp(&verbs_api::QpInitAttr::new(
            pd,
            cq,
            QpType::Rc,
            verbs_api::QpCap::new(4, 4),
        ))
        .unwrap();
    let init = QpAttr {
        qp_state: verbs_api::QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let m =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    dev.modify_qp(qpn, &init, m).unwrap();
    let mut rtr = QpAttr {
        qp_state: verbs_api::QpState::Rtr,
        path_mtu: Mtu::Mtu4096,
        dest_qp_num: qpn,
        min_rnr_timer: 1,
        ..QpAttr::default()
    };
    rtr.ah_attr.is_global = true;
    rtr.ah_attr.grh.dgid = verbs_api::Gid::from_ipv4(Ipv4Addr::new(10, 77, 0, 1));
    rtr.ah_attr.port_num = 1;
    let m = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    assert_eq!(dev.modify_qp(qpn, &rtr, m).unwrap_err().errno(), 22);
    rtr.path_mtu = Mtu::Mtu1024;
    dev.modify_qp(qpn, &rtr, m).unwrap();

    // Jumbo frames: 4096.
    sh("ip link set v0 mtu 9000");
    let p = port_until(&dev, |p| p.active_mtu == Mtu::Mtu4096);
    assert_eq!(p.active_mtu, Mtu::Mtu4096);

    // The link goes down under the interface: PORT_ERR; back up: PORT_ACTIVE.
    sh("ip link set v1 down");
    let p = port_until(&dev, |p| p.state == PortState::Down);
    assert_eq!(p.state, PortState::Down);
    assert_eq!(next_event(&dev), AsyncEventType::PortErr);
    sh("ip link set v1 up");
    let p = port_until(&dev, |p| p.state == PortState::Active);
    assert_eq!(p.state, PortState::Active);
    assert_eq!(next_event(&dev), AsyncEventType::PortActive);

    dev.destroy_qp(qpn).unwrap();
    println!("netdev: all checks passed");
}
