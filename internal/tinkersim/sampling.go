package tinkersim

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// futureState is where a future is in its life.
type futureState int

const (
	futureQueued  futureState = iota // accepted, waiting for a capacity slot
	futureRunning                    // holds a slot (or never completes)
	futureDone                       // result or failure available
)

// failure is the payload of a failed future (§T5 RequestFailedResponse).
type failure struct {
	Error    string `json:"error"`
	Category string `json:"category"`
}

// tryAgain is the try_again body (§T5 TryAgainResponse).
type tryAgain struct {
	Type             string `json:"type"`
	RequestID        string `json:"request_id"`
	QueueState       string `json:"queue_state"`
	QueueStateReason string `json:"queue_state_reason,omitempty"`
}

// future is one accepted asample.
type future struct {
	id            string
	state         futureState
	result        *SampleResponse
	failure       *failure
	neverComplete bool
	latency       time.Duration
	timer         *time.Timer
	done          chan struct{}
	doneAt        time.Time
	readAt        time.Time // when the outcome was first answered in full; zero until then
	metadataSent  bool
}

// handleAsample implements POST /api/v1/asample (§3.6).
func (s *Server) handleAsample(w http.ResponseWriter, r *http.Request) {
	var req sampleRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	p, maxCtx, requestID, e := s.validateSample(&req)
	if e != nil {
		writeHTTPError(w, e)
		return
	}
	// §8: a re-sent (sampling_session_id, seq_id) maps to the same future, no double work.
	if requestID != "" && s.replay(requestID) {
		writeJSON(w, http.StatusOK, map[string]string{"request_id": requestID})
		return
	}
	f := &future{done: make(chan struct{})}
	if p.maxTokens > maxCtx-len(p.prompt) { // not len+max_tokens, which a huge max_tokens overflows
		f.failure = &failure{Error: "Prompt length plus max_tokens exceeds the model's context window", Category: "user"}
		f.latency = s.cfg.BaseLatency
	} else {
		f.result = s.gen.generate(p)
		longest := 0
		for _, seq := range f.result.Sequences {
			longest = max(longest, len(seq.Tokens))
		}
		f.latency = s.cfg.BaseLatency + time.Duration(longest)*s.cfg.PerTokenLatency
	}
	backpressure := r.Header.Get("X-Tinker-Sampling-Backpressure") == "1"
	now := time.Now()

	s.mu.Lock()
	if requestID != "" {
		if _, ok := s.futures[requestID]; ok { // a concurrent duplicate won the race
			s.st.replays++
			s.mu.Unlock()
			writeJSON(w, http.StatusOK, map[string]string{"request_id": requestID})
			return
		}
	} else {
		requestID = "sample:" + s.newIDLocked()
	}
	if s.running >= s.cfg.Capacity && backpressure {
		// §3.6: with the backpressure header the backend rejects instead of queueing.
		s.st.capacityRejections++
		s.mu.Unlock()
		s.writeTooManyRequests(w, s.cfg.RetryAfter, "sampler busy: backend at capacity")
		return
	}
	if a := s.hitLocked(epAsample, now, FaultNeverComplete); a != nil {
		f.neverComplete = true
	} else if f.failure != nil {
		// Failing already (its context): a failed fault's hits are kept for samples it fails.
	} else if a := s.hitLocked(epAsample, now, FaultFailed); a != nil {
		f.result = nil
		f.failure = &failure{Error: orDefault(a.f.Reason, "Request failed: injected "+a.f.Category+" failure"), Category: a.f.Category}
	}
	f.id = requestID
	s.futures[requestID] = f
	s.st.accepted++
	if s.running < s.cfg.Capacity {
		s.startLocked(f)
	} else {
		s.queue = append(s.queue, f)
	}
	slow := s.hitLocked(epAsample, now, FaultSlowAccept)
	s.mu.Unlock()
	if slow != nil {
		s.delay(r, slow.f.Delay)
	}
	writeJSON(w, http.StatusOK, map[string]string{"request_id": requestID})
}

// replay reports whether requestID is already a future, counting the replay.
func (s *Server) replay(requestID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.futures[requestID]; ok {
		s.st.replays++
		return true
	}
	return false
}

// validateSample checks a SampleRequest like the service does and resolves the sampler. It
// returns the generator input, the model's context length and the deterministic request id
// ("" when the request names no sampling session).
func (s *Server) validateSample(req *sampleRequest) (*genParams, int, string, *httpError) {
	if e := checkLiteral("type", req.Type, "sample", false); e != nil {
		return nil, 0, "", e
	}
	if req.Prompt == nil {
		return nil, 0, "", unprocessable("field \"prompt\" is required")
	}
	if req.SamplingParams == nil {
		return nil, 0, "", unprocessable("field \"sampling_params\" is required")
	}
	prompt, e := promptTokens(req.Prompt)
	if e != nil {
		return nil, 0, "", e
	}
	p := &genParams{prompt: prompt, numSamples: 1, maxTokens: s.cfg.DefaultMaxTokens}
	if req.NumSamples != nil {
		if *req.NumSamples < 1 || *req.NumSamples > s.cfg.MaxNumSamples {
			return nil, 0, "", unprocessable("field \"num_samples\" must be in [1, %d]", s.cfg.MaxNumSamples)
		}
		p.numSamples = *req.NumSamples
	}
	sp := req.SamplingParams
	if sp.MaxTokens != nil {
		if *sp.MaxTokens < 1 {
			return nil, 0, "", unprocessable("field \"sampling_params.max_tokens\" must be at least 1")
		}
		p.maxTokens = *sp.MaxTokens
	}
	if sp.Seed != nil {
		p.seed = uint64(*sp.Seed) & (1<<63 - 1) // §T4 note: folded into [0, 2^63)
	}
	if sp.Temperature != nil && *sp.Temperature < 0 {
		return nil, 0, "", unprocessable("field \"sampling_params.temperature\" must not be negative")
	}
	if sp.TopP != nil && (*sp.TopP <= 0 || *sp.TopP > 1) {
		return nil, 0, "", unprocessable("field \"sampling_params.top_p\" must be in (0, 1]")
	}
	if sp.TopK != nil && *sp.TopK < -1 {
		return nil, 0, "", unprocessable("field \"sampling_params.top_k\" must be -1 or positive")
	}
	stop, e := parseStop(sp.Stop)
	if e != nil {
		return nil, 0, "", e
	}
	p.stopTokens = stop.tokens
	if req.PromptLogprobs != nil {
		p.promptLP = *req.PromptLogprobs
	}
	if req.TopkPromptLogprobs != nil {
		if *req.TopkPromptLogprobs < 0 {
			return nil, 0, "", unprocessable("field \"topk_prompt_logprobs\" must not be negative")
		}
		p.topK = min(*req.TopkPromptLogprobs, MaxTopK) // the service caps k at 20 (§10)
	}

	var requestID string
	maxCtx := 0
	switch {
	case req.SamplingSessionID != nil:
		if req.SeqID == nil {
			return nil, 0, "", unprocessable("field \"seq_id\" is required when sampling_session_id is provided")
		}
		s.mu.Lock()
		sm := s.samplerLocked(*req.SamplingSessionID, time.Now())
		s.mu.Unlock()
		if sm == nil {
			return nil, 0, "", &httpError{status: http.StatusNotFound, msg: "sampling session not found: " + *req.SamplingSessionID}
		}
		maxCtx = sm.maxCtx
		// §8: request ids are <sampling_session_id>:<seq_id>.
		requestID = sm.id + ":" + strconv.FormatInt(*req.SeqID, 10)
	case req.BaseModel != nil:
		m, ok := s.model(*req.BaseModel)
		if !ok {
			return nil, 0, "", badRequest("unsupported base_model %q", *req.BaseModel)
		}
		maxCtx = m.MaxContextLength
	case req.ModelPath != nil:
		if !strings.HasPrefix(*req.ModelPath, "tinker://") {
			return nil, 0, "", badRequest("model_path must start with tinker://")
		}
		maxCtx = s.cfg.Models[0].MaxContextLength
	default:
		return nil, 0, "", unprocessable("one of sampling_session_id, base_model or model_path is required")
	}
	return p, maxCtx, requestID, nil
}

// maxPromptPositions bounds a prompt's positions before they are made: an image's
// expected_tokens is a number in the request, and 50,000,000 of them took 190 MB for a
// 200-byte request (2^50, a panic). It is far above any model's context window, so a prompt
// under it that does not fit still gets its failed future (category user), as before.
const maxPromptPositions = 1 << 22

// promptTokens flattens a ModelInput (§T1) into token ids. Images and audio have no ids in the
// simulator: an image or image_asset_pointer counts as expected_tokens positions (256 when
// absent), a dmel chunk as one position per 8 bytes; those positions hash as token id 0.
func promptTokens(in *modelInput) ([]int32, *httpError) {
	if in.Chunks == nil {
		return nil, unprocessable("field \"prompt.chunks\" is required")
	}
	var out []int32
	for i, c := range *in.Chunks {
		if c.Type == nil {
			return nil, unprocessable("field \"prompt.chunks[%d].type\" is required", i)
		}
		allowed := map[string]bool{}
		switch *c.Type {
		case "encoded_text":
			if c.Tokens == nil {
				return nil, unprocessable("field \"prompt.chunks[%d].tokens\" is required", i)
			}
			out = append(out, *c.Tokens...)
			allowed["tokens"] = true
		case "image", "image_asset_pointer":
			if c.Format == nil || (*c.Format != "png" && *c.Format != "jpeg") {
				return nil, unprocessable("field \"prompt.chunks[%d].format\" must be \"png\" or \"jpeg\"", i)
			}
			if *c.Type == "image" && c.Data == nil {
				return nil, unprocessable("field \"prompt.chunks[%d].data\" is required", i)
			}
			if *c.Type == "image_asset_pointer" && c.Location == nil {
				return nil, unprocessable("field \"prompt.chunks[%d].location\" is required", i)
			}
			n := 256
			if c.ExpectedTokens != nil {
				if *c.ExpectedTokens < 1 {
					return nil, unprocessable("field \"prompt.chunks[%d].expected_tokens\" must be positive", i)
				}
				n = *c.ExpectedTokens
			}
			if n > maxPromptPositions-len(out) {
				return nil, unprocessable("prompt.chunks[%d]: the prompt would be over %d positions", i, maxPromptPositions)
			}
			out = append(out, make([]int32, n)...)
			allowed["format"], allowed["expected_tokens"] = true, true
			allowed["data"], allowed["location"] = *c.Type == "image", *c.Type == "image_asset_pointer"
		case "dmel":
			if c.Dmel == nil {
				return nil, unprocessable("field \"prompt.chunks[%d].dmel\" is required", i)
			}
			out = append(out, make([]int32, max(1, len(*c.Dmel)/8))...)
			allowed["dmel"] = true
		default:
			return nil, unprocessable("field \"prompt.chunks[%d].type\": unknown chunk type %q", i, *c.Type)
		}
		present := map[string]bool{"tokens": c.Tokens != nil, "data": c.Data != nil, "format": c.Format != nil,
			"expected_tokens": c.ExpectedTokens != nil, "location": c.Location != nil, "dmel": c.Dmel != nil}
		for name, there := range present {
			if there && !allowed[name] {
				return nil, unprocessable("prompt.chunks[%d]: field %q is not allowed in a %q chunk", i, name, *c.Type)
			}
		}
	}
	if len(out) == 0 {
		return nil, unprocessable("field \"prompt\": the prompt has no tokens")
	}
	return out, nil
}

// startLocked gives f a capacity slot and arms its completion.
func (s *Server) startLocked(f *future) {
	f.state = futureRunning
	s.running++
	s.st.peak = max(s.st.peak, s.running)
	if f.neverComplete {
		// A hung future does not pin the backend: its slot is released at once.
		s.running--
		return
	}
	f.timer = time.AfterFunc(f.latency, func() { s.complete(f) })
}

// complete finishes f, unless a pause window holds futures back (§4.3): then f waits for the
// window to end.
func (s *Server) complete(f *future) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.isClosed() || f.state == futureDone {
		return
	}
	if s.pauseLocked(time.Now()) != nil {
		s.deferred[f] = struct{}{}
		return
	}
	s.finishLocked(f)
}

// finishLocked publishes f's outcome, frees its slot and starts queued samples.
func (s *Server) finishLocked(f *future) {
	f.state = futureDone
	f.doneAt = time.Now()
	close(f.done)
	s.running--
	if f.failure != nil {
		s.st.failed++
	} else {
		s.st.completed++
	}
	for len(s.queue) > 0 && s.running < s.cfg.Capacity {
		next := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.startLocked(next)
	}
}

// releaseDeferredLocked finishes futures held back by a pause that is no longer active.
func (s *Server) releaseDeferredLocked() {
	if len(s.deferred) == 0 || s.pauseLocked(time.Now()) != nil {
		return
	}
	for f := range s.deferred {
		delete(s.deferred, f)
		s.finishLocked(f)
	}
}

// armWindowEndLocked releases deferred futures when a pause window ends.
func (s *Server) armWindowEndLocked(end time.Time) {
	var t *time.Timer
	t = time.AfterFunc(time.Until(end)+time.Millisecond, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.windowTimers, t)
		if !s.isClosed() {
			s.releaseDeferredLocked()
		}
	})
	s.windowTimers[t] = struct{}{}
}

// handleRetrieveFuture implements POST /api/v1/retrieve_future (§3.7, §4): a long poll that
// answers the result, a failure, or 408 try_again after LongPollWait.
func (s *Server) handleRetrieveFuture(w http.ResponseWriter, r *http.Request) {
	var req retrieveFutureRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	if req.RequestID == nil {
		writeHTTPError(w, unprocessable("field \"request_id\" is required"))
		return
	}
	id := *req.RequestID
	now := time.Now()
	if s.genericFault(w, epRetrieveFuture, id, now) {
		return
	}
	s.mu.Lock()
	f := s.futures[id]
	if f != nil && s.hitLocked(epRetrieveFuture, now, FaultExpired) != nil {
		delete(s.futures, id) // §4.2: 410 → the client resubmits with a new seq_id
		f = nil
	}
	if f == nil {
		s.mu.Unlock()
		writeJSONError(w, http.StatusGone, "future expired or unknown: "+id)
		return
	}
	if s.hitLocked(epRetrieveFuture, now, FaultTryAgain200) != nil {
		body := s.tryAgainLocked(id, now, nil)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, body)
		return
	}
	pauseAtStart := s.pauseLocked(now)
	s.mu.Unlock()

	timer := time.NewTimer(s.cfg.LongPollWait)
	defer timer.Stop()
	s.pollsHeld.Add(1)
	defer s.pollsHeld.Add(-1)
	select {
	case <-f.done:
	case <-timer.C:
	case <-r.Context().Done():
	case <-s.closed:
	}
	select {
	case <-f.done:
		s.writeOutcome(w, r, f, req.AllowMetadataOnly != nil && *req.AllowMetadataOnly)
	default:
		s.mu.Lock()
		body := s.tryAgainLocked(id, time.Now(), pauseAtStart)
		s.mu.Unlock()
		// §12: long-poll expiry is a 408 with a try_again body.
		writeJSON(w, http.StatusRequestTimeout, body)
	}
}

// tryAgainLocked builds a try_again body with the queue state of the pause active now (or,
// failing that, the one active when the poll arrived).
func (s *Server) tryAgainLocked(id string, now time.Time, fallback *activeFault) tryAgain {
	body := tryAgain{Type: "try_again", RequestID: id, QueueState: "active"}
	p := s.pauseLocked(now)
	if p == nil {
		p = fallback
	}
	if p != nil {
		body.QueueState = string(p.f.Kind)
		body.QueueStateReason = p.f.Reason
	}
	return body
}

// writeOutcome answers a finished future: a failure as 200 {"error","category"} (§3.7 reply
// 4), a big result first as complete_metadata when allowed (§4.4), then protobuf if Accept asks
// for it (§T4), else the JSON shape of §T3.
func (s *Server) writeOutcome(w http.ResponseWriter, r *http.Request, f *future, allowMetadataOnly bool) {
	if f.failure != nil {
		s.markRead(f)
		writeJSON(w, http.StatusOK, f.failure)
		return
	}
	wantProto := strings.Contains(r.Header.Get("Accept"), "application/x-protobuf")
	var body []byte
	if wantProto {
		body = f.result.AppendProto(nil)
	} else {
		body = f.result.AppendJSON(nil)
	}
	if allowMetadataOnly && s.cfg.MetadataOnlyThreshold > 0 {
		size := len(body)
		if !wantProto {
			size = len(f.result.AppendProto(nil))
		}
		s.mu.Lock()
		announce := size > s.cfg.MetadataOnlyThreshold && !f.metadataSent
		f.metadataSent = f.metadataSent || announce
		s.mu.Unlock()
		if announce {
			writeJSON(w, http.StatusOK, map[string]any{"status": "complete_metadata", "response_payload_size": size})
			return
		}
	}
	s.markRead(f)
	if wantProto {
		writeBody(w, http.StatusOK, "application/x-protobuf", body)
		return
	}
	writeBody(w, http.StatusOK, "application/json", body)
}

// markRead notes the first time f's outcome is answered in full; the janitor drops f ReadTTL
// later.
func (s *Server) markRead(f *future) {
	s.mu.Lock()
	if f.readAt.IsZero() {
		f.readAt = time.Now()
	}
	s.mu.Unlock()
}
