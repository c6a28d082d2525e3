//! tshark decodes the pcap of every scenario: one InfiniBand frame per packet of the
//! trace and no malformed frame or warning (the clean-decode filter of emu-wire's
//! tshark test). Skipped (saying so) only when tshark is absent and REQUIRE_TSHARK is
//! unset, as `.ci/run` sets it.

use std::process::Command;

use emu_sims::scenario;

/// tshark's InfiniBand payload heuristics misread arbitrary payloads; off.
const NO_HEURISTICS: &[&str] = &[
    "rpcrdma_infiniband",
    "smb_direct_infiniband",
    "smcr_infiniband",
    "iser_infiniband",
    "lnet_ib",
    "sdp_infiniband",
    "fc_infiniband",
    "mellanox_eoib",
    "nvme_rdma",
    "eth_over_ib",
    "drbd_rdma",
];

const DIRTY: &str = r#"udp.dstport==4791 && (!infiniband.bth || _ws.malformed || _ws.expert.severity >= "Warning" || infiniband.vendor || infiniband.bth.tver != 0)"#;

fn tshark(args: &[&str]) -> String {
    let mut cmd = Command::new("tshark");
    for h in NO_HEURISTICS {
        cmd.args(["--disable-heuristic", h]);
    }
    let out = cmd.args(args).output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn tshark_decodes_every_scenario_cleanly() {
    if Command::new("tshark").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("REQUIRE_TSHARK").is_none(),
            "REQUIRE_TSHARK is set but tshark is not installed"
        );
        println!("skipping: tshark not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sims-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for s in scenario::all() {
        let out = scenario::run(s, 1);
        out.result.unwrap_or_else(|e| panic!("{}: {e}", s.name));
        let path = dir.join(format!("{}.pcap", s.name));
        let file = std::fs::File::create(&path).unwrap();
        emu_sims::pcap::write(&out.trace, file).unwrap();
        let p = path.to_str().unwrap();
        let fields = tshark(&["-r", p, "-T", "fields", "-e", "infiniband.bth.psn"]);
        let psns: Vec<String> = out
            .trace
            .packets
            .iter()
            .map(|r| r.repr.unwrap().bth.psn.value().to_string())
            .collect();
        assert_eq!(fields.lines().collect::<Vec<_>>(), psns, "{}", s.name);
        let dirty = tshark(&["-r", p, "-Y", DIRTY]);
        assert!(
            dirty.trim().is_empty(),
            "{}: frames that do not decode cleanly:\n{dirty}",
            s.name
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
