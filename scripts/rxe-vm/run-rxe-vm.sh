#!/bin/bash
# Boot the Debian bookworm VM (kernel 6.1, real rdma_rxe) under QEMU and run a job in it.
#   usage: run-rxe-vm.sh JOB_SCRIPT
# The host folder $W/share is mounted in the guest at /mnt/host (9p, read-write);
# the job runs there as root (cwd /mnt/host) after rxe0 is up on eth0 (10.0.2.15).
# Output: serial console on stdout, $W/share/job.log, exit status = job's exit status.
# Env: W=/tmp/rxevm ACCEL=tcg|kvm MEM=2048 SMP=2 TIMEOUT=900 NET=user|tap TAP=rxetap0
#      EXTRA_NET=",hostfwd=tcp::2222-:22" (slirp options) KAPPEND="extra kernel args"
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${W:-/tmp/rxevm}
JOB=${1:?usage: run-rxe-vm.sh JOB_SCRIPT}
ACCEL=${ACCEL:-tcg}; MEM=${MEM:-2048}; SMP=${SMP:-2}; TIMEOUT=${TIMEOUT:-900}
[ -x "$W/qemu-root/usr/bin/qemu-system-x86_64" ] && [ -f "$W/initramfs.cpio.gz" ] || W="$W" "$HERE/build-image.sh" >&2
Q=$W/qemu-root
export LD_LIBRARY_PATH=$Q/usr/lib/x86_64-linux-gnu:$Q/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$W/share"
[ "$(readlink -f "$JOB")" = "$(readlink -f "$W/share/job.sh")" ] || cp "$JOB" "$W/share/job.sh"
rm -f "$W/share/job.rc" "$W/share/job.log"
if [ "$ACCEL" = kvm ]; then ACC=(-accel kvm -cpu host); else ACC=(-accel tcg,thread=multi -cpu max); fi
# NET=user (default): QEMU slirp, guest 10.0.2.15, host reachable as 10.0.2.2 (UDP/TCP NATed to host loopback).
# NET=tap: host tap device $TAP (192.168.77.1/24), guest 192.168.77.2 -- real L2/L3, no NAT (needed for valid ICRCs).
NET=${NET:-user}; TAP=${TAP:-rxetap0}; KAPPEND=${KAPPEND:-}
if [ "$NET" = tap ]; then
  if ! ip link show "$TAP" >/dev/null 2>&1; then
    ip tuntap add dev "$TAP" mode tap
    ip addr add 192.168.77.1/24 dev "$TAP"
  fi
  ip link set "$TAP" up
  NETARGS=(-netdev tap,id=n0,ifname="$TAP",script=no,downscript=no)
  KAPPEND="$KAPPEND rxevm.ip=192.168.77.2/24 rxevm.gw=192.168.77.1"
else
  NETARGS=(-netdev "user,id=n0${EXTRA_NET:-}")
fi
start=$(date +%s%N)
timeout "$TIMEOUT" "$Q/usr/bin/qemu-system-x86_64" -L "$Q/usr/share/qemu" -L "$Q/usr/share/seabios" \
  "${ACC[@]}" -m "$MEM" -smp "$SMP" -nographic -no-reboot -nodefaults -serial stdio \
  -kernel "$W/kernel/vmlinuz" -initrd "$W/initramfs.cpio.gz" \
  -append "console=ttyS0 panic=-1 quiet loglevel=4 ${KAPPEND:-}" \
  -fsdev local,id=rootfs,path="$W/rootfs",security_model=passthrough \
  -device virtio-9p-pci,fsdev=rootfs,mount_tag=rootfs \
  -fsdev local,id=share,path="$W/share",security_model=none \
  -device virtio-9p-pci,fsdev=share,mount_tag=hostshare \
  "${NETARGS[@]}" -device virtio-net-pci,netdev=n0 \
  </dev/null || echo "qemu exited with $?" >&2
echo "VM wall time: $(( ($(date +%s%N) - start) / 1000000 )) ms" >&2
[ -f "$W/share/job.rc" ] && exit "$(cat "$W/share/job.rc")"
echo "no job.rc: job did not complete" >&2; exit 3
