package tinkersim

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestGoldenProtoVector(t *testing.T) {
	t.Parallel()
	// §T4 golden example, 92 bytes.
	const golden = "0a160801120864000000c80000001a08000000bf0000a0bf0a0c1204070000001a04000000be" +
		"12080000c07f000060c01a280a1000000000000000000b0000000c0000001210804fc3c7804f" +
		"c3c7000000bf000000c0180220022003"
	nan := math.Float32frombits(0x7fc00000)
	resp := &SampleResponse{
		Sequences: []Sequence{
			{StopReason: StopReasonLength, Tokens: []int32{100, 200}, Logprobs: []float32{-0.5, -1.25}},
			{StopReason: StopReasonStop, Tokens: []int32{7}, Logprobs: []float32{-0.125}},
		},
		PromptLogprobs: []float32{nan, -3.5},
		TopK: &TopKPromptLogprobs{K: 2, PromptLength: 2, TokenIDs: []int32{0, 0, 11, 12},
			Logprobs: []float32{topkEmptyLogprob, topkEmptyLogprob, -0.5, -2.0}},
		PromptCacheHitTokens: 3,
	}
	got := hex.EncodeToString(resp.AppendProto(nil))
	if got != golden {
		t.Fatalf("proto mismatch\n got %s\nwant %s", got, golden)
	}
	if len(got) != 2*92 {
		t.Fatalf("%d bytes, want 92", len(got)/2)
	}
	// The JSON view of the same response is the §T3 shape with the §T4 list-view rules.
	wantJSON := `{"type":"sample","sequences":[{"stop_reason":"length","tokens":[100,200],"logprobs":[-0.5,-1.25]},` +
		`{"stop_reason":"stop","tokens":[7],"logprobs":[-0.125]}],"prompt_logprobs":[null,-3.5],` +
		`"topk_prompt_logprobs":[null,[[11,-0.5],[12,-2]]],"prompt_cache_hit_tokens":3}`
	if j := string(resp.AppendJSON(nil)); j != wantJSON {
		t.Fatalf("json mismatch\n got %s\nwant %s", j, wantJSON)
	}
	raw, _ := hex.DecodeString(golden)
	dec, err := decodeSampleResponse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Sequences[0].StopReason != StopReasonLength || !slices.Equal(dec.Sequences[1].Tokens, []int32{7}) || dec.PromptCacheHitTokens != 3 {
		t.Fatalf("decoded golden: %+v", dec)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	for _, key := range []string{"", "tml-wrong", "sk-" + testKey, "tml-"} {
		r := h.do("GET", "/api/v1/healthz", nil, "X-API-Key", key)
		body := mustJSONError(t, r, http.StatusUnauthorized)
		if strings.Contains(string(r.body), testKey) || body["detail"] == nil {
			t.Fatalf("401 body %q", r.body)
		}
	}
	r := h.do("GET", "/api/v1/healthz", nil)
	mustStatus(t, r, 200)
	if r.json(t)["status"] != "ok" {
		t.Fatalf("healthz %q", r.body)
	}
	if _, err := New(Config{APIKeys: []string{"sk-123"}}); err == nil {
		t.Fatal("New accepted a key without the tml- prefix")
	}
	// Without configured keys any tml- key is accepted, others are not.
	open := newHarness(t, Config{APIKeys: []string{}})
	mustStatus(t, open.do("GET", "/api/v1/healthz", nil, "X-API-Key", "tml-anything"), 200)
	mustJSONError(t, open.do("GET", "/api/v1/healthz", nil, "X-API-Key", "eyJjwt"), 401)
}

func TestValidation(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	good := func() map[string]any { return sampleBody(ssid, 1, []int32{1, 2, 3}, nil) }
	cases := []struct {
		name   string
		path   string
		body   any
		status int
		detail string
	}{
		{"unknown field", "/api/v1/create_session", `{"tags":[],"user_metadata":{},"sdk_version":"0.25.0","type":"create_session","colour":1}`, 422, "unknown field"},
		{"wrong literal", "/api/v1/create_session", `{"sdk_version":"0.25.0","type":"create_sessions"}`, 422, "must be"},
		{"missing literal", "/api/v1/session_heartbeat", `{"session_id":"x"}`, 422, "required"},
		{"malformed", "/api/v1/client/config", `{"sdk_version":`, 400, "malformed"},
		{"trailing", "/api/v1/client/config", `{"sdk_version":"1"} {}`, 400, "trailing"},
		{"not an object", "/api/v1/client/config", `"x"`, 400, "JSON object"},
		{"mistyped config", "/api/v1/client/config", `{"sdk_version":1}`, 422, "sdk_version"},
		{"mistyped seq_id", "/api/v1/asample", func() any { b := good(); b["seq_id"] = "7"; return b }(), 422, "seq_id"},
		{"fractional seq_id", "/api/v1/asample", func() any { b := good(); b["seq_id"] = 1.5; return b }(), 422, "seq_id"},
		{"unknown sample field", "/api/v1/asample", func() any { b := good(); b["n"] = 2; return b }(), 422, "unknown field"},
		{"unknown param", "/api/v1/asample", func() any { b := good(); b["sampling_params"].(map[string]any)["min_p"] = 0.1; return b }(), 422, "min_p"},
		{"unknown chunk field", "/api/v1/asample", func() any {
			b := good()
			b["prompt"] = map[string]any{"chunks": []any{map[string]any{"tokens": []int{1}, "type": "encoded_text", "text": "hi"}}}
			return b
		}(), 422, "unknown field"},
		{"chunk field of other type", "/api/v1/asample", func() any {
			b := good()
			b["prompt"] = map[string]any{"chunks": []any{map[string]any{"tokens": []int{1}, "type": "encoded_text", "format": "png"}}}
			return b
		}(), 422, "not allowed"},
		{"wrong sample type", "/api/v1/asample", func() any { b := good(); b["type"] = "samples"; return b }(), 422, "type"},
		{"missing prompt", "/api/v1/asample", func() any { b := good(); delete(b, "prompt"); return b }(), 422, "prompt"},
		{"missing seq_id", "/api/v1/asample", func() any { b := good(); delete(b, "seq_id"); return b }(), 422, "seq_id"},
		{"null seq_id", "/api/v1/asample", func() any { b := good(); b["seq_id"] = nil; return b }(), 422, "seq_id"},
		{"mixed stop", "/api/v1/asample", func() any { b := good(); b["sampling_params"].(map[string]any)["stop"] = []any{"x", 3}; return b }(), 422, "mixed"},
		{"stop object", "/api/v1/asample", func() any { b := good(); b["sampling_params"].(map[string]any)["stop"] = map[string]any{}; return b }(), 422, "stop"},
		{"num_samples 0", "/api/v1/asample", func() any { b := good(); b["num_samples"] = 0; return b }(), 422, "num_samples"},
		{"max_tokens 0", "/api/v1/asample", func() any { b := good(); b["sampling_params"].(map[string]any)["max_tokens"] = 0; return b }(), 422, "max_tokens"},
		{"empty prompt", "/api/v1/asample", func() any { b := good(); b["prompt"] = map[string]any{"chunks": []any{}}; return b }(), 422, "no tokens"},
		{"unknown sampler", "/api/v1/asample", sampleBody("nope:sample:0", 1, []int32{1}, nil), 404, "not found"},
		{"poll without id", "/api/v1/retrieve_future", `{"allow_metadata_only":true}`, 422, "request_id"},
		{"bad model", "/api/v1/create_sampling_session", `{"session_id":"x","sampling_session_seq_id":0,"base_model":"gpt-9","type":"create_sampling_session"}`, 400, "unsupported"},
		{"bad paging", "/api/v1/training_runs?limit=abc", nil, 422, "limit"},
		{"unknown query", "/api/v1/checkpoints?colour=red", nil, 422, "colour"},
	}
	for _, c := range cases {
		method := "POST"
		if c.body == nil {
			method = "GET"
		}
		r := h.do(method, c.path, c.body)
		body := mustJSONError(t, r, c.status)
		if d, _ := body["detail"].(string); !strings.Contains(d, c.detail) {
			t.Errorf("%s: detail %q does not mention %q", c.name, d, c.detail)
		}
	}
	mustJSONError(t, h.do("GET", "/api/v1/asample", nil), http.StatusMethodNotAllowed)
	mustJSONError(t, h.do("POST", "/api/v1/no_such_thing", `{}`), http.StatusNotFound)
	if st := h.srv.Stats(); st.SamplesAccepted != 0 {
		t.Fatalf("invalid requests created %d samples", st.SamplesAccepted)
	}
}

func TestSamplingRoundTrip(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{BaseLatency: 5 * time.Millisecond, PerTokenLatency: time.Millisecond})
	r := h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`)
	mustStatus(t, r, 200)
	if cfg := r.json(t); cfg["sample_max_concurrent_requests"] != float64(2000) || cfg["pjwt_auth_enabled"] != false {
		t.Fatalf("client/config %s", r.body)
	}
	r = h.do("POST", "/api/v1/client/dynamic_config", `{"sdk_version":"0.25.0"}`)
	mustStatus(t, r, 200)
	if r.json(t)["refresh_interval_sec"] != float64(300) {
		t.Fatalf("dynamic_config %s", r.body)
	}
	r = h.do("POST", "/api/v1/create_session", `{"tags":["a"],"user_metadata":{"k":"v"},"sdk_version":"0.25.0","project_id":"p","type":"create_session"}`)
	mustStatus(t, r, 200)
	sess := r.json(t)
	sid := sess["session_id"].(string)
	if sess["type"] != "create_session" || len(sid) != 36 {
		t.Fatalf("create_session %s", r.body)
	}
	r = h.do("POST", "/api/v1/create_sampling_session", map[string]any{"session_id": sid, "sampling_session_seq_id": 0,
		"base_model": "meta-llama/Llama-3.1-8B-Instruct", "type": "create_sampling_session"})
	mustStatus(t, r, 200)
	ssid := r.json(t)["sampling_session_id"].(string)
	if ssid != sid+":sample:0" {
		t.Fatalf("sampling session id %q", ssid)
	}
	r = h.do("GET", "/api/v1/samplers/"+ssid, nil)
	mustStatus(t, r, 200)
	if s := r.json(t); s["sampler_id"] != ssid || s["base_model"] != "meta-llama/Llama-3.1-8B-Instruct" || s["model_path"] != nil {
		t.Fatalf("samplers: %s", r.body)
	}
	mustStatus(t, h.do("POST", "/api/v1/session_heartbeat", map[string]any{"session_id": sid, "type": "session_heartbeat"}), 200)
	mustJSONError(t, h.do("POST", "/api/v1/session_heartbeat", map[string]any{"session_id": "nope", "type": "session_heartbeat"}), 404)
	r = h.do("GET", "/api/v1/get_server_capabilities", nil)
	mustStatus(t, r, 200)
	if !strings.Contains(string(r.body), `{"model_name":"Qwen/Qwen3-8B","max_context_length":32768}`) {
		t.Fatalf("capabilities %s", r.body)
	}
	mustStatus(t, h.do("POST", "/api/v1/telemetry", `{"events":[{"x":1}],"platform":"linux","sdk_version":"0.25.0","session_id":"s","process_uuid":"u"}`), 200)

	body := sampleBody(ssid, 17, []int32{151644, 872, 198, 3838, 374}, map[string]any{"seed": 1234, "stop": []string{"<|im_end|>"}, "max_tokens": 32})
	body["num_samples"] = 3
	id := h.asample(body)
	if id != ssid+":17" {
		t.Fatalf("request id %q", id)
	}
	pr := h.protoResult(id)
	if len(pr.Sequences) != 3 || pr.PromptLogprobs != nil || pr.TopK != nil {
		t.Fatalf("proto result %+v", pr)
	}
	for _, s := range pr.Sequences {
		if len(s.Tokens) == 0 || len(s.Tokens) > 32 || len(s.Logprobs) != len(s.Tokens) {
			t.Fatalf("sequence %+v", s)
		}
	}
	// The same future read again as JSON (§T3) carries the same tokens.
	jr := h.result(id, "application/json")
	var js struct {
		Type      string `json:"type"`
		Sequences []struct {
			StopReason string    `json:"stop_reason"`
			Tokens     []int32   `json:"tokens"`
			Logprobs   []float32 `json:"logprobs"`
		} `json:"sequences"`
		PromptLogprobs any `json:"prompt_logprobs"`
	}
	if err := json.Unmarshal(jr.body, &js); err != nil || js.Type != "sample" || len(js.Sequences) != 3 {
		t.Fatalf("json result %s: %v", jr.body, err)
	}
	for i, s := range js.Sequences {
		if !slices.Equal(s.Tokens, pr.Sequences[i].Tokens) || !slices.Equal(s.Logprobs, pr.Sequences[i].Logprobs) ||
			s.StopReason != pr.Sequences[i].StopReason.String() {
			t.Fatalf("seq %d: json %+v vs proto %+v", i, s, pr.Sequences[i])
		}
	}
	st := h.srv.Stats()
	if st.SamplesAccepted != 1 || st.SamplesCompleted != 1 || st.Requests["asample"][200] != 1 || st.Requests["retrieve_future"][200] < 2 ||
		st.Requests["session_heartbeat"][404] != 1 || st.PeakConcurrent != 1 || st.Concurrent != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestMountPrefix(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{APIKeys: []string{testKey}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	mux := http.NewServeMux()
	mux.Handle("/services/tinker-prod/", http.StripPrefix("/services/tinker-prod", srv))
	ts := httptest.NewServer(mux)
	defer ts.Close()
	direct := httptest.NewServer(srv)
	defer direct.Close()
	for _, url := range []string{ts.URL + "/services/tinker-prod/api/v1/healthz", direct.URL + "/services/tinker-prod/api/v1/healthz", direct.URL + "/api/v1/healthz"} {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("X-API-Key", testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", url, resp.StatusCode)
		}
	}
}

func TestIdempotentAsample(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{BaseLatency: time.Hour})
	ssid := h.sampler("Qwen/Qwen3-8B")
	body := sampleBody(ssid, 1_000_000_000_000_000_007, []int32{5, 6, 7}, nil) // shadow-client seq ids are ~1e18 (§8)
	a := h.asample(body)
	b := h.asample(body)
	if a != b || a != ssid+":1000000000000000007" {
		t.Fatalf("ids %q %q", a, b)
	}
	c := h.asample(sampleBody(ssid, 2, []int32{5, 6, 7}, nil))
	if c == a {
		t.Fatal("another seq_id got the same future")
	}
	st := h.srv.Stats()
	if st.SamplesAccepted != 2 || st.IdempotentReplays != 1 || st.Concurrent != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestLongPollTimesOutWith408(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{BaseLatency: time.Hour, LongPollWait: 80 * time.Millisecond})
	ssid := h.sampler("Qwen/Qwen3-8B")
	id := h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	start := time.Now()
	r := h.poll(id, "application/x-protobuf")
	if el := time.Since(start); el < 80*time.Millisecond {
		t.Fatalf("poll answered after %v, before the long-poll wait", el)
	}
	body := mustJSONError(t, r, http.StatusRequestTimeout)
	if body["type"] != "try_again" || body["request_id"] != id || body["queue_state"] != "active" {
		t.Fatalf("408 body %s", r.body)
	}
	// A finished future answers before the wait: a fast sampler completes within one poll.
	fast := newHarness(t, Config{LongPollWait: 10 * time.Second, BaseLatency: 20 * time.Millisecond})
	fssid := fast.sampler("Qwen/Qwen3-8B")
	fid := fast.asample(sampleBody(fssid, 0, []int32{1}, nil))
	start = time.Now()
	mustStatus(t, fast.poll(fid, "application/x-protobuf"), 200)
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("poll held %v although the sample took 20ms", el)
	}
	// Unknown futures answer 410 (§12: the SDK resubmits).
	mustJSONError(t, h.poll("nope:1", "application/x-protobuf"), http.StatusGone)
}

// TestAReadFutureIsDroppedSoonAfter checks the two lifetimes of a finished future: one whose
// result was answered goes ReadTTL later (so a long run does not keep every result it served),
// while one nobody read yet stays for ResultTTL.
func TestAReadFutureIsDroppedSoonAfter(t *testing.T) {
	t.Parallel()
	// The second read comes one loopback round trip after the first: ReadTTL leaves it 2 s,
	// which a loaded machine under -race does not take.
	h := newHarness(t, Config{ResultTTL: time.Hour, ReadTTL: 2 * time.Second})
	ssid := h.sampler("Qwen/Qwen3-8B")
	read := h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	unread := h.asample(sampleBody(ssid, 1, []int32{2}, nil))
	h.protoResult(read)
	h.protoResult(read) // a client that lost the reply polls again: still there
	deadline := time.Now().Add(10 * time.Second)
	for h.poll(read, "application/x-protobuf").status != http.StatusGone {
		if time.Now().After(deadline) {
			t.Fatal("the read future is still kept 10s after it was read")
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.protoResult(unread)
	if st := h.srv.Stats(); st.SamplesAccepted != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCapacityBackpressure(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{Capacity: 2, BaseLatency: time.Hour, RetryAfter: 1500 * time.Millisecond})
	ssid := h.sampler("Qwen/Qwen3-8B")
	h.asample(sampleBody(ssid, 0, []int32{1}, nil))
	h.asample(sampleBody(ssid, 1, []int32{1}, nil))
	r := h.do("POST", "/api/v1/asample", sampleBody(ssid, 2, []int32{1}, nil), "X-Tinker-Sampling-Backpressure", "1")
	mustJSONError(t, r, http.StatusTooManyRequests)
	if r.header.Get("Retry-After") != "2" || r.header.Get("Retry-After-Ms") != "1500" {
		t.Fatalf("Retry-After %q, -Ms %q", r.header.Get("Retry-After"), r.header.Get("Retry-After-Ms"))
	}
	// Without the header the sample is accepted and queued.
	r = h.do("POST", "/api/v1/asample", sampleBody(ssid, 3, []int32{1}, nil))
	mustStatus(t, r, 200)
	st := h.srv.Stats()
	if st.Concurrent != 2 || st.Queued != 1 || st.PeakConcurrent != 2 || st.CapacityRejections != 1 || st.Requests["asample"][429] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCapacityQueueDrains(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{Capacity: 2, BaseLatency: 10 * time.Millisecond})
	ssid := h.sampler("Qwen/Qwen3-8B")
	var ids []string
	for i := range 6 {
		r := h.do("POST", "/api/v1/asample", sampleBody(ssid, int64(i), []int32{int32(i) + 1}, nil))
		mustStatus(t, r, 200)
		ids = append(ids, r.json(t)["request_id"].(string))
	}
	for _, id := range ids {
		h.protoResult(id)
	}
	st := h.srv.Stats()
	if st.SamplesCompleted != 6 || st.PeakConcurrent != 2 || st.Queued != 0 || st.Concurrent != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestDeterminism(t *testing.T) {
	t.Parallel()
	a := newHarness(t, Config{})
	b := newHarness(t, Config{Seed: 99}) // the server seed does not change outputs
	sa, sb := a.sampler("Qwen/Qwen3-8B"), b.sampler("Qwen/Qwen3-8B")
	prompt := []int32{9707, 11, 1879, 0, 42}
	get := func(h *harness, ssid string, seq int64, seed any) *SampleResponse {
		body := sampleBody(ssid, seq, prompt, map[string]any{"seed": seed, "max_tokens": 64})
		body["num_samples"] = 4
		return h.protoResult(h.asample(body))
	}
	r1, r2 := get(a, sa, 1, 1234), get(b, sb, 7, 1234)
	if !reflect.DeepEqual(r1, r2) {
		t.Fatalf("same prompt and seed gave different outputs:\n%+v\n%+v", r1, r2)
	}
	if reflect.DeepEqual(r1.Sequences[0].Tokens, r1.Sequences[1].Tokens) {
		t.Fatal("sample indices 0 and 1 gave the same tokens")
	}
	r3 := get(a, sa, 2, 1235)
	if reflect.DeepEqual(r1.Sequences[0].Tokens, r3.Sequences[0].Tokens) {
		t.Fatal("another seed gave the same tokens")
	}
	// A negative and a huge unsigned seed are both valid 64-bit seeds (§T2).
	get(a, sa, 3, -5)
	get(a, sa, 4, uint64(math.MaxUint64))
	for _, s := range r1.Sequences {
		for _, tok := range s.Tokens {
			if tok < 1000 || tok >= 100000 {
				t.Fatalf("token %d outside [1000, 100000)", tok)
			}
		}
	}
}

func TestMaxTokensAndStop(t *testing.T) {
	t.Parallel()
	g := generator{minGen: 1, tokenMin: 1000, tokenMax: 100000, stopProb: 0.05}
	stops := []int32{151645, 151643}
	var sawStop, sawLength, sawStopStrEnd, sawForcedLength int
	for seed := uint64(0); seed < 300; seed++ {
		// Stop token ids: a stop id really ends the sequence and is its last token.
		resp := g.generate(&genParams{prompt: []int32{1, 2, 3}, seed: seed, numSamples: 2, maxTokens: 20, stopTokens: stops})
		for _, s := range resp.Sequences {
			if len(s.Tokens) == 0 || len(s.Tokens) > 20 || len(s.Logprobs) != len(s.Tokens) {
				t.Fatalf("seed %d: bad sequence %+v", seed, s)
			}
			for i, tok := range s.Tokens[:len(s.Tokens)-1] {
				if slices.Contains(stops, tok) {
					t.Fatalf("seed %d: stop id %d at position %d did not end the sequence", seed, tok, i)
				}
			}
			last := s.Tokens[len(s.Tokens)-1]
			switch s.StopReason {
			case StopReasonStop:
				sawStop++
				if !slices.Contains(stops, last) {
					t.Fatalf("seed %d: stop reason stop but last token %d is not a stop id", seed, last)
				}
			case StopReasonLength:
				sawLength++
				if len(s.Tokens) != 20 || slices.Contains(stops, last) {
					t.Fatalf("seed %d: length with %d tokens ending in %d", seed, len(s.Tokens), last)
				}
			}
			for _, lp := range s.Logprobs {
				if lp > 0 || lp <= -8 {
					t.Fatalf("logprob %v out of range", lp)
				}
			}
		}
		// Stop strings: natural end before max_tokens is a stop, max_tokens is a length.
		resp = g.generate(&genParams{prompt: []int32{1, 2, 3}, seed: seed, numSamples: 1, maxTokens: 8})
		s := resp.Sequences[0]
		if (len(s.Tokens) == 8) != (s.StopReason == StopReasonLength) {
			t.Fatalf("seed %d: %d tokens with reason %v", seed, len(s.Tokens), s.StopReason)
		}
		if s.StopReason == StopReasonStop {
			sawStopStrEnd++
		}
		// max_tokens 1 always ends by length (or by a stop id).
		resp = g.generate(&genParams{prompt: []int32{4}, seed: seed, numSamples: 1, maxTokens: 1})
		if len(resp.Sequences[0].Tokens) != 1 || resp.Sequences[0].StopReason != StopReasonLength {
			t.Fatalf("max_tokens 1: %+v", resp.Sequences[0])
		}
		sawForcedLength++
	}
	if sawStop == 0 || sawLength == 0 || sawStopStrEnd == 0 || sawForcedLength == 0 {
		t.Fatalf("stop %d length %d stop-string ends %d", sawStop, sawLength, sawStopStrEnd)
	}

	// Over HTTP: max_tokens and stop ids are honoured in the reply.
	h := newHarness(t, Config{StopTokenProbability: 0.3})
	ssid := h.sampler("Qwen/Qwen3-8B")
	body := sampleBody(ssid, 1, []int32{1, 2}, map[string]any{"max_tokens": 5, "stop": []int32{151645}})
	body["num_samples"] = 16
	resp := h.protoResult(h.asample(body))
	for _, s := range resp.Sequences {
		if len(s.Tokens) > 5 || (s.StopReason == StopReasonStop) != (s.Tokens[len(s.Tokens)-1] == 151645) {
			t.Fatalf("sequence %+v", s)
		}
	}
}

func TestLogprobs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	prompt := []int32{151644, 872, 198, 3838}
	body := sampleBody(ssid, 1, prompt, map[string]any{"max_tokens": 1})
	body["prompt_logprobs"] = true
	body["topk_prompt_logprobs"] = 25 // capped at 20
	id := h.asample(body)
	pr := h.protoResult(id)
	if len(pr.PromptLogprobs) != 4 || !math.IsNaN(float64(pr.PromptLogprobs[0])) {
		t.Fatalf("prompt logprobs %v", pr.PromptLogprobs)
	}
	for _, lp := range pr.PromptLogprobs[1:] {
		if math.IsNaN(float64(lp)) || lp > 0 {
			t.Fatalf("prompt logprob %v", lp)
		}
	}
	tk := pr.TopK
	if tk == nil || tk.K != 20 || tk.PromptLength != 4 || len(tk.TokenIDs) != 80 || len(tk.Logprobs) != 80 {
		t.Fatalf("topk %+v", tk)
	}
	for j := 0; j < 20; j++ {
		if tk.TokenIDs[j] != 0 || tk.Logprobs[j] != topkEmptyLogprob {
			t.Fatalf("row 0 not empty: %v %v", tk.TokenIDs[:20], tk.Logprobs[:20])
		}
	}
	for i := 1; i < 4; i++ {
		for j := 1; j < 20; j++ {
			if tk.Logprobs[i*20+j] >= tk.Logprobs[i*20+j-1] || tk.TokenIDs[i*20+j] == tk.TokenIDs[i*20+j-1] {
				t.Fatalf("row %d not a decreasing top-k: %v", i, tk.Logprobs[i*20:i*20+20])
			}
		}
	}
	jr := h.result(id, "application/json")
	var js struct {
		PromptLogprobs     []*float64     `json:"prompt_logprobs"`
		TopkPromptLogprobs [][][2]float64 `json:"topk_prompt_logprobs"`
	}
	if err := json.Unmarshal(jr.body, &js); err != nil {
		t.Fatalf("%v: %s", err, jr.body)
	}
	if js.PromptLogprobs[0] != nil || float32(*js.PromptLogprobs[1]) != pr.PromptLogprobs[1] {
		t.Fatalf("json prompt logprobs %s", jr.body)
	}
	if js.TopkPromptLogprobs[0] != nil || len(js.TopkPromptLogprobs[1]) != 20 || js.TopkPromptLogprobs[2][0][0] != float64(tk.TokenIDs[40]) {
		t.Fatalf("json topk %s", jr.body)
	}
	// Not requested: absent in proto, null in JSON.
	id2 := h.asample(sampleBody(ssid, 2, prompt, nil))
	if pr2 := h.protoResult(id2); pr2.PromptLogprobs != nil || pr2.TopK != nil {
		t.Fatalf("unrequested logprobs %+v", pr2)
	}
	if jr2 := h.result(id2, "application/json"); !strings.Contains(string(jr2.body), `"prompt_logprobs":null,"topk_prompt_logprobs":null`) {
		t.Fatalf("json %s", jr2.body)
	}
}

func TestContextWindowOverflowFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{Models: []Model{{Name: "tiny", MaxContextLength: 10}}})
	ssid := h.sampler("tiny")
	id := h.asample(sampleBody(ssid, 1, []int32{1, 2, 3, 4, 5, 6}, map[string]any{"max_tokens": 5}))
	r := h.result(id, "application/x-protobuf")
	if m := r.json(t); m["category"] != "user" || !strings.Contains(m["error"].(string), "context window") {
		t.Fatalf("reply %s", r.body)
	}
	if st := h.srv.Stats(); st.SamplesFailed != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestREST(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{TrainingRuns: 5})
	r := h.do("GET", "/api/v1/training_runs?limit=2&offset=0&access_scope=owned", nil)
	mustStatus(t, r, 200)
	var runs struct {
		TrainingRuns []map[string]any `json:"training_runs"`
		Cursor       cursor           `json:"cursor"`
	}
	if err := json.Unmarshal(r.body, &runs); err != nil || len(runs.TrainingRuns) != 2 || runs.Cursor != (cursor{0, 2, 5}) {
		t.Fatalf("training_runs %s", r.body)
	}
	r = h.do("GET", "/api/v1/training_runs?limit=2&offset=4", nil)
	if err := json.Unmarshal(r.body, &runs); err != nil || len(runs.TrainingRuns) != 1 || runs.Cursor != (cursor{4, 2, 5}) {
		t.Fatalf("last page %s", r.body)
	}
	runID := runs.TrainingRuns[0]["training_run_id"].(string)
	r = h.do("GET", "/api/v1/training_runs/"+runID+"?access_scope=owned", nil)
	mustStatus(t, r, 200)
	if r.json(t)["training_run_id"] != runID {
		t.Fatalf("run %s", r.body)
	}
	r = h.do("GET", "/api/v1/training_runs/"+runID+"/checkpoints", nil)
	mustStatus(t, r, 200)
	var cks struct {
		Checkpoints []checkpoint `json:"checkpoints"`
		Cursor      *cursor      `json:"cursor"`
	}
	if err := json.Unmarshal(r.body, &cks); err != nil || len(cks.Checkpoints) != 2 || cks.Cursor != nil {
		t.Fatalf("run checkpoints %s", r.body)
	}
	r = h.do("GET", "/api/v1/checkpoints?limit=3&offset=9", nil)
	if err := json.Unmarshal(r.body, &cks); err != nil || len(cks.Checkpoints) != 1 || *cks.Cursor != (cursor{9, 3, 10}) {
		t.Fatalf("checkpoints %s", r.body)
	}
	r = h.do("POST", "/api/v1/weights_info", map[string]any{"tinker_path": cks.Checkpoints[0].TinkerPath})
	mustStatus(t, r, 200)
	if m := r.json(t); m["is_lora"] != true || m["base_model"] == "" {
		t.Fatalf("weights_info %s", r.body)
	}
	mustJSONError(t, h.do("POST", "/api/v1/weights_info", `{"tinker_path":"tinker://nope/weights/x"}`), 404)
	mustJSONError(t, h.do("GET", "/api/v1/training_runs/nope", nil), 404)
	// A sampler from a checkpoint path inherits the run's base model.
	sess := h.do("POST", "/api/v1/create_session", `{"sdk_version":"0.25.0","type":"create_session"}`).json(t)["session_id"].(string)
	r = h.do("POST", "/api/v1/create_sampling_session", map[string]any{"session_id": sess, "sampling_session_seq_id": 1,
		"model_path": cks.Checkpoints[0].TinkerPath, "type": "create_sampling_session"})
	mustStatus(t, r, 200)
	ssid := r.json(t)["sampling_session_id"].(string)
	r = h.do("GET", "/api/v1/samplers/"+ssid, nil)
	if m := r.json(t); m["model_path"] != cks.Checkpoints[0].TinkerPath {
		t.Fatalf("sampler %s", r.body)
	}
	r = h.do("GET", "/api/v1/sessions?limit=10", nil)
	if !strings.Contains(string(r.body), sess) {
		t.Fatalf("sessions %s", r.body)
	}
	r = h.do("GET", "/api/v1/sessions/"+sess, nil)
	if !strings.Contains(string(r.body), ssid) {
		t.Fatalf("session %s", r.body)
	}
}

func TestDynamicConfigDisabled(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{DisableDynamicConfig: true, ClientConfig: map[string]any{"sample_max_concurrent_requests": 7}})
	mustJSONError(t, h.do("POST", "/api/v1/client/dynamic_config", `{"sdk_version":"0.25.0"}`), 404)
	if m := h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`).json(t); m["sample_max_concurrent_requests"] != float64(7) {
		t.Fatalf("client config %v", m)
	}
}

func TestMetadataOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{MetadataOnlyThreshold: 10})
	ssid := h.sampler("Qwen/Qwen3-8B")
	id := h.asample(sampleBody(ssid, 1, []int32{1, 2}, nil))
	r := h.result(id, "application/x-protobuf")
	m := r.json(t)
	if m["status"] != "complete_metadata" || m["response_payload_size"].(float64) <= 10 {
		t.Fatalf("first poll %s", r.body)
	}
	// Only once per future (§3.7): the next poll carries the payload.
	if resp := h.protoResult(id); len(resp.Sequences) != 1 {
		t.Fatalf("payload %+v", resp)
	}
}

func TestCloseWakesLongPolls(t *testing.T) {
	t.Parallel()
	srv, err := New(Config{APIKeys: []string{testKey}, BaseLatency: time.Hour, LongPollWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	base, err := srv.Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, srv: srv, base: base}
	ssid := h.sampler("Qwen/Qwen3-8B")
	id := h.asample(sampleBody(ssid, 1, []int32{1}, nil))
	done := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest("POST", base+"/api/v1/retrieve_future", strings.NewReader(`{"request_id":"`+id+`"}`))
		req.Header.Set("X-API-Key", testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- reply{}
			return
		}
		resp.Body.Close()
		done <- reply{status: resp.StatusCode}
	}()
	eventually(t, "the poll to be held", func() bool { return srv.Stats().PollsHeld == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	select {
	case r := <-done:
		if r.status != http.StatusRequestTimeout {
			t.Fatalf("held poll got %d", r.status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("held poll not released by Shutdown")
	}
}

// TestAStartedAgainSimulatorGivesOtherIDs: session ids are not drawn from the fault seed. With
// them, a simulator started again (compose restarts it) gave the first client to come the
// session id another had held, whose asample with the same seq_id was then answered with the
// first one's future: a completion of a prompt it never sent.
func TestAStartedAgainSimulatorGivesOtherIDs(t *testing.T) {
	t.Parallel()
	cfg := Config{Seed: 1}
	before := newHarness(t, cfg)
	stale := before.sampler("Qwen/Qwen3-8B")
	after := newHarness(t, cfg) // the same configuration, started again
	other := after.sampler("Qwen/Qwen3-8B")
	if other == stale {
		t.Fatalf("the simulator started again gave out sampler %s again", other)
	}
	idOther := after.asample(sampleBody(other, 0, []int32{7, 7, 7}, nil))
	r := after.do("POST", "/api/v1/asample", sampleBody(stale, 0, []int32{1, 2, 3}, nil), "X-Tinker-Sampling-Backpressure", "1")
	if r.status == http.StatusOK && r.json(t)["request_id"] == idOther {
		t.Fatalf("a prompt on the old sampler was answered with another client's future %s", idOther)
	}
}

// TestHugeNumbersInASampleAreAnswered: max_tokens near 2^63 overflowed the context check and
// the generator asked for a slice that large; an image's expected_tokens of 2^50 asked for its
// positions. Both panicked, and the client got no reply, a connection error it retries for
// minutes, where the real service answers.
func TestHugeNumbersInASampleAreAnswered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{LongPollWait: 30 * time.Millisecond})
	ssid := h.sampler("Qwen/Qwen3-8B")
	id := h.asample(sampleBody(ssid, 0, []int32{1}, map[string]any{"max_tokens": int64(math.MaxInt64)}))
	if m := h.result(id, "application/x-protobuf").json(t); m["category"] != "user" {
		t.Fatalf("max_tokens 2^63-1: %v, want a failed future of category user", m)
	}
	for _, n := range []int64{1 << 50, 50_000_000} {
		body := fmt.Sprintf(`{"prompt":{"chunks":[{"data":"","format":"png","expected_tokens":%d,"type":"image"}]},`+
			`"sampling_params":{"max_tokens":4},"sampling_session_id":%q,"seq_id":%d,"type":"sample"}`, n, ssid, n)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		r := h.do("POST", "/api/v1/asample", body)
		runtime.ReadMemStats(&after)
		mustJSONError(t, r, http.StatusUnprocessableEntity)
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
			t.Fatalf("expected_tokens %d: %d MB allocated for a %d-byte request", n, alloc>>20, len(body))
		}
	}
}

// TestAFieldNamedInAnotherCaseIsUnknown: the service's field names are case-sensitive, as
// pydantic's are, so "SEQ_ID" is an unknown field there, not seq_id. encoding/json matches
// names regardless of case: a client that spelt one so passed here and failed in production.
func TestAFieldNamedInAnotherCaseIsUnknown(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	ssid := h.sampler("Qwen/Qwen3-8B")
	rename := func(m map[string]any, from, to string) { m[to] = m[from]; delete(m, from) }
	cases := []struct {
		name string
		path string
		body any
		key  string
	}{
		{"top level", "/api/v1/asample", func() any { b := sampleBody(ssid, 1, []int32{1, 2, 3}, nil); rename(b, "seq_id", "SEQ_ID"); return b }(), "SEQ_ID"},
		{"sampling params", "/api/v1/asample", func() any {
			b := sampleBody(ssid, 2, []int32{1, 2, 3}, nil)
			rename(b["sampling_params"].(map[string]any), "max_tokens", "Max_Tokens")
			return b
		}(), "Max_Tokens"},
		{"chunk", "/api/v1/asample", func() any {
			b := sampleBody(ssid, 3, []int32{1, 2, 3}, nil)
			b["prompt"] = map[string]any{"chunks": []any{map[string]any{"Tokens": []int{1}, "type": "encoded_text"}}}
			return b
		}(), "Tokens"},
		{"session", "/api/v1/create_session", `{"tags":[],"user_metadata":{},"sdk_version":"0.25.0","Type":"create_session"}`, "Type"},
		{"poll", "/api/v1/retrieve_future", `{"Request_Id":"x","allow_metadata_only":true}`, "Request_Id"},
	}
	for _, c := range cases {
		body := mustJSONError(t, h.do("POST", c.path, c.body), http.StatusUnprocessableEntity)
		if d, _ := body["detail"].(string); !strings.Contains(d, "unknown field") || !strings.Contains(d, c.key) {
			t.Errorf("%s: detail %q does not name the unknown field %q", c.name, d, c.key)
		}
	}
	if st := h.srv.Stats(); st.SamplesAccepted != 0 {
		t.Fatalf("requests with misspelt fields created %d samples", st.SamplesAccepted)
	}
}

// TestRequestsAreLoggedAtDebug checks Config.Logger's promise of request logs: each reply is
// logged at debug level with its endpoint and status, never with the API key.
func TestRequestsAreLoggedAtDebug(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var buf strings.Builder
	logs := func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	})
	h := newHarness(t, Config{Logger: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	mustStatus(t, h.do("GET", "/api/v1/healthz", nil), 200)
	mustJSONError(t, h.do("POST", "/api/v1/asample", "{", "X-API-Key", testKey), 400)
	eventually(t, "request logs", func() bool {
		l := logs()
		return strings.Contains(l, "endpoint=healthz") && strings.Contains(l, "status=200") &&
			strings.Contains(l, "endpoint=asample") && strings.Contains(l, "status=400")
	})
	if strings.Contains(logs(), testKey) {
		t.Fatalf("the API key is in the logs:\n%s", logs())
	}
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
