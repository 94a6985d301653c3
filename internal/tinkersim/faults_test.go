package tinkersim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

func mustInject(t *testing.T, s *Server, f Fault) FaultID {
	t.Helper()
	id, err := s.Inject(f)
	if err != nil {
		t.Fatalf("inject %+v: %v", f, err)
	}
	return id
}

func TestFaultRateLimitWindowCountsAsamples(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{RetryAfter: 3 * time.Second})
	ssid := h.sampler("Qwen/Qwen3-8B")
	h.asample(sampleBody(ssid, 0, []int32{1}, nil)) // before the window
	id := mustInject(t, h.srv, Fault{Kind: FaultRateLimit, Duration: time.Hour, Reason: "slow down"})
	for i := range 3 {
		r := h.do("POST", "/api/v1/asample", sampleBody(ssid, int64(i+1), []int32{1}, nil), "X-Tinker-Sampling-Backpressure", "1")
		body := mustJSONError(t, r, http.StatusTooManyRequests)
		if r.header.Get("Retry-After") != "3" || body["detail"] != "slow down" {
			t.Fatalf("429 %v %s", r.header, r.body)
		}
	}
	// Other endpoints are not affected by an asample 429.
	mustStatus(t, h.do("GET", "/api/v1/healthz", nil), 200)
	if !h.srv.RemoveFault(id) {
		t.Fatal("RemoveFault: not found")
	}
	h.asample(sampleBody(ssid, 9, []int32{1}, nil)) // after the window
	st := h.srv.Stats()
	if len(st.Windows) != 1 {
		t.Fatalf("windows %+v", st.Windows)
	}
	w := st.Windows[0]
	if w.Kind != FaultRateLimit || w.AsampleCalls != 3 || w.End.IsZero() || !w.End.After(w.Start) || w.FaultID != id {
		t.Fatalf("window %+v", w)
	}
	if st.Requests["asample"][429] != 3 || st.Requests["asample"][200] != 2 {
		t.Fatalf("requests %+v", st.Requests)
	}
}

func TestFaultRateIsSeededAndDeterministic(t *testing.T) {
	t.Parallel()
	pattern := func() string {
		h := newHarness(t, Config{Seed: 42})
		ssid := h.sampler("Qwen/Qwen3-8B")
		mustInject(t, h.srv, Fault{Kind: FaultRateLimit, Rate: 0.5})
		var b strings.Builder
		for i := range 40 {
			r := h.do("POST", "/api/v1/asample", sampleBody(ssid, int64(i), []int32{1}, nil), "X-Tinker-Sampling-Backpressure", "1")
			if r.status == 429 {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		return b.String()
	}
	a, b := pattern(), pattern()
	if a != b {
		t.Fatalf("same seed, different fault patterns:\n%s\n%s", a, b)
	}
	if n := strings.Count(a, "x"); n < 8 || n > 32 {
		t.Fatalf("rate 0.5 hit %d of 40: %s", n, a)
	}
}

// TestFaultCountBoundsTheHits: a fault with a count hits that many requests, then none; a
// count of 1 on kind 429 is a lone 429.
func TestFaultCountBoundsTheHits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	mustInject(t, h.srv, Fault{Kind: FaultRateLimit, Count: 2})
	var got strings.Builder
	for i := range 5 {
		r := h.do("POST", "/api/v1/asample", sampleBody(ssid, int64(i), []int32{1}, nil), "X-Tinker-Sampling-Backpressure", "1")
		got.WriteString(map[bool]string{true: "x", false: "."}[r.status == http.StatusTooManyRequests])
	}
	if got.String() != "xx..." {
		t.Fatalf("asample replies %s, want the first two refused (x)", got.String())
	}
	if fs := h.srv.Faults(); len(fs) != 1 || fs[0].Count != 2 || fs[0].Hits != 2 {
		t.Fatalf("faults %+v, want count 2 and 2 hits", fs)
	}
}

func TestFaultServerErrorAndBare400(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	id := h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	f5 := mustInject(t, h.srv, Fault{Kind: FaultServerError, Status: 503, Endpoints: []string{"retrieve_future"}})
	r := h.poll(id, "application/x-protobuf")
	body := mustJSONError(t, r, 503)
	if body["error"] != "Service Unavailable" || !strings.Contains(body["message"].(string), "Log ID") {
		t.Fatalf("5xx body %s", r.body)
	}
	mustStatus(t, h.do("POST", "/api/v1/asample", sampleBody(ssid, 1, []int32{1}, nil)), 200) // not on asample
	h.srv.RemoveFault(f5)
	mustInject(t, h.srv, Fault{Kind: FaultBare400})
	for _, r := range []reply{h.poll(id, "application/x-protobuf"), h.do("POST", "/api/v1/asample", sampleBody(ssid, 2, []int32{1}, nil))} {
		if r.status != 400 || len(r.body) != 0 || r.header.Get("Content-Length") != "0" {
			t.Fatalf("bare 400: %d %v %q", r.status, r.header, r.body)
		}
	}
	if _, err := h.srv.Inject(Fault{Kind: FaultServerError, Status: 404}); err == nil {
		t.Fatal("5xx fault accepted status 404")
	}
}

// TestFaultDrop: a dropped request gets no reply at all, a connection error for the client,
// on the endpoints named (here auth/token, an outage of the JWT exchange) and nowhere else,
// counted under status 0.
func TestFaultDrop(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{JWTAuth: true})
	mustInject(t, h.srv, Fault{Kind: FaultDrop, Endpoints: []string{"auth/token"}, Count: 2})
	for range 2 {
		req, _ := http.NewRequest("POST", h.base+"/api/v1/auth/token", strings.NewReader("{}"))
		req.Header.Set("X-API-Key", testKey)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("dropped auth/token answered %d", resp.StatusCode)
		}
	}
	mustStatus(t, h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`), 200)
	mustStatus(t, h.do("POST", "/api/v1/auth/token", "{}"), 200) // the count is spent
	if st := h.srv.Stats(); st.Requests["auth/token"][0] != 2 || st.Requests["auth/token"][200] != 1 {
		t.Fatalf("auth/token replies %v, want 2 dropped and 1 ok", st.Requests["auth/token"])
	}
	if _, err := ParseFault("kind=drop,endpoints=auth/token,duration=30s", time.Now()); err != nil {
		t.Fatal(err)
	}
}

func TestFaultPollTimeoutsAndTryAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{LongPollWait: time.Hour})
	ssid := h.sampler("Qwen/Qwen3-8B")
	id := h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	f := mustInject(t, h.srv, Fault{Kind: FaultTimeout})
	start := time.Now()
	r := h.poll(id, "application/x-protobuf")
	body := mustJSONError(t, r, http.StatusRequestTimeout)
	if body["type"] != "try_again" || body["request_id"] != id || time.Since(start) > 30*time.Second {
		t.Fatalf("408 %s", r.body)
	}
	h.srv.RemoveFault(f)
	mustInject(t, h.srv, Fault{Kind: FaultTryAgain200})
	r = h.poll(id, "application/x-protobuf")
	mustStatus(t, r, 200)
	if m := r.json(t); m["type"] != "try_again" || m["queue_state"] != "active" {
		t.Fatalf("200 try_again %s", r.body)
	}
	h.srv.ClearFaults()
	h.protoResult(id)
}

func TestFaultExpired410(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{BaseLatency: time.Hour})
	ssid := h.sampler("Qwen/Qwen3-8B")
	body := sampleBody(ssid, 5, []int32{1}, nil)
	id := h.asample(body)
	f := mustInject(t, h.srv, Fault{Kind: FaultExpired})
	mustJSONError(t, h.poll(id, "application/x-protobuf"), http.StatusGone)
	h.srv.RemoveFault(f)
	mustJSONError(t, h.poll(id, "application/x-protobuf"), http.StatusGone) // stays gone
	// The expired future is forgotten: the same seq_id is new work.
	if again := h.asample(body); again != id {
		t.Fatalf("id %q", again)
	}
	if st := h.srv.Stats(); st.SamplesAccepted != 2 || st.IdempotentReplays != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFaultPaymentRequired(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	mustInject(t, h.srv, Fault{Kind: FaultPaymentRequired, Duration: time.Hour})
	for i := range 2 {
		mustJSONError(t, h.do("POST", "/api/v1/asample", sampleBody(ssid, int64(i), []int32{1}, nil)), http.StatusPaymentRequired)
	}
	st := h.srv.Stats()
	if len(st.Windows) != 1 || st.Windows[0].Kind != FaultPaymentRequired || st.Windows[0].AsampleCalls != 2 {
		t.Fatalf("windows %+v", st.Windows)
	}
}

// A 401 fault refuses the credential on every API endpoint, as a revoked key, while admin
// endpoints still answer; its window counts the asample calls that came anyway, and the key
// works again once the fault is removed.
func TestFaultUnauthorized(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	sid := h.do("POST", "/api/v1/create_session", `{"sdk_version":"0.25.0","type":"create_session"}`).json(t)["session_id"].(string)
	id := mustInject(t, h.srv, Fault{Kind: FaultUnauthorized})
	for i := range 2 {
		d := mustJSONError(t, h.do("POST", "/api/v1/asample", sampleBody(ssid, int64(i), []int32{1}, nil)), http.StatusUnauthorized)
		if d["detail"] != "invalid or missing X-API-Key" {
			t.Fatalf("401 detail %v", d)
		}
	}
	mustJSONError(t, h.do("POST", "/api/v1/session_heartbeat", map[string]any{"session_id": sid, "type": "session_heartbeat"}), http.StatusUnauthorized)
	mustJSONError(t, h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`), http.StatusUnauthorized)
	mustStatus(t, h.do("GET", "/admin/stats", nil), 200)
	st := h.srv.Stats()
	if len(st.Windows) != 1 || st.Windows[0].Kind != FaultUnauthorized || st.Windows[0].AsampleCalls != 2 {
		t.Fatalf("windows %+v", st.Windows)
	}
	if !h.srv.RemoveFault(id) {
		t.Fatal("remove the fault")
	}
	h.asample(sampleBody(ssid, 2, []int32{1}, nil))
	mustStatus(t, h.do("POST", "/api/v1/session_heartbeat", map[string]any{"session_id": sid, "type": "session_heartbeat"}), 200)

	f, err := ParseFault("kind=401,endpoints=asample,reason=key revoked", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	mustInject(t, h.srv, f)
	if d := mustJSONError(t, h.do("POST", "/api/v1/asample", sampleBody(ssid, 3, []int32{1}, nil)), http.StatusUnauthorized); d["detail"] != "key revoked" {
		t.Fatalf("401 detail %v", d)
	}
	mustStatus(t, h.do("POST", "/api/v1/session_heartbeat", map[string]any{"session_id": sid, "type": "session_heartbeat"}), 200)
}

// A 403 fault refuses one request (by default an asample) with a JSON detail; the key goes on
// working elsewhere.
func TestFaultForbidden(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	mustInject(t, h.srv, Fault{Kind: FaultForbidden, Count: 1})
	if d := mustJSONError(t, h.do("POST", "/api/v1/asample", sampleBody(ssid, 0, []int32{1}, nil)), http.StatusForbidden); d["detail"] != "permission denied" {
		t.Fatalf("403 detail %v", d)
	}
	h.asample(sampleBody(ssid, 1, []int32{1}, nil))
}

func TestFaultPausedHoldsFutures(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{LongPollWait: 50 * time.Millisecond})
	ssid := h.sampler("Qwen/Qwen3-8B")
	fid := mustInject(t, h.srv, Fault{Kind: FaultPausedCapacity, Reason: "Tinker backend is running short on capacity, please wait"})
	id := h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	h.asample(sampleBody(ssid, 1, []int32{2}, nil))
	for range 3 {
		r := h.poll(id, "application/x-protobuf")
		body := mustJSONError(t, r, http.StatusRequestTimeout)
		if body["queue_state"] != "paused_capacity" || body["queue_state_reason"] != "Tinker backend is running short on capacity, please wait" {
			t.Fatalf("paused poll %s", r.body)
		}
	}
	if st := h.srv.Stats(); st.SamplesCompleted != 0 || st.Windows[0].AsampleCalls != 2 {
		t.Fatalf("completed during the pause: %+v", st)
	}
	h.srv.RemoveFault(fid)
	h.protoResult(id)
	eventually(t, "both samples to complete", func() bool { return h.srv.Stats().SamplesCompleted == 2 })

	// A timed window releases its futures by itself when it ends.
	mustInject(t, h.srv, Fault{Kind: FaultPausedRateLimit, Duration: 150 * time.Millisecond})
	id2 := h.asample(sampleBody(ssid, 2, []int32{3}, nil))
	r := h.poll(id2, "application/x-protobuf")
	if r.status == 408 {
		if m := r.json(t); m["queue_state"] != "paused_rate_limit" {
			t.Fatalf("poll in window %s", r.body)
		}
	}
	h.protoResult(id2)
}

func TestFaultNeverCompleteAndFailed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{LongPollWait: 30 * time.Millisecond, Capacity: 1})
	ssid := h.sampler("Qwen/Qwen3-8B")
	nc := mustInject(t, h.srv, Fault{Kind: FaultNeverComplete})
	hung := h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	h.srv.RemoveFault(nc)
	for range 3 {
		mustJSONError(t, h.poll(hung, "application/x-protobuf"), http.StatusRequestTimeout)
	}
	if st := h.srv.Stats(); st.Concurrent != 0 {
		t.Fatalf("a hung future pins capacity: %+v", st)
	}
	for i, cat := range []string{"user", "server", "unknown"} {
		f := mustInject(t, h.srv, Fault{Kind: FaultFailed, Category: cat})
		id := h.asample(sampleBody(ssid, int64(i+1), []int32{1}, nil))
		r := h.result(id, "application/x-protobuf")
		if m := r.json(t); m["category"] != cat || m["error"] == "" {
			t.Fatalf("failed future %s", r.body)
		}
		h.srv.RemoveFault(f)
	}
	if st := h.srv.Stats(); st.SamplesFailed != 3 || st.SamplesCompleted != 0 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := h.srv.Inject(Fault{Kind: FaultFailed, Category: "USER"}); err == nil {
		t.Fatal("accepted an upper-case category")
	}
}

func TestFaultSlowHeartbeat(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	sid := h.do("POST", "/api/v1/create_session", `{"sdk_version":"0.25.0","type":"create_session"}`).json(t)["session_id"].(string)
	mustInject(t, h.srv, Fault{Kind: FaultSlowHeartbeat, Delay: 120 * time.Millisecond})
	start := time.Now()
	mustStatus(t, h.do("POST", "/api/v1/session_heartbeat", map[string]any{"session_id": sid, "type": "session_heartbeat"}), 200)
	if el := time.Since(start); el < 120*time.Millisecond {
		t.Fatalf("heartbeat answered after %v", el)
	}
}

func TestFaultSlowAcceptHoldsTheSlotBeforeTheReply(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{Capacity: 2, BaseLatency: time.Hour})
	ssid := h.sampler("Qwen/Qwen3-8B")
	// The acceptance comes after the delay.
	mustInject(t, h.srv, Fault{Kind: FaultSlowAccept, Delay: 300 * time.Millisecond, Count: 1})
	start := time.Now()
	h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("acceptance answered after %v, want the 300ms delay", el)
	}
	// The slot is taken while the acceptance is still on its way: a second sample is turned
	// away at once, and its 429 arrives before the first sample's acceptance. That acceptance
	// is held for an hour, longer than any 429 can take under load, and let go by cancelling
	// its request.
	mustInject(t, h.srv, Fault{Kind: FaultSlowAccept, Delay: time.Hour, Count: 1})
	data, err := json.Marshal(sampleBody(ssid, 1, []int32{1}, nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", h.base+"/api/v1/asample", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tinker-Sampling-Backpressure", "1")
	accepted := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		accepted <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for h.srv.Stats().Concurrent != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the sample never took its slot")
		}
		time.Sleep(time.Millisecond)
	}
	r := h.do("POST", "/api/v1/asample", sampleBody(ssid, 2, []int32{1}, nil), "X-Tinker-Sampling-Backpressure", "1")
	mustJSONError(t, r, http.StatusTooManyRequests)
	select {
	case err := <-accepted:
		t.Fatalf("the acceptance arrived before the 429: %v", err)
	default:
	}
	cancel()
	<-accepted
	if _, err := h.srv.Inject(Fault{Kind: FaultSlowAccept}); err == nil {
		t.Fatal("slow_accept without a delay was accepted")
	}
}

func TestFaultGenericEndpoints(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	mustInject(t, h.srv, Fault{Kind: FaultRateLimit, Endpoints: []string{"create_session"}})
	mustJSONError(t, h.do("POST", "/api/v1/create_session", `{"sdk_version":"0.25.0","type":"create_session"}`), 429)
	mustInject(t, h.srv, Fault{Kind: FaultServerError, Endpoints: []string{"*"}, Start: time.Now().Add(time.Hour)})
	mustStatus(t, h.do("GET", "/api/v1/healthz", nil), 200) // window not open yet
	if _, err := h.srv.Inject(Fault{Kind: FaultExpired, Endpoints: []string{"asample"}}); err == nil {
		t.Fatal("410 fault moved to asample")
	}
	if err := h.srv.SetFaults([]Fault{{Kind: FaultTimeout, Endpoints: []string{"healthz"}}}); err != nil {
		t.Fatal(err)
	}
	if got := h.srv.Faults(); len(got) != 1 || got[0].Kind != FaultTimeout {
		t.Fatalf("faults %+v", got)
	}
	mustJSONError(t, h.do("GET", "/api/v1/healthz", nil), 408)
	if st := h.srv.Stats(); len(st.Windows) != 1 || st.Windows[0].End.IsZero() {
		t.Fatalf("SetFaults did not close the 429 window: %+v", st.Windows)
	}
}

func TestParseFault(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f, err := ParseFault("kind=paused_capacity,start=10s,duration=20s,reason=short, please wait", now)
	if err != nil {
		t.Fatal(err)
	}
	if f.Kind != FaultPausedCapacity || !f.Start.Equal(now.Add(10*time.Second)) || f.Duration != 20*time.Second || f.Reason != "short, please wait" {
		t.Fatalf("%+v", f)
	}
	f, err = ParseFault("kind=5xx,rate=0.25,status=502,endpoints=asample+retrieve_future", now)
	if err != nil || f.Rate != 0.25 || f.Status != 502 || len(f.Endpoints) != 2 {
		t.Fatalf("%+v %v", f, err)
	}
	if f, err = ParseFault("kind=429,count=1", now); err != nil || f.Count != 1 {
		t.Fatalf("%+v %v", f, err)
	}
	for _, bad := range []string{"kind=nope", "kind=429,rate=x", "kind=429,colour=red", "kind=slow_heartbeat", "429",
		"kind=429,count=-1", "kind=paused_capacity,count=1", "kind=429,rate=NaN", "kind=429,rate=-0.5"} {
		if _, err := ParseFault(bad, now); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{AdminToken: "admin-secret"})
	ssid := h.sampler("Qwen/Qwen3-8B")
	mustJSONError(t, h.do("GET", "/admin/stats", nil), 401) // the API key is not enough
	adm := []string{"X-Admin-Token", "admin-secret"}
	r := h.do("POST", "/admin/faults", `[{"kind":"429","duration":"1h","count":5},{"kind":"failed","category":"user","rate":1}]`, adm...)
	mustStatus(t, r, 200)
	var ids struct{ IDs []FaultID }
	if err := json.Unmarshal(r.body, &ids); err != nil || len(ids.IDs) != 2 {
		t.Fatalf("inject reply %s", r.body)
	}
	mustJSONError(t, h.do("POST", "/admin/faults", `{"kind":"429","colour":"red"}`, adm...), 422)
	mustJSONError(t, h.do("POST", "/admin/faults", `{"kind":"nope"}`, adm...), 422)
	mustJSONError(t, h.do("POST", "/admin/faults", `{"kind":"429","duration":"soon"}`, adm...), 422)
	mustJSONError(t, h.do("POST", "/api/v1/asample", sampleBody(ssid, 0, []int32{1}, nil)), 429)
	r = h.do("GET", "/admin/faults", nil, adm...)
	if !strings.Contains(string(r.body), `"kind":"429"`) || !strings.Contains(string(r.body), `"count":5,"hits":1`) {
		t.Fatalf("faults %s", r.body)
	}
	mustStatus(t, h.do("DELETE", "/admin/faults/"+jsonNum(ids.IDs[0]), nil, adm...), 200)
	mustJSONError(t, h.do("DELETE", "/admin/faults/"+jsonNum(ids.IDs[0]), nil, adm...), 404)
	r = h.do("GET", "/admin/stats", nil, adm...)
	mustStatus(t, r, 200)
	var st Stats
	if err := json.Unmarshal(r.body, &st); err != nil {
		t.Fatal(err)
	}
	if st.Requests["asample"][429] != 1 || len(st.Windows) != 1 || st.Windows[0].AsampleCalls != 1 {
		t.Fatalf("admin stats %s", r.body)
	}
	mustStatus(t, h.do("DELETE", "/admin/faults", nil, adm...), 200)
	mustStatus(t, h.do("POST", "/admin/reset", nil, adm...), 200)
	if st := h.srv.Stats(); len(st.Windows) != 0 || len(st.Requests) > 1 || len(h.srv.Faults()) != 0 {
		t.Fatalf("after reset %+v", st)
	}
	// Without an admin token, the API key authenticates admin requests.
	plain := newHarness(t, Config{})
	mustStatus(t, plain.do("GET", "/admin/stats", nil), 200)
	mustJSONError(t, plain.do("GET", "/admin/stats", nil, "X-API-Key", "tml-nope"), 401)
}

// TestForgetSessionsIsARestart: after POST /admin/forget_sessions, the sessions, sampling
// sessions and futures from before answer as a restarted service's would (404, 404, 410),
// while new ones work.
func TestForgetSessionsIsARestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	sid := strings.Split(ssid, ":")[0]
	id := h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	h.protoResult(id)
	mustStatus(t, h.do("POST", "/admin/forget_sessions", nil), 200)

	mustJSONError(t, h.do("POST", "/api/v1/session_heartbeat", map[string]any{"session_id": sid, "type": "session_heartbeat"}), 404)
	mustJSONError(t, h.do("POST", "/api/v1/create_sampling_session", map[string]any{"session_id": sid, "sampling_session_seq_id": 1,
		"base_model": "Qwen/Qwen3-8B", "type": "create_sampling_session"}), 404)
	mustJSONError(t, h.do("POST", "/api/v1/asample", sampleBody(ssid, 1, []int32{1}, nil)), 404)
	mustJSONError(t, h.poll(id, "application/x-protobuf"), 410)
	h.protoResult(h.asample(sampleBody(h.sampler("Qwen/Qwen3-8B"), 0, []int32{1}, nil)))
}

// TestAPIKeysRotate: after PUT /admin/api_keys, the old key is refused with 401 and the new
// one accepted, on the API and on the admin endpoints (which take the API keys when no admin
// token is set); a key without the tml- prefix is refused with 422 and changes nothing.
func TestAPIKeysRotate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	const rotated = "tml-rotated"
	mustJSONError(t, h.do("PUT", "/admin/api_keys", map[string]any{"api_keys": []string{"bogus"}}), 422)
	mustStatus(t, h.do("GET", "/api/v1/healthz", nil), 200)
	mustStatus(t, h.do("PUT", "/admin/api_keys", map[string]any{"api_keys": []string{rotated}}), 200)
	mustJSONError(t, h.do("GET", "/api/v1/healthz", nil), 401)
	mustStatus(t, h.do("GET", "/api/v1/healthz", nil, "X-API-Key", rotated), 200)
	mustStatus(t, h.do("GET", "/admin/stats", nil, "X-API-Key", rotated), 200)
}

func jsonNum(id FaultID) string { b, _ := json.Marshal(id); return string(b) }

// TestAFaultNamingNoEndpointIsRefused: a typo in a fault's endpoints matched nothing, so an
// operator believed a fault injected that never fired.
func TestAFaultNamingNoEndpointIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	if _, err := h.srv.Inject(Fault{Kind: FaultServerError, Endpoints: []string{"retrieve-future"}}); err == nil {
		t.Error(`Inject accepted the endpoint "retrieve-future"`)
	}
	if _, err := ParseFault("kind=429,endpoints=asmple", time.Now()); err == nil {
		t.Error(`ParseFault accepted the endpoint "asmple"`)
	}
	mustStatus(t, h.do("POST", "/admin/faults", `{"kind":"5xx","endpoints":["/api/v1/asample"]}`), http.StatusUnprocessableEntity)
	for _, eps := range [][]string{{"*"}, {"retrieve_future", "samplers"}, {"client/config"}} {
		if _, err := h.srv.Inject(Fault{Kind: FaultServerError, Endpoints: eps, Count: 1}); err != nil {
			t.Errorf("endpoints %v: %v", eps, err)
		}
	}
}

// TestA408DuringAPauseSaysThePause: every try_again of a poll during a paused_capacity window
// carries the pause's queue state and reason (§4.3), the injected 408's too.
func TestA408DuringAPauseSaysThePause(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{LongPollWait: 30 * time.Millisecond})
	ssid := h.sampler("Qwen/Qwen3-8B")
	mustInject(t, h.srv, Fault{Kind: FaultPausedCapacity, Reason: "short on capacity"})
	id := h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	mustInject(t, h.srv, Fault{Kind: FaultTimeout})
	body := mustJSONError(t, h.poll(id, "application/x-protobuf"), http.StatusRequestTimeout)
	if body["type"] != "try_again" || body["queue_state"] != "paused_capacity" || body["queue_state_reason"] != "short on capacity" {
		t.Fatalf("408 during a paused_capacity window: %v", body)
	}
}

// TestAFailedFaultFailsAsManySamplesAsItsCount: a sample that fails anyway (its context) does
// not take one of a failed fault's hits.
func TestAFailedFaultFailsAsManySamplesAsItsCount(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{LongPollWait: 30 * time.Millisecond, Models: []Model{{Name: "m", MaxContextLength: 20}}})
	ssid := h.sampler("m")
	mustInject(t, h.srv, Fault{Kind: FaultFailed, Category: "server", Count: 1})
	over := h.asample(sampleBody(ssid, 0, []int32{1}, map[string]any{"max_tokens": 100}))
	if m := h.result(over, "application/x-protobuf").json(t); m["category"] != "user" {
		t.Fatalf("a prompt over the context: %v", m)
	}
	id := h.asample(sampleBody(ssid, 1, []int32{1}, map[string]any{"max_tokens": 4}))
	if m := h.result(id, "application/json").json(t); m["category"] != "server" {
		t.Fatalf("the sample after: %v, want the fault's failure", m)
	}
}

// TestFaultShouldRetryHeader: a fault with ShouldRetry adds x-should-retry (§6.1) to the
// status it answers with, from Inject, the -fault form and the admin endpoint; kinds that
// answer no status of their own refuse it.
func TestFaultShouldRetryHeader(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	mustInject(t, h.srv, Fault{Kind: FaultForbidden, Endpoints: []string{"create_sampling_session"}, Count: 1, ShouldRetry: "true"})
	sid, _, _ := strings.Cut(ssid, ":") // <session_id>:sample:<n> (§3.5)
	r := h.do("POST", "/api/v1/create_sampling_session", map[string]any{"session_id": sid, "sampling_session_seq_id": 1,
		"base_model": "Qwen/Qwen3-8B", "type": "create_sampling_session"})
	mustJSONError(t, r, 403)
	if got := r.header.Get("X-Should-Retry"); got != "true" {
		t.Fatalf("403: x-should-retry %q", got)
	}
	mustInject(t, h.srv, Fault{Kind: FaultServerError, Status: 503, Endpoints: []string{"asample"}, Count: 1, ShouldRetry: "false"})
	r = h.do("POST", "/api/v1/asample", sampleBody(ssid, 0, []int32{1}, nil))
	mustJSONError(t, r, 503)
	if got := r.header.Get("X-Should-Retry"); got != "false" {
		t.Fatalf("503: x-should-retry %q", got)
	}
	// Without the option, and once the faults are spent, no header.
	r = h.do("POST", "/api/v1/asample", sampleBody(ssid, 1, []int32{1}, nil))
	mustStatus(t, r, 200)
	if _, ok := r.header["X-Should-Retry"]; ok {
		t.Fatalf("200 carries x-should-retry: %v", r.header)
	}

	now := time.Now()
	if f, err := ParseFault("kind=429,count=1,should_retry=false", now); err != nil || f.ShouldRetry != "false" {
		t.Fatalf("%+v %v", f, err)
	}
	for _, bad := range []string{"kind=429,should_retry=yes", "kind=failed,should_retry=true", "kind=drop,should_retry=false"} {
		if _, err := ParseFault(bad, now); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	mustStatus(t, h.do("POST", "/admin/faults", `{"kind":"408","endpoints":["create_session"],"should_retry":true}`), 200)
	r = h.do("GET", "/admin/faults", nil)
	if !strings.Contains(string(r.body), `"should_retry":"true"`) {
		t.Fatalf("faults %s", r.body)
	}
	mustJSONError(t, h.do("POST", "/admin/faults", `{"kind":"408","should_retry":"maybe"}`), 422)
}

// TestSessionTimeoutExpiresSessionsWithoutHeartbeats: with Config.SessionTimeout, a session
// that heartbeats stays, and one that does not is forgotten with its sampling sessions (§3.4):
// its heartbeat, new sampling sessions, asample and sampler lookups answer 404, while a future
// it had already been given can still be read.
func TestSessionTimeoutExpiresSessionsWithoutHeartbeats(t *testing.T) {
	t.Parallel()
	const timeout = time.Second
	h := newHarness(t, Config{SessionTimeout: timeout})
	quiet, alive := h.sampler("Qwen/Qwen3-8B"), h.sampler("Qwen/Qwen3-8B")
	quietID, aliveID := strings.Split(quiet, ":")[0], strings.Split(alive, ":")[0]
	id := h.asample(sampleBody(quiet, 0, []int32{1}, nil))
	heartbeat := func(sid string) reply {
		return h.do("POST", "/api/v1/session_heartbeat", map[string]any{"session_id": sid, "type": "session_heartbeat"})
	}
	for end := time.Now().Add(5 * timeout / 2); time.Now().Before(end); time.Sleep(timeout / 10) {
		mustStatus(t, heartbeat(aliveID), 200)
	}

	mustJSONError(t, heartbeat(quietID), 404)
	mustJSONError(t, h.do("POST", "/api/v1/create_sampling_session", map[string]any{"session_id": quietID, "sampling_session_seq_id": 1,
		"base_model": "Qwen/Qwen3-8B", "type": "create_sampling_session"}), 404)
	mustJSONError(t, h.do("POST", "/api/v1/asample", sampleBody(quiet, 1, []int32{1}, nil)), 404)
	mustJSONError(t, h.do("GET", "/api/v1/samplers/"+quiet, nil), 404)
	mustJSONError(t, h.do("GET", "/api/v1/sessions/"+quietID, nil), 404)
	h.protoResult(id)

	mustStatus(t, h.do("GET", "/api/v1/samplers/"+alive, nil), 200)
	h.protoResult(h.asample(sampleBody(alive, 0, []int32{1}, nil)))
	r := h.do("GET", "/api/v1/sessions", nil)
	mustStatus(t, r, 200)
	if strings.Contains(string(r.body), quietID) || !strings.Contains(string(r.body), aliveID) {
		t.Errorf("sessions listing %s", r.body)
	}
	if n := h.srv.Stats().SessionsExpired; n != 1 {
		t.Errorf("%d sessions expired, want 1", n)
	}
	if _, err := New(Config{SessionTimeout: -time.Second}); err == nil {
		t.Error("a negative session timeout was accepted")
	}
}

// TestANegativeStartIsRefused: a fault's start is a delay from its injection. A negative one
// was taken two ways, both silently: the command line's start=-5s opened the window 5 s in
// the past (so it closed 5 s early, or before it was injected), the admin endpoint's
// start_in "-5s" opened it now. Both now refuse it, as they refuse a negative duration.
func TestANegativeStartIsRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	if f, err := ParseFault("kind=429,start=-5s,duration=1m", time.Now()); err == nil {
		t.Errorf("ParseFault accepted start=-5s: %+v", f)
	}
	mustJSONError(t, h.do("POST", "/admin/faults", `{"kind":"429","start_in":"-5s","duration":"1m"}`), http.StatusUnprocessableEntity)
	if n := len(h.srv.Faults()); n != 0 {
		t.Errorf("%d faults injected", n)
	}
	// Zero stays "at injection".
	if _, err := ParseFault("kind=429,start=0s", time.Now()); err != nil {
		t.Error(err)
	}
	mustStatus(t, h.do("POST", "/admin/faults", `{"kind":"429","start_in":"0s","count":1}`), http.StatusOK)
}
