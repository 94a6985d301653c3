package tinker_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
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
			s := openSampler(t, ctx, tinker.Config{BaseURL: cs.url, APIKey: simKey, RootCAs: cs.roots,
				Timing: tinker.Timing{SubmitRetryBase: 10 * time.Millisecond, SubmitRetryMax: 50 * time.Millisecond}})
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

// faultEnv is a simulator behind an httptest server whose client the test dials itself
// (Dial may be what fails), recording the client's events.
type faultEnv struct {
	sim *tinkersim.Server
	url string

	mu     sync.Mutex
	events []tinker.Event
}

func newFaultEnv(t *testing.T, cfg tinkersim.Config) *faultEnv {
	t.Helper()
	cfg.APIKeys = []string{simKey}
	if cfg.LongPollWait == 0 {
		cfg.LongPollWait = 100 * time.Millisecond
	}
	sim, err := tinkersim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim)
	t.Cleanup(func() { ts.Close(); sim.Close() })
	return &faultEnv{sim: sim, url: ts.URL}
}

// dial dials with the delays of the retry layers cut to milliseconds.
func (e *faultEnv) dial(ctx context.Context, timing tinker.Timing) (*tinker.Client, error) {
	d := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	d(&timing.HTTPRetryBase, 5*time.Millisecond)
	d(&timing.HTTPRetryMax, 20*time.Millisecond)
	d(&timing.SubmitRetryBase, 20*time.Millisecond)
	d(&timing.SubmitRetryMax, 100*time.Millisecond)
	d(&timing.SampleRetryBase, 10*time.Millisecond)
	d(&timing.SampleRetryMax, 50*time.Millisecond)
	d(&timing.BackoffSmall, 20*time.Millisecond)
	d(&timing.BillingRetry, 20*time.Millisecond)
	return tinker.Dial(ctx, tinker.Config{BaseURL: e.url, APIKey: simKey, Timing: timing,
		OnEvent: func(ev tinker.Event) {
			e.mu.Lock()
			e.events = append(e.events, ev)
			e.mu.Unlock()
		}})
}

// sampler dials as dial does and opens a sampler of Qwen3-8B; the client closes with the test.
func (e *faultEnv) sampler(t *testing.T, ctx context.Context) *tinker.Sampler {
	t.Helper()
	c, err := e.dial(ctx, tinker.Timing{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (e *faultEnv) eventsOf(k tinker.EventKind, endpoint string) []tinker.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []tinker.Event
	for _, ev := range e.events {
		if ev.Kind == k && (endpoint == "" || ev.Endpoint == endpoint) {
			out = append(out, ev)
		}
	}
	return out
}

// TestSimStartupJWTExchangeOutage: an outage of auth/token while Dial exchanges the key for a
// JWT (§2 step 2, §2.2), as 503s or as dropped connections, is retried in the loop of §6.2
// (HTTP retries turned off here, so that the loop alone does it): Dial gets through an
// outage shorter than the loop's deadline and then samples with the JWT; one longer fails
// Dial once the deadline has passed, with the outage's error; a refused key (401) is not
// retried at all.
func TestSimStartupJWTExchangeOutage(t *testing.T) {
	t.Parallel()
	outages := []struct {
		name string
		kind tinkersim.FaultKind
		seen func(tinkersim.Stats) int64
	}{
		{"503", tinkersim.FaultServerError, func(st tinkersim.Stats) int64 { return st.Requests["auth/token"][503] }},
		{"drop", tinkersim.FaultDrop, func(st tinkersim.Stats) int64 { return st.Requests["auth/token"][0] }},
	}
	for _, o := range outages {
		t.Run(o.name+" shorter than the deadline", func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, tinkersim.Config{JWTAuth: true})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			// The outage starts now, not when the simulator did, so that it lasts its 400 ms
			// from here however long the set-up took.
			if _, err := e.sim.Inject(tinkersim.Fault{Kind: o.kind, Status: 503 * boolInt(o.kind == tinkersim.FaultServerError),
				Endpoints: []string{"auth/token"}, Duration: 400 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			c, err := e.dial(ctx, tinker.Timing{HTTPMaxRetries: -1, SubmitRetryDeadline: 10 * time.Second})
			if err != nil {
				t.Fatalf("Dial through a %s outage of auth/token: %v", o.name, err)
			}
			defer c.Close()
			st := e.sim.Stats()
			if o.seen(st) < 2 || st.Requests["auth/token"][200] != 1 || time.Since(start) < 400*time.Millisecond {
				t.Fatalf("auth/token replies %v after %s: want the outage met more than once, then one JWT", st.Requests["auth/token"], time.Since(start))
			}
			// Go's transport may itself send a request with an X-Idempotency-Key again once
			// when its reused connection closes, so the simulator can see more drops than tries.
			if r := e.eventsOf(tinker.EventRetry, "auth/token"); len(r) < 2 || int64(len(r)) > o.seen(st) || r[0].Layer != tinker.LayerSubmit {
				t.Fatalf("retry events %+v: want one of the §6.2 loop per failed exchange", r)
			}
			s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Sample(ctx, simRequest(3)); err != nil {
				t.Fatalf("sample with the JWT: %v", err)
			}
			if st := e.sim.Stats(); st.JWTRejections != 0 {
				t.Fatalf("%d requests refused for their JWT", st.JWTRejections)
			}
		})
		t.Run(o.name+" longer than the deadline", func(t *testing.T) {
			t.Parallel()
			e := newFaultEnv(t, tinkersim.Config{JWTAuth: true, Faults: []tinkersim.Fault{
				{Kind: o.kind, Status: 503 * boolInt(o.kind == tinkersim.FaultServerError), Endpoints: []string{"auth/token"}}}})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const deadline = 500 * time.Millisecond
			start := time.Now()
			c, err := e.dial(ctx, tinker.Timing{HTTPMaxRetries: -1, SubmitRetryDeadline: deadline})
			took := time.Since(start)
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded through an endless auth/token outage")
			}
			var se *tinker.StatusError
			var ce *tinker.ConnectionError
			if o.kind == tinkersim.FaultServerError && (!errors.As(err, &se) || se.StatusCode != 503) ||
				o.kind == tinkersim.FaultDrop && !errors.As(err, &ce) {
				t.Fatalf("Dial: %v (%T), want the outage's error", err, err)
			}
			// Waits 20, 40, 80, 100, 100… ms, the last cut to the deadline: then one more try.
			// How many tries fit in the deadline depends on how long each takes (a loaded
			// machine under -race fitted 4); that the loop waited so and went on to its
			// deadline does not.
			if took < deadline || took > deadline+5*time.Second || o.seen(e.sim.Stats()) < 2 {
				t.Fatalf("Dial gave up after %s and %d tries, want just past %s", took, o.seen(e.sim.Stats()), deadline)
			}
			r := e.eventsOf(tinker.EventRetry, "auth/token")
			for i, ev := range r {
				want := min(20*time.Millisecond<<i, 100*time.Millisecond)
				if ev.Layer != tinker.LayerSubmit || ev.Delay > want || (ev.Delay < want && i != len(r)-1) {
					t.Fatalf("retry %d of %d waits %v in layer %s, want %v (the last one cut to the deadline)", i+1, len(r), ev.Delay, ev.Layer, want)
				}
			}
		})
	}
	t.Run("401 is not retried", func(t *testing.T) {
		t.Parallel()
		e := newFaultEnv(t, tinkersim.Config{JWTAuth: true, Faults: []tinkersim.Fault{
			{Kind: tinkersim.FaultUnauthorized, Endpoints: []string{"auth/token"}}}})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := e.dial(ctx, tinker.Timing{SubmitRetryDeadline: 10 * time.Second})
		var se *tinker.StatusError
		if err == nil {
			c.Close()
		}
		if !errors.As(err, &se) || se.StatusCode != 401 || e.sim.Stats().Requests["auth/token"][401] != 1 {
			t.Fatalf("Dial: %v after auth/token replies %v, want one 401, not retried", err, e.sim.Stats().Requests["auth/token"])
		}
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// billingWindow is the client/config flag billing_exception_max_pause_duration_sec (§3.1).
func billingWindow(d time.Duration) map[string]any {
	return map[string]any{"billing_exception_max_pause_duration_sec": d.Seconds()}
}

// TestSimBillingPause: 402s (§2.3) against the simulator, the window cut to a fraction of a
// second through client/config. A 402 on asample inside the window backs the sample off as a
// 429 does, same attempt and seq_id, and the sample goes through once the 402s stop; 402s
// that go on past the window fail the sample with the 402, not retried, and from then on a
// 402 fails at once (the incident lasts until no 402 was logged for 300 s); on a poll, the
// same after sleeps of BillingRetry.
func TestSimBillingPause(t *testing.T) {
	t.Parallel()
	t.Run("402s that stop inside the window", func(t *testing.T) {
		t.Parallel()
		e := newFaultEnv(t, tinkersim.Config{ClientConfig: billingWindow(10 * time.Second)})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s := e.sampler(t, ctx)
		// Three 402s, then none: counted, not timed, so that they meet the sample however
		// long Dial and the sampler took.
		if _, err := e.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultPaymentRequired, Count: 3}); err != nil {
			t.Fatal(err)
		}
		res, err := s.Sample(ctx, simRequest(4))
		if err != nil {
			t.Fatalf("sample across a billing pause inside the window: %v", err)
		}
		checkSequences(t, res.Response, 1, 16)
		st := e.sim.Stats()
		if st.Requests["asample"][402] < 2 || res.Attempts != 1 || res.Submissions < 3 || st.SamplesAccepted != 1 {
			t.Fatalf("%d 402s, %d attempts, %d submissions, %d futures: want the one attempt (one seq_id) paused and sent again",
				st.Requests["asample"][402], res.Attempts, res.Submissions, st.SamplesAccepted)
		}
		if len(e.eventsOf(tinker.EventBillingPaused, "asample")) == 0 {
			t.Fatal("no billing pause event")
		}
	})
	t.Run("402s past the window on asample", func(t *testing.T) {
		t.Parallel()
		const window = 500 * time.Millisecond
		e := newFaultEnv(t, tinkersim.Config{ClientConfig: billingWindow(window)})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s := e.sampler(t, ctx)
		if _, err := e.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultPaymentRequired}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := s.Sample(ctx, simRequest(5))
		took := time.Since(start)
		var se *tinker.StatusError
		if !errors.As(err, &se) || se.StatusCode != 402 || tinker.IsRetryable(err) {
			t.Fatalf("sample under endless 402s: %v, want the 402, not retryable", err)
		}
		n := e.sim.Stats().Requests["asample"][402]
		if took < window || took > window+5*time.Second || n < 3 {
			t.Fatalf("the 402 became fatal after %s and %d 402s, want just past the %s window", took, n, window)
		}
		// The incident goes on: the next 402 fails at once, without a pause.
		if _, err = s.Sample(ctx, simRequest(6)); !errors.As(err, &se) || se.StatusCode != 402 ||
			e.sim.Stats().Requests["asample"][402] != n+1 {
			t.Fatalf("a 402 after the window: %v after %d more 402s, want it fatal at once", err, e.sim.Stats().Requests["asample"][402]-n)
		}
	})
	t.Run("402s past the window on polls", func(t *testing.T) {
		t.Parallel()
		const window = 500 * time.Millisecond
		e := newFaultEnv(t, tinkersim.Config{ClientConfig: billingWindow(window)})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s := e.sampler(t, ctx)
		if _, err := e.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultPaymentRequired, Endpoints: []string{"retrieve_future"}}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := s.Sample(ctx, simRequest(7))
		took := time.Since(start)
		if err == nil || tinker.IsRetryable(err) || !strings.Contains(err.Error(), "402") {
			t.Fatalf("sample whose polls meet endless 402s: %v, want a fatal 402", err)
		}
		st := e.sim.Stats()
		if took < window || took > window+5*time.Second || st.Requests["retrieve_future"][402] < 3 || st.SamplesAccepted != 1 {
			t.Fatalf("fatal after %s, %d 402 polls, %d futures: want one future polled through the %s window",
				took, st.Requests["retrieve_future"][402], st.SamplesAccepted, window)
		}
	})
}

// TestSimShouldRetry: the service's x-should-retry header overrides the status in the HTTP
// retry layer (§6.1): "false" forbids retrying even a 503, "true" retries even a 403. Each
// case runs with and without the header, so the header is what changes the outcome. asample
// has no HTTP-level retries (§3.6), so there the header is not consulted and the submission
// layer retries by status alone (§6.2), as the SDK's does.
func TestSimShouldRetry(t *testing.T) {
	cases := []struct {
		name        string
		kind        tinkersim.FaultKind
		status      int
		shouldRetry string
		// The status the call fails with without retrying; 0: it succeeds after one retry.
		wantSession, wantAsample int
	}{
		{"503", tinkersim.FaultServerError, 503, "", 0, 0},
		{"503 x-should-retry false", tinkersim.FaultServerError, 503, "false", 503, 0},
		{"403", tinkersim.FaultForbidden, 403, "", 403, 403},
		{"403 x-should-retry true", tinkersim.FaultForbidden, 403, "true", 0, 403},
	}
	for _, tc := range cases {
		fault := func(endpoint string) tinkersim.Fault {
			f := tinkersim.Fault{Kind: tc.kind, Endpoints: []string{endpoint}, Count: 1, ShouldRetry: tc.shouldRetry}
			if tc.kind == tinkersim.FaultServerError {
				f.Status = tc.status
			}
			return f
		}
		t.Run("create_sampling_session/"+tc.name, func(t *testing.T) {
			e := newSimEnv(t, tinkersim.Config{}, nil)
			if _, err := e.sim.Inject(fault("create_sampling_session")); err != nil {
				t.Fatal(err)
			}
			_, err := e.client.NewSampler(e.ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
			checkShouldRetry(t, err, tc.wantSession)
			st := e.sim.Stats().Requests["create_sampling_session"]
			ok := int64(0)
			if tc.wantSession == 0 {
				ok = 1
			}
			if st[tc.status] != 1 || st[200] != ok {
				t.Errorf("replies %v, want one %d and %d 200", st, tc.status, ok)
			}
		})
		t.Run("asample/"+tc.name, func(t *testing.T) {
			e := newSimEnv(t, tinkersim.Config{}, nil)
			s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
			if _, err := e.sim.Inject(fault("asample")); err != nil {
				t.Fatal(err)
			}
			_, err := s.Sample(e.ctx, simRequest(1))
			checkShouldRetry(t, err, tc.wantAsample)
		})
	}
}

// checkShouldRetry checks that err is a *tinker.StatusError of status want, or nil when want is 0.
func checkShouldRetry(t *testing.T, err error, want int) {
	t.Helper()
	var se *tinker.StatusError
	switch {
	case want == 0 && err != nil:
		t.Fatalf("failed: %v, want success after one retry", err)
	case want != 0 && (!errors.As(err, &se) || se.StatusCode != want):
		t.Fatalf("error %v, want status %d without a retry", err, want)
	}
}

// TestSimTransportReplayDoesNotSampleTwice: an asample the service took in, on a kept-alive
// connection that then closes before the reply, is sent again by Go's http.Transport itself
// (the request carries X-Idempotency-Key, which makes it replayable), unseen by the client's
// retry layers. The replay carries the same key and the same (sampling_session_id, seq_id),
// which the service maps to the same future (§8, §12), so the sample runs once.
func TestSimTransportReplayDoesNotSampleTwice(t *testing.T) {
	sim, err := tinkersim.New(tinkersim.Config{APIKeys: []string{simKey}, LongPollWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		keys []string // X-Idempotency-Key of every asample received
	)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/asample") {
			sim.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		keys = append(keys, r.Header.Get("X-Idempotency-Key"))
		first := len(keys) == 1
		mu.Unlock()
		if !first {
			sim.ServeHTTP(w, r)
			return
		}
		// The service takes the sample in, then the connection dies before the reply.
		sim.ServeHTTP(httptest.NewRecorder(), r)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		conn.Close()
	}))
	t.Cleanup(func() { ts.Close(); sim.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := openSampler(t, ctx, tinker.Config{BaseURL: ts.URL, APIKey: simKey})
	res, err := s.Sample(ctx, simRequest(1))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || keys[0] == "" || keys[1] != keys[0] {
		t.Fatalf("asample keys %q, want one request replayed by the transport with its key", keys)
	}
	if res.Submissions != 1 || res.Attempts != 1 {
		t.Errorf("%d submissions, %d attempts: the replay was the transport's, not the client's", res.Submissions, res.Attempts)
	}
	if st := sim.Stats(); st.SamplesAccepted != 1 || st.IdempotentReplays != 1 {
		t.Errorf("accepted %d samples with %d replays, want the one sample run once", st.SamplesAccepted, st.IdempotentReplays)
	}
}
