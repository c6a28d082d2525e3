#!/usr/bin/env bash
# Runs the conformance suite on the emulator (fabric and UDP) and renders
# docs/conformance.md with their results, plus kernel rxe's if a result file from the
# VM run (scripts/ci-hw.sh) is given: scripts/conformance.sh [rxe.tsv]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${TMPDIR:-/tmp}/conformance.$$"
mkdir -p "$out"
cargo run -q -p verbs-conformance --bin conformance -- --backend emu-udp --save "$out/emu-udp.tsv" | tail -1
extra=()
for f in "$@"; do extra+=(--results "$f"); done
cargo run -q -p verbs-conformance --bin conformance -- --backend emu-fabric --results "$out/emu-udp.tsv" \
  "${extra[@]}" --markdown docs/conformance.md | tail -2
rm -rf "$out"
# Every case that fails on rxe, with what rxe does and the citation that shows it
# deviates (the lists scripts/ci-hw.sh accepts). A list line is
# "name | what rxe does | what the standard says"; comments and blank lines skipped.
deviations() {
  printf '| %s | what rxe does | what the standard says |\n|---|---|---|\n' "$1"
  grep -v '^#' "$2" | grep -v '^[[:space:]]*$' \
    | awk -F' [|] ' '{ printf "| %s | %s | %s |\n", $1, $2, $3 }'
}
{
  printf '\n## Where kernel rxe deviates\n\n'
  printf 'The cases above that fail on rxe, each accepted by `scripts/ci-hw.sh` from '
  printf '`scripts/rxe-vm/conformance-deviations.txt`; any other failure fails CI.\n\n'
  deviations case scripts/rxe-vm/conformance-deviations.txt
  printf '\nhw-backend'"'"'s own tests (`hw-backend/tests/`) that fail on rxe, accepted from '
  printf '`scripts/rxe-vm/rxe-deviations.txt`:\n\n'
  deviations test scripts/rxe-vm/rxe-deviations.txt
  printf '\nCases not run on rxe because they crash the VM'"'"'s kernel (skipped there from '
  printf '`scripts/rxe-vm/conformance-crashes.txt`):\n\n'
  printf '| case | what the kernel does |\n|---|---|\n'
  grep -v '^#' scripts/rxe-vm/conformance-crashes.txt | grep -v '^[[:space:]]*$' \
    | awk -F' [|] ' '{ printf "| %s | %s |\n", $1, $2 }'
} >> docs/conformance.md
# What rxe did in the wire interop probes (measured by scripts/ci-interop.sh, recorded in
# docs/interop.md), beside what the emulator did in the same probe.
{
  printf '\n## Wire interop probes: kernel rxe and the emulator on one link\n\n'
  printf 'Measured by `scripts/ci-interop.sh`; details in [interop.md](interop.md).\n\n'
  sed -n '/^| behaviour (interop probe)/,/^$/p' docs/interop.md
} >> docs/conformance.md
