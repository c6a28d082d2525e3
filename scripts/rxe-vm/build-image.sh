#!/bin/bash
# Build everything needed to boot a Debian bookworm VM with a real rdma_rxe device.
# Everything lives under $W (default /tmp/rxevm). Run as root on a Debian 12 host.
# Adapted from the team's shared rxe-vm tools; steps that are already done under $W
# (QEMU, kernel, rootfs) are skipped, so a kept $W is a cache.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${W:-/tmp/rxevm}
mkdir -p "$W" && cd "$W"
mkdir -p debs qemu-root kernel share

# Mirror: taken from the host's apt config at run time (not hard-coded).
MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
echo "mirror: $MIRROR"

t0=$(date +%s)
# 1. host tools (debootstrap, cpio, busybox-static install cleanly)
inst() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >/dev/null; }
inst debootstrap cpio busybox-static kmod || { apt-get update >/dev/null && inst debootstrap cpio busybox-static kmod; }

# 2. QEMU: host has qemu-utils 10.x from backports which Breaks qemu-system-common 7.2,
#    so do NOT install qemu-system-x86; download its .debs and unpack them under $W/qemu-root.
if [ ! -x qemu-root/usr/bin/qemu-system-x86_64 ]; then
  PKGS=$(apt-get -s install --no-install-recommends qemu-system-x86 qemu-utils- 2>&1 | awk '/^Inst/{print $2}')
  (cd debs && apt-get download $PKGS)
  for d in debs/*.deb; do case $d in *linux-image*) ;; *) dpkg -x "$d" qemu-root;; esac; done
fi
t1=$(date +%s); echo "qemu ready: $((t1-t0))s"

# 3. Kernel: Debian's linux-image-amd64 (its modules include rdma_rxe.ko)
KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
KVER=${KPKG#linux-image-}
if [ ! -f kernel/boot/vmlinuz-$KVER ]; then
  (cd debs && apt-get download "$KPKG")
  dpkg -x debs/${KPKG}_*.deb kernel
fi
ln -sfn boot/vmlinuz-$KVER kernel/vmlinuz
echo "$KVER" > kernel/version
find kernel -name 'rdma_rxe.ko*'
t2=$(date +%s); echo "kernel ready: $((t2-t1))s"

# 4. rootfs via debootstrap (minbase + RDMA userspace)
if [ ! -x rootfs/usr/bin/ibv_rc_pingpong ] || [ ! -x rootfs/usr/bin/qperf ]; then
  rm -rf rootfs
  debootstrap --variant=minbase \
    --include=rdma-core,ibverbs-utils,ibverbs-providers,librdmacm1,rdmacm-utils,perftest,qperf,iproute2,kmod,procps,iputils-ping,netbase,tcpdump \
    bookworm rootfs "$MIRROR"
fi
# kernel modules into the rootfs (same kernel as we boot)
rm -rf rootfs/var/cache/apt/archives/*.deb
# only the modules the guest needs (rdma_rxe, rdma_ucm, ib_umad, virtio_net, crc32 crypto + deps)
depmod -b kernel "$KVER"
rm -rf rootfs/lib/modules/$KVER
mkdir -p rootfs/lib/modules/$KVER
cp kernel/lib/modules/$KVER/modules.{order,builtin,builtin.modinfo} rootfs/lib/modules/$KVER/
for m in rdma_rxe rdma_ucm ib_umad virtio_net crc32_generic crc32_pclmul; do
  modprobe -d kernel -S "$KVER" --show-depends $m | awk '/^insmod/{print $2}'
done | sort -u | while read -r f; do
  rel=${f#*/lib/modules/$KVER/}; mkdir -p "rootfs/lib/modules/$KVER/$(dirname "$rel")"; cp "$f" "rootfs/lib/modules/$KVER/$rel"
done
depmod -b rootfs "$KVER"
mkdir -p rootfs/mnt/host
echo rxevm > rootfs/etc/hostname
install -m 755 "$HERE/rxe-init.sh" rootfs/rxe-init.sh
t3=$(date +%s); echo "rootfs ready: $((t3-t2))s"

# 5. tiny initramfs: busybox + virtio/9p modules, mounts rootfs over 9p and switch_roots
rm -rf initramfs && mkdir -p initramfs/{bin,proc,sys,dev,newroot,lib/modules}
cp /usr/bin/busybox initramfs/bin/
depmod -b kernel "$KVER"
: > initramfs/modlist
for m in virtio_pci 9pnet_virtio 9p; do
  modprobe -d kernel -S "$KVER" --show-depends $m | awk '/^insmod/{print $2}'
done | awk '!seen[$0]++' | while read -r f; do
  cp "$f" initramfs/lib/modules/; basename "$f" >> initramfs/modlist
done
cat initramfs/modlist | tr '\n' ' '; echo
cat > initramfs/init <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modlist); do insmod /lib/modules/$m; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose rootfs /newroot || { echo "9p root mount failed"; sh; }
umount /proc /sys; umount /dev 2>/dev/null
exec switch_root /newroot /rxe-init.sh
INIT
chmod +x initramfs/init
(cd initramfs && find . | cpio -o -H newc --quiet | gzip -1) > initramfs.cpio.gz
t4=$(date +%s); echo "initramfs ready: $((t4-t3))s; total $((t4-t0))s"
du -sh qemu-root kernel rootfs debs initramfs.cpio.gz
