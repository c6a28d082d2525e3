#!/usr/bin/env bash
# CI step: other people's RDMA software, unmodified (Debian 12 packages), on the
# emulator through `rdma-emu exec` (docs/clients.md):
#   UCX 1.13        ucx_info -d; ucx_perftest tag_lat, tag_bw, put_bw, am_bw over
#                   rc_verbs and over ud_verbs (two processes, 127.0.0.1 and .2)
#   libfabric 1.17  fi_info -p verbs; fi_pingpong over verbs (dgram, msg) and
#                   verbs;ofi_rxm / verbs;ofi_rxd (rdm)
#   pyverbs         rdma-core v44.0's tests/test_rdmacm.py (needs the suite's tarball,
#                   as scripts/ci-pyverbs.sh)
#   Open MPI 4.1    mpirun -np 2 --mca pml ucx, an MPI ping-pong over ud_verbs and
#                   rc_verbs, each rank its own device
# plus the launcher's own tests (cargo test -p rdma-emu --test exec, with the library).
#   scripts/ci-stacks.sh            # installs its packages if missing (apt-get)
# Every step runs under timeout and prints one line:
#   PASS   it did what the stack does on a real RoCE device
#   KNOWN  it fails for a cause written down in docs/clients.md (an emulator gap in
#          code this script does not own); the line names the cause. When the cause
#          is fixed the step prints PASS, and its KNOWN rule should be removed.
#   FAIL   anything else; the script then exits 1.
# Needs user namespaces (rdma-emu exec); where there are none every step says so and
# the script exits 1. STACKS_ONLY="ucx pyverbs" runs only those groups (launcher, ucx,
# libfabric, pyverbs, mpi).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
tar=${PYVERBS_TESTS:-$root/../shared/thirdparty/rdma-core-v44.0-tests.tar.gz}
T=${STACKS_TIMEOUT:-60}
start=$(date +%s)

pkgs="ucx-utils libucx0 libfabric-bin libfabric1 ibverbs-utils iproute2 python3-pyverbs openmpi-bin libopenmpi-dev"
missing=$(for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086
  apt-get install -y -qq $missing >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq $missing >/dev/null; } ||
    { echo "FAIL install: $missing"; exit 1; }
fi

work=$(mktemp -d /tmp/ci-stacks.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$root/capi/build-so.sh" --release "$work/lib" >/dev/null || { echo "FAIL build libibverbs.so.1"; exit 1; }
# The launcher only sets up namespaces and files: a debug build does.
cargo build -q -p rdma-emu --manifest-path "$root/Cargo.toml" || { echo "FAIL build rdma-emu"; exit 1; }
emu=$CARGO_TARGET_DIR/debug/rdma-emu
export RDMA_EMU_LIB=$work/lib
unset RDMA_EMU_DEVICES RDMA_EMU_CONFIG RDMA_EMU_IP

only=${STACKS_ONLY:-launcher ucx libfabric pyverbs mpi}
want() { [[ " $only " == *" $1 "* ]]; }
failed=()
npass=0
nknown=0
# result NAME STATUS DETAIL: prints the line and counts it.
result() {
  case $2 in
    PASS) npass=$((npass + 1)) ;;
    KNOWN) nknown=$((nknown + 1)) ;;
    *) failed+=("$1") ;;
  esac
  printf '%-6s %-34s %s\n' "$2" "$1" "$3"
}
# show LOG: the end of a failing step's log, indented.
show() { tail -n "${2:-15}" "$1" | sed 's/^/        /'; }

# --- the launcher itself ---------------------------------------------------------
log=$work/launcher.log
if ! want launcher; then :
elif (cd "$root" && timeout 600 cargo test -q -p rdma-emu --test exec -- --nocapture) >"$log" 2>&1; then
  if grep -q "SKIPPED" "$log"; then
    result launcher-tests FAIL "skipped: $(grep -m1 SKIPPED "$log")"
  else
    result launcher-tests PASS "$(grep -Eo 'test result: .*' "$log" | head -1)"
  fi
else
  result launcher-tests FAIL "cargo test -p rdma-emu --test exec"; show "$log" 30
fi

# --- UCX ---------------------------------------------------------------------------
log=$work/ucx_info.log
have() { grep -A1 "Transport: $1\$" "$log" | grep -q "Device: emu0:1"; }
if want ucx; then
  timeout "$T" "$emu" exec --ip 127.0.0.1 -- ucx_info -d >"$log" 2>&1
  rc=$?
  if [ $rc = 0 ] && have rc_verbs && have ud_verbs; then
    result ucx_info PASS "rc_verbs and ud_verbs on emu0:1"
  else
    result ucx_info FAIL "exit $rc"; show "$log"
  fi
fi

# ucx_pair NAME TLS TRANSPORT ARGS...: ucx_perftest server on 127.0.0.1, client on
# 127.0.0.2 with ARGS; the client's "Final:" line is the result.
ucx_port=13400
ucx_pair() {
  want ucx || return 0
  local name=$1 tls=$2 tl=$3; shift 3
  local s=$work/$name.server.log c=$work/$name.client.log
  ucx_port=$((ucx_port + 1))
  # UD: emu-core reports wc.sl = 0 for RoCEv2/IPv4 UD receives, which UCX reads as
  # "GRH layout" and so drops every packet in its destination-GID check
  # (docs/clients.md); the check is switched off until the emulator says IPv4.
  local env=(UCX_TLS="$tls" UCX_NET_DEVICES=emu0:1)
  # (Subshells, so that bash's "Segmentation fault" notices stay out of the output.)
  (env "${env[@]}" timeout "$T" "$emu" exec --ip 127.0.0.1 -- ucx_perftest -p $ucx_port >"$s" 2>&1; exit $?) 2>/dev/null &
  local spid=$!
  sleep 1
  (env "${env[@]}" timeout "$T" "$emu" exec --ip 127.0.0.2 -- \
    ucx_perftest -p $ucx_port "$@" 127.0.0.1 >"$c" 2>&1; exit $?) 2>/dev/null
  local crc=$?
  wait $spid
  local src=$?
  local final
  final=$(grep -m1 '^Final:' "$c" | tr -s ' ')
  if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$final" ]; then
    result "$name" PASS "$final"
  else
    result "$name" FAIL "client exit $crc, server exit $src"; show "$c"; show "$s" 5
  fi
}
RC="rc_verbs,ud_verbs:aux" # rc_verbs needs ud_verbs for wireup (UCX's own alias rc_v)
ucx_pair ucx-rc-tag_lat "$RC" rc_verbs -t tag_lat -n 10000
ucx_pair ucx-rc-tag_bw "$RC" rc_verbs -t tag_bw -s 65536 -n 2000
ucx_pair ucx-rc-put_bw "$RC" rc_verbs -d emu0:1 -x rc_verbs -t put_bw -s 65536 -D zcopy -n 2000
ucx_pair ucx-rc-am_bw "$RC" rc_verbs -d emu0:1 -x rc_verbs -t am_bw -s 4096 -D bcopy -n 2000
ucx_pair ucx-ud-tag_lat ud_verbs ud_verbs -t tag_lat -n 10000
ucx_pair ucx-ud-tag_bw ud_verbs ud_verbs -t tag_bw -s 65536 -n 2000
# UD has no RDMA WRITE: UCT put_bw is "does not support operation put" on any device;
# UCP's put (emulated over active messages) is the put over ud_verbs.
ucx_pair ucx-ud-ucp_put_bw ud_verbs ud_verbs -t ucp_put_bw -s 65536 -n 2000
ucx_pair ucx-ud-am_bw ud_verbs ud_verbs -d emu0:1 -x ud_verbs -t am_bw -s 2048 -D bcopy -n 2000

# --- libfabric ---------------------------------------------------------------------
want libfabric && {
log=$work/fi_info.log
timeout "$T" "$emu" exec --ip 127.0.0.1 -- fi_info -p verbs >"$log" 2>&1
if grep -q FI_EP_DGRAM "$log" && ! grep -q FI_EP_MSG "$log"; then
  result fi_info-loopback PASS "DGRAM only: libfabric skips loopback interfaces for MSG/RDM"
else
  result fi_info-loopback FAIL "expected the DGRAM endpoint only"; show "$log"
fi
log=$work/fi_info_netns.log
timeout "$T" "$emu" exec --netns --ip 127.0.0.1 -- fi_info -p verbs >"$log" 2>&1
if grep -q "FI_PROTO_RDMA_CM_IB_RC" "$log" && grep -q "verbs;ofi_rxm" "$log" && grep -q FI_EP_DGRAM "$log"; then
  result fi_info-netns PASS "verbs MSG (RC), verbs;ofi_rxm RDM, verbs DGRAM on emu0"
else
  result fi_info-netns FAIL ""; show "$log"
fi
}

# fi_pair NAME PROVIDER EP [UNIVERSE]: server and client fi_pingpong in one network
# namespace whose emunet0 carries both addresses; each process its own device (nested
# exec). UNIVERSE sets FI_UNIVERSE_SIZE.
fi_pair() {
  want libfabric || return 0
  local name=$1 prov=$2 ep=$3
  export FI_UNIVERSE_SIZE=${4:-}
  [ -n "$FI_UNIVERSE_SIZE" ] || unset FI_UNIVERSE_SIZE
  local s=$work/$name.server.log c=$work/$name.client.log
  # In the work folder: a crashing fi_pingpong leaves a backtrace file where it runs.
  (cd "$work" && timeout $((T + 10)) "$emu" exec --netns --ip 127.0.0.1 --netns-addr 127.0.0.2 -- sh -c '
    emu=$1 prov=$2 ep=$3 s=$4 c=$5 t=$6
    FI_LOG_LEVEL=warn timeout "$t" fi_pingpong -p "$prov" -e "$ep" -I 1000 >"$s" 2>&1 &
    sleep 1
    FI_LOG_LEVEL=warn timeout "$t" "$emu" exec --ip 127.0.0.2 -- \
      fi_pingpong -p "$prov" -e "$ep" -I 1000 127.0.0.1 >"$c" 2>&1
    crc=$?
    wait $!
    src=$?
    exit $((crc != 0 || src != 0))' sh "$emu" "$prov" "$ep" "$s" "$c" "$T" >/dev/null 2>&1)
  local rc=$?
  local last
  last=$(grep -E '^[0-9]+[kmg]? ' "$c" | tail -1 | tr -s ' ')
  if [ $rc = 0 ] && [ -n "$last" ]; then
    result "$name" PASS "largest size: $last"
  elif grep -q "rdma_getaddrinfo: Invalid argument" "$s" "$c"; then
    result "$name" KNOWN "rdma_getaddrinfo(NULL, NULL, hints) is EINVAL in the emulator's librdmacm"
  else
    result "$name" FAIL "exit $rc"; show "$c"; show "$s" 8
  fi
}
fi_pair fi_pingpong-verbs-dgram verbs dgram
fi_pair fi_pingpong-verbs-msg verbs msg
# rxm sizes its MSG endpoints' CQ as (rx + tx size) x FI_UNIVERSE_SIZE (256 by
# default), above the device's max_cqe (32767): a universe of 4 processes fits.
fi_pair fi_pingpong-verbs-rxm-rdm "verbs;ofi_rxm" rdm 4
fi_pair fi_pingpong-verbs-rxd-rdm "verbs;ofi_rxd" rdm

# --- pyverbs rdmacm ----------------------------------------------------------------
if ! want pyverbs; then :
elif [ ! -f "$tar" ]; then
  result pyverbs-rdmacm FAIL "no copy of rdma-core's tests at $tar (set PYVERBS_TESTS)"
else
  tar xzf "$tar" -C "$work"
  suite=$(dirname "$(find "$work" -name run_tests.py -path '*tests/run_tests.py' | head -1)")/..
  # Each case on its own (in parallel: most of their time is a player waiting for
  # the other), so its log holds its own players' output only. --netns: emunet0
  # carries only the device's address, the first address pyverbs takes from
  # `ip -j addr show` (on lo it would take 127.0.0.1).
  cases=$(grep -o 'def test_rdmacm_[a-z_]*' "$suite/tests/test_rdmacm.py" | cut -c5-)
  for t in $cases; do
    (cd "$suite" && timeout 300 "$emu" exec --netns --ip 127.0.0.77 -- /usr/bin/python3 \
      tests/run_tests.py --dev emu0 -v "test_rdmacm.CMTestCase.$t") >"$work/pyverbs.$t.log" 2>&1 &
  done
  wait
  ok=() other=()
  for t in $cases; do
    log=$work/pyverbs.$t.log
    if grep -q '^Ran 1 test' "$log" && grep -q '^OK' "$log" && ! grep -q 'skipped=' "$log"; then
      ok+=("$t")
    else other+=("$t")
    fi
  done
  n=$(wc -w <<<"$cases")
  if [ "$n" = 0 ]; then
    result pyverbs-rdmacm FAIL "no test_rdmacm cases found"
  elif [ ${#other[@]} != 0 ]; then
    result pyverbs-rdmacm FAIL "of $n: ${#ok[@]} passed, ${#other[@]} skipped or failed"
    for t in "${other[@]}"; do echo "      $t"; tail -n 12 "$work/pyverbs.$t.log" | sed 's/^/        /'; done
  else
    # Server and client are two processes on one address: the emulated device is
    # shared between them, as kernel rxe's is (emu-core's nic/share.rs).
    result pyverbs-rdmacm PASS "$n cases ran, none skipped, server and client on one address"
  fi
fi

# --- Open MPI over UCX ---------------------------------------------------------------
# mpirun starts each rank through rdma-emu exec with its own address (rank r on
# 127.0.0.(11+r)); the ping-pong is ours (scripts/mpi_pingpong.c, also run between
# hosts by ci-netns.sh), Open MPI and UCX are Debian's.
mpi_pair() {
  want mpi || return 0
  local name=$1 tls=$2 log=$work/$1.log
  (timeout $((T * 2)) mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ucx \
    --mca btl self,vader,tcp -x RDMA_EMU_LIB -x UCX_TLS="$tls,self" -x UCX_NET_DEVICES=emu0:1 \
    sh -c \
    "exec '$emu' exec --ip 127.0.0.\$((OMPI_COMM_WORLD_RANK + 11)) -- '$work/mpi_pingpong'" \
    >"$log" 2>&1; exit $?) 2>/dev/null
  local rc=$?
  local last
  last=$(grep -E '^ *1048576 bytes' "$log" | tr -s ' ')
  if [ $rc = 0 ] && [ -n "$last" ]; then
    result "$name" PASS "$last"
  else
    result "$name" FAIL "exit $rc"; show "$log"
  fi
}
if want mpi; then
  if mpicc -O2 -o "$work/mpi_pingpong" "$root/scripts/mpi_pingpong.c" >"$work/mpicc.log" 2>&1; then
    mpi_pair mpi-ucx-ud ud_verbs
    mpi_pair mpi-ucx-rc "rc_verbs,ud_verbs:aux"
  else
    result mpi-build FAIL "mpicc"; show "$work/mpicc.log"
  fi
fi

echo "stacks: $npass passed, $nknown known failures, ${#failed[@]} failed ($(($(date +%s) - start)) s)"
[ ${#failed[@]} = 0 ] || { echo "FAIL stacks: ${failed[*]}"; exit 1; }
