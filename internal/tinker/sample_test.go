package tinker

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// runSample dials a fresh fake, queues poll replies, and runs one Sample.
func runSample(t *testing.T, mod func(*Config), polls ...reply) (*SampleResult, *fakeTinker, *fakeClock, *eventLog, error) {
	t.Helper()
	f := newFake(t)
	f.push("retrieve_future", polls...)
	c, fc, ev := dial(t, f, mod)
	s := sampler(t, c)
	res, err := s.Sample(testCtx(t), basicRequest())
	return res, f, fc, ev, err
}

func TestSampleHappyPathWire(t *testing.T) {
	res, f, fc, ev, err := runSample(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(res.Response, simpleResponse()) || res.Attempts != 1 || res.Submissions != 1 {
		t.Fatalf("result %+v", res)
	}
	as := f.requests("asample")[0]
	seq := seqIDs(t, f.requests("asample"))[0]
	want := fmt.Sprintf(`{"num_samples":1,"prompt":{"chunks":[{"tokens":[1,2,3],"type":"encoded_text"}]},`+
		`"sampling_params":{"max_tokens":16,"temperature":1.0,"top_k":-1,"top_p":1.0},"sampling_session_id":"sess-1:sample:0",`+
		`"seq_id":%d,"prompt_logprobs":false,"topk_prompt_logprobs":0,"type":"sample"}`, seq)
	if string(as.Body) != want {
		t.Fatalf("asample body\n got %s\nwant %s", as.Body, want)
	}
	if as.Header.Get("X-Tinker-Sampling-Backpressure") != "1" || as.Header.Get("X-Idempotency-Key") == "" ||
		as.Header.Get("Content-Type") != "application/json" || as.Header.Get("X-Stainless-Retry-Count") != "0" {
		t.Fatalf("asample headers %v", as.Header)
	}
	if res.SeqID != seq || res.RequestID != fmt.Sprintf("sess-1:sample:0:%d", seq) {
		t.Fatalf("ids %d %s", res.SeqID, res.RequestID)
	}
	p := f.requests("retrieve_future")[0]
	if string(p.Body) != fmt.Sprintf(`{"request_id":"sess-1:sample:0:%d","allow_metadata_only":true}`, seq) {
		t.Fatalf("poll body %s", p.Body)
	}
	if p.Header.Get("Accept") != "application/x-protobuf" || p.Header.Get("X-Tinker-Request-Iteration") != "0" ||
		p.Header.Get("X-Tinker-Request-Type") != "Sample" || p.Header.Get("X-Tinker-Create-Promise-Roundtrip-Time") == "" ||
		p.Header.Get("X-Stainless-Read-Timeout") != "45" {
		t.Fatalf("poll headers %v", p.Header)
	}
	if len(fc.Sleeps()) != 0 {
		t.Fatalf("slept %v", fc.Sleeps())
	}
	byEndpoint := map[string]int{}
	for _, e := range ev.of(EventRequest) {
		if e.StatusCode == 200 && e.Duration > 0 {
			byEndpoint[e.Endpoint]++
		}
	}
	if byEndpoint["asample"] != 1 || byEndpoint["retrieve_future"] != 1 {
		t.Fatalf("request events %v", byEndpoint)
	}
}

// Every row of the §4.2 table.
func TestPollTryAgain200(t *testing.T) {
	res, f, fc, ev, err := runSample(t, nil,
		jsonReply(200, `{"type":"try_again","request_id":"x","queue_state":"paused_capacity","queue_state_reason":"busy GPUs"}`),
		jsonReply(200, `{"type":"try_again","request_id":"x","queue_state":"active"}`),
		jsonReply(200, `{"type":"try_again","request_id":"x","queue_state":"weird"}`),
		jsonReply(200, `{"type":"try_again","request_id":"x","queue_state_reason":"why"}`))
	if err != nil || res.Response == nil {
		t.Fatal(err)
	}
	polls := f.requests("retrieve_future")
	if len(polls) != 5 {
		t.Fatalf("%d polls", len(polls))
	}
	for i, p := range polls {
		if p.Header.Get("X-Tinker-Request-Iteration") != fmt.Sprint(i) {
			t.Fatalf("poll %d iteration %q", i, p.Header.Get("X-Tinker-Request-Iteration"))
		}
		if (p.Header.Get("X-Tinker-Create-Promise-Roundtrip-Time") != "") != (i == 0) {
			t.Fatalf("poll %d roundtrip header", i)
		}
	}
	if len(fc.Sleeps()) != 0 {
		t.Fatalf("try_again slept %v", fc.Sleeps())
	}
	qs := ev.of(EventQueueState)
	if len(qs) != 3 || qs[0].QueueState != QueuePausedCapacity || qs[0].Reason != "busy GPUs" || qs[0].SamplerID != "sess-1:sample:0" ||
		qs[1].QueueState != QueueActive || qs[2].QueueState != QueueUnknown || qs[2].Reason != "why" {
		t.Fatalf("queue events %+v", qs)
	}
}

func TestPollCompleteMetadata(t *testing.T) {
	res, f, _, _, err := runSample(t, nil, jsonReply(200, `{"status":"complete_metadata","response_payload_size":7340032}`))
	if err != nil || res.Response == nil {
		t.Fatal(err)
	}
	polls := f.requests("retrieve_future")
	if len(polls) != 2 || !strings.Contains(string(polls[1].Body), `"allow_metadata_only":false`) {
		t.Fatalf("polls %d, second body %s", len(polls), polls[1].Body)
	}
	_, _, _, _, err = runSample(t, nil, jsonReply(200, `{"status":"complete_metadata","response_payload_size":1}`),
		jsonReply(200, `{"status":"complete_metadata","response_payload_size":1}`))
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		t.Fatalf("second complete_metadata: %v", err)
	}
}

func TestPollFailedFuture(t *testing.T) {
	for cat, want := range map[string]Category{"user": CategoryUser, "server": CategoryServer, "unknown": CategoryUnknown, "Weird": CategoryUnknown, "": CategoryUnknown} {
		body := `{"error":"Prompt too long","category":"` + cat + `"}`
		_, f, _, _, err := runSample(t, nil, jsonReply(200, body))
		var rf *RequestFailedError
		if !errors.As(err, &rf) || rf.Category != want || rf.Message != "Prompt too long" || !strings.HasPrefix(rf.RequestID, "sess-1:sample:0:") {
			t.Fatalf("category %q: %v", cat, err)
		}
		if IsRetryable(err) || len(f.requests("asample")) != 1 {
			t.Fatalf("failed future was retried")
		}
	}
}

func TestPollJSONResultAndGarbage(t *testing.T) {
	res, _, _, _, err := runSample(t, nil, jsonReply(200, `{"type":"sample","sequences":[{"stop_reason":"length","tokens":[9],"logprobs":[-1.5]}],"prompt_logprobs":null}`))
	if err != nil || res.Response.Sequences[0].StopReason != StopReasonLength || res.Response.Sequences[0].Tokens[0] != 9 {
		t.Fatalf("%+v %v", res, err)
	}
	_, _, _, _, err = runSample(t, nil, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("<html>oops</html>"))
	})
	var pe *ProtocolError
	if !errors.As(err, &pe) || IsRetryable(err) {
		t.Fatalf("non-JSON 200: %v", err)
	}
	_, _, _, _, err = runSample(t, nil, protoReply([]byte{0x0a, 0x05}))
	if !errors.As(err, &pe) {
		t.Fatalf("bad protobuf: %v", err)
	}
}

// TestReplySizeIsBounded: a reply over Timing.MaxReplyBytes is a protocol error, not
// retried, whether its Content-Length says so or it streams without one, and without end; a
// reply of exactly the bound is read.
func TestReplySizeIsBounded(t *testing.T) {
	const limit = 1 << 20
	small := func(c *Config) { c.Timing.MaxReplyBytes = limit }
	result := `{"type":"sample","sequences":[{"stop_reason":"length","tokens":[9],"logprobs":[-1.5]}]}`
	padded := func(n int) reply { // the result, then spaces up to n bytes in all
		return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(result + strings.Repeat(" ", n-len(result))))
		}
	}
	if res, _, _, _, err := runSample(t, small, padded(limit)); err != nil || res.Response.Sequences[0].Tokens[0] != 9 {
		t.Fatalf("a reply of exactly the bound: %+v %v", res, err)
	}
	declared := func(w http.ResponseWriter, r *http.Request, b []byte) {
		w.Header().Set("Content-Length", fmt.Sprint(limit+1))
		padded(limit+1)(w, r, b)
	}
	endless := func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(result))
		spaces := []byte(strings.Repeat(" ", 64<<10))
		for r.Context().Err() == nil {
			if _, err := w.Write(spaces); err != nil {
				return // the client stopped reading
			}
		}
	}
	for name, rep := range map[string]reply{"streamed": padded(limit + 1), "declared": declared, "endless": endless} {
		_, f, _, _, err := runSample(t, small, rep)
		var pe *ProtocolError
		if !errors.As(err, &pe) || IsRetryable(err) || !strings.Contains(err.Error(), "larger than 1048576 bytes") {
			t.Fatalf("%s reply over the bound: %v", name, err)
		}
		if n := len(f.requests("retrieve_future")); n != 1 {
			t.Fatalf("%s reply over the bound: %d polls, want 1 (no retry)", name, n)
		}
	}
}

// TestPoll408And5xxRepoll: a 408 and a first 5xx are polled again at once (§4.2); a 5xx
// after another waits Timing.PollServerErrorBase (10 ms), doubled per 5xx in a row.
func TestPoll408And5xxRepoll(t *testing.T) {
	res, f, fc, ev, err := runSample(t, nil,
		jsonReply(408, `{"type":"try_again","request_id":"x","queue_state":"paused_rate_limit"}`),
		bareStatus(408), jsonReply(500, `{"error":"Internal Server Error"}`), jsonReply(503, `{}`))
	if err != nil || res.Response == nil {
		t.Fatal(err)
	}
	if sleeps := fc.Sleeps(); len(f.requests("retrieve_future")) != 5 || len(sleeps) != 1 || sleeps[0] != 10*time.Millisecond {
		t.Fatalf("%d polls, sleeps %v: want 5 polls and one 10ms sleep, after the second 5xx", len(f.requests("retrieve_future")), sleeps)
	}
	qs := ev.of(EventQueueState)
	if len(qs) != 1 || qs[0].QueueState != QueuePausedRateLimit || qs[0].Reason != "concurrent sampler weights limit hit" {
		t.Fatalf("queue events %+v", qs)
	}
	// A 5xx re-poll is a retry of the poll layer (tinkerfleet_tinker_retries_total{layer=poll});
	// a 408 is the long poll's "not yet", no retry.
	rs := ev.of(EventRetry)
	if len(rs) != 2 || rs[0].Layer != LayerPoll || rs[0].StatusCode != 500 || rs[1].StatusCode != 503 ||
		rs[0].Delay != 0 || rs[1].Delay != 10*time.Millisecond || rs[0].Attempt != 0 || rs[1].Attempt != 1 || rs[0].Err == nil {
		t.Fatalf("retry events %+v, want the two 5xx re-polls", rs)
	}
}

func TestPoll429AndConnectionBackoff(t *testing.T) {
	res, _, fc, ev, err := runSample(t, nil,
		jsonReply(429, `{"detail":"slow"}`), jsonReply(429, `{}`), truncated, jsonReply(429, `{}`),
		jsonReply(500, `{}`),       // any reply outside the backoff class resets the exponent
		truncated, bareStatus(400)) // a bare 400 is a connection error (§1.4)
	if err != nil || res.Response == nil {
		t.Fatal(err)
	}
	want := []time.Duration{1, 2, 4, 8, 1, 2}
	got := fc.Sleeps()
	if len(got) != len(want) {
		t.Fatalf("sleeps %v", got)
	}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("sleeps %v", got)
		}
	}
	if rl := ev.of(EventRateLimited); len(rl) != 3 || rl[0].Endpoint != "retrieve_future" || rl[2].Delay != 8*time.Second {
		t.Fatalf("rate-limited events %+v", rl)
	}
	for _, e := range ev.of(EventRetry) {
		if e.Layer != LayerPoll {
			t.Fatalf("retry layer %v", e.Layer)
		}
	}
}

func TestPollTimeoutIsConnectionBackoff(t *testing.T) {
	res, f, fc, _, err := runSample(t, func(c *Config) { c.Timing.PollTimeout = 50 * time.Millisecond }, block)
	if err != nil || res.Response == nil {
		t.Fatal(err)
	}
	if len(f.requests("retrieve_future")) != 2 || len(fc.Sleeps()) != 1 || fc.Sleeps()[0] != time.Second {
		t.Fatalf("polls %d sleeps %v", len(f.requests("retrieve_future")), fc.Sleeps())
	}
}

// TestAPollsTimeoutRestartsWithEachPieceOfItsBody: a result that comes slowly, each piece
// well within the poll timeout, is read to its end though the whole takes more than twice
// the timeout (httpx's read timeout, §1.3); re-polling it would cut it off again each time.
// A body that stops coming still ends at the timeout.
func TestAPollsTimeoutRestartsWithEachPieceOfItsBody(t *testing.T) {
	const timeout = time.Second
	const pieces = 12 // one each timeout/5: 2.4 s in all
	result := encodeResponse(simpleResponse())
	if len(result) < pieces {
		t.Fatalf("a result of %d bytes cannot come in %d pieces", len(result), pieces)
	}
	trickle := func(stallAfter int) reply {
		return func(w http.ResponseWriter, r *http.Request, _ []byte) {
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.WriteHeader(200)
			size := (len(result) + pieces - 1) / pieces
			for i, rest := 0, result; len(rest) > 0; i++ {
				if i == stallAfter {
					<-r.Context().Done()
					return
				}
				n := min(size, len(rest))
				_, _ = w.Write(rest[:n])
				w.(http.Flusher).Flush()
				rest = rest[n:]
				select {
				case <-time.After(timeout / 5):
				case <-r.Context().Done():
					return
				}
			}
		}
	}
	slow := func(c *Config) { c.Timing.PollTimeout = timeout }

	res, f, fc, _, err := runSample(t, slow, trickle(-1))
	if err != nil || !reflect.DeepEqual(res.Response, simpleResponse()) {
		t.Fatalf("a slow result: %+v, %v", res, err)
	}
	if polls := len(f.requests("retrieve_future")); polls != 1 || len(fc.Sleeps()) != 0 {
		t.Fatalf("a slow result took %d polls and sleeps %v; want it read by its one poll", polls, fc.Sleeps())
	}

	res, f, fc, _, err = runSample(t, slow, trickle(pieces/2))
	if err != nil || res.Response == nil {
		t.Fatal(err)
	}
	if polls := len(f.requests("retrieve_future")); polls != 2 || len(fc.Sleeps()) != 1 {
		t.Fatalf("a result that stopped coming: %d polls, sleeps %v; want it timed out and polled again", polls, fc.Sleeps())
	}
}

func TestPoll400Budget(t *testing.T) {
	bad := jsonReply(400, `{"detail":"bad"}`)
	res, _, fc, ev, err := runSample(t, nil, bad, bad, bad)
	if err != nil || res.Response == nil || len(fc.Sleeps()) != 0 {
		t.Fatalf("3 bad requests: %v", err)
	}
	if rs := ev.of(EventRetry); len(rs) != 3 || rs[2].Layer != LayerPoll || rs[2].StatusCode != 400 || rs[2].Attempt != 2 {
		t.Fatalf("retry events %+v, want the three re-polls of the poll layer", rs)
	}
	_, f, _, _, err := runSample(t, nil, bad, bad, bad, bad)
	var se *StatusError
	var pe *ProtocolError
	if !errors.As(err, &pe) || !errors.As(err, &se) || se.StatusCode != 400 || IsRetryable(err) || len(f.requests("retrieve_future")) != 4 {
		t.Fatalf("4 bad requests: %v", err)
	}
	// A 408 with a JSON body resets the budget.
	res, _, _, _, err = runSample(t, nil, bad, bad, jsonReply(408, `{"type":"try_again"}`), bad, bad, bad)
	if err != nil || res.Response == nil {
		t.Fatalf("budget not reset by 408: %v", err)
	}
	// A compressed body is a body, although Go's transport drops the Content-Length of a
	// reply it decompresses: not a bare 400 (§1.4), which would sleep as a connection error.
	gz := gzipReply(400, `{"detail":"bad"}`)
	res, _, fc, _, err = runSample(t, nil, gz, gz, gz)
	if err != nil || res.Response == nil || len(fc.Sleeps()) != 0 {
		t.Fatalf("3 compressed bad requests: %v, sleeps %v", err, fc.Sleeps())
	}
}

// gzipReply answers status with body compressed, and its Content-Length.
func gzipReply(status int, body string) reply {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = io.WriteString(zw, body)
	_ = zw.Close()
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Length", fmt.Sprint(b.Len()))
		w.WriteHeader(status)
		_, _ = w.Write(b.Bytes())
	}
}

func TestPoll402BillingPause(t *testing.T) {
	pay := jsonReply(402, `{"detail":"payment required"}`)
	res, _, fc, ev, err := runSample(t, nil, pay)
	if err != nil || res.Response == nil || !reflect.DeepEqual(fc.Sleeps(), []time.Duration{5 * time.Second}) {
		t.Fatalf("402: %v, sleeps %v", err, fc.Sleeps())
	}
	if bp := ev.of(EventBillingPaused); len(bp) != 1 || bp[0].Endpoint != "retrieve_future" {
		t.Fatalf("billing events %+v", bp)
	}
	// The window (here 10 s, from client/config) expires: the 402 becomes fatal.
	f := newFake(t)
	f.set("client/config", jsonReply(200, `{"billing_exception_max_pause_duration_sec": 10}`))
	f.set("retrieve_future", pay)
	c, fc, _ := dial(t, f, nil)
	_, err = sampler(t, c).Sample(testCtx(t), basicRequest())
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 402 || IsRetryable(err) || len(fc.Sleeps()) != 3 || len(f.requests("retrieve_future")) != 4 {
		t.Fatalf("expired window: %v, sleeps %v, polls %d", err, fc.Sleeps(), len(f.requests("retrieve_future")))
	}
}

func TestPoll410ResubmitsWithNewSeqID(t *testing.T) {
	res, f, fc, ev, err := runSample(t, nil, jsonReply(410, `{"detail":"promise expired"}`))
	if err != nil || res.Response == nil {
		t.Fatal(err)
	}
	ids := seqIDs(t, f.requests("asample"))
	if len(ids) != 2 || ids[1] != ids[0]+1 || res.Attempts != 2 || res.Submissions != 2 || res.SeqID != ids[1] {
		t.Fatalf("seq ids %v, result %+v", ids, res)
	}
	r := ev.of(EventRetry)
	if len(r) != 1 || r[0].Layer != LayerSample || r[0].Delay < 375*time.Millisecond || r[0].Delay > 625*time.Millisecond ||
		fc.Sleeps()[0] != r[0].Delay {
		t.Fatalf("retry events %+v", r)
	}
	polls := f.requests("retrieve_future")
	if polls[1].Header.Get("X-Tinker-Request-Iteration") != "0" {
		t.Fatal("resubmitted future did not restart its iteration count")
	}
}

// TestPollOther2xxIsClassifiedLikeA200: the SDK's HTTP layer (httpx) raises only for a status
// outside 2xx, so any 2xx poll reply goes through the content classification of §3.7/§4.2: a
// 202 try_again polls again, a 202 or 206 protobuf result is the result, and a 204 with no body
// fails as the SDK's JSON decode of it does.
func TestPollOther2xxIsClassifiedLikeA200(t *testing.T) {
	tryAgain202 := jsonReply(http.StatusAccepted, `{"type":"try_again","request_id":"x","queue_state":"active"}`)
	res, f, fc, _, err := runSample(t, nil, tryAgain202, tryAgain202)
	if err != nil || res.Response == nil || len(fc.Sleeps()) != 0 || len(f.requests("retrieve_future")) != 3 {
		t.Fatalf("202 try_again: %v, sleeps %v", err, fc.Sleeps())
	}
	for _, code := range []int{http.StatusAccepted, http.StatusPartialContent} {
		want := simpleResponse()
		b := encodeResponse(want)
		res, _, _, _, err = runSample(t, nil, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.WriteHeader(code)
			_, _ = w.Write(b)
		})
		if err != nil || res.Response == nil || !reflect.DeepEqual(res.Response.Sequences, want.Sequences) {
			t.Fatalf("%d protobuf result: %+v, %v", code, res, err)
		}
	}
	_, f, _, _, err = runSample(t, nil, bareStatus(http.StatusNoContent))
	var pe *ProtocolError
	if !errors.As(err, &pe) || IsRetryable(err) || len(f.requests("asample")) != 1 {
		t.Fatalf("204 without a body: %v", err)
	}
}

func TestPollFatalStatuses(t *testing.T) {
	for _, code := range []int{401, 403, 404, 409, 422} {
		_, f, _, _, err := runSample(t, nil, jsonReply(code, `{"detail":"no"}`))
		var se *StatusError
		var pe *ProtocolError
		if !errors.As(err, &pe) || !errors.As(err, &se) || se.StatusCode != code || IsRetryable(err) || len(f.requests("asample")) != 1 {
			t.Fatalf("status %d: %v", code, err)
		}
	}
}

// recDispatcher records the gate's calls, wrapping the default one.
type recDispatcher struct {
	inner localDispatcher
	f     *fakeTinker
	mu    sync.Mutex
	log   []string
}

func (d *recDispatcher) note(s string) {
	d.mu.Lock()
	d.log = append(d.log, s)
	d.mu.Unlock()
}

func (d *recDispatcher) Acquire(ctx context.Context, est int64) (func(bool), error) {
	d.note(fmt.Sprintf("acquire %d", est))
	return func(accepted bool) {
		d.note(fmt.Sprintf("release accepted=%v polls=%d", accepted, len(d.f.requests("retrieve_future"))))
	}, nil
}

func (d *recDispatcher) Wait(ctx context.Context) error { d.note("wait"); return d.inner.Wait(ctx) }

func (d *recDispatcher) Backoff(ctx context.Context, reason string, dur time.Duration) {
	d.note(fmt.Sprintf("backoff %s %v", reason, dur))
	d.inner.Backoff(ctx, reason, dur)
}

// The dispatcher's release says whether the service took the sample: the worker's gate
// counts only those as held (its capacity learning). A 400 took nothing; a 2xx whose body has
// no request_id is a protocol error, but the service runs the sample.
func TestAsampleReleaseSaysWhetherTheServiceTookIt(t *testing.T) {
	for _, c := range []struct {
		status   int
		body     string
		accepted bool
	}{
		{400, `{"detail":"bad prompt"}`, false},
		{200, `{}`, true},
	} {
		f := newFake(t)
		fc := newFakeClock()
		d := &recDispatcher{inner: localDispatcher{clock: fc}, f: f}
		f.push("asample", jsonReply(c.status, c.body))
		cl, _, _ := dial(t, f, func(cfg *Config) { cfg.Dispatcher = d; cfg.Timing.Clock = fc })
		if _, err := sampler(t, cl).Sample(testCtx(t), basicRequest()); err == nil {
			t.Fatalf("%d from asample ended in no error", c.status)
		}
		want := []string{"acquire 30", "wait", fmt.Sprintf("release accepted=%v polls=0", c.accepted)}
		if !reflect.DeepEqual(d.log, want) {
			t.Errorf("%d: dispatcher log %v, want %v", c.status, d.log, want)
		}
	}
}

// §5.1/§5.3: asample 429 → dispatcher backoff (1 s; 5 s over 128 KiB), same
// seq_id, permits released before polling.
func TestAsample429Backoff(t *testing.T) {
	f := newFake(t)
	fc := newFakeClock()
	d := &recDispatcher{inner: localDispatcher{clock: fc}, f: f}
	f.push("asample", jsonReply(429, `{"detail":"sampler busy"}`))
	c, _, ev := dial(t, f, func(cfg *Config) { cfg.Dispatcher = d; cfg.Timing.Clock = fc })
	s := sampler(t, c)
	res, err := s.Sample(testCtx(t), basicRequest())
	if err != nil {
		t.Fatal(err)
	}
	ids := seqIDs(t, f.requests("asample"))
	if len(ids) != 2 || ids[0] != ids[1] || res.Attempts != 1 || res.Submissions != 2 {
		t.Fatalf("seq ids %v result %+v", ids, res)
	}
	want := []string{"acquire 30", "wait", "backoff rate_limited 1s", "wait", "release accepted=true polls=0"}
	if !reflect.DeepEqual(d.log, want) {
		t.Fatalf("dispatcher log %v", d.log)
	}
	if !reflect.DeepEqual(fc.Sleeps(), []time.Duration{time.Second}) {
		t.Fatalf("sleeps %v", fc.Sleeps())
	}
	if rl := ev.of(EventRateLimited); len(rl) != 1 || rl[0].Endpoint != "asample" || rl[0].Delay != time.Second || rl[0].SamplerID != s.ID() {
		t.Fatalf("events %+v", rl)
	}
	if h0, h1 := f.requests("asample")[0].Header.Get("X-Idempotency-Key"), f.requests("asample")[1].Header.Get("X-Idempotency-Key"); h0 == h1 {
		t.Fatal("idempotency key reused across asample calls")
	}

	// A prompt estimated above 128 KiB backs off 5 s.
	f.push("asample", jsonReply(429, `{}`))
	big := SampleRequest{Prompt: EncodedText(make([]int, 13108))}
	if _, err := s.Sample(testCtx(t), big); err != nil {
		t.Fatal(err)
	}
	if got := d.log[len(d.log)-3]; got != "backoff rate_limited 5s" {
		t.Fatalf("large prompt log %v", d.log)
	}
}

func TestAsample402InWindowBacksOff(t *testing.T) {
	f := newFake(t)
	f.push("asample", jsonReply(402, `{"detail":"pay"}`))
	c, fc, ev := dial(t, f, nil)
	res, err := sampler(t, c).Sample(testCtx(t), basicRequest())
	if err != nil || res.Submissions != 2 {
		t.Fatalf("%v %+v", err, res)
	}
	ids := seqIDs(t, f.requests("asample"))
	if ids[0] != ids[1] || !reflect.DeepEqual(fc.Sleeps(), []time.Duration{time.Second}) || len(ev.of(EventBillingPaused)) != 1 {
		t.Fatalf("ids %v sleeps %v", ids, fc.Sleeps())
	}
	// Once the window is over the 402 is an error and not retried.
	f2 := newFake(t)
	f2.set("client/config", jsonReply(200, `{"billing_exception_max_pause_duration_sec": 5}`))
	f2.set("asample", jsonReply(402, `{"detail":"pay"}`))
	c2, _, _ := dial(t, f2, nil)
	_, err = sampler(t, c2).Sample(testCtx(t), basicRequest())
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 402 || len(f2.requests("asample")) != 7 {
		t.Fatalf("402 after window: %v after %d", err, len(f2.requests("asample")))
	}
}

// §6.3: a request that times out is retried as a connection error is (the SDK's
// retryable_exceptions: timeouts and APIConnectionError), at the sample layer too once the
// §6.2 loop's 300 s are spent; its timeout is the request's own, not the caller's context.
func TestTimedOutSubmissionsAreRetriedAtEachLayer(t *testing.T) {
	f := newFake(t)
	for range 15 {
		f.push("asample", block)
	}
	c, _, ev := dial(t, f, func(c *Config) { c.Timing.RequestTimeout = 20 * time.Millisecond })
	res, err := sampler(t, c).Sample(testCtx(t), basicRequest())
	if err != nil {
		t.Fatalf("15 submissions that timed out, then one answered: %v", err)
	}
	// The first attempt's 15 submissions time out: 14 retries of the §6.2 loop, which spends
	// its 300 s on them, then one of the §6.3 layer. The second attempt's submission is
	// answered at once, but a loaded machine under -race can take more than 20 ms to bring
	// the answer in: then it too timed out, and the loop sent it again.
	if res.Attempts != 2 || res.Submissions < 16 {
		t.Fatalf("result %+v: want 2 attempts of 16 submissions (more if an answered one came late)", res)
	}
	var layers []RetryLayer
	for _, e := range ev.of(EventRetry) {
		if e.Layer == LayerSubmit || e.Layer == LayerSample {
			layers = append(layers, e.Layer)
		}
	}
	want := []RetryLayer{}
	for range 14 {
		want = append(want, LayerSubmit)
	}
	want = append(want, LayerSample)
	for range res.Submissions - 16 {
		want = append(want, LayerSubmit)
	}
	if !reflect.DeepEqual(layers, want) {
		t.Fatalf("retry layers %v, want %v", layers, want)
	}
}

// §6.2: asample 5xx retried with 1,2,4,8,16,30… s, truncated to the 300 s
// deadline, then the §6.3 layer resubmits with a new seq_id.
func TestSubmissionRetryLoop(t *testing.T) {
	f := newFake(t)
	for range 15 {
		f.push("asample", jsonReply(503, `{"detail":"unavailable"}`))
	}
	c, fc, ev := dial(t, f, nil)
	res, err := sampler(t, c).Sample(testCtx(t), basicRequest())
	if err != nil {
		t.Fatal(err)
	}
	sl := fc.Sleeps()
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30, 30, 30, 30, 30, 30, 29}
	if len(sl) != len(want)+1 {
		t.Fatalf("sleeps %v", sl)
	}
	var sum time.Duration
	for i, w := range want {
		if sl[i] != w*time.Second {
			t.Fatalf("sleep %d = %v, all %v", i, sl[i], sl)
		}
		sum += sl[i]
	}
	if sum != 300*time.Second {
		t.Fatalf("submit loop slept %v", sum)
	}
	ids := seqIDs(t, f.requests("asample"))
	if len(ids) != 16 || ids[14] != ids[0] || ids[15] != ids[0]+1 || res.Attempts != 2 || res.Submissions != 16 {
		t.Fatalf("ids %v res %+v", ids, res)
	}
	layers := map[RetryLayer]int{}
	for _, e := range ev.of(EventRetry) {
		layers[e.Layer]++
	}
	if layers[LayerSubmit] != 14 || layers[LayerSample] != 1 {
		t.Fatalf("retry layers %v", layers)
	}
	// A non-retryable status is not retried at any layer.
	f.push("asample", jsonReply(422, `{"detail":"bad"}`))
	before := len(f.requests("asample"))
	_, err = sampler(t, c).Sample(testCtx(t), basicRequest())
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 422 || len(f.requests("asample")) != before+1 {
		t.Fatalf("422: %v", err)
	}
}

// §6.3 stuck detection: with the default 7200 s, a future that never resolves
// (429 forever) ends with ErrProgressTimeout.
func TestProgressTimeout(t *testing.T) {
	f := newFake(t)
	f.set("retrieve_future", jsonReply(429, `{}`))
	c, fc, _ := dial(t, f, nil)
	start := fc.Now()
	_, err := sampler(t, c).Sample(testCtx(t), basicRequest())
	if !errors.Is(err, ErrProgressTimeout) || IsRetryable(err) {
		t.Fatalf("err %v", err)
	}
	if el := fc.Now().Sub(start); el <= 7200*time.Second || el > 7200*time.Second+31*time.Second {
		t.Fatalf("gave up after %v", el)
	}
	// It names what the polls met, as the submit loop's stuck error does.
	if !strings.Contains(err.Error(), "(last error: ") || !strings.Contains(err.Error(), "429") {
		t.Fatalf("err %v: want the last poll failure named", err)
	}
	// Unlimited attempts with new seq_ids until the (here 60 s) timeout.
	f2 := newFake(t)
	f2.set("retrieve_future", jsonReply(410, `{}`))
	c2, _, _ := dial(t, f2, func(cfg *Config) { cfg.Timing.ProgressTimeout = 60 * time.Second })
	_, err = sampler(t, c2).Sample(testCtx(t), basicRequest())
	ids := seqIDs(t, f2.requests("asample"))
	if !errors.Is(err, ErrProgressTimeout) || len(ids) < 8 || ids[len(ids)-1] != ids[0]+int64(len(ids)-1) {
		t.Fatalf("410 forever: %v after %d attempts", err, len(ids))
	}
}

func TestSampleNoRetriesFlag(t *testing.T) {
	f := newFake(t)
	f.set("client/config", jsonReply(200, `{"sample_no_retries": true}`))
	f.push("retrieve_future", jsonReply(410, `{}`))
	c, _, _ := dial(t, f, nil)
	_, err := sampler(t, c).Sample(testCtx(t), basicRequest())
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 410 || len(f.requests("asample")) != 1 {
		t.Fatalf("no-retries: %v", err)
	}
}

type blockingDispatcher struct{}

func (blockingDispatcher) Acquire(ctx context.Context, _ int64) (func(bool), error) {
	return func(bool) {}, nil
}
func (blockingDispatcher) Wait(ctx context.Context) error                 { <-ctx.Done(); return ctx.Err() }
func (blockingDispatcher) Backoff(context.Context, string, time.Duration) {}

func TestCancellationIsPrompt(t *testing.T) {
	f := newFake(t)
	f.set("retrieve_future", block)
	c, _, _ := dial(t, f, func(cfg *Config) { cfg.Timing.Clock = nil }) // real clock
	s := sampler(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Sample(ctx, basicRequest())
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("poll cancel: %v after %v", err, time.Since(start))
	}
	// Cancelled while the dispatcher holds the submission back.
	c2, _, _ := dial(t, f, func(cfg *Config) { cfg.Dispatcher = blockingDispatcher{} })
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	_, err = sampler(t, c2).Sample(ctx2, basicRequest())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dispatch cancel: %v", err)
	}
	// Cancelled during a 30 s poll backoff on the real clock.
	f3 := newFake(t)
	f3.set("retrieve_future", jsonReply(429, `{}`))
	c3, _, _ := dial(t, f3, func(cfg *Config) { cfg.Timing.Clock = nil })
	ctx3, cancel3 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel3()
	start = time.Now()
	_, err = sampler(t, c3).Sample(ctx3, basicRequest())
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("backoff cancel: %v after %v", err, time.Since(start))
	}
}

func TestConcurrentSamplesUniqueSeqIDs(t *testing.T) {
	f := newFake(t)
	c, _, _ := dial(t, f, nil)
	s := sampler(t, c)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Sample(testCtx(t), basicRequest())
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int64]bool{}
	for _, id := range seqIDs(t, f.requests("asample")) {
		if seen[id] {
			t.Fatalf("duplicate seq_id %d", id)
		}
		seen[id] = true
	}
	if len(seen) != 40 {
		t.Fatalf("%d seq ids", len(seen))
	}
}

func TestSampleValidation(t *testing.T) {
	f := newFake(t)
	c, _, _ := dial(t, f, nil)
	s := sampler(t, c)
	bad := []SampleRequest{
		{},
		{Prompt: EncodedText([]int{1}), NumSamples: -1},
		{Prompt: EncodedText([]int{1}), Params: SamplingParams{Stop: Stop{Strings: []string{"a"}, Tokens: []int{1}}}},
	}
	for i, r := range bad {
		if _, err := s.Sample(testCtx(t), r); err == nil {
			t.Fatalf("request %d accepted", i)
		}
	}
	if len(f.requests("asample")) != 0 {
		t.Fatal("invalid request was sent")
	}
}

// TestAReplyThatOnlyDeclaresItsSizeTakesNoMemoryForIt: a reply that declares a large
// Content-Length (under 64 MiB) made readBody allocate all of it before a byte arrived: 16
// such polls held 1 GB though the peer sent nothing, and a worker runs up to 400 polls, none
// of them counted by its result memory. Memory is taken as bytes arrive now.
func TestAReplyThatOnlyDeclaresItsSizeTakesNoMemoryForIt(t *testing.T) {
	const n = 16
	const declared = 63 << 20
	f := newFake(t)
	release := make(chan struct{})
	var polls atomic.Int32
	f.set("retrieve_future", func(w http.ResponseWriter, r *http.Request, _ []byte) {
		polls.Add(1)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Header().Set("Content-Length", "66060288") // 63 MiB, nothing sent
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	c, _, _ := dial(t, f, func(c *Config) { c.Timing.PollTimeout = 5 * time.Second; c.Timing.Clock = nil })
	s := sampler(t, c)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { _, _ = s.Sample(ctx, basicRequest()) })
	}
	for deadline := time.Now().Add(30 * time.Second); polls.Load() < n && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the clients read the headers
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	cancel() // the samples end here: a body cut short would be polled again
	close(release)
	wg.Wait()
	grew := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d polls, each declaring %d MiB and sending 0 bytes: heap grew by %d MiB", n, declared>>20, grew>>20)
	if grew > 256<<20 {
		t.Fatalf("heap grew by %d MiB for replies that sent no byte", grew>>20)
	}
}

// TestAFailedFuturesMessageHasNoCredential: a failed future's message that echoes the
// credential (the API key, or a JWT) is scrubbed as an error reply's body is: the worker
// writes it into the result line (failed_future).
func TestAFailedFuturesMessageHasNoCredential(t *testing.T) {
	msg := `{"error":"request by key ` + string(testKey) + ` with token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln failed","category":"user"}`
	_, _, _, _, err := runSample(t, nil, jsonReply(200, msg))
	var rf *RequestFailedError
	if !errors.As(err, &rf) {
		t.Fatalf("want a failed future, got %v", err)
	}
	if strings.Contains(err.Error(), string(testKey)) || strings.Contains(err.Error(), "eyJhbGci") {
		t.Fatalf("credential in the error: %v", err)
	}
}

// TestAsample410IsNotRetried: 410 is the poll's "promise expired" (§4.2), which re-runs the
// sample with a new seq_id (§6.3). On asample it is one of the other 4xx, which no layer
// retries (§5.3, §7.1): retried, a sampling session the service says is gone was sent a new
// sample every 10 s for the two hours of the no-progress timeout.
func TestAsample410IsNotRetried(t *testing.T) {
	f := newFake(t)
	f.set("asample", jsonReply(410, `{"detail":"gone"}`))
	c, _, _ := dial(t, f, nil)
	_, err := sampler(t, c).Sample(testCtx(t), basicRequest())
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != 410 || IsRetryable(err) || len(f.requests("asample")) != 1 {
		t.Fatalf("asample 410: %v after %d submissions, want the 410 after one", err, len(f.requests("asample")))
	}
}
