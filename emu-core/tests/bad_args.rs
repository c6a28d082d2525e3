//! Every example refuses bad arguments, impossible sizes and a missing peer with one
//! line on stderr and a non-zero exit: no panic, no abort, no silent run with
//! defaults (issue 26, point 5). `cargo test` builds the examples next to the test
//! binaries; sizes above the memory available are refused before anything is
//! allocated.

mod cli_util;

use std::net::{Ipv4Addr, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cli_util::{assert_one_line_error, free_tcp_port, free_udp_port, run, start};

fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap();
    let path = deps
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} was not built (cargo test builds examples)",
        path.display()
    );
    path
}

/// More than any machine has: refused before anything is allocated.
const TIB: &str = "1099511627776";
/// Above the port's max_msg_sz (2^31) and what a u32 length holds.
const TOO_LONG: &str = "4294967297";

/// An example, its arguments and its environment.
type Case<'a> = (&'a str, Vec<String>, Vec<(&'a str, String)>);

/// Runs each case and checks it fails with one line.
fn table(cases: &[Case<'_>]) {
    for (name, args, env) in cases {
        let mut cmd = Command::new(example(name));
        cmd.args(args).env_remove("EMU_PORT");
        for (k, v) in env {
            cmd.env(k, v);
        }
        assert_one_line_error(&run(cmd, Duration::from_secs(60)));
    }
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// A port of its own for a case that opens a device before it fails.
fn udp() -> String {
    free_udp_port(Ipv4Addr::LOCALHOST).to_string()
}

#[test]
fn the_pingpongs_refuse_bad_arguments() {
    let mut cases = Vec::new();
    for name in ["rc_pingpong", "uc_pingpong", "ud_pingpong", "srq_pingpong"] {
        for a in [
            &["-s", TIB, "--loopback", "-n", "1"][..],
            &["-s", "0", "--loopback"],
            &["-n", "0", "--loopback"],
            &["--timeout", "0", "--loopback"],
            &["--udp-port", "0", "--loopback"],
            &["-s", "abc"],
            &["-s"],
            &["--bogus"],
            &["--ip", "8.8.8.8", "--loopback"],
            &["--loopback", "127.0.0.1"],
            &["--loopback", "-p", "5000"],
            &["-p", "0", "127.0.0.1"],
            &["127.0.0.1", "127.0.0.2"],
        ] {
            cases.push((name, args(a), vec![]));
        }
        // Refused once the device is open: its limits.
        cases.push((
            name,
            args(&["-s", TOO_LONG, "--loopback", "--udp-port", &udp()]),
            vec![],
        ));
        // An address this host does not have: the device cannot open.
        cases.push((
            name,
            args(&["--ip", "192.0.2.1", "--udp-port", &udp()]),
            vec![],
        ));
    }
    cases.push(("rc_pingpong", args(&["-q", "4"]), vec![]));
    cases.push((
        "ud_pingpong",
        args(&["-s", "5000", "--loopback", "--udp-port", &udp()]),
        vec![],
    ));
    cases.push(("srq_pingpong", args(&["-q", "0", "--loopback"]), vec![]));
    cases.push((
        "srq_pingpong",
        args(&["-q", "4294967295", "--loopback", "--udp-port", &udp()]),
        vec![],
    ));
    table(&cases);
}

#[test]
fn the_other_examples_refuse_bad_arguments() {
    let cases = vec![
        ("write_verify", args(&["--bytes", "0"]), vec![]),
        ("write_verify", args(&["--bytes", TIB]), vec![]),
        ("write_verify", args(&["--bytes"]), vec![]),
        ("write_verify", args(&["--bogus"]), vec![]),
        ("write_verify", args(&["-p", "0"]), vec![]),
        ("write_verify", args(&["127.0.0.1", "127.0.0.2"]), vec![]),
        ("perftest_peer", args(&[]), vec![]),
        ("perftest_peer", args(&["send"]), vec![]),
        ("perftest_peer", args(&["write", "-s", "0"]), vec![]),
        ("perftest_peer", args(&["write", "-n", "0"]), vec![]),
        ("perftest_peer", args(&["write", "-t", "0"]), vec![]),
        ("perftest_peer", args(&["atomic", "-s", "16"]), vec![]),
        (
            "perftest_peer",
            args(&["write", "127.0.0.1", "127.0.0.2"]),
            vec![],
        ),
        ("perftest_peer", args(&["write", "--bogus"]), vec![]),
        (
            "perftest_peer",
            args(&["write", "-s", TOO_LONG, "--udp-port", &udp()]),
            vec![],
        ),
        (
            "perftest_peer",
            args(&["write", "-s", TIB, "--udp-port", &udp()]),
            vec![],
        ),
        (
            "perftest_peer",
            args(&["write", "-t", "100000000", "--udp-port", &udp()]),
            vec![],
        ),
        ("cm_file_transfer", args(&[]), vec![]),
        ("cm_file_transfer", args(&["receive", "extra"]), vec![]),
        (
            "cm_file_transfer",
            args(&["--port", "abc", "receive"]),
            vec![],
        ),
        (
            "cm_file_transfer",
            args(&["--bogus", "1", "receive"]),
            vec![],
        ),
        ("cm_file_transfer", args(&["send", "1.2.3", "f"]), vec![]),
        (
            "cm_file_transfer",
            args(&["receive"]),
            vec![("EMU_PORT", "x".into())],
        ),
        (
            "cm_file_transfer",
            args(&["send", "127.0.0.1", "/nonexistent/file"]),
            vec![],
        ),
        (
            "cm_file_transfer",
            args(&["--ip", "192.0.2.1", "--udp-port", &udp(), "receive"]),
            vec![],
        ),
        ("demo", args(&["--bogus"]), vec![]),
        ("demo", args(&[]), vec![("EMU_PORT", "abc".into())]),
        ("demo", args(&[]), vec![("EMU_PORT", "0".into())]),
        ("hello_rdma", args(&["x"]), vec![]),
        ("hello_rdma", args(&[]), vec![("EMU_PORT", "70000".into())]),
        ("engine_demo", args(&["x"]), vec![]),
    ];
    table(&cases);
}

/// A device whose port is taken cannot open: one line, not a panic.
#[test]
fn a_taken_port_is_one_line() {
    let held = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    table(&[
        ("demo", vec![], vec![("EMU_PORT", port.clone())]),
        ("hello_rdma", vec![], vec![("EMU_PORT", port.clone())]),
        (
            "rc_pingpong",
            args(&["--loopback", "--udp-port", &port]),
            vec![],
        ),
        ("write_verify", args(&["--udp-port", &port]), vec![]),
        (
            "perftest_peer",
            args(&["write", "--udp-port", &port]),
            vec![],
        ),
    ]);
}

/// One end of a two-process run of `name`, on its own ports.
fn end(name: &str, extra: &[&str], tcp: u16, udp: u16) -> Command {
    let mut cmd = Command::new(example(name));
    cmd.args(extra)
        .args(["-p", &tcp.to_string(), "--udp-port", &udp.to_string()]);
    cmd
}

/// rc_pingpong's client, whose server is killed mid-run, and the server, whose
/// client is: each ends with one line and a non-zero exit, not a hang or a panic.
#[test]
fn a_pingpong_whose_peer_dies_ends_with_one_line() {
    for kill_server in [true, false] {
        let (tcp, udp) = (free_tcp_port(), free_udp_port(Ipv4Addr::LOCALHOST));
        let long = ["-n", "1000000000", "--timeout", "3"];
        let mut server = start(end("rc_pingpong", &long, tcp, udp));
        let mut client_cmd = end("rc_pingpong", &long, tcp, udp);
        client_cmd.arg("127.0.0.1");
        let mut client = start(client_cmd);
        // Both print the remote address once connected, then ping-pong.
        client.wait_for_stdout("remote address", Duration::from_secs(30));
        server.wait_for_stdout("remote address", Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(500));
        let (mut victim, survivor) = if kill_server {
            (server, client)
        } else {
            (client, server)
        };
        victim.child.kill().unwrap();
        victim.child.wait().unwrap();
        // The client's RC retries (timeout 18, 7 retries) give up within ~9 s; the
        // server waits --timeout for the next message.
        assert_one_line_error(&survivor.wait(Duration::from_secs(60)));
    }
}
