#!/usr/bin/env bash
# Regenerates gen/ into a temporary directory and fails if it differs from the committed
# gen/, so the committed types always match proto/proto/*.proto. Needs buf and
# protoc-gen-go on PATH (or in $(go env GOPATH)/bin):
#   go install github.com/bufbuild/buf/cmd/buf@v1.75.0
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="${PATH}:$(go env GOPATH)/bin"
out="$(mktemp -d)"
trap 'rm -rf "${out}"' EXIT
buf generate --output "${out}"
if ! diff -r "${out}/gen" gen; then
  echo "workers/go/gen is out of date: run \`buf generate\` in workers/go and commit the result" >&2
  exit 1
fi
echo "workers/go/gen is up to date"
