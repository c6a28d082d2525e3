#!/usr/bin/env bash
# CI step: the emulator between hosts. Network namespaces stand in for hosts:
#   A 10.77.0.1 --- veth, MTU 1500 --- B 10.77.0.2
#   C 10.78.1.2 --- MTU 1500 --- R (router, forwards, decrements TTL) --- MTU 9000 --- D 10.78.2.2
# and runs there, every process under timeout, two processes on two hosts each: the
# rc/uc/ud/srq pingpong examples, write_verify (byte-exact, also with random loss on
# the link by nftables), unmodified perftest (RC WRITE/READ/SEND/atomics, UD SEND;
# bandwidth and latency), rping, ucmatose and udaddy through capi's libraries, and the
# same across the router. Each device's port follows its interface: 1024 on the
# 1500-byte links, 4096 on the 9000-byte one, so a path crossing both needs the
# smaller MTU chosen by the user (perftest -m 1024), as with kernel rxe.
#   scripts/ci-netns.sh        # as root (ip netns); installs iproute2, nftables, perftest, ...
# Env: NETNS_ONLY="step ..." runs only the named steps; NETNS_TIMEOUT (60 s).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" != 0 ]; then
  echo "ci-netns.sh makes network namespaces with ip netns: run it as root (CI does)"
  exit 1
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
T=${NETNS_TIMEOUT:-60}
work=$(mktemp -d /tmp/ci-netns.XXXXXX)
pass=() fail=()
NS="emuA emuB emuC emuR emuD"

cleanup() {
  for n in $NS; do ip netns pids "$n" 2>/dev/null | xargs -r kill 2>/dev/null; ip netns del "$n" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
PKGS="iproute2 nftables perftest ibverbs-utils rdmacm-utils"
if ! dpkg -s $PKGS >/dev/null 2>&1; then
  apt-get install -y -qq $PKGS >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $PKGS >/dev/null; } ||
    { echo "FAIL netns: cannot install $PKGS"; exit 1; }
fi

echo "building the examples and capi's libraries (release)"
cargo build --release -q -p emu-core --examples || { echo "FAIL build examples"; exit 1; }
bin=$CARGO_TARGET_DIR/release/examples
lib=$work/lib
"$root/capi/build-so.sh" --release "$lib" >/dev/null || { echo "FAIL build libibverbs.so.1"; exit 1; }

# ---- the hosts ----
for n in $NS; do ip netns add "$n" && ip -n "$n" link set lo up || { echo "FAIL netns: ip netns add $n"; exit 1; }; done
link() { # nsA ifA addrA nsB ifB addrB mtu
  ip link add "$2" netns "$1" type veth peer name "$5" netns "$4" &&
    ip -n "$1" link set "$2" mtu "$7" && ip -n "$4" link set "$5" mtu "$7" &&
    ip -n "$1" addr add "$3" dev "$2" && ip -n "$4" addr add "$6" dev "$5" &&
    ip -n "$1" link set "$2" up && ip -n "$4" link set "$5" up
}
link emuA a0 10.77.0.1/24 emuB b0 10.77.0.2/24 1500 &&
  link emuC c0 10.78.1.2/24 emuR r1 10.78.1.1/24 1500 &&
  link emuR r2 10.78.2.1/24 emuD d0 10.78.2.2/24 9000 &&
  ip -n emuC route add default via 10.78.1.1 &&
  ip -n emuD route add default via 10.78.2.1 &&
  ip netns exec emuR sysctl -qw net.ipv4.ip_forward=1 ||
  { echo "FAIL netns: building the topology"; exit 1; }

want() { [ -z "${NETNS_ONLY:-}" ] || [[ " $NETNS_ONLY " == *" $1 "* ]]; }
record() { # name rc logs...
  local name=$1 rc=$2; shift 2
  if [ "$rc" = 0 ]; then pass+=("$name"); echo "PASS $name"
  else fail+=("$name"); echo "FAIL $name (rc=$rc)"; for f in "$@"; do sed 's/^/    /' "$f" | tail -12; done; fi
}
# on NS IP CMD...: runs CMD on host NS with capi's libraries and its device on IP.
on() { local ns=$1 ip=$2; shift 2; ip netns exec "$ns" env LD_LIBRARY_PATH="$lib" RDMA_EMU_IP="$ip" timeout "$T" "$@"; }
# pair NAME SNS SIP CNS CIP "server cmd" "client cmd" [grep]: a server on SNS, its client on CNS.
pair() {
  local name=$1 sns=$2 sip=$3 cns=$4 cip=$5 s=$6 c=$7 check=${8:-}
  want "$name" || return 0
  on "$sns" "$sip" $s >"$work/$name.srv" 2>&1 &
  local spid=$!
  sleep "${PAIR_WAIT:-1}"
  on "$cns" "$cip" $c >"$work/$name.cli" 2>&1
  local crc=$?
  wait "$spid"; local src=$?
  local rc=$(( crc != 0 ? crc : src ))
  if [ "$rc" = 0 ] && [ -n "$check" ] && ! grep -Eq "$check" "$work/$name.cli"; then rc=99; fi
  record "$name" "$rc" "$work/$name.srv" "$work/$name.cli"
  [ -z "$check" ] || grep -Eh "$check" "$work/$name.cli" | tail -1 | sed 's/^/    /'
}

A=10.77.0.1 B=10.77.0.2 C=10.78.1.2 D=10.78.2.2

# The ports as the hosts' interfaces make them.
if want devinfo; then
  on emuA $A ibv_devinfo -v >"$work/devinfo.A" 2>&1 && grep -q "active_mtu:.*1024" "$work/devinfo.A" &&
    on emuD $D ibv_devinfo -v >"$work/devinfo.D" 2>&1 && grep -q "active_mtu:.*4096" "$work/devinfo.D"
  record devinfo $? "$work/devinfo.A" "$work/devinfo.D"
fi

# ---- two hosts on one 1500-byte link ----
for ex in rc uc ud srq; do
  size=(); [ "$ex" = ud ] && size=(-s 1024)
  pair "${ex}_pingpong" emuA $A emuB $B "$bin/${ex}_pingpong --ip $A ${size[*]}" \
    "$bin/${ex}_pingpong --ip $B ${size[*]} $A" "iters in"
done
pair write_verify emuA $A emuB $B "$bin/write_verify --bytes 67108864 --ip $A" \
  "$bin/write_verify --bytes 67108864 --ip $B $A" "server verified every byte"
pair ibv_rc_pingpong emuA $A emuB $B "ibv_rc_pingpong -g 0" "ibv_rc_pingpong -g 0 $A" "iters in"
pair ibv_ud_pingpong emuA $A emuB $B "ibv_ud_pingpong -g 0 -s 1024" "ibv_ud_pingpong -g 0 -s 1024 $A" "iters in"
pair ib_write_bw emuA $A emuB $B "ib_write_bw" "ib_write_bw $A" "^ *65536"
pair ib_read_bw emuA $A emuB $B "ib_read_bw" "ib_read_bw $A" "^ *65536"
pair ib_send_bw emuA $A emuB $B "ib_send_bw" "ib_send_bw $A" "^ *65536"
pair ib_atomic_bw emuA $A emuB $B "ib_atomic_bw" "ib_atomic_bw $A" "^ *8 "
pair ib_send_bw_ud emuA $A emuB $B "ib_send_bw -c UD" "ib_send_bw -c UD $A" "^ *[0-9]+ "
pair ib_write_lat emuA $A emuB $B "ib_write_lat" "ib_write_lat $A" "^ *2 "
pair ib_read_lat emuA $A emuB $B "ib_read_lat" "ib_read_lat $A" "^ *2 "
pair ib_send_lat emuA $A emuB $B "ib_send_lat" "ib_send_lat $A" "^ *2 "
pair ib_send_lat_ud emuA $A emuB $B "ib_send_lat -c UD" "ib_send_lat -c UD $A" "^ *2 "
pair rping emuA $A emuB $B "rping -s -v -C 10 -a $A" "rping -c -v -C 10 -a $A" "ping data: rdma-ping-9"
pair ucmatose emuA $A emuB $B "ucmatose -b $A" "ucmatose -s $A -b $B" "test complete"
pair udaddy emuA $A emuB $B "udaddy -b $A" "udaddy -s $A -b $B" "test complete"

# A datagram larger than the link's MTU: refused where it is made (UD: at most the
# port's active MTU, LOC_LEN_ERR past it), not lost in silence.
if want ud_too_big; then
  on emuA $A ibv_ud_pingpong -g 0 -s 2048 >"$work/ud_big.srv" 2>&1 &
  spid=$!; sleep 1
  on emuB $B ibv_ud_pingpong -g 0 -s 2048 $A >"$work/ud_big.cli" 2>&1
  crc=$?; kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
  # ibv_ud_pingpong checks the size against the port's MTU and says so.
  if [ "$crc" != 0 ] && [ "$crc" -lt 124 ] && grep -qi "mtu" "$work/ud_big.cli"; then rc=0; else rc=1; fi
  record ud_too_big "$rc" "$work/ud_big.cli"
fi

# Random loss on the link (nftables, 1% of RoCE datagrams each way): RC stays
# byte-exact.
if want write_verify_lossy; then
  ip netns exec emuB nft -f - <<'EOF' || { echo "FAIL nft"; fail+=(nft); }
table inet loss {
  chain in { type filter hook input priority 0; udp dport 4791 numgen random mod 100 < 1 drop; }
  chain out { type filter hook output priority 0; udp dport 4791 numgen random mod 100 < 1 drop; }
}
EOF
  pair write_verify_lossy emuA $A emuB $B "$bin/write_verify --bytes 16777216 --ip $A" \
    "$bin/write_verify --bytes 16777216 --ip $B $A" "server verified every byte"
  ip netns exec emuB nft delete table inet loss 2>/dev/null
  ip netns exec emuB nft list ruleset >/dev/null 2>&1
fi

# ---- through a router; 1024 on C's side, 4096 on D's: the smaller decides ----
pair routed_rc_pingpong emuC $C emuD $D "$bin/rc_pingpong --ip $C" "$bin/rc_pingpong --ip $D $C" "iters in"
pair routed_ib_write_bw emuD $D emuC $C "ib_write_bw -m 1024" "ib_write_bw -m 1024 $D" "^ *65536"
pair routed_ib_send_lat emuD $D emuC $C "ib_send_lat -m 1024" "ib_send_lat -m 1024 $D" "^ *2 "
pair routed_rping emuC $C emuD $D "rping -s -v -C 10 -a $C" "rping -c -v -C 10 -a $C" "ping data: rdma-ping-9"

echo "passed (${#pass[@]}): ${pass[*]}"
echo "failed (${#fail[@]}): ${fail[*]}"
[ "${#fail[@]}" = 0 ]
