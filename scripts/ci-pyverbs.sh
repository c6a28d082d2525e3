#!/usr/bin/env bash
# CI step: rdma-core's own test suite (pyverbs, rdma-core v44.0's tests/, the version
# Debian 12 packages as python3-pyverbs) run unmodified through the emulator's
# libibverbs.so.1 / librdmacm.so.1.
#   scripts/ci-pyverbs.sh    # needs python3-pyverbs (installed here if missing)
# The suite is not downloadable in CI: an unmodified copy sits in the steering
# repository's shared/thirdparty (PYVERBS_TESTS=path.tar.gz names another). It is
# unpacked into a temporary folder and never enters this repository.
# Fails on a hang (timeout), on a crash, and on any failing or erroring test not listed
# in scripts/pyverbs-known-differences.txt (each line: the test id, then why it would
# differ on kernel rxe too); a listed test that now passes is reported, so the list
# only shrinks.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
tar=${PYVERBS_TESTS:-$root/../shared/thirdparty/rdma-core-v44.0-tests.tar.gz}
known=$root/scripts/pyverbs-known-differences.txt
if [ ! -f "$tar" ]; then
  echo "SKIPPED pyverbs: no copy of rdma-core's tests at $tar (set PYVERBS_TESTS)"
  exit 0
fi
if ! dpkg -s python3-pyverbs >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq python3-pyverbs >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq python3-pyverbs >/dev/null; } ||
    { echo "FAIL pyverbs: cannot install python3-pyverbs"; exit 1; }
fi
work=$(mktemp -d /tmp/ci-pyverbs.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$root/capi/build-so.sh" --release "$work/lib" >/dev/null || { echo "FAIL build libibverbs.so.1"; exit 1; }
tar xzf "$tar" -C "$work"
suite=$(dirname "$(find "$work" -name run_tests.py -path '*tests/run_tests.py' | head -1)")/..
log=$work/pyverbs.log
# The launcher (a debug build does) puts the device where the suite looks for it,
# with a network interface that carries its address (--netns), so the rdmacm cases
# run too: their players are processes forked from the suite's, server and client on
# that one address (the device is shared between them, as rxe's is).
cargo build -q -p rdma-emu --manifest-path "$root/Cargo.toml" || { echo "FAIL build rdma-emu"; exit 1; }
(cd "$suite" && timeout "${PYVERBS_TIMEOUT:-900}" "$CARGO_TARGET_DIR/debug/rdma-emu" exec \
  --lib "$work/lib" --netns --ip 127.0.0.77 -- /usr/bin/python3 tests/run_tests.py --dev emu0 -v) >"$log" 2>&1
rc=$?
tail -3 "$log"
if [ "$rc" -ge 124 ] || ! grep -Eq '^Ran [0-9]+ tests' "$log"; then
  echo "FAIL pyverbs: the suite did not finish (exit $rc: hang, crash or abort)"
  tail -40 "$log"
  exit 1
fi
ran=$(grep -Eo '^Ran [0-9]+' "$log" | grep -Eo '[0-9]+')
bad=$(grep -E '^(FAIL|ERROR): ' "$log" | sed -E 's/^(FAIL|ERROR): [^ ]+ \(([^)]+)\).*/\2/' | sort -u)
allowed=$(grep -Ev '^\s*(#|$)' "$known" | awk '{print $1}' | sort -u)
unexpected=$(comm -23 <(printf '%s\n' "$bad" | sed '/^$/d') <(printf '%s\n' "$allowed" | sed '/^$/d'))
fixed=$(comm -13 <(printf '%s\n' "$bad" | sed '/^$/d') <(printf '%s\n' "$allowed" | sed '/^$/d'))
# unittest's closing line: "OK (skipped=N)" or "FAILED (failures=N, errors=N, skipped=N)".
skipped=$(tail -1 "$log" | grep -Eo 'skipped=[0-9]+' | grep -Eo '[0-9]+' || echo 0)
nbad=$(printf '%s\n' "$bad" | sed '/^$/d' | wc -l)
passed=$((ran - skipped - nbad))
echo "pyverbs: $ran tests, $passed passed, $skipped skipped, $nbad failed or errored (known: $(printf '%s\n' "$allowed" | sed '/^$/d' | wc -l))"
[ -z "$fixed" ] || { echo "now passing, remove from $(basename "$known"):"; printf '    %s\n' $fixed; }
if [ -n "$unexpected" ]; then
  echo "FAIL pyverbs: failures not in $(basename "$known"):"
  for t in $unexpected; do
    echo "  $t"
    grep -E "^(FAIL|ERROR): [^ ]+ \($t\)" -A14 "$log" | tail -12 | sed 's/^/      /'
  done
  exit 1
fi
echo "PASS pyverbs"
