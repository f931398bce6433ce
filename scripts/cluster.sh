#!/usr/bin/env bash
# Runs the deploy/compose.yaml topology as local processes, no containers: a broker,
# 2 gates, 3 chat workers, 1 echo worker and 1 profile worker, each its own `shaddock` process on
# loopback. Prints the URLs, then waits; Ctrl-C (or SIGTERM) stops exactly the
# processes it started, by pid: gates first (they drain in-flight requests), then
# workers, then the broker. If one of them dies, the rest are stopped too.
#
#   scripts/cluster.sh                      # shaddock broker, random free ports
#   scripts/cluster.sh --nats-server        # a real nats-server as the bus
#   scripts/cluster.sh --gates 4 --chat 6 --echo 2 --env-file /tmp/cluster.env
#   SHADDOCK_BIN=target/debug/shaddock scripts/cluster.sh
#
# Every process binds port 0 unless --gate-port/--broker-port say otherwise, and the
# real ports are read from its log, so several clusters (and tests) can run at once.
# Logs go to one file per process in --log-dir (a fresh temporary folder by default).

# shellcheck disable=SC2317 # teardown and its helpers run from traps
set -euo pipefail

usage() {
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  cat <<'EOF'

Options:
  --gates N          gate processes (default 2)
  --chat N           chat workers (default 3)
  --echo N           echo workers (default 1)
  --profile N        profile workers (default 1; chat.login calls the profile service)
  --nats-server      run nats-server (PATH or $(go env GOPATH)/bin) instead of
                     `shaddock broker`
  --nats URLS        use running NATS servers; start no broker
  --broker-port P    broker client port (default 0: any free port)
  --gate-port P      first gate's port; the others follow (default 0: any free port)
  --bin PATH         the shaddock binary (default $SHADDOCK_BIN, else
                     target/release/shaddock, built if missing)
  --log-dir DIR      where the per-process logs go (default: a new temp folder)
  --env-file FILE    also write the URLs and pids there as shell variables
  --ready-timeout S  seconds each process has to become ready (default 30)
  --stop-timeout S   seconds each stage has after SIGTERM before SIGKILL (default 8)
EOF
}

cd "$(dirname "${BASH_SOURCE[0]}")/.."

gates=2 chats=3 echos=1 profiles=1 broker=shaddock nats_urls="" broker_port=0 gate_port=0
bin="${SHADDOCK_BIN:-}" log_dir="" env_file="" ready_timeout=30 stop_timeout=8
while [[ $# -gt 0 ]]; do
  case "$1" in
    --gates) gates="$2"; shift 2 ;;
    --chat) chats="$2"; shift 2 ;;
    --echo) echos="$2"; shift 2 ;;
    --profile) profiles="$2"; shift 2 ;;
    --nats-server) broker="nats-server"; shift ;;
    --nats) broker=external nats_urls="$2"; shift 2 ;;
    --broker-port) broker_port="$2"; shift 2 ;;
    --gate-port) gate_port="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --log-dir) log_dir="$2"; shift 2 ;;
    --env-file) env_file="$2"; shift 2 ;;
    --ready-timeout) ready_timeout="$2"; shift 2 ;;
    --stop-timeout) stop_timeout="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "cluster.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "${bin}" ]]; then
  bin=target/release/shaddock
  if [[ ! -x "${bin}" ]]; then
    echo "building ${bin}" >&2
    cargo build --release --bin shaddock
  fi
fi
if [[ ! -x "${bin}" ]]; then
  echo "cluster.sh: no shaddock binary at ${bin}" >&2
  exit 1
fi

nats_server_bin() {
  if command -v nats-server >/dev/null 2>&1; then
    command -v nats-server
  elif command -v go >/dev/null 2>&1 && [[ -x "$(go env GOPATH)/bin/nats-server" ]]; then
    echo "$(go env GOPATH)/bin/nats-server"
  else
    echo "cluster.sh: nats-server not found (scripts/test.sh installs it)" >&2
    return 1
  fi
}

log_dir="${log_dir:-$(mktemp -d "${TMPDIR:-/tmp}/shaddock-cluster.XXXXXX")}"
mkdir -p "${log_dir}"

# Parallel arrays, in start order: role name, pid, log file.
names=() pids=() logs=()
# Set once teardown began, so a second signal does not start it again.
stopping=0

# Stops the processes whose names match $1 (a glob): SIGTERM, then SIGKILL after
# --stop-timeout. Only pids this script started and that are still its children.
stop_matching() {
  local pattern="$1" i deadline alive
  local stage=()
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2053 # the pattern is meant to glob
    if [[ "${names[i]}" == ${pattern} ]] && kill -0 "${pids[i]}" 2>/dev/null; then
      kill -TERM "${pids[i]}" 2>/dev/null || true
      stage+=("${pids[i]}")
    fi
  done
  [[ ${#stage[@]} -gt 0 ]] || return 0
  deadline=$((SECONDS + stop_timeout))
  while ((SECONDS < deadline)); do
    alive=0
    for i in "${stage[@]}"; do
      if kill -0 "${i}" 2>/dev/null; then alive=1; fi
    done
    ((alive)) || break
    sleep 0.1
  done
  for i in "${stage[@]}"; do
    if kill -0 "${i}" 2>/dev/null; then
      echo "pid ${i} did not stop after SIGTERM; killing it" >&2
      kill -KILL "${i}" 2>/dev/null || true
    fi
  done
  # Reap them, so no zombie outlives the script.
  wait "${stage[@]}" 2>/dev/null || true
}

teardown() {
  ((stopping)) && return 0
  stopping=1
  [[ ${#pids[@]} -gt 0 ]] || return 0
  echo "stopping ${#pids[@]} processes" >&2
  stop_matching 'gate-*'
  stop_matching 'worker-*'
  stop_matching 'broker'
  echo "stopped; logs in ${log_dir}" >&2
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Starts one process: start NAME PROGRAM ARGS...
start() {
  local name="$1"
  shift
  local log="${log_dir}/${name}.log"
  RUST_LOG="${RUST_LOG:-info}" "$@" >"${log}" 2>&1 &
  names+=("${name}")
  pids+=("$!")
  logs+=("${log}")
}

# Waits until the log of process index $1 has a line ending in $2, or fails with its
# tail when the process exits or --ready-timeout passes.
await_ready() {
  local i="$1" ready="$2" deadline=$((SECONDS + ready_timeout))
  until grep -q "${ready}\$" "${logs[i]}" 2>/dev/null; do
    if ! kill -0 "${pids[i]}" 2>/dev/null; then
      echo "cluster.sh: ${names[i]} exited before it was ready:" >&2
      tail -n 20 "${logs[i]}" >&2
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      echo "cluster.sh: ${names[i]} not ready after ${ready_timeout}s:" >&2
      tail -n 20 "${logs[i]}" >&2
      exit 1
    fi
    sleep 0.05
  done
}

# The first word after phrase $2 in the log of process index $1.
logged_after() {
  sed -n "s/.*$2\([^ ]*\).*/\1/p" "${logs[$1]}" | head -n 1
}

broker_monitor=""
case "${broker}" in
  external)
    nats="${nats_urls}"
    ;;
  *)
    # Both brokers take -1 for "any free port".
    port="${broker_port}"
    if [[ "${port}" == 0 ]]; then port=-1; fi
    if [[ "${broker}" == nats-server ]]; then
      start broker "$(nats_server_bin)" -a 127.0.0.1 -p "${port}" -m -1
    else
      start broker "${bin}" broker -a 127.0.0.1 -p "${port}" -m -1
    fi
    await_ready 0 "Server is ready"
    nats="nats://$(logged_after 0 'Listening for client connections on ')"
    broker_monitor="http://$(logged_after 0 'Starting http monitor on ')"
    ;;
esac

for ((n = 1; n <= gates; n++)); do
  port=0
  if ((gate_port > 0)); then port=$((gate_port + n - 1)); fi
  start "gate-${n}" "${bin}" gate --listen "127.0.0.1:${port}" --nats "${nats}" \
    --gate-id "gate-${n}" --metrics-listen 127.0.0.1:0
done
for service in chat echo profile; do
  case "${service}" in
    chat) count="${chats}" ;;
    echo) count="${echos}" ;;
    profile) count="${profiles}" ;;
  esac
  for ((n = 1; n <= count; n++)); do
    # Each its own data directory beside the logs: a directory is one process's
    # (docs/stores.md); a profile worker's profiles are lost with the cluster's folder.
    start "worker-${service}-${n}" "${bin}" worker --service "${service}" --nats "${nats}" \
      --metrics-listen 127.0.0.1:0 --data-dir "${log_dir}/data-${service}-${n}"
  done
done

gate_urls=() metrics_urls=()
for i in "${!names[@]}"; do
  case "${names[i]}" in
    gate-*)
      await_ready "${i}" "Gate is ready"
      gate_urls+=("ws://$(logged_after "${i}" 'Gate listening for WebSocket clients on ')")
      ;;
    worker-*) await_ready "${i}" "Worker is ready" ;;
  esac
  url="$(logged_after "${i}" 'Serving Prometheus metrics on ')"
  if [[ -n "${url}" ]]; then metrics_urls+=("${url}"); fi
done
if [[ "${broker}" == shaddock ]]; then metrics_urls+=("${broker_monitor}/metrics"); fi

echo
printf '%-18s %-8s %s\n' PROCESS PID ADDRESS
for i in "${!names[@]}"; do
  case "${names[i]}" in
    broker) addr="${nats}  monitor ${broker_monitor}" ;;
    gate-*) addr="ws://$(logged_after "${i}" 'Gate listening for WebSocket clients on ')" ;;
    *) addr="" ;;
  esac
  metrics="$(logged_after "${i}" 'Serving Prometheus metrics on ')"
  printf '%-18s %-8s %s%s\n' "${names[i]}" "${pids[i]}" "${addr}" "${metrics:+  metrics ${metrics}}"
done
echo
echo "gates:   $(IFS=,; echo "${gate_urls[*]}")"
echo "nats:    ${nats}"
echo "logs:    ${log_dir}"
if [[ -n "${env_file}" ]]; then
  {
    echo "SHADDOCK_GATE_URLS=$(IFS=,; echo "${gate_urls[*]}")"
    echo "SHADDOCK_NATS=${nats}"
    echo "SHADDOCK_METRICS_URLS=$(IFS=,; echo "${metrics_urls[*]}")"
    echo "SHADDOCK_PIDS=\"${pids[*]}\""
    echo "SHADDOCK_CLUSTER_PID=$$"
  } >"${env_file}"
  echo "env:     ${env_file}"
fi
echo "Cluster is ready; Ctrl-C stops it."

# Returns when any child exits: one dying means the cluster is not what was asked for.
set +e
wait -n
status=$?
set -e
for i in "${!names[@]}"; do
  if ! kill -0 "${pids[i]}" 2>/dev/null; then
    echo "cluster.sh: ${names[i]} (pid ${pids[i]}) exited (status ${status}); its last lines:" >&2
    tail -n 20 "${logs[i]}" >&2
    break
  fi
done
exit 1
