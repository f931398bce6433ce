#!/usr/bin/env python3
"""Checks against the fleet's Prometheus, for deploy/test.sh (standard library only).

  prom.py targets PROM_URL JOB=COUNT...      every target up, COUNT per job (waits)
  prom.py counts PROM_URL SERVICE            per-worker answered requests, as JSON
  prom.py shares PROM_URL SERVICE BASELINE_JSON ANSWERED MIN_SHARE
                                             waits until ANSWERED more requests are
                                             counted, then each worker's share of them
                                             must be at least MIN_SHARE of a fair one
  prom.py cluster NATS_MONITOR_URL PEERS     the node routes to PEERS other nodes
  prom.py dashboard PROM_URL DASHBOARD [METRICS_URL...]
                                             every metric name the dashboard queries is
                                             in a live scrape: Prometheus' series, or
                                             one of the /metrics pages given
Waits poll every POLL_S seconds for at most WAIT_S (argument-free: these are names).
"""
import json
import re
import sys
import time
import urllib.parse
import urllib.request

POLL_S = 0.5
WAIT_S = 60
HTTP_TIMEOUT_S = 5


def get(url):
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
        return resp.read().decode()


def api(prom, path, **params):
    query = urllib.parse.urlencode(params)
    body = json.loads(get(f"{prom}/api/v1/{path}" + (f"?{query}" if query else "")))
    if body.get("status") != "success":
        raise RuntimeError(f"{path}: {body}")
    return body["data"]


def wait(what, probe):
    """Calls probe() until it returns (ok, detail) with ok true; fails after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        ok, detail = probe()
        if ok:
            return detail
        if time.monotonic() > deadline:
            sys.exit(f"FAIL  {what}: not after {WAIT_S}s: {detail}")
        time.sleep(POLL_S)


def targets(prom, *expected):
    want = dict(e.split("=") for e in expected)
    want = {job: int(n) for job, n in want.items()}

    def probe():
        active = api(prom, "targets", state="active")["activeTargets"]
        by_job = {}
        for t in active:
            by_job.setdefault(t["labels"]["job"], []).append(t)
        counts = {job: len(by_job.get(job, [])) for job in want}
        down = [f'{t["labels"]["job"]}/{t["labels"]["instance"]}: {t["health"]} {t["lastError"]}'
                for t in active if t["health"] != "up"]
        detail = f"targets per job {counts} (want {want}); not up: {down or 'none'}"
        return counts == want and not down and set(by_job) == set(want), (detail, active)

    _, active = wait("Prometheus targets", probe)
    names = ", ".join(sorted(f'{t["labels"]["job"]}/{t["labels"]["instance"]}' for t in active))
    print(f"ok    Prometheus: all {len(active)} targets up ({names})")


def per_worker(prom, service):
    result = api(prom, "query", query=f'worker_requests_total{{service="{service}",code="200"}}')["result"]
    return {r["metric"]["instance"]: float(r["value"][1]) for r in result}


def counts(prom, service):
    print(json.dumps(per_worker(prom, service)))


def shares(prom, service, baseline_file, answered, min_share):
    with open(baseline_file) as f:
        baseline = json.load(f)
    answered, min_share = int(answered), float(min_share)
    workers = [t["labels"]["instance"] for t in api(prom, "targets", state="active")["activeTargets"]
               if t["labels"]["job"] == "worker" and t["labels"].get("deployment") == service]

    def probe():
        now = per_worker(prom, service)
        delta = {w: now.get(w, 0) - baseline.get(w, 0) for w in workers}
        total = sum(delta.values())
        return total >= answered, (f"{total:.0f} of {answered} counted", delta)

    _, delta = wait(f"{answered} {service} requests counted by Prometheus", probe)
    fair = sum(delta.values()) / len(workers)
    report = ", ".join(f"{w} {d:.0f}" for w, d in sorted(delta.items()))
    short = [w for w, d in delta.items() if d < fair * min_share]
    if short:
        sys.exit(f"FAIL  {service} workers below {min_share:.0%} of a fair share ({fair:.0f}): {short}; all: {report}")
    print(f"ok    {len(workers)} {service} workers each took a share of {sum(delta.values()):.0f} requests ({report})")


# PromQL words that are not metric names: functions are followed by "(", label names
# sit inside {...} or by/without (...), durations inside [...].
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "and", "or", "unless", "offset"}


def metric_names(expr):
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        word = m.group(0)
        rest = expr[m.end():].lstrip()
        if word in PROMQL_WORDS or rest.startswith("("):
            continue
        if m.start() > 0 and (expr[m.start() - 1].isdigit() or expr[m.start() - 1] in "$."):
            continue
        names.add(word)
    return names


def scraped_names(text):
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def dashboard(prom, dashboard_file, *metrics_urls):
    with open(dashboard_file) as f:
        board = json.load(f)
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", []) if t.get("expr")]
    wanted = set().union(*(metric_names(e) for e in exprs))

    def probe():
        live = set(api(prom, "label/__name__/values"))
        for url in metrics_urls:
            live |= scraped_names(get(url))
        missing = sorted(wanted - live)
        return not missing, f"the dashboard queries metrics no live scrape has: {', '.join(missing)}"

    # A counter first touched a moment ago is in Prometheus after its next scrape.
    wait("dashboard metrics", probe)
    print(f"ok    all {len(wanted)} metric names in the dashboard's {len(exprs)} queries are in a live scrape")


def cluster(monitor, peers):
    def probe():
        try:
            routes = json.loads(get(f"{monitor}/routez"))["routes"] or []
        except OSError as e:  # a node just restarted may not listen yet
            return False, str(e)
        names = sorted({r["remote_name"] for r in routes})
        return len(names) == int(peers), names

    names = wait(f"{monitor} routed to {peers} nodes", probe)
    print(f"ok    NATS cluster: {monitor} routes to {', '.join(names)}")


COMMANDS = {"cluster": cluster, "targets": targets, "counts": counts, "shares": shares, "dashboard": dashboard}

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    COMMANDS[sys.argv[1]](*sys.argv[2:])
