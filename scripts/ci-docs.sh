#!/usr/bin/env bash
# CI step: every shell block of the user guides runs as written (docs/learning.md,
# docs/c-programs.md; the Rust blocks of docs/testing-your-code.md and the README are
# doctests of crate sims). Each block runs in bash -e from the repository's root, with
# a time limit; a failing block fails the step and shows its output.
set -euo pipefail
cd "$(dirname "$0")/.."
# The guides say target/release/...: build where they look.
unset CARGO_TARGET_DIR
export DEBIAN_FRONTEND=noninteractive
PKGS="ibverbs-utils rdmacm-utils perftest tshark ncat"
if ! dpkg -s $PKGS >/dev/null 2>&1; then
  apt-get install -y -qq $PKGS >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $PKGS >/dev/null; }
fi
fail=0
for doc in docs/learning.md docs/c-programs.md; do
  n=0
  # The lines between "```sh" and the next "```", one file per block.
  tmp=$(mktemp -d)
  awk -v dir="$tmp" '/^```sh$/ { n++; f = dir "/" n ".sh"; next } /^```/ { f = ""; next } f { print > f }' "$doc"
  for b in $(ls "$tmp" | sort -n); do
    n=$((n + 1))
    if timeout 600 bash -e "$tmp/$b" > "$tmp/out" 2>&1; then
      echo "ok   $doc block $n"
    else
      echo "FAIL $doc block $n:"; sed 's/^/  | /' "$tmp/$b"; tail -20 "$tmp/out" | sed 's/^/  > /'
      fail=1
    fi
  done
  rm -rf "$tmp"
done
exit $fail
