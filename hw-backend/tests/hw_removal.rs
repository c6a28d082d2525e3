//! `RDMA_CM_EVENT_DEVICE_REMOVAL` on a real device (librdmacm man page
//! rdma_get_cm_event(3); manual 4.3.1): the test deletes the very device it runs on with
//! `rdma link delete`, so it runs only when `RDMA_TEST_REMOVE_DEVICE` names that device
//! (the last step of the rxe VM job, scripts/rxe-vm/hw-job.sh) and skips otherwise.
#![cfg(feature = "hw")]
#![forbid(unsafe_code)]

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use hw_backend::{HwCm, HwDevice};
use verbs_api::*;

#[test]
fn removed_device_is_device_removal_on_every_id() {
    let Ok(link) = std::env::var("RDMA_TEST_REMOVE_DEVICE") else {
        eprintln!("SKIP: set RDMA_TEST_REMOVE_DEVICE=<device> to let this test delete it");
        return;
    };
    let dev = Arc::new(HwDevice::open(Some(&link)).expect("open the device to remove"));
    let ip = common::ipv4(&*dev).expect("an IPv4 RoCE GID");
    let cm = HwCm::new(dev.clone());
    let (sch, cch) = (
        cm.create_event_channel().unwrap(),
        cm.create_event_channel().unwrap(),
    );
    // A listener, and an id with its route resolved toward it.
    let to = SocketAddr::from((ip, 7470));
    let l = cm.create_id(sch, PortSpace::Tcp).unwrap();
    cm.bind_addr(l, to).unwrap();
    cm.listen(l, 4).unwrap();
    let c = cm.create_id(cch, PortSpace::Tcp).unwrap();
    cm.resolve_addr(c, None, to, Duration::from_secs(2))
        .unwrap();
    let wait = Some(Duration::from_secs(10));
    assert_eq!(
        cm.get_cm_event(cch, wait).unwrap().event,
        CmEventType::AddrResolved
    );
    cm.resolve_route(c, Duration::from_secs(2)).unwrap();
    assert_eq!(
        cm.get_cm_event(cch, wait).unwrap().event,
        CmEventType::RouteResolved
    );

    // The removal goes on in the background: the kernel finishes it once every
    // context on the device is closed, which with rxe (no context disassociation) and
    // librdmacm's own context means when this process exits; the VM job checks after.
    let mut rdma = Command::new("rdma")
        .args(["link", "delete", &link])
        .spawn()
        .expect("run `rdma link delete`");
    std::thread::spawn(move || rdma.wait());
    for (ch, id) in [(sch, l), (cch, c)] {
        let e = cm.get_cm_event(ch, wait).expect("DEVICE_REMOVAL");
        assert_eq!((e.event, e.id), (CmEventType::DeviceRemoval, id), "{e:?}");
    }
    // What the man page asks of the application: destroy the ids.
    cm.destroy_id(l).unwrap();
    cm.destroy_id(c).unwrap();
    cm.destroy_event_channel(sch).unwrap();
    cm.destroy_event_channel(cch).unwrap();
}
