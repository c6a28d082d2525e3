//! Which emulated devices `ibv_get_device_list` shows, from the environment.
//!
//! * `RDMA_EMU_DEVICES="emu0=127.0.0.1:4791,emu1=127.0.0.2"`: the devices, each
//!   `name=address[:port]` (port 4791 when omitted; every device a program talks to
//!   must use the same port). An address is IPv4 (`127.0.0.2`, `127.0.0.2:4791`) or
//!   IPv6 (`::1`, `[::1]:4791`): the device's GID is then the IPv6 address itself, and
//!   it talks to IPv6 peers.
//! * `RDMA_EMU_CONFIG=/path/to/file`: the same, one device per line (`name ipv4[:port]`
//!   or `name=ipv4[:port]`; `#` starts a comment). Used when `RDMA_EMU_DEVICES` is unset.
//! * `RDMA_EMU_IP=127.0.0.2` (or `::1`): one device `emu0` on that address.
//! * Nothing set: one device `emu0` on 127.0.0.1; if another process already holds
//!   127.0.0.1:4791, `ibv_open_device` takes the next free address 127.0.0.2,
//!   127.0.0.3, ... (Linux answers on all of 127.0.0.0/8), so a server and a client on
//!   one host need no configuration. Its GID carries the address it got.
//! * `RDMA_EMU_INTEROP=1`: every device opens its link in interop mode, for a real
//!   RoCE peer such as kernel rxe on the other end of a real link (emu-core's
//!   `LinkOptions::interop`: raw receive socket, so root or `CAP_NET_RAW`), with an
//!   active MTU of 1024, the largest IBTA MTU an Ethernet MTU of 1500 carries (what
//!   rxe reports on such a link). `0` or unset: the loopback mode.
//! * `RDMA_EMU_STRICT_PORT=1`: every device's connected QPs take packets only from
//!   the UDP source port their peer first sent from (emu-core's
//!   `LinkOptions::strict_source_port`). `0` or unset: any port of the peer's address,
//!   as kernel rxe.
//! * `RDMA_EMU_LINK=auto`, the default (unset or empty) outside the interop mode: every
//!   device is a UDP device that also offers the same-host shared-memory link and uses
//!   it to a peer on this host that offers it, UDP to any other (emu-core's
//!   `SameHost::Auto`): each pair of devices finds the link it can. `udp` (the
//!   interop mode's default): UDP only, every packet on the wire (for a capture). `shm`:
//!   every device sits on the shared-memory link instead of UDP (emu-core's
//!   `SameHost::Shm`), talking to its peers on this host through rings in memory both
//!   map, with no system call on the data path while both poll.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use emu_core::nic::SameHost;

/// The RoCEv2 UDP port.
pub const ROCE_PORT: u16 = 4791;

/// One configured device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// `ibv_get_device_name`.
    pub name: String,
    /// The address it owns (its GID is `::ffff:ip` for IPv4, `ip` for IPv6).
    pub ip: IpAddr,
    /// The UDP port.
    pub port: u16,
    /// True when no address was configured: opening may move on to the next free
    /// 127.0.0.x.
    pub auto_ip: bool,
}

/// The devices from the variables `get` returns (the process environment in use;
/// a map in tests). Errors name the bad entry.
pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Vec<DeviceConfig>, String> {
    if let Some(list) = get("RDMA_EMU_DEVICES") {
        return parse_list(list.split(','));
    }
    if let Some(path) = get("RDMA_EMU_CONFIG") {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("RDMA_EMU_CONFIG={path}: {e}"))?;
        return parse_list(text.lines().map(|l| l.split('#').next().unwrap_or("")));
    }
    if let Some(ip) = get("RDMA_EMU_IP") {
        let (ip, port) = parse_addr(ip.trim())?;
        return Ok(vec![DeviceConfig {
            name: "emu0".into(),
            ip,
            port,
            auto_ip: false,
        }]);
    }
    Ok(vec![DeviceConfig {
        name: "emu0".into(),
        ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: ROCE_PORT,
        auto_ip: true,
    }])
}

fn parse_list<'a>(entries: impl Iterator<Item = &'a str>) -> Result<Vec<DeviceConfig>, String> {
    let mut out: Vec<DeviceConfig> = Vec::new();
    for entry in entries.map(str::trim).filter(|e| !e.is_empty()) {
        let (name, addr) = entry
            .split_once('=')
            .or_else(|| entry.split_once(char::is_whitespace))
            .ok_or_else(|| format!("device entry {entry:?}: expected name=address[:port]"))?;
        let name = name.trim();
        if name.is_empty() || name.len() >= 64 || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("device entry {entry:?}: bad device name"));
        }
        if out.iter().any(|d| d.name == name) {
            return Err(format!("device {name} is configured twice"));
        }
        let (ip, port) = parse_addr(addr.trim())?;
        out.push(DeviceConfig {
            name: name.into(),
            ip,
            port,
            auto_ip: false,
        });
    }
    Ok(out)
}

/// `ipv4[:port]`, a bare IPv6 address, or `[ipv6]:port`.
fn parse_addr(s: &str) -> Result<(IpAddr, u16), String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok((ip, ROCE_PORT));
    }
    if s.starts_with('[') {
        return s
            .parse::<SocketAddr>()
            .map(|a| (a.ip(), a.port()))
            .map_err(|_| format!("{s:?}: expected [ipv6]:port"));
    }
    let (ip, port) = match s.split_once(':') {
        Some((ip, port)) => (
            ip,
            port.parse::<u16>()
                .map_err(|_| format!("{s:?}: bad UDP port"))?,
        ),
        None => (s, ROCE_PORT),
    };
    let ip = ip
        .parse::<Ipv4Addr>()
        .map_err(|_| format!("{s:?}: expected an IPv4 or IPv6 address"))?;
    Ok((IpAddr::V4(ip), port))
}

/// Whether `RDMA_EMU_INTEROP` asks for interop mode (see the module docs).
pub fn interop_from_env(get: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    flag_from_env(get, "RDMA_EMU_INTEROP")
}

/// The link `RDMA_EMU_LINK` asks for (see the module docs): unset, the automatic
/// choice, except in the interop mode (`interop`), whose peers are kernel rxe or a NIC.
pub fn link_from_env(
    get: impl Fn(&str) -> Option<String>,
    interop: bool,
) -> Result<SameHost, String> {
    match get("RDMA_EMU_LINK").as_deref().map(str::trim) {
        None | Some("") if interop => Ok(SameHost::Udp),
        None | Some("") => Ok(SameHost::Auto),
        Some("udp") => Ok(SameHost::Udp),
        Some("shm") => Ok(SameHost::Shm),
        Some("auto") => Ok(SameHost::Auto),
        Some(v) => Err(format!("RDMA_EMU_LINK={v:?}: expected udp, shm or auto")),
    }
}

/// Whether the variable `name` (`0`, `1` or unset) is set to 1.
pub fn flag_from_env(get: impl Fn(&str) -> Option<String>, name: &str) -> Result<bool, String> {
    match get(name).as_deref().map(str::trim) {
        None | Some("" | "0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!("{name}={v:?}: expected 0 or 1")),
    }
}

/// The addresses an automatically addressed device tries, in order (the last octet
/// walks up from an IPv4 one; an IPv6 one is tried alone).
pub fn auto_candidates(first: IpAddr) -> impl Iterator<Item = IpAddr> {
    let (v4, start) = match first {
        IpAddr::V4(v4) => (v4, v4.octets()[3]),
        IpAddr::V6(_) => (Ipv4Addr::UNSPECIFIED, 255),
    };
    let [a, b, c, _] = v4.octets();
    let walk = (start..=254).map(move |d| IpAddr::V4(Ipv4Addr::new(a, b, c, d)));
    first.is_ipv6().then_some(first).into_iter().chain(walk)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn default_is_one_auto_device() {
        let d = from_env(env(&[])).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].name, "emu0");
        assert_eq!(d[0].ip, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(d[0].port, 4791);
        assert!(d[0].auto_ip);
    }

    #[test]
    fn rdma_emu_ip_fixes_the_address() {
        let d = from_env(env(&[("RDMA_EMU_IP", "127.0.0.2")])).unwrap();
        assert_eq!(d[0].ip, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
        assert!(!d[0].auto_ip);
        assert!(from_env(env(&[("RDMA_EMU_IP", "localhost")])).is_err());
    }

    #[test]
    fn device_list() {
        let d = from_env(env(&[(
            "RDMA_EMU_DEVICES",
            "emu0=127.0.0.1:5000, emu1=127.0.0.2",
        )]))
        .unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].name.as_str(), d[0].port), ("emu0", 5000));
        assert_eq!(
            (d[1].name.as_str(), d[1].ip, d[1].port),
            ("emu1", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), 4791)
        );
        for bad in [
            "emu0",
            "emu0=1.2.3",
            "emu0=1.2.3.4:x",
            "=1.2.3.4",
            "a=1.1.1.1,a=1.1.1.2",
        ] {
            assert!(
                from_env(env(&[("RDMA_EMU_DEVICES", bad)])).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn config_file() {
        let path = std::env::temp_dir().join(format!("capi-config-{}", std::process::id()));
        std::fs::write(
            &path,
            "# devices\nemuA 127.0.0.5\n\nemuB=127.0.0.6:4800 # second\n",
        )
        .unwrap();
        let d = from_env(env(&[("RDMA_EMU_CONFIG", path.to_str().unwrap())])).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].name.as_str(), d[0].ip),
            ("emuA", IpAddr::V4(Ipv4Addr::new(127, 0, 0, 5)))
        );
        assert_eq!((d[1].name.as_str(), d[1].port), ("emuB", 4800));
        assert!(from_env(env(&[("RDMA_EMU_CONFIG", "/nonexistent/x")])).is_err());
    }

    #[test]
    fn interop_switch() {
        assert_eq!(interop_from_env(env(&[])), Ok(false));
        assert_eq!(
            interop_from_env(env(&[("RDMA_EMU_INTEROP", "0")])),
            Ok(false)
        );
        assert_eq!(
            interop_from_env(env(&[("RDMA_EMU_INTEROP", "1")])),
            Ok(true)
        );
        assert!(interop_from_env(env(&[("RDMA_EMU_INTEROP", "yes")])).is_err());
        let strict = |v| flag_from_env(env(&[("RDMA_EMU_STRICT_PORT", v)]), "RDMA_EMU_STRICT_PORT");
        assert_eq!((strict("1"), strict("0")), (Ok(true), Ok(false)));
        assert!(strict("on").unwrap_err().contains("RDMA_EMU_STRICT_PORT"));
    }

    #[test]
    fn link_switch() {
        assert_eq!(link_from_env(env(&[]), false), Ok(SameHost::Auto));
        assert_eq!(link_from_env(env(&[]), true), Ok(SameHost::Udp));
        for interop in [false, true] {
            let link = |v| link_from_env(env(&[("RDMA_EMU_LINK", v)]), interop);
            assert_eq!(link("udp"), Ok(SameHost::Udp));
            assert_eq!(link("shm"), Ok(SameHost::Shm));
            assert_eq!(link("auto"), Ok(SameHost::Auto));
            assert!(link("fast").is_err());
        }
    }

    #[test]
    fn auto_candidates_walk_the_last_octet() {
        let v: Vec<_> = auto_candidates(Ipv4Addr::new(127, 0, 0, 253).into()).collect();
        assert_eq!(
            v,
            [
                IpAddr::V4(Ipv4Addr::new(127, 0, 0, 253)),
                IpAddr::V4(Ipv4Addr::new(127, 0, 0, 254))
            ]
        );
        let v6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
        assert_eq!(auto_candidates(v6).collect::<Vec<_>>(), [v6]);
    }

    #[test]
    fn ipv6_addresses_with_and_without_a_port() {
        let one = |v: &str| from_env(env(&[("RDMA_EMU_IP", v)])).map(|d| (d[0].ip, d[0].port));
        let lo6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
        assert_eq!(one("::1"), Ok((lo6, 4791)));
        assert_eq!(one("[::1]:4800"), Ok((lo6, 4800)));
        assert_eq!(one("fe80::1"), Ok(("fe80::1".parse().unwrap(), 4791)));
        assert!(one("[::1]").is_err());
        assert!(one("[::1]:x").is_err());
        let d = from_env(env(&[("RDMA_EMU_DEVICES", "a=[fd00::1]:4791,b=127.0.0.2")])).unwrap();
        assert_eq!(d[0].ip, "fd00::1".parse::<IpAddr>().unwrap());
        assert_eq!(d[1].ip, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
    }

    use proptest::prelude::*;

    proptest! {
        /// A device list written in the documented syntax parses back to itself.
        #[test]
        fn device_lists_round_trip(
            devs in proptest::collection::btree_map("[a-z][a-z0-9_]{0,14}", (any::<[u8; 4]>(), any::<u16>(), any::<bool>()), 1..6),
        ) {
            let text: Vec<String> = devs
                .iter()
                .map(|(n, (ip, port, with_port))| {
                    let ip = Ipv4Addr::from(*ip);
                    if *with_port { format!("{n}={ip}:{port}") } else { format!("{n}={ip}") }
                })
                .collect();
            let parsed = from_env(env(&[("RDMA_EMU_DEVICES", &text.join(","))])).unwrap();
            prop_assert_eq!(parsed.len(), devs.len());
            for (d, (n, (ip, port, with_port))) in parsed.iter().zip(&devs) {
                prop_assert_eq!(&d.name, n);
                prop_assert_eq!(d.ip, IpAddr::V4(Ipv4Addr::from(*ip)));
                prop_assert_eq!(d.port, if *with_port { *port } else { ROCE_PORT });
                prop_assert!(!d.auto_ip);
            }
        }

        /// Arbitrary text never panics the parser.
        #[test]
        fn garbage_is_an_error_not_a_panic(text in ".{0,64}") {
            let _ = from_env(env(&[("RDMA_EMU_DEVICES", &text)]));
        }
    }
}
