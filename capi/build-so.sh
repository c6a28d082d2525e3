#!/bin/sh
# Links the emulator's libibverbs.so.1 and librdmacm.so.1 from the crate's static library.
#   capi/build-so.sh [--release] OUTDIR
# Builds `cargo build -p rdma-emu-ibverbs` (honouring CARGO_TARGET_DIR), then links
# OUTDIR/libibverbs.so.1 with the version scripts libibverbs.map and librdmacm.map (a
# Rust cdylib cannot carry symbol versions: rustc passes a version script of its own),
# and makes OUTDIR/librdmacm.so.1 a link to the same file: the dynamic loader maps a
# file once whatever name it is asked for, so the CM and the verbs share their objects.
# Needs cc.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
profile=debug
if [ "${1:-}" = "--release" ]; then profile=release; shift; fi
out=${1:?usage: build-so.sh [--release] OUTDIR}
target=${CARGO_TARGET_DIR:-$here/../target}
if [ "$profile" = release ]; then
  cargo build -q --release -p rdma-emu-ibverbs --manifest-path "$here/../Cargo.toml"
else
  cargo build -q -p rdma-emu-ibverbs --manifest-path "$here/../Cargo.toml"
fi
mkdir -p "$out"
cc -shared -o "$out/libibverbs.so.1" \
  -Wl,--whole-archive "$target/$profile/librdma_emu_ibverbs.a" -Wl,--no-whole-archive \
  -Wl,--version-script="$here/libibverbs.map" -Wl,--version-script="$here/librdmacm.map" -Wl,-soname,libibverbs.so.1 \
  -Wl,-z,now -lpthread -ldl -lm -lgcc_s -lc
ln -sf libibverbs.so.1 "$out/libibverbs.so"
ln -sf libibverbs.so.1 "$out/librdmacm.so.1"
ln -sf libibverbs.so.1 "$out/librdmacm.so"
echo "$out/libibverbs.so.1 $out/librdmacm.so.1"
