//! `rdma-emu exec`: the device tree programs see inside the namespaces it makes, and a
//! stock verbs program (`ibv_devinfo`) on the emulator's library through it.
//!
//! Where user and mount namespaces cannot be made, each test says so and skips. The
//! `ibv_devinfo` test needs the emulator's library: `RDMA_EMU_LIB=DIR` with DIR from
//! `capi/build-so.sh DIR` (it says it skipped otherwise).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_rdma-emu");

/// A directory holding a file named libibverbs.so.1: enough for the launcher to start
/// programs that do not load it (`sh`). Removed when dropped.
struct StandInLib(PathBuf);

impl std::ops::Deref for StandInLib {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for StandInLib {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for StandInLib {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for StandInLib {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A [`StandInLib`] of this test's own (tests run in parallel threads).
fn stand_in_lib() -> StandInLib {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("rdma-emu-exec-test-lib-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("libibverbs.so.1"), b"").unwrap();
    StandInLib(d)
}

fn exec(lib: &Path, args: &[&str], script: &str) -> Output {
    Command::new(BIN)
        .arg("exec")
        .arg("--lib")
        .arg(lib)
        .args(args)
        .args(["--", "sh", "-c", script])
        .env_remove("RDMA_EMU_DEVICES")
        .env_remove("RDMA_EMU_CONFIG")
        .env_remove("RDMA_EMU_IP")
        .output()
        .expect("run rdma-emu")
}

/// False (after saying why) where the launcher cannot make its namespaces here.
fn namespaces_available(lib: &Path) -> bool {
    let out = exec(lib, &["--ip", "127.0.0.60"], "true");
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("cannot make a user and mount namespace") {
        eprintln!("SKIPPED: no user/mount namespaces here: {}", err.trim());
        return false;
    }
    assert!(out.status.success(), "rdma-emu exec -- true: {err}");
    true
}

fn text(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn the_program_sees_the_device_in_sys_and_dev() {
    let lib = stand_in_lib();
    if !namespaces_available(&lib) {
        return;
    }
    let before = Path::new("/sys/class/infiniband/emu0").exists();
    let out = exec(
        &lib,
        &["--ip", "127.0.0.61"],
        "d=/sys/class/infiniband/emu0; p=$d/ports/1; \
         cat $d/node_type $d/node_guid $d/fw_ver $p/state $p/phys_state $p/link_layer \
             $p/lid $p/gids/0 $p/gid_attrs/types/0 $p/gid_attrs/ndevs/0 $p/pkeys/0 \
             /sys/class/infiniband_verbs/uverbs0/ibdev /sys/class/infiniband_verbs/abi_version; \
         ls $d/device/net/; \
         test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 && \
         test -w /dev/infiniband/uverbs0 && echo uverbs0-char; \
         echo \"${LD_LIBRARY_PATH%%:*}\"; echo \"$RDMA_EMU_DEVICES\"; \
         test -d /sys/class/net/lo && test -c /dev/null && echo others-still-there",
    );
    let t = text(&out);
    let lines: Vec<&str> = t.lines().collect();
    let lib_dir = std::fs::canonicalize(&lib).unwrap();
    assert_eq!(
        lines,
        [
            "1: CA",
            // emu_core::nic::node_guid: 02:00:ff:fe, then the IPv4 address.
            "0200:fffe:7f00:003d",
            env!("CARGO_PKG_VERSION"),
            "4: ACTIVE",
            "5: LinkUp",
            "Ethernet",
            "0x0",
            "0000:0000:0000:0000:0000:ffff:7f00:003d",
            "RoCE v2",
            "lo",
            "0xffff",
            "emu0",
            "6",
            "lo",
            "uverbs0-char",
            lib_dir.to_str().unwrap(),
            "emu0=127.0.0.61:4791",
            "others-still-there",
        ]
    );
    // Nothing leaked out of the mount namespace.
    assert_eq!(Path::new("/sys/class/infiniband/emu0").exists(), before);
}

#[test]
fn exit_status_and_errors_are_the_programs() {
    let lib = stand_in_lib();
    if !namespaces_available(&lib) {
        return;
    }
    let out = exec(&lib, &["--ip", "127.0.0.62"], "exit 7");
    assert_eq!(out.status.code(), Some(7));
    let out = Command::new(BIN)
        .args(["exec", "--lib", "/nonexistent", "--", "true"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("capi/build-so.sh"), "{err}");
    let out = Command::new(BIN)
        .args(["exec", "--lib"])
        .arg(&lib)
        .args(["--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run"));
}

#[test]
fn plain_mode_sets_only_the_environment() {
    let lib = stand_in_lib();
    let out = Command::new(BIN)
        .args(["exec", "--plain", "--ip", "127.0.0.63", "--lib"])
        .arg(&lib)
        .args([
            "--",
            "sh",
            "-c",
            "echo \"$RDMA_EMU_DEVICES\"; test -e /sys/class/infiniband/emu0 && echo tree || echo no-tree",
        ])
        .output()
        .unwrap();
    let t = text(&out);
    let host_has_it = Path::new("/sys/class/infiniband/emu0").exists();
    assert_eq!(
        t,
        format!(
            "emu0=127.0.0.63:4791\n{}\n",
            if host_has_it { "tree" } else { "no-tree" }
        )
    );
}

/// The user-namespace path, as an ordinary user: run when the tests run as root and
/// `setpriv` can drop to `nobody` (who must be able to reach the binary).
#[test]
fn works_unprivileged() {
    if !nix_is_root() || Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("SKIPPED: not root, or no setpriv: the other tests ran as this user");
        return;
    }
    let lib = stand_in_lib();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .args(["exec", "--ip", "127.0.0.64", "--lib"])
        .arg(&lib)
        .args([
            "--",
            "sh",
            "-c",
            "id -u; cat /sys/class/infiniband/emu0/ports/1/gids/0; test -c /dev/infiniband/uverbs0 && echo char",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Permission denied") && !out.status.success() {
        eprintln!("SKIPPED: nobody cannot reach the binary or library here: {err}");
        return;
    }
    if err.contains("cannot make a user and mount namespace") {
        eprintln!(
            "SKIPPED: no unprivileged user namespaces here: {}",
            err.trim()
        );
        return;
    }
    assert_eq!(
        text(&out),
        "65534\n0000:0000:0000:0000:0000:ffff:7f00:0040\nchar\n"
    );
}

fn nix_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false)
}

#[test]
fn ibv_devinfo_through_the_launcher() {
    let Some(lib) = std::env::var_os("RDMA_EMU_LIB").map(PathBuf::from) else {
        eprintln!("SKIPPED: set RDMA_EMU_LIB=DIR (capi/build-so.sh DIR) to run ibv_devinfo");
        return;
    };
    if Command::new("ibv_devinfo").arg("--help").output().is_err() {
        eprintln!("SKIPPED: no ibv_devinfo (ibverbs-utils)");
        return;
    }
    if !namespaces_available(&lib) {
        return;
    }
    let out = Command::new(BIN)
        .args(["exec", "--ip", "127.0.0.65", "--lib"])
        .arg(&lib)
        .args(["--", "ibv_devinfo", "-v"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(t.contains("hca_id:\temu0"), "{t}");
    assert!(t.contains("PORT_ACTIVE"), "{t}");
    assert!(t.contains("::ffff:127.0.0.65, RoCE v2"), "{t}");
    // Under --netns the device's interface is emunet0, whose MTU the port follows:
    // still 4096, as for a device on lo (a 1500-byte veth would give 1024, and two
    // processes of one test would disagree).
    if Command::new("ip").arg("-V").output().is_ok() {
        let out = Command::new(BIN)
            .args(["exec", "--netns", "--ip", "127.0.0.67", "--lib"])
            .arg(&lib)
            .args(["--", "ibv_devinfo", "-v"])
            .output()
            .unwrap();
        let t = text(&out);
        assert!(t.contains("active_mtu:\t\t4096 (5)"), "{t}");
    }
    // The same node GUID as the tree says.
    let out = exec(
        &lib,
        &["--ip", "127.0.0.65"],
        "cat /sys/class/infiniband/emu0/node_guid",
    );
    let guid = text(&out);
    assert!(
        t.contains(&format!("node_guid:\t\t\t{}", guid.trim())),
        "{t}\n{guid}"
    );
}

/// `--netns`: the program runs as root of a new network namespace whose `emunet0`
/// carries the device's address (127.x allowed there: route_localnet), the tree names
/// `emunet0` as its interface, and /sys/class/net is the namespace's; a nested
/// `exec --ip` there (the second process of a pair) gets its own device.
#[test]
fn netns_gives_the_device_a_non_loopback_interface() {
    let lib = stand_in_lib();
    if !namespaces_available(&lib) {
        return;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        eprintln!("SKIPPED: no iproute2 `ip`");
        return;
    }
    let out = exec(
        &lib,
        &["--netns", "--ip", "10.77.0.1", "--netns-addr", "10.77.0.2"],
        &format!(
            "id -u; ls /sys/class/infiniband/emu0/device/net/; \
             cat /sys/class/infiniband/emu0/ports/1/gid_attrs/ndevs/0; \
             cat /sys/class/infiniband/emu0/device/net/emunet0/operstate; \
             ls /sys/class/net | sort | tr '\\n' ' '; echo; \
             cat /proc/sys/net/ipv4/conf/emunet0/route_localnet; \
             ip -o -4 addr show emunet0 | awk '{{print $4}}'; \
             {BIN} exec --lib {lib} --ip 10.77.0.2 -- \
               cat /sys/class/infiniband/emu0/ports/1/gids/0",
            lib = lib.display()
        ),
    );
    assert_eq!(
        text(&out),
        "0\nemunet0\nemunet0\nup\nemunet0 emunet0p lo \n1\n10.77.0.1/32\n10.77.0.2/32\n\
         0000:0000:0000:0000:0000:ffff:0a4d:0002\n"
    );
}

/// Where no user namespace can be made, `exec` says so in one line and names what
/// works instead; `--plain` runs the program with the environment only. Made here by
/// running the launcher in a user namespace whose limit of nested namespaces is 0
/// (python3 does the unshare: the test harness is multithreaded, which unshare
/// refuses); skipped where python3 or user namespaces are missing.
#[test]
fn without_user_namespaces_it_says_what_works_instead() {
    const NO_USERNS: &str = "import ctypes, os, sys\n\
        if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0: sys.exit(77)\n\
        open('/proc/sys/user/max_user_namespaces', 'w').write('0')\n\
        os.execv(sys.argv[1], sys.argv[1:])\n";
    let lib = stand_in_lib();
    let run = |plain: bool| {
        let mut c = Command::new("python3");
        c.args(["-c", NO_USERNS, BIN, "exec", "--ip", "127.0.0.66", "--lib"])
            .arg(&lib);
        if plain {
            c.arg("--plain");
        }
        c.args(["--", "sh", "-c", "echo \"$RDMA_EMU_DEVICES\""]);
        c.output()
    };
    let out = match run(false) {
        Ok(o) if o.status.code() != Some(77) => o,
        _ => {
            eprintln!("SKIPPED: no python3, or no user namespace for the test itself");
            return;
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot make a user and mount namespace") && err.contains("--plain"),
        "{err}"
    );
    let out = run(true).unwrap();
    assert_eq!(text(&out), "emu0=127.0.0.66:4791\n");
}
