//! The UDP link's tests: receives (GRO runs, batching, its back-off) and sends
//! (GSO runs, connected peer sockets, IP IDs).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use super::recv::{BATCH_AFTER, BATCH_BACKOFF};
use super::send::MAX_PEER_SOCKETS;
use super::*;
use crate::nic::interop::{LinkOptions, PacketHook, Verdict};
use crate::nic::link::{Link, Route, Transmit};

/// Sends one packet from `src` to `dst` through `l`.
fn send1(
    l: &UdpLink,
    src: impl Into<IpAddr>,
    dst: impl Into<IpAddr>,
    p: &mut [u8],
) -> std::io::Result<()> {
    l.send(&mut [Transmit::one(
        Route {
            src: src.into(),
            dst: dst.into(),
            tos: 0,
        },
        p,
    )])
}

/// Sends a run of `segment`-byte packets from `src` to `dst` through `l`.
fn send_run(
    l: &UdpLink,
    src: impl Into<IpAddr>,
    dst: impl Into<IpAddr>,
    run: &mut [u8],
    segment: usize,
) -> std::io::Result<()> {
    l.send(&mut [Transmit {
        route: Route {
            src: src.into(),
            dst: dst.into(),
            tos: 0,
        },
        contents: run,
        segment_size: segment,
    }])
}
use emu_wire::{check_icrc, Ipv4Endpoints};
use nix::sys::socket::sockopt;

/// Two links on one port, on 127.0.0.1 and 127.0.0.2.
fn pair() -> (UdpLink, UdpLink) {
    let opts = LinkOptions::default();
    let a = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 1).into(), 0, &opts, None).unwrap();
    let b = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 2).into(), a.port(), &opts, None).unwrap();
    (a, b)
}

/// What `receive` got: (length, ICRC right, bytes) per datagram.
type Got = Vec<(usize, bool, Vec<u8>)>;

/// The source port of `a`'s datagrams to `dst`: its connected socket's, once it
/// has sent there, or the bound one.
fn sent_from(a: &UdpLink, dst: impl Into<IpAddr>) -> u16 {
    let dst = dst.into();
    a.peers
        .lock()
        .iter()
        .find(|p| p.dst == dst)
        .and_then(|p| p.socket.as_ref())
        .map_or(a.port(), |s| s.1)
}

/// Waits for `want` datagrams from 127.0.0.1 and receives them through `b`, with
/// the one-slot receive of an idle poll or the batched one; also how many
/// receives it took. Each must come from port `from`.
fn receive(b: &UdpLink, idle: bool, want: usize, from: u16) -> (Got, usize) {
    let mut rx = b.rx_bufs();
    let mut out = Vec::new();
    let mut calls = 0;
    while out.len() < want {
        calls += 1;
        assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
        rx.found = if idle { 0 } else { BATCH_AFTER };
        b.recv_batch(&mut rx);
        for d in &rx.got {
            assert_eq!(d.from.ip(), IpAddr::from(Ipv4Addr::new(127, 0, 0, 1)));
            assert_eq!(d.from.port(), from);
            let bytes = rx.bytes(d);
            out.push((
                bytes.len(),
                b.icrc_ip_id(d, bytes, 0).is_some(),
                bytes.to_vec(),
            ));
        }
    }
    (out, calls)
}

/// A run of three packets leaves as one GSO send (the last shorter) and comes back
/// as three datagrams, whichever receive takes it, each with its ICRC right.
#[test]
fn a_gso_run_arrives_as_its_datagrams() {
    for idle in [true, false] {
        let (a, b) = pair();
        // Three "packets": 100, 100 and 60 bytes, ICRC slots included.
        let mut run: Vec<u8> = (0..260u32).map(|i| (i % 251) as u8).collect();
        send_run(&a, a.ip, b.ip, &mut run, 100).unwrap();
        let (got, calls) = receive(&b, idle, 3, sent_from(&a, b.ip));
        if a.max_segments() > 1 && b.state.gro_segments() > 1 {
            // GSO and GRO on: one receive took the whole run and split it by the
            // segment size the kernel reported.
            assert_eq!(calls, 1, "idle {idle}");
        }
        let lens: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(lens, [100, 100, 60], "idle {idle}");
        assert!(got.iter().all(|g| g.1), "ICRC, idle {idle}");
        let joined: Vec<u8> = got.iter().flat_map(|g| g.2.clone()).collect();
        assert_eq!(joined, run, "idle {idle}");
    }
}

/// A lone packet leaves with `sendto` and arrives whole, ICRC right; a corrupted
/// byte fails the check.
#[test]
fn a_single_datagram_arrives_with_its_icrc() {
    let (a, b) = pair();
    let mut p = vec![7u8; 40];
    send1(&a, a.ip, b.ip, &mut p).unwrap();
    let (got, _) = receive(&b, true, 1, sent_from(&a, b.ip));
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0, got[0].1), (40, true));
    let mut rx = b.rx_bufs();
    let mut q = vec![9u8; 40];
    send1(&a, a.ip, b.ip, &mut q).unwrap();
    assert!(b.wait_readable(Duration::from_secs(2)));
    rx.found = 0;
    assert_eq!(b.recv_batch(&mut rx), 1);
    let d = rx.got[0];
    let mut bytes = rx.bytes(&d).to_vec();
    bytes[3] ^= 1;
    assert!(b.icrc_ip_id(&d, &bytes, 0).is_none());
}

/// Nothing waiting: the one-slot receive returns nothing and does not block.
#[test]
fn an_idle_receive_finds_nothing() {
    let (_a, b) = pair();
    let mut rx = b.rx_bufs();
    rx.found = 0;
    assert_eq!(b.recv_batch(&mut rx), 0);
    assert_eq!(rx.found, 0);
}

/// Datagrams sent one by one are read one slot at a time until three receives in
/// a row found one; the fourth takes all that wait in one batched call.
#[test]
fn receives_batch_only_once_datagrams_keep_coming() {
    let (a, b) = pair();
    for n in 0..5u8 {
        let mut p = vec![n; 40];
        send1(&a, a.ip, b.ip, &mut p).unwrap();
    }
    let mut rx = b.rx_bufs();
    rx.found = 0;
    let mut counts = Vec::new();
    while counts.iter().sum::<usize>() < 5 {
        assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
        counts.push(b.recv_batch(&mut rx));
    }
    assert_eq!(counts, [1, 1, 1, 2]);
    assert_eq!(b.recv_batch(&mut rx), 0);
    assert_eq!(rx.found, 0, "an empty receive starts over");
}

/// Whether the socket has `UDP_GRO` on, as the kernel says.
fn gro_on(l: &UdpLink) -> bool {
    nix::sys::socket::getsockopt(&l.socket, sockopt::UdpGroSegment).unwrap()
}

/// Receives until `want` datagrams came, one receive per wake-up; their lengths
/// (each ICRC checked) and how many receives found something.
fn take(b: &UdpLink, rx: &mut RxBufs, want: usize) -> (Vec<usize>, usize) {
    let mut lens = Vec::new();
    let mut calls = 0;
    while lens.len() < want {
        assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
        if b.recv_batch(rx) > 0 {
            calls += 1;
        }
        for d in &rx.got {
            assert!(
                b.icrc_ip_id(d, rx.bytes(d), 0).is_some(),
                "ICRC of datagram {}",
                lens.len()
            );
            lens.push(d.len);
        }
    }
    (lens, calls)
}

/// Quiet traffic turns GRO off; once a receive found the socket empty, one-slot
/// receives read with `recvfrom`, and a run sent then arrives as its datagrams
/// (the kernel splits it). A backlog turns GRO back on, and a run then arrives in
/// one receive again.
#[test]
fn gro_follows_the_traffic() {
    let (a, b) = pair();
    if b.state.gro_segments() <= 1 {
        return; // a kernel without UDP_GRO: nothing switches
    }
    let mut rx = b.rx_bufs();
    rx.found = 0;
    assert!(gro_on(&b) && rx.gro.on());
    for _ in 0..crate::nic::gro::QUIET - 1 {
        assert_eq!(b.recv_batch(&mut rx), 0);
    }
    assert!(gro_on(&b));
    assert_eq!(b.recv_batch(&mut rx), 0);
    assert!(!gro_on(&b) && !rx.gro.on());
    assert!(rx.gro.plain(), "the socket was empty at the switch");
    let mut p = vec![3u8; 40];
    send1(&a, a.ip, b.ip, &mut p).unwrap();
    assert_eq!(take(&b, &mut rx, 1), (vec![40], 1));
    assert_eq!(rx.got[0].from.port(), sent_from(&a, b.ip));
    assert_eq!(rx.bytes(&rx.got[0])[..36], p[..36]);
    let mut run: Vec<u8> = (0..260u32).map(|i| (i % 251) as u8).collect();
    send_run(&a, a.ip, b.ip, &mut run, 100).unwrap();
    rx.found = 0;
    assert_eq!(take(&b, &mut rx, 3).0, [100, 100, 60]);
    // A backlog: runs split into twelve datagrams, taken by one batched receive.
    for _ in 0..4 {
        let mut run: Vec<u8> = vec![5u8; 300];
        send_run(&a, a.ip, b.ip, &mut run, 100).unwrap();
    }
    rx.found = BATCH_AFTER;
    rx.backoff = 0;
    assert_eq!(take(&b, &mut rx, 12), (vec![100; 12], 1));
    assert!(gro_on(&b) && rx.gro.on() && !rx.gro.plain());
    let mut run: Vec<u8> = vec![6u8; 260];
    send_run(&a, a.ip, b.ip, &mut run, 100).unwrap();
    rx.found = 0;
    assert_eq!(take(&b, &mut rx, 3), (vec![100, 100, 60], 1));
}

/// A run queued while GRO was on cannot be split once it is off (the kernel then
/// reports no segment size): turning GRO off with anything queued turns it back
/// on, and the run is read right.
#[test]
fn gro_stays_on_while_something_is_queued() {
    let (a, b) = pair();
    if b.state.gro_segments() <= 1 {
        return;
    }
    let mut rx = b.rx_bufs();
    rx.found = 0;
    let mut run: Vec<u8> = (0..260u32).map(|i| (i % 251) as u8).collect();
    send_run(&a, a.ip, b.ip, &mut run, 100).unwrap();
    assert!(b.wait_readable(Duration::from_secs(2)));
    b.switch_gro(&mut rx.gro, false);
    assert!(gro_on(&b) && rx.gro.on() && !rx.gro.plain());
    assert_eq!(take(&b, &mut rx, 3), (vec![100, 100, 60], 1));
    b.switch_gro(&mut rx.gro, false);
    assert!(!gro_on(&b) && rx.gro.plain(), "empty now: off");
}

/// A batched receive that takes a single datagram (no backlog) makes the next
/// [`BATCH_BACKOFF`] receives one-slot, however many in a row find datagrams;
/// then batching resumes.
#[test]
fn a_batch_without_backlog_backs_off() {
    let (a, b) = pair();
    let mut rx = b.rx_bufs();
    let send = |n: u8| {
        for i in 0..n {
            let mut p = vec![i; 40];
            send1(&a, a.ip, b.ip, &mut p).unwrap();
        }
    };
    send(1);
    assert!(b.wait_readable(Duration::from_secs(2)));
    rx.found = BATCH_AFTER;
    assert_eq!(b.recv_batch(&mut rx), 1);
    assert_eq!(rx.backoff, BATCH_BACKOFF);
    send(5);
    let mut counts = Vec::new();
    while counts.iter().sum::<usize>() < 5 {
        assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
        counts.push(b.recv_batch(&mut rx));
    }
    assert_eq!(counts, [1, 1, 1, 1, 1]);
    assert_eq!(rx.backoff, BATCH_BACKOFF - 5);
    // Once the backoff has run out, the streak (still going) batches again.
    rx.backoff = 0;
    send(5);
    let mut counts = Vec::new();
    while counts.iter().sum::<usize>() < 5 {
        assert!(b.wait_readable(Duration::from_secs(2)), "nothing arrived");
        counts.push(b.recv_batch(&mut rx));
    }
    assert_eq!(counts, [5]);
}

/// Two single packets in one `send` (one `sendmmsg`) deliver two datagrams in order, each with its own ICRC, from the
/// peer's connected socket.
#[test]
fn send_two_sends_both_in_order() {
    let (a, b) = pair();
    let mut first = vec![1u8; 40];
    let mut second = vec![2u8; 28];
    let route = Route {
        src: a.ip,
        dst: b.ip,
        tos: 0,
    };
    a.send(&mut [
        Transmit::one(route, &mut first),
        Transmit::one(route, &mut second),
    ])
    .unwrap();
    let (got, _) = receive(&b, true, 2, sent_from(&a, b.ip));
    let lens: Vec<usize> = got.iter().map(|g| g.0).collect();
    assert_eq!(lens, [40, 28]);
    assert!(got.iter().all(|g| g.1), "ICRC");
    assert_eq!(got[0].2[..36], [1u8; 36]);
    assert_eq!(got[1].2[..24], [2u8; 24]);
}

/// Sends to a peer leave from one connected socket of their own (an ephemeral
/// port, which the ICRC covers); with a hook they leave from the bound socket.
#[test]
fn sends_to_a_peer_leave_from_its_connected_socket() {
    let (a, b) = pair();
    for n in 0..3u8 {
        let mut p = vec![n; 40];
        send1(&a, a.ip, b.ip, &mut p).unwrap();
    }
    let port = sent_from(&a, b.ip);
    assert_ne!(port, a.port());
    let (got, _) = receive(&b, true, 3, port);
    assert!(got.iter().all(|g| g.1), "ICRC");
    assert_eq!(a.peers.lock().len(), 1);

    #[derive(Debug)]
    struct Pass;
    impl PacketHook for Pass {
        fn on_send(&self, _: Ipv4Addr, _: &[u8]) -> Verdict {
            Verdict::Pass
        }
        fn on_receive(&self, _: SocketAddrV4, _: Option<u16>, _: &[u8]) -> Verdict {
            Verdict::Pass
        }
    }
    let opts = LinkOptions {
        hook: Some(Arc::new(Pass)),
        ..LinkOptions::default()
    };
    let h = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 1).into(), 0, &opts, None).unwrap();
    let c = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 2).into(), h.port(), &opts, None).unwrap();
    let mut p = vec![1u8; 40];
    send1(&h, h.ip, c.ip, &mut p).unwrap();
    let (got, _) = receive(&c, true, 1, h.port());
    assert!(got[0].1, "ICRC");
    assert!(h.peers.lock().is_empty());
}

/// A peer whose port closed: the connected socket reports the ICMP error on a
/// later send, which the link sends again; once the peer is back, datagrams arrive.
#[test]
fn a_closed_peer_port_loses_only_datagrams() {
    let opts = LinkOptions::default();
    let a = UdpLink::bind(Ipv4Addr::new(127, 0, 0, 1).into(), 0, &opts, None).unwrap();
    let gone = Ipv4Addr::new(127, 0, 0, 3);
    for _ in 0..3 {
        let mut p = vec![5u8; 40];
        send1(&a, a.ip, gone, &mut p).unwrap();
        // Let the port unreachable come back before the next send.
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = UdpLink::bind(gone.into(), a.port(), &opts, None).unwrap();
    let mut p = vec![6u8; 40];
    send1(&a, a.ip, gone, &mut p).unwrap();
    let mut rx = c.rx_bufs();
    assert!(c.wait_readable(Duration::from_secs(2)), "nothing arrived");
    rx.found = 0;
    assert_eq!(c.recv_batch(&mut rx), 1);
    let d = rx.got[0];
    assert_eq!(d.from.port(), sent_from(&a, gone));
    assert!(c.icrc_ip_id(&d, rx.bytes(&d), 0).is_some());
}

/// At most `MAX_PEER_SOCKETS` peers get a socket of their own; the rest are sent
/// to from the bound socket.
/// The receive guesses the ID after the last one from the same sender (a connected
/// socket, a GSO run), 0 after a 0 (an unconnected socket) or from another sender.
#[test]
fn the_next_ip_id_is_guessed_from_the_last() {
    let (a, _) = pair();
    let mut rx = a.rx_bufs();
    let (x, y) = (
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 9), 1000)),
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 9), 1001)),
    );
    assert_eq!(rx.guess_ip_id(x), 0);
    rx.saw_ip_id(x, 41);
    assert_eq!((rx.guess_ip_id(x), rx.guess_ip_id(y)), (42, 0));
    rx.saw_ip_id(x, 0xFFFF);
    assert_eq!(rx.guess_ip_id(x), 0);
    rx.saw_ip_id(y, 0);
    assert_eq!((rx.guess_ip_id(y), rx.guess_ip_id(x)), (0, 0));
}

/// A packet a hook delays still leaves after its link closed, and the link's
/// address can be bound again at once (the delayed send does not hold it).
#[test]
fn a_delayed_packet_does_not_keep_the_address() {
    #[derive(Debug)]
    struct Later;
    impl PacketHook for Later {
        fn on_send(&self, _: Ipv4Addr, _: &[u8]) -> Verdict {
            Verdict::Delay(Duration::from_millis(300))
        }
        fn on_receive(&self, _: SocketAddrV4, _: Option<u16>, _: &[u8]) -> Verdict {
            Verdict::Pass
        }
    }
    let opts = LinkOptions {
        hook: Some(Arc::new(Later)),
        ..LinkOptions::default()
    };
    let ip = Ipv4Addr::new(127, 0, 0, 71);
    let peer = UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 72), 0)).unwrap();
    let a = UdpLink::bind(ip.into(), peer.local_addr().unwrap().port(), &opts, None).unwrap();
    let port = a.port();
    let mut p = vec![0u8; 64];
    let n = emu_wire::PacketRepr::new(emu_wire::Opcode::UdSendOnly, 1, emu_wire::Psn::new(0))
        .emit(&mut p, b"late");
    p.truncate(n);
    send1(&a, ip, Ipv4Addr::new(127, 0, 0, 72), &mut p).unwrap();
    drop(a);
    let again = UdpLink::bind(ip.into(), port, &opts, None);
    assert!(again.is_ok(), "{:?}", again.err());
    let mut buf = [0u8; 128];
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (n, from) = peer.recv_from(&mut buf).unwrap();
    let SocketAddr::V4(from) = from else { panic!() };
    let ep = Ipv4Endpoints {
        src: ip,
        dst: Ipv4Addr::new(127, 0, 0, 72),
        ip_id: 0,
        src_port: from.port(),
        dst_port: peer.local_addr().unwrap().port(),
    };
    assert!(check_icrc(&ep, &buf[..n]), "the delayed packet's ICRC");
}

#[test]
fn peer_sockets_are_capped() {
    let a = UdpLink::bind(
        Ipv4Addr::new(127, 0, 0, 1).into(),
        0,
        &LinkOptions::default(),
        None,
    )
    .unwrap();
    let n = MAX_PEER_SOCKETS as u8 + 4;
    for i in 1..=n {
        let mut p = vec![i; 40];
        send1(&a, a.ip, Ipv4Addr::new(127, 0, 1, i), &mut p).unwrap();
    }
    assert_eq!(a.peers.lock().len(), MAX_PEER_SOCKETS);
    assert_ne!(sent_from(&a, Ipv4Addr::new(127, 0, 1, 1)), a.port());
    assert_eq!(sent_from(&a, Ipv4Addr::new(127, 0, 1, n)), a.port());
}

// `UDP_NO_CHECK6_TX` (udp(7)): the sender's side of the option under test, to send
// what kernel rxe sends over IPv6.
use nix::{setsockopt_impl, sockopt_impl};
sockopt_impl!(
    /// Send UDP/IPv6 datagrams with checksum 0.
    UdpNoCheck6Tx,
    SetOnly,
    libc::SOL_UDP,
    libc::UDP_NO_CHECK6_TX,
    bool
);

/// A UDP/IPv6 datagram with checksum 0, as kernel rxe sends its RoCEv2 packets over
/// IPv6, reaches an IPv6 link (RFC 8200 would have the kernel drop it), and so does
/// one with a checksum. Without `accept_zero_checksum` the first never arrives.
#[test]
fn an_ipv6_datagram_with_checksum_zero_arrives() {
    use std::net::{Ipv6Addr, UdpSocket};
    let link = UdpLink::bind(Ipv6Addr::LOCALHOST.into(), 0, &LinkOptions::default(), None)
        .expect("an IPv6 link on ::1");
    let to = SocketAddr::from((Ipv6Addr::LOCALHOST, link.port()));
    for zero in [true, false] {
        let tx = UdpSocket::bind((Ipv6Addr::LOCALHOST, 0)).unwrap();
        nix::sys::socket::setsockopt(&tx, UdpNoCheck6Tx, &zero).unwrap();
        let payload = [u8::from(zero); 48];
        tx.send_to(&payload, to).unwrap();
        assert!(
            link.wait_readable(Duration::from_secs(2)),
            "checksum zero {zero}: nothing arrived"
        );
        let mut rx = link.rx_bufs();
        rx.found = 0;
        assert_eq!(link.recv_batch(&mut rx), 1, "checksum zero {zero}");
        assert_eq!(rx.bytes(&rx.got[0]), payload, "checksum zero {zero}");
    }
}
