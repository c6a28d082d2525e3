#!/usr/bin/env bash
# CI step: hw-backend on the real kernel rxe driver.
#   1. installs the build packages (libibverbs-dev, librdmacm-dev, libclang-dev),
#   2. builds (or reuses) the Debian 12 VM image with rdma_rxe (scripts/rxe-vm/),
#   3. builds hw-backend's test binaries with `--features hw` on the host,
#   4. boots the VM, which creates rxe0 and runs them and the conformance suite
#      (scripts/rxe-vm/hw-job.sh); then it adds a global IPv6 address to the guest's
#      interface and runs HwCm's tests and the suite's cm cases again over IPv6,
#   5. fails on any test failure not listed in scripts/rxe-vm/rxe-deviations.txt or
#      scripts/rxe-vm/conformance-deviations.txt, or if HwCm did not connect over IPv6.
# Env: RXEVM_W (VM work folder; default /work/rxevm-cache when /work is writable, else
# $TMPDIR/rxevm: kept between runs, it is a cache), ACCEL=tcg|kvm (default tcg),
# RXEVM_TIMEOUT (the VM's time limit in seconds, default 600).
# Writes the per-test table to $RXEVM_W/share/results.md; this run's logs, results and
# table stay in a folder of its own, $RXEVM_W/run.* (printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
t0=$(date +%s)
note() { printf '[ci-hw %4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }

if [ -z "${RXEVM_W:-}" ]; then
  if [ -d /work ] && [ -w /work ]; then RXEVM_W=/work/rxevm-cache; else RXEVM_W=${TMPDIR:-/tmp}/rxevm; fi
fi
export W=$RXEVM_W
mkdir -p "$W"

note "packages"
export DEBIAN_FRONTEND=noninteractive
PKGS="libibverbs-dev librdmacm-dev libclang-dev pkg-config"
if ! dpkg -s $PKGS >/dev/null 2>&1; then
  apt-get install -y -qq $PKGS >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $PKGS >/dev/null; }
fi

note "VM image under $W"
if [ -x "$W/qemu-root/usr/bin/qemu-system-x86_64" ] && [ -f "$W/initramfs.cpio.gz" ] \
   && [ -x "$W/rootfs/usr/bin/ibv_devices" ]; then
  note "VM image cached"
else
  "$REPO/scripts/rxe-vm/build-image.sh" > "$W/build-image.log" 2>&1 \
    || { tail -30 "$W/build-image.log"; exit 1; }
  tail -1 "$W/build-image.log"
fi

note "build hw-backend tests with --features hw"
exes=$(cargo test -p hw-backend --features hw --no-run --message-format=json 2>/dev/null \
  | grep -o '"executable":"[^"]*"' | sed 's/"executable":"\(.*\)"/\1/')
[ -n "$exes" ] || { echo "no test executables built"; exit 1; }
# This run's binaries and results wait in a folder of its own: $W/share is the VM's,
# and another run may be using it; it is touched only under the VM lock below.
RUN=$(mktemp -d "$W/run.XXXXXX")
mkdir -p "$RUN/bin" "$RUN/conf"
for e in $exes; do
  n=$(basename "$e"); cp "$e" "$RUN/bin/${n%-*}"
done
ls "$RUN/bin"
note "build the conformance suite with --features hw"
cargo build -q --release -p verbs-conformance --features hw --bin conformance
cp "${CARGO_TARGET_DIR:-target}/release/conformance" "$RUN/conf/"
# The cases that crash the VM's kernel, skipped there with their reason.
cp "$REPO/scripts/rxe-vm/conformance-crashes.txt" "$RUN/conf/crashes.txt"

note "run in the VM"
vmrc=0
# One VM at a time on the host (ci-interop.sh takes the same lock).
# The issue allows the VM step 10 minutes; it takes about 4 here (RXEVM_TIMEOUT, in
# seconds, gives a host shared with other work longer).
# Under the lock: put this run's binaries in $W/share, run the VM, take the results
# out again (a run that cleared $W/share outside the lock lost another's results).
export RUN REPO
TIMEOUT=${RXEVM_TIMEOUT:-600} flock /tmp/rxe-vm.lock bash -c '
  rm -rf "$W/share/bin" "$W/share/results" "$W/share/conf"
  cp -r "$RUN/bin" "$RUN/conf" "$W/share/"
  rc=0; "$REPO/scripts/rxe-vm/run-rxe-vm.sh" "$REPO/scripts/rxe-vm/hw-job.sh" > "$RUN/vm.log" 2>&1 || rc=$?
  cp -r "$W/share/results" "$RUN/results" 2>/dev/null || true
  exit $rc' || vmrc=$?
cp "$RUN/vm.log" "$W/vm.log" 2>/dev/null || true
rm -rf "$RUN/bin" "$RUN/conf"
# Through a file: `head` closing the pipe early must not fail the step (pipefail).
sed -n '/RXEVM: rxe0 ready/,$p' "$RUN/vm.log" | grep -v '^\s*$' > "$RUN/vm-job.log" || true
known=$(grep -v '^\s*#' "$REPO/scripts/rxe-vm/rxe-deviations.txt" | cut -d'|' -f1 | tr -d ' ' | grep -v '^$' || true)
# The guest's log, a known deviation's "... FAILED" shown as such: a reader (or a tool)
# scanning the log for failures then finds only the unexpected ones. (Lines from the
# guest's serial console end in CR LF.)
known_re=$(printf '%s\n' "$known" | paste -sd'|' -)
head -200 "$RUN/vm-job.log" | if [ -n "$known_re" ]; then
  sed -E "s/^test ($known_re) \.\.\. FAILED\r?$/test \1 ... fails (known rxe deviation)/"
else cat; fi
if [ "$vmrc" -ne 0 ]; then echo "VM job failed (exit $vmrc)"; exit 1; fi

note "compare with scripts/rxe-vm/rxe-deviations.txt"
results=$(cat "$RUN"/results/*.log | grep -v '^FAIL \|^skip ' | grep -E '^test .* \.\.\. (ok|FAILED|ignored)$' || true)
[ -n "$results" ] || { echo "no test results from the VM"; exit 1; }
unexpected=0; ok=0; dev=0
table="| test | rxe | note |"$'\n'"|---|---|---|"
while read -r _ name _ res; do
  case "$res" in
    ok) ok=$((ok + 1)); note_="";
        if grep -qx "$name" <<<"$known"; then note_="listed as a deviation but passes: remove it"; echo "NOTE: $name $note_"; fi
        table+=$'\n'"| $name | pass | $note_ |";;
    FAILED)
        if grep -qx "$name" <<<"$known"; then dev=$((dev + 1))
          table+=$'\n'"| $name | fail | known rxe deviation |"
        else unexpected=$((unexpected + 1)); echo "UNEXPECTED FAILURE on rxe: $name"
          table+=$'\n'"| $name | fail | UNEXPECTED |"
        fi;;
    *) table+=$'\n'"| $name | $res | |";;
  esac
done <<<"$results"
printf '%s\n' "$table" > "$RUN/results.md"
cp "$RUN/results.md" "$W/share/results.md" 2>/dev/null || true
cat "$RUN/results.md"
if [ "$unexpected" -ne 0 ]; then
  for f in "$RUN"/results/*.log; do sed -n '/^failures:$/,/^test result/p' "$f"; done
fi
note "rxe: $ok ok, $dev known deviations, $unexpected unexpected failures"

note "conformance suite on rxe vs scripts/rxe-vm/conformance-deviations.txt"
cknown=$(grep -v '^\s*#' "$REPO/scripts/rxe-vm/conformance-deviations.txt" | cut -d'|' -f1 | tr -d ' ' | grep -v '^$' || true)
cunexpected=0
# compare LABEL TSV: one run's verdicts against the deviation list.
compare() {
  local label=$1 conf=$2 name verdict msg
  [ -s "$conf" ] || { echo "no $label conformance results from the VM"; tail -20 "$RUN/results/conformance"*.log 2>/dev/null; exit 1; }
  while IFS=$'\t' read -r name verdict msg; do
    case "$verdict" in
      fail)
        if ! grep -qx "$name" <<<"$cknown"; then
          cunexpected=$((cunexpected + 1)); echo "UNEXPECTED conformance failure on $label: $name: $msg"
        fi;;
      pass)
        if grep -qx "$name" <<<"$cknown"; then echo "NOTE: $name is listed as an rxe deviation but passes ($label): remove it"; fi;;
    esac
  done < "$conf"
  printf '%s conformance: %s passed, %s failed, %s skipped\n' "$label" \
    "$(grep -c $'\tpass' "$conf")" "$(grep -c $'\tfail' "$conf")" "$(grep -c $'\tskip' "$conf")"
}
conf="$RUN/results/rxe.tsv"
compare rxe "$conf"
# HwCm over IPv6 (hw-job.sh): the cm cases again, through rxe0's global IPv6 GID.
compare "rxe over IPv6 (cm::)" "$RUN/results/rxe-ipv6.tsv"
grep -q $'^cm::connect_establish_disconnect\tpass' "$RUN/results/rxe-ipv6.tsv" \
  || { echo "HwCm did not connect over IPv6"; cunexpected=$((cunexpected + 1)); }
echo "$cunexpected unexpected conformance failures"
echo "per-case results: $conf (scripts/conformance.sh $conf renders docs/conformance.md with them)"
[ "$unexpected" -eq 0 ] && [ "$cunexpected" -eq 0 ]
