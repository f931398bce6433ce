#!/usr/bin/env bash
# deploy/ for real: builds the images (no registry), starts the compose fleet under
# Docker, checks it, and tears down exactly what it started. scripts/test.sh runs it.
#
#   deploy/test.sh [--shaddock-bin FILE] [--skip-without-engine]
#
# --shaddock-bin   the binary to put in the image (default target/debug/shaddock: CI's
#                  test build; the image's binary must be built on a glibc no newer
#                  than the base's, which images.sh takes from this machine's release)
# --skip-without-engine
#                  when no Docker engine can be had here (no root, no dockerd, dockerd
#                  will not start), say so and exit 0 instead of failing
#
# Offline first (no engine needed): deploy/nats-exporter's Go tests, and the Kubernetes
# files rendered with kustomize and checked against the binary (deploy/test/k8s.py).
# Then, on an engine (deploy/test/engine.sh: the running one, else a dockerd of our own
# on a data root kept between runs), the fleet of deploy/compose.yaml minus Grafana
# (Debian has no package of it), every port published on 127.0.0.1 on a free port:
#  1. Prometheus has every gate, worker and NATS exporter target up;
#  2. a client on gate 1 and a client on gate 2 chat in one room;
#  3. the image's default command (`shaddock up`) answers an echo (the README's example);
#  4. with the echo worker paused, a request times out at the gate (408);
#  5. every metric name the Grafana dashboard queries is in a live scrape;
#  6. `--scale chat=6`: each of the 6 chat workers takes a share of a load;
#  7. `docker stop` of gate 1 under load (SIGTERM, then the gate's drain within the
#     compose stop grace): no request fails, every client carries on on gate 2.
#  8. `docker restart` of each nats-server node in turn under load on gate 2 (compose
#     stops a node in lame duck mode): no request fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

shaddock_bin=target/debug/shaddock
skip_without_engine=false
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shaddock-bin) shaddock_bin="$2"; shift 2 ;;
    --skip-without-engine) skip_without_engine=true; shift ;;
    *) sed -n '2,12p' "$0" >&2; exit 2 ;;
  esac
done
shaddock_bin="$(realpath "${shaddock_bin}")"
nats_server_bin="$(command -v nats-server)" || { echo "error: nats-server is not on PATH" >&2; exit 1; }

# Load of the scale and drain checks, and what share of a fair split each chat worker
# must take.
SCALE_CLIENTS=20
SCALE_INTERVAL=5ms
SCALE_DURATION=3s
SCALE_MIN_SHARE=0.25
DRAIN_CLIENTS=20
DRAIN_INTERVAL_MS=10

started=${SECONDS}
phase_start=${SECONDS}
phase() {
  printf -- '-- %s (%ds so far)\n' "$*" "$((SECONDS - started))"
  phase_start=${SECONDS}
}
took() { printf '   took %ds\n' "$((SECONDS - phase_start))"; }

work="$(mktemp -d /tmp/shaddock-deploy-test.XXXXXX)"
# shellcheck source=deploy/test/engine.sh
source deploy/test/engine.sh
project="shaddocktest$$"
compose_file=deploy/compose.yaml
compose() { compose_cmd -f "${compose_file}" -p "${project}" "$@"; }
fleet_up=false
skipped=false
up_container=""

teardown() {
  local code=$?
  set +e
  if [[ ${code} -ne 0 && "${fleet_up}" == true ]]; then
    echo "-- failed: the fleet's last log lines"
    compose logs --no-color --tail 15 2>&1 | tail -120
  fi
  [[ -n "${up_container}" ]] && docker rm -f "${up_container}" >/dev/null
  if [[ "${fleet_up}" == true ]]; then
    compose down --remove-orphans --timeout 20 >"${work}/down.log" 2>&1 \
      || { echo "compose down failed:"; cat "${work}/down.log"; }
  fi
  if [[ -n "${engine_pid}" ]]; then
    # Our own engine: drop the images this run's rebuilds left untagged, so the kept data
    # root holds one set.
    docker image prune -f >/dev/null
  fi
  engine_stop
  rm -rf "${work}"
  local outcome=passed
  [[ ${code} -ne 0 ]] && outcome=FAILED
  [[ "${skipped}" == true ]] && outcome="offline checks passed, fleet SKIPPED (no Docker engine)"
  printf -- '-- deploy test: %s in %ds\n' "${outcome}" "$((SECONDS - started))"
  exit "${code}"
}
trap teardown EXIT
trap 'exit 130' INT TERM

phase "offline: deploy/nats-exporter tests, Kubernetes files"
(
  cd deploy/nats-exporter
  go vet ./...
  go test ./...
  unformatted="$(gofmt -l .)"
  [[ -z "${unformatted}" ]] || { echo "FAIL  gofmt would change: ${unformatted}" >&2; exit 1; }
)
if command -v kubectl >/dev/null 2>&1; then
  kubectl kustomize deploy/k8s >"${work}/k8s.yaml"
else
  go run sigs.k8s.io/kustomize/kustomize/v5@v5.8.3 build deploy/k8s >"${work}/k8s.yaml"
fi
python3 deploy/test/k8s.py "${work}/k8s.yaml" "${shaddock_bin}" "${nats_server_bin}"
took

phase "Docker engine"
if ! engine_start; then
  if [[ "${skip_without_engine}" == true ]]; then
    echo "SKIPPED the compose fleet checks: no Docker engine here: ${engine_why_not}"
    skipped=true
    exit 0
  fi
  echo "error: no Docker engine: ${engine_why_not}" >&2
  exit 1
fi
took

if [[ -n "${engine_pid}" ]]; then
  # Our own data root: containers a killed earlier run left behind would come back with
  # their restart policy; they are this script's, so remove them.
  stale="$(docker ps -a --filter label=com.docker.compose.project \
    --format '{{.ID}} {{.Label "com.docker.compose.project"}}' | awk '$2 ~ /^shaddocktest[0-9]+$/ {print $1}')"
  if [[ -n "${stale}" ]]; then
    echo "removing containers of earlier runs: ${stale//$'\n'/ }"
    # shellcheck disable=SC2086
    docker rm -f ${stale} >/dev/null
    docker network prune -f --filter label=com.docker.compose.network=default >/dev/null
  fi
fi

phase "images (deploy/images.sh)"
deploy/images.sh --shaddock-bin "${shaddock_bin}" --nats-server-bin "${nats_server_bin}"
took

phase "compose fleet up: 3 nats-server, 3 exporters, 2 gates, 3 chat, 1 echo, 1 profile, Prometheus"
export SHADDOCK_PUBLISH_ADDR=127.0.0.1 SHADDOCK_GATE1_PORT="" SHADDOCK_GATE2_PORT="" \
  SHADDOCK_NATS_PORT="" SHADDOCK_NATS_MONITOR_PORT="" SHADDOCK_PROMETHEUS_PORT="" SHADDOCK_GRAFANA_PORT=""
services=(nats-1 nats-2 nats-3 nats-exporter-1 nats-exporter-2 nats-exporter-3 gate-1 gate-2 chat echo profile prometheus)
fleet_up=true
compose up -d --no-build "${services[@]}" 2>"${work}/up.log" || { cat "${work}/up.log" >&2; exit 1; }
published() { compose port "$1" "$2" | tail -1; }
gate1="ws://$(published gate-1 3250)"
gate2="ws://$(published gate-2 3250)"
prom="http://$(published prometheus 9090)"
echo "gates ${gate1} ${gate2}, Prometheus ${prom}"
python3 deploy/test/prom.py targets "${prom}" gate=2 nats=3 worker=5
python3 deploy/test/prom.py cluster "http://$(published nats-1 8222)" 2
took

phase "chat: a client on each gate, one room"
node deploy/test/chat-two-gates.mjs "${gate1}" "${gate2}"
took

phase "the image's default command: shaddock up"
up_container="$(docker run -d --network "${project}_default" -p 127.0.0.1::3250 -p 127.0.0.1::8222 \
  -p 127.0.0.1::9100 "${SHADDOCK_IMAGE:-shaddock:latest}" 2>"${work}/run.log")" \
  || { cat "${work}/run.log" >&2; exit 1; }
up_port() { docker port "${up_container}" "$1" | head -1; }
deadline=$((SECONDS + 30))
until node deploy/test/echo.mjs "ws://$(up_port 3250)" >"${work}/up-echo.log" 2>&1; do
  if ((SECONDS > deadline)) || [[ "$(docker inspect -f '{{.State.Running}}' "${up_container}")" != true ]]; then
    cat "${work}/up-echo.log" >&2
    docker logs --tail 20 "${up_container}" >&2
    exit 1
  fi
  sleep 0.2
done
cat "${work}/up-echo.log"
took

phase "a request the paused echo worker cannot answer times out at the gate"
echo_container="$(compose ps -q echo)"
docker pause "${echo_container}" >/dev/null
node deploy/test/echo.mjs "${gate1}" 408
docker unpause "${echo_container}" >/dev/null
node deploy/test/echo.mjs "${gate1}"
took

phase "every metric the Grafana dashboard queries, in a live scrape"
python3 deploy/test/prom.py dashboard "${prom}" deploy/grafana/dashboards/shaddock.json \
  "http://$(up_port 8222)/metrics" "http://$(up_port 9100)/metrics"
took

phase "--scale chat=6: every chat worker takes a share"
compose up -d --no-build --no-recreate --scale chat=6 chat 2>"${work}/scale.log" \
  || { cat "${work}/scale.log" >&2; exit 1; }
python3 deploy/test/prom.py targets "${prom}" gate=2 nats=3 worker=8
python3 deploy/test/prom.py counts "${prom}" chat >"${work}/baseline.json"
"${shaddock_bin}" loadtest concurrency --url "${gate1},${gate2}" --service chat \
  --clients "${SCALE_CLIENTS}" --interval "${SCALE_INTERVAL}" --duration "${SCALE_DURATION}" \
  --warmup 500ms --ramp 500ms --quiet --json "${work}/scale.json" >"${work}/scale.txt"
read -r answered failed < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["runs"][0]
print(r["ok"], r["sent"]-r["ok"])' "${work}/scale.json")
grep -E '^(achieved|errors)' "${work}/scale.txt" | sed 's/^/   /'
[[ "${failed}" == 0 ]] || { echo "FAIL  ${failed} chat requests failed under the scale load" >&2; exit 1; }
# Warm-up requests are answered too: count what Prometheus saw, at least the measured.
python3 deploy/test/prom.py shares "${prom}" chat "${work}/baseline.json" "${answered}" "${SCALE_MIN_SHARE}"
took

# drain-load.mjs on gates $1 and $2, started and waited on until every client is answered.
start_load() {
  coproc LOAD { node deploy/test/drain-load.mjs "$1" "$2" "${DRAIN_CLIENTS}" "${DRAIN_INTERVAL_MS}" 2>&1; }
  # shellcheck disable=SC2153 # LOAD_PID is set by coproc
  load_pid=${LOAD_PID}
  # Copies: bash drops the coproc's descriptors when it exits.
  exec {load_out}<&"${LOAD[0]}" {load_in}>&"${LOAD[1]}"
  local line
  while read -r line <&"${load_out}"; do
    echo "   ${line}"
    [[ "${line}" == loaded ]] && break
  done
  [[ "${line:-}" == loaded ]] || { wait "${load_pid}" || true; echo "FAIL  the load never started" >&2; exit 1; }
}
# Tells the load what happened ($1: the stopped gate's URL, or `bus`); it checks, reports, ends.
finish_load() {
  echo "$1" >&"${load_in}"
  exec {load_in}>&-
  local line
  while read -r line <&"${load_out}"; do echo "${line}"; done
  wait "${load_pid}"
}

phase "docker stop gate-1 under load: nothing lost"
gate1_container="$(compose ps -q gate-1)"
start_load "${gate1}" "${gate2}"
stop_start=${SECONDS}
docker stop "${gate1_container}" >/dev/null
echo "   gate-1 stopped in $((SECONDS - stop_start))s (stop grace $(docker inspect -f '{{.Config.StopTimeout}}' "${gate1_container}")s), exit code $(docker inspect -f '{{.State.ExitCode}}' "${gate1_container}")"
finish_load "${gate1}"
took

phase "docker restart of each nats node under load (lame duck mode): nothing lost"
start_load "${gate2}" "${gate2}"
for node in nats-1 nats-2 nats-3; do
  restart_start=${SECONDS}
  docker restart "$(compose ps -q "${node}")" >/dev/null
  # Back in the cluster (its host port may change with the restart) before the next.
  python3 deploy/test/prom.py cluster "http://$(published nats-1 8222)" 2 | sed 's/^/   /'
  echo "   ${node} restarted and routed in $((SECONDS - restart_start))s"
done
finish_load bus
took
