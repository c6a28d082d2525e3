//! A process that exits with a connection still up tells its peer, as the kernel
//! does when the process's rdma_cm file closes (`ucma_close` destroys the ids, and
//! an established one sends a DREQ): the peer gets `DISCONNECTED` at once instead
//! of never. The test runs itself a second time as the client process.

// This test plays the C program: raw pointers are its whole point.
#![allow(unsafe_code)]

use std::process::{Command, Stdio};
use std::ptr::null_mut;

use rdma_emu_ibverbs::sys::rdma as r;
use rdma_emu_ibverbs::sys::{ibv_qp_init_attr, IBV_QPT_RC};
use rdma_emu_ibverbs::*;

const SERVER: [u8; 4] = [127, 0, 0, 27];
const CLIENT: [u8; 4] = [127, 0, 0, 28];
const PORT: u16 = 7996;
/// Set in the environment of the second run: it is the client.
const ROLE: &str = "RDMACM_EXIT_TEST_CLIENT";

fn sin(ip: [u8; 4], port: u16) -> r::sockaddr_in {
    r::sockaddr_in {
        sin_family: libc::AF_INET as r::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: r::in_addr {
            s_addr: u32::from_be_bytes(ip).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// The next event of `ch` within `ms` (None if none came), acked; its type and id.
unsafe fn next_event(
    ch: *mut r::rdma_event_channel,
    ms: i32,
) -> Option<(r::rdma_cm_event_type, *mut r::rdma_cm_id)> {
    unsafe {
        let mut p = libc::pollfd {
            fd: (*ch).fd,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut p, 1, ms) != 1 {
            return None;
        }
        let mut ev = null_mut();
        assert_eq!(rdma_get_cm_event(ch, &mut ev), 0);
        let got = ((*ev).event, (*ev).id);
        assert_eq!(rdma_ack_cm_event(ev), 0);
        Some(got)
    }
}

unsafe fn expect(
    ch: *mut r::rdma_event_channel,
    want: r::rdma_cm_event_type,
) -> *mut r::rdma_cm_id {
    let got = unsafe { next_event(ch, 5000) };
    let (ty, id) = got.unwrap_or_else(|| panic!("no event {want} within 5 s"));
    assert_eq!(ty, want, "event {ty}, want {want}");
    id
}

fn rc_attr() -> ibv_qp_init_attr {
    let mut a = ibv_qp_init_attr {
        qp_type: IBV_QPT_RC,
        ..Default::default()
    };
    a.cap.max_send_wr = 4;
    a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a
}

/// The client process: connects, then leaves with `exit` and the connection up.
unsafe fn client() -> ! {
    unsafe {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut id = null_mut();
        assert_eq!(rdma_create_id(ch, &mut id, null_mut(), r::RDMA_PS_TCP), 0);
        let mut src = sin(CLIENT, 0);
        let mut dst = sin(SERVER, PORT);
        assert_eq!(
            rdma_resolve_addr(id, (&raw mut src).cast(), (&raw mut dst).cast(), 2000),
            0
        );
        expect(ch, r::RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(rdma_resolve_route(id, 2000), 0);
        expect(ch, r::RDMA_CM_EVENT_ROUTE_RESOLVED);
        let mut a = rc_attr();
        assert_eq!(rdma_create_qp(id, null_mut(), &mut a), 0);
        let mut cp = r::rdma_conn_param {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        };
        assert_eq!(rdma_connect(id, &mut cp), 0);
        expect(ch, r::RDMA_CM_EVENT_ESTABLISHED);
        println!("client connected");
        // No disconnect, no destroy: the process just ends (exit(3) runs atexit).
        std::process::exit(0);
    }
}

#[test]
fn an_exiting_process_disconnects_its_peer() {
    if std::env::var_os(ROLE).is_some() {
        // SAFETY: the second run of this test binary; read once at the first call.
        unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=127.0.0.28") };
        // SAFETY: the C ABI as a C program calls it.
        unsafe { client() };
    }
    // SAFETY: no other thread of this test binary reads the environment yet.
    unsafe { std::env::set_var("RDMA_EMU_DEVICES", "emu0=127.0.0.27") };
    // SAFETY: the C ABI as a C program calls it.
    unsafe {
        let ch = rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut listen = null_mut();
        assert_eq!(
            rdma_create_id(ch, &mut listen, null_mut(), r::RDMA_PS_TCP),
            0
        );
        let mut a = sin(SERVER, PORT);
        assert_eq!(rdma_bind_addr(listen, (&raw mut a).cast()), 0);
        assert_eq!(rdma_listen(listen, 1), 0);

        let exe = std::env::current_exe().unwrap();
        let child = Command::new(exe)
            .args([
                "--exact",
                "an_exiting_process_disconnects_its_peer",
                "--nocapture",
            ])
            .env(ROLE, "1")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();

        let sid = expect(ch, r::RDMA_CM_EVENT_CONNECT_REQUEST);
        let mut qa = rc_attr();
        assert_eq!(rdma_create_qp(sid, null_mut(), &mut qa), 0);
        let mut ap = r::rdma_conn_param {
            responder_resources: 1,
            initiator_depth: 1,
            ..Default::default()
        };
        assert_eq!(rdma_accept(sid, &mut ap), 0);
        assert_eq!(expect(ch, r::RDMA_CM_EVENT_ESTABLISHED), sid);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "client: {out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("client connected"));
        // The client's exit sent the DREQ: DISCONNECTED now, not after any timeout.
        assert_eq!(expect(ch, r::RDMA_CM_EVENT_DISCONNECTED), sid);
        assert_eq!(rdma_disconnect(sid), 0);
        rdma_destroy_qp(sid);
        assert_eq!(rdma_destroy_id(sid), 0);
        assert_eq!(rdma_destroy_id(listen), 0);
        rdma_destroy_event_channel(ch);
    }
}
