//! Stock tshark, with its default settings, decodes the pcap of every scenario cleanly:
//! one InfiniBand frame over UDP 4791 per packet of the trace, no payload claimed by
//! one of the heuristic sub-dissectors tshark runs on InfiniBand payloads (RPC-over-RDMA,
//! SMB Direct, iSER, NVMe-oF, ...: a student who opens the file runs them all), and no
//! malformed frame or expert warning. tshark reads an empty configuration folder, so a
//! profile on this machine cannot turn heuristics off. Skipped (saying so) only when
//! tshark is absent and REQUIRE_TSHARK is unset, as `.ci/run` sets it.

use std::path::Path;
use std::process::Command;

use emu_sims::scenario;

/// What a clean frame is: Ethernet, IPv4, UDP, InfiniBand, and the payload (if any) as
/// plain data, which no heuristic claimed.
const CLEAN: &[&str] = &[
    "eth:ethertype:ip:udp:infiniband",
    "eth:ethertype:ip:udp:infiniband:data",
];

const DIRTY: &str = r#"!(udp.dstport == 4791) || !infiniband.bth || _ws.malformed || _ws.expert.severity >= "Warning" || infiniband.vendor || infiniband.bth.tver != 0"#;

/// tshark with its default settings: `config` is an empty folder.
fn tshark(config: &Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .env("WIRESHARK_CONFIG_DIR", config)
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn stock_tshark_decodes_every_scenario_cleanly() {
    if Command::new("tshark").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("REQUIRE_TSHARK").is_none(),
            "REQUIRE_TSHARK is set but tshark is not installed"
        );
        println!("skipping: tshark not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("sims-tshark-{}", std::process::id()));
    let config = dir.join("config");
    std::fs::create_dir_all(&config).unwrap();
    for s in scenario::all() {
        let out = scenario::run(s, 1);
        out.result.unwrap_or_else(|e| panic!("{}: {e}", s.name));
        let path = dir.join(format!("{}.pcap", s.name));
        let file = std::fs::File::create(&path).unwrap();
        emu_sims::pcap::write(&out.trace, file).unwrap();
        let p = path.to_str().unwrap();

        let fields = tshark(
            &config,
            &["-r", p, "-T", "fields", "-e", "infiniband.bth.psn"],
        );
        let psns: Vec<String> = out
            .trace
            .packets
            .iter()
            .map(|r| r.repr.unwrap().bth.psn.value().to_string())
            .collect();
        assert_eq!(fields.lines().collect::<Vec<_>>(), psns, "{}", s.name);

        let protocols = tshark(&config, &["-r", p, "-T", "fields", "-e", "frame.protocols"]);
        for (i, line) in protocols.lines().enumerate() {
            assert!(
                CLEAN.contains(&line),
                "{}: frame {} decodes as {line}, not InfiniBand and data",
                s.name,
                i + 1
            );
        }

        let dirty = tshark(&config, &["-r", p, "-Y", DIRTY]);
        assert!(
            dirty.trim().is_empty(),
            "{}: frames that do not decode cleanly:\n{dirty}",
            s.name
        );

        let verbose = tshark(&config, &["-r", p, "-V"]);
        assert!(
            !verbose.contains("Malformed"),
            "{}: tshark -V says Malformed:\n{verbose}",
            s.name
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
