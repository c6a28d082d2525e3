//! `rdma-emu` refuses bad arguments, impossible sizes and a peer that dies with one line
//! on stderr and a non-zero exit: no panic, no abort, no option silently ignored and
//! no count of zero that runs nothing (issue 26, point 5).

#[path = "../../emu-core/tests/cli_util/mod.rs"]
mod cli_util;

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use cli_util::{assert_one_line_error, free_tcp_port, free_udp_port, run, start};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-emu");

fn rdma_emu(args: &[String]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("RDMA_EMU_DEVICES")
        .env_remove("RDMA_EMU_CONFIG")
        .env_remove("RDMA_EMU_IP")
        .env_remove("RDMA_EMU_LIB");
    cmd
}

/// Each case fails with one line, and before printing anything: no banner, no half a
/// table, ahead of the error.
fn table(cases: &[Vec<String>]) {
    for args in cases {
        let ended = run(rdma_emu(args), Duration::from_secs(60));
        assert_one_line_error(&ended);
        assert!(
            ended.stdout.is_empty(),
            "{}: printed before failing:\n{}",
            ended.what,
            ended.stdout
        );
    }
}

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(String::from).collect()
}

/// A UDP port of its own for a case that opens devices before it fails.
fn udp() -> u16 {
    free_udp_port(Ipv4Addr::LOCALHOST)
}

#[test]
fn usage_errors_are_one_line() {
    table(&[
        args(""),
        args("bogus"),
        args("--bogus"),
        args("devinfo --ip 300.1.1.1"),
        args("devinfo --bogus"),
        args("pingpong"),
        args("pingpong xx"),
        args("bench"),
        args("bench foo"),
        args("bench write_bw --size abc"),
        args("exec"),
        args("exec --name foo -- true"),
        args("exec --netns-addr 10.0.0.1 -- true"),
        args("scenario"),
        args("scenario run"),
        args("scenario run no_such_scenario"),
        args("completions"),
        args("completions tcsh"),
        args("completions bash extra"),
    ]);
}

#[test]
fn pingpong_refuses_bad_arguments() {
    let mut cases = Vec::new();
    for t in ["rc", "uc", "ud", "srq"] {
        for a in [
            "-s 1099511627776 --loopback -n 1",
            "-s 0 --loopback",
            "-n 0 --loopback",
            "--timeout 0 --loopback",
            "--udp-port 0 --loopback",
            "-s abc",
            "-s",
            "--bogus",
            "--ip 8.8.8.8 --loopback",
            "--loopback 127.0.0.1",
            "--loopback -p 5000",
            "127.0.0.1 127.0.0.2",
        ] {
            cases.push(args(&format!("pingpong {t} {a}")));
        }
        cases.push(args(&format!(
            "pingpong {t} -s 4294967297 --loopback --udp-port {}",
            udp()
        )));
        cases.push(args(&format!(
            "pingpong {t} --ip 192.0.2.1 --udp-port {}",
            udp()
        )));
    }
    cases.push(args("pingpong rc -q 4"));
    cases.push(args(&format!(
        "pingpong ud -s 5000 --loopback --udp-port {}",
        udp()
    )));
    cases.push(args("pingpong srq -q 0 --loopback"));
    table(&cases);
}

#[test]
fn bench_refuses_bad_arguments() {
    table(&[
        args("bench write_bw --iters 0"),
        args("bench write_bw -n 0"),
        args("bench send_lat -n 0"),
        args("bench read_lat --size 0"),
        args("bench atomic_bw --size 0"),
        args("bench write_bw -m 3000"),
        args("bench write_bw --qps 200000"),
        args("bench write_bw --tx-depth 16384"),
        args("bench write_bw --qps 2 --tx-depth 32769"),
        args("bench flood -n 0"),
        args("bench flood --size 0"),
        args("bench flood --size 65508"),
        args("bench flood -m 3000"),
        args("bench flood --rounds 0"),
        args("bench flood --tx-depth 0"),
        args("bench flood --tx-depth 8193"),
        args("bench flood --qps 2"),
        args("bench flood --fabric"),
        args("bench flood --events"),
        args("bench flood --no-baseline"),
        args("bench flood --json"),
        args("bench flood --link shm"),
        args("bench write_bw --fabric --link shm"),
        args("bench write_bw --link tcp"),
        args("bench write_bw --size 0"),
        args("bench write_bw --size 4294967296"),
        args("bench write_bw --qps 0"),
        args("bench write_bw --tx-depth 0"),
        args("bench write_bw --rounds 0"),
        args("bench write_bw --mtu 1000"),
        args("bench write_bw --fabric --port 5000"),
        args("bench atomic_bw --size 16"),
        args("bench send_lat --tx-depth 4"),
        args("bench send_lat --qps 2"),
        args("bench send_lat --fabric"),
        args("bench write_lat --events"),
        args("bench read_lat --wait-send"),
        args("bench write_bw --wait-send"),
        args("bench flood --wait-send"),
        args("bench send_lat --busy-poll --events"),
        args(&format!(
            "bench write_bw --tx-depth 4000000000 -n 1 --no-baseline --port {}",
            udp()
        )),
        args("devinfo --ip 192.0.2.1"),
    ]);
}

/// `rdma-emu pingpong rc`, once with its server killed mid-run and once with its
/// client killed: the other end ends with one line and a non-zero exit.
#[test]
fn pingpong_whose_peer_dies_ends_with_one_line() {
    for kill_server in [true, false] {
        let (tcp, udp) = (free_tcp_port(), udp());
        let end = |host: Option<&str>| {
            let mut a = args(&format!(
                "pingpong rc -n 1000000000 --timeout 3 -p {tcp} --udp-port {udp}"
            ));
            a.extend(host.map(String::from));
            start(rdma_emu(&a))
        };
        let mut server = end(None);
        let mut client = end(Some("127.0.0.1"));
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
        assert_one_line_error(&survivor.wait(Duration::from_secs(60)));
    }
}

/// A reader that closes the pipe before the tool writes (`rdma-emu ... | head`) ends it
/// quietly with the status a SIGPIPE would give (141), not a panic's backtrace.
#[test]
fn a_closed_stdout_ends_the_tool_quietly() {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-emu"))
        .args(["scenario", "list"])
        .stdout(writer)
        .output()
        .expect("run rdma-emu");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "stderr: {err}");
    assert!(!err.contains("panicked"), "stderr: {err}");
}
