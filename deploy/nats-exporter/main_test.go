package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const sampleVarz = `{"server_name":"nats-1","version":"2.15.2","connections":3,
"in_msgs":1234,"mem":15400960,"cpu":1.5,"cluster":{"port":6222},"bad-name":7,"jetstream":{}}`

func TestRenderWritesTopLevelNumbersAsGauges(t *testing.T) {
	varz, err := parseVarz(strings.NewReader(sampleVarz))
	if err != nil {
		t.Fatal(err)
	}
	got := render(varz)
	want := `# TYPE gnatsd_varz_connections gauge
gnatsd_varz_connections{server_name="nats-1"} 3
# TYPE gnatsd_varz_cpu gauge
gnatsd_varz_cpu{server_name="nats-1"} 1.5
# TYPE gnatsd_varz_in_msgs gauge
gnatsd_varz_in_msgs{server_name="nats-1"} 1234
# TYPE gnatsd_varz_mem gauge
gnatsd_varz_mem{server_name="nats-1"} 15400960
`
	if got != want {
		t.Fatalf("render:\n%s\nwant:\n%s", got, want)
	}
}

func TestNotAnObjectIsAnError(t *testing.T) {
	for _, body := range []string{"", "[1,2]", "{", "<html>"} {
		if _, err := parseVarz(strings.NewReader(body)); err == nil {
			t.Errorf("parseVarz(%q): no error", body)
		}
	}
}

func TestScrapeOfAnAbsentServerIs502(t *testing.T) {
	nats := httptest.NewServer(http.NotFoundHandler())
	url := nats.URL
	nats.Close()
	e := &exporter{varzURL: url + "/varz", client: http.DefaultClient}
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil).WithContext(context.Background()))
	if rec.Code != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", rec.Code)
	}
}

func TestScrapeReadsVarz(t *testing.T) {
	nats := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/varz" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(sampleVarz))
	}))
	defer nats.Close()
	e := &exporter{varzURL: nats.URL + "/varz", client: nats.Client()}
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `gnatsd_varz_in_msgs{server_name="nats-1"} 1234`) {
		t.Fatalf("status %d body %q", rec.Code, rec.Body.String())
	}
}
