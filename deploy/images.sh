#!/usr/bin/env bash
# Builds every image deploy/compose.yaml runs, with no registry: a Debian base made by
# debootstrap from Debian's packages and imported, then on it the shaddock image (the
# `prebuilt` target of deploy/Dockerfile), nats-server, deploy/nats-exporter and
# Prometheus (Debian's package).
#
#   deploy/images.sh --shaddock-bin target/debug/shaddock
#
# Needs a Docker engine (DOCKER_HOST as usual; the Debian `docker` client, for BuildKit
# without the buildx plugin), debootstrap, go, and nats-server on PATH (or
# --nats-server-bin). The base is built only when the engine lacks it (or the
# Prometheus packages are not in --cache-dir): keep the engine's data root to keep it.
set -euo pipefail

usage() {
  cat <<EOF
usage: $0 --shaddock-bin FILE [--nats-server-bin FILE] [--suite NAME] [--cache-dir DIR]
  --shaddock-bin FILE     the shaddock binary to put in the image (built on this machine)
  --nats-server-bin FILE  default: nats-server on PATH
  --suite NAME            Debian release of the base; default: this machine's when it is
                          Debian (a binary built here needs this glibc or newer), else bookworm
  --cache-dir DIR         debootstrap's and Prometheus' .deb files (default ${CACHE_DIR_DEFAULT})
Images: ${BASE_REPO}:SUITE, \$SHADDOCK_IMAGE, \$SHADDOCK_NATS_IMAGE,
\$SHADDOCK_NATS_EXPORTER_IMAGE, \$SHADDOCK_PROMETHEUS_IMAGE (defaults in deploy/compose.yaml).
EOF
}

BASE_REPO=shaddock-base
CACHE_DIR_DEFAULT="${SHADDOCK_DEPLOY_CACHE_DIR:-/var/cache/shaddock-deploy}"
MIRROR=${SHADDOCK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The same defaults as deploy/compose.yaml's image names.
SHADDOCK_IMAGE=${SHADDOCK_IMAGE:-shaddock:latest}
SHADDOCK_NATS_IMAGE=${SHADDOCK_NATS_IMAGE:-shaddock-nats-server:latest}
SHADDOCK_NATS_EXPORTER_IMAGE=${SHADDOCK_NATS_EXPORTER_IMAGE:-shaddock-nats-exporter:latest}
SHADDOCK_PROMETHEUS_IMAGE=${SHADDOCK_PROMETHEUS_IMAGE:-shaddock-prometheus:latest}

deploy_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
shaddock_bin=""
nats_server_bin=""
suite=""
cache_dir="${CACHE_DIR_DEFAULT}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shaddock-bin) shaddock_bin="$2"; shift 2 ;;
    --nats-server-bin) nats_server_bin="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --cache-dir) cache_dir="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
[[ -n "${shaddock_bin}" ]] || { usage >&2; exit 2; }
[[ -x "${shaddock_bin}" ]] || { echo "error: ${shaddock_bin} is not an executable" >&2; exit 1; }
nats_server_bin="${nats_server_bin:-$(command -v nats-server || true)}"
[[ -x "${nats_server_bin}" ]] || { echo "error: no nats-server (PATH or --nats-server-bin)" >&2; exit 1; }
if [[ -z "${suite}" ]]; then
  # shellcheck source=/dev/null
  suite="$(if . /etc/os-release 2>/dev/null && [[ "${ID:-}" == debian ]]; then echo "${VERSION_CODENAME:-}"; fi)"
  suite="${suite:-bookworm}"
fi
base_image="${BASE_REPO}:${suite}"
prometheus_debs="${cache_dir}/prometheus-${suite}"

# Debian's client: BuildKit is built into its engine, no buildx plugin needed.
docker_cmd="${DOCKER:-$(command -v /usr/bin/docker || command -v docker)}"
docker() { "${docker_cmd}" "$@"; }
export DOCKER_BUILDKIT=1

work="$(mktemp -d /var/tmp/shaddock-images.XXXXXX)"
trap 'rm -rf "${work}"' EXIT

elapsed() { printf '%s in %ds\n' "$1" "$((SECONDS - $2))"; }

# The base: debootstrap (minbase, plus CA certificates) imported as one layer. While the
# root is at hand, apt inside it fetches Debian's prometheus package and every package
# it needs that the base lacks, for the Prometheus image.
build_base() {
  local start=${SECONDS} root="${work}/root"
  mkdir -p "${cache_dir}/debs" "${root}"
  debootstrap --variant=minbase --include=ca-certificates --cache-dir="${cache_dir}/debs" \
    "${suite}" "${root}" "${MIRROR}" >"${work}/debootstrap.log" 2>&1 || {
    tail -20 "${work}/debootstrap.log" >&2
    return 1
  }
  rm -rf "${prometheus_debs}"
  mkdir -p "${root}/tmp/debs/partial"
  cp /etc/resolv.conf "${root}/etc/resolv.conf"
  chroot "${root}" apt-get install -y --no-install-recommends --download-only \
    -o Dir::Cache::archives=/tmp/debs prometheus >"${work}/apt.log" 2>&1 || {
    tail -20 "${work}/apt.log" >&2
    return 1
  }
  mkdir -p "${prometheus_debs}"
  mv "${root}"/tmp/debs/*.deb "${prometheus_debs}/"
  rm -rf "${root}/tmp/debs"
  : >"${root}/etc/resolv.conf"
  tar -C "${root}" --numeric-owner \
    --exclude=./var/lib/apt/lists --exclude=./var/cache/apt --exclude=./usr/share/doc \
    --exclude=./usr/share/man --exclude=./usr/share/locale --exclude=./usr/share/info \
    -c . | docker import --change 'CMD ["bash"]' - "${base_image}" >/dev/null
  rm -rf "${root}"
  elapsed "base ${base_image} (debootstrap ${suite}, imported)" "${start}"
}

# build IMAGE DOCKERFILE CONTEXT [TARGET]
build() {
  local start=${SECONDS} image="$1" dockerfile="$2" context="$3" target=()
  [[ $# -ge 4 ]] && target=(--target "$4")
  # No network in the build: everything it needs is in the context or the base.
  docker build -q --network none -f "${dockerfile}" "${target[@]}" --build-arg "BASE_IMAGE=${base_image}" \
    -t "${image}" "${context}" >/dev/null
  elapsed "${image}" "${start}"
}

if docker image inspect "${base_image}" >/dev/null 2>&1 && compgen -G "${prometheus_debs}/prometheus_*.deb" >/dev/null; then
  echo "base ${base_image}: cached"
else
  build_base
fi

# Each image's context is a folder holding only what it copies. Debug information is
# stripped from the shaddock binary (a debug build is ~240 MB with it, a tenth without);
# the code is the same.
mkdir -p "${work}/shaddock" "${work}/nats-server" "${work}/nats-exporter" "${work}/prometheus"
strip --strip-debug -o "${work}/shaddock/shaddock" "${shaddock_bin}"
cp "${nats_server_bin}" "${work}/nats-server/nats-server"
(cd "${deploy_dir}/nats-exporter" && CGO_ENABLED=0 go build -o "${work}/nats-exporter/nats-exporter" .)
cp "${prometheus_debs}"/*.deb "${work}/prometheus/"

build "${SHADDOCK_IMAGE}" "${deploy_dir}/Dockerfile" "${work}/shaddock" prebuilt
build "${SHADDOCK_NATS_IMAGE}" "${deploy_dir}/images/nats-server.Dockerfile" "${work}/nats-server"
build "${SHADDOCK_NATS_EXPORTER_IMAGE}" "${deploy_dir}/images/nats-exporter.Dockerfile" "${work}/nats-exporter" prebuilt
build "${SHADDOCK_PROMETHEUS_IMAGE}" "${deploy_dir}/images/prometheus.Dockerfile" "${work}/prometheus"
