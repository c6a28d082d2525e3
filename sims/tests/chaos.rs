//! The chaos soak (`emu_sims::chaos`), short: over UDP with faults, junk and a restart, then
//! its replay on the fabric from the command line the UDP run prints; the fabric run is
//! deterministic; a failure is reported with the seed and the replay command.

use clap::Parser;
use emu_sims::chaos::junk::LUCKY;
use emu_sims::chaos::{run, SoakArgs, SoakReport};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    soak: SoakArgs,
}

/// The options of the replay command a report prints (the words after `--`).
fn replay_args(r: &SoakReport) -> SoakArgs {
    let cmd = r.replay_command();
    let words = cmd.split(" -- ").nth(1).expect("a `--` in the command");
    let argv = std::iter::once("chaos_soak").chain(words.split_whitespace());
    Cli::try_parse_from(argv)
        .expect("the replay command parses")
        .soak
}

#[test]
fn udp_soak_passes_and_replays_on_the_fabric() {
    let r = run(&SoakArgs {
        seed: Some(26),
        secs: 8.0,
        pairs: 4,
        junk: 800,
        net: 61,
        ..SoakArgs::default()
    });
    println!("{r}");
    assert!(r.passed(), "{r}");
    let s = &r.stats;
    assert!(s.batches > 50 && s.bytes > 1 << 20, "{r}");
    // Two of the four pairs have their passive side on the device that restarted.
    assert!(r.restarted_after.is_some(), "{r}");
    assert_eq!(s.restart_failures, 2, "{r}");
    assert!(s.dg_delivered > 100, "{r}");
    let [seen, dropped, duplicated, delayed] = r.faults;
    assert!(
        seen > 1000 && dropped > 0 && duplicated > 0 && delayed > 0,
        "{r}"
    );
    assert_eq!(r.junk.len(), 3);
    for j in &r.junk {
        assert!(
            j.sent[..LUCKY].iter().all(|&n| n > 0),
            "every kind sent: {r}"
        );
    }

    let replay = replay_args(&r);
    assert!(replay.fabric);
    assert_eq!(replay.seed, Some(26));
    assert_eq!(replay.pairs, 4);
    assert_eq!(replay.ops, r.stats.batches);
    assert_eq!(replay.restart_at, r.restarted_after);
    let f = run(&replay);
    println!("{f}");
    assert!(f.passed(), "{f}");
    assert!(f.stats.batches >= replay.ops, "{f}");
    assert_eq!(f.stats.restart_failures, 2, "{f}");
}

#[test]
fn the_fabric_run_is_deterministic() {
    let args = SoakArgs {
        seed: Some(4242),
        fabric: true,
        ops: 600,
        loss: 0.03,
        ..SoakArgs::default()
    };
    let (a, b) = (run(&args), run(&args));
    assert!(a.passed(), "{a}");
    assert_eq!(a.stats, b.stats);
    assert_eq!(a.faults, b.faults);
    assert_eq!(a.elapsed, b.elapsed);
    // The restart comes at the first pass over the flows after 300 batches.
    assert!(
        a.restarted_after.is_some_and(|n| (300..310).contains(&n)),
        "{a}"
    );
    assert_eq!(a.stats.restart_failures, 2, "{a}");
    let other = run(&SoakArgs {
        seed: Some(4243),
        ..args
    });
    assert_ne!(a.faults, other.faults);
}

#[test]
fn a_failure_names_the_seed_and_the_replay() {
    // Half the packets lost: connections die with no restart, which --strict fails.
    let r = run(&SoakArgs {
        seed: Some(7),
        fabric: true,
        ops: 100,
        loss: 0.5,
        strict: true,
        no_restart: true,
        ..SoakArgs::default()
    });
    assert!(!r.passed(), "{r}");
    let text = r.to_string();
    assert!(text.contains("FAIL (seed 7)"), "{text}");
    assert!(text.contains("lost with no peer restarting"), "{text}");
    assert!(text.contains("deterministic"), "{text}");
    let replay = replay_args(&r);
    assert_eq!(
        (replay.seed, replay.no_restart, replay.strict),
        (Some(7), true, true)
    );

    // Options out of range are failures, not panics.
    let bad = run(&SoakArgs {
        loss: 2.0,
        ..SoakArgs::default()
    });
    assert!(bad.failures[0].contains("--loss 2"), "{bad}");
    assert!(
        bad.args.seed.is_some(),
        "the seed is always chosen and printed"
    );
}

#[test]
fn a_fabric_device_restarts_on_its_name_and_address() {
    use emu_core::nic::EmuConfig;
    use std::net::Ipv4Addr;
    use verbs_api::Device;
    let f = emu_sims::Fabric::new(1);
    let ip = Ipv4Addr::new(10, 0, 0, 1);
    let old = f.add_device("a", ip).unwrap();
    let b = f.add_device("b", Ipv4Addr::new(10, 0, 0, 2)).unwrap();
    drop(old);
    let cfg = EmuConfig {
        name: "a".into(),
        ip: ip.into(),
        ..EmuConfig::default()
    };
    let new = f.replace_device(cfg.clone()).unwrap();
    assert_eq!(new.gid(), verbs_api::Gid::from_ipv4(ip));
    assert!(new.alloc_pd().is_ok() && b.alloc_pd().is_ok());
    for wrong in [
        EmuConfig {
            name: "c".into(),
            ..cfg.clone()
        },
        EmuConfig {
            ip: Ipv4Addr::new(10, 0, 0, 3).into(),
            ..cfg
        },
    ] {
        assert!(f.replace_device(wrong).is_err());
    }
}
