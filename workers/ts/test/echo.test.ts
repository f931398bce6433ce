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
