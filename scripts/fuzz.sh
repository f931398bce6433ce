#!/usr/bin/env bash
# Runs a libFuzzer target from fuzz/ (default `parser`) for SECONDS (default 60).
#
#   scripts/fuzz.sh [SECONDS] [TARGET]      TARGET: parser | subjects
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

corpus="$root/fuzz/corpus/$target"
mkdir -p "$corpus"
args=(-max_total_time="$seconds" -timeout=10 -print_final_stats=1)
if [[ -f "$root/fuzz/$target.dict" ]]; then
  args+=(-dict="$root/fuzz/$target.dict")
fi

cd "$root"
# nice: the machine has two cores, and builds and tests share them.
exec nice -n 10 cargo fuzz run -s "$sanitizer" "$target" "$corpus" "$root/fuzz/seeds/$target" -- "${args[@]}"
