package tinker_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// These tests are the cross test of issue 2: the real client against the real simulator
// (internal/tinkersim, an independent reading of the protocol) over loopback HTTP.

const simKey = "tml-sim.cross-test-key"

// simEnv is a simulator behind an httptest server and a client dialled to it.
type simEnv struct {
	sim    *tinkersim.Server
	client *tinker.Client
	ctx    context.Context
	base   string // the simulator's base URL

	mu     sync.Mutex
	events []tinker.Event
	creds  map[string]bool // every X-API-Key value the simulator received
}

// newSimEnv starts a simulator with cfg (key, long-poll wait and latency filled in) and
// dials a client whose retry delays are shortened so that fault recovery is fast; mod may
// change the client's Config.
func newSimEnv(t *testing.T, cfg tinkersim.Config, mod func(*tinker.Config)) *simEnv {
	t.Helper()
	cfg.APIKeys = []string{simKey}
	if cfg.LongPollWait == 0 {
		cfg.LongPollWait = 100 * time.Millisecond
	}
	if cfg.BaseLatency == 0 {
		cfg.BaseLatency = 5 * time.Millisecond
	}
	sim, err := tinkersim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	e := &simEnv{sim: sim, ctx: ctx, creds: map[string]bool{}}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.creds[r.Header.Get("X-API-Key")] = true
		e.mu.Unlock()
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { ts.Close(); sim.Close() })
	e.base = ts.URL
	ccfg := tinker.Config{
		BaseURL: ts.URL,
		APIKey:  simKey,
		OnEvent: func(ev tinker.Event) {
			e.mu.Lock()
			e.events = append(e.events, ev)
			e.mu.Unlock()
		},
		Timing: tinker.Timing{
			HTTPRetryBase:   5 * time.Millisecond,
			HTTPRetryMax:    20 * time.Millisecond,
			SubmitRetryBase: 10 * time.Millisecond,
			SubmitRetryMax:  50 * time.Millisecond,
			SampleRetryBase: 10 * time.Millisecond,
			SampleRetryMax:  50 * time.Millisecond,
			PollBackoffBase: 10 * time.Millisecond,
			PollBackoffMax:  50 * time.Millisecond,
		},
	}
	if mod != nil {
		mod(&ccfg)
	}
	c, err := tinker.Dial(ctx, ccfg)
	if err != nil {
		t.Fatalf("dial the simulator: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	e.client = c
	return e
}

// heartbeatsSent counts the session_heartbeat requests the client has finished.
func (e *simEnv) heartbeatsSent() int {
	n := 0
	for _, ev := range e.eventsOf(tinker.EventRequest) {
		if ev.Endpoint == "session_heartbeat" {
			n++
		}
	}
	return n
}

// eventsOf returns the events of kind k seen so far.
func (e *simEnv) eventsOf(k tinker.EventKind) []tinker.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []tinker.Event
	for _, ev := range e.events {
		if ev.Kind == k {
			out = append(out, ev)
		}
	}
	return out
}

// credentials returns the distinct X-API-Key values the simulator received.
func (e *simEnv) credentials() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]string, 0, len(e.creds))
	for c := range e.creds {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// requests returns how many replies with status the simulator sent on endpoint.
func (e *simEnv) requests(endpoint string, status int) int64 {
	return e.sim.Stats().Requests[endpoint][status]
}

func (e *simEnv) sampler(t *testing.T, spec tinker.SamplerSpec) *tinker.Sampler {
	t.Helper()
	s, err := e.client.NewSampler(e.ctx, spec)
	if err != nil {
		t.Fatalf("new sampler %+v: %v", spec, err)
	}
	return s
}

// openSampler dials the service of cfg and opens a sampling session of Qwen3-8B on it; the
// client closes when the test ends.
func openSampler(t *testing.T, ctx context.Context, cfg tinker.Config) *tinker.Sampler {
	t.Helper()
	c, err := tinker.Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func simRequest(seed int64) tinker.SampleRequest {
	maxTokens := 16
	return tinker.SampleRequest{
		Prompt: tinker.EncodedText([]int{151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30}),
		Params: tinker.SamplingParams{MaxTokens: &maxTokens, Seed: &seed},
	}
}

// checkSequences checks the shape the simulator promises for every sequence: tokens within
// max_tokens, one logprob per token, each in (-8, 0].
func checkSequences(t *testing.T, r *tinker.SampleResponse, n, maxTokens int) {
	t.Helper()
	if len(r.Sequences) != n {
		t.Fatalf("%d sequences, want %d", len(r.Sequences), n)
	}
	for i, s := range r.Sequences {
		if len(s.Tokens) == 0 || len(s.Tokens) > maxTokens || len(s.Logprobs) != len(s.Tokens) {
			t.Fatalf("sequence %d: %d tokens, %d logprobs (max_tokens %d)", i, len(s.Tokens), len(s.Logprobs), maxTokens)
		}
		if s.StopReason != tinker.StopReasonStop && s.StopReason != tinker.StopReasonLength {
			t.Fatalf("sequence %d: stop reason %q", i, s.StopReason)
		}
		if s.StopReason == tinker.StopReasonLength && len(s.Tokens) != maxTokens {
			t.Fatalf("sequence %d: stopped for length after %d of %d tokens", i, len(s.Tokens), maxTokens)
		}
		for _, lp := range s.Logprobs {
			if lp > 0 || lp <= -8 {
				t.Fatalf("sequence %d: logprob %v outside (-8, 0]", i, lp)
			}
		}
	}
}

// TestSimForgottenSessionIsReplaced: a service that no longer knows the client's session (it
// restarted) answers its heartbeat, and a sampling session made in it, 404. The client then
// creates a new session, whether its heartbeat or a new sampler notices first, and samples
// again; a sampler of the old session fails with the asample 404 (its owner makes a new one).
func TestSimForgottenSessionIsReplaced(t *testing.T) {
	qwen := tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"}
	// A new sampler notices: the heartbeat does not tick in this test.
	e := newSimEnv(t, tinkersim.Config{}, func(c *tinker.Config) { c.Timing.HeartbeatInterval = time.Hour })
	old := e.sampler(t, qwen)
	first := e.client.SessionID()
	e.sim.ForgetSessions()
	var se *tinker.StatusError
	if _, err := old.Sample(e.ctx, simRequest(1)); !errors.As(err, &se) || se.Endpoint != "asample" || se.StatusCode != 404 {
		t.Fatalf("a sampler of the forgotten session: %v; want the asample 404", err)
	}
	fresh := e.sampler(t, qwen)
	if _, err := fresh.Sample(e.ctx, simRequest(1)); err != nil {
		t.Fatalf("a sampler made after the service forgot the session: %v", err)
	}
	if want := e.client.SessionID() + ":sample:0"; fresh.ID() != want {
		t.Errorf("sampler %q in the new session, want %q: its sampling sessions count from 0 (§3.5)", fresh.ID(), want)
	}
	if now := e.client.SessionID(); now == first || e.requests("create_session", 200) != 2 {
		t.Errorf("session %q (was %q), %d create_session: want one new session", now, first, e.requests("create_session", 200))
	}

	// The heartbeat notices.
	h := newSimEnv(t, tinkersim.Config{}, func(c *tinker.Config) { c.Timing.HeartbeatInterval = 10 * time.Millisecond })
	first = h.client.SessionID()
	h.sim.ForgetSessions()
	deadline := time.Now().Add(20 * time.Second)
	for h.client.SessionID() == first {
		if time.Now().After(deadline) {
			t.Fatalf("the session is still %q, 20s after the service forgot it", first)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := h.sampler(t, qwen).Sample(h.ctx, simRequest(2)); err != nil {
		t.Fatalf("sample in the new session: %v", err)
	}
	if n := h.requests("create_sampling_session", 404); n != 0 {
		t.Errorf("%d create_sampling_session 404s after the heartbeat renewed the session", n)
	}
}

// TestSimSessionRenewalWaitIsCancellable: while the heartbeat replaces a session the service
// forgot, and create_session keeps failing (the service is still coming back), a NewSampler
// that finds the session gone waits for that renewal, but only as long as its context lasts:
// every call returns promptly when its context is cancelled. Close, which ends the renewal,
// does not wait for the NewSampler either.
func TestSimSessionRenewalWaitIsCancellable(t *testing.T) {
	e := newSimEnv(t, tinkersim.Config{}, func(c *tinker.Config) {
		c.Timing.HeartbeatInterval = 10 * time.Millisecond
		c.Timing.HTTPRetryBase, c.Timing.HTTPRetryMax = time.Minute, time.Minute // the renewal lasts
	})
	e.sim.ForgetSessions()
	if _, err := e.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultDrop, Endpoints: []string{"create_session"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(e.eventsOf(tinker.EventRetry)) == 0 { // the heartbeat's create_session failed once
		if time.Now().After(deadline) {
			t.Fatal("the heartbeat did not try to renew the session within 20s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := e.client.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("NewSampler while the session is being renewed: %v; want its context's end", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("NewSampler returned %v after its context's 300ms", took)
		}
	case <-time.After(5 * time.Second):
		t.Error("NewSampler still waits for the session renewal 5s after its context ended")
		_ = e.client.Close() // ends the renewal, and so the wait
		<-done
	}
}

// TestSimSessionTimeoutHeartbeatsKeepTheSession: a service that expires sessions without
// heartbeats (§3.4, Config.SessionTimeout) keeps the client's, which heartbeats well within
// the timeout: after three timeouts its first sampler still samples in its first session.
// Without heartbeats within the timeout the session does expire, and the client carries on
// in a new one.
func TestSimSessionTimeoutHeartbeatsKeepTheSession(t *testing.T) {
	const timeout = time.Second
	qwen := tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"}
	e := newSimEnv(t, tinkersim.Config{SessionTimeout: timeout}, func(c *tinker.Config) { c.Timing.HeartbeatInterval = timeout / 10 })
	s, first := e.sampler(t, qwen), e.client.SessionID()
	time.Sleep(3 * timeout)
	if _, err := s.Sample(e.ctx, simRequest(1)); err != nil {
		t.Fatalf("sample %v after the session timeout: %v", 3*timeout, err)
	}
	if st := e.sim.Stats(); st.SessionsExpired != 0 || e.client.SessionID() != first || e.requests("create_session", 200) != 1 {
		t.Errorf("%d sessions expired, session %q (was %q): want the first session kept", st.SessionsExpired, e.client.SessionID(), first)
	}
	if n := e.requests("session_heartbeat", 200); n < 3 {
		t.Errorf("%d heartbeats in %v", n, 3*timeout)
	}

	// No heartbeat within the timeout: the session expires, a new sampler makes a new one.
	q := newSimEnv(t, tinkersim.Config{SessionTimeout: timeout}, func(c *tinker.Config) { c.Timing.HeartbeatInterval = time.Hour })
	first = q.client.SessionID()
	time.Sleep(timeout + timeout/2)
	if _, err := q.sampler(t, qwen).Sample(q.ctx, simRequest(1)); err != nil {
		t.Fatalf("sample after the session expired: %v", err)
	}
	if st := q.sim.Stats(); st.SessionsExpired != 1 || q.client.SessionID() == first {
		t.Errorf("%d sessions expired, session %q (was %q): want the first expired and a new one", st.SessionsExpired, q.client.SessionID(), first)
	}
}

// TestSimFutureTimeoutGivesUpALostFuture: with Config.FutureTimeout, a future the service
// never completes ends the Sample with ErrFutureTimeout, not retried; without it the client
// polls on, as the SDK does.
func TestSimFutureTimeoutGivesUpALostFuture(t *testing.T) {
	e := newSimEnv(t, tinkersim.Config{Faults: []tinkersim.Fault{{Kind: tinkersim.FaultNeverComplete}}},
		func(c *tinker.Config) { c.FutureTimeout = 300 * time.Millisecond })
	_, err := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"}).Sample(e.ctx, simRequest(1))
	if !errors.Is(err, tinker.ErrFutureTimeout) || tinker.IsRetryable(err) {
		t.Fatalf("Sample of a future that never completes: %v; want ErrFutureTimeout", err)
	}
	if n := e.sim.Stats().SamplesAccepted; n != 1 {
		t.Errorf("%d samples submitted, want 1 (not retried)", n)
	}

	forever := newSimEnv(t, tinkersim.Config{Faults: []tinkersim.Fault{{Kind: tinkersim.FaultNeverComplete}}}, nil)
	ctx, cancel := context.WithTimeout(forever.ctx, time.Second)
	defer cancel()
	if _, err := forever.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"}).Sample(ctx, simRequest(1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("without FutureTimeout: %v; want it to poll until the context ends", err)
	}
}

// TestSimStartupAndHeartbeat: Dial runs client/config, client/dynamic_config and
// create_session once each (§2), applies the simulator's flags (§3.1) and refresh interval,
// and heartbeats (§3.4); with dynamic config disabled the 404 means defaults.
func TestSimStartupAndHeartbeat(t *testing.T) {
	e := newSimEnv(t, tinkersim.Config{ClientConfig: map[string]any{
		"sample_max_concurrent_requests":       7,
		"sample_dispatch_bytes_semaphore_size": 1 << 20,
		"sample_no_retries":                    false,
		"some_future_flag":                     "ignored",
	}}, func(c *tinker.Config) { c.Timing.HeartbeatInterval = 20 * time.Millisecond })
	for _, ep := range []string{"client/config", "client/dynamic_config", "create_session"} {
		if n := e.requests(ep, 200); n != 1 {
			t.Errorf("%s answered 200 %d times, want 1", ep, n)
		}
	}
	f := e.client.Flags()
	if f.SampleMaxConcurrentRequests != 7 || f.SampleDispatchBytesSemaphoreSize != 1<<20 ||
		f.InflightResponseBytesSemaphoreSize != 52428800 || !f.SampleEnableStuckDetection ||
		f.BillingExceptionMaxPauseDuration != time.Hour || f.DynamicConfigRefreshInterval != 300*time.Second {
		t.Errorf("flags %+v", f)
	}
	if id := e.client.SessionID(); len(id) != 36 || strings.Count(id, "-") != 4 {
		t.Errorf("session id %q is not UUID-shaped", id)
	}
	deadline := time.Now().Add(20 * time.Second)
	for e.requests("session_heartbeat", 200) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("heartbeats: %v", e.sim.Stats().Requests["session_heartbeat"])
		}
		time.Sleep(5 * time.Millisecond)
	}
	if hf := e.eventsOf(tinker.EventHeartbeatFailed); len(hf) != 0 {
		t.Errorf("heartbeat failures: %v", hf[0].Err)
	}
	if err := e.client.Healthz(e.ctx); err != nil {
		t.Errorf("healthz: %v", err)
	}
	// Close stops the heartbeat. It waited for the heartbeat to end, so every heartbeat the
	// client sent has finished by then (the last one cut short, perhaps, while the simulator
	// still answers it): the simulator answers no more than those.
	_ = e.client.Close()
	sent := e.heartbeatsSent()
	time.Sleep(100 * time.Millisecond)
	if n, m := e.heartbeatsSent(), e.requests("session_heartbeat", 200); n != sent || m > int64(sent) {
		t.Errorf("heartbeats after Close: %d sent before it, %d sent and %d answered in all", sent, n, m)
	}

	d := newSimEnv(t, tinkersim.Config{DisableDynamicConfig: true}, nil)
	if n := d.requests("client/dynamic_config", 404); n != 1 {
		t.Errorf("dynamic_config answered 404 %d times, want 1", n)
	}
	if got := d.client.Flags().DynamicConfigRefreshInterval; got != 300*time.Second {
		t.Errorf("refresh interval after a 404: %v, want the 300 s default", got)
	}
}

// TestSimCapabilitiesAndListings: get_server_capabilities carries max_context_length (§3.8);
// the paginated listings (§3.14) return every synthetic training run and checkpoint of the
// simulator, one request per page; weights_info and a run's checkpoints agree with them.
func TestSimCapabilitiesAndListings(t *testing.T) {
	const runs = 7
	e := newSimEnv(t, tinkersim.Config{TrainingRuns: runs}, nil)
	caps, err := e.client.Capabilities(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range tinkersim.DefaultModels() {
		got, ok := caps.Model(m.Name)
		if !ok || got.MaxContextLength != m.MaxContextLength {
			t.Errorf("capabilities for %s: %+v (found %v), want max_context_length %d", m.Name, got, ok, m.MaxContextLength)
		}
	}

	var trs []tinker.TrainingRun
	for tr, err := range e.client.TrainingRuns(e.ctx, tinker.ListOptions{PageSize: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		trs = append(trs, tr)
	}
	if len(trs) != runs {
		t.Fatalf("listed %d training runs, the simulator has %d", len(trs), runs)
	}
	if pages := e.requests("training_runs", 200); pages != (runs+1)/2 {
		t.Errorf("%d training_runs pages for %d runs of 2", pages, runs)
	}
	seen := map[string]bool{}
	for _, tr := range trs {
		if seen[tr.TrainingRunID] || !strings.HasSuffix(tr.TrainingRunID, ":train:0") || tr.LastSamplerCheckpoint == nil ||
			tr.LastRequestTime.IsZero() || tr.LoraRank == nil || !tr.IsLora {
			t.Fatalf("training run %+v", tr)
		}
		seen[tr.TrainingRunID] = true
		if _, ok := caps.Model(tr.BaseModel); !ok {
			t.Errorf("run %s: base model %q is not a supported model", tr.TrainingRunID, tr.BaseModel)
		}
	}

	var cps []tinker.Checkpoint
	for cp, err := range e.client.Checkpoints(e.ctx, tinker.ListOptions{PageSize: 3}) {
		if err != nil {
			t.Fatal(err)
		}
		cps = append(cps, cp)
	}
	if len(cps) != 2*runs {
		t.Fatalf("listed %d checkpoints, want %d (two per run)", len(cps), 2*runs)
	}
	if pages := e.requests("checkpoints", 200); pages != (2*runs+2)/3 {
		t.Errorf("%d checkpoints pages for %d checkpoints of 3", pages, 2*runs)
	}
	paths := map[string]bool{}
	for _, cp := range cps {
		run, _, ok := strings.Cut(strings.TrimPrefix(cp.TinkerPath, "tinker://"), "/")
		if !ok || !seen[run] || paths[cp.TinkerPath] || !strings.HasSuffix(cp.TinkerPath, "/"+cp.CheckpointID) ||
			(cp.CheckpointType != "training" && cp.CheckpointType != "sampler") || cp.Time.IsZero() {
			t.Fatalf("checkpoint %+v", cp)
		}
		paths[cp.TinkerPath] = true
	}

	// Breaking out early fetches no further page.
	before := e.requests("checkpoints", 200)
	for range e.client.Checkpoints(e.ctx, tinker.ListOptions{PageSize: 3}) {
		break
	}
	if got := e.requests("checkpoints", 200) - before; got != 1 {
		t.Errorf("early break fetched %d pages", got)
	}

	run := trs[runs-1]
	rc, err := e.client.RunCheckpoints(e.ctx, run.TrainingRunID)
	if err != nil || len(rc) != 2 {
		t.Fatalf("checkpoints of run %s: %+v, %v", run.TrainingRunID, rc, err)
	}
	wi, err := e.client.WeightsInfo(e.ctx, run.LastSamplerCheckpoint.TinkerPath)
	if err != nil || wi.BaseModel != run.BaseModel || !wi.IsLora {
		t.Fatalf("weights_info of %s: %+v, %v (run base model %s)", run.LastSamplerCheckpoint.TinkerPath, wi, err, run.BaseModel)
	}
}

// TestSimSamplersLogprobsDeterminism: samplers for a base model and for a tinker://
// checkpoint path (§3.5, §3.9), prompt logprobs and top-k prompt logprobs (§T4, k capped at
// 20), and determinism: the same seed gives the same tokens (the simulator's outputs are a
// function of prompt, seed and sample index).
func TestSimSamplersLogprobsDeterminism(t *testing.T) {
	e := newSimEnv(t, tinkersim.Config{TrainingRuns: 2}, nil)
	base := e.sampler(t, tinker.SamplerSpec{BaseModel: "meta-llama/Llama-3.1-8B-Instruct"})
	info, err := base.Info(e.ctx)
	if err != nil || info.BaseModel != "meta-llama/Llama-3.1-8B-Instruct" || info.SamplerID != base.ID() || info.ModelPath != "" {
		t.Fatalf("base sampler info %+v, %v", info, err)
	}
	if !strings.HasPrefix(base.ID(), e.client.SessionID()+":sample:") {
		t.Errorf("sampler id %q does not extend session %q", base.ID(), e.client.SessionID())
	}

	var run tinker.TrainingRun
	for tr, err := range e.client.TrainingRuns(e.ctx, tinker.ListOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		run = tr
	}
	path := run.LastSamplerCheckpoint.TinkerPath
	ckpt := e.sampler(t, tinker.SamplerSpec{ModelPath: path})
	info, err = ckpt.Info(e.ctx)
	if err != nil || info.ModelPath != path || info.BaseModel != run.BaseModel {
		t.Fatalf("checkpoint sampler info %+v, %v; want model path %s, base model %s", info, err, path, run.BaseModel)
	}
	if ckpt.ID() == base.ID() {
		t.Fatalf("two samplers share id %s", base.ID())
	}

	req := simRequest(1234)
	req.NumSamples = 3
	req.PromptLogprobs = true
	req.TopKPromptLogprobs = 5
	for _, s := range []*tinker.Sampler{base, ckpt} {
		res, err := s.Sample(e.ctx, req)
		if err != nil {
			t.Fatalf("sampler %s: %v", s.ID(), err)
		}
		if res.Attempts != 1 || res.Submissions != 1 || res.RequestID == "" {
			t.Errorf("result bookkeeping %+v", res)
		}
		r := res.Response
		checkSequences(t, r, 3, *req.Params.MaxTokens)
		n := len(req.Prompt.Chunks[0].Tokens)
		if len(r.PromptLogprobs) != n || !math.IsNaN(r.PromptLogprobs[0]) {
			t.Fatalf("prompt logprobs %v for %d prompt tokens (first must be NaN)", r.PromptLogprobs, n)
		}
		for i, lp := range r.PromptLogprobs[1:] {
			if math.IsNaN(lp) || lp > 0 {
				t.Fatalf("prompt logprob %d: %v", i+1, lp)
			}
		}
		checkTopK(t, r.TopKPromptLogprobs, n, 5)
	}

	// k above the service's maximum is capped at 20.
	req.TopKPromptLogprobs = 50
	req.NumSamples = 1
	res, err := base.Sample(e.ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	checkTopK(t, res.Response.TopKPromptLogprobs, len(req.Prompt.Chunks[0].Tokens), tinkersim.MaxTopK)

	// Determinism: same seed, same tokens (each call a new seq_id); another seed differs.
	tokens := func(s *tinker.Sampler, seed int64) [][]int {
		t.Helper()
		r := simRequest(seed)
		r.NumSamples = 2
		res, err := s.Sample(e.ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		var out [][]int
		for _, q := range res.Response.Sequences {
			out = append(out, q.Tokens)
		}
		return out
	}
	a, b, c := tokens(base, 42), tokens(base, 42), tokens(base, 43)
	if !slices.EqualFunc(a, b, slices.Equal[[]int]) {
		t.Errorf("seed 42 twice: %v then %v", a, b)
	}
	if slices.Equal(a[0], a[1]) {
		t.Errorf("two samples of one request are identical: %v", a[0])
	}
	if slices.EqualFunc(a, c, slices.Equal[[]int]) {
		t.Errorf("seeds 42 and 43 give the same tokens %v", a)
	}
	if st := e.sim.Stats(); st.IdempotentReplays != 0 || st.SamplesCompleted != st.SamplesAccepted {
		t.Errorf("simulator: %d replays, %d accepted, %d completed", st.IdempotentReplays, st.SamplesAccepted, st.SamplesCompleted)
	}
}

// checkTopK checks top-k prompt logprobs: one row per prompt token, none for the first, k
// cells with decreasing logprobs elsewhere.
func checkTopK(t *testing.T, rows [][]tinker.TokenLogprob, n, k int) {
	t.Helper()
	if len(rows) != n || len(rows[0]) != 0 {
		t.Fatalf("top-k rows: %d for %d prompt tokens, first %v", len(rows), n, rows)
	}
	for i, row := range rows[1:] {
		if len(row) != k {
			t.Fatalf("top-k row %d has %d cells, want %d", i+1, len(row), k)
		}
		for j := 1; j < k; j++ {
			if row[j].Logprob > row[j-1].Logprob {
				t.Fatalf("top-k row %d not in decreasing order: %v", i+1, row)
			}
		}
	}
}

// TestSimFaults: the faults of §12 the client must survive, injected into the simulator.
func TestSimFaults(t *testing.T) {
	// Each case injects its fault, starts a sample, waits until the simulator answered
	// endpoint with status at least once (the fault was hit), then removes the fault; the
	// sample must recover and check tells how.
	type faultCase struct {
		name     string
		fault    tinkersim.Fault
		endpoint string
		status   int
		check    func(t *testing.T, e *simEnv, res *tinker.SampleResult, before tinkersim.Stats)
	}
	cases := []faultCase{{
		// §4.2: 5xx on a poll → poll again at once.
		name: "5xx on polls", endpoint: "retrieve_future", status: 503,
		fault: tinkersim.Fault{Kind: tinkersim.FaultServerError, Status: 503, Endpoints: []string{"retrieve_future"}},
		check: func(t *testing.T, e *simEnv, res *tinker.SampleResult, _ tinkersim.Stats) {
			if res.Attempts != 1 {
				t.Errorf("a 5xx poll re-ran the attempt: %d attempts", res.Attempts)
			}
			// Each poll again is a retry of the poll layer, which
			// tinkerfleet_tinker_retries_total{layer="poll"} and the client's warning show.
			var polls int64
			for _, ev := range e.eventsOf(tinker.EventRetry) {
				if ev.Layer == tinker.LayerPoll && ev.StatusCode == 503 {
					polls++
				}
			}
			if n := e.requests("retrieve_future", 503); polls != n {
				t.Errorf("%d poll-layer retry events for %d polls answered 503, want one each", polls, n)
			}
		},
	}, {
		// §4.2: 408 with a try_again body → poll again at once, the queue state is reported.
		name: "408 on polls", endpoint: "retrieve_future", status: 408,
		fault: tinkersim.Fault{Kind: tinkersim.FaultTimeout},
		check: func(t *testing.T, e *simEnv, res *tinker.SampleResult, _ tinkersim.Stats) {
			if res.Attempts != 1 {
				t.Errorf("a 408 poll re-ran the attempt: %d attempts", res.Attempts)
			}
			if qs := e.eventsOf(tinker.EventQueueState); len(qs) == 0 || qs[0].QueueState != tinker.QueueActive {
				t.Errorf("queue-state events %+v, want active", qs)
			}
		},
	}, {
		// §4.2, §6.3: 410 → the whole sample is resubmitted with a new seq_id (a new future,
		// not an idempotent replay of the old one).
		name: "410 expired", endpoint: "retrieve_future", status: 410,
		fault: tinkersim.Fault{Kind: tinkersim.FaultExpired},
		check: func(t *testing.T, e *simEnv, res *tinker.SampleResult, before tinkersim.Stats) {
			st := e.sim.Stats()
			if res.Attempts < 2 || st.SamplesAccepted-before.SamplesAccepted != int64(res.Attempts) ||
				st.IdempotentReplays != before.IdempotentReplays {
				t.Errorf("%d attempts, %d futures accepted, %d replays: want a new future per attempt",
					res.Attempts, st.SamplesAccepted-before.SamplesAccepted, st.IdempotentReplays-before.IdempotentReplays)
			}
			if !strings.HasSuffix(res.RequestID, ":"+strconv.FormatInt(res.SeqID, 10)) {
				t.Errorf("request id %s does not end in the final seq_id %d", res.RequestID, res.SeqID)
			}
			if len(e.eventsOf(tinker.EventRetry)) == 0 {
				t.Error("no retry event for the resubmission")
			}
		},
	}, {
		// §1.4, §6.2: a bare 400 on asample is a connection-level rejection, retried by the
		// submission loop with the same seq_id.
		name: "bare 400 on asample", endpoint: "asample", status: 400,
		fault: tinkersim.Fault{Kind: tinkersim.FaultBare400, Endpoints: []string{"asample"}},
		check: func(t *testing.T, e *simEnv, res *tinker.SampleResult, before tinkersim.Stats) {
			st := e.sim.Stats()
			if res.Attempts != 1 || res.Submissions < 2 || st.SamplesAccepted-before.SamplesAccepted != 1 {
				t.Errorf("%d attempts, %d submissions, %d futures: want one attempt resubmitted after the 400",
					res.Attempts, res.Submissions, st.SamplesAccepted-before.SamplesAccepted)
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newSimEnv(t, tinkersim.Config{}, nil)
			s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
			before := e.sim.Stats()
			id, err := e.sim.Inject(tc.fault)
			if err != nil {
				t.Fatal(err)
			}
			type out struct {
				res *tinker.SampleResult
				err error
			}
			done := make(chan out, 1)
			go func() {
				res, err := s.Sample(e.ctx, simRequest(7))
				done <- out{res, err}
			}()
			deadline := time.Now().Add(20 * time.Second)
			for e.requests(tc.endpoint, tc.status) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the fault was never hit: %v", e.sim.Stats().Requests)
				}
				time.Sleep(time.Millisecond)
			}
			e.sim.RemoveFault(id)
			o := <-done
			if o.err != nil {
				t.Fatalf("sample did not survive %s: %v", tc.name, o.err)
			}
			checkSequences(t, o.res.Response, 1, 16)
			tc.check(t, e, o.res, before)
		})
	}

	// §4.3: a paused_capacity window holds the futures back; polls answer try_again with the
	// queue state and reason, which the client reports; the sample completes after the window.
	t.Run("paused_capacity window", func(t *testing.T) {
		e := newSimEnv(t, tinkersim.Config{}, nil)
		s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
		const reason = "Tinker backend is running short on capacity (simulated)"
		id, err := e.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultPausedCapacity, Reason: reason})
		if err != nil {
			t.Fatal(err)
		}
		type out struct {
			res *tinker.SampleResult
			err error
		}
		done := make(chan out, 1)
		go func() {
			res, err := s.Sample(e.ctx, simRequest(9))
			done <- out{res, err}
		}()
		pausedEvents := func() []tinker.Event {
			var paused []tinker.Event
			for _, ev := range e.eventsOf(tinker.EventQueueState) {
				if ev.QueueState == tinker.QueuePausedCapacity {
					paused = append(paused, ev)
				}
			}
			return paused
		}
		// The window ends once the client has reported the pause, however long that took.
		deadline := time.Now().Add(20 * time.Second)
		for len(pausedEvents()) == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		e.sim.RemoveFault(id)
		o := <-done
		if o.err != nil {
			t.Fatalf("sample across the pause: %v", o.err)
		}
		checkSequences(t, o.res.Response, 1, 16)
		if paused := pausedEvents(); len(paused) == 0 || paused[0].Reason != reason || paused[0].SamplerID != s.ID() {
			t.Fatalf("paused queue-state events %+v, want reason %q for sampler %s", paused, reason, s.ID())
		}
		if w := e.sim.Stats().Windows; len(w) != 1 || w[0].AsampleCalls != 1 {
			t.Errorf("pause window stats %+v, want the one asample call", w)
		}
	})

	// §4.2, §7.2: a failed future is terminal: *RequestFailedError with the category, no
	// retry. Both an injected user failure and a prompt beyond the context window.
	t.Run("failed future", func(t *testing.T) {
		e := newSimEnv(t, tinkersim.Config{}, nil)
		s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
		id, err := e.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultFailed, Category: "user", Reason: "prompt rejected by policy"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Sample(e.ctx, simRequest(11))
		var rf *tinker.RequestFailedError
		if !errors.As(err, &rf) || rf.Category != tinker.CategoryUser || rf.Message != "prompt rejected by policy" ||
			!strings.HasPrefix(rf.RequestID, s.ID()+":") {
			t.Fatalf("err %v (%T), want a user RequestFailedError for sampler %s", err, err, s.ID())
		}
		if tinker.IsRetryable(err) || e.sim.Stats().SamplesAccepted != 1 {
			t.Errorf("failed future retried: %d futures accepted", e.sim.Stats().SamplesAccepted)
		}
		e.sim.RemoveFault(id)

		req := simRequest(12)
		tooMany := 32768
		req.Params.MaxTokens = &tooMany
		_, err = s.Sample(e.ctx, req)
		if !errors.As(err, &rf) || rf.Category != tinker.CategoryUser || !strings.Contains(rf.Message, "context window") {
			t.Fatalf("context overflow: err %v, want a user RequestFailedError", err)
		}
	})
}

// TestSimDefaultClientKeepsConnections: with its default HTTP client, a client sampling in
// many goroutines at once reuses its connections (§1.4: the reference client keeps pools),
// so the simulator accepts about as many connections as requests were in flight at once, not
// one per request. A client with Go's default pool of 2 idle connections per host opened one
// per request or so here, and spent a fifth of a busy `submit --simulate` on dialling.
func TestSimDefaultClientKeepsConnections(t *testing.T) {
	sim, err := tinkersim.New(tinkersim.Config{APIKeys: []string{simKey}, BaseLatency: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, err := sim.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := openSampler(t, ctx, tinker.Config{BaseURL: url, APIKey: simKey})

	const goroutines, each = 32, 24
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				if _, err := s.Sample(ctx, simRequest(int64(g*each+i))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := sim.Stats()
	requests := st.Requests["asample"][http.StatusOK] + st.Requests["retrieve_future"][http.StatusOK]
	if requests < 2*goroutines*each {
		t.Fatalf("the simulator answered %d asample and retrieve_future calls, want at least %d", requests, 2*goroutines*each)
	}
	// A request that finds no idle connection dials one, and may then take another that
	// came free meanwhile: a pool ends up with somewhat more connections than goroutines.
	// Start-up and the heartbeat may take a few of their own.
	if limit := int64(2*goroutines + 4); st.Connections < 1 || st.Connections > limit {
		t.Fatalf("%d connections for %d requests from %d goroutines: want at most %d", st.Connections, requests, goroutines, limit)
	}
}
