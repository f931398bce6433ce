#!/usr/bin/env bash
# Markdown backticks in single-quoted printf formats are literal on purpose.
# shellcheck disable=SC2016
#
# Broker vs nats-server, as BENCHMARKS.md "Broker vs nats-server" defines it.
#
# For each scenario the two servers run ALTERNATELY (ours, theirs, ours, theirs, ...), each
# run against a freshly started server on a free port, and the table reports medians and
# the ratio ours / nats-server measured in this same invocation: on a shared 2-core machine
# only same-run ratios mean anything.
#
#   B1..B5  Go nats-bench, flags exactly as BENCHMARKS.md; figure "NATS Pub/Sub stats"
#           msgs/sec ("Pub stats" for B1, which has no subscriber).
#   B6      `shaddock-loadtest bus-rr` (= `shaddock loadtest bus-rr`): 50 requesters,
#           2 queue responders, 16 B, 5 s.
#   MEM     `shaddock-loadtest idle-conns`: resident bytes per idle connection (1,000).
#
# Environment:
#   ROUNDS=3            runs per server per scenario (medians over these)
#   SCENARIOS="B1 B2 B3 B4 B5 B6 MEM"   subset to run, e.g. SCENARIOS="B2 B5"
#   RUN_TIMEOUT=120     seconds before one run is killed and reported as stalled
#   OURS=target/release/broker          our server binary (built unless overridden)
#   THEIRS=nats-server  peer binary (go-installed at the pinned version if missing)
#   NATS_BENCH=nats-bench               client binary (go-installed if missing)
#   LOADTEST=target/release/shaddock-loadtest   B6/MEM tool (or "target/release/shaddock loadtest")
#   SKIP_BUILD=1        do not run cargo
#   QUIET_WAIT=1800     seconds to wait for a running cargo/rustc before each run
#   B6_DURATION=5s  B6_WARMUP=1s  MEM_CONNS=1000
#
# The report is markdown on stdout (paste into docs/benchmarks.md); progress on stderr.
# Validating the script itself, without our broker: OURS=$(command -v nats-server) — such a
# run compares nats-server with itself and its figures are not ours.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

ROUNDS=${ROUNDS:-3}
SCENARIOS=${SCENARIOS:-"B1 B2 B3 B4 B5 B6 MEM"}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
# Startup is milliseconds; this only bounds a server that never says it is ready.
READY_TIMEOUT=${READY_TIMEOUT:-15}
B6_DURATION=${B6_DURATION:-5s}
B6_WARMUP=${B6_WARMUP:-1s}
MEM_CONNS=${MEM_CONNS:-1000}
NATS_SERVER_VERSION=v2.15.2
NATS_BENCH_VERSION=v1.12.0
DEFAULT_OURS=$ROOT/target/release/broker
OURS=${OURS:-$DEFAULT_OURS}

declare -A FLAGS=(
  [B1]="-np 1 -ns 0 -n 1000000 -ms 16"
  [B2]="-np 1 -ns 1 -n 1000000 -ms 16"
  [B3]="-np 1 -ns 4 -n 200000 -ms 128"
  [B4]="-np 4 -ns 4 -n 400000 -ms 128"
  [B5]="-np 10 -ns 100 -n 20000 -ms 1000"
)

log() { printf '%s\n' "$*" >&2; }
die() { log "bench-broker: $*"; exit 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-broker.XXXXXX")
SERVER_PID=""
DRAIN_PID=""
KEEP_WORK=0
cleanup() {
  if [[ -n $SERVER_PID ]]; then stop_server; fi
  if ((KEEP_WORK)); then
    rm -f "$WORK/ours-server"
    log "logs of the failed or stalled runs are kept in $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- tools and build

gobin() { echo "$(go env GOPATH)/bin"; }

# Finds a Go tool on PATH or in GOPATH/bin, installing the pinned version if absent.
go_tool() {
  local name=$1 module=$2 found
  found=$(command -v "$name" 2>/dev/null || true)
  if [[ -z $found ]] && command -v go >/dev/null; then
    [[ -x $(gobin)/$name ]] && found=$(gobin)/$name
  fi
  if [[ -z $found ]]; then
    command -v go >/dev/null || die "$name not found and no go toolchain to install it"
    log "installing $module"
    go install "$module" >&2 || die "go install $module failed"
    found=$(gobin)/$name
  fi
  echo "$found"
}

THEIRS=${THEIRS:-$(go_tool nats-server "github.com/nats-io/nats-server/v2@$NATS_SERVER_VERSION")}
NATS_BENCH=${NATS_BENCH:-$(go_tool nats-bench "github.com/nats-io/nats.go/examples/nats-bench@$NATS_BENCH_VERSION")}
theirs_version=$("$THEIRS" --version 2>&1 | head -n1 || true)
[[ $theirs_version == *"$NATS_SERVER_VERSION"* ]] ||
  log "warning: peer is '$theirs_version', BENCHMARKS.md pins $NATS_SERVER_VERSION"

# The load tool is `shaddock-loadtest`, the same `loadtest::run` as `shaddock loadtest`
# with fewer crates to build than the root binary (which links every role): this script
# only needs the broker and the tool. LOADTEST="target/release/shaddock loadtest" selects the
# root binary instead.
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  if [[ $OURS == "$DEFAULT_OURS" ]]; then
    log "building broker and shaddock-loadtest (release)"
    cargo build --release -p shaddock-broker -p shaddock-loadtest --bins >&2 ||
      die "cargo build failed"
  else
    log "building shaddock-loadtest (release); OURS=$OURS is used as is"
    cargo build --release -p shaddock-loadtest --bins >&2 || die "cargo build failed"
  fi
fi
[[ -x $OURS ]] || die "our server $OURS is not an executable (build it, or set OURS)"
# Run a snapshot: a rebuild of target/release during the runs must not swap the binary
# between rounds.
OURS_LABEL=${OURS#"$ROOT"/}
cp "$OURS" "$WORK/ours-server"
OURS_SUM=$(sha256sum "$WORK/ours-server" | cut -c1-12)
OURS=$WORK/ours-server
read -r -a LOADTEST <<<"${LOADTEST:-$ROOT/target/release/shaddock-loadtest}"
[[ -x ${LOADTEST[0]} ]] || LOADTEST=()

# ---------------------------------------------------------------- one server

# Starts "$1" on a free port: sets SERVER_PID and SERVER_PORT. Reads the server's log as it
# is written (through a FIFO) until "Server is ready", so there is no sleep and no race
# with the port; then keeps draining the log so the server never blocks on stderr.
start_server() {
  local bin=$1 log_file=$2 fifo=$WORK/server.fifo line ready=0 fd deadline
  rm -f "$fifo"
  mkfifo "$fifo"
  "$bin" -a 127.0.0.1 -p -1 >"$fifo" 2>&1 &
  SERVER_PID=$!
  exec {fd}<"$fifo"
  rm -f "$fifo"
  SERVER_PORT=""
  deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)) && IFS= read -r -t $((deadline - SECONDS)) -u "$fd" line; do
    printf '%s\n' "$line" >>"$log_file"
    if [[ $line =~ Listening\ for\ client\ connections\ on\ [^[:space:]]*:([0-9]+) ]]; then
      SERVER_PORT=${BASH_REMATCH[1]}
    fi
    if [[ $line == *"Server is ready"* ]]; then
      ready=1
      break
    fi
  done
  cat <&"$fd" >>"$log_file" &
  DRAIN_PID=$!
  exec {fd}<&-
  if ((!ready)) || [[ -z $SERVER_PORT ]]; then
    log "server $bin did not become ready (log: $log_file)"
    tail -n 5 "$log_file" >&2 || true
    stop_server
    return 1
  fi
}

# Stops exactly SERVER_PID: TERM, then KILL if it has not exited within 5 s. The server is
# our child and not reaped until the final `wait`, so its pid cannot have been reused.
stop_server() {
  local tick
  if [[ -n $SERVER_PID ]]; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for ((tick = 0; tick < 100; tick++)); do
      alive "$SERVER_PID" || break
      sleep 0.05
    done
    if alive "$SERVER_PID"; then
      log "server $SERVER_PID ignored TERM for 5 s; killing it"
      kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [[ -n $DRAIN_PID ]]; then wait "$DRAIN_PID" 2>/dev/null || true; fi
  SERVER_PID=""
  DRAIN_PID=""
}

# True while pid $1 runs (a zombie, exited but not yet reaped, does not count).
alive() {
  local _pid _comm state
  read -r _pid _comm state _ 2>/dev/null <"/proc/$1/stat" || return 1
  [[ $state != Z ]]
}

# ---------------------------------------------------------------- one run

# Runs scenario $1 once against server binary $2 and sets RUN_RESULT to its figure, or to
# "stalled" / "failed". B6 gives "req_per_s p50_us p99_us errors"; MEM bytes per
# connection. Sets a global rather than printing so that it runs in this shell, not a
# command-substitution subshell: the server stays visible to the EXIT trap.
run_one() {
  local scenario=$1 bin=$2 tag=$3 round=$4 out rc=0 figure
  local server_log=$WORK/$scenario.$tag.$round.server.log
  out=$WORK/$scenario.$tag.$round.out
  RUN_RESULT=failed
  start_server "$bin" "$server_log" || { KEEP_WORK=1; return 0; }
  local url=nats://127.0.0.1:$SERVER_PORT
  case $scenario in
    B1 | B2 | B3 | B4 | B5)
      # shellcheck disable=SC2086 # FLAGS holds several words on purpose
      timeout -k 5 "$RUN_TIMEOUT" "$NATS_BENCH" -s "$url" ${FLAGS[$scenario]} foo >"$out" 2>&1 || rc=$?
      ;;
    B6)
      timeout -k 5 "$RUN_TIMEOUT" "${LOADTEST[@]}" bus-rr --url "$url" --requesters 50 \
        --responders 2 --size 16 --duration "$B6_DURATION" --warmup "$B6_WARMUP" --json - \
        >"$out" 2>"$out.err" || rc=$?
      ;;
    MEM)
      timeout -k 5 "$RUN_TIMEOUT" "${LOADTEST[@]}" idle-conns --url "$url" --pid "$SERVER_PID" \
        --conns "$MEM_CONNS" --json - >"$out" 2>"$out.err" || rc=$?
      ;;
  esac
  if ! alive "$SERVER_PID"; then
    log "  $scenario $tag: server exited during the run (log: $server_log)"
    if ((rc == 0)); then rc=1; fi
  fi
  stop_server
  if ((rc == 124 || rc == 137)); then
    KEEP_WORK=1
    RUN_RESULT=stalled
    return 0
  fi
  figure=""
  if ((rc == 0)); then
    case $scenario in
      B1) figure=$(stat_line 'Pub stats' <"$out") ;;
      B2 | B3 | B4 | B5) figure=$(stat_line 'NATS Pub/Sub stats' <"$out") ;;
      B6) figure="$(json_field req_per_s <"$out") $(json_field p50_us <"$out") $(json_field p99_us <"$out") $(json_field errors <"$out")" ;;
      MEM) figure=$(json_field bytes_per_conn <"$out") ;;
    esac
  fi
  if [[ -z ${figure// /} ]]; then
    KEEP_WORK=1
    log "  $scenario $tag: run failed (rc=$rc, output: $out)"
    tail -n 5 "$out" "$out.err" 2>/dev/null >&2 || true
    return 0
  fi
  RUN_RESULT=$figure
}

# "  Pub stats: 4,499,748 msgs/sec ~ ..." -> 4499748 (first line starting with $1).
stat_line() {
  local re="^[[:space:]]*$1: ([0-9,]+) msgs/sec"
  sed -nE "\#$re#{s#$re.*#\1#p;q}" | tr -d ,
}

# Numeric field $1 of a one-line JSON object on stdin.
json_field() {
  sed -nE "s/.*\"$1\":(-?[0-9.]+).*/\1/p;T;q"
}

# ---------------------------------------------------------------- statistics and format

# Median of the numeric arguments (non-numbers such as "stalled" are skipped); empty if none.
median() {
  printf '%s\n' "$@" | { grep -E '^-?[0-9.]+$' || true; } | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit; if (NR % 2) print v[(NR + 1) / 2];
         else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# Count of non-numeric results ("stalled", "failed") among the arguments, as a note.
misses() {
  local stalled=0 failed=0 v
  for v in "$@"; do
    case $v in stalled) stalled=$((stalled + 1)) ;; failed) failed=$((failed + 1)) ;; esac
  done
  local note=""
  ((stalled)) && note+=" ($stalled stalled)"
  ((failed)) && note+=" ($failed failed)"
  echo "$note"
}

ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b != 0) printf "%.2f", a / b }'; }
mega() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { printf "%.2f M", v / 1e6 }'; }
kilo() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { printf "%.1fk", v / 1e3 }'; }
ms() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { printf "%.3f ms", v / 1e3 }'; }
show() { if [[ -n $1 ]]; then echo "$1"; else echo "—"; fi; }
# Raw per-run values, for the detail column: "5.1 M, 5.0 M, stalled".
runs_text() {
  local unit=$1 v out=()
  shift
  for v in "$@"; do
    if [[ $v =~ ^-?[0-9.]+$ ]]; then out+=("$("$unit" "$v")"); else out+=("$v"); fi
  done
  local joined
  joined=$(IFS=,; echo "${out[*]}")
  echo "${joined//,/, }"
}
plain() { echo "$1"; }

# ---------------------------------------------------------------- main

compiler_busy() { pgrep -x rustc >/dev/null || pgrep -x cargo >/dev/null; }

# A compile on the same 2 cores halves what either server gets: wait (up to QUIET_WAIT
# seconds) for any cargo/rustc to finish before each run, and count runs that still
# overlapped one so the report can say so.
QUIET_WAIT=${QUIET_WAIT:-1800}
NOISY_RUNS=0
wait_quiet() {
  local deadline=$((SECONDS + QUIET_WAIT)) said=0
  while compiler_busy && ((SECONDS < deadline)); do
    if ((!said)); then log "waiting for cargo/rustc to finish (QUIET_WAIT=$QUIET_WAIT s)"; said=1; fi
    sleep 5
  done
}

declare -A RESULTS
SELECTED=()
for scenario in $SCENARIOS; do
  case $scenario in
    B1 | B2 | B3 | B4 | B5 | MEM | B6) ;;
    *) die "unknown scenario $scenario (B1..B6, MEM)" ;;
  esac
  if [[ $scenario == B6 || $scenario == MEM ]] && ((${#LOADTEST[@]} == 0)); then
    die "$scenario needs the loadtest binary: build with cargo or unset SKIP_BUILD"
  fi
  SELECTED+=("$scenario")
done

for scenario in "${SELECTED[@]}"; do
  for round in $(seq 1 "$ROUNDS"); do
    for side in ours theirs; do
      if [[ $side == ours ]]; then bin=$OURS; else bin=$THEIRS; fi
      wait_quiet
      busy_before=0
      if compiler_busy; then busy_before=1; fi
      run_one "$scenario" "$bin" "$side" "$round"
      if ((busy_before)) || compiler_busy; then
        NOISY_RUNS=$((NOISY_RUNS + 1))
        log "$scenario round $round/$ROUNDS $side: $RUN_RESULT (a compiler was running)"
      else
        log "$scenario round $round/$ROUNDS $side: $RUN_RESULT"
      fi
      RESULTS[$scenario,$side]+="${RESULTS[$scenario,$side]:+;}$RUN_RESULT"
    done
  done
done

# Loads the runs of scenario $1 into the arrays o (ours) and t (theirs).
load_runs() {
  IFS=';' read -r -a o <<<"${RESULTS[$1,ours]:-}"
  IFS=';' read -r -a t <<<"${RESULTS[$1,theirs]:-}"
}

# The command that reproduces this report, with every setting that differs from the default.
command_line="ROUNDS=$ROUNDS SCENARIOS=\"${SELECTED[*]}\""
for var in OURS RUN_TIMEOUT B6_DURATION B6_WARMUP MEM_CONNS; do
  case $var in
    OURS) [[ $OURS_LABEL == "${DEFAULT_OURS#"$ROOT"/}" ]] && continue ;;
    RUN_TIMEOUT) [[ $RUN_TIMEOUT == 120 ]] && continue ;;
    B6_DURATION) [[ $B6_DURATION == 5s ]] && continue ;;
    B6_WARMUP) [[ $B6_WARMUP == 1s ]] && continue ;;
    MEM_CONNS) [[ $MEM_CONNS == 1000 ]] && continue ;;
  esac
  if [[ $var == OURS ]]; then command_line+=" OURS=$OURS_LABEL"; else command_line+=" $var=${!var}"; fi
done
if [[ ${SKIP_BUILD:-0} == 1 ]]; then command_line+=" SKIP_BUILD=1"; fi
command_line+=" scripts/bench-broker.sh"

machine_cpu=$(lscpu 2>/dev/null | sed -nE 's/^Model name:[[:space:]]+//p' | head -n1)
machine_mem=$(free -h 2>/dev/null | awk '/^Mem:/ { print $2 }')
revision=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "no commit")
if [[ -n $(git -C "$ROOT" status --porcelain 2>/dev/null | head -n1) ]]; then
  revision+=" (uncommitted changes)"
fi

cat <<EOF
### Broker vs nats-server — $(date -u '+%Y-%m-%d %H:%M UTC')

- Command: \`$command_line\`
- Machine: $(nproc) cores, ${machine_cpu:-unknown CPU}, ${machine_mem:-?} RAM, Linux $(uname -r)
- Ours: \`$OURS_LABEL\` (sha256 $OURS_SUM), tree at $revision; theirs: \`$THEIRS\` ($theirs_version); client: nats-bench $NATS_BENCH_VERSION, \`${LOADTEST[*]##*/}\`
- Each figure is the median of $ROUNDS runs per server, ours and theirs alternating, each run on a freshly started server.
EOF
((NOISY_RUNS)) && echo "- Warning: $NOISY_RUNS runs overlapped a cargo/rustc process; treat the figures as noisy."
[[ $OURS_LABEL != "${DEFAULT_OURS#"$ROOT"/}" ]] && echo "- Note: OURS was overridden to \`$OURS_LABEL\`; these are not the project's broker figures."

bench_rows=0
for scenario in "${SELECTED[@]}"; do
  [[ -n ${FLAGS[$scenario]:-} ]] || continue
  if ((bench_rows == 0)); then
    printf '\n| id | nats-bench flags | ours (median msgs/s) | nats-server (median) | ours ÷ nats-server | runs: ours / nats-server |\n'
    printf '|----|-----------------|---------------------:|---------------------:|------------------:|---------------------------|\n'
  fi
  bench_rows=$((bench_rows + 1))
  load_runs "$scenario"
  mo=$(median "${o[@]}")
  mt=$(median "${t[@]}")
  printf '| %s | `%s` | %s%s | %s%s | %s | %s / %s |\n' "$scenario" "${FLAGS[$scenario]}" \
    "$(show "$(mega "$mo")")" "$(misses "${o[@]}")" "$(show "$(mega "$mt")")" "$(misses "${t[@]}")" \
    "$(show "$(ratio "$mo" "$mt")")" "$(runs_text mega "${o[@]}")" "$(runs_text mega "${t[@]}")"
done

if [[ " ${SELECTED[*]} " == *" B6 "* ]]; then
  load_runs B6
  # Column $1 of each run ("req_per_s p50_us p99_us errors"), failures passed through.
  col() {
    local i=$1 v
    shift
    for v in "$@"; do
      if [[ $v == stalled || $v == failed ]]; then echo "$v"; else echo "$v" | awk -v i="$i" '{ print $i }'; fi
    done
  }
  # One table row: label, column, formatter; each column's median taken on its own.
  b6_row() {
    local ov tv mo mt
    mapfile -t ov < <(col "$2" "${o[@]}")
    mapfile -t tv < <(col "$2" "${t[@]}")
    mo=$(median "${ov[@]}")
    mt=$(median "${tv[@]}")
    printf '| %s | %s | %s | %s | %s / %s |\n' "$1" "$(show "$($3 "$mo")")" \
      "$(show "$($3 "$mt")")" "$(show "$(ratio "$mo" "$mt")")" \
      "$(runs_text "$3" "${ov[@]}")" "$(runs_text "$3" "${tv[@]}")"
  }
  sum() { awk '/^[0-9]+$/ { s += $1 } END { print s + 0 }'; }
  printf '\n**B6** request-reply: `%s bus-rr --requesters 50 --responders 2 --size 16 --duration %s --warmup %s`%s\n\n' \
    "${LOADTEST[*]##*/}" "$B6_DURATION" "$B6_WARMUP" "$(misses "${o[@]}" "${t[@]}")"
  printf '| B6 | ours (median) | nats-server (median) | ours ÷ nats-server | runs: ours / nats-server |\n'
  printf '|----|--------------:|---------------------:|------------------:|---------------------------|\n'
  b6_row req/s 1 kilo
  b6_row p50 2 ms
  b6_row p99 3 ms
  printf '| errors (all runs) | %s | %s | | |\n' "$(col 4 "${o[@]}" | sum)" "$(col 4 "${t[@]}" | sum)"
fi

if [[ " ${SELECTED[*]} " == *" MEM "* ]]; then
  load_runs MEM
  mo=$(median "${o[@]}")
  mt=$(median "${t[@]}")
  printf '\n**Memory per idle connection** (%s connections, CONNECT + PING/PONG, RSS delta ÷ connections)\n\n' "$MEM_CONNS"
  printf '| | ours (median) | nats-server (median) | ours ÷ nats-server | runs: ours / nats-server |\n'
  printf '|-|--------------:|---------------------:|------------------:|---------------------------|\n'
  printf '| bytes / connection | %s%s | %s%s | %s | %s / %s |\n' "$(show "$mo")" "$(misses "${o[@]}")" \
    "$(show "$mt")" "$(misses "${t[@]}")" "$(show "$(ratio "$mo" "$mt")")" \
    "$(runs_text plain "${o[@]}")" "$(runs_text plain "${t[@]}")"
fi
echo
echo "Ratios: above 1 is better for msgs/s and req/s; below 1 is better for latency and memory."
