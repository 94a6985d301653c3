package tinker_test

import (
	"context"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// Faults of the wire doc the client must meet, injected into the simulator and driven over
// loopback HTTP: a bare 400 (§1.4), an auth/token outage at start-up (§2.2, §6.2) and 402s
// that go on past the billing window (§2.3).

// seenRequest is one request the simulator answered, with the connection it came on.
type seenRequest struct {
	endpoint, remote string
	status           int
}

// connSim is a simulator behind an httptest server (TLS with HTTP/2 offered when h2) that
// records which connection each request came on.
type connSim struct {
	sim   *tinkersim.Server
	url   string
	roots *x509.CertPool

	mu   sync.Mutex
	seen []seenRequest
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func newConnSim(t *testing.T, cfg tinkersim.Config, h2 bool) *connSim {
	t.Helper()
	cfg.APIKeys = []string{simKey}
	sim, err := tinkersim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs := &connSim{sim: sim}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		sim.ServeHTTP(sw, r)
		ep := r.URL.Path[len("/api/v1/"):]
		cs.mu.Lock()
		cs.seen = append(cs.seen, seenRequest{endpoint: ep, remote: r.RemoteAddr, status: sw.status})
		cs.mu.Unlock()
	}))
	if h2 {
		ts.EnableHTTP2 = true
		ts.StartTLS()
		cs.roots = x509.NewCertPool()
		cs.roots.AddCert(ts.Certificate())
	} else {
		ts.Start()
	}
	t.Cleanup(func() { ts.Close(); sim.Close() })
	cs.url = ts.URL
	return cs
}

func (cs *connSim) requests() []seenRequest {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return append([]seenRequest(nil), cs.seen...)
}

// TestSimBare400RetryGoesOutOnANewConnection: a 400 without a body is a connection-level
// rejection, and the SDK replaces that pool client, so the retry goes out on a fresh
// connection (§1.4). With the client's default transport, over HTTP/1.1 and over HTTP/2 (as
// the real service is reached, §1.4), while another sample's long poll is in flight on the
// client's connection, as it always is in bulk sampling.
func TestSimBare400RetryGoesOutOnANewConnection(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		name := "HTTP/1.1"
		if h2 {
			name = "HTTP/2"
		}
		t.Run(name, func(t *testing.T) {
			cs := newConnSim(t, tinkersim.Config{LongPollWait: 5 * time.Second}, h2)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := tinker.Dial(ctx, tinker.Config{BaseURL: cs.url, APIKey: simKey, RootCAs: cs.roots,
				Timing: tinker.Timing{SubmitRetryBase: 10 * time.Millisecond, SubmitRetryMax: 50 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
			if err != nil {
				t.Fatal(err)
			}
			// A sample whose poll the simulator holds: it never completes until the fault goes.
			hold, err := cs.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultNeverComplete, Count: 1})
			if err != nil {
				t.Fatal(err)
			}
			held := make(chan error, 1)
			hctx, hcancel := context.WithCancel(ctx)
			defer hcancel()
			go func() { _, err := s.Sample(hctx, simRequest(1)); held <- err }()
			for cs.sim.Stats().Requests["asample"][http.StatusOK] == 0 {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond) // its poll is on the wire
			cs.sim.RemoveFault(hold)

			if _, err := cs.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultBare400, Endpoints: []string{"asample"}, Count: 1}); err != nil {
				t.Fatal(err)
			}
			res, err := s.Sample(ctx, simRequest(2))
			if err != nil {
				t.Fatalf("sample after a bare 400: %v", err)
			}
			checkSequences(t, res.Response, 1, 16)
			var rejected, retry *seenRequest
			reqs := cs.requests()
			for i := range reqs {
				r := &reqs[i]
				if r.endpoint != "asample" {
					continue
				}
				if r.status == http.StatusBadRequest {
					rejected = r
				} else if rejected != nil && retry == nil {
					retry = r
				}
			}
			if rejected == nil || retry == nil {
				t.Fatalf("want a bare 400 on asample and its retry: %+v", reqs)
			}
			if rejected.remote == retry.remote {
				t.Fatalf("the retry after a bare 400 went down the rejected connection %s (§1.4: a fresh one)", retry.remote)
			}
			hcancel()
			<-held
		})
	}
}
