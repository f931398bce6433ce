#!/usr/bin/env bash
# Runs a libFuzzer target from fuzz/ (default `parser`) for SECONDS (default 60), or
# every target one after the other for SECONDS each.
#
#   scripts/fuzz.sh [SECONDS] [TARGET | all]
#
# Targets: the broker's `parser` and `subjects`; the gate's client-facing decoders
# `client_protobuf` (binary frames), `client_json` (text frames, typed bodies
# transcoded), `pomelo` (packages, messages, the handshake) and `upgrade` (the HTTP
# request head).
#
# cargo-fuzz wants nightly; only stable is installed here, so RUSTC_BOOTSTRAP=1 lets
# stable accept the -Z flags it passes. AddressSanitizer is used when the toolchain
# ships its runtime, otherwise the run goes on without a sanitizer (the code is safe
# Rust, so ASan mostly guards the C++ libFuzzer itself). New inputs are kept in
# fuzz/corpus/TARGET (git-ignored); the checked-in seeds are read from fuzz/seeds/TARGET.
# A crash leaves its input in fuzz/artifacts/TARGET and makes the script fail.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
target="${2:-parser}"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
sanitizer=address
if ! compgen -G "$(rustc --print sysroot)/lib/rustlib/*/lib/librustc-*_rt.asan.a" >/dev/null; then
  sanitizer=none
fi

targets=(parser subjects client_protobuf client_json pomelo upgrade)
if [[ "$target" == all ]]; then
  run=("${targets[@]}")
elif [[ " ${targets[*]} " == *" $target "* ]]; then
  run=("$target")
else
  echo "unknown target $target; one of: ${targets[*]} all" >&2
  exit 2
fi

cd "$root"
for target in "${run[@]}"; do
  corpus="$root/fuzz/corpus/$target"
  mkdir -p "$corpus"
  args=(-max_total_time="$seconds" -timeout=10 -print_final_stats=1)
  if [[ -f "$root/fuzz/$target.dict" ]]; then
    args+=(-dict="$root/fuzz/$target.dict")
  fi
  # nice: the machine has two cores, and builds and tests share them.
  nice -n 10 cargo fuzz run -s "$sanitizer" "$target" "$corpus" "$root/fuzz/seeds/$target" -- "${args[@]}"
done
