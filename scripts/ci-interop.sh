#!/usr/bin/env bash
# CI step: wire interop between the emulator and kernel rxe (docs/interop.md).
#   1. builds the pingpong examples (emu-core) and the interop tool (tests, --features hw),
#   2. boots the rxe VM with NET=tap (guest 192.168.77.2, host 192.168.77.1 on rxetap0;
#      our own test link, no other address is ever a target) running the interop agent,
#   3. runs, each as one step: ibv_{rc,uc,ud}_pingpong against our pingpong examples in
#      both roles, ib_{write,read,atomic}_bw against our perftest_peer in both roles, a capture of the IP IDs on the tap, and the fault probes,
#      and the connection manager: unmodified rping and udaddy (rdmacm-utils) on the
#      host, on capi's libibverbs.so.1/librdmacm.so.1 in interop mode
#      (RDMA_EMU_INTEROP=1), against the VM's rping and udaddy on the kernel's rdma_cm,
#      both roles, plus address resolution of an address nobody owns,
#   4. fails if any step failed.
# Needs root (tap device, raw socket). Env: RXEVM_W (the cached VM image; default
# /work/rxevm-cache), INTEROP_W (this job's VM folder; default $RXEVM_W-interop),
# ACCEL=tcg|kvm (default tcg; kvm fails in nested setups).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
t0=$(date +%s)
note() { printf '[ci-interop %4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

if [ -z "${RXEVM_W:-}" ]; then
  if [ -d /work ] && [ -w /work ]; then RXEVM_W=/work/rxevm-cache; else RXEVM_W=${TMPDIR:-/tmp}/rxevm; fi
fi
W=${INTEROP_W:-$RXEVM_W-interop}
ACCEL=${ACCEL:-tcg}
export ACCEL
TGT=${CARGO_TARGET_DIR:-$REPO/target}

note "VM image under $RXEVM_W"
if ! { [ -x "$RXEVM_W/qemu-root/usr/bin/qemu-system-x86_64" ] && [ -f "$RXEVM_W/initramfs.cpio.gz" ] \
       && [ -x "$RXEVM_W/rootfs/usr/bin/ibv_rc_pingpong" ]; }; then
  mkdir -p "$RXEVM_W"
  W="$RXEVM_W" "$REPO/scripts/rxe-vm/build-image.sh" > "$RXEVM_W/build-image.log" 2>&1 \
    || { tail -30 "$RXEVM_W/build-image.log"; exit 1; }
fi
# Our own VM folder (its share is ours alone), the image linked from the cache.
mkdir -p "$W/share/bin"
for f in qemu-root kernel initramfs.cpio.gz rootfs; do ln -sfn "$RXEVM_W/$f" "$W/$f"; done

note "build"
cargo build -q --release -p emu-core --example rc_pingpong --example uc_pingpong --example ud_pingpong --example perftest_peer || exit 1
cargo build -q --release -p tests --features hw --example interop || exit 1
"$REPO/capi/build-so.sh" --release "$W/capi-lib" >/dev/null || exit 1
EX=$TGT/release/examples
cp "$EX/interop" "$W/share/bin/interop"
IO=$EX/interop

note "boot the VM (NET=tap, ACCEL=$ACCEL)"
W="$W" NET=tap TIMEOUT=600 "$REPO/scripts/rxe-vm/run-rxe-vm.sh" "$REPO/scripts/interop/job.sh" > "$W/vm.log" 2>&1 &
vmpid=$!
cleanup() { "$IO" vm 192.168.77.2:7000 exit >/dev/null 2>&1; wait "$vmpid" 2>/dev/null; }
trap cleanup EXIT
vmx() { timeout 120 "$IO" vm 192.168.77.2:7000 "$@"; }
# The agent is up once it answers.
for _ in $(seq 1 300); do
  if timeout 5 "$IO" vm 192.168.77.2:7000 true >/dev/null 2>&1; then break; fi
  kill -0 "$vmpid" 2>/dev/null || { cat "$W/vm.log"; echo "VM died"; exit 1; }
  sleep 1
done
note "VM agent up"
sed -n '/RXEVM: rxe0 ready/,$p' "$W/vm.log" | grep -v '^\s*$' | head -20
GIDX=$(vmx "ibv_devinfo -d rxe0 -v" | awk '/GID\[/ && /::ffff:|0000:0000:0000:0000:0000:ffff:|192\.168\.77\.2/ {gsub(/[^0-9]/,"",$1); print $1; exit}')
GIDX=${GIDX:-1}
note "rxe0 IPv4 GID index $GIDX"

pass=0; fail=0; results=""
record() { # NAME RC
  if [ "$2" -eq 0 ]; then pass=$((pass + 1)); results+="| $1 | pass |"$'\n'; note "PASS $1"
  else fail=$((fail + 1)); results+="| $1 | FAIL (exit $2) |"$'\n'; note "FAIL $1 (exit $2)"; fi
}
MY="--interop --ip 192.168.77.1 --timeout 20"
# ours as server, rdma-core's as client
pp_ours_server() { # TOOL ARGS
  local t=$1; shift
  timeout 60 "$EX/${t}_pingpong" $MY "$@" > "$W/ours.log" 2>&1 & local p=$!
  sleep 0.5
  vmx "ibv_${t}_pingpong -d rxe0 -g $GIDX $* 192.168.77.1"; local r=$?
  wait $p; local o=$?
  sed 's/^/  ours: /' "$W/ours.log"
  [ $r -eq 0 ] && [ $o -eq 0 ]
}
# rdma-core's as server, ours as client
pp_theirs_server() {
  local t=$1; shift
  vmx "ibv_${t}_pingpong -d rxe0 -g $GIDX $*" > "$W/theirs.log" 2>&1 & local p=$!
  sleep 1
  timeout 60 "$EX/${t}_pingpong" $MY "$@" 192.168.77.2; local o=$?
  wait $p; local r=$?
  sed 's/^/  rxe: /' "$W/theirs.log"
  [ $r -eq 0 ] && [ $o -eq 0 ]
}

note "IP IDs on the wire (tshark on rxetap0 during an RC ping-pong)"
tshark -i rxetap0 -f "udp port 4791" -a duration:15 -c 40 -T fields -e ip.src -e ip.id -e ip.flags.df -e infiniband.bth.opcode \
  > "$W/ipid.txt" 2>"$W/tshark.err" & tsp=$!
# tshark starts slowly on a loaded host: start the ping-pong once it is capturing.
for _ in $(seq 1 100); do grep -q "Capturing on" "$W/tshark.err" 2>/dev/null && break; sleep 0.2; done
pp_ours_server rc -n 10 >/dev/null 2>&1
wait $tsp
echo "  src ip.id df opcode (first 40 RoCEv2 packets):"; sed 's/^/  /' "$W/ipid.txt" | head -12
ours_ids=$(awk '$1=="192.168.77.1"{print $2}' "$W/ipid.txt" | sort -u | tr '\n' ' ')
rxe_ids=$(awk '$1=="192.168.77.2"{print $2}' "$W/ipid.txt" | sort -u | wc -l)
echo "  our IP IDs: $ours_ids; distinct rxe IP IDs: $rxe_ids"
[ "$ours_ids" = "0x0000 " ] && [ "$rxe_ids" -gt 1 ]; record "ip-id: ours all 0, rxe's vary" $?

for t in rc uc ud; do
  args="-n 200"; [ $t = ud ] && args="-n 200 -s 512"
  pp_ours_server $t $args; record "ibv_${t}_pingpong client -> our ${t}_pingpong server" $?
  pp_theirs_server $t $args; record "our ${t}_pingpong client -> ibv_${t}_pingpong server" $?
done

# perftest (ib_{write,read,atomic}_bw) against our perftest_peer, both roles.
PT="-s 4096 -n 200"
pt_ours_server() { # VERB ARGS
  local v=$1; shift
  timeout 90 "$EX/perftest_peer" $v --interop --ip 192.168.77.1 --timeout 60 "$@" > "$W/ours.log" 2>&1 & local p=$!
  sleep 0.5
  vmx "ib_${v}_bw -d rxe0 -x $GIDX -F $* 192.168.77.1" > "$W/theirs.log" 2>&1; local r=$?
  wait $p; local o=$?
  sed 's/^/  ours: /' "$W/ours.log"; grep -E '^ *[0-9]+ +[0-9]+ ' "$W/theirs.log" | sed 's/^/  rxe: /'
  [ $r -eq 0 ] || sed 's/^/  rxe: /' "$W/theirs.log" | tail -8
  [ $r -eq 0 ] && [ $o -eq 0 ]
}
pt_theirs_server() {
  local v=$1; shift
  vmx "ib_${v}_bw -d rxe0 -x $GIDX -F $*" > "$W/theirs.log" 2>&1 & local p=$!
  sleep 1.5
  timeout 90 "$EX/perftest_peer" $v --interop --ip 192.168.77.1 --timeout 60 "$@" 192.168.77.2; local o=$?
  wait $p; local r=$?
  grep -E '^ *[0-9]+ +[0-9]+ ' "$W/theirs.log" | sed 's/^/  rxe: /'
  [ $r -eq 0 ] || sed 's/^/  rxe: /' "$W/theirs.log" | tail -8
  [ $r -eq 0 ] && [ $o -eq 0 ]
}
for v in write read atomic; do
  args=$PT; [ $v = atomic ] && args="-n 200"
  pt_ours_server $v $args; record "ib_${v}_bw client -> our perftest_peer $v server" $?
  pt_theirs_server $v $args; record "our perftest_peer $v client -> ib_${v}_bw server" $?
done

for pr in ack-drop ack-drop-all rnr dup-read psn-skip; do
  vmx "./bin/interop peer $pr" > "$W/peer.log" 2>&1 & p=$!
  sleep 0.5
  timeout 90 "$IO" probe $pr 192.168.77.2 192.168.77.1; o=$?
  wait $p; r=$?
  sed 's/^/  rxe: /' "$W/peer.log"
  [ $o -eq 0 ] && [ $r -eq 0 ]; record "probe $pr" $?
done

# The connection manager: unmodified rdmacm-utils on the host, on capi's libraries with
# the device in interop mode, against the same tools on the kernel's rdma_cm in the VM.
CM_ENV="LD_LIBRARY_PATH=$W/capi-lib RDMA_EMU_IP=192.168.77.1 RDMA_EMU_INTEROP=1"
cm_ours_server() { # CHECK SERVER-ARGS -- CLIENT-ARGS: ours serves, the VM's connects
  local check=$1 s=$2 c=$3 tool=${4:-rping}
  env $CM_ENV timeout 45 $tool $s > "$W/ours.log" 2>&1 & local p=$!
  sleep 1
  vmx "timeout 40 $tool $c" > "$W/theirs.log" 2>&1; local r=$?
  wait $p; local o=$?
  sed 's/^/  ours: /' "$W/ours.log" | tail -4; sed 's/^/  rxe: /' "$W/theirs.log" | tail -4
  [ $r -eq 0 ] && [ $o -eq 0 ] && grep -q "$check" "$W/theirs.log"
}
cm_theirs_server() { # CHECK SERVER-ARGS CLIENT-ARGS [TOOL]: the VM's serves, ours connects
  local check=$1 s=$2 c=$3 tool=${4:-rping}
  vmx "timeout 40 $tool $s" > "$W/theirs.log" 2>&1 & local p=$!
  sleep 1.5
  env $CM_ENV timeout 45 $tool $c > "$W/ours.log" 2>&1; local o=$?
  wait $p; local r=$?
  sed 's/^/  ours: /' "$W/ours.log" | tail -4; sed 's/^/  rxe: /' "$W/theirs.log" | tail -4
  [ $r -eq 0 ] && [ $o -eq 0 ] && grep -q "$check" "$W/ours.log"
}
RP="-v -V -C 10"
cm_ours_server "ping data: rdma-ping-9" "-s $RP -a 192.168.77.1" "-c $RP -a 192.168.77.1"
record "rping client (kernel rdma_cm) -> our rping server (capi, interop)" $?
cm_theirs_server "ping data: rdma-ping-9" "-s $RP -a 192.168.77.2" "-c $RP -a 192.168.77.2"
record "our rping client (capi, interop) -> rping server (kernel rdma_cm)" $?
cm_ours_server "test complete" "-b 192.168.77.1" "-s 192.168.77.1" udaddy
record "udaddy client (kernel rdma_cm) -> our udaddy server (capi, interop)" $?
cm_theirs_server "test complete" "-b 192.168.77.2" "-s 192.168.77.2" udaddy
record "our udaddy client (capi, interop) -> udaddy server (kernel rdma_cm)" $?
# Nobody owns 192.168.77.3: the address probe goes unanswered, rping reports
# RDMA_CM_EVENT_ADDR_ERROR and fails.
env $CM_ENV timeout 30 rping -c -a 192.168.77.3 -C 1 > "$W/ours.log" 2>&1; o=$?
sed 's/^/  ours: /' "$W/ours.log" | tail -3
[ $o -ne 0 ] && grep -q "ADDR_ERROR" "$W/ours.log"; record "rping to an address nobody owns: ADDR_ERROR" $?

note "results: $pass passed, $fail failed"
printf '| step | result |\n|---|---|\n%s' "$results" | tee "$W/results.md"
[ "$fail" -eq 0 ]
