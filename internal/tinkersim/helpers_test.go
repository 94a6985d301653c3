package tinkersim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

const testKey = "tml-test-key-123"

// harness is a simulator behind a real loopback HTTP server.
type harness struct {
	t    testing.TB
	srv  *Server
	base string
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	if cfg.APIKeys == nil {
		cfg.APIKeys = []string{testKey}
	}
	if cfg.LongPollWait == 0 {
		cfg.LongPollWait = 100 * time.Millisecond
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	return &harness{t: t, srv: srv, base: ts.URL}
}

// reply is a received HTTP response, body read.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("reply %d is not a JSON object: %v: %q", r.status, err, r.body)
	}
	return m
}

// do sends one request; body may be a string (sent verbatim), nil, or a value to marshal.
func (h *harness) do(method, path string, body any, headers ...string) reply {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			h.t.Fatalf("marshal: %v", err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, h.base+path, rd)
	if err != nil {
		h.t.Fatalf("new request: %v", err)
	}
	req.Header.Set("X-API-Key", testKey)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
		} else {
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("read body: %v", err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: data}
}

// mustStatus fails unless r has the wanted status.
func mustStatus(t testing.TB, r reply, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d; body %q", r.status, want, r.body)
	}
}

// mustJSONError checks a 4xx/5xx with a JSON body and a matching Content-Length.
func mustJSONError(t testing.TB, r reply, want int) map[string]any {
	t.Helper()
	mustStatus(t, r, want)
	if cl := r.header.Get("Content-Length"); cl == "" || cl == "0" || cl != strconv.Itoa(len(r.body)) {
		t.Fatalf("Content-Length %q for a body of %d bytes", cl, len(r.body))
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	return r.json(t)
}

// sampler creates a session and a sampling session for model and returns the sampler id.
func (h *harness) sampler(model string) string {
	h.t.Helper()
	r := h.do("POST", "/api/v1/create_session", map[string]any{"tags": []string{}, "user_metadata": map[string]any{},
		"sdk_version": "0.25.0", "type": "create_session"})
	mustStatus(h.t, r, 200)
	sid := r.json(h.t)["session_id"].(string)
	r = h.do("POST", "/api/v1/create_sampling_session", map[string]any{"session_id": sid, "sampling_session_seq_id": 0,
		"base_model": model, "type": "create_sampling_session"})
	mustStatus(h.t, r, 200)
	return r.json(h.t)["sampling_session_id"].(string)
}

// sampleBody is a SampleRequest as the SDK sends it (§3.6).
func sampleBody(ssid string, seq int64, tokens []int32, params map[string]any) map[string]any {
	sp := map[string]any{"max_tokens": 16, "temperature": 1.0, "top_k": -1, "top_p": 1.0}
	for k, v := range params {
		sp[k] = v
	}
	return map[string]any{
		"num_samples":          1,
		"prompt":               map[string]any{"chunks": []any{map[string]any{"tokens": tokens, "type": "encoded_text"}}},
		"sampling_params":      sp,
		"sampling_session_id":  ssid,
		"seq_id":               seq,
		"prompt_logprobs":      false,
		"topk_prompt_logprobs": 0,
		"type":                 "sample",
	}
}

// asample submits body and returns the request id.
func (h *harness) asample(body map[string]any) string {
	h.t.Helper()
	r := h.do("POST", "/api/v1/asample", body, "X-Tinker-Sampling-Backpressure", "1")
	mustStatus(h.t, r, 200)
	return r.json(h.t)["request_id"].(string)
}

// poll sends one retrieve_future.
func (h *harness) poll(id string, accept string) reply {
	h.t.Helper()
	return h.do("POST", "/api/v1/retrieve_future", map[string]any{"request_id": id, "allow_metadata_only": true},
		"Accept", accept, "X-Tinker-Request-Type", "Sample")
}

// result polls until a 200 arrives (408 try_again are re-polled at once, like the SDK).
func (h *harness) result(id string, accept string) reply {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r := h.poll(id, accept)
		if r.status == http.StatusRequestTimeout {
			continue
		}
		mustStatus(h.t, r, 200)
		return r
	}
	h.t.Fatalf("future %s did not complete", id)
	return reply{}
}

// protoResult polls and decodes a protobuf result.
func (h *harness) protoResult(id string) *SampleResponse {
	h.t.Helper()
	r := h.result(id, "application/x-protobuf")
	if ct := r.header.Get("Content-Type"); ct != "application/x-protobuf" {
		h.t.Fatalf("content type %q, body %q", ct, r.body)
	}
	resp, err := decodeSampleResponse(r.body)
	if err != nil {
		h.t.Fatalf("decode: %v", err)
	}
	return resp
}

// decodeSampleResponse is an independent protowire decoder of §T4, for the tests.
func decodeSampleResponse(b []byte) (*SampleResponse, error) {
	out := &SampleResponse{}
	err := walk(b, func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error {
		switch num {
		case 1:
			var seq Sequence
			err := walk(data, func(n protowire.Number, _ protowire.Type, v uint64, d []byte) error {
				switch n {
				case 1:
					seq.StopReason = StopReason(v)
				case 2:
					seq.Tokens = int32s(d)
				case 3:
					seq.Logprobs = float32s(d)
				}
				return nil
			})
			out.Sequences = append(out.Sequences, seq)
			return err
		case 2:
			out.PromptLogprobs = float32s(data)
		case 3:
			t := &TopKPromptLogprobs{}
			out.TopK = t
			return walk(data, func(n protowire.Number, _ protowire.Type, v uint64, d []byte) error {
				switch n {
				case 1:
					t.TokenIDs = int32s(d)
				case 2:
					t.Logprobs = float32s(d)
				case 3:
					t.K = uint32(v)
				case 4:
					t.PromptLength = uint32(v)
				}
				return nil
			})
		case 4:
			out.PromptCacheHitTokens = int32(v)
		}
		return nil
	})
	return out, err
}

func walk(b []byte, fn func(protowire.Number, protowire.Type, uint64, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v uint64
		var data []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			data, n = protowire.ConsumeBytes(b)
		default:
			return fmt.Errorf("unexpected wire type %d", typ)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, data); err != nil {
			return err
		}
	}
	return nil
}

func int32s(d []byte) []int32 {
	out := make([]int32, len(d)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(d[4*i:]))
	}
	return out
}

func float32s(d []byte) []float32 {
	out := make([]float32, len(d)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
	}
	return out
}

// eventually polls cond until it holds or a generous deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
