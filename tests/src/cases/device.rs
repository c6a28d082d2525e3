//! Device and port queries (manual 3.3.1-3.3.4).

use verbs_api::{DeviceCapFlags, LinkLayer, PortState};

use super::{assert_errno, errno::EINVAL};
use crate::{Case, Env, Outcome};

pub(super) fn register(v: &mut Vec<Case>) {
    v.push(Case::new(
        "device::query_device_limits_are_sane",
        "manual 3.3.1 ibv_query_device: the attributes describe the device's limits",
        query_device,
    ));
    v.push(Case::new(
        "device::query_port_1_is_active_ethernet",
        "manual 3.3.2 ibv_query_port; IBTA Annex A16/A17: a RoCE port's link layer is Ethernet",
        query_port,
    ));
    v.push(Case::new(
        "device::query_port_0_is_einval",
        "manual 3.3.2: ports are numbered from 1",
        query_port_zero,
    ));
    v.push(Case::new(
        "device::query_port_beyond_count_is_einval",
        "manual 3.3.2: port_num must be a port of the device (phys_port_cnt)",
        query_port_beyond,
    ));
    v.push(Case::new("device::gid_0_is_the_roce_v2_gid", "manual 3.3.3 ibv_query_gid; IBTA Annex A17: a RoCEv2 GID of an IPv4 address is ::ffff:a.b.c.d, of an IPv6 address the address itself", gid_zero));
    v.push(Case::new(
        "device::gid_index_beyond_table_is_einval",
        "manual 3.3.3: index must be below gid_tbl_len",
        gid_beyond,
    ));
    v.push(Case::new(
        "device::pkey_0_is_default_full_member",
        "manual 3.3.4 ibv_query_pkey; IBTA 10.9.1.2: index 0 holds the default P_Key 0xFFFF",
        pkey_zero,
    ));
    v.push(Case::new(
        "device::pkey_index_beyond_table_is_einval",
        "manual 3.3.4: index must be below pkey_tbl_len",
        pkey_beyond,
    ));
}

fn query_device(env: &Env) -> Outcome {
    let a = env.dev.query_device().expect("query_device");
    assert!(a.phys_port_cnt >= 1, "{a:?}");
    assert!(
        a.max_qp > 0 && a.max_cq > 0 && a.max_mr > 0 && a.max_pd > 0,
        "{a:?}"
    );
    assert!(a.max_qp_wr > 0 && a.max_cqe > 0 && a.max_sge > 0, "{a:?}");
    assert!(a.max_mr_size > 0, "{a:?}");
    // Every backend here has SRQs, address handles, multicast and memory windows:
    // their limits are not zero, and MEM_WINDOW says windows are there.
    assert!(
        a.max_srq > 0 && a.max_srq_wr > 0 && a.max_srq_sge > 0,
        "{a:?}"
    );
    assert!(a.max_ah > 0 && a.max_mw > 0, "{a:?}");
    assert!(a.max_mcast_grp > 0 && a.max_mcast_qp_attach > 0, "{a:?}");
    assert!(
        a.max_total_mcast_qp_attach >= a.max_mcast_qp_attach,
        "{a:?}"
    );
    assert!(
        a.device_cap_flags.contains(DeviceCapFlags::MEM_WINDOW),
        "{:?}",
        a.device_cap_flags
    );
    Outcome::Pass
}

fn query_port(env: &Env) -> Outcome {
    let p = env.dev.query_port(1).expect("query_port(1)");
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.link_layer, LinkLayer::Ethernet);
    assert!(p.gid_tbl_len >= 1 && p.pkey_tbl_len >= 1, "{p:?}");
    assert!(p.active_mtu as u32 <= p.max_mtu as u32, "{p:?}");
    assert!(p.max_msg_sz >= 1 << 20, "{p:?}");
    Outcome::Pass
}

fn query_port_zero(env: &Env) -> Outcome {
    assert_errno(env.dev.query_port(0), EINVAL);
    Outcome::Pass
}

fn query_port_beyond(env: &Env) -> Outcome {
    let n = env.dev.query_device().expect("query_device").phys_port_cnt;
    assert_errno(env.dev.query_port(n + 1), EINVAL);
    Outcome::Pass
}

fn gid_zero(env: &Env) -> Outcome {
    let g = env.dev.query_gid(1, 0).expect("query_gid");
    if let std::net::IpAddr::V6(v6) = env.ip() {
        // A device on an IPv6 address: its RoCEv2 GID is the address itself (Annex
        // A17), a unicast address that is not IPv4-mapped; the emulator puts it at
        // index 0 (hardware lists it after its link-local entries).
        assert!(
            !v6.is_unspecified() && !v6.is_multicast(),
            "the device's GID {v6} is not a unicast address"
        );
        if env.emulator {
            assert_eq!(g, env.gid(), "index 0 is not the device's RoCEv2 GID");
        }
        return Outcome::Pass;
    }
    // Hardware may hold a link-local (fe80::) RoCEv1 GID at index 0; the emulator puts
    // the RoCEv2 GID there. Either way some entry is the IPv4-mapped one.
    if g.to_ipv4().is_some() {
        return Outcome::Pass;
    }
    let len = env.dev.query_port(1).expect("query_port").gid_tbl_len;
    for i in 1..len.min(16) {
        if env
            .dev
            .query_gid(1, i)
            .map(|g| g.to_ipv4().is_some())
            .unwrap_or(false)
        {
            return Outcome::Pass;
        }
    }
    panic!("no IPv4-mapped GID in the first entries (index 0 is {g})");
}

fn gid_beyond(env: &Env) -> Outcome {
    let len = env.dev.query_port(1).expect("query_port").gid_tbl_len;
    assert_errno(env.dev.query_gid(1, len), EINVAL);
    Outcome::Pass
}

fn pkey_zero(env: &Env) -> Outcome {
    assert_eq!(env.dev.query_pkey(1, 0).expect("query_pkey"), 0xFFFF);
    Outcome::Pass
}

fn pkey_beyond(env: &Env) -> Outcome {
    let len = env.dev.query_port(1).expect("query_port").pkey_tbl_len;
    assert_errno(env.dev.query_pkey(1, len), 2);
    Outcome::Pass
}
