package tinkersim

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// Inject adds a fault and returns its id. Faults of kind 429, 402, 401 and the paused kinds also
// open a window in Stats.Windows.
func (s *Server) Inject(f Fault) (FaultID, error) {
	v, err := f.validate()
	if err != nil {
		return 0, fmt.Errorf("inject fault: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.injectLocked(v, time.Now()), nil
}

func (s *Server) injectLocked(f Fault, now time.Time) FaultID {
	s.nextID++
	a := &activeFault{id: s.nextID, f: f, start: f.Start}
	if a.start.IsZero() {
		a.start = now
	}
	if f.Duration > 0 {
		a.end = a.start.Add(f.Duration)
	}
	if f.Kind.windowed() {
		a.win = &windowStat{WindowStats{FaultID: a.id, Kind: f.Kind, Start: a.start, End: a.end}}
		s.st.windows = append(s.st.windows, a.win)
	}
	s.faults = append(s.faults, a)
	if f.Kind.pause() && !a.end.IsZero() {
		// Futures held back by this window complete when it ends.
		s.armWindowEndLocked(a.end)
	}
	return a.id
}

// SetFaults replaces all injected faults by fs (all or nothing).
func (s *Server) SetFaults(fs []Fault) error {
	valid := make([]Fault, 0, len(fs))
	for i, f := range fs {
		v, err := f.validate()
		if err != nil {
			return fmt.Errorf("set faults: #%d: %w", i+1, err)
		}
		valid = append(valid, v)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.clearFaultsLocked(now)
	for _, f := range valid {
		s.injectLocked(f, now)
	}
	return nil
}

// RemoveFault removes one fault; it reports whether the fault existed. Its window, if any,
// ends now in Stats.
func (s *Server) RemoveFault(id FaultID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i, a := range s.faults {
		if a.id == id {
			s.closeWindowLocked(a, now)
			s.faults = append(s.faults[:i], s.faults[i+1:]...)
			s.releaseDeferredLocked()
			return true
		}
	}
	return false
}

// ClearFaults removes every fault (their windows end now; stats are kept).
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clearFaultsLocked(time.Now())
}

func (s *Server) clearFaultsLocked(now time.Time) {
	for _, a := range s.faults {
		s.closeWindowLocked(a, now)
	}
	s.faults = nil
	s.releaseDeferredLocked()
}

func (s *Server) closeWindowLocked(a *activeFault, now time.Time) {
	if a.win != nil && (a.win.End.IsZero() || now.Before(a.win.End)) {
		if now.Before(a.win.Start) {
			a.win.End = a.win.Start
		} else {
			a.win.End = now
		}
	}
}

// Reset clears every fault and all stats (sessions, samplers and futures are kept).
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
	s.releaseDeferredLocked()
	s.st = newStats()
	s.st.peak = s.running
}

// ForgetSessions forgets every session, sampling session and future, as a service that
// restarted would: a heartbeat, create_sampling_session or asample naming them answers 404,
// and a poll of one of those futures 410. Samples running finish unseen; faults, stats and
// the configuration stay.
func (s *Server) ForgetSessions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.sessions)
	clear(s.samplers)
	clear(s.futures)
}

// Faults lists the injected faults.
func (s *Server) Faults() []FaultInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]FaultInfo, 0, len(s.faults))
	for _, a := range s.faults {
		fi := FaultInfo{ID: a.id, Kind: a.f.Kind, Endpoints: a.f.Endpoints, Rate: a.f.Rate, Count: a.f.Count, Hits: a.hits, Start: a.start,
			Reason: a.f.Reason, Category: a.f.Category, Status: a.f.Status, ShouldRetry: a.f.ShouldRetry}
		if !a.end.IsZero() {
			end := a.end
			fi.End = &end
		}
		out = append(out, fi)
	}
	return out
}

// hitLocked returns the first fault of one of kinds that is active at now for endpoint, has
// hits left, and whose rate draw hits. The RNG is seeded, so a sequence of requests is
// reproducible.
func (s *Server) hitLocked(endpoint string, now time.Time, kinds ...FaultKind) *activeFault {
	for _, a := range s.faults {
		match := false
		for _, k := range kinds {
			if a.f.Kind == k {
				match = true
				break
			}
		}
		if !match || !a.activeAt(now) || !a.appliesTo(endpoint) || (a.f.Count > 0 && a.hits >= a.f.Count) {
			continue
		}
		if a.f.Rate > 0 && a.f.Rate < 1 && s.rng.Float64() >= a.f.Rate {
			continue
		}
		a.hits++
		return a
	}
	return nil
}

// pauseLocked returns the active pause window, if any (the latest injected wins).
func (s *Server) pauseLocked(now time.Time) *activeFault {
	for i := len(s.faults) - 1; i >= 0; i-- {
		a := s.faults[i]
		if a.f.Kind.pause() && a.activeAt(now) {
			return a
		}
	}
	return nil
}

// countAsampleInWindows counts an asample arrival in every window open at now.
func (s *Server) countAsampleInWindows(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.faults {
		if a.win != nil && a.activeAt(now) {
			a.win.AsampleCalls++
		}
	}
}

// genericFault answers the request with an injected 429, 402, 5xx, bare 400 or 408 when one
// hits, or drops it (FaultDrop: it does not return then); it reports whether it did.
// requestID fills the try_again body of a 408 on polls.
func (s *Server) genericFault(w http.ResponseWriter, endpoint, requestID string, now time.Time) bool {
	s.mu.Lock()
	a := s.hitLocked(endpoint, now, FaultBare400, FaultDrop, FaultServerError, FaultRateLimit, FaultPaymentRequired, FaultTimeout)
	var (
		logID    string
		tryAgain tryAgain
	)
	switch {
	case a == nil:
	case a.f.Kind == FaultServerError:
		logID = s.newIDLocked()
	case a.f.Kind == FaultTimeout && endpoint == epRetrieveFuture:
		tryAgain = s.tryAgainLocked(requestID, now, nil) // a pause's queue state, as every try_again says it (§4.3)
	}
	s.mu.Unlock()
	if a == nil {
		return false
	}
	switch a.f.Kind {
	case FaultDrop:
		if rec, ok := w.(*statusRecorder); ok {
			rec.drop()
		}
		// net/http closes an HTTP/1.1 connection, or resets an HTTP/2 stream, without a reply
		// and without logging.
		panic(http.ErrAbortHandler)
	}
	a.f.setShouldRetry(w)
	switch a.f.Kind {
	case FaultBare400:
		// §1.4: no body and Content-Length 0, the shape the SDK treats as a Cloudflare reject.
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusBadRequest)
	case FaultServerError:
		// §7.1: the production 500 body.
		msg := a.f.Reason
		if msg == "" {
			msg = "An unexpected error occurred. Log ID: " + logID
		}
		writeJSON(w, a.f.Status, map[string]string{"error": http.StatusText(a.f.Status), "message": msg})
	case FaultRateLimit:
		ra := a.f.RetryAfter
		if ra == 0 {
			ra = s.cfg.RetryAfter
		}
		s.writeTooManyRequests(w, ra, orDefault(a.f.Reason, "rate limit exceeded"))
	case FaultPaymentRequired:
		writeJSONError(w, http.StatusPaymentRequired, orDefault(a.f.Reason, "billing: payment required, sampling is paused"))
	case FaultTimeout:
		if endpoint == epRetrieveFuture {
			writeJSON(w, http.StatusRequestTimeout, tryAgain)
		} else {
			writeJSONError(w, http.StatusRequestTimeout, orDefault(a.f.Reason, "request timeout"))
		}
	}
	return true
}

// refuseCredential answers 401 or 403 when an injected FaultUnauthorized or FaultForbidden
// hits the request, as the service answers a key it no longer accepts, or one that may not do
// what the request asks; it reports whether it did.
func (s *Server) refuseCredential(w http.ResponseWriter, endpoint string, now time.Time) bool {
	s.mu.Lock()
	a := s.hitLocked(endpoint, now, FaultUnauthorized, FaultForbidden)
	s.mu.Unlock()
	if a == nil {
		return false
	}
	a.f.setShouldRetry(w)
	switch {
	case a.f.Kind == FaultForbidden:
		writeJSONError(w, http.StatusForbidden, orDefault(a.f.Reason, "permission denied"))
	default:
		writeJSONError(w, http.StatusUnauthorized, orDefault(a.f.Reason, "invalid or missing X-API-Key"))
	}
	return true
}

// setShouldRetry adds the fault's x-should-retry header (§6.1) to the reply, if it has one.
func (f *Fault) setShouldRetry(w http.ResponseWriter) {
	if f.ShouldRetry != "" {
		w.Header().Set("X-Should-Retry", f.ShouldRetry)
	}
}

// writeTooManyRequests answers 429 with Retry-After (whole seconds, at least 1), the
// retry-after-ms the SDK parses first (§6.1), and a JSON body with a Content-Length (§12).
func (s *Server) writeTooManyRequests(w http.ResponseWriter, ra time.Duration, msg string) {
	secs := int((ra + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	w.Header().Set("Retry-After-Ms", strconv.FormatInt(ra.Milliseconds(), 10))
	writeJSONError(w, http.StatusTooManyRequests, msg)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
