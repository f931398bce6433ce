// Command echo serves Shaddock's echo service from Go, beside Rust and TypeScript
// workers in the same queue group (the contract is docs/workers.md):
//
//	go run . --nats nats://127.0.0.1:4222 [--prefix shaddock] [--queue 1024] [--drain-grace 10s]
//
// echo.echo answers an EchoRequest with an EchoResponse holding the same body; echo.raw
// answers the body unchanged. It prints "Worker is ready" once it serves; on SIGTERM or
// SIGINT it drains, prints "Worker stopped: served=N rejected=M" and exits 0, or 1 when
// the drain fails or outlasts --drain-grace (the bus is down), saying what it lost.
package main

//go:generate buf generate

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"shaddock.dev/workers/go/gen/echopb"
	"shaddock.dev/workers/go/gen/rpcpb"
	"shaddock.dev/workers/go/gen/statuspb"
)

const service = "echo"

// The counts printed at exit: requests answered by a handler, and refused with 503;
// answers made while the connection was down, since it was last made (lost unless it
// comes back).
var served, rejected, held atomic.Int64

// The connection, for respond to know whether it is up.
var bus *nats.Conn

func main() {
	urls := flag.String("nats", envOr("SHADDOCK_NATS", nats.DefaultURL), "NATS server URLs, comma-separated (env SHADDOCK_NATS)")
	prefix := flag.String("prefix", envOr("SHADDOCK_PREFIX", "shaddock"), "subject prefix shared with the gates (env SHADDOCK_PREFIX)")
	capacity := flag.Int("queue", 1024, "requests queued before the worker answers 503")
	grace, err := time.ParseDuration(envOr("SHADDOCK_DRAIN_GRACE", "10s"))
	if err != nil {
		log.Fatalf("SHADDOCK_DRAIN_GRACE: %v", err)
	}
	flag.DurationVar(&grace, "drain-grace", grace, "how long a drain may take before the worker exits anyway, saying what it could not deliver (env SHADDOCK_DRAIN_GRACE)")
	flag.Parse()
	if *capacity < 1 {
		log.Fatal("--queue must be at least 1")
	}

	// Whatever was held while the connection was down is written first on reconnecting.
	reconnected := nats.ReconnectHandler(func(*nats.Conn) { held.Store(0) })
	nc, err := nats.Connect(*urls, nats.Name("shaddock-worker-echo-go"), nats.MaxReconnects(-1), reconnected)
	if err != nil {
		log.Fatalf("connecting to NATS at %s: %v", *urls, err)
	}
	bus = nc
	// Bounded: when full, a request is answered 503 at once instead of waiting where
	// it could only time out.
	queue := make(chan queued, *capacity)
	overloaded := marshal(&rpcpb.RpcResponse{Code: uint32(statuspb.Status_STATUS_UNAVAILABLE), Message: fmt.Sprintf("service %q is overloaded: its queue of %d is full", service, *capacity)})
	methodPrefix := *prefix + ".svc." + service + "."
	sub, err := nc.QueueSubscribe(methodPrefix+">", service, func(m *nats.Msg) {
		select {
		case queue <- queued{m, time.Now()}:
		default:
			rejected.Add(1)
			respond(m, overloaded)
		}
	})
	if err != nil {
		log.Fatalf("subscribing: %v", err)
	}
	closed := sub.StatusChanged(nats.SubscriptionClosed)

	// The schema announcement: now, and whenever a gate asks.
	announcement := marshal(schema())
	announce := func(*nats.Msg) { _ = nc.Publish(*prefix+".schema.svc."+service, announcement) }
	asks, err := nc.Subscribe(*prefix+".schema.ask", announce)
	if err != nil {
		log.Fatalf("subscribing: %v", err)
	}
	announce(nil)
	if err := nc.Flush(); err != nil { // a round trip: the server has the subscriptions
		log.Fatalf("flushing: %v", err)
	}
	// Trapped before saying it is ready: a SIGTERM right after must drain, not kill.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	fmt.Printf("Worker is ready: serving %s> in queue group %s\n", methodPrefix, service)

	// One handler at a time, in arrival order, like the Rust and TypeScript workers.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for q := range queue {
			handle(q, strings.TrimPrefix(q.msg.Subject, methodPrefix))
		}
	}()

	fmt.Printf("%v: draining\n", <-signals)
	// Drain: unsubscribe (new requests go to the group's other workers), take what the
	// server already sent, answer everything taken, then close; within the grace.
	drained := make(chan error, 1)
	go func() {
		_ = asks.Unsubscribe()
		if err := sub.Drain(); err != nil {
			log.Printf("draining: %v", err)
		} else {
			<-closed // every message the server sent has been queued or refused
		}
		close(queue)
		<-done
		drained <- nc.Drain()
	}()
	select {
	case err = <-drained:
	case <-time.After(grace):
		err = fmt.Errorf("did not end within its grace of %v", grace)
	}
	if err != nil {
		log.Fatalf("the drain failed: %v (is the bus down?): %d answers not delivered", err, held.Load())
	}
	fmt.Printf("Worker stopped: served=%d rejected=%d\n", served.Load(), rejected.Load())
}

type queued struct {
	msg      *nats.Msg
	received time.Time
}

// handle answers one request with an RpcResponse on its reply subject.
func handle(q queued, method string) {
	started := time.Now()
	var response *rpcpb.RpcResponse
	request := &rpcpb.RpcRequest{}
	if err := proto.Unmarshal(q.msg.Data, request); err != nil {
		response = &rpcpb.RpcResponse{Code: uint32(statuspb.Status_STATUS_BAD_REQUEST), Message: "malformed RpcRequest: " + err.Error()}
	} else {
		response = call(method, request.GetBody())
	}
	response.QueueUs = micros(started.Sub(q.received))
	response.HandlerUs = micros(time.Since(started))
	served.Add(1)
	respond(q.msg, marshal(response))
}

// call runs one method of the echo service.
func call(method string, body []byte) *rpcpb.RpcResponse {
	switch method {
	case "echo":
		request := &echopb.EchoRequest{}
		if err := proto.Unmarshal(body, request); err != nil {
			return &rpcpb.RpcResponse{Code: uint32(statuspb.Status_STATUS_BAD_REQUEST), Message: "bad request body: " + err.Error()}
		}
		return &rpcpb.RpcResponse{Code: uint32(statuspb.Status_STATUS_OK), Body: marshal(&echopb.EchoResponse{Body: request.GetBody()})}
	case "raw":
		return &rpcpb.RpcResponse{Code: uint32(statuspb.Status_STATUS_OK), Body: body}
	default:
		return &rpcpb.RpcResponse{Code: uint32(statuspb.Status_STATUS_NOT_FOUND), Message: fmt.Sprintf("unknown method %q of service %q", method, service)}
	}
}

// schema is what the gates need to give JSON clients typed bodies for echo.echo.
func schema() *rpcpb.ServiceSchema {
	request := (&echopb.EchoRequest{}).ProtoReflect().Descriptor()
	response := (&echopb.EchoResponse{}).ProtoReflect().Descriptor()
	return &rpcpb.ServiceSchema{
		Service: service,
		Methods: []*rpcpb.MethodSchema{{
			Method:       "echo",
			RequestType:  string(request.FullName()),
			ResponseType: string(response.FullName()),
		}},
		Descriptors: marshal(&descriptorpb.FileDescriptorSet{File: filesOf(request.ParentFile())}),
	}
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

func respond(m *nats.Msg, payload []byte) {
	if m.Reply == "" { // a notify: handled, never answered
		return
	}
	if err := m.Respond(payload); err != nil {
		log.Printf("answering on %s: %v", m.Reply, err)
	} else if !bus.IsConnected() {
		held.Add(1)
	}
}

func marshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		log.Fatalf("encoding %T: %v", m, err) // our own messages always encode
	}
	return b
}

func micros(d time.Duration) uint32 {
	return uint32(min(max(d.Microseconds(), 0), 1<<32-1))
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}
