package tinker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sampler is a sampling session (§3.5). It is safe for concurrent use; every
// Sample call is independent (§8: no ordering guarantees).
type Sampler struct {
	c   *Client
	id  string
	seq atomic.Int64  // seq_id counter with a random per-object base (§8)
	sem chan struct{} // sample_max_concurrent_requests (§5.4, §6.3)

	mu           sync.Mutex
	inFlight     int       // Sample calls inside the retry handler
	lastProgress time.Time // stuck detection (§6.3)
	lastPauseLog time.Time // queue-state log debounce (§4.3)
}

type createSamplingSessionBody struct {
	SessionID            string `json:"session_id"`
	SamplingSessionSeqID int64  `json:"sampling_session_seq_id"`
	BaseModel            string `json:"base_model,omitempty"`
	ModelPath            string `json:"model_path,omitempty"`
	Type                 string `json:"type"`
}

// NewSampler creates a sampling session for a base model and/or a tinker://
// checkpoint path (§3.5; 10 HTTP retries, not the 300 s loop).
func (c *Client) NewSampler(ctx context.Context, spec SamplerSpec) (*Sampler, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	session := c.SessionID()
	if session == "" {
		return nil, errors.New("tinker: NewSampler needs a session (Config.Sessionless is set)")
	}
	if spec.BaseModel == "" && spec.ModelPath == "" {
		return nil, errors.New("tinker: SamplerSpec needs BaseModel or ModelPath")
	}
	if spec.ModelPath != "" && !strings.HasPrefix(spec.ModelPath, "tinker://") {
		return nil, fmt.Errorf("tinker: model path %q must start with tinker://", spec.ModelPath)
	}
	id, err := c.createSamplingSession(ctx, session, spec)
	var se *StatusError
	if errors.As(err, &se) && se.StatusCode == http.StatusNotFound && c.sessionLost(ctx, session) {
		// The service no longer knows the session (a 404 may also be a checkpoint it does not
		// have: the heartbeat tells them apart). Once more, in a new session.
		if err := c.renewSession(ctx, session); err != nil {
			return nil, err
		}
		id, err = c.createSamplingSession(ctx, c.SessionID(), spec)
	}
	if err != nil {
		return nil, err
	}
	return c.Sampler(id), nil
}

// createSamplingSession sends create_sampling_session in session and returns the sampling
// session id.
func (c *Client) createSamplingSession(ctx context.Context, session string, spec SamplerSpec) (string, error) {
	body := createSamplingSessionBody{SessionID: session, SamplingSessionSeqID: c.samplerSeq.Add(1) - 1,
		BaseModel: spec.BaseModel, ModelPath: spec.ModelPath, Type: "create_sampling_session"}
	var out struct {
		SamplingSessionID string `json:"sampling_session_id"`
	}
	cl := &call{name: "create_sampling_session", method: http.MethodPost, path: "api/v1/create_sampling_session",
		body: mustJSON(body), maxRetries: c.t.HTTPMaxRetries}
	if err := c.doJSON(ctx, cl, &out); err != nil {
		return "", fmt.Errorf("tinker: create sampling session: %w", err)
	}
	if out.SamplingSessionID == "" {
		return "", &ProtocolError{Endpoint: cl.name, Msg: "reply has no sampling_session_id"}
	}
	return out.SamplingSessionID, nil
}

// Sampler returns a Sampler for an existing sampling session id (for example one
// created by another process). Its seq_ids start at a random base of the form
// 1e9·(r+1), r < 1e9, so that several objects sharing one session do not collide
// (§8).
func (c *Client) Sampler(samplingSessionID string) *Sampler {
	s := &Sampler{c: c, id: samplingSessionID, sem: make(chan struct{}, max(c.flags.SampleMaxConcurrentRequests, 1))}
	s.seq.Store(1_000_000_000 * (rand.Int64N(1_000_000_000) + 1))
	return s
}

// ID returns the sampling session id.
func (s *Sampler) ID() string { return s.id }

// Info fetches the sampler's base model (§3.9).
func (s *Sampler) Info(ctx context.Context) (*SamplerInfo, error) { return s.c.SamplerInfo(ctx, s.id) }

// Sample runs one sample: the retry handler of §6.3 (unless the server flag
// sample_no_retries is set) around attempts of §5.1. Each attempt estimates the
// prompt bytes, allocates a new seq_id, acquires the Dispatcher, submits asample
// through the §6.2 loop (waiting out Dispatcher backoffs and recording new ones
// on 429 or 402-in-window), releases the Dispatcher and polls the future (§4).
// Retryable failures (see IsRetryable) re-run the attempt after
// min(0.5 s·2^k, 10 s) ±25 %, without an attempt limit, until no request of this
// sampler made progress for Timing.ProgressTimeout (ErrProgressTimeout).
func (s *Sampler) Sample(ctx context.Context, req SampleRequest) (*SampleResult, error) {
	if s.c.closed.Load() {
		return nil, ErrClosed
	}
	if err := req.validate(); err != nil {
		return nil, err
	}
	res := &SampleResult{}
	flags := &s.c.flags
	if flags.SampleNoRetries {
		if err := s.attempt(ctx, &req, res, false); err != nil {
			return nil, &SampleError{Attempts: res.Attempts, Err: err}
		}
		return res, nil
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("tinker: sample: %w", ctx.Err())
	}
	defer func() { <-s.sem }()
	s.enter()
	defer s.exit()
	watch := flags.SampleEnableStuckDetection
	for k := 0; ; k++ {
		err := s.attempt(ctx, &req, res, watch)
		if err == nil {
			s.progress()
			return res, nil
		}
		if ctx.Err() != nil || !IsRetryable(err) {
			return nil, &SampleError{Attempts: res.Attempts, Err: err}
		}
		if watch {
			if serr := s.stuck(); serr != nil {
				return nil, &SampleError{Attempts: res.Attempts, Err: fmt.Errorf("%w (last error: %v)", serr, err)}
			}
		}
		t := &s.c.t
		d := sampleBackoff(k, t.SampleRetryBase, t.SampleRetryMax, t.SampleJitter, rand.Float64())
		s.c.emit(Event{Kind: EventRetry, Endpoint: "sample", Layer: LayerSample, Delay: d, Attempt: k, Err: err, SamplerID: s.id})
		if serr := s.c.clock.Sleep(ctx, d); serr != nil {
			return nil, &SampleError{Attempts: res.Attempts, Err: fmt.Errorf("tinker: sample: %w", serr)}
		}
	}
}

// SampleError is what Sample returns when it made attempts and failed: the error that ended it,
// and how many attempts (§6.3) it made, each sent to the service or waiting to be.
type SampleError struct {
	Attempts int
	Err      error
}

func (e *SampleError) Error() string { return e.Err.Error() }

// Unwrap returns the error that ended the sample.
func (e *SampleError) Unwrap() error { return e.Err }

// AttemptsOf returns how many attempts the Sample that returned err made (0 when err is not a
// SampleError: Sample failed before its first).
func AttemptsOf(err error) int {
	var se *SampleError
	if errors.As(err, &se) {
		return se.Attempts
	}
	return 0
}

// sampleBackoff is the §6.3 delay before retry k: d = min(base·2^k, max),
// d += d·jitter·(2u−1), clamped to [0, max].
func sampleBackoff(k int, base, maxD time.Duration, jitter, u float64) time.Duration {
	d := float64(base) * math.Pow(2, float64(min(k, 1000)))
	d = math.Min(d, float64(maxD))
	d += d * jitter * (2*u - 1)
	return time.Duration(math.Max(0, math.Min(d, float64(maxD))))
}

func (s *Sampler) enter() {
	s.mu.Lock()
	if s.inFlight == 0 {
		s.lastProgress = s.c.clock.Now()
	}
	s.inFlight++
	s.mu.Unlock()
}

func (s *Sampler) exit() {
	s.mu.Lock()
	s.inFlight--
	s.mu.Unlock()
}

func (s *Sampler) progress() {
	s.mu.Lock()
	s.lastProgress = s.c.clock.Now()
	s.mu.Unlock()
}

// stuck is the stuck detection of §6.3, evaluated at every wait point of an
// attempt (dispatch waits, submission retries, every poll).
func (s *Sampler) stuck() error {
	s.mu.Lock()
	since := s.c.clock.Now().Sub(s.lastProgress)
	s.mu.Unlock()
	if since > s.c.t.ProgressTimeout {
		return fmt.Errorf("tinker: sampler %s: no progress made in %s: %w", s.id, s.c.t.ProgressTimeout, ErrProgressTimeout)
	}
	return nil
}

// attempt is one ATTEMPT of §5.1.
func (s *Sampler) attempt(ctx context.Context, req *SampleRequest, res *SampleResult, watch bool) error {
	res.Attempts++
	c := s.c
	est := req.Prompt.EstimatedBytes()
	seq := s.seq.Add(1) - 1 // allocated before any waiting (§8)
	body, err := appendSampleRequest(make([]byte, 0, 256+est), req, s.id, seq)
	if err != nil {
		return err
	}
	check := func() error { return nil }
	if watch {
		check = s.stuck
	}
	acquired, err := c.disp.Acquire(ctx, est)
	if err != nil {
		return fmt.Errorf("tinker: sample: dispatch: %w", err)
	}
	// Released once, on every way out: also a panic below (a bug, in the client or a hook),
	// which a caller may recover from (the worker does, job by job) and go on. Kept, the
	// permits would be lost to the Dispatcher for good.
	released := false
	release := func(accepted bool) {
		released = true
		acquired(accepted)
	}
	defer func() {
		if !released {
			acquired(false)
		}
	}()
	cl := &call{name: "asample", method: http.MethodPost, path: "api/v1/asample", body: body, samplerID: s.id,
		header: func(h http.Header) { h["X-Tinker-Sampling-Backpressure"] = []string{"1"} }}
	var requestID string
	for {
		if err := c.disp.Wait(ctx); err != nil {
			release(false)
			return fmt.Errorf("tinker: sample: dispatch wait: %w", err)
		}
		backpressure, taken := "", false
		err := c.withRetries(ctx, cl.name, s.id, check, func(ctx context.Context) error {
			backpressure, taken = "", false
			res.Submissions++
			// asample has no HTTP-level retries (§3.6); one idempotency key per call.
			r, err := c.roundTrip(ctx, cl, 0, newIdempotencyKey())
			if err != nil {
				return err
			}
			switch {
			case r.status >= 200 && r.status <= 299:
				taken = true // the service runs it, even if its reply cannot be read
				var fut struct {
					RequestID string `json:"request_id"`
				}
				if err := json.Unmarshal(r.body, &fut); err != nil || fut.RequestID == "" {
					return &ProtocolError{Endpoint: cl.name, Msg: "reply has no request_id", Err: err}
				}
				requestID = fut.RequestID
				return nil
			case r.status == http.StatusTooManyRequests:
				backpressure = BackoffRateLimited
				return nil
			case r.status == http.StatusPaymentRequired && c.billingPause(cl.name, s.id):
				backpressure = BackoffBilling
				return nil
			}
			return c.statusError(cl, r)
		})
		if err != nil {
			release(taken)
			return fmt.Errorf("tinker: sample: submit: %w", err)
		}
		if backpressure == "" {
			break
		}
		// §5.1/§5.3: 1 s backoff, 5 s for prompts over 128 KiB; same seq_id.
		d := c.t.BackoffSmall
		if est > c.t.BackoffLargeThreshold {
			d = c.t.BackoffLarge
		}
		if backpressure == BackoffRateLimited {
			c.emit(Event{Kind: EventRateLimited, Endpoint: cl.name, StatusCode: http.StatusTooManyRequests,
				Reason: backpressure, Delay: d, SamplerID: s.id})
		}
		c.disp.Backoff(ctx, backpressure, d)
		if err := check(); err != nil {
			release(false)
			return err
		}
	}
	release(true) // permits are not held while polling (§5.1)
	resp, err := s.poll(ctx, requestID, time.Now(), check)
	if err != nil {
		return err
	}
	res.Response, res.SeqID, res.RequestID = resp, seq, requestID
	return nil
}

// pollReply is every JSON shape retrieve_future can answer with (§T5).
type pollReply struct {
	Type                string          `json:"type"`
	Status              string          `json:"status"`
	Error               json.RawMessage `json:"error"`
	Category            string          `json:"category"`
	QueueState          string          `json:"queue_state"`
	QueueStateReason    string          `json:"queue_state_reason"`
	ResponsePayloadSize int64           `json:"response_payload_size"`
}

func pollBody(requestID string, allowMeta bool) []byte {
	b := make([]byte, 0, 64+len(requestID))
	b = append(b, `{"request_id":`...)
	b = appendString(b, requestID)
	b = append(b, `,"allow_metadata_only":`...)
	b = strconv.AppendBool(b, allowMeta)
	return append(b, '}')
}

// poll long-polls retrieve_future until the future resolves, classifying every
// reply as the table of §4.2 says.
func (s *Sampler) poll(ctx context.Context, requestID string, created time.Time, check func() error) (*SampleResponse, error) {
	c := s.c
	t := &c.t
	const name = "retrieve_future"
	allowMeta, connExp, badRequests, serverErrors, metaSeen := true, 0, 0, 0, false
	var releaseMeta func()
	defer func() {
		if releaseMeta != nil {
			releaseMeta()
		}
	}()
	body := pollBody(requestID, true)
	immediate := func() error { // re-poll at once (or after the optional floor)
		if t.PollFloor > 0 {
			return c.clock.Sleep(ctx, t.PollFloor)
		}
		return nil
	}
	backoff := func(status int, err error) error { // 429 and connection errors
		d := submitBackoff(connExp, t.PollBackoffBase, t.PollBackoffMax)
		connExp++
		if status == http.StatusTooManyRequests {
			c.emit(Event{Kind: EventRateLimited, Endpoint: name, StatusCode: status, Delay: d, SamplerID: s.id})
		}
		c.emit(Event{Kind: EventRetry, Endpoint: name, Layer: LayerPoll, StatusCode: status, Delay: d, Attempt: connExp - 1, Err: err, SamplerID: s.id})
		return c.clock.Sleep(ctx, d)
	}
	start := c.clock.Now()
	// last is the failure the latest poll met (a 5xx, a 429, a connection error, a 400),
	// which giving up names; a reply that is no failure clears it.
	var last error
	named := func(err error) error {
		if last != nil {
			return fmt.Errorf("%w (last error: %v)", err, last)
		}
		return err
	}
	for it := 0; ; it++ {
		if err := check(); err != nil {
			return nil, named(err)
		}
		if c.futureTimeout > 0 && c.clock.Now().Sub(start) > c.futureTimeout {
			return nil, named(fmt.Errorf("tinker: %s %s: not answered %s after the sample was accepted: %w",
				name, requestID, c.futureTimeout, ErrFutureTimeout))
		}
		iter := strconv.Itoa(it)
		cl := &call{name: name, method: http.MethodPost, path: "api/v1/retrieve_future", body: body,
			accept: "application/x-protobuf", timeout: t.PollTimeout, samplerID: s.id,
			header: func(h http.Header) {
				h["X-Tinker-Request-Iteration"] = []string{iter}
				h["X-Tinker-Request-Type"] = []string{"Sample"}
				h["X-Stainless-Raw-Response"] = []string{"raw"}
				if iter == "0" {
					h["X-Tinker-Create-Promise-Roundtrip-Time"] = []string{
						strconv.FormatFloat(time.Since(created).Seconds(), 'g', -1, 64)}
				}
			}}
		r, err := c.roundTrip(ctx, cl, 0, newIdempotencyKey())
		if err != nil {
			var ce *ConnectionError
			if ctx.Err() != nil || !errors.As(err, &ce) {
				return nil, err
			}
			last = err
			if err := backoff(0, err); err != nil {
				return nil, fmt.Errorf("tinker: %s: %w", name, err)
			}
			continue
		}
		if r.status != http.StatusTooManyRequests {
			connExp = 0 // any reply outside the backoff class proves the connection alive
		}
		if r.status < 500 {
			serverErrors = 0
		}
		if r.status >= 200 && r.status <= 299 || r.status == http.StatusRequestTimeout {
			last = nil
		} else {
			last = c.statusError(cl, r) // the reply's error, as the cases below report it
		}
		switch {
		case r.status >= 200 && r.status <= 299:
			// Every 2xx, not only 200: the SDK's HTTP layer (httpx, §1.4) raises only for a
			// status outside 2xx, and its poll loop classifies whatever did not raise by
			// content (§3.7, §4.2). A 204 has no body, fatal as the SDK's JSON decode of it is.
			if strings.Contains(r.header.Get("Content-Type"), "application/x-protobuf") {
				resp, err := decodeSampleResponseProto(r.body)
				if err != nil {
					return nil, &ProtocolError{Endpoint: name, Msg: "decode protobuf SampleResponse", Err: err}
				}
				return resp, nil
			}
			var pr pollReply
			if err := json.Unmarshal(r.body, &pr); err != nil {
				return nil, &ProtocolError{Endpoint: name, Msg: "reply is neither protobuf nor JSON", Err: err}
			}
			switch {
			case pr.Type == "try_again":
				if q := parseQueueState(pr.QueueState); q != QueueUnknown || pr.QueueStateReason != "" {
					s.queueState(q, pr.QueueStateReason)
				}
			case pr.Status == "complete_metadata":
				if metaSeen {
					return nil, &ProtocolError{Endpoint: name, Msg: "complete_metadata returned twice"}
				}
				metaSeen, allowMeta = true, false
				rel, err := c.inflight.acquire(ctx, pr.ResponsePayloadSize) // §4.4
				if err != nil {
					return nil, fmt.Errorf("tinker: %s: in-flight bytes: %w", name, err)
				}
				releaseMeta = rel
				body = pollBody(requestID, allowMeta)
				continue
			case pr.Error != nil:
				msg := string(pr.Error)
				var str string
				if json.Unmarshal(pr.Error, &str) == nil {
					msg = str
				}
				return nil, &RequestFailedError{Category: parseCategory(pr.Category), Message: c.redact(msg), RequestID: requestID}
			default:
				resp, err := decodeSampleResponseJSON(r.body)
				if err != nil {
					return nil, &ProtocolError{Endpoint: name, Msg: "decode JSON SampleResponse", Err: err}
				}
				return resp, nil
			}
		case r.status == http.StatusRequestTimeout:
			// "try again" as an HTTP error (§4.2).
			var pr pollReply
			if json.Unmarshal(r.body, &pr) == nil {
				badRequests = 0
				if pr.QueueState != "" {
					s.queueState(parseQueueState(pr.QueueState), pr.QueueStateReason)
				}
			}
		case r.status >= 500:
			// Polled again at once (§4.2), a retry of the poll layer (as a 400's below),
			// which the client's warning and the retries metric show; after a 5xx in a row,
			// later and later (Timing.PollServerErrorBase).
			d := t.PollFloor
			if serverErrors > 0 {
				d = max(d, submitBackoff(serverErrors-1, t.PollServerErrorBase, t.PollServerErrorMax))
			}
			c.emit(Event{Kind: EventRetry, Endpoint: name, Layer: LayerPoll, StatusCode: r.status, Delay: d,
				Attempt: serverErrors, Err: last, SamplerID: s.id})
			serverErrors++
			if d > 0 {
				if err := c.clock.Sleep(ctx, d); err != nil {
					return nil, fmt.Errorf("tinker: %s: %w", name, err)
				}
			}
			continue
		case r.status == http.StatusTooManyRequests:
			if err := backoff(r.status, last); err != nil {
				return nil, fmt.Errorf("tinker: %s: %w", name, err)
			}
			continue
		case r.status == http.StatusBadRequest:
			badRequests++
			if badRequests > t.PollBadRequests {
				return nil, &ProtocolError{Endpoint: name, Msg: "error retrieving result", Err: last}
			}
			c.emit(Event{Kind: EventRetry, Endpoint: name, Layer: LayerPoll, StatusCode: r.status, Delay: t.PollFloor,
				Attempt: badRequests - 1, Err: last, SamplerID: s.id})
		case r.status == http.StatusPaymentRequired:
			if !c.billingPause(name, s.id) {
				return nil, &ProtocolError{Endpoint: name, Msg: "billing pause window expired", Err: last}
			}
			if err := c.clock.Sleep(ctx, t.BillingRetry); err != nil {
				return nil, fmt.Errorf("tinker: %s: %w", name, err)
			}
			continue
		case r.status == http.StatusGone:
			// Promise expired: the whole sample is resubmitted with a new seq_id (§6.3).
			return nil, last
		default:
			return nil, &ProtocolError{Endpoint: name, Msg: "error retrieving result", Err: last}
		}
		if err := immediate(); err != nil {
			return nil, fmt.Errorf("tinker: %s: %w", name, err)
		}
	}
}

// queueState reports a queue state (§4.3): an EventQueueState every time, and a
// warning for paused states at most once per Timing.QueueLogEvery per sampler.
func (s *Sampler) queueState(q QueueState, reason string) {
	if reason == "" && q.Paused() {
		reason = defaultQueueReason(q)
	} else {
		reason = s.c.serviceText(reason) // the service's words, logged: without credentials
	}
	s.c.emit(Event{Kind: EventQueueState, Endpoint: "retrieve_future", QueueState: q, Reason: reason, SamplerID: s.id})
	if !q.Paused() {
		return
	}
	now := s.c.clock.Now()
	s.mu.Lock()
	logIt := s.lastPauseLog.IsZero() || now.Sub(s.lastPauseLog) >= s.c.t.QueueLogEvery
	if logIt {
		s.lastPauseLog = now
	}
	s.mu.Unlock()
	if logIt {
		s.c.log.Warn(fmt.Sprintf("Sampling is paused for sampler %s. Reason: %s", s.id, reason),
			"sampler", s.id, "queue_state", string(q))
	}
}
