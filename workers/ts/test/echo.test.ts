// The echo worker as a process: ready line, requests, drain on SIGTERM with its count.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { EchoRequestSchema, EchoResponseSchema } from "../src/gen/echo_pb.js";
import { RpcRequestSchema, RpcResponseSchema } from "../src/gen/rpc_pb.js";
import { DEADLINE_MS, startBus, watchOutput } from "./bus.js";

// dist-test/test/echo.test.js -> dist-test/src/echo.js
const ECHO = join(dirname(fileURLToPath(import.meta.url)), "..", "src", "echo.js");

test("the echo worker serves, then drains on SIGTERM and reports its count", async () => {
  const bus = await startBus();
  const child = spawn(process.execPath, [ECHO, "--nats", bus.url, "--prefix", "p"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  try {
    const output = watchOutput(child, "Worker is ready");
    await output.ready;
    const nc = await bus.connect();
    const body = create(EchoRequestSchema, { body: new TextEncoder().encode("x") });
    for (let i = 0; i < 3; i++) {
      const request = create(RpcRequestSchema, { route: "echo.echo", body: toBinary(EchoRequestSchema, body) });
      const reply = await nc.request("p.svc.echo.echo", toBinary(RpcRequestSchema, request), { timeout: DEADLINE_MS });
      const response = fromBinary(RpcResponseSchema, reply.data);
      assert.equal(response.code, 200);
      assert.deepEqual(Buffer.from(fromBinary(EchoResponseSchema, response.body).body), Buffer.from(body.body));
    }
    const exited = once(child, "exit");
    child.kill("SIGTERM");
    const [code] = await exited;
    assert.equal(code, 0);
    assert.match(output.printed(), /Worker stopped: served=3 rejected=0/);
  } finally {
    child.kill("SIGKILL");
    bus.stop();
  }
});

test("stopped while its bus is down, the echo worker exits within its drain grace saying what it lost", async () => {
  const bus = await startBus();
  const graceMs = 1_000;
  const child = spawn(process.execPath, [ECHO, "--nats", bus.url, "--drain-grace", `${graceMs}ms`], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  try {
    let errors = "";
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => (errors += chunk));
    await watchOutput(child, "Worker is ready").ready;
    // One answer: the worker is serving, its signal handlers in place.
    const nc = await bus.connect();
    const request = create(RpcRequestSchema, { route: "echo.raw" });
    await nc.request("shaddock.svc.echo.raw", toBinary(RpcRequestSchema, request), { timeout: DEADLINE_MS });
    await bus.stop();
    const exited = once(child, "exit");
    const stopping = performance.now();
    child.kill("SIGTERM");
    const [code, signal] = await exited;
    const took = performance.now() - stopping;
    assert.equal(code, 1, `${String(signal)} ${errors}`);
    assert.ok(took < graceMs + 1_000, `within its grace: ${took}`);
    assert.match(errors, /the drain .* \(is the bus down\?\): \d+ answers and \d+ pushes not delivered/);
  } finally {
    child.kill("SIGKILL");
  }
});
