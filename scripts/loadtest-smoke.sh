#!/usr/bin/env bash
# Smoke test of the WebSocket load-test scenarios (`shaddock loadtest ...`): every
# scenario runs for about a second or two with a few clients against a topology it
# launches itself (broker, gates, workers as separate processes on loopback), or against
# the in-process bare echo server for `limit`. Fails if a scenario exits with an error or
# any of its runs reports zero successful answers. Figures are not checked: this proves
# the tool works end to end, not how fast anything is (docs/benchmarks.md for that).
# The exception is `faults`, run with --check on each bus: it fails when a phase (a
# worker added, drained or killed, a gate drained, a bus node restarted) costs the
# clients more than issue #15 allows (docs/benchmarks.md, "Faults under load").
#
#   scripts/loadtest-smoke.sh                      # uses target/debug/shaddock
#   SHADDOCK_BIN=target/release/shaddock scripts/loadtest-smoke.sh
#
# Bounded: each scenario gets SIGTERM after SCENARIO_TIMEOUT seconds (default 60), which
# stops what it launched and keeps their logs, and SIGKILL 30 s later; the whole smoke
# takes about 60 s on a 2-core machine with a debug build.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN="${SHADDOCK_BIN:-target/debug/shaddock}"
SCENARIO_TIMEOUT="${SCENARIO_TIMEOUT:-60}"
export SHADDOCK_BIN="${BIN}"

if [[ ! -x "${BIN}" ]]; then
  echo "error: ${BIN} is not built (cargo build -p shaddock)" >&2
  exit 1
fi

out="$(mktemp -d)"
trap 'rm -rf "${out}"' EXIT

# Short runs: little warm-up and ramp, a short timeout so a broken path fails fast.
short=(--warmup 0.3s --ramp 0.2s --timeout 2s --quiet)
failed=()

# The launched processes' whole logs of scenario $1 (`--logs`), shown when it failed.
show_logs() {
  local log
  for log in "${out}/logs/$1"/*.log; do
    [[ -e "${log}" ]] || continue
    echo "--- ${log##*/} (its last 200 lines)" >&2
    tail -n 200 "${log}" >&2
  done
}

scenario() {
  local name="$1"
  shift
  printf '+ shaddock loadtest %s\n' "$*"
  # Every scenario but `limit` launches processes: their logs are kept for a failure.
  local logs=()
  [[ "$1" == limit ]] || logs=(--logs "${out}/logs/${name}")
  local started=${SECONDS} status=0
  timeout --kill-after=30 "${SCENARIO_TIMEOUT}" "${BIN}" loadtest "$@" "${logs[@]}" \
    --json "${out}/${name}.json" >"${out}/${name}.txt" 2>"${out}/${name}.err" || status=$?
  if ((status)); then
    echo "FAILED: ${name} (exit status ${status})" >&2
    cat "${out}/${name}.txt" "${out}/${name}.err" >&2
    show_logs "${name}"
    failed+=("${name}")
    return
  fi
  # The tool already fails on a run without successes; check the JSON too, so a
  # report that lost its runs cannot pass silently.
  if grep -q '"ok": 0,' "${out}/${name}.json"; then
    echo "FAILED: ${name} reports a run with 0 successful answers" >&2
    cat "${out}/${name}.txt" >&2
    show_logs "${name}"
    failed+=("${name}")
    return
  fi
  grep -E '^\| [^-r]' "${out}/${name}.txt" | head -n 8 || true
  grep -E '^(best|RSS|opened)' "${out}/${name}.txt" || true
  echo "  ok in $((SECONDS - started)) s"
}

scenario concurrency concurrency --clients 2,5 --duration 1s --with-limit "${short[@]}"
# JSON clients on chat's typed route beside protobuf ones: the gate must transcode, or
# every JSON request is refused and the run reports 0 answers.
scenario concurrency-json concurrency --service chat --clients 2 --duration 1s --json-beside \
  --with-limit "${short[@]}"
# The same load over wss:// to the same gate, beside the plain run: the launched gate
# serves TLS with a throwaway CA's certificate, and the SDK's clients must trust it.
scenario concurrency-tls concurrency --clients 2 --duration 1s --tls-beside \
  --with-limit "${short[@]}"
scenario saturate saturate --clients 2 --start-rate 100 --max-rate 200 --factor 2 --scale-workers 1,2 \
  --with-limit --limit-max-rate 400 \
  --refine 0 --step 1s --p99-target 1s "${short[@]}"
scenario idle idle --sessions 50 --quiet
scenario limit limit --clients 2,5 --duration 1s "${short[@]}"
scenario broadcast broadcast --members 20 --messages 10
# Sessions opened and closed, each with an echo and a chat login and join: every
# process's RSS read before, after the warm-up and at the end (issue #34).
scenario churn churn --sessions 400 --warmup 200 --samples 1 --concurrency 50 --mix echo,chat \
  --settle 0.5s
# A keyed service: arena matches whose owner drains halfway (our broker and a nats-server
# cluster), that gain a worker halfway (the cluster), whose owner is killed (the
# cluster), or whose workers' node enters lame duck mode (the cluster); --check fails
# the run if an input is lost or applied twice, or a match's ticks skip or repeat across
# the hand-over (after a kill: no match lost, an input answered 408 or not at all may be
# in the state or not, no push gap over --max-gap; this fails until standbys, #48).
scenario matches-drain matches --matches 8 --players 2 --duration 2s --arena-workers 2 \
  --fault drain-owner --check --quiet
scenario matches-drain-cluster matches --matches 8 --players 2 --duration 2s --arena-workers 2 \
  --fault drain-owner --bus nats-cluster --check --quiet
scenario matches-add-cluster matches --matches 8 --players 2 --duration 2s --arena-workers 2 \
  --fault add-worker --bus nats-cluster --check --quiet
scenario matches-lame-duck matches --matches 8 --players 2 --duration 2s --arena-workers 2 \
  --fault lame-duck --bus nats-cluster --check --quiet
scenario matches-kill matches --matches 8 --players 2 --duration 4s --arena-workers 2 \
  --fault kill-owner --bus nats-cluster --check --quiet
# Every player's link cut at once halfway, on both buses, 2 gates: each SDK client
# resumes on the next gate of its list; --check fails the run if an input is lost or
# applied twice, a state push is skipped or repeated, or a reconnection did not resume.
for bus in shaddock nats-cluster; do
  scenario "matches-flap-$bus" matches --matches 8 --players 2 --duration 2s --gates 2 \
    --fault flap --bus "$bus" --check --quiet
done
# Every fault phase for 1.5 s under a light load, on our broker and on a 3-node
# nats-server cluster. The gates keep their 5 s request timeout (a shorter one turns a
# slow answer on a busy machine into a 408), inside the clients' 8 s, so a killed
# worker's requests show as 408s; the run waits for them only at its end.
faults=(--clients 4 --rate 50 --phase 1500ms --timeout 8s --drain-timeout 1s --check --quiet)
scenario faults-shaddock faults --bus shaddock "${faults[@]}"
scenario faults-nats-cluster faults --bus nats-cluster "${faults[@]}"


if ((${#failed[@]})); then
  echo "load-test smoke failed: ${failed[*]}" >&2
  exit 1
fi
echo "load-test smoke passed: 12 scenarios"
