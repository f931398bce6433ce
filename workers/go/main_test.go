// The echo worker as a user runs it: its own process (this test binary, started again
// as the worker), against a real nats-server on a free port, driven by a bare nats.go
// client playing the gate. nats-server must be on PATH (scripts/test.sh installs it).
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"shaddock.dev/workers/go/gen/echopb"
	"shaddock.dev/workers/go/gen/rpcpb"
	"shaddock.dev/workers/go/gen/statuspb"
)

// deadline bounds every wait of these tests.
const deadline = 20 * time.Second

// runAsWorker, when set, makes this test binary run main() instead of the tests: the
// worker under test is then a process of its own, stopped by its pid.
const runAsWorker = "SHADDOCK_ECHO_GO_TEST_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(runAsWorker) != "" {
		main()
		return
	}
	os.Exit(m.Run())
}

// lines hands a process's output lines to a test, one channel read at a time.
type lines chan string

func readLines(r io.Reader) lines {
	out := make(lines, 1024)
	go func() {
		defer close(out)
		scanner := bufio.NewScanner(r)
		for scanner.Scan() {
			out <- scanner.Text()
		}
	}()
	return out
}

// until returns the first line matching re, failing the test at the deadline or at the
// process's end.
func (l lines) until(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	timeout := time.After(deadline)
	for {
		select {
		case line, ok := <-l:
			if !ok {
				t.Fatalf("the process ended before printing %q", re)
			}
			if m := re.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-timeout:
			t.Fatalf("no line matching %q within %v", re, deadline)
		}
	}
}

// start runs name with args, its stdout and stderr merged, and kills it (by its pid)
// when the test ends unless it has exited.
func start(t *testing.T, env []string, name string, args ...string) (*exec.Cmd, lines) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, readLines(out)
}

// natsServer starts nats-server on a free port and returns its URL once it listens.
func natsServer(t *testing.T) string {
	t.Helper()
	_, out := start(t, nil, "nats-server", "-a", "127.0.0.1", "-p", "-1")
	port := out.until(t, regexp.MustCompile(`Listening for client connections on [0-9.]+:(\d+)`))[1]
	return "nats://127.0.0.1:" + port
}

// worker starts the echo worker against url with prefix, once it serves.
func worker(t *testing.T, url, prefix string) (*exec.Cmd, lines) {
	t.Helper()
	cmd, out := start(t, []string{runAsWorker + "=1"}, os.Args[0], "--nats", url, "--prefix", prefix)
	out.until(t, regexp.MustCompile(`^Worker is ready`))
	return cmd, out
}

func connect(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func echoRequest(t *testing.T, body string) []byte {
	t.Helper()
	inner, err := proto.Marshal(&echopb.EchoRequest{Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	request, err := proto.Marshal(&rpcpb.RpcRequest{Route: "echo.echo", Body: inner, Key: "m1"})
	if err != nil {
		t.Fatal(err)
	}
	return request
}

// A plain worker subscribes <prefix>.svc.<service>.> in its queue group: a keyed
// service's requests, on <prefix>.part.<service>.<partition>.<method>, never reach it
// (docs/workers.md, "Keyed services"), while its own route does.
func TestAPlainWorkersWildcardNeverReceivesAKeyedRequest(t *testing.T) {
	url := natsServer(t)
	worker(t, url, "gk")
	nc := connect(t, url)

	reply, err := nc.Request("gk.svc.echo.echo", echoRequest(t, "hi"), deadline)
	if err != nil {
		t.Fatalf("the plain route: %v", err)
	}
	answer := &rpcpb.RpcResponse{}
	if err := proto.Unmarshal(reply.Data, answer); err != nil || answer.GetCode() != uint32(statuspb.Status_STATUS_OK) {
		t.Fatalf("the plain route answered %v (%v)", answer, err)
	}

	// The same service's name, keyed: nothing that serves partitions is subscribed, so
	// the bus says nobody is (had the plain worker's wildcard caught it, it would answer).
	for partition := range 4 {
		subject := fmt.Sprintf("gk.part.echo.%d.echo", partition)
		_, err := nc.Request(subject, echoRequest(t, "keyed"), deadline)
		if !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("a keyed request on %s: %v, want no responders", subject, err)
		}
	}
}

// SIGTERM drains: the worker answers what it took, says so, and exits 0.
func TestSigtermDrainsAndExits(t *testing.T) {
	url := natsServer(t)
	cmd, out := worker(t, url, "gd")
	nc := connect(t, url)
	if _, err := nc.Request("gd.svc.echo.raw", []byte{}, deadline); err != nil {
		t.Fatalf("a request before the drain: %v", err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped := out.until(t, regexp.MustCompile(`^Worker stopped: served=(\d+) rejected=(\d+)`))
	if strings.Join(stopped[1:], " ") != "1 0" {
		t.Fatalf("stopped with served=%s rejected=%s, want 1 and 0", stopped[1], stopped[2])
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the worker's exit: %v", err)
	}
}
