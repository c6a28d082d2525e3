//! `rdma-emu exec`: runs an unmodified program on the emulated device, with the device
//! where RDMA software looks for it.
//!
//! Software such as UCX, libfabric's verbs provider and rdma-core's pyverbs tests does
//! not only call libibverbs: it also reads the kernel's description of the device in
//! sysfs (`/sys/class/infiniband/<dev>/...`, `/sys/class/infiniband_verbs/uverbsN/...`),
//! checks that `/dev/infiniband/uverbsN` is a character device it may open, and finds
//! the network interface that carries the device's address. This subcommand
//!
//! 1. puts the emulator's `libibverbs.so.1` / `librdmacm.so.1` first on
//!    `LD_LIBRARY_PATH` (`--lib DIR`, else `$RDMA_EMU_LIB`, else `rdma-emu-lib/` next
//!    to the `rdma-emu` binary, else the binary's own directory) and, with `--ip`, sets
//!    `RDMA_EMU_DEVICES` for the library;
//! 2. enters a new user namespace (unless it already runs as root) and a new mount
//!    namespace, so that nothing needs root and nothing outside changes;
//! 3. covers `/sys/class` and `/dev` with tmpfs copies whose entries are bind mounts of
//!    the originals, plus the generated `infiniband`, `infiniband_verbs` and
//!    `/dev/infiniband` (whose nodes are bind mounts of `/dev/null`: character devices
//!    anyone may open, which is all the checks want; the library never opens them);
//! 4. with `--netns`, also enters a new network namespace with `lo` up and a veth pair
//!    `emunet0`/`emunet0p` carrying the device addresses (for libfabric, which ignores
//!    loopback interfaces), the program running as root of the namespace, and
//!    `/sys/class/net` showing that namespace's interfaces;
//! 5. replaces itself with the program (`execvp`), so signals and the exit status are
//!    the program's own.
//!
//! The values in the tree are what the library reports: the launcher opens the same
//! emulated device on a private UDP port and writes its `query_device`, `query_port`,
//! `query_pkey` and `query_gid` answers in the kernel's sysfs formats
//! (drivers/infiniband/core/sysfs.c).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::symlink;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use emu_core::nic::{EmuConfig, EmuDevice};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use verbs_api::{Device, LinkLayer, PortState};

/// The device configuration parser of the emulator's libibverbs, shared so that the
/// launcher reads `RDMA_EMU_*` exactly as the library does (`exec/config.rs` is a
/// symbolic link to `capi/src/config.rs`).
#[allow(dead_code, unreachable_pub)]
mod config;

use config::DeviceConfig;

/// The kernel's `IB_USER_VERBS_ABI_VERSION` (include/uapi/rdma/ib_user_verbs.h).
const UVERBS_ABI_VERSION: u32 = 6;
/// The kernel's uverbs character devices: major 231, minors from 192
/// (drivers/infiniband/core/uverbs_main.c `IB_UVERBS_BASE_DEV`).
const UVERBS_MAJOR: u32 = 231;
const UVERBS_BASE_MINOR: u32 = 192;
/// The interface `--netns` makes (its peer is `emunet0p`).
const NETNS_IF: &str = "emunet0";

/// Options of `rdma-emu exec`.
#[derive(Args, Debug)]
pub(crate) struct ExecOpts {
    /// The device's address, `ipv4[:udp_port]` (sets `RDMA_EMU_DEVICES=NAME=ADDR` for
    /// the program). Without it the device list comes from the environment as the
    /// library reads it (`RDMA_EMU_DEVICES`, `RDMA_EMU_CONFIG`, `RDMA_EMU_IP`, else
    /// emu0 on 127.0.0.1).
    #[arg(long)]
    ip: Option<String>,
    /// The device's name (with `--ip`).
    #[arg(long, default_value = "emu0", requires = "ip")]
    name: String,
    /// The directory holding the emulator's libibverbs.so.1 and librdmacm.so.1
    /// (`capi/build-so.sh --release DIR`). Default: `$RDMA_EMU_LIB`, else
    /// `rdma-emu-lib/` beside the rdma-emu binary, else the binary's directory.
    #[arg(long)]
    lib: Option<PathBuf>,
    /// Also a new network namespace: `lo` up and an interface `emunet0` carrying each
    /// device address and each `--netns-addr` (as /32). The program runs as root of
    /// the namespace. Start every process that must talk to each other inside one
    /// such namespace (e.g. a shell running a nested `rdma-emu exec --ip` per process).
    #[arg(long)]
    netns: bool,
    /// With `--netns`: another address for `emunet0` (for the other processes' devices).
    #[arg(long = "netns-addr", requires = "netns")]
    netns_addr: Vec<Ipv4Addr>,
    /// No namespaces and no /sys or /dev entries: only the library path and the device
    /// environment (what works where user namespaces are not available).
    #[arg(long, conflicts_with = "netns")]
    plain: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// What the generated tree says about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DeviceDesc {
    /// `ibv_get_device_name`.
    pub(crate) name: String,
    /// Index in the device list (the N of uverbsN).
    pub(crate) index: usize,
    /// `fw_ver`.
    pub(crate) fw_ver: String,
    /// Node GUID (host order); also the system image GUID.
    pub(crate) node_guid: u64,
    /// Port 1's logical state (IBTA encoding).
    pub(crate) state: u32,
    /// Port 1's physical state (IBTA encoding).
    pub(crate) phys_state: u8,
    /// IBTA active width code.
    pub(crate) active_width: u8,
    /// IBTA active speed code.
    pub(crate) active_speed: u8,
    /// Port 1's LID.
    pub(crate) lid: u16,
    /// Port 1's SM LID.
    pub(crate) sm_lid: u16,
    /// Port 1's LMC.
    pub(crate) lmc: u8,
    /// Port 1's SM SL.
    pub(crate) sm_sl: u8,
    /// Port 1's capability mask.
    pub(crate) cap_mask: u32,
    /// True for Ethernet (RoCE).
    pub(crate) ethernet: bool,
    /// The GID table (all entries, zero where empty).
    pub(crate) gids: Vec<[u8; 16]>,
    /// The P_Key table.
    pub(crate) pkeys: Vec<u16>,
    /// The network interface that carries the device's address, if one does.
    pub(crate) netdev: Option<String>,
}

/// Runs `o.command` as described in the module docs; returns only on failure.
pub(crate) fn run(o: ExecOpts) -> Result<(), String> {
    let lib = find_lib(o.lib.as_deref())?;
    let env = |k: &str| std::env::var(k).ok();
    let devices = match &o.ip {
        Some(addr) => {
            let list = format!("{}={addr}", o.name);
            config::from_env(|k| (k == "RDMA_EMU_DEVICES").then(|| list.clone()))
        }
        None => config::from_env(env),
    }
    .map_err(|e| format!("device configuration: {e}"))?;
    if devices.is_empty() {
        return Err("no device configured".into());
    }
    let mut cmd = Command::new(&o.command[0]);
    cmd.args(&o.command[1..]);
    let ld = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => lib.clone().into_os_string(),
    };
    cmd.env("LD_LIBRARY_PATH", ld);
    if o.ip.is_some() {
        cmd.env("RDMA_EMU_DEVICES", devices_env(&devices));
        cmd.env_remove("RDMA_EMU_CONFIG");
        cmd.env_remove("RDMA_EMU_IP");
    }
    if !o.plain {
        let fallback = |what: &str, e: String| {
            format!(
                "{what} ({e}), so /sys/class/infiniband and /dev/infiniband cannot be \
                 provided; plain libibverbs/librdmacm programs still work without them: \
                 `rdma-emu exec --plain ...` (LD_LIBRARY_PATH={} plus the RDMA_EMU_* variables)",
                lib.display()
            )
        };
        enter_namespaces(o.netns)
            .map_err(|e| fallback("cannot make a user and mount namespace", e))?;
        if o.netns {
            // (The namespace's addresses are IPv4; an IPv6 device's is not added.)
            let mut addrs: Vec<Ipv4Addr> = devices
                .iter()
                .filter_map(|d| match d.ip {
                    std::net::IpAddr::V4(v4) => Some(v4),
                    std::net::IpAddr::V6(_) => None,
                })
                .collect();
            addrs.extend(&o.netns_addr);
            setup_netns(&addrs)?;
        }
        // Mounting can still be refused inside the namespace (a security module, a
        // read-only /sys); the namespace is ours alone, so a half-done tree is lost with it.
        let mount_err = |e| fallback("cannot mount the device tree", e);
        // /sys/class first: under --netns it brings the namespace's /sys/class/net,
        // which the device reads its port's MTU, speed and state from when it opens.
        shadow_sys_class(o.netns).map_err(mount_err)?;
        let descs = devices
            .iter()
            .enumerate()
            .map(|(i, d)| describe(d, i))
            .collect::<Result<Vec<_>, String>>()?;
        install_tree(&descs).map_err(mount_err)?;
    }
    let e = cmd.exec();
    Err(format!("cannot run {:?}: {e}", o.command[0]))
}

/// `RDMA_EMU_DEVICES` for `devices`.
fn devices_env(devices: &[DeviceConfig]) -> String {
    devices
        .iter()
        .map(|d| format!("{}={}:{}", d.name, d.ip, d.port))
        .collect::<Vec<_>>()
        .join(",")
}

/// The directory with the emulator's libibverbs.so.1 (see [`ExecOpts::lib`]).
fn find_lib(given: Option<&Path>) -> Result<PathBuf, String> {
    let has_lib = |d: &Path| d.join("libibverbs.so.1").is_file();
    let candidates: Vec<(PathBuf, &str)> = if let Some(d) = given {
        vec![(d.to_path_buf(), "--lib")]
    } else if let Some(d) = std::env::var_os("RDMA_EMU_LIB") {
        vec![(PathBuf::from(d), "RDMA_EMU_LIB")]
    } else {
        let exe = std::env::current_exe().map_err(|e| format!("where is rdma-emu: {e}"))?;
        let dir = exe.parent().unwrap_or(Path::new("/")).to_path_buf();
        vec![
            (dir.join("rdma-emu-lib"), "beside rdma-emu"),
            (dir, "beside rdma-emu"),
        ]
    };
    for (d, _) in &candidates {
        if has_lib(d) {
            return fs::canonicalize(d).map_err(|e| format!("{}: {e}", d.display()));
        }
    }
    let tried: Vec<String> = candidates
        .iter()
        .map(|(d, why)| format!("{} ({why})", d.display()))
        .collect();
    Err(format!(
        "no emulator libibverbs.so.1 in {}; build it with `capi/build-so.sh --release DIR` \
         and pass --lib DIR (or set RDMA_EMU_LIB=DIR)",
        tried.join(", ")
    ))
}

/// New user (when not root) and mount namespaces, and a network namespace with
/// `netns`; the mount tree made private so nothing propagates out.
fn enter_namespaces(netns: bool) -> Result<(), String> {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let mut flags = CloneFlags::CLONE_NEWNS;
    if netns {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    if uid != 0 {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    unshare(flags).map_err(|e| {
        let why = match e {
            nix::errno::Errno::ENOSPC => ": the user namespace limit is reached (user.max_user_namespaces)",
            nix::errno::Errno::EPERM => ": not permitted here (a container's seccomp or security policy, kernel.unprivileged_userns_clone=0, or AppArmor's userns restriction)",
            nix::errno::Errno::EINVAL => ": the kernel has no user namespaces, or the process has threads",
            _ => "",
        };
        format!("unshare: {e}{why}")
    })?;
    if uid != 0 {
        // The program keeps its own ids, except in a network namespace, where it is
        // root so that it (and `ip`) may configure the namespace.
        let (inner_uid, inner_gid) = if netns { (0, 0) } else { (uid, gid) };
        let w = |f: &str, s: String| fs::write(f, s).map_err(|e| format!("{f}: {e}"));
        w("/proc/self/setgroups", "deny".into())?;
        w("/proc/self/uid_map", format!("{inner_uid} {uid} 1\n"))?;
        w("/proc/self/gid_map", format!("{inner_gid} {gid} 1\n"))?;
    }
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("making / private: {e}"))
}

/// `lo` up, and `emunet0` (one end of a veth pair, MTU 65535) up with `addrs` as /32
/// addresses, where 127.x addresses are not martians.
fn setup_netns(addrs: &[Ipv4Addr]) -> Result<(), String> {
    let peer = format!("{NETNS_IF}p");
    // Packets with 127.x addresses arriving on an interface other than lo are dropped
    // as martians unless route_localnet is set: the emulator's multicast, which leaves
    // through the device address's interface and is looped back there, would be lost.
    for conf in ["all", "default"] {
        let f = format!("/proc/sys/net/ipv4/conf/{conf}/route_localnet");
        fs::write(&f, "1").map_err(|e| format!("{f}: {e}"))?;
    }
    let mut steps: Vec<Vec<String>> = vec![
        vec!["link".into(), "set".into(), "lo".into(), "up".into()],
        [
            "link", "add", NETNS_IF, "type", "veth", "peer", "name", &peer,
        ]
        .map(String::from)
        .to_vec(),
    ];
    for a in addrs {
        let a = format!("{a}/32");
        steps.push(
            ["addr", "add", &a, "dev", NETNS_IF]
                .map(String::from)
                .to_vec(),
        );
    }
    // Traffic between addresses of one host goes through `lo` whatever interface
    // holds them; the pair gets the largest MTU a veth takes, so that the device, whose
    // port MTU follows its interface's, keeps lo's (4096) like a device on 127.x.
    for dev in [NETNS_IF, peer.as_str()] {
        steps.push(
            ["link", "set", dev, "mtu", "65535", "up"]
                .map(String::from)
                .to_vec(),
        );
    }
    for s in steps {
        let out = Command::new("ip")
            .args(&s)
            .output()
            .map_err(|e| format!("--netns needs iproute2's `ip`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "ip {}: {}",
                s.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(())
}

/// Opens `cfg`'s device on a private UDP port and records what it reports.
fn describe(cfg: &DeviceConfig, index: usize) -> Result<DeviceDesc, String> {
    let dev = EmuDevice::open(EmuConfig {
        name: cfg.name.clone(),
        ip: cfg.ip,
        port: 0,
        ..EmuConfig::default()
    })
    .map_err(|e| format!("cannot open an emulated device on {}: {e}", cfg.ip))?;
    let q = |e: verbs_api::Error| format!("{}: {e}", cfg.name);
    let a = dev.query_device().map_err(q)?;
    let p = dev.query_port(1).map_err(q)?;
    let gids = (0..p.gid_tbl_len)
        .map(|i| dev.query_gid(1, i).map(|g| g.0))
        .collect::<verbs_api::Result<Vec<_>>>()
        .map_err(q)?;
    let pkeys = (0..p.pkey_tbl_len)
        .map(|i| dev.query_pkey(1, i))
        .collect::<verbs_api::Result<Vec<_>>>()
        .map_err(q)?;
    Ok(DeviceDesc {
        name: cfg.name.clone(),
        index,
        fw_ver: a.fw_ver,
        node_guid: a.node_guid,
        state: PortState::as_u32(p.state),
        phys_state: p.phys_state,
        active_width: p.active_width,
        active_speed: p.active_speed,
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        sm_sl: p.sm_sl,
        cap_mask: p.port_cap_flags,
        ethernet: p.link_layer == LinkLayer::Ethernet,
        gids,
        pkeys,
        netdev: match cfg.ip {
            std::net::IpAddr::V4(v4) => netdev_of(v4),
            std::net::IpAddr::V6(v6) if v6.is_loopback() => Some("lo".into()),
            // (Found by the device itself; sysfs names none here.)
            std::net::IpAddr::V6(_) => None,
        },
    })
}

/// The interface carrying `ip`, by the rule the emulated device follows its
/// interface with (emu-core `nic::netdev::interface_of`, whose port MTU, speed and
/// state come from it): the first, in `getifaddrs` order, holding exactly that
/// address, else the first whose subnet holds it (127.0.0.x: `lo`).
pub(crate) fn netdev_of(ip: Ipv4Addr) -> Option<String> {
    let addrs: Vec<(String, Ipv4Addr, Ipv4Addr)> = nix::ifaddrs::getifaddrs()
        .ok()?
        .filter_map(|a| {
            let addr = a.address?.as_sockaddr_in()?.ip();
            let mask = a.netmask?.as_sockaddr_in()?.ip();
            Some((a.interface_name, addr, mask))
        })
        .collect();
    pick_netdev(ip, &addrs)
}

/// [`netdev_of`]'s choice among `(name, address, netmask)`, in `getifaddrs` order.
fn pick_netdev(ip: Ipv4Addr, addrs: &[(String, Ipv4Addr, Ipv4Addr)]) -> Option<String> {
    let within =
        |a: Ipv4Addr, m: Ipv4Addr| u32::from(a) & u32::from(m) == u32::from(ip) & u32::from(m);
    addrs
        .iter()
        .find(|(_, a, _)| *a == ip)
        .or_else(|| addrs.iter().find(|(_, a, m)| within(*a, *m)))
        .map(|x| x.0.clone())
}

/// The kernel's `%pI6` (eight groups of four hex digits).
fn gid_text(g: &[u8; 16]) -> String {
    g.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// The kernel's GUID format: four groups of four hex digits.
fn guid_text(guid: u64) -> String {
    let b = guid.to_be_bytes();
    b.chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join(":")
}

/// The sysfs `rate` text for IBTA width and speed codes (`rate_show`).
fn rate_text(width: u8, speed: u8) -> String {
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 0,
    };
    // Tenths of Gb/s per lane, and the name.
    let (tenths, name) = match speed {
        1 => (25, " SDR"),
        2 => (50, " DDR"),
        4 => (100, " QDR"),
        8 => (100, " FDR10"),
        16 => (140, " FDR"),
        32 => (250, " EDR"),
        64 => (500, " HDR"),
        128 => (1000, " NDR"),
        _ => (25, ""),
    };
    let total = tenths * lanes;
    let whole = total / 10;
    // The kernel prints ".5" for any remainder (every IBTA rate is a multiple of 2.5).
    let frac = if total % 10 != 0 { ".5" } else { "" };
    format!("{whole}{frac} Gb/sec ({lanes}X{name})")
}

/// The name of an IBTA port state (`state_show`).
fn state_text(s: u32) -> String {
    let name = match s {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "UNKNOWN",
    };
    format!("{s}: {name}")
}

/// The name of an IBTA physical port state (`phys_state_show`).
fn phys_state_text(s: u8) -> String {
    let name = match s {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "<unknown>",
    };
    format!("{s}: {name}")
}

/// The GID type of an entry, as `gid_attrs/types/N` says it (RoCE v2 for an
/// IPv4-mapped GID, the only kind the emulator makes).
fn gid_type_text(g: &[u8; 16]) -> Option<&'static str> {
    let v4_mapped = g[..10].iter().all(|b| *b == 0) && g[10] == 0xFF && g[11] == 0xFF;
    if v4_mapped {
        Some("RoCE v2")
    } else if g.iter().any(|b| *b != 0) {
        Some("IB/RoCE v1")
    } else {
        None
    }
}

fn write(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, format!("{text}\n"))
}

/// Writes `<dir>/<name>/...` for each device: what `/sys/class/infiniband` holds.
pub(crate) fn write_infiniband(dir: &Path, devs: &[DeviceDesc]) -> io::Result<()> {
    for d in devs {
        let root = dir.join(&d.name);
        write(&root.join("node_type"), "1: CA")?;
        write(&root.join("node_guid"), &guid_text(d.node_guid))?;
        write(&root.join("sys_image_guid"), &guid_text(d.node_guid))?;
        write(&root.join("fw_ver"), &d.fw_ver)?;
        write(&root.join("hca_type"), "rdma-emu")?;
        write(&root.join("hw_rev"), "0x0")?;
        write(&root.join("node_desc"), &format!("rdma-emu {}", d.name))?;
        let dev = root.join("device");
        fs::create_dir_all(dev.join("net"))?;
        write(&dev.join("numa_node"), "-1")?;
        if let Some(nd) = &d.netdev {
            symlink(format!("/sys/class/net/{nd}"), dev.join("net").join(nd))?;
        }
        let port = root.join("ports").join("1");
        write(&port.join("state"), &state_text(d.state))?;
        write(&port.join("phys_state"), &phys_state_text(d.phys_state))?;
        write(
            &port.join("rate"),
            &rate_text(d.active_width, d.active_speed),
        )?;
        write(
            &port.join("link_layer"),
            if d.ethernet { "Ethernet" } else { "InfiniBand" },
        )?;
        write(&port.join("lid"), &format!("0x{:x}", d.lid))?;
        write(&port.join("sm_lid"), &format!("0x{:x}", d.sm_lid))?;
        write(&port.join("lid_mask_count"), &d.lmc.to_string())?;
        write(&port.join("sm_sl"), &d.sm_sl.to_string())?;
        write(&port.join("cap_mask"), &format!("0x{:08x}", d.cap_mask))?;
        fs::create_dir_all(port.join("gid_attrs").join("types"))?;
        fs::create_dir_all(port.join("gid_attrs").join("ndevs"))?;
        for (i, g) in d.gids.iter().enumerate() {
            write(&port.join("gids").join(i.to_string()), &gid_text(g))?;
            // The kernel answers EINVAL for an empty entry's type and net device;
            // here such entries are absent.
            if let Some(t) = gid_type_text(g) {
                let attrs = port.join("gid_attrs");
                write(&attrs.join("types").join(i.to_string()), t)?;
                if let Some(nd) = &d.netdev {
                    write(&attrs.join("ndevs").join(i.to_string()), nd)?;
                }
            }
        }
        for (i, k) in d.pkeys.iter().enumerate() {
            write(
                &port.join("pkeys").join(i.to_string()),
                &format!("0x{k:04x}"),
            )?;
        }
    }
    Ok(())
}

/// The uverbs node name of a device (`uverbsN`).
fn uverbs_name(d: &DeviceDesc) -> String {
    format!("uverbs{}", d.index)
}

/// Writes what `/sys/class/infiniband_verbs` holds.
pub(crate) fn write_infiniband_verbs(dir: &Path, devs: &[DeviceDesc]) -> io::Result<()> {
    write(&dir.join("abi_version"), &UVERBS_ABI_VERSION.to_string())?;
    for d in devs {
        let root = dir.join(uverbs_name(d));
        write(&root.join("ibdev"), &d.name)?;
        write(&root.join("abi_version"), &UVERBS_ABI_VERSION.to_string())?;
        let minor = UVERBS_BASE_MINOR + d.index as u32;
        write(&root.join("dev"), &format!("{UVERBS_MAJOR}:{minor}"))?;
    }
    Ok(())
}

/// The names under `/dev/infiniband`: `uverbsN` per device (the `dev_name` the
/// emulator's libibverbs reports, which UCX looks up there) and `rdma_cm`.
pub(crate) fn dev_nodes(devs: &[DeviceDesc]) -> Vec<String> {
    let mut v: Vec<String> = devs.iter().map(uverbs_name).collect();
    v.push("rdma_cm".into());
    v
}

/// Covers `dir` with a tmpfs holding bind mounts of its entries (except `skip`), then
/// lets `fill` add to it. `fill` gets the new directory and a path that still
/// reaches the old one.
fn shadow(
    dir: &Path,
    skip: &[&str],
    fill: impl FnOnce(&Path, &Path) -> Result<(), String>,
) -> Result<(), String> {
    let err = |what: &str, e: &dyn std::fmt::Display| format!("{}: {what}: {e}", dir.display());
    let old = File::open(dir).map_err(|e| err("open", &e))?;
    let old_path = PathBuf::from(format!("/proc/self/fd/{}", old.as_raw_fd()));
    let mut entries = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| err("read", &e))? {
        let e = e.map_err(|e| err("read", &e))?;
        let ft = e.file_type().map_err(|e| err("read", &e))?;
        entries.push((e.file_name(), ft));
    }
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )
    .map_err(|e| err("mount tmpfs", &e))?;
    let mut failed = Vec::new();
    for (name, ft) in entries {
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        let src = old_path.join(&name);
        let dst = dir.join(&name);
        let r = if ft.is_symlink() {
            fs::read_link(&src).and_then(|t| symlink(t, &dst))
        } else {
            let made = if ft.is_dir() {
                fs::create_dir(&dst)
            } else {
                File::create(&dst).map(drop)
            };
            made.and_then(|()| {
                mount(
                    Some(&src),
                    &dst,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(io::Error::from)
            })
        };
        if let Err(e) = r {
            failed.push(format!("{} ({e})", name.to_string_lossy()));
        }
    }
    if !failed.is_empty() {
        eprintln!(
            "rdma-emu exec: not visible inside: {}: {}",
            dir.display(),
            failed.join(", ")
        );
    }
    fill(dir, &old_path)?;
    drop(old);
    Ok(())
}

/// Puts the network namespace's own view of its interfaces on `/sys/class/net` and
/// `/sys/devices/virtual/net` (sysfs shows the network namespace of whoever mounted it,
/// so the host's `/sys` lists the host's interfaces): a sysfs mounted from inside
/// the namespace, at `scratch` for as long as it takes to bind those two directories.
fn netns_sysfs_net(scratch: &Path) -> Result<(), String> {
    let err =
        |what: &str, e: &dyn std::fmt::Display| format!("sysfs of the namespace: {what}: {e}");
    fs::create_dir(scratch).map_err(|e| err("mkdir", &e))?;
    mount(
        Some("sysfs"),
        scratch,
        Some("sysfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| err("mount", &e))?;
    for (from, to) in [
        ("class/net", "/sys/class/net"),
        ("devices/virtual/net", "/sys/devices/virtual/net"),
    ] {
        mount(
            Some(&scratch.join(from)),
            to,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| err(to, &e))?;
    }
    umount2(scratch, MntFlags::MNT_DETACH).map_err(|e| err("umount", &e))?;
    fs::remove_dir(scratch).map_err(|e| err("rmdir", &e))
}

/// Covers `/sys/class` with a writable copy of its entries except `infiniband` and
/// `infiniband_verbs` (with `netns`, also the namespace's own `/sys/class/net`).
fn shadow_sys_class(netns: bool) -> Result<(), String> {
    shadow(
        Path::new("/sys/class"),
        &["infiniband", "infiniband_verbs"],
        |dir, _| {
            if netns {
                netns_sysfs_net(&dir.join(".rdma-emu-sysfs"))?;
            }
            Ok(())
        },
    )
}

/// Writes the generated entries into the `/sys/class` copy ([`shadow_sys_class`]) and
/// mounts `/dev`'s.
fn install_tree(devs: &[DeviceDesc]) -> Result<(), String> {
    fn io(what: &'static str) -> impl Fn(io::Error) -> String {
        move |e| format!("{what}: {e}")
    }
    write_infiniband(Path::new("/sys/class/infiniband"), devs)
        .map_err(io("/sys/class/infiniband"))?;
    write_infiniband_verbs(Path::new("/sys/class/infiniband_verbs"), devs)
        .map_err(io("/sys/class/infiniband_verbs"))?;
    shadow(Path::new("/dev"), &["infiniband"], |dir, old| {
        let ib = dir.join("infiniband");
        fs::create_dir(&ib).map_err(io("/dev/infiniband"))?;
        for n in dev_nodes(devs) {
            let node = ib.join(&n);
            File::create(&node).map_err(io("/dev/infiniband"))?;
            mount(
                Some(&old.join("null")),
                &node,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| format!("/dev/infiniband/{n}: bind /dev/null: {e}"))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(index: usize, ip: Ipv4Addr, netdev: Option<&str>) -> DeviceDesc {
        let mut g0 = [0u8; 16];
        g0[10] = 0xFF;
        g0[11] = 0xFF;
        g0[12..].copy_from_slice(&ip.octets());
        let mut gids = vec![[0u8; 16]; 16];
        gids[0] = g0;
        let mut pkeys = vec![0u16; 64];
        pkeys[0] = 0xFFFF;
        DeviceDesc {
            name: format!("emu{index}"),
            index,
            fw_ver: "0.1.0".into(),
            node_guid: 0x0200_00FF_FF00_0009,
            state: 4,
            phys_state: 5,
            active_width: 1,
            active_speed: 1,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            sm_sl: 0,
            cap_mask: 0x0600_0000,
            ethernet: true,
            gids,
            pkeys,
            netdev: netdev.map(String::from),
        }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rdma-emu-exec-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn read(p: PathBuf) -> String {
        fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn infiniband_tree_has_the_kernel_files_and_formats() {
        let dir = tempdir("ib");
        let devs = [
            desc(0, Ipv4Addr::new(127, 0, 0, 9), Some("lo")),
            desc(1, Ipv4Addr::new(10, 1, 2, 3), None),
        ];
        write_infiniband(&dir, &devs).unwrap();
        let e = dir.join("emu0");
        assert_eq!(read(e.join("node_type")), "1: CA\n");
        assert_eq!(read(e.join("node_guid")), "0200:00ff:ff00:0009\n");
        assert_eq!(read(e.join("sys_image_guid")), "0200:00ff:ff00:0009\n");
        assert_eq!(read(e.join("fw_ver")), "0.1.0\n");
        assert_eq!(read(e.join("hca_type")), "rdma-emu\n");
        let p = e.join("ports/1");
        assert_eq!(read(p.join("state")), "4: ACTIVE\n");
        assert_eq!(read(p.join("phys_state")), "5: LinkUp\n");
        assert_eq!(read(p.join("rate")), "2.5 Gb/sec (1X SDR)\n");
        assert_eq!(read(p.join("link_layer")), "Ethernet\n");
        assert_eq!(read(p.join("lid")), "0x0\n");
        assert_eq!(read(p.join("cap_mask")), "0x06000000\n");
        assert_eq!(
            read(p.join("gids/0")),
            "0000:0000:0000:0000:0000:ffff:7f00:0009\n"
        );
        assert_eq!(
            read(p.join("gids/15")),
            "0000:0000:0000:0000:0000:0000:0000:0000\n"
        );
        assert!(!p.join("gids/16").exists());
        assert_eq!(read(p.join("gid_attrs/types/0")), "RoCE v2\n");
        assert_eq!(read(p.join("gid_attrs/ndevs/0")), "lo\n");
        assert!(!p.join("gid_attrs/types/1").exists());
        assert_eq!(read(p.join("pkeys/0")), "0xffff\n");
        assert_eq!(read(p.join("pkeys/63")), "0x0000\n");
        let net: Vec<_> = fs::read_dir(e.join("device/net"))
            .unwrap()
            .map(|x| x.unwrap().file_name())
            .collect();
        assert_eq!(net, ["lo"]);
        assert_eq!(
            fs::read_link(e.join("device/net/lo")).unwrap(),
            Path::new("/sys/class/net/lo")
        );
        // A device whose address no interface carries: no net device, no ndevs.
        let e1 = dir.join("emu1");
        assert_eq!(
            read(e1.join("ports/1/gids/0")),
            "0000:0000:0000:0000:0000:ffff:0a01:0203\n"
        );
        assert_eq!(fs::read_dir(e1.join("device/net")).unwrap().count(), 0);
        assert!(!e1.join("ports/1/gid_attrs/ndevs/0").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn infiniband_verbs_tree_and_dev_nodes() {
        let dir = tempdir("uverbs");
        let devs = [
            desc(0, Ipv4Addr::LOCALHOST, None),
            desc(1, Ipv4Addr::LOCALHOST, None),
        ];
        write_infiniband_verbs(&dir, &devs).unwrap();
        assert_eq!(read(dir.join("abi_version")), "6\n");
        assert_eq!(read(dir.join("uverbs0/ibdev")), "emu0\n");
        assert_eq!(read(dir.join("uverbs1/ibdev")), "emu1\n");
        assert_eq!(read(dir.join("uverbs1/abi_version")), "6\n");
        assert_eq!(read(dir.join("uverbs0/dev")), "231:192\n");
        assert_eq!(read(dir.join("uverbs1/dev")), "231:193\n");
        assert_eq!(dev_nodes(&devs), ["uverbs0", "uverbs1", "rdma_cm"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn values_come_from_the_emulated_device() {
        let cfg = DeviceConfig {
            name: "emu0".into(),
            ip: Ipv4Addr::new(127, 0, 0, 9).into(),
            port: 4791,
            auto_ip: false,
        };
        let d = describe(&cfg, 0).unwrap();
        // The library's node GUID (capi `guid_of`, emu-core `query_device`).
        assert_eq!(d.node_guid, 0x0200_FFFE_7F00_0009);
        assert_eq!(d.gids[0][10..], [0xFF, 0xFF, 127, 0, 0, 9]);
        assert_eq!(gid_type_text(&d.gids[0]), Some("RoCE v2"));
        assert_eq!(d.state, 4);
        assert!(d.ethernet);
        assert_eq!(d.pkeys[0], 0xFFFF);
        assert_eq!(d.netdev.as_deref(), Some("lo"));
    }

    #[test]
    fn netdev_choice() {
        let lo = (
            "lo".to_string(),
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::new(255, 0, 0, 0),
        );
        let eth = (
            "eth0".to_string(),
            Ipv4Addr::new(10, 0, 0, 5),
            Ipv4Addr::new(255, 255, 255, 0),
        );
        let veth = |a| ("emunet0".to_string(), a, Ipv4Addr::BROADCAST);
        let all = [
            lo.clone(),
            eth.clone(),
            veth(Ipv4Addr::new(127, 0, 0, 1)),
            veth(Ipv4Addr::new(127, 0, 0, 2)),
        ];
        let pick = |ip| pick_netdev(ip, &all);
        // An exact address first, in order (lo before emunet0 for 127.0.0.1).
        assert_eq!(
            pick(Ipv4Addr::new(127, 0, 0, 2)).as_deref(),
            Some("emunet0")
        );
        assert_eq!(pick(Ipv4Addr::LOCALHOST).as_deref(), Some("lo"));
        assert_eq!(pick(Ipv4Addr::new(10, 0, 0, 5)).as_deref(), Some("eth0"));
        // Else the subnet.
        assert_eq!(pick(Ipv4Addr::new(127, 0, 0, 3)).as_deref(), Some("lo"));
        assert_eq!(pick(Ipv4Addr::new(10, 0, 0, 9)).as_deref(), Some("eth0"));
        assert_eq!(pick(Ipv4Addr::new(192, 168, 0, 1)), None);
    }

    #[test]
    fn text_formats() {
        assert_eq!(rate_text(1, 1), "2.5 Gb/sec (1X SDR)");
        assert_eq!(rate_text(2, 32), "100 Gb/sec (4X EDR)");
        assert_eq!(rate_text(2, 64), "200 Gb/sec (4X HDR)");
        assert_eq!(state_text(1), "1: DOWN");
        assert_eq!(phys_state_text(2), "2: Polling");
        assert_eq!(guid_text(0x0011_2233_4455_6677), "0011:2233:4455:6677");
        assert_eq!(gid_type_text(&[0; 16]), None);
        let mut ll = [0u8; 16];
        ll[0] = 0xFE;
        ll[1] = 0x80;
        assert_eq!(gid_type_text(&ll), Some("IB/RoCE v1"));
        assert_eq!(
            devices_env(&[DeviceConfig {
                name: "emu0".into(),
                ip: Ipv4Addr::new(127, 0, 0, 2).into(),
                port: 4791,
                auto_ip: false
            }]),
            "emu0=127.0.0.2:4791"
        );
    }
}
