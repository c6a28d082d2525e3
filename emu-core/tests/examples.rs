//! Every example runs in the test suite: the ping-pongs with `--loopback` (both ends in
//! one process, real UDP), the demos as they are. `cargo test` builds the examples next
//! to the test binaries; this test runs them and requires a clean exit and their output.

use std::path::PathBuf;
use std::process::Command;

fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let path = deps.parent().unwrap().join("examples").join(name);
    assert!(
        path.exists(),
        "{} was not built (cargo test builds examples)",
        path.display()
    );
    path
}

fn run(name: &str, args: &[&str], port: u16) -> String {
    let out = Command::new(example(name))
        .args(args)
        .env("EMU_PORT", port.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The tests of this file run one at a time: UC has no retransmission, so a burst from
/// a concurrently running example could overflow a loopback socket buffer and lose a UC
/// message (which, as on real hardware, stalls the ping-pong).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn port(k: u16) -> u16 {
    8000 + (std::process::id() % 1500) as u16 * 16 + k
}

/// The ping-pongs with `--loopback`, the demos, hello_rdma.
#[test]
fn every_example_runs() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let pingpongs = [
        ("rc_pingpong", &["-s", "5000"][..]),
        ("uc_pingpong", &["-s", "5000"]),
        // UD: one packet per message, within the MTU.
        ("ud_pingpong", &["-s", "1000"]),
        ("srq_pingpong", &["-s", "5000", "-q", "4"]),
    ];
    for (k, (name, extra)) in pingpongs.iter().enumerate() {
        let p = port(4 + k as u16).to_string();
        let mut args = vec!["--loopback", "-n", "200", "--udp-port", &p];
        args.extend_from_slice(extra);
        let out = run(name, &args, 0);
        assert_eq!(out.matches("200 iters in").count(), 2, "{name}: {out}");
    }
    let out = run("demo", &[], port(2));
    assert!(
        out.contains("the bytes read back are the bytes written: true"),
        "{out}"
    );
    assert!(
        out.contains("counter: 99 (originals returned: 0 and 5)"),
        "{out}"
    );
    assert!(out.contains("\"remote access error\""), "{out}");
    let out = run("hello_rdma", &[], port(3));
    assert!(
        out.contains("FETCH_ADD: old value 41, counter now 42"),
        "{out}"
    );
    let out = run("engine_demo", &[], 0);
    assert!(out.contains("RC_RDMA_READ_RESPONSE_LAST"), "{out}");
}

/// Runs `name` as a server and a client in two processes (`args` for both, plus
/// `127.0.0.1` for the client) and returns (client stdout, server stdout) once both
/// exited successfully.
fn two_processes(name: &'static str, args: Vec<String>) -> (String, String) {
    let server_args = args.clone();
    // The server runs in its own thread while this one starts the client.
    let server = std::thread::spawn(move || {
        Command::new(example(name))
            .args(server_args)
            .output()
            .unwrap()
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    let client = Command::new(example(name))
        .args(&args)
        .arg("127.0.0.1")
        .output()
        .unwrap();
    let server = server.join().unwrap();
    let (c, s) = (
        String::from_utf8_lossy(&client.stdout).into_owned(),
        String::from_utf8_lossy(&server.stdout).into_owned(),
    );
    assert!(
        client.status.success() && server.status.success(),
        "{name} client: {c}{}\nserver: {s}{}",
        String::from_utf8_lossy(&client.stderr),
        String::from_utf8_lossy(&server.stderr)
    );
    (c, s)
}

/// Two processes exchange data by RC WRITE over UDP loopback, byte-exact (64 MiB here;
/// `.ci/run` also moves 1 GiB in a release build).
#[test]
fn two_processes_write_64_mib_byte_exact() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (tcp, udp) = (port(10).to_string(), port(11).to_string());
    let args = ["--bytes", "67108864", "-p", &tcp, "--udp-port", &udp].map(String::from);
    let (c, s) = two_processes("write_verify", args.to_vec());
    assert!(s.contains("received and verified 67108864 bytes"), "{s}");
    assert!(c.contains("server verified every byte"), "{c}");
}

/// The ping-pong examples as rdma-core's are used: a server process and a client
/// process that find each other over TCP, with no flags beyond the ports.
#[test]
fn two_processes_ping_pong() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (k, name) in [
        (12, "rc_pingpong"),
        (14, "uc_pingpong"),
        (8, "ud_pingpong"),
        (0, "srq_pingpong"),
    ] {
        let (tcp, udp) = (port(k).to_string(), port(k + 1).to_string());
        let mut args = ["-n", "200", "-p", &tcp, "--udp-port", &udp]
            .map(String::from)
            .to_vec();
        if name == "srq_pingpong" {
            args.extend(["-q", "4"].map(String::from));
        }
        let (c, s) = two_processes(name, args);
        assert!(c.contains("200 iters in"), "{c}");
        assert!(s.contains("200 iters in"), "{s}");
    }
}
