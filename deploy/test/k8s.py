#!/usr/bin/env python3
"""Offline checks of deploy/k8s, against the real binary (PyYAML; no cluster).

  k8s.py RENDERED_YAML SHADDOCK_BIN NATS_SERVER_BIN

RENDERED_YAML is `kustomize build deploy/k8s` output. For every Deployment's container:
- each `--flag` in args and each environment variable is one the binary's subcommand
  really has (its --help lists flags and `[env: NAME=...]`; RUST_LOG is read by its
  logging, so the name must be in the binary);
- the process is started from those args and env, with the container ports swapped for
  free ones and SHADDOCK_NATS for a nats-server this starts on loopback (and stops),
  and each probe (httpGet: 2xx; tcpSocket:
  connects) must answer it;
- CPU and memory requests and a memory limit are set.
Every worker Deployment has a HorizontalPodAutoscaler on it with a CPU utilization
target, min <= the Deployment's replicas <= max.
"""
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time

import yaml

# How long a started process may take until its probes answer, and to exit on SIGTERM.
READY_S = 20
STOP_S = 10
POLL_S = 0.2
# Variables read outside clap (not in --help): the logging filter.
EXTRA_ENV = {"RUST_LOG"}

failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL  {msg}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def help_text(binary, sub):
    return subprocess.run([binary, sub, "--help"], capture_output=True, text=True, check=True).stdout


def probe_ok(probe, ports):
    port = probe.get("httpGet", probe.get("tcpSocket", {})).get("port")
    port = ports.get(port, port)
    try:
        if "httpGet" in probe:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", probe["httpGet"].get("path", "/"))
            status = conn.getresponse().status
            conn.close()
            return 200 <= status < 400, f"GET {probe['httpGet'].get('path', '/')} on :{port}: {status}"
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True, f"tcp :{port}: connects"
    except OSError as err:
        return False, f"port {port}: {err}"


def check_container(name, c, binary, nats_url):
    args = c.get("args") or []
    if not args:
        fail(f"{name}: no args (the image's default command `up` is not a fleet role)")
        return
    sub = args[0]
    text = help_text(binary, sub)
    for arg in args[1:]:
        if arg.startswith("--") and f"  {arg.split('=')[0]} " not in text and f"  {arg.split('=')[0]}\n" not in text:
            fail(f"{name}: `shaddock {sub}` has no flag {arg}")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    binary_bytes = open(binary, "rb").read()
    for var in env:
        known = f"[env: {var}=" in text or f"[env: {var}]" in text
        if not known and not (var in EXTRA_ENV and var.encode() in binary_bytes):
            fail(f"{name}: `shaddock {sub}` reads no variable {var}")
    res = c.get("resources", {})
    for path in [("requests", "cpu"), ("requests", "memory"), ("limits", "memory")]:
        if not res.get(path[0], {}).get(path[1]):
            fail(f"{name}: no resources.{path[0]}.{path[1]}")

    # Start it as the container would run, on free ports.
    container_ports = {p["containerPort"]: free_port() for p in c.get("ports", [])}
    named = {p["name"]: container_ports[p["containerPort"]] for p in c.get("ports", []) if "name" in p}
    ports = {**{str(k): v for k, v in container_ports.items()}, **container_ports, **named}

    def local(value):
        for inside, outside in container_ports.items():
            value = value.replace(f":{inside}", f":{outside}")
        return value

    run_env = dict(os.environ)
    for var, value in env.items():
        # valueFrom (the pod name): any one subject token will do here.
        run_env[var] = local(value) if value is not None else f"k8s-check-{os.getpid()}"
    run_env["SHADDOCK_NATS"] = nats_url
    probes = {kind: c[kind] for kind in ("readinessProbe", "livenessProbe", "startupProbe") if kind in c}
    if not probes:
        fail(f"{name}: no probes")
        return
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([binary] + [local(a) for a in args], env=run_env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + READY_S
            pending = dict(probes)
            results = {}
            while pending and time.monotonic() < deadline and proc.poll() is None:
                for kind, probe in list(pending.items()):
                    ok, detail = probe_ok(probe, ports)
                    if ok:
                        results[kind] = detail
                        del pending[kind]
                time.sleep(POLL_S)
            for kind in pending:
                log.seek(0)
                tail = log.read().decode(errors="replace").splitlines()[-5:]
                fail(f"{name}: {kind} never answered ({probe_ok(probes[kind], ports)[1]}); log: {tail}")
            for kind, detail in results.items():
                print(f"ok    {name}: {kind} answers ({detail})")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_port(port, proc):
    deadline = time.monotonic() + READY_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(POLL_S)
    sys.exit(f"FAIL  nats-server on :{port} did not answer (exit code {proc.poll()})")


def main(rendered, binary, nats_server):
    port = free_port()
    nats = subprocess.Popen([nats_server, "-a", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, nats)
        check_all(rendered, binary, f"nats://127.0.0.1:{port}")
    finally:
        nats.terminate()
        nats.wait()
    if failures:
        sys.exit(f"FAIL  {len(failures)} Kubernetes check(s) failed")


def check_all(rendered, binary, nats_url):
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    hpas = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    if not deployments:
        fail("no Deployment rendered")
    for dname, dep in sorted(deployments.items()):
        for c in dep["spec"]["template"]["spec"]["containers"]:
            check_container(f"{dname}/{c['name']}", c, binary, nats_url)
        args = dep["spec"]["template"]["spec"]["containers"][0].get("args") or []
        if args[:1] != ["worker"]:
            continue
        mine = [h for h in hpas if h["spec"]["scaleTargetRef"]["name"] == dname
                and h["spec"]["scaleTargetRef"]["kind"] == "Deployment"]
        if len(mine) != 1:
            fail(f"{dname}: {len(mine)} HorizontalPodAutoscalers target it, want 1")
            continue
        spec = mine[0]["spec"]
        cpu = [m for m in spec.get("metrics", []) if m.get("resource", {}).get("name") == "cpu"
               and m["resource"].get("target", {}).get("averageUtilization")]
        replicas = dep["spec"].get("replicas", 1)
        if not cpu:
            fail(f"{dname}: its autoscaler has no CPU utilization target")
        elif not spec.get("minReplicas", 1) <= replicas <= spec["maxReplicas"]:
            fail(f"{dname}: replicas {replicas} outside the autoscaler's {spec.get('minReplicas', 1)}..{spec['maxReplicas']}")
        else:
            target = cpu[0]["resource"]["target"]["averageUtilization"]
            print(f"ok    {dname}: autoscaler {spec.get('minReplicas', 1)}-{spec['maxReplicas']} replicas at {target}% CPU")
    if not failures:
        print(f"ok    Kubernetes: {len(docs)} objects rendered; {len(deployments)} Deployments' args, env, probes and resources check out")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
