#!/bin/bash
# The job scripts/ci-hw.sh runs inside the rxe VM (as /mnt/host/job.sh, cwd /mnt/host):
# every hw-backend test binary in ./bin against rxe0, with REQUIRE_RDMA_DEVICE=1 so that
# a missing device fails instead of skipping. Each binary's libtest output goes to
# results/<name>.log; the host compares it with rxe-deviations.txt. Then the conformance
# suite, and HwCm's tests and the suite's cm cases again over IPv6. Exit status: 0 when
# every binary ran to completion (tests may have failed), 2 when one hung or crashed.
export REQUIRE_RDMA_DEVICE=1 RDMA_DEVICE=rxe0 RUST_BACKTRACE=1
# hw_cm's silent peer: a node that answers ARP but runs no RDMA CM. With QEMU user
# networking (gateway 10.0.2.2, NATed to the host's loopback, where an emulator may
# listen) it is QEMU's DNS address 10.0.2.3; on a tap link the host (the gateway).
gw=$(ip route show default | awk '{print $3; exit}')
if [ "$gw" = 10.0.2.2 ]; then RDMA_CM_SILENT_PEER=10.0.2.3; else RDMA_CM_SILENT_PEER=$gw; fi
export RDMA_CM_SILENT_PEER
ulimit -l unlimited
uname -r
rdma link show
mkdir -p results
rc=0
for b in bin/*; do
  name=$(basename "$b")
  # hw_removal deletes rxe0: it runs last, below.
  [ "$name" = hw_removal ] && continue
  start=$(date +%s%N)
  timeout 300 "$b" --test-threads=1 > "results/$name.log" 2>&1
  brc=$?
  echo "$name: exit $brc in $(( ($(date +%s%N) - start) / 1000000 )) ms"
  grep -E '^test .* \.\.\. ' "results/$name.log"
  # libtest exits 101 when tests fail; anything else non-zero is a hang or a crash.
  if [ "$brc" -ne 0 ] && [ "$brc" -ne 101 ]; then
    echo "$name did not complete (exit $brc)"; tail -20 "results/$name.log"; rc=2
  fi
done
# The conformance suite (crate tests), case by case, on rxe0. RDMA_TEST_LINK_FAULTS=1:
# cases that need the link down take eth0 down and up (this VM's only link; the share
# is not networked).
if [ -x conf/conformance ]; then
  start=$(date +%s%N)
  skips=(); [ -f conf/crashes.txt ] && skips=(--skip-list conf/crashes.txt)
  RDMA_TEST_LINK_FAULTS=1 timeout 420 conf/conformance --backend hw:rxe0 "${skips[@]}" --save results/rxe.tsv > results/conformance.log 2>&1
  crc=$?
  echo "conformance: exit $crc in $(( ($(date +%s%N) - start) / 1000000 )) ms"
  tail -1 results/conformance.log
  # 0: all passed, 1: some failed (compared on the host); anything else: hang or crash.
  if [ "$crc" -ne 0 ] && [ "$crc" -ne 1 ]; then
    echo "conformance did not complete (exit $crc)"; tail -20 results/conformance.log; rc=2
  fi
fi
# HwCm over IPv6: a global address on eth0 (nodad: usable at once) becomes a RoCE v2
# GID of rxe0; hw_cm (but the silent peer, 75 s, run above over IPv4) and the suite's
# cm cases run again through it, RDMA_GID_INDEX naming that GID. hw_cm's results are
# named ipv6::<test> (results/hw_cm-ipv6.log), the suite's go to results/rxe-ipv6.tsv.
V6=fd77::2
ip -6 addr replace $V6/64 dev eth0 nodad
# The GID's sysfs spelling (eight groups of four hex digits) and its RoCE v2 entry.
v6gid=fd77:0000:0000:0000:0000:0000:0000:0002
port=/sys/class/infiniband/rxe0/ports/1
v6idx=
for i in $(seq 50); do
  # One grep over the table (rxe's has 1024 entries; a process per entry is slow here).
  for f in $(grep -lx $v6gid "$port"/gids/*); do
    n=${f##*/}
    [ "$(cat "$port/gid_attrs/types/$n" 2>/dev/null)" = "RoCE v2" ] && v6idx=$n
  done
  [ -n "$v6idx" ] && break
  sleep 0.1
done
if [ -z "$v6idx" ]; then
  echo "rxe0 has no RoCE v2 GID for $V6"; rc=2
else
  echo "IPv6: $V6 is rxe0's GID $v6idx"
  if [ -x bin/hw_cm ]; then
    RDMA_GID_INDEX=$v6idx timeout 120 bin/hw_cm --test-threads=1 --skip silent_peer > results/hw_cm-ipv6.raw 2>&1
    brc=$?
    sed -E 's/^test (.*) \.\.\. /test ipv6::\1 ... /' results/hw_cm-ipv6.raw > results/hw_cm-ipv6.log
    rm results/hw_cm-ipv6.raw
    echo "hw_cm over IPv6: exit $brc"
    grep -E '^test .* \.\.\. ' results/hw_cm-ipv6.log
    if [ "$brc" -ne 0 ] && [ "$brc" -ne 101 ]; then
      echo "hw_cm over IPv6 did not complete (exit $brc)"; tail -20 results/hw_cm-ipv6.log; rc=2
    fi
  fi
  if [ -x conf/conformance ]; then
    RDMA_GID_INDEX=$v6idx timeout 120 conf/conformance --backend hw:rxe0 --save results/rxe-ipv6.tsv cm:: > results/conformance-ipv6.log 2>&1
    crc=$?
    echo "conformance cm:: over IPv6: exit $crc"
    tail -1 results/conformance-ipv6.log
    if [ "$crc" -ne 0 ] && [ "$crc" -ne 1 ]; then
      echo "conformance over IPv6 did not complete (exit $crc)"; tail -20 results/conformance-ipv6.log; rc=2
    fi
  fi
fi
# Last, as it deletes the device: DEVICE_REMOVAL on every CM id (hw_removal).
if [ -x bin/hw_removal ]; then
  RDMA_TEST_REMOVE_DEVICE=rxe0 timeout 120 bin/hw_removal --test-threads=1 > results/hw_removal.log 2>&1
  brc=$?
  echo "hw_removal: exit $brc"
  grep -E '^test .* \.\.\. ' results/hw_removal.log
  if [ "$brc" -ne 0 ] && [ "$brc" -ne 101 ]; then
    echo "hw_removal did not complete (exit $brc)"; tail -20 results/hw_removal.log; rc=2
  fi
  # The removal ends once the test process has closed its contexts.
  sleep 2
  if rdma link show | grep -q rxe0; then echo "rxe0 was not removed"; rdma link show; rc=2; fi
fi
exit $rc
