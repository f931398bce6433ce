# shellcheck shell=bash
# shellcheck disable=SC2034 # engine_pid and engine_why_not are read by the caller
# A Docker engine for deploy/test.sh (sourced, not run). engine_start uses the engine
# DOCKER_HOST (or /var/run/docker.sock) names when one answers; otherwise it starts a
# dockerd of its own, records its pid, and engine_stop stops exactly that process.
#
# Our dockerd changes nothing on the host beyond its own folders: no docker0 bridge
# (--bridge=none: compose makes its own networks, removed at teardown), no iptables
# rules and no ip_forward change (published ports are served by docker-proxy on
# loopback; containers reach each other on their compose network and nothing outside).
# Its data root (SHADDOCK_DOCKER_DATA_ROOT, default /var/lib/shaddock-docker) is kept
# between runs: that is where the debootstrap'd base image stays cached.

ENGINE_DATA_ROOT="${SHADDOCK_DOCKER_DATA_ROOT:-/var/lib/shaddock-docker}"
ENGINE_RUN_DIR="${SHADDOCK_DOCKER_RUN_DIR:-/run/shaddock-docker}"
# How long dockerd may take to answer, and to exit on SIGTERM (it stops its containers).
ENGINE_START_TIMEOUT_S="${SHADDOCK_DOCKER_START_TIMEOUT_S:-60}"
ENGINE_STOP_TIMEOUT_S="${SHADDOCK_DOCKER_STOP_TIMEOUT_S:-30}"

engine_pid=""
# Why engine_start found no engine.
engine_why_not=""

# The Debian docker client (BuildKit without the buildx plugin), else any.
DOCKER="${DOCKER:-$(command -v /usr/bin/docker || command -v docker || true)}"
export DOCKER
docker() { "${DOCKER}" "$@"; }
# Compose v1 (Debian 12's docker-compose) or v2 (the docker plugin); both read
# deploy/compose.yaml.
compose_cmd() {
  if command -v docker-compose >/dev/null 2>&1; then
    docker-compose "$@"
  else
    docker compose "$@"
  fi
}

# Installs the Debian packages of the given commands that are missing; false (with
# engine_why_not) when it cannot.
engine_packages() {
  local missing=() cmd
  declare -A package=([dockerd]=docker.io [docker-compose]=docker-compose [debootstrap]=debootstrap)
  for cmd in "$@"; do
    command -v "${cmd}" >/dev/null 2>&1 || missing+=("${package[${cmd}]}")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    engine_why_not="missing ${missing[*]}, and no apt-get as root to install them"
    return 1
  fi
  echo "installing ${missing[*]} (Debian's packages)"
  local log
  log="$(mktemp)"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}"; } >"${log}" 2>&1; then
    engine_why_not="apt-get install ${missing[*]} failed: $(tail -3 "${log}")"
    rm -f "${log}"
    return 1
  fi
  rm -f "${log}"
  DOCKER="$(command -v /usr/bin/docker || command -v docker)"
}

engine_answers() { docker info >/dev/null 2>&1; }

# Sets DOCKER_HOST to an engine that answers; false (with engine_why_not) when none can
# be had here.
engine_start() {
  # Compose (Debian's docker-compose, unless `docker compose` works) and debootstrap,
  # for the base image, whichever engine runs.
  local tools=(debootstrap)
  docker compose version >/dev/null 2>&1 || tools+=(docker-compose)
  if [[ -n "${DOCKER_HOST:-}" ]] || [[ -S /var/run/docker.sock ]]; then
    if engine_answers; then
      engine_packages "${tools[@]}" || return 1
      echo "engine: the running one at ${DOCKER_HOST:-/var/run/docker.sock} (left running)"
      return 0
    fi
  fi
  engine_packages dockerd "${tools[@]}" || return 1
  if [[ "$(id -u)" != 0 ]]; then
    engine_why_not="dockerd needs root"
    return 1
  fi
  mkdir -p "${ENGINE_RUN_DIR}" "${ENGINE_DATA_ROOT}"
  export DOCKER_HOST="unix://${ENGINE_RUN_DIR}/docker.sock"
  if engine_answers; then
    engine_why_not="a dockerd already serves ${DOCKER_HOST} (another run of this test?)"
    return 1
  fi
  dockerd --data-root "${ENGINE_DATA_ROOT}" --exec-root "${ENGINE_RUN_DIR}/exec" \
    --pidfile "${ENGINE_RUN_DIR}/dockerd.pid" --host "${DOCKER_HOST}" \
    --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
    >"${ENGINE_RUN_DIR}/dockerd.log" 2>&1 &
  engine_pid=$!
  local deadline=$((SECONDS + ENGINE_START_TIMEOUT_S))
  until engine_answers; do
    if ! kill -0 "${engine_pid}" 2>/dev/null; then
      engine_pid=""
      engine_why_not="dockerd exited at start: $(tail -3 "${ENGINE_RUN_DIR}/dockerd.log")"
      return 1
    fi
    if ((SECONDS >= deadline)); then
      engine_stop
      engine_why_not="dockerd did not answer within ${ENGINE_START_TIMEOUT_S}s: $(tail -3 "${ENGINE_RUN_DIR}/dockerd.log")"
      return 1
    fi
    sleep 0.2
  done
  echo "engine: started dockerd pid ${engine_pid} (data root ${ENGINE_DATA_ROOT}, log ${ENGINE_RUN_DIR}/dockerd.log)"
}

# Stops the dockerd engine_start started, if any: SIGTERM, SIGKILL after the timeout.
engine_stop() {
  [[ -n "${engine_pid}" ]] || return 0
  kill -TERM "${engine_pid}" 2>/dev/null || true
  local deadline=$((SECONDS + ENGINE_STOP_TIMEOUT_S))
  while kill -0 "${engine_pid}" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if kill -0 "${engine_pid}" 2>/dev/null; then
    echo "engine: dockerd ${engine_pid} still running after ${ENGINE_STOP_TIMEOUT_S}s: SIGKILL" >&2
    kill -KILL "${engine_pid}" 2>/dev/null || true
  fi
  wait "${engine_pid}" 2>/dev/null || true
  echo "engine: stopped dockerd pid ${engine_pid}"
  engine_pid=""
}
