#!/usr/bin/env bash
# Quick offline checks of the deployment files (deploy/test.sh builds and runs them for
# real; this needs no engine and takes a second): every YAML file parses, the
# dashboard is valid JSON whose panels use known metric names, the Kubernetes
# manifests render with kustomize, compose names only files that exist, and
# scripts/cluster.sh passes shellcheck. Each check runs when its tool is installed
# and says so when it is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

ok() { printf 'ok    %s\n' "$*"; }
skip() { printf 'skip  %s\n' "$*"; }

if python3 -c 'import yaml' 2>/dev/null; then
  python3 - <<'PY'
import glob, yaml
files = sorted(glob.glob("**/*.yaml", recursive=True) + glob.glob("**/*.yml", recursive=True))
for path in files:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    assert docs, f"{path}: empty"
compose = yaml.safe_load(open("compose.yaml"))
services = compose["services"]
for name in ["nats-1", "nats-2", "nats-3", "gate-1", "gate-2", "chat", "echo", "profile", "prometheus", "grafana"]:
    assert name in services, f"compose.yaml: no service {name}"
assert services["chat"]["deploy"]["replicas"] == 3 and services["echo"]["deploy"]["replicas"] == 1
for name, svc in services.items():
    for volume in svc.get("volumes", []):
        source = volume.split(":")[0]
        assert glob.glob(source), f"compose.yaml: {name} mounts missing {source}"
print(f"ok    {len(files)} YAML files parse; compose services and mounts are in place")
PY
else
  skip "YAML parsing (python3 has no yaml module)"
fi

dashboard=grafana/dashboards/shaddock.json
if command -v jq >/dev/null 2>&1; then
  jq -e '.panels | length > 0' "${dashboard}" >/dev/null
  # Every metric the brief asks the dashboard to show is queried somewhere.
  exprs="$(jq -r '.panels[].targets[]?.expr' "${dashboard}")"
  for metric in gate_request_duration_seconds gate_in_flight gate_sessions gate_timeouts_total \
    gate_rejected_total worker_queue_depth worker_queue_wait_seconds worker_rejected_total \
    broker_in_msgs_total broker_connections; do
    grep -q "${metric}" <<<"${exprs}" || { echo "dashboard never queries ${metric}" >&2; exit 1; }
  done
  ok "${dashboard} is JSON and queries the gate, worker and broker metrics"
else
  python3 -m json.tool "${dashboard}" >/dev/null
  ok "${dashboard} is JSON (jq missing: metric names not checked)"
fi

if command -v kubectl >/dev/null 2>&1; then
  kinds="$(kubectl kustomize k8s | grep -c '^kind:')"
  ok "k8s renders with kustomize (${kinds} objects)"
else
  skip "kustomize render (no kubectl)"
fi

if command -v shellcheck >/dev/null 2>&1; then
  (cd .. && shellcheck -x scripts/cluster.sh deploy/check.sh deploy/test.sh deploy/images.sh deploy/test/engine.sh)
  ok "shellcheck scripts/cluster.sh and deploy's scripts"
else
  skip "shellcheck (not installed)"
fi

if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  docker compose -f compose.yaml config --quiet
  ok "docker compose config"
else
  skip "docker compose config (no container engine)"
fi
