package tinker

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

const testKey = APIKey("tml-TESTSECRET.0123456789abcdef")

// fakeClock is a virtual clock: Sleep records the duration and advances time at
// once, so protocol-sized delays (seconds to hours) cost nothing and tests can
// assert the exact delays the client chose.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	f.sleeps = append(f.sleeps, d)
	if d > 0 {
		f.now = f.now.Add(d)
	}
	f.mu.Unlock()
	return nil
}

func (f *fakeClock) Sleeps() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.sleeps...)
}

// seen is one request the fake server received.
type seen struct {
	Method   string
	Endpoint string
	Query    url.Values
	Header   http.Header
	Body     []byte
}

type reply func(w http.ResponseWriter, r *http.Request, body []byte)

// fakeTinker is a scripted Tinker peer over real loopback HTTP, mounted under a
// path prefix (§1.1). Each endpoint answers from a queue of replies, then from a
// fallback; every request is recorded.
type fakeTinker struct {
	t        *testing.T
	srv      *httptest.Server
	prefix   string
	mu       sync.Mutex
	seen     []seen
	queues   map[string][]reply
	fallback map[string]reply
	// accept decides which X-API-Key values an endpoint takes; nil means testKey only.
	accept func(endpoint, cred string) bool
}

func newFake(t *testing.T) *fakeTinker {
	t.Helper()
	f := &fakeTinker{t: t, prefix: "/svc/tinker-prod", queues: map[string][]reply{}, fallback: map[string]reply{}}
	f.fallback["client/config"] = jsonReply(200, `{}`)
	f.fallback["client/dynamic_config"] = jsonReply(404, `{"detail":"Not Found"}`)
	f.fallback["create_session"] = jsonReply(200, `{"type":"create_session","session_id":"sess-1","info_message":null}`)
	f.fallback["session_heartbeat"] = jsonReply(200, `{"type":"session_heartbeat"}`)
	f.fallback["create_sampling_session"] = jsonReply(200, `{"type":"create_sampling_session","sampling_session_id":"sess-1:sample:0"}`)
	f.fallback["asample"] = acceptSample
	f.fallback["retrieve_future"] = protoReply(encodeResponse(simpleResponse()))
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeTinker) url() string { return f.srv.URL + f.prefix }

func (f *fakeTinker) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	base := f.prefix + "/api/v1/"
	if !strings.HasPrefix(r.URL.Path, base) {
		f.t.Errorf("request outside the base URL prefix: %s", r.URL.Path)
		http.Error(w, "bad prefix", 404)
		return
	}
	ep := strings.TrimPrefix(r.URL.Path, base)
	if strings.HasPrefix(ep, "samplers/") {
		ep = "samplers"
	}
	f.mu.Lock()
	accept := f.accept
	f.mu.Unlock()
	cred := r.Header.Get("X-Api-Key")
	if (accept == nil && cred != string(testKey)) || (accept != nil && !accept(ep, cred)) {
		jsonReply(401, `{"detail":"bad key"}`)(w, r, body)
		return
	}
	f.mu.Lock()
	f.seen = append(f.seen, seen{Method: r.Method, Endpoint: ep, Query: r.URL.Query(), Header: r.Header.Clone(), Body: body})
	var rep reply
	if q := f.queues[ep]; len(q) > 0 {
		rep, f.queues[ep] = q[0], q[1:]
	} else {
		rep = f.fallback[ep]
	}
	f.mu.Unlock()
	if rep == nil {
		jsonReply(404, `{"detail":"no such endpoint"}`)(w, r, body)
		return
	}
	rep(w, r, body)
}

// push queues replies for an endpoint; set replaces its fallback.
func (f *fakeTinker) push(ep string, rs ...reply) {
	f.mu.Lock()
	f.queues[ep] = append(f.queues[ep], rs...)
	f.mu.Unlock()
}

func (f *fakeTinker) set(ep string, r reply) {
	f.mu.Lock()
	f.fallback[ep] = r
	f.mu.Unlock()
}

// setAccept replaces the credential check (see fakeTinker.accept).
func (f *fakeTinker) setAccept(fn func(endpoint, cred string) bool) {
	f.mu.Lock()
	f.accept = fn
	f.mu.Unlock()
}

func (f *fakeTinker) requests(ep string) []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []seen
	for _, s := range f.seen {
		if ep == "" || s.Endpoint == ep {
			out = append(out, s)
		}
	}
	return out
}

func jsonReply(status int, body string) reply {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

func withHeader(k, v string, r reply) reply {
	return func(w http.ResponseWriter, req *http.Request, body []byte) {
		w.Header().Set(k, v)
		r(w, req, body)
	}
}

func protoReply(b []byte) reply {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(b)
	}
}

// bareStatus answers with no body at all (Content-Length 0).
func bareStatus(status int) reply {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) { w.WriteHeader(status) }
}

// truncated promises a body it does not deliver: the reply breaks after the
// headers, a connection error Go's transport cannot silently retry (it does
// retry a request with X-Idempotency-Key that fails before any reply on a
// reused connection, which would make a bare hang-up nondeterministic here).
func truncated(w http.ResponseWriter, _ *http.Request, _ []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", "100")
	w.WriteHeader(200)
	_, _ = w.Write([]byte(`{"type":`))
}

// block holds the request until the client gives up.
func block(_ http.ResponseWriter, r *http.Request, _ []byte) { <-r.Context().Done() }

// acceptSample answers asample with request id <sampling_session_id>:<seq_id> (§8).
func acceptSample(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		SamplingSessionID string `json:"sampling_session_id"`
		SeqID             int64  `json:"seq_id"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		jsonReply(400, `{"detail":"bad json"}`)(w, r, body)
		return
	}
	jsonReply(200, fmt.Sprintf(`{"request_id":"%s:%d"}`, req.SamplingSessionID, req.SeqID))(w, r, body)
}

func simpleResponse() *SampleResponse {
	return &SampleResponse{Sequences: []SampledSequence{{StopReason: StopReasonStop, Tokens: []int{5, 6, 7}, Logprobs: []float64{-0.5, -0.25, -1}}}}
}

// encodeResponse builds a tinker_public.SampleResponse with protowire (test side
// of §T4).
func encodeResponse(r *SampleResponse) []byte {
	var b []byte
	for _, s := range r.Sequences {
		var sb []byte
		if s.StopReason == StopReasonLength {
			sb = protowire.AppendTag(sb, 1, protowire.VarintType)
			sb = protowire.AppendVarint(sb, 1)
		}
		sb = protowire.AppendTag(sb, 2, protowire.BytesType)
		sb = protowire.AppendBytes(sb, le32i(s.Tokens))
		if s.Logprobs != nil {
			sb = protowire.AppendTag(sb, 3, protowire.BytesType)
			sb = protowire.AppendBytes(sb, le32f(s.Logprobs))
		}
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, sb)
	}
	if r.PromptLogprobs != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, le32f(r.PromptLogprobs))
	}
	if r.PromptCacheHitTokens != 0 {
		b = protowire.AppendTag(b, 4, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.PromptCacheHitTokens))
	}
	return b
}

func le32i(v []int) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(x)))
	}
	return b
}

func le32f(v []float64) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
	}
	return b
}

// eventLog records events.
type eventLog struct {
	mu sync.Mutex
	ev []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
}

func (l *eventLog) of(k EventKind) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.ev {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// dial starts a client against f with a virtual clock and an event log.
func dial(t *testing.T, f *fakeTinker, mod func(*Config)) (*Client, *fakeClock, *eventLog) {
	t.Helper()
	fc := newFakeClock()
	ev := &eventLog{}
	cfg := Config{BaseURL: f.url(), APIKey: testKey, OnEvent: ev.add,
		Timing: Timing{Clock: fc, HeartbeatInterval: time.Hour}}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, fc, ev
}

func sampler(t *testing.T, c *Client) *Sampler {
	t.Helper()
	s, err := c.NewSampler(context.Background(), SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatalf("NewSampler: %v", err)
	}
	return s
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func basicRequest() SampleRequest {
	mt := 16
	return SampleRequest{Prompt: EncodedText([]int{1, 2, 3}), Params: SamplingParams{MaxTokens: &mt}}
}

// seqIDs extracts the seq_id of every asample request.
func seqIDs(t *testing.T, reqs []seen) []int64 {
	t.Helper()
	out := make([]int64, len(reqs))
	for i, r := range reqs {
		var b struct {
			SeqID int64 `json:"seq_id"`
		}
		if err := json.Unmarshal(r.Body, &b); err != nil {
			t.Fatalf("asample body: %v", err)
		}
		out[i] = b.SeqID
	}
	return out
}
