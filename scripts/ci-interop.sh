#!/usr/bin/env bash
# CI step: wire interop between the emulator and kernel rxe (docs/interop.md).
#   1. builds the pingpong examples (emu-core) and the interop tool (tests, --features hw),
#   2. boots the rxe VM with NET=tap (guest 192.168.77.2, host 192.168.77.1 on rxetap0;
#      our own test link, no other address is ever a target) running the interop agent,
#   3. runs, each as one step: ibv_{rc,uc,ud}_pingpong against our pingpong examples in
#      both roles, ib_{write,read,atomic}_bw against our perftest_peer in both roles, a capture of the IP IDs on the tap, and the fault probes,
#      and the connection manager: unmodified rping, udaddy, rdma_server/rdma_client,
#      mckey (rdmacm-utils) and ib_{send,write}_bw -R (perftest) on the host, on capi's
#      libibverbs.so.1/librdmacm.so.1 in interop mode (RDMA_EMU_INTEROP=1), against
#      the same tools on the kernel's rdma_cm in the VM, both roles; then the error
#      paths: an address nobody owns (ADDR_ERROR), a port nobody listens on (REJ 8)
#      both ways, and a server stopped with SIGSTOP both ways (the kernel's MRA,
#      ours when the race allows; tshark counts the MADs),
#      then rstream/riostream against librdmacm's rsockets, and RC over IPv6 (fd77::1 on the
#      tap, fd77::2 in the guest: ibv_rc_pingpong and ib_write_bw through capi, both roles),
#   4. fails if any step failed twice (a step that fails is run once more; see `step`).
# The VM boot waits for /tmp/rxe-vm.lock (one VM at a time on the host; do not wrap
# this script in that lock as well), and the steps start only once the VM that
# answers shows this run's token. Needs root (tap device, raw socket). Env: RXEVM_W (the cached VM image; default
# /work/rxevm-cache), INTEROP_W (this job's VM folder; default $RXEVM_W-interop),
# ACCEL=tcg|kvm (default tcg; kvm fails in nested setups), INTEROP_ONLY=REGEX (run only
# the steps whose name matches).
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
cargo build -q --release -p verbs-conformance --features hw --example interop || exit 1
"$REPO/capi/build-so.sh" --release "$W/capi-lib" >/dev/null || exit 1
EX=$TGT/release/examples
cp "$EX/interop" "$W/share/bin/interop"
IO=$EX/interop

note "boot the VM (NET=tap, ACCEL=$ACCEL; waits for /tmp/rxe-vm.lock)"
# One VM at a time on this host: the boot waits for the lock. Every VM answers on
# 192.168.77.2, so a VM of another job may answer while ours waits for the lock: ours
# is the one that shows the token written into our own share (/mnt/host in the guest).
TOKEN="ci-interop-$$-$(date +%s%N)"
echo "$TOKEN" > "$W/share/vm-token"
W="$W" NET=tap TIMEOUT=600 flock /tmp/rxe-vm.lock "$REPO/scripts/rxe-vm/run-rxe-vm.sh" "$REPO/scripts/interop/job.sh" > "$W/vm.log" 2>&1 &
vmpid=$!
ours_up=0
cleanup() {
  # Only our own VM is told to power off; a boot still waiting for the lock is dropped.
  if [ "$ours_up" = 1 ]; then "$IO" vm 192.168.77.2:7000 exit >/dev/null 2>&1; else kill "$vmpid" 2>/dev/null; fi
  wait "$vmpid" 2>/dev/null
}
trap cleanup EXIT
vmx() { timeout 120 "$IO" vm 192.168.77.2:7000 "$@"; }
# Our agent is up once it answers with our token (up to 15 min: the lock may be held).
for _ in $(seq 1 900); do
  # (Read whole, not piped into grep -q: with pipefail an early grep exit fails the check.)
  answer=$(timeout 5 "$IO" vm 192.168.77.2:7000 "cat /mnt/host/vm-token" 2>/dev/null)
  if [ "${answer%%$'\n'*}" = "$TOKEN" ]; then ours_up=1; break; fi
  kill -0 "$vmpid" 2>/dev/null || { cat "$W/vm.log"; echo "VM died"; exit 1; }
  sleep 1
done
[ "$ours_up" = 1 ] || { echo "our VM never answered"; exit 1; }
note "VM agent up"
sed -n '/RXEVM: rxe0 ready/,$p' "$W/vm.log" | grep -v '^\s*$' | head -20
GIDX=$(vmx "ibv_devinfo -d rxe0 -v" | awk '/GID\[/ && /::ffff:|0000:0000:0000:0000:0000:ffff:|192\.168\.77\.2/ {gsub(/[^0-9]/,"",$1); print $1; exit}')
GIDX=${GIDX:-1}
note "rxe0 IPv4 GID index $GIDX"

pass=0; fail=0; retried=0; results=""
record() { # NAME RC [NOTE]
  if [ "$2" -eq 0 ]; then pass=$((pass + 1)); results+="| $1 | pass${3:+ ($3)} |"$'\n'; note "PASS $1${3:+ ($3)}"
  else fail=$((fail + 1)); results+="| $1 | FAIL (exit $2) |"$'\n'; note "FAIL $1 (exit $2)"; fi
}
# Runs a step, and once more if it fails: the VM is software-emulated on a shared host
# and several steps pace the two sides with sleeps, so a slow moment can fail a step
# that is right. A step that fails twice fails; one that needed the second run says so
# in its result line and in the count at the end.
step() { # NAME CMD [ARGS...]
  local name=$1; shift
  # INTEROP_ONLY=REGEX runs only the steps whose name matches (a partial run).
  if [ -n "${INTEROP_ONLY:-}" ] && ! [[ $name =~ $INTEROP_ONLY ]]; then return 0; fi
  "$@"; local rc=$?
  if [ $rc -ne 0 ]; then
    note "RETRY $name (first run: exit $rc)"
    "$@"; rc=$?
    [ $rc -ne 0 ] || retried=$((retried + 1))
    record "$name" $rc "on the second run"
  else
    record "$name" $rc
  fi
}
MY="--interop --ip 192.168.77.1 --timeout 20"
# How our side runs: interop mode (raw receive socket, root) first; the default mode
# (a plain UDP socket, no privilege) at the end sets these again.
PT_MODE="--interop"; AS=""
# ours as server, rdma-core's as client
pp_ours_server() { # TOOL ARGS
  local t=$1; shift
  $AS timeout 60 "$EX/${t}_pingpong" $MY "$@" > "$W/ours.log" 2>&1 & local p=$!
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
  $AS timeout 60 "$EX/${t}_pingpong" $MY "$@" 192.168.77.2; local o=$?
  wait $p; local r=$?
  sed 's/^/  rxe: /' "$W/theirs.log"
  [ $r -eq 0 ] && [ $o -eq 0 ]
}

ipid_step() {
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
[ "$ours_ids" = "0x0000 " ] && [ "$rxe_ids" -gt 1 ]
}
note "IP IDs on the wire (tshark on rxetap0 during an RC ping-pong)"
step "ip-id: ours all 0, rxe's vary" ipid_step

for t in rc uc ud; do
  args="-n 200"; [ $t = ud ] && args="-n 200 -s 512"
  step "ibv_${t}_pingpong client -> our ${t}_pingpong server" pp_ours_server $t $args
  step "our ${t}_pingpong client -> ibv_${t}_pingpong server" pp_theirs_server $t $args
done

# perftest (ib_{write,read,atomic}_bw) against our perftest_peer, both roles.
PT="-s 4096 -n 200"
pt_ours_server() { # VERB ARGS
  local v=$1; shift
  $AS timeout 90 "$EX/perftest_peer" $v $PT_MODE --ip 192.168.77.1 --timeout 60 "$@" > "$W/ours.log" 2>&1 & local p=$!
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
  $AS timeout 90 "$EX/perftest_peer" $v $PT_MODE --ip 192.168.77.1 --timeout 60 "$@" 192.168.77.2; local o=$?
  wait $p; local r=$?
  grep -E '^ *[0-9]+ +[0-9]+ ' "$W/theirs.log" | sed 's/^/  rxe: /'
  [ $r -eq 0 ] || sed 's/^/  rxe: /' "$W/theirs.log" | tail -8
  [ $r -eq 0 ] && [ $o -eq 0 ]
}
for v in write read atomic; do
  args=$PT; [ $v = atomic ] && args="-n 200"
  step "ib_${v}_bw client -> our perftest_peer $v server" pt_ours_server $v $args
  step "our perftest_peer $v client -> ib_${v}_bw server" pt_theirs_server $v $args
done

probe() { # PROBE
  vmx "./bin/interop peer $1" > "$W/peer.log" 2>&1 & local p=$!
  sleep 0.5
  timeout 90 "$IO" probe $1 192.168.77.2 192.168.77.1; local o=$?
  wait $p; local r=$?
  sed 's/^/  rxe: /' "$W/peer.log"
  [ $o -eq 0 ] && [ $r -eq 0 ]
}
for pr in ack-drop ack-drop-all rnr dup-read psn-skip; do
  step "probe $pr" probe $pr
done

# The connection manager: unmodified rdmacm-utils and perftest on the host, on capi's
# libraries with the device in interop mode, against the same tools on the kernel's
# rdma_cm in the VM. Our side must also print no "rdma-emu librdmacm:" error.
CM_ENV="LD_LIBRARY_PATH=$W/capi-lib RDMA_EMU_IP=192.168.77.1 RDMA_EMU_INTEROP=1"
clean_ours() { ! grep -q "rdma-emu librdmacm:" "$W/ours.log"; }
cm_ours_server() { # CHECK SERVER-CMD CLIENT-CMD: ours serves, the VM's connects; CHECK in the client's output
  local check=$1 s=$2 c=$3
  $AS env $CM_ENV timeout 45 $s > "$W/ours.log" 2>&1 & local p=$!
  sleep 1
  vmx "timeout 40 $c" > "$W/theirs.log" 2>&1; local r=$?
  wait $p; local o=$?
  sed 's/^/  ours: /' "$W/ours.log" | tail -4; sed 's/^/  rxe: /' "$W/theirs.log" | tail -4
  [ $r -eq 0 ] && [ $o -eq 0 ] && grep -Eq "$check" "$W/theirs.log" && clean_ours
}
cm_theirs_server() { # CHECK SERVER-CMD CLIENT-CMD: the VM's serves, ours connects; CHECK in ours
  local check=$1 s=$2 c=$3
  vmx "timeout 40 $s" > "$W/theirs.log" 2>&1 & local p=$!
  sleep 1.5
  $AS env $CM_ENV timeout 45 $c > "$W/ours.log" 2>&1; local o=$?
  wait $p; local r=$?
  sed 's/^/  ours: /' "$W/ours.log" | tail -4; sed 's/^/  rxe: /' "$W/theirs.log" | tail -4
  [ $r -eq 0 ] && [ $o -eq 0 ] && grep -Eq "$check" "$W/ours.log" && clean_ours
}
RP="-v -V -C 10"
step "rping client (kernel rdma_cm) -> our rping server (capi, interop)" cm_ours_server "ping data: rdma-ping-9" "rping -s $RP -a 192.168.77.1" "rping -c $RP -a 192.168.77.1"
step "our rping client (capi, interop) -> rping server (kernel rdma_cm)" cm_theirs_server "ping data: rdma-ping-9" "rping -s $RP -a 192.168.77.2" "rping -c $RP -a 192.168.77.2"
step "udaddy client (kernel rdma_cm) -> our udaddy server (capi, interop)" cm_ours_server "test complete" "udaddy -b 192.168.77.1" "udaddy -s 192.168.77.1"
step "our udaddy client (capi, interop) -> udaddy server (kernel rdma_cm)" cm_theirs_server "test complete" "udaddy -b 192.168.77.2" "udaddy -s 192.168.77.2"
# Synchronous ids (no event channel), rdma_getaddrinfo, rdma_create_ep, rdma_get_request
# and the convenience verbs (rdma_post_send/recv, rdma_get_send/recv_comp).
step "rdma_client (kernel rdma_cm) -> our rdma_server (capi, interop)" cm_ours_server "rdma_client: end 0" "rdma_server -s 192.168.77.1" "rdma_client -s 192.168.77.1"
step "our rdma_client (capi, interop) -> rdma_server (kernel rdma_cm)" cm_theirs_server "rdma_client: end 0" "rdma_server -s 192.168.77.2" "rdma_client -s 192.168.77.2"
# rsockets: librdmacm's rsocket.c over rxe in the VM against capi's rsockets, each
# side speaking rsockets' protocol (connection data, credits, SGL updates, iomap
# entries); rstream byte-checked (-T v) blocking and non-blocking, riostream with
# riowrite into the other side's riomap.
RS="-T b -T v -S 65536 -C 20 -I 5"
RSN="-T v -S 3000 -C 50 -I 5"
RIO="-T b -T v -S 65536 -C 10 -I 5"
step "rstream client (kernel rxe, librdmacm rsockets) -> our rstream server (capi, interop)" cm_ours_server "^custom" "rstream -b 192.168.77.1 -p 7481 $RS" "rstream -s 192.168.77.1 -p 7481 $RS"
step "our rstream client (capi, interop) -> rstream server (kernel rxe, librdmacm rsockets)" cm_theirs_server "^custom" "rstream -b 192.168.77.2 -p 7482 $RS" "rstream -s 192.168.77.2 -p 7482 $RS"
step "rstream client, non-blocking (kernel rxe) -> our rstream server (capi, interop)" cm_ours_server "^custom" "rstream -b 192.168.77.1 -p 7483 $RSN" "rstream -s 192.168.77.1 -p 7483 $RSN"
step "our rstream client, non-blocking (capi, interop) -> rstream server (kernel rxe)" cm_theirs_server "^custom" "rstream -b 192.168.77.2 -p 7484 $RSN" "rstream -s 192.168.77.2 -p 7484 $RSN"
step "riostream client (kernel rxe, librdmacm rsockets) -> our riostream server (capi, interop)" cm_ours_server "^custom" "riostream -b 192.168.77.1 -p 7485 $RIO" "riostream -s 192.168.77.1 -p 7485 $RIO"
step "our riostream client (capi, interop) -> riostream server (kernel rxe, librdmacm rsockets)" cm_theirs_server "^custom" "riostream -b 192.168.77.2 -p 7486 $RIO" "riostream -s 192.168.77.2 -p 7486 $RIO"
# Multicast: the receiver joins 239.255.7.1 and waits for 10 datagrams (QPN 0xFFFFFF,
# sent to the IPv4 group over the tap); the sender joins, pauses 3 s and sends them.
# Only the other side sends to the group, so the receiver's "data transfers complete"
# means the datagrams crossed.
mckey_theirs_receive() {
  cm_theirs_server "data transfers complete" "mckey -m 239.255.7.1 -b 192.168.77.2 -C 10" "mckey -s -m 239.255.7.1 -b 192.168.77.1 -C 10" \
    && grep -q "data transfers complete" "$W/theirs.log"
}
mckey_ours_receive() {
  cm_ours_server "data transfers complete" "mckey -m 239.255.7.2 -b 192.168.77.1 -C 10" "mckey -s -m 239.255.7.2 -b 192.168.77.2 -C 10" \
    && grep -q "data transfers complete" "$W/ours.log"
}
step "our mckey sender (capi, interop) -> mckey receiver (kernel rdma_cm), 239.255.7.1" mckey_theirs_receive
step "mckey sender (kernel rdma_cm) -> our mckey receiver (capi, interop), 239.255.7.2" mckey_ours_receive
# perftest -R (rdma_cm sets up both of perftest's connections). perftest 4.5-0.17 has a
# listen race of its own (capi/README.md): its client may send the data connection's
# REQ before its server's second rdma_listen; the listener's CM (the kernel's or ours)
# then answers REJ "invalid service ID" and perftest's retry of that cannot work. A run
# that failed with exactly that REJ is run again (up to 5 times, each retry printed).
pt_R() { # VERB OURS-ROLE(server|client)
  local v=$1 role=$2 try port o r log
  for try in 1 2 3 4 5; do
    port=$((18600 + try))
    if [ "$role" = server ]; then
      env $CM_ENV timeout 60 ib_${v}_bw -R -p $port -n 200 -s 4096 > "$W/ours.log" 2>&1 & local p=$!
      sleep 1
      vmx "timeout 50 ib_${v}_bw -R -d rxe0 -p $port -n 200 -s 4096 192.168.77.1" > "$W/theirs.log" 2>&1; r=$?
      log=$W/theirs.log
      if [ $r -ne 0 ] && [ $try -lt 5 ] && grep -q "RDMA_CM_EVENT_REJECTED; error: 8" "$log"; then
        kill $p 2>/dev/null; wait $p 2>/dev/null; echo "  RETRY: perftest's REQ came before its server's rdma_listen (REJ 8)"; continue
      fi
      wait $p; o=$?
    else
      vmx "sh -c 'echo \$\$ > /tmp/pt-server.pid; exec timeout 50 ib_${v}_bw -R -d rxe0 -p $port -n 200 -s 4096'" > "$W/theirs.log" 2>&1 & local p=$!
      sleep 2
      env $CM_ENV timeout 60 ib_${v}_bw -R -p $port -n 200 -s 4096 192.168.77.2 > "$W/ours.log" 2>&1; o=$?
      log=$W/ours.log
      if [ $o -ne 0 ] && [ $try -lt 5 ] && grep -q "RDMA_CM_EVENT_REJECTED; error: 8" "$log"; then
        # Our perftest exited without a DREQ for its first (exchange) connection, which
        # the kernel still holds. The next process's QP has the same QPN, so its REQ
        # would get REJ "stale connection" (10). So: end the VM's server while a CM of
        # ours runs to answer the kernel's DREQ for it, then try again on another port.
        env $CM_ENV timeout 15 rping -s -a 192.168.77.1 -p 7999 > /dev/null 2>&1 & local h=$!
        sleep 1
        vmx 'kill $(cat /tmp/pt-server.pid)' > /dev/null; wait $p 2>/dev/null
        sleep 3; kill $h 2>/dev/null; wait $h 2>/dev/null
        echo "  RETRY: perftest's REQ came before its server's rdma_listen (REJ 8)"; continue
      fi
      wait $p; r=$?
    fi
    grep -E '^ *4096 +200 ' "$log" | sed 's/^/  /'
    [ $r -eq 0 ] || sed 's/^/  rxe: /' "$W/theirs.log" | tail -8
    [ $o -eq 0 ] || sed 's/^/  ours: /' "$W/ours.log" | tail -8
    [ $r -eq 0 ] && [ $o -eq 0 ] && grep -Eq '^ *4096 +200 ' "$log" && clean_ours
    return
  done
}
for v in send write; do
  step "ib_${v}_bw -R client (kernel rdma_cm) -> our ib_${v}_bw -R server (capi, interop)" pt_R $v server
  step "our ib_${v}_bw -R client (capi, interop) -> ib_${v}_bw -R server (kernel rdma_cm)" pt_R $v client
done
# Nobody owns 192.168.77.3: the address probe goes unanswered, rping reports
# RDMA_CM_EVENT_ADDR_ERROR and fails.
addr_error() {
  env $CM_ENV timeout 30 rping -c -a 192.168.77.3 -C 1 > "$W/ours.log" 2>&1; local o=$?
  sed 's/^/  ours: /' "$W/ours.log" | tail -3
  [ $o -ne 0 ] && grep -q "ADDR_ERROR" "$W/ours.log"
}
step "rping to an address nobody owns: ADDR_ERROR" addr_error
# Nobody listens on port 9999: the kernel's CM answers our REQ with REJ "invalid service
# ID" (IBTA 12.6.7 reason 8), rping reports RDMA_CM_EVENT_REJECTED with status 8.
kernel_rej8() {
  env $CM_ENV timeout 30 rping -c -v -C 1 -a 192.168.77.2 -p 9999 > "$W/ours.log" 2>&1; local o=$?
  sed 's/^/  ours: /' "$W/ours.log" | tail -3
  [ $o -ne 0 ] && grep -q "RDMA_CM_EVENT_REJECTED, error 8" "$W/ours.log" && clean_ours
}
step "our rping client -> VM port nobody listens on: kernel REJ 8, REJECTED status 8" kernel_rej8
# And the other way: our CM (a process with a listener on 7174, so a CM runs) answers a
# REQ for port 9999 with REJ 8, and the kernel's rping reports it.
our_rej8() {
  env $CM_ENV timeout 30 rping -s -v -C 1 -a 192.168.77.1 -p 7174 > "$W/ours.log" 2>&1 & local p=$!
  sleep 1
  vmx "timeout 20 rping -c -v -C 1 -a 192.168.77.1 -p 9999" > "$W/theirs.log" 2>&1; local r=$?
  kill $p 2>/dev/null; wait $p 2>/dev/null
  sed 's/^/  rxe: /' "$W/theirs.log" | tail -3
  [ $r -ne 0 ] && grep -q "RDMA_CM_EVENT_REJECTED, error 8" "$W/theirs.log" && clean_ours
}
step "kernel rping client -> our port nobody listens on: our REJ 8, REJECTED status 8" our_rej8

# MRA (IBTA 12.6.6) both ways. A server stopped (SIGSTOP) right after rdma_listen leaves
# its CM with a REQ nobody has accepted; the client's CM resends the REQ after its
# response timeout (about 4.3 s for rdma_cm's 20), the stopped side's CM answers the
# duplicate with an MRA, and the server, continued, accepts. tshark shows the CM MADs
# (attribute 0x0010 REQ, 0x0011 MRA).
mads() { # FILE SECONDS: capture the CM MADs on the tap in the background ($tsp)
  tshark -i rxetap0 -f "udp port 4791" -a duration:$2 -Y "infiniband.bth.destqp == 1" \
    -T fields -e frame.time_relative -e ip.src -e infiniband.mad.attributeid > "$1" 2>"$1.err" & tsp=$!
  for _ in $(seq 1 100); do grep -q "Capturing on" "$1.err" 2>/dev/null && break; sleep 0.2; done
}
count() { awk -v s="$2" -v a="$3" '$2==s && $3==a' "$1" | wc -l; }
# The kernel's MRA: its rdma_cm arms a delayed MRA for every REQ its user has not yet
# accepted (cma.c, CMA_CM_MRA_SETTING) and cm.c sends it for a duplicate REQ. Stopped
# for 12.5 s; our REQ (t ~4 s) and its resend (~8.3 s) get the MRA (service timeout 24,
# about 69 s); had we not honoured it, a third REQ would leave at ~12.6 s, before the
# server continues (~15 s). So: exactly two REQs from us, one MRA from the kernel.
kernel_mra() {
  mads "$W/mads1.txt" 40
  vmx 'timeout 40 sh -c "rping -s -v -V -C 3 -a 192.168.77.2 & p=\$!; sleep 2.5; kill -STOP \$p; sleep 12.5; kill -CONT \$p; wait \$p"' > "$W/theirs.log" 2>&1 & local p=$!
  sleep 4
  env $CM_ENV timeout 45 rping -c -v -V -C 3 -a 192.168.77.2 > "$W/ours.log" 2>&1; local o=$?
  wait $p; local r=$?; sleep 1; kill -INT $tsp 2>/dev/null; wait $tsp
  sed 's/^/  mad: /' "$W/mads1.txt"
  local reqs mras
  reqs=$(count "$W/mads1.txt" 192.168.77.1 0x0010); mras=$(count "$W/mads1.txt" 192.168.77.2 0x0011)
  echo "  our REQs: $reqs, kernel MRAs: $mras"
  [ $o -eq 0 ] && [ $r -eq 0 ] && grep -q "ping data: rdma-ping-2" "$W/ours.log" && [ "$reqs" -eq 2 ] && [ "$mras" -ge 1 ] && clean_ours
}
step "kernel MRA: our rping client waits for a stopped kernel rping server" kernel_mra
# Our server stopped: the kernel's REQ and its resend (~6.3 s) wait in our sockets; once
# continued, the connection must complete. Our CM answers the duplicate with an MRA when
# it takes it before rping has accepted (most runs), else the REP answers both: a race
# between our CM thread and rping, so the MRA count is printed, not required.
our_mra() {
  mads "$W/mads2.txt" 30
  env $CM_ENV timeout 45 rping -s -v -C 3 -a 192.168.77.1 > "$W/ours.log" 2>&1 & local p=$!
  sleep 1
  local sp; sp=$(pgrep -P $p rping); kill -STOP $sp
  vmx "timeout 40 rping -c -v -V -C 3 -a 192.168.77.1" > "$W/theirs.log" 2>&1 & local q=$!
  sleep 9; kill -CONT $sp
  wait $q; local r=$?; wait $p; local o=$?; sleep 1; kill -INT $tsp 2>/dev/null; wait $tsp
  sed 's/^/  mad: /' "$W/mads2.txt"
  echo "  our MRAs: $(count "$W/mads2.txt" 192.168.77.1 0x0011) (0 if rping accepted before our CM took the duplicate REQ)"
  [ $o -eq 0 ] && [ $r -eq 0 ] && grep -q "ping data: rdma-ping-2" "$W/theirs.log" && clean_ours
}
step "kernel rping client to our stopped rping server: connects after the REQ resend" our_mra

# The default mode: the same traffic with our side on a plain UDP socket, as a user
# without privileges (nobody) where the build is readable to one. Our datagrams now
# leave from a connected socket with non-zero IP IDs and GSO runs, each ICRC computed
# with its ID (rxe drops any other); rxe's are checked with the ID solved from the ICRC.
note "default mode (no raw socket)"
MY="--ip 192.168.77.1 --timeout 20"; PT_MODE=""
CM_ENV="LD_LIBRARY_PATH=$W/capi-lib RDMA_EMU_IP=192.168.77.1"
AS=""
if command -v setpriv >/dev/null \
   && setpriv --reuid=65534 --regid=65534 --clear-groups -- test -x "$EX/rc_pingpong" -a -r "$W/capi-lib/libibverbs.so.1"; then
  AS="setpriv --reuid=65534 --regid=65534 --clear-groups --"
  note "our side runs as nobody"
else
  note "our side runs as root: the build is not readable to nobody"
fi
ipid_default() {
  tshark -i rxetap0 -f "udp port 4791" -a duration:15 -c 40 -T fields -e ip.src -e ip.id \
    > "$W/ipid2.txt" 2>"$W/tshark2.err" & tsp=$!
  for _ in $(seq 1 100); do grep -q "Capturing on" "$W/tshark2.err" 2>/dev/null && break; sleep 0.2; done
  pp_ours_server rc -n 10 >/dev/null 2>&1; local o=$?
  wait $tsp
  local ours; ours=$(awk '$1=="192.168.77.1"{print $2}' "$W/ipid2.txt" | sort -u | wc -l)
  echo "  distinct IP IDs of ours: $ours (a connected socket numbers them)"
  [ $o -eq 0 ] && [ "$ours" -gt 1 ]
}
step "ip-id, default mode: ours numbered, and rxe accepts them" ipid_default
for t in rc uc ud; do
  args="-n 200"; [ $t = ud ] && args="-n 200 -s 512"
  step "ibv_${t}_pingpong client -> our ${t}_pingpong server (default mode)" pp_ours_server $t $args
  step "our ${t}_pingpong client -> ibv_${t}_pingpong server (default mode)" pp_theirs_server $t $args
done
for v in write read atomic; do
  args="-s 65536 -n 200"; [ $v = atomic ] && args="-n 200"
  step "ib_${v}_bw client -> our perftest_peer $v server (default mode)" pt_ours_server $v $args
  step "our perftest_peer $v client -> ib_${v}_bw server (default mode)" pt_theirs_server $v $args
done
step "rping client (kernel rdma_cm) -> our rping server (capi, default mode)" cm_ours_server "ping data: rdma-ping-9" "rping -s $RP -a 192.168.77.1" "rping -c $RP -a 192.168.77.1"
step "our rping client (capi, default mode) -> rping server (kernel rdma_cm)" cm_theirs_server "ping data: rdma-ping-9" "rping -s $RP -a 192.168.77.2" "rping -c $RP -a 192.168.77.2"
step "udaddy client (kernel rdma_cm) -> our udaddy server (capi, default mode)" cm_ours_server "test complete" "udaddy -b 192.168.77.1" "udaddy -s 192.168.77.1"
step "our udaddy client (capi, default mode) -> udaddy server (kernel rdma_cm)" cm_theirs_server "test complete" "udaddy -b 192.168.77.2" "udaddy -s 192.168.77.2"

# IPv6: host fd77::1 and guest fd77::2 on the tap link (nodad: usable at once, no
# duplicate address detection to wait for). rxe adds the address's RoCEv2 GID when it
# appears (after fe80:: and the IPv4-mapped one); our side is capi's libibverbs.so.1
# in the default mode (interop mode reads IPv4 headers only; IPv6 has no IP ID to
# match). The tools' own TCP exchange goes over IPv4 (ibv_*_pingpong's server binds
# getaddrinfo's first passive address, 0.0.0.0, so an IPv6 connect never reaches it,
# and perftest's exchange is IPv4): the GIDs they exchange, and so every RoCE packet,
# are IPv6, which the tools print (ibv_rc_pingpong: "GID fd77::2"; perftest: both
# GIDs as decimal bytes, "GID: 253:119:...").
V6_ENV="LD_LIBRARY_PATH=$W/capi-lib RDMA_EMU_IP=fd77::1"
G6=""
v6_setup() {
  ip -6 addr replace fd77::1/64 dev rxetap0 nodad || return 1
  vmx "ip -6 addr replace fd77::2/64 dev eth0 nodad" || return 1
  local i
  for i in $(seq 1 20); do
    G6=$(vmx "ibv_devinfo -d rxe0 -v" | sed -n 's/.*GID\[ *\([0-9]*\)\]:[[:space:]]*fd77::2.*/\1/p' | head -1)
    [ -n "$G6" ] && break
    sleep 0.5
  done
  echo "  rxe0 GID index of fd77::2: ${G6:-none}"
  [ -n "$G6" ]
}
v6_pp_ours_server() { # PORT
  env $V6_ENV timeout 60 ibv_rc_pingpong -g 0 -p $1 -n 200 > "$W/ours.log" 2>&1 & local p=$!
  sleep 1
  vmx "ibv_rc_pingpong -d rxe0 -g $G6 -p $1 -n 200 192.168.77.1" > "$W/theirs.log" 2>&1; local r=$?
  wait $p; local o=$?
  sed 's/^/  ours: /' "$W/ours.log"; sed 's/^/  rxe: /' "$W/theirs.log" | tail -3
  [ $r -eq 0 ] && [ $o -eq 0 ] && grep -q "remote address:.*GID fd77::2" "$W/ours.log"
}
v6_pp_theirs_server() { # PORT
  vmx "ibv_rc_pingpong -d rxe0 -g $G6 -p $1 -n 200" > "$W/theirs.log" 2>&1 & local p=$!
  sleep 1.5
  env $V6_ENV timeout 60 ibv_rc_pingpong -g 0 -p $1 -n 200 192.168.77.2 > "$W/ours.log" 2>&1; local o=$?
  wait $p; local r=$?
  sed 's/^/  ours: /' "$W/ours.log"; sed 's/^/  rxe: /' "$W/theirs.log" | tail -3
  [ $r -eq 0 ] && [ $o -eq 0 ] && grep -q "remote address:.*GID fd77::2" "$W/ours.log"
}
V6_BW="-F -s 65536 -n 200"
v6_bw_ours_server() { # PORT
  env $V6_ENV timeout 90 ib_write_bw -x 0 -p $1 $V6_BW > "$W/ours.log" 2>&1 & local p=$!
  sleep 1
  vmx "ib_write_bw -d rxe0 -x $G6 -p $1 $V6_BW 192.168.77.1" > "$W/theirs.log" 2>&1; local r=$?
  wait $p; local o=$?
  grep -E 'GID|^ *65536 ' "$W/ours.log" | sed 's/^/  ours: /'; [ $r -eq 0 ] || sed 's/^/  rxe: /' "$W/theirs.log" | tail -8
  [ $r -eq 0 ] && [ $o -eq 0 ] && [ "$(grep -c 'GID: 253:119:' "$W/ours.log")" -ge 2 ]
}
v6_bw_theirs_server() { # PORT
  vmx "ib_write_bw -d rxe0 -x $G6 -p $1 $V6_BW" > "$W/theirs.log" 2>&1 & local p=$!
  sleep 1.5
  env $V6_ENV timeout 90 ib_write_bw -x 0 -p $1 $V6_BW 192.168.77.2 > "$W/ours.log" 2>&1; local o=$?
  wait $p; local r=$?
  grep -E 'GID|^ *65536 ' "$W/ours.log" | sed 's/^/  ours: /'; [ $r -eq 0 ] || sed 's/^/  rxe: /' "$W/theirs.log" | tail -8
  [ $r -eq 0 ] && [ $o -eq 0 ] && [ "$(grep -c 'GID: 253:119:' "$W/ours.log")" -ge 2 ]
}
trap 'ip -6 addr del fd77::1/64 dev rxetap0 2>/dev/null; cleanup' EXIT
step "IPv6: fd77::1 (host) and fd77::2 (guest) on the tap link, rxe0's GID of fd77::2" v6_setup
if [ -n "$G6" ]; then
  step "IPv6: ibv_rc_pingpong client (rxe) -> our ibv_rc_pingpong server (capi)" v6_pp_ours_server 18610
  step "IPv6: our ibv_rc_pingpong client (capi) -> ibv_rc_pingpong server (rxe)" v6_pp_theirs_server 18611
  step "IPv6: ib_write_bw client (rxe) -> our ib_write_bw server (capi)" v6_bw_ours_server 18612
  step "IPv6: our ib_write_bw client (capi) -> ib_write_bw server (rxe)" v6_bw_theirs_server 18613
fi

note "results: $pass passed ($retried of them on a second run), $fail failed"
printf '| step | result |\n|---|---|\n%s' "$results" | tee "$W/results.md"
[ "$fail" -eq 0 ]
