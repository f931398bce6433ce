"""A Shaddock worker in Python: serves `greet.hello` (docs/recipes/proto/greet.proto)
with nats-py, beside workers in any other language. The contract is docs/workers.md.

    python worker.py [--nats nats://127.0.0.1:4222] [--prefix shaddock] [--queue 1024]

Needs nats-py and protobuf, and the modules protoc generates from proto/proto/rpc.proto,
proto/proto/status.proto and greet.proto on the import path (docs/recipes/README.md).
`handle` and `announcement` do no I/O: docs/recipes/test.sh calls them directly.
"""

import argparse
import asyncio
import os
import signal
import time

import nats
from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

import greet_pb2
import rpc_pb2
import status_pb2

SERVICE = "greet"


def handle(method: str, payload: bytes, received: float | None = None) -> bytes:
    """One request: the RpcRequest's bytes in, the encoded RpcResponse out."""
    started = time.perf_counter()
    try:
        response = call(method, rpc_pb2.RpcRequest.FromString(payload))
    except DecodeError as e:
        response = error(status_pb2.STATUS_BAD_REQUEST, f"malformed RpcRequest: {e}")
    except Exception as e:  # a failed handler is a 500, and the worker keeps serving
        response = error(status_pb2.STATUS_HANDLER_ERROR, f"internal error: {type(e).__name__}")
    done = time.perf_counter()
    response.queue_us = micros(started - (received or started))
    response.handler_us = micros(done - started)
    return response.SerializeToString()


def call(method: str, request: rpc_pb2.RpcRequest) -> rpc_pb2.RpcResponse:
    """Runs one method of the service."""
    if method != "hello":
        return error(status_pb2.STATUS_NOT_FOUND, f'unknown method "{method}" of service "{SERVICE}"')
    try:
        hello = greet_pb2.HelloRequest.FromString(request.body)
    except DecodeError as e:
        return error(status_pb2.STATUS_BAD_REQUEST, f"bad request body: {e}")
    name = hello.name or request.session.uid
    if not name:
        return error(status_pb2.STATUS_BAD_REQUEST, "give a name, or log in first")
    body = greet_pb2.HelloResponse(text=f"hello, {name}").SerializeToString()
    return rpc_pb2.RpcResponse(code=status_pb2.STATUS_OK, body=body)


def announcement() -> bytes:
    """The ServiceSchema that gives JSON clients typed bodies for greet.hello."""
    request, response = greet_pb2.HelloRequest.DESCRIPTOR, greet_pb2.HelloResponse.DESCRIPTOR
    return rpc_pb2.ServiceSchema(
        service=SERVICE,
        # The method alone, as in its subject's last token: "hello", not "greet.hello".
        methods=[rpc_pb2.MethodSchema(method="hello", request_type=request.full_name, response_type=response.full_name)],
        descriptors=descriptor_set(request.file).SerializeToString(),
    ).SerializeToString()


def descriptor_set(*files) -> descriptor_pb2.FileDescriptorSet:
    """The files, with every file they import, dependencies first."""
    out, seen = descriptor_pb2.FileDescriptorSet(), set()

    def visit(file):
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            visit(dependency)
        file.CopyToProto(out.file.add())

    for file in files:
        visit(file)
    return out


def error(code: int, message: str) -> rpc_pb2.RpcResponse:
    return rpc_pb2.RpcResponse(code=code, message=message)


def micros(seconds: float) -> int:
    return min(max(int(seconds * 1e6), 0), 2**32 - 1)


async def serve(urls: str, prefix: str, capacity: int) -> None:
    nc = await nats.connect(urls.split(","), name=f"shaddock-worker-{SERVICE}-py", max_reconnect_attempts=-1)
    # Bounded: when full, a request is answered 503 at once rather than left to time out.
    queue: asyncio.Queue = asyncio.Queue(maxsize=capacity)
    overloaded = error(
        status_pb2.STATUS_UNAVAILABLE, f'service "{SERVICE}" is overloaded: its queue of {capacity} is full'
    ).SerializeToString()
    methods = f"{prefix}.svc.{SERVICE}."

    async def take(msg):
        # Never wait here: nats-py drops messages (a slow consumer) behind a callback
        # that does not keep up.
        try:
            queue.put_nowait((msg, time.perf_counter()))
        except asyncio.QueueFull:
            if msg.reply:
                await msg.respond(overloaded)

    sub = await nc.subscribe(methods + ">", queue=SERVICE, cb=take)
    schema = announcement()

    async def announce(_msg=None):
        await nc.publish(f"{prefix}.schema.svc.{SERVICE}", schema)

    asks = await nc.subscribe(f"{prefix}.schema.ask", cb=announce)
    await announce()
    await nc.flush()  # a round trip: the server has the subscriptions
    print(f"Worker is ready: serving {methods}> in queue group {SERVICE}", flush=True)

    async def answer():  # one request at a time, in arrival order
        while True:
            msg, received = await queue.get()
            response = handle(msg.subject[len(methods):], msg.data, received)
            if msg.reply:  # none: a client's notify, handled and never answered
                await msg.respond(response)
            queue.task_done()

    answering = asyncio.create_task(answer())
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await stop.wait()
    print("draining", flush=True)
    # Drain: UNSUB, then a PING/PONG round trip (the server has sent everything it
    # routed here), then every message received has been through `take`.
    await asks.unsubscribe()
    await sub.drain()
    await queue.join()  # every request taken is answered
    answering.cancel()
    await nc.drain()  # flushes the answers, then closes
    print("Worker stopped", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", default=os.environ.get("SHADDOCK_NATS", "nats://127.0.0.1:4222"))
    parser.add_argument("--prefix", default=os.environ.get("SHADDOCK_PREFIX", "shaddock"))
    parser.add_argument("--queue", type=int, default=1024)
    args = parser.parse_args()
    asyncio.run(serve(args.nats, args.prefix, args.queue))


if __name__ == "__main__":
    main()
