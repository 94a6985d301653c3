package tinker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
)

// §2: client/config, client/dynamic_config (404 → defaults), create_session,
// then a heartbeat owned by the client and stopped by Close; the base URL keeps
// its path prefix (§1.1).
func TestDialStartupAndHeartbeat(t *testing.T) {
	f := newFake(t)
	f.set("client/config", jsonReply(200, `{"sample_dispatch_bytes_semaphore_size": 2048, "sample_no_retries": false,
		"billing_exception_max_pause_duration_sec": 60, "some_future_flag": {"x": 1}, "sample_max_concurrent_requests": null}`))
	var beats atomic.Int32
	f.set("session_heartbeat", func(w http.ResponseWriter, r *http.Request, b []byte) {
		beats.Add(1)
		jsonReply(200, `{"type":"session_heartbeat"}`)(w, r, b)
	})
	c, _, ev := dial(t, f, func(cfg *Config) {
		cfg.Timing.HeartbeatInterval = 5 * time.Millisecond
		cfg.Tags = []string{"a"}
		cfg.ProjectID = "proj-1"
	})
	var order []string
	for _, r := range f.requests("") {
		order = append(order, r.Endpoint)
	}
	if got := strings.Join(order[:3], ","); got != "client/config,client/dynamic_config,create_session" {
		t.Fatalf("start-up order %v", order)
	}
	cfgReq := f.requests("client/config")[0]
	if string(cfgReq.Body) != `{"sdk_version":"0.25.0"}` || cfgReq.Method != "POST" ||
		cfgReq.Header.Get("Content-Type") != "application/json" || cfgReq.Header.Get("X-Idempotency-Key") == "" {
		t.Fatalf("client/config request %+v", cfgReq)
	}
	if got := string(f.requests("create_session")[0].Body); got != `{"tags":["a"],"user_metadata":{},"sdk_version":"0.25.0","project_id":"proj-1","type":"create_session"}` {
		t.Fatalf("create_session body %s", got)
	}
	fl := c.Flags()
	if fl.SampleDispatchBytesSemaphoreSize != 2048 || fl.BillingExceptionMaxPauseDuration != time.Minute ||
		fl.SampleMaxConcurrentRequests != 2000 || !fl.SampleEnableStuckDetection || fl.InflightResponseBytesSemaphoreSize != 52428800 ||
		fl.DynamicConfigRefreshInterval != 300*time.Second {
		t.Fatalf("flags %+v", fl)
	}
	if c.SessionID() != "sess-1" {
		t.Fatalf("session %q", c.SessionID())
	}
	waitFor(t, func() bool { return beats.Load() >= 3 })
	hb := f.requests("session_heartbeat")[0]
	if string(hb.Body) != `{"session_id":"sess-1","type":"session_heartbeat"}` {
		t.Fatalf("heartbeat body %s", hb.Body)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close waited for the heartbeat to end; every heartbeat it sent has finished (the last
	// one cut short, perhaps, while the fake still reads it), and the fake sees no more.
	sent := int32(heartbeatRequests(ev))
	time.Sleep(30 * time.Millisecond)
	if n := heartbeatRequests(ev); n != int(sent) || beats.Load() > sent {
		t.Fatalf("heartbeat continued after Close: %d sent by then, %d sent and %d received in all", sent, n, beats.Load())
	}
	if _, err := c.NewSampler(context.Background(), SamplerSpec{BaseModel: "m"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("NewSampler after Close: %v", err)
	}
	_ = c.Close() // idempotent
}

// heartbeatRequests counts the session_heartbeat requests the client has finished.
func heartbeatRequests(ev *eventLog) int {
	n := 0
	for _, e := range ev.of(EventRequest) {
		if e.Endpoint == "session_heartbeat" {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestDialDynamicConfigAndFatal404(t *testing.T) {
	f := newFake(t)
	f.set("client/dynamic_config", jsonReply(200, `{"refresh_interval_sec": 42}`))
	c, _, _ := dial(t, f, nil)
	if c.Flags().DynamicConfigRefreshInterval != 42*time.Second {
		t.Fatalf("refresh %v", c.Flags().DynamicConfigRefreshInterval)
	}
	// A 404 on client/config is fatal (§2 step 1).
	f2 := newFake(t)
	f2.set("client/config", jsonReply(404, `{"detail":"nope"}`))
	_, err := Dial(testCtx(t), Config{BaseURL: f2.url(), APIKey: testKey, Timing: Timing{Clock: newFakeClock()}})
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 404 || len(f2.requests("client/config")) != 1 {
		t.Fatalf("Dial with config 404: %v", err)
	}
}

func TestDialSessionlessAndBaseURLFromEnv(t *testing.T) {
	f := newFake(t)
	t.Setenv("TINKER_BASE_URL", f.url()+"/")
	c, err := Dial(testCtx(t), Config{APIKey: testKey, Sessionless: true, Timing: Timing{Clock: newFakeClock()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(f.requests("create_session")) != 0 || c.SessionID() != "" {
		t.Fatal("sessionless client created a session")
	}
	if _, err := c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "m"}); err == nil {
		t.Fatal("sessionless NewSampler succeeded")
	}
	if _, err := Dial(testCtx(t), Config{BaseURL: f.url(), APIKey: "sk-bad"}); err == nil {
		t.Fatal("bad key prefix accepted")
	}
}

func TestNewSamplerRequests(t *testing.T) {
	f := newFake(t)
	f.push("create_sampling_session", jsonReply(200, `{"sampling_session_id":"sess-1:sample:0"}`),
		jsonReply(200, `{"sampling_session_id":"sess-1:sample:1"}`))
	c, _, _ := dial(t, f, nil)
	s0, err := c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := c.NewSampler(testCtx(t), SamplerSpec{ModelPath: "tinker://sess-1:train:0/sampler_weights/step-100"})
	if err != nil {
		t.Fatal(err)
	}
	if s0.ID() != "sess-1:sample:0" || s1.ID() != "sess-1:sample:1" {
		t.Fatalf("ids %s %s", s0.ID(), s1.ID())
	}
	reqs := f.requests("create_sampling_session")
	if got := string(reqs[0].Body); got != `{"session_id":"sess-1","sampling_session_seq_id":0,"base_model":"Qwen/Qwen3-8B","type":"create_sampling_session"}` {
		t.Fatalf("body 0 %s", got)
	}
	if got := string(reqs[1].Body); got != `{"session_id":"sess-1","sampling_session_seq_id":1,"model_path":"tinker://sess-1:train:0/sampler_weights/step-100","type":"create_sampling_session"}` {
		t.Fatalf("body 1 %s", got)
	}
	if _, err := c.NewSampler(testCtx(t), SamplerSpec{ModelPath: "s3://x"}); err == nil {
		t.Fatal("non-tinker model path accepted")
	}
	if _, err := c.NewSampler(testCtx(t), SamplerSpec{}); err == nil {
		t.Fatal("empty spec accepted")
	}
	// Distinct random seq_id bases per object (§8).
	if s0.seq.Load() == s1.seq.Load() || s0.seq.Load() < 1_000_000_000 {
		t.Fatalf("seq bases %d %d", s0.seq.Load(), s1.seq.Load())
	}
}

// §6.1: retries on 5xx with the exponential delay, x-should-retry overrides,
// Retry-After used exactly, at most 10 retries, one idempotency key, and
// x-stainless-retry-count counting up.
func TestHTTPRetryLayer(t *testing.T) {
	f := newFake(t)
	c, fc, ev := dial(t, f, nil)
	f.push("create_sampling_session",
		jsonReply(503, `{"detail":"busy"}`),
		withHeader("Retry-After", "3", jsonReply(429, `{"detail":"slow"}`)),
		withHeader("retry-after-ms", "1500", jsonReply(500, `{}`)),
		func(w http.ResponseWriter, r *http.Request, b []byte) { // HTTP-date, whole seconds
			w.Header().Set("Retry-After", fc.Now().Add(7*time.Second).Format(http.TimeFormat))
			jsonReply(502, `{}`)(w, r, b)
		},
		withHeader("x-should-retry", "true", jsonReply(400, `{"detail":"retry me"}`)),
	)
	if _, err := c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "m"}); err != nil {
		t.Fatal(err)
	}
	sl := fc.Sleeps()
	if len(sl) != 5 || sl[0] < 375*time.Millisecond || sl[0] > 500*time.Millisecond || sl[1] != 3*time.Second ||
		sl[2] != 1500*time.Millisecond || sl[3] <= 6*time.Second || sl[3] > 7*time.Second || sl[4] < 6*time.Second || sl[4] > 8*time.Second {
		t.Fatalf("sleeps %v", sl)
	}
	reqs := f.requests("create_sampling_session")
	for i, r := range reqs {
		if r.Header.Get("X-Stainless-Retry-Count") != fmt.Sprint(i) || r.Header.Get("X-Idempotency-Key") != reqs[0].Header.Get("X-Idempotency-Key") {
			t.Fatalf("request %d headers %v", i, r.Header)
		}
	}
	if n := len(ev.of(EventRetry)); n != 5 {
		t.Fatalf("%d retry events", n)
	}
	if e := ev.of(EventRetry)[1]; e.Layer != LayerHTTP || e.StatusCode != 429 || e.Delay != 3*time.Second {
		t.Fatalf("retry event %+v", e)
	}

	// x-should-retry: false forbids retrying a 503.
	f.push("create_sampling_session", withHeader("x-should-retry", "false", jsonReply(503, `{}`)))
	_, err := c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "m"})
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 503 {
		t.Fatalf("x-should-retry false: %v", err)
	}

	// At most 10 retries (11 requests), then the status error.
	before := len(f.requests("create_sampling_session"))
	f.set("create_sampling_session", jsonReply(500, `{"error":"Internal Server Error"}`))
	_, err = c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "m"})
	if !errors.As(err, &se) || se.StatusCode != 500 || len(f.requests("create_sampling_session"))-before != 11 {
		t.Fatalf("exhausted: %v after %d requests", err, len(f.requests("create_sampling_session"))-before)
	}
}

// A server that echoes the key in an error body, a logger, events: the key
// appears nowhere but in the X-API-Key header.
func TestKeyNeverLeaks(t *testing.T) {
	f := newFake(t)
	var logs bytes.Buffer
	c, _, ev := dial(t, f, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	f.set("create_sampling_session", jsonReply(403, `{"detail":"key `+string(testKey)+` is not allowed"}`))
	_, err := c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "m"})
	if err == nil {
		t.Fatal("403 accepted")
	}
	c.log.Info("client", "client", c, "cfg", fmt.Sprintf("%+v", c))
	var all strings.Builder
	all.WriteString(err.Error())
	all.WriteString(fmt.Sprintf("%+v %#v", err, err))
	all.WriteString(logs.String())
	for _, e := range ev.ev {
		all.WriteString(fmt.Sprintf("%+v", e))
	}
	if strings.Contains(all.String(), "TESTSECRET") {
		t.Fatalf("key leaked: %s", all.String())
	}
	if !strings.Contains(err.Error(), redactedText) {
		t.Fatalf("echoed key not redacted: %v", err)
	}
	if got := f.requests("create_sampling_session")[0].Header.Get("X-Api-Key"); got != string(testKey) {
		t.Fatalf("X-API-Key header %q", got)
	}
}

func TestCapabilitiesInfoHealth(t *testing.T) {
	f := newFake(t)
	f.set("get_server_capabilities", jsonReply(200, `{"supported_models":[{"model_name":"Qwen/Qwen3-8B","max_context_length":32768},{"model_name":"old"}]}`))
	f.set("samplers", jsonReply(200, `{"sampler_id":"sess-1:sample:0","base_model":"Qwen/Qwen3-8B","model_path":null}`))
	f.set("weights_info", jsonReply(200, `{"base_model":"Qwen/Qwen3-8B","is_lora":true,"lora_rank":32}`))
	f.set("healthz", jsonReply(200, `{"status":"ok"}`))
	f.push("get_server_capabilities", jsonReply(503, `{}`)) // retried
	c, _, _ := dial(t, f, nil)
	ctx := testCtx(t)
	caps, err := c.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := caps.Model("Qwen/Qwen3-8B"); !ok || m.MaxContextLength != 32768 {
		t.Fatalf("caps %+v", caps)
	}
	if m, _ := caps.Model("old"); m.MaxContextLength != 0 {
		t.Fatalf("old %+v", m)
	}
	if r := f.requests("get_server_capabilities")[0]; r.Method != "GET" || r.Header.Get("Content-Type") != "" {
		t.Fatalf("GET headers %v", r.Header)
	}
	s := sampler(t, c)
	info, err := s.Info(ctx)
	if err != nil || info.BaseModel != "Qwen/Qwen3-8B" || info.ModelPath != "" {
		t.Fatalf("info %+v %v", info, err)
	}
	wi, err := c.WeightsInfo(ctx, "tinker://run/weights/w")
	if err != nil || !wi.IsLora || *wi.LoraRank != 32 || string(f.requests("weights_info")[0].Body) != `{"tinker_path":"tinker://run/weights/w"}` {
		t.Fatalf("weights %+v %v", wi, err)
	}
	if err := c.Healthz(ctx); err != nil {
		t.Fatal(err)
	}
	f.set("healthz", jsonReply(200, `{"status":"degraded"}`))
	if err := c.Healthz(ctx); err == nil {
		t.Fatal("degraded health accepted")
	}
}

func TestListingPagesLazily(t *testing.T) {
	f := newFake(t)
	total := 250
	f.set("checkpoints", func(w http.ResponseWriter, r *http.Request, b []byte) {
		var off, lim int
		fmt.Sscan(r.URL.Query().Get("offset"), &off)
		fmt.Sscan(r.URL.Query().Get("limit"), &lim)
		var items []string
		for i := off; i < min(off+lim, total); i++ {
			items = append(items, fmt.Sprintf(`{"checkpoint_id":"weights/%d","checkpoint_type":"training","time":"2026-07-01T12:00:00Z","tinker_path":"tinker://r/weights/%d","public":false,"expires_at":null}`, i, i))
		}
		jsonReply(200, fmt.Sprintf(`{"checkpoints":[%s],"cursor":{"offset":%d,"limit":%d,"total_count":%d}}`, strings.Join(items, ","), off, lim, total))(w, r, b)
	})
	c, _, _ := dial(t, f, nil)
	ctx := testCtx(t)
	n := 0
	for cp, err := range c.Checkpoints(ctx, ListOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		if cp.CheckpointID != fmt.Sprintf("weights/%d", n) || cp.Time.IsZero() {
			t.Fatalf("item %d: %+v", n, cp)
		}
		n++
	}
	reqs := f.requests("checkpoints")
	if n != total || len(reqs) != 3 || reqs[2].Query.Get("offset") != "200" || reqs[0].Query.Get("limit") != "100" {
		t.Fatalf("got %d items in %d requests", n, len(reqs))
	}
	// Stop early: no further page is fetched.
	n = 0
	for range c.Checkpoints(ctx, ListOptions{}) {
		n++
		if n == 150 {
			break
		}
	}
	if got := len(f.requests("checkpoints")) - 3; got != 2 {
		t.Fatalf("early stop fetched %d pages", got)
	}

	// Training runs: total_count ends the listing; errors are yielded once.
	f.push("training_runs",
		jsonReply(200, `{"training_runs":[{"training_run_id":"s:train:0","base_model":"m","model_owner":"o","is_lora":true,"corrupted":false,"lora_rank":8,"last_request_time":"2026-07-01T12:00:00Z","last_checkpoint":null,"last_sampler_checkpoint":null,"user_metadata":{"k":"v"}},{"training_run_id":"s:train:1","base_model":"m","model_owner":"o","is_lora":false,"corrupted":false,"last_request_time":"2026-07-01T12:00:00Z"}],"cursor":{"offset":0,"limit":2,"total_count":3}}`),
		jsonReply(200, `{"training_runs":[{"training_run_id":"s:train:2","base_model":"m","model_owner":"o","is_lora":false,"corrupted":false,"last_request_time":"2026-07-01T12:00:00Z"}],"cursor":{"offset":2,"limit":2,"total_count":3}}`),
	)
	var ids []string
	for tr, err := range c.TrainingRuns(ctx, ListOptions{PageSize: 2}) {
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, tr.TrainingRunID)
	}
	tr := f.requests("training_runs")
	if strings.Join(ids, ",") != "s:train:0,s:train:1,s:train:2" || len(tr) != 2 || tr[0].Query.Get("access_scope") != "owned" {
		t.Fatalf("runs %v in %d requests", ids, len(tr))
	}
	f.set("training_runs", jsonReply(403, `{"detail":"no"}`))
	var errs int
	for _, err := range c.TrainingRuns(ctx, ListOptions{}) {
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode != 403 {
			t.Fatalf("listing error %v", err)
		}
		errs++
	}
	if errs != 1 {
		t.Fatalf("%d errors yielded", errs)
	}
	f.set("training_runs/r1/checkpoints", jsonReply(200, `{"checkpoints":[{"checkpoint_id":"sampler_weights/a","checkpoint_type":"sampler","time":"2026-07-01T12:00:00Z","tinker_path":"tinker://r1/sampler_weights/a"}],"cursor":null}`))
	cps, err := c.RunCheckpoints(ctx, "r1")
	if err != nil || len(cps) != 1 || cps[0].CheckpointType != "sampler" {
		t.Fatalf("run checkpoints %+v %v", cps, err)
	}
}

// TestDialWarnsWhileItCannotReachTheService: Dial against a port nobody listens on retries
// client/config for the 300 s of §6.2 (here on a fake clock), and says so: a warning at the
// first retry, then at most one every 30 s, naming the endpoint and the error but never the
// key. Sampling calls are warned about in sum, with the status their events carry; their
// 429s (backpressure) are not.
func TestDialWarnsWhileItCannotReachTheService(t *testing.T) {
	logs := &fleettest.Buffer{}
	_, err := Dial(testCtx(t), Config{BaseURL: fleettest.ClosedURL(t), APIKey: testKey, Logger: debugLogger(logs),
		Timing: Timing{Clock: newFakeClock()}})
	var ce *ConnectionError
	if !errors.As(err, &ce) {
		t.Fatalf("Dial to a closed port: %v", err)
	}
	out := logs.String()
	n := strings.Count(out, "tinker: request failed; retrying")
	if n < 2 || n > 11 || !strings.Contains(out, "endpoint=client/config") || !strings.Contains(out, "connection refused") {
		t.Fatalf("%d retry warnings over 300 s, want 2 to 11 (one at once, then one every 30 s at most):\n%s", n, out)
	}
	if strings.Contains(out, string(testKey)) {
		t.Fatal("a warning shows the API key")
	}

	var c Client
	var events []Event
	clock := newFakeClock()
	c.log, c.clock, c.onEvent = debugLogger(logs), clock, func(e Event) { events = append(events, e) }
	before := logs.String()
	failed := func(status int) Event {
		return Event{Kind: EventRetry, Endpoint: "asample", Layer: LayerSubmit, SamplerID: "s-1",
			Err: &StatusError{Method: "POST", Endpoint: "asample", StatusCode: status}}
	}
	c.emit(failed(http.StatusTooManyRequests))
	if logs.String() != before {
		t.Fatal("a sampling call's 429 was warned about")
	}
	if len(events) != 1 || events[0].StatusCode != http.StatusTooManyRequests {
		t.Fatalf("events %+v: want the status of the retry's error", events)
	}
	c.emit(failed(http.StatusServiceUnavailable))
	c.emit(failed(http.StatusServiceUnavailable)) // within 30 s: counted, not warned
	if out := logs.String()[len(before):]; strings.Count(out, "tinker: request failed; retrying") != 1 ||
		!strings.Contains(out, "endpoint=asample status=503") || !strings.Contains(out, "retried=1") {
		t.Fatalf("a sample's 503s, warned once at first:\n%s", out)
	}
	_ = clock.Sleep(testCtx(t), retryLogInterval)
	before = logs.String()
	c.emit(failed(http.StatusServiceUnavailable))
	if out := logs.String()[len(before):]; strings.Count(out, "tinker: request failed; retrying") != 1 || !strings.Contains(out, "retried=2") {
		t.Fatalf("30 s later, one warning counting the retry held back: want retried=2:\n%s", out)
	}
}

// A reply that echoes a key the client replaced (SetAPIKey, after a rotation; a request sent
// before the swap may still be answered) has it redacted too.
func TestARotatedKeyStaysRedacted(t *testing.T) {
	f := newFake(t)
	c, _, _ := dial(t, f, nil)
	const rotated = APIKey("tml-ROTATEDSECRET")
	if changed, err := c.SetAPIKey(rotated); err != nil || !changed {
		t.Fatalf("SetAPIKey = %v, %v", changed, err)
	}
	f.mu.Lock()
	f.accept = func(_, cred string) bool { return cred == string(rotated) }
	f.mu.Unlock()
	f.set("create_sampling_session", jsonReply(403, `{"detail":"keys `+string(testKey)+` and `+string(rotated)+` are not allowed"}`))
	_, err := c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "m"})
	if err == nil {
		t.Fatal("403 accepted")
	}
	if msg := err.Error(); strings.Contains(msg, "TESTSECRET") || strings.Contains(msg, "ROTATEDSECRET") || strings.Count(msg, redactedText) != 2 {
		t.Fatalf("a key echoed after the rotation: %v; want both redacted", err)
	}
}

// A redirect is followed on the service's host, and not to another host, which would get
// the API key with it: the request ends with an error that names where it was sent.
func TestARedirectTakesTheKeyNowhereElse(t *testing.T) {
	f := newFake(t)
	var elsewhere []string // the X-API-Key values another host received
	var mu sync.Mutex
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		elsewhere = append(elsewhere, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer other.Close()
	redirect := func(to string) reply {
		return func(w http.ResponseWriter, r *http.Request, _ []byte) { http.Redirect(w, r, to, http.StatusFound) }
	}
	const caps = `{"supported_models":[{"model_name":"Qwen/Qwen3-8B","max_context_length":32768}]}`
	f.set("get_server_capabilities", jsonReply(200, caps))
	c, _, _ := dial(t, f, nil)
	ctx := testCtx(t)

	f.push("get_server_capabilities", redirect(f.url()+"/api/v1/get_server_capabilities"))
	if _, err := c.Capabilities(ctx); err != nil {
		t.Fatalf("a redirect on the service's host: %v", err)
	}
	if n := len(f.requests("get_server_capabilities")); n != 2 {
		t.Fatalf("the service saw %d requests, want the redirected one and the one it redirected to", n)
	}

	// The same server under another name is another host.
	away := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)
	f.push("get_server_capabilities", redirect(away+"/steal"))
	_, err := c.Capabilities(ctx)
	var pe *ProtocolError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "redirected to "+away+", not followed") {
		t.Fatalf("a redirect to another host: %v; want a ProtocolError naming it", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(elsewhere) != 0 {
		t.Fatalf("another host received %d requests (keys %q)", len(elsewhere), elsewhere)
	}
}

// keepCredentialHome follows redirects on the host a request went to, upgrades to https
// included, and no others; a redirect policy of the caller's still applies.
func TestKeepCredentialHomeFollowsOnlyTheSameHost(t *testing.T) {
	req := func(raw string) *http.Request {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Request{URL: u}
	}
	check := keepCredentialHome(&http.Client{}).CheckRedirect
	for _, tc := range []struct {
		from, to string
		follow   bool
	}{
		{"https://tinker.example/api/v1/asample", "https://tinker.example/v2/asample", true},
		{"https://tinker.example/a", "https://TINKER.example/b", true},
		{"http://tinker.example/a", "https://tinker.example/a", true},
		{"https://tinker.example/a", "http://tinker.example/a", false},
		{"https://tinker.example/a", "https://evil.example/a", false},
		{"https://tinker.example/a", "https://tinker.example:8443/a", false},
	} {
		err := check(req(tc.to), []*http.Request{req(tc.from)})
		if follow := err == nil; follow != tc.follow {
			t.Errorf("%s -> %s: followed %v, want %v (%v)", tc.from, tc.to, follow, tc.follow, err)
		}
	}
	var ten []*http.Request
	for range 10 {
		ten = append(ten, req("https://tinker.example/a"))
	}
	if check(req("https://tinker.example/a"), ten) == nil {
		t.Error("an eleventh redirect followed")
	}
	refuse := errors.New("the caller's policy")
	own := keepCredentialHome(&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return refuse }})
	if err := own.CheckRedirect(req("https://tinker.example/b"), []*http.Request{req("https://tinker.example/a")}); err != refuse {
		t.Errorf("the caller's policy was not applied: %v", err)
	}
}

// A Cloudflare Access service token from the environment goes in its two headers on every
// request (§1.1, §1.2), and its secret is scrubbed from an error that echoes it, as a key is.
func TestCloudflareAccessHeadersGoOnEveryRequest(t *testing.T) {
	t.Setenv("CLOUDFLARE_ACCESS_CLIENT_ID", "cf-id.access")
	t.Setenv("CLOUDFLARE_ACCESS_CLIENT_SECRET", "CFSECRET0123456789")
	f := newFake(t)
	c, _, _ := dial(t, f, nil)
	if _, err := sampler(t, c).Sample(testCtx(t), SampleRequest{Prompt: EncodedText([]int{1, 2}), NumSamples: 1}); err != nil {
		t.Fatal(err)
	}
	all := f.requests("")
	if len(all) < 5 {
		t.Fatalf("only %d requests seen", len(all))
	}
	for _, r := range all {
		if r.Header.Get("CF-Access-Client-Id") != "cf-id.access" || r.Header.Get("CF-Access-Client-Secret") != "CFSECRET0123456789" {
			t.Fatalf("%s %s without the Cloudflare Access headers: %v", r.Method, r.Endpoint, r.Header)
		}
	}
	f.set("get_server_capabilities", jsonReply(403, `{"detail":"token CFSECRET0123456789 may not"}`))
	_, err := c.Capabilities(testCtx(t))
	if err == nil || strings.Contains(err.Error(), "CFSECRET") || !strings.Contains(err.Error(), redactedText) {
		t.Fatalf("the secret echoed in an error: %v", err)
	}
	if s := fmt.Sprintf("%v %+v", c.cf, c.cf); strings.Contains(s, "CFSECRET") {
		t.Fatalf("the secret printed: %s", s)
	}
}

// TestABare400IsRetriedOnAFreshConnection: a 400 without a body is a connection-level
// rejection, retried as a connection error on a fresh connection, as the SDK replaces that
// pool client (§1.4); the retry went down the very connection that was rejected.
func TestABare400IsRetriedOnAFreshConnection(t *testing.T) {
	f := newFake(t)
	var mu sync.Mutex
	var addrs []string
	rec := func(r reply) reply {
		return func(w http.ResponseWriter, req *http.Request, body []byte) {
			mu.Lock()
			addrs = append(addrs, req.RemoteAddr)
			mu.Unlock()
			r(w, req, body)
		}
	}
	f.push("create_sampling_session", rec(bareStatus(400)))
	f.set("create_sampling_session", rec(jsonReply(200, `{"sampling_session_id":"sess-1:sample:0"}`)))
	c, _, _ := dial(t, f, nil)
	if _, err := c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "Qwen/Qwen3-8B"}); err != nil {
		t.Fatalf("NewSampler: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(addrs) != 2 {
		t.Fatalf("want the bare 400 and one retry, got %d requests", len(addrs))
	}
	if addrs[0] == addrs[1] {
		t.Fatalf("the retry after a bare 400 reused the rejected connection %s; §1.4 wants a fresh one", addrs[0])
	}
}

// TestABillingIncidentEndsWhenNo402WasLoggedFor300s: an incident resets when no 402 was
// logged for 300 s (§2.3; the SDK's last-logged time moves at most every 60 s, and not once
// the window is over). The client counted from the last 402 seen, so 402s that kept coming
// past the window failed every call at once, where the SDK pauses again after 5 minutes.
func TestABillingIncidentEndsWhenNo402WasLoggedFor300s(t *testing.T) {
	f := newFake(t)
	f.set("client/config", jsonReply(200, `{"billing_exception_max_pause_duration_sec": 100}`))
	f.set("get_server_capabilities", jsonReply(200, `{"supported_models":[]}`))
	c, fc, _ := dial(t, f, nil)
	t0 := fc.Now()
	at := func(d time.Duration) {
		fc.mu.Lock()
		fc.now = t0.Add(d)
		fc.mu.Unlock()
	}
	pay := jsonReply(402, `{"detail":"payment required"}`)
	// t=0: first 402 of the incident, logged. t=50 s: a 402, not logged (< 60 s since).
	for _, d := range []time.Duration{0, 50 * time.Second} {
		at(d)
		f.push("get_server_capabilities", pay)
		if _, err := c.Capabilities(testCtx(t)); err != nil {
			t.Fatalf("402 at %s inside the window: %v", d, err)
		}
	}
	// t=320 s: 320 s since the last *logged* 402 → a new incident, whose window is open.
	at(320 * time.Second)
	f.push("get_server_capabilities", pay)
	if _, err := c.Capabilities(testCtx(t)); err != nil {
		t.Fatalf("402 at 320 s (no 402 logged for 320 s: a new incident per §2.3) was fatal: %v", err)
	}
}

// TestBare400BudgetIsPerTrafficClass: the SDK keeps the bare-400 budget (16 conversions)
// per connection pool, one pool per traffic class (§1.4): polls that spend theirs leave
// asample's whole. With one budget for all, a burst of rejected polls made the next bare 400
// on asample a plain 400, a job failed for good as the user's.
func TestBare400BudgetIsPerTrafficClass(t *testing.T) {
	f := newFake(t)
	c, _, _ := dial(t, f, nil)
	s := sampler(t, c)
	budget := c.t.Bare400Budget
	for range budget {
		f.push("retrieve_future", bareStatus(400))
	}
	f.push("retrieve_future", block) // the sample's poll stays out, as in bulk sampling
	actx, acancel := context.WithCancel(testCtx(t))
	defer acancel()
	held := make(chan error, 1)
	go func() { _, err := s.Sample(actx, basicRequest()); held <- err }()
	for len(f.requests("retrieve_future")) < budget+1 {
		select {
		case err := <-held:
			t.Fatalf("the first sample ended: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	f.push("asample", bareStatus(400))
	res, err := s.Sample(testCtx(t), basicRequest())
	if err != nil || res.Submissions != 2 {
		t.Fatalf("a bare 400 on asample after %d on polls: %v; want it retried as a connection error", budget, err)
	}
	acancel()
	<-held
}

// TestABare400IsCountedAsThe400ItWas: a bare 400 turned into a connection error (§1.4) is
// still a reply of status 400, and its request event says so. It said 0, "no response" in
// tinkerfleet_tinker_requests_total, so that a load balancer rejecting requests read as a
// network that lost them.
func TestABare400IsCountedAsThe400ItWas(t *testing.T) {
	res, _, _, ev, err := runSample(t, nil, bareStatus(400))
	if err != nil || res.Response == nil {
		t.Fatal(err)
	}
	var polls []int
	for _, e := range ev.of(EventRequest) {
		if e.Endpoint == "retrieve_future" {
			polls = append(polls, e.StatusCode)
		}
	}
	if !reflect.DeepEqual(polls, []int{400, 200}) {
		t.Fatalf("poll request events of status %v, want [400 200]", polls)
	}
	r := ev.of(EventRetry)
	if len(r) != 1 || r[0].Layer != LayerPoll {
		t.Fatalf("retry events %+v: want one poll backoff, as for a connection error", r)
	}
}

// TestTheServicesMessagesAreLoggedWithoutTheKey: the messages the service sends to be shown
// (create_session's info, warning and error messages, §3.3, and the reason of a paused
// queue, §4.3) are logged as the service wrote them but for the credentials in them, as an
// error body is: a service that names the key it was given ("key tml-… expires soon") must
// not put it in the log.
func TestTheServicesMessagesAreLoggedWithoutTheKey(t *testing.T) {
	f := newFake(t)
	k := string(testKey)
	f.set("create_session", jsonReply(200, `{"type":"create_session","session_id":"sess-1",`+
		`"info_message":"hello `+k+`","warning_message":"key `+k+` expires soon","error_message":"key `+k+` is on its last day"}`))
	f.push("retrieve_future", jsonReply(200, `{"type":"try_again","request_id":"x","queue_state":"paused_rate_limit","queue_state_reason":"too many samples for key `+k+`"}`))
	var logs bytes.Buffer
	c, _, _ := dial(t, f, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if _, err := sampler(t, c).Sample(testCtx(t), basicRequest()); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if strings.Contains(out, "TESTSECRET") {
		t.Fatalf("key in the log:\n%s", out)
	}
	for _, want := range []string{"expires soon", "last day", "too many samples for key"} {
		if !strings.Contains(out, want) {
			t.Errorf("the service's message %q is not in the log:\n%s", want, out)
		}
	}
}

// TestABaseURLsUserInformationIsNotShown: a base URL may carry a proxy's user and password,
// or a token as its user name. The errors and warnings of a base URL that is no URL, of one
// whose password's '/' ends its host, and of a service that cannot be reached show neither.
func TestABaseURLsUserInformationIsNotShown(t *testing.T) {
	closed := strings.TrimPrefix(fleettest.ClosedURL(t), "http://")
	for _, base := range []string{
		"htps://proxyuser:s3cret@" + closed,     // no scheme Dial takes
		"http://proxyuser:s3cret/pw@" + closed,  // "s3cret" taken for a port
		"http://proxyuser:12/s3cret@" + closed,  // parses: host proxyuser:12, the rest a path
		"http://proxyuser:s3cret%zz@" + closed,  // a bad escape
		"http://s3cret-token-as-user@" + closed, // net/http shows a URL's user name
		"http://proxyuser:s3cret-pw@" + closed,  // net/http shows it as proxyuser:***
	} {
		logs := &fleettest.Buffer{}
		_, err := Dial(testCtx(t), Config{BaseURL: base, APIKey: testKey, Logger: debugLogger(logs),
			Timing: Timing{Clock: newFakeClock()}})
		if err == nil {
			t.Fatalf("%s: Dial to a closed port succeeded", base)
		}
		if all := err.Error() + logs.String(); strings.Contains(all, "s3cret") {
			t.Errorf("%s: the base URL's user information is shown: %v\n%s", base, err, logs)
		}
	}
}
