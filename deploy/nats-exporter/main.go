// Command nats-exporter serves one nats-server's /varz as Prometheus text.
//
// nats-server's monitoring port speaks JSON only. The usual bridge,
// prometheus-nats-exporter, is neither a Debian package nor served by the Go module
// proxy this project builds from, so deploy/ carries this one: on every scrape it reads
// SERVER/varz and writes each top-level number in it as a gauge named
// gnatsd_varz_<field> (the names prometheus-nats-exporter gives them, so dashboards
// written for either work with both), labelled with the server's name. Counters such
// as in_msgs are gauges here too, as there: rate() works on them all the same.
//
// A scrape that cannot read /varz is answered 502, so Prometheus marks the target down
// while its nats-server is.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"
)

// Defaults of the command-line flags.
const (
	defaultListen  = ":7777"
	defaultServer  = "http://127.0.0.1:8222"
	defaultTimeout = 2 * time.Second
	// Largest /varz body read; a real one is a few KB.
	maxVarzBytes = 1 << 20
)

func main() {
	listen := flag.String("listen", defaultListen, "address to serve /metrics on")
	server := flag.String("server", defaultServer, "nats-server monitoring URL (its -m / http_port)")
	timeout := flag.Duration("timeout", defaultTimeout, "how long one read of /varz may take")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments: %v\n", flag.Args())
		os.Exit(2)
	}
	exporter := &exporter{varzURL: strings.TrimRight(*server, "/") + "/varz", client: &http.Client{Timeout: *timeout}}
	mux := http.NewServeMux()
	mux.Handle("/metrics", exporter)
	log.Printf("serving %s as Prometheus metrics on %s/metrics", exporter.varzURL, *listen)
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: *timeout}
	log.Fatal(srv.ListenAndServe())
}

type exporter struct {
	varzURL string
	client  *http.Client
}

func (e *exporter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	varz, err := e.fetch(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	if _, err := io.WriteString(w, render(varz)); err != nil {
		log.Printf("writing a scrape: %v", err)
	}
}

func (e *exporter) fetch(ctx context.Context) (map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.varzURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", e.varzURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading %s: %s", e.varzURL, resp.Status)
	}
	return parseVarz(io.LimitReader(resp.Body, maxVarzBytes))
}

func parseVarz(r io.Reader) (map[string]any, error) {
	var varz map[string]any
	dec := json.NewDecoder(r)
	dec.UseNumber()
	if err := dec.Decode(&varz); err != nil {
		return nil, fmt.Errorf("varz is not a JSON object: %w", err)
	}
	return varz, nil
}

// render writes the top-level numbers of varz, sorted by name, one gauge each.
func render(varz map[string]any) string {
	name, _ := varz["server_name"].(string)
	labels := fmt.Sprintf("{server_name=%q}", name)
	fields := make([]string, 0, len(varz))
	for field, value := range varz {
		if _, ok := value.(json.Number); ok && validName(field) {
			fields = append(fields, field)
		}
	}
	sort.Strings(fields)
	var b strings.Builder
	for _, field := range fields {
		metric := "gnatsd_varz_" + field
		fmt.Fprintf(&b, "# TYPE %s gauge\n%s%s %s\n", metric, metric, labels, varz[field])
	}
	return b.String()
}

// validName: a field name that may follow "gnatsd_varz_" in a metric name.
func validName(field string) bool {
	if field == "" {
		return false
	}
	for _, c := range field {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
