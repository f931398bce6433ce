// Command recipe uses Go types generated from proto/proto with nothing but the files'
// go_package options (docs/recipes/README.md). It encodes the frames a Go client sends
// a gate in binary protobuf, decodes the gate's answer, and builds the schema
// announcement a Go worker publishes, with its FileDescriptorSet; it checks each step
// and exits non-zero if one is wrong.
package main

import (
	"encoding/hex"
	"fmt"
	"log"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"shaddock.dev/proto/clientpb"
	"shaddock.dev/proto/echopb"
	"shaddock.dev/proto/rpcpb"
	"shaddock.dev/proto/statuspb"
)

func main() {
	// A client's first frame, then a request: every binary frame is one Packet.
	hello := marshal(&clientpb.Packet{Kind: &clientpb.Packet_Handshake{
		Handshake: &clientpb.Handshake{Client: "recipe-go/1.0", Serial: true},
	}})
	body := marshal(&echopb.EchoRequest{Body: []byte("hi")})
	request := marshal(&clientpb.Packet{Kind: &clientpb.Packet_Request{
		Request: &clientpb.Request{Id: 1, Route: "echo.echo", Body: body},
	}})
	expect("handshake frame", hello, "0a111a0d7265636970652d676f2f312e302001")
	expect("EchoRequest{body: \"hi\"}", body, "0a026869")
	expect("request frame", request, "2213080112096563686f2e6563686f1a040a026869")

	// The gate's answer to it, as it arrives: a Response whose body is an EchoResponse.
	arrived := marshal(&clientpb.Packet{Kind: &clientpb.Packet_Response{Response: &clientpb.Response{
		Id: 1, Code: uint32(statuspb.Status_STATUS_OK), Body: marshal(&echopb.EchoResponse{Body: []byte("hi")}),
	}}})
	packet := &clientpb.Packet{}
	check(proto.Unmarshal(arrived, packet))
	response := packet.GetResponse()
	answer := &echopb.EchoResponse{}
	check(proto.Unmarshal(response.GetBody(), answer))
	if response.GetId() != 1 || response.GetCode() != 200 || string(answer.GetBody()) != "hi" {
		log.Fatalf("answer decoded wrong: %v, %v", response, answer)
	}
	fmt.Printf("response: id %d, code %d, EchoResponse{body: %q}\n", response.GetId(), response.GetCode(), answer.GetBody())

	// A worker's announcement: its typed methods and the files declaring their types.
	requestType := (&echopb.EchoRequest{}).ProtoReflect().Descriptor()
	responseType := (&echopb.EchoResponse{}).ProtoReflect().Descriptor()
	set := &descriptorpb.FileDescriptorSet{File: filesOf(requestType.ParentFile())}
	schema := &rpcpb.ServiceSchema{
		Service: "echo",
		Methods: []*rpcpb.MethodSchema{{
			Method:       "echo", // the method alone: the route is echo.echo
			RequestType:  string(requestType.FullName()),
			ResponseType: string(responseType.FullName()),
		}},
		Descriptors: marshal(set),
	}
	// What a gate does with it: load the set, find every type named.
	decoded := &descriptorpb.FileDescriptorSet{}
	check(proto.Unmarshal(schema.GetDescriptors(), decoded))
	files, err := protodesc.NewFiles(decoded)
	check(err)
	for _, m := range schema.GetMethods() {
		for _, name := range []string{m.GetRequestType(), m.GetResponseType()} {
			if _, err := files.FindDescriptorByName(protoreflect.FullName(name)); err != nil {
				log.Fatalf("the descriptor set lacks %s: %v", name, err)
			}
		}
	}
	fmt.Printf("announcement: %d bytes, descriptors of %d file(s) holding %s and %s\n",
		len(marshal(schema)), len(decoded.GetFile()), requestType.FullName(), responseType.FullName())
}

// filesOf lists file and everything it imports, dependencies first.
func filesOf(file protoreflect.FileDescriptor) []*descriptorpb.FileDescriptorProto {
	var files []*descriptorpb.FileDescriptorProto
	imports := file.Imports()
	for i := 0; i < imports.Len(); i++ {
		files = append(files, filesOf(imports.Get(i).FileDescriptor)...)
	}
	return append(files, protodesc.ToFileDescriptorProto(file))
}

// expect fails unless encoded is, in hex, want.
func expect(what string, encoded []byte, want string) {
	got := hex.EncodeToString(encoded)
	if got != want {
		log.Fatalf("%s: %s, want %s", what, got, want)
	}
	fmt.Printf("%s: %s\n", what, got)
}

func marshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	check(err)
	return b
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
