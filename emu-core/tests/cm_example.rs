//! The `cm_file_transfer` example (the seed tutorial's Lab 3) as two processes: a
//! receiver on 127.0.5.1 and a sender on 127.0.5.2 move a 2.5 MiB file of random bytes
//! and agree on its hash.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use rand::{RngCore, SeedableRng};

fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let path = deps.parent().unwrap().join("examples").join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

#[test]
fn lab3_file_transfer_between_two_processes() {
    let udp = (43000 + std::process::id() % 10000).to_string();
    let file = std::env::temp_dir().join(format!("cm-lab3-{}.bin", std::process::id()));
    let mut data = vec![0u8; 5 << 19];
    rand_chacha::ChaCha8Rng::seed_from_u64(3).fill_bytes(&mut data);
    std::fs::write(&file, &data).unwrap();

    let exe = example("cm_file_transfer");
    let mut rx = Command::new(&exe)
        .args(["receive", "--ip", "127.0.5.1", "--udp-port", &udp])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(rx.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("listening on 127.0.5.1"), "{first}");

    let tx = Command::new(&exe)
        .args(["send", "127.0.5.1", file.to_str().unwrap()])
        .args(["--ip", "127.0.5.2", "--udp-port", &udp])
        .output()
        .unwrap();
    let tx_out = String::from_utf8_lossy(&tx.stdout).into_owned();
    let rx_status = rx.wait().unwrap();
    let rx_out: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let _ = std::fs::remove_file(&file);
    assert!(
        tx.status.success(),
        "sender: {tx_out} {}",
        String::from_utf8_lossy(&tx.stderr)
    );
    assert!(rx_status.success(), "receiver: {rx_out:?}");
    assert!(tx_out.contains("sent 2621440 bytes"), "{tx_out}");
    assert!(tx_out.contains("the receiver says good"), "{tx_out}");
    assert!(
        rx_out
            .iter()
            .any(|l| l.starts_with("received 2621440 bytes") && l.ends_with("good")),
        "{rx_out:?}"
    );
}
