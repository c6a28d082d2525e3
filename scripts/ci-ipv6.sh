#!/usr/bin/env bash
# CI step: the conformance suite over UDP/IPv6 (emu-udp backend), twice, in an
# unprivileged user and network namespace (root is not needed):
#   --ip ::1          the IPv6 loopback address; Linux's lo carries no IPv6 multicast,
#                     so the cases that need a group heard skip there and say so
#   --ip fd00:77::1   an address on a veth (nodad: usable at once), where a group's
#                     datagrams loop back to the host's members: every case runs
# Any failed case fails the step.
#   scripts/ci-ipv6.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build -q -p verbs-conformance --bin conformance
bin="$CARGO_TARGET_DIR/debug/conformance"
if ! unshare -rn true 2>/dev/null; then
  echo "ci-ipv6.sh: no user and network namespaces (unshare -rn)"
  exit 1
fi
log=$(mktemp /tmp/ci-ipv6.XXXXXX)
trap 'rm -f "$log"' EXIT
# The case output goes to a file; a failure prints its failed cases.
unshare -rn bash -c '
  set -e
  ip link set lo up
  ip link add v6a type veth peer name v6b
  ip link set v6a up
  ip link set v6b up
  ip -6 addr add fd00:77::1/64 dev v6a nodad
  for ip in ::1 fd00:77::1; do
    "$1" --backend emu-udp --ip "$ip" >"$2" 2>&1 || { grep "^FAIL" "$2"; tail -1 "$2"; exit 1; }
    echo "--ip $ip: $(tail -1 "$2")"
  done' _ "$bin" "$log"
