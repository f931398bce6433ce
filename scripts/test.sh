#!/usr/bin/env bash
# THE test command for Shaddock (CI runs it through .ci/run). Works from any directory.
#
# A fresh machine has Rust, Go, Node and Python. This script installs the rest: the
# nats-server that compatibility tests compare the broker against, the Go NATS example
# clients (nats-bench and friends) that tests and benchmarks drive it with, and the
# rustfmt/clippy components. Then it checks formatting and lints and runs the tests.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

NATS_SERVER_VERSION=v2.15.2
NATS_GO_VERSION=v1.12.0
NATS_GO_TOOLS=(nats-bench nats-pub nats-sub nats-req nats-rply nats-qsub)

step() { printf '\n==> %s\n' "$*"; }
run() {
  printf '+ %s\n' "$*"
  "$@"
}

step "Go tools: nats-server ${NATS_SERVER_VERSION}, nats.go ${NATS_GO_VERSION} examples"
if command -v go >/dev/null 2>&1; then
  gopath="$(go env GOPATH)"
  gobin="$(go env GOBIN)"
  # `go install` puts binaries in GOBIN, else the first GOPATH entry's bin/.
  gobin="${gobin:-${gopath%%:*}/bin}"
  export PATH="${gobin}:${PATH}"
fi

need_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "error: $1 is missing and Go is not installed to build it" >&2
    exit 1
  fi
}

if [[ "$(nats-server --version 2>/dev/null || true)" == *" ${NATS_SERVER_VERSION}" ]]; then
  echo "nats-server ${NATS_SERVER_VERSION}: $(command -v nats-server)"
else
  need_go nats-server
  run go install "github.com/nats-io/nats-server/v2@${NATS_SERVER_VERSION}"
fi
for tool in "${NATS_GO_TOOLS[@]}"; do
  if command -v "${tool}" >/dev/null 2>&1; then
    echo "${tool}: $(command -v "${tool}")"
  else
    need_go "${tool}"
    run go install "github.com/nats-io/nats.go/examples/${tool}@${NATS_GO_VERSION}"
  fi
done

step "Chromium (Debian's package) for the demo page's browser test"
if command -v chromium >/dev/null 2>&1; then
  echo "chromium: $(command -v chromium)"
elif command -v apt-get >/dev/null 2>&1; then
  run apt-get update
  run apt-get install -y chromium
else
  echo "error: chromium is missing and apt-get is not available to install it" >&2
  exit 1
fi

step "Rust components: rustfmt, clippy"
if ! cargo fmt --version >/dev/null 2>&1; then
  run rustup component add rustfmt
fi
if ! cargo clippy --version >/dev/null 2>&1; then
  run rustup component add clippy
fi
cargo --version
cargo fmt --version
cargo clippy --version

step "Format"
run cargo fmt --all -- --check

step "Lint"
run cargo clippy --workspace --all-targets -- -D warnings

step "Layers: no import cycles between modules (docs/layers.md)"
run python3 scripts/check-layers.py gateway services loadtest broker bus proto net nats-wire testkit clients/rust

step "Workers in other languages: TypeScript (workers/ts) and Go (workers/go)"
# The mixed-language test in `cargo test` below runs these workers beside a Rust one.
# From inside the package: `npm ci --prefix` leaves out buf's platform binary.
(
  cd workers/ts
  run npm ci --no-audit --no-fund
  run npm run check:generated
  run npm test
)
if ! command -v buf >/dev/null 2>&1; then
  run go install github.com/bufbuild/buf/cmd/buf@v1.75.0
fi
if ! command -v protoc-gen-go >/dev/null 2>&1; then
  run go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
fi
run workers/go/scripts/check-generated.sh
(
  cd workers/go
  run go vet ./...
  # The worker as its own process against a real nats-server (on PATH, above).
  run go test -count=1 ./...
  unformatted="$(gofmt -l .)"
  if [[ -n "${unformatted}" ]]; then
    echo "error: gofmt would change: ${unformatted}" >&2
    exit 1
  fi
)

step "Recipes (docs/recipes): Go and Python types from proto/ alone, descriptor sets, a Python worker"
run docs/recipes/test.sh

step "Tests"
run cargo test --workspace

step "Load-test smoke: every scenario for a second or two"
run cargo build -p shaddock
run scripts/loadtest-smoke.sh

step "TypeScript SDK (clients/ts): generated types, build, demo bundle, tests against a real gate, Chromium"
export SHADDOCK_BIN="${PWD}/target/debug/shaddock"
(
  cd clients/ts
  run npm ci --no-audit --no-fund
  # The types in src/gen are generated from proto/ and committed: they must match.
  run npm run check:generated
  run npm run build
  # The demo page the gate embeds (gateway/web) is this build's output, committed.
  run npm run check:bundle
  run npm test
  run npm run test:browser
)

# ---------------------------------------------------------------------------------------
# Further steps go here, after the unit and integration tests: each one a `step` line and
# `run` commands, failing the script on error (e.g. a short, bounded fuzz run of the
# broker's parser; real-client compatibility suites).
# ---------------------------------------------------------------------------------------

step "Pomelo clients (clients/pomelo-test): the npm pomelo-protocol codec against a real gate"
(
  cd clients/pomelo-test
  run npm ci --no-audit --no-fund
  run npm test
)

# Deployment: deploy/ for real (issue #18). Needs the debug `shaddock` built above, the
# TypeScript SDK built above, and nats-server. On a machine where no Docker engine can be
# started it runs its offline checks, then says so and skips the fleet.
step "Deployment (deploy/test.sh): images without a registry, the compose fleet under Docker, Kubernetes files"
run deploy/test.sh --shaddock-bin target/debug/shaddock --skip-without-engine

step "All checks passed"
