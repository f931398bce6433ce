"""Checks the Python recipe (docs/recipes/README.md): the modules protoc generated from
proto/proto and docs/recipes/proto import, encode what a client and a worker send, and
give the FileDescriptorSet a worker announces, the same as protoc's own; the worker in
worker.py answers and announces correctly. Run by docs/recipes/test.sh:

    python check.py DESCRIPTOR_SET   (protoc's --descriptor_set_out, --include_imports)
"""

import sys

from google.protobuf import descriptor_pb2, descriptor_pool, json_format

import arena_pb2
import chat_pb2
import client_pb2
import echo_pb2
import greet_pb2
import profile_pb2
import resume_pb2
import rpc_pb2
import status_pb2
import worker


def expect(what: str, encoded: bytes, want: str) -> None:
    assert encoded.hex() == want, f"{what}: {encoded.hex()}, want {want}"
    print(f"{what}: {want}")


# A client's request frame in binary protobuf: the same bytes as the Go recipe's.
body = echo_pb2.EchoRequest(body=b"hi").SerializeToString()
expect('EchoRequest{body: "hi"}', body, "0a026869")
frame = client_pb2.Packet(request=client_pb2.Request(id=1, route="echo.echo", body=body))
expect("request frame", frame.SerializeToString(), "2213080112096563686f2e6563686f1a040a026869")
# ...and in JSON (a text frame): bytes are base64 in the proto3 JSON mapping.
as_json = json_format.MessageToDict(echo_pb2.EchoRequest(body=b"hi"))
assert as_json == {"body": "aGk="}, as_json
assert status_pb2.STATUS_UNAVAILABLE == 503 and status_pb2.Status.Name(401) == "STATUS_UNAUTHORIZED"

# The descriptor set, built from the modules, holds what protoc's does.
generated = (
    arena_pb2, chat_pb2, client_pb2, echo_pb2, greet_pb2, profile_pb2, resume_pb2, rpc_pb2, status_pb2,
)
modules = worker.descriptor_set(*(m.DESCRIPTOR for m in generated))
with open(sys.argv[1], "rb") as f:
    from_protoc = descriptor_pb2.FileDescriptorSet.FromString(f.read())
assert sorted(f.name for f in modules.file) == sorted(f.name for f in from_protoc.file), (
    [f.name for f in modules.file],
    [f.name for f in from_protoc.file],
)
for files in (modules, from_protoc):
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    for name in ("shaddock.client.Packet", "shaddock.rpc.ServiceSchema", "game.greet.HelloRequest"):
        pool.FindMessageTypeByName(name)
print(f"descriptor sets: {len(modules.file)} files, from the modules and from protoc alike")

# The worker: its announcement names the method alone, and types its descriptors hold.
schema = rpc_pb2.ServiceSchema.FromString(worker.announcement())
assert schema.service == "greet" and [m.method for m in schema.methods] == ["hello"], schema
pool = descriptor_pool.DescriptorPool()
for file in descriptor_pb2.FileDescriptorSet.FromString(schema.descriptors).file:
    pool.Add(file)
for m in schema.methods:
    pool.FindMessageTypeByName(m.request_type)
    pool.FindMessageTypeByName(m.response_type)
print(f"announcement: greet.{schema.methods[0].method} {schema.methods[0].request_type} -> {schema.methods[0].response_type}")


# A request as a gate sends it, and the answers.
def ask(method: str, body: bytes, uid: str = "") -> rpc_pb2.RpcResponse:
    request = rpc_pb2.RpcRequest(route=f"greet.{method}", body=body, session=rpc_pb2.Session(gate="g1", sid=7, uid=uid))
    return rpc_pb2.RpcResponse.FromString(worker.handle(method, request.SerializeToString()))


answer = ask("hello", greet_pb2.HelloRequest(name="ann").SerializeToString())
assert answer.code == 200 and greet_pb2.HelloResponse.FromString(answer.body).text == "hello, ann", answer
answer = ask("hello", b"", uid="bob")
assert greet_pb2.HelloResponse.FromString(answer.body).text == "hello, bob", answer
assert ask("hello", b"").code == 400
assert ask("hello", b"\x0a\x05ab").code == 400  # a truncated body
assert ask("nope", b"").code == 404
assert rpc_pb2.RpcResponse.FromString(worker.handle("hello", b"\xff")).code == 400
print("worker: 200, 400 and 404 as docs/workers.md says")
