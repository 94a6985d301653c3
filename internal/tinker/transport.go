package tinker

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

const maxErrorBody = 1024

// call describes one logical API call.
type call struct {
	name       string // endpoint label for events and errors ("asample", "samplers", ...)
	method     string
	path       string // relative to the base URL, e.g. "api/v1/asample"
	body       []byte // nil for GET
	accept     string // "" means application/json
	timeout    time.Duration
	maxRetries int // HTTP-level retries (§6.1); 0 for asample, polls, heartbeat
	samplerID  string
	header     func(h http.Header) // extra per-request headers
	useAPIKey  bool                // send the API key even while a JWT is in use (auth/token, §2.2)
}

// response is a fully read HTTP reply.
type response struct {
	status int
	header http.Header
	body   []byte
}

// newIdempotencyKey returns a fresh X-Idempotency-Key (§1.2).
func newIdempotencyKey() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return "tinkerfleet-go-retry-" + hex.EncodeToString(b[:])
}

// roundTrip sends one HTTP request and reads the whole reply. A transport
// failure, a per-request timeout or a bare 400 (§1.4) is a *ConnectionError; a
// cancelled ctx returns ctx's error. Any status is returned as a response.
func (c *Client) roundTrip(ctx context.Context, cl *call, retryCount int, idem string) (*response, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("tinker: %s: %w", cl.name, err)
	}
	// Before the per-request timeout starts: this may refresh the JWT first (§2.2).
	cred, err := c.credential(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("tinker: %s: %w", cl.name, err)
	}
	timeout := cl.timeout
	if timeout == 0 {
		timeout = c.t.RequestTimeout
	}
	rctx, timer := withRequestTimeout(ctx, timeout)
	defer timer.stop()
	var body io.Reader
	if cl.body != nil {
		body = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(rctx, cl.method, c.base+cl.path, body)
	if err != nil {
		return nil, fmt.Errorf("tinker: %s: build request: %w", cl.name, err)
	}
	h := req.Header
	h["X-Api-Key"] = []string{string(cred)}
	if c.cf.ClientID != "" {
		h["Cf-Access-Client-Id"] = []string{c.cf.ClientID}
	}
	if c.cf.ClientSecret != "" {
		h["Cf-Access-Client-Secret"] = []string{string(c.cf.ClientSecret)}
	}
	accept := cl.accept
	if accept == "" {
		accept = "application/json"
	}
	h["Accept"] = []string{accept}
	h["User-Agent"] = []string{c.userAgent}
	h["X-Stainless-Retry-Count"] = []string{strconv.Itoa(retryCount)}
	h["X-Stainless-Read-Timeout"] = []string{strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64)}
	if cl.method != http.MethodGet {
		h["Content-Type"] = []string{"application/json"}
		if idem != "" {
			h["X-Idempotency-Key"] = []string{idem}
		}
	}
	if cl.header != nil {
		cl.header(h)
	}
	budget := &c.bare400[trafficClassOf(cl.name)]
	var gen uint64
	if c.pool != nil {
		gen = c.pool.gen.Load()
	}
	start := time.Now()
	resp, err := c.hc.Do(req)
	var r *response
	status := 0 // of the reply; a bare 400 turned into a connection error keeps its 400
	if err == nil {
		r = &response{status: resp.StatusCode, header: resp.Header}
		// The timeout restarts with each piece of the body, as httpx's read timeout
		// does (§1.3): a large result over a slow link is not cut off while it comes.
		resp.Body = &restartingBody{ReadCloser: resp.Body, timer: timer}
		r.body, err = readBody(resp, c.t.MaxReplyBytes)
		// A reply the transport decompressed lost its Content-Length, and had a body.
		bare := resp.ContentLength <= 0 && !resp.Uncompressed
		_ = resp.Body.Close()
		if err == nil && r.status == http.StatusBadRequest && bare {
			// §1.4: a 400 without Content-Length (or "0") is a connection-level
			// rejection, retried as a connection error while the budget lasts. The SDK
			// replaces the pool client, so the retry goes out on a fresh connection.
			if c.pool != nil {
				c.pool.replace(gen)
			} else {
				c.hc.CloseIdleConnections()
			}
			if budget.Add(-1) >= 0 {
				err = errors.New("bare HTTP 400 without a body (connection-level rejection)")
				r, status = nil, http.StatusBadRequest
			} else {
				budget.Add(1)
			}
		}
	}
	dur := time.Since(start)
	if r != nil {
		status = r.status
		if status < 400 {
			if budget.Load() < int64(c.t.Bare400Budget) {
				budget.Add(1) // refill by one per success (§1.4)
			}
		}
	}
	c.emit(Event{Kind: EventRequest, Endpoint: cl.name, Method: cl.method, StatusCode: status,
		Duration: dur, Attempt: retryCount, SamplerID: cl.samplerID})
	if away := (*redirectedAwayError)(nil); errors.As(err, &away) {
		return nil, &ProtocolError{Endpoint: cl.name, Msg: away.Error()} // not a connection error: no retry helps
	}
	if errors.Is(err, errReplyTooLarge) {
		return nil, &ProtocolError{Endpoint: cl.name, Msg: fmt.Sprintf("reply of status %d is larger than %d bytes (Timing.MaxReplyBytes)", status, c.t.MaxReplyBytes)}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("tinker: %s: %w", cl.name, ctx.Err())
		}
		if cause := context.Cause(rctx); errors.Is(cause, context.DeadlineExceeded) {
			// The request's own timeout ended it; HTTP/2 reports that as a plain cancellation.
			return nil, &ConnectionError{Endpoint: cl.name, Timeout: true, Err: fmt.Errorf("no answer within %s: %w", timeout, cause)}
		}
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			ue.URL = shownURL(ue.URL) // net/http hides a password, not a token as the user name
		}
		var ne net.Error // a dial, TLS handshake or read that timed out by itself
		return nil, &ConnectionError{Endpoint: cl.name, Timeout: errors.As(err, &ne) && ne.Timeout(), Err: err}
	}
	return r, nil
}

// Traffic classes: the SDK keeps one connection pool per class, each with its own budget of
// bare-400 conversions (§1.4), so that rejected polls do not spend asample's.
const (
	classREST    = iota // REST reads, config, tokens (the SDK's train pool and plain httpx)
	classSession        // create_session, session_heartbeat, create_sampling_session
	classSample         // asample
	classPoll           // retrieve_future (the SDK's retrieve_promise pool)
	numTrafficClasses
)

// trafficClassOf returns the traffic class of the call named name.
func trafficClassOf(name string) int {
	switch name {
	case "asample":
		return classSample
	case "retrieve_future":
		return classPoll
	case "create_session", "session_heartbeat", "create_sampling_session":
		return classSession
	}
	return classREST
}

// withRequestTimeout returns ctx ended after timeout, a request's timeout (§1.3), with
// context.DeadlineExceeded as its cause, as context.WithTimeout does, but for a timer that
// fires late. A timeout that falls due while the process is not running (stopped by Ctrl-Z
// or SIGSTOP, in a paused container or VM) fires as it runs again, at the same moment as the
// reads of the answers that came meanwhile and wait in its sockets. Ending the request then
// would throw its answer away, and a poll's answer lost so is a sample paid for twice once
// the service has let its future go (410, §4.2). So a timer that fires more than lateSlack
// after its time gives the request lateSlack more, each time it comes late. The context has
// no Deadline: it ends by cancellation, which dials, handshakes and reads all heed. The
// returned timer's restart puts the timeout off again; its stop ends the context.
func withRequestTimeout(ctx context.Context, timeout time.Duration) (context.Context, *requestTimer) {
	rctx, cancel := context.WithCancelCause(ctx)
	rt := &requestTimer{cancel: cancel, timeout: timeout}
	rt.mu.Lock()
	rt.due = time.Now().Add(timeout)
	rt.timer = time.AfterFunc(timeout, rt.fire)
	rt.mu.Unlock()
	return rctx, rt
}

// lateSlack is how late a request's timer may fire before withRequestTimeout takes the
// process for one that did not run, and how much longer it then gives the request: an
// answer waiting in a socket is read within milliseconds of the process running again.
const lateSlack = time.Second

// requestTimer ends a request at its timeout (withRequestTimeout).
type requestTimer struct {
	mu      sync.Mutex
	timeout time.Duration
	due     time.Time
	timer   *time.Timer
	stopped bool // the request ended: a firing that waited for mu must not re-arm the timer
	cancel  context.CancelCauseFunc
}

func (rt *requestTimer) fire() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.stopped {
		return
	}
	now := time.Now()
	switch {
	case now.Before(rt.due): // restarted since it was armed
		rt.timer.Reset(rt.due.Sub(now))
		return
	case now.Sub(rt.due) > lateSlack:
		rt.due = now.Add(lateSlack)
		rt.timer.Reset(lateSlack)
		return
	}
	rt.cancel(context.DeadlineExceeded)
}

// restart puts the timeout off to a whole timeout from now. The timer is not re-armed
// here: fire finds the later due time and waits for it, so a restart costs a lock.
func (rt *requestTimer) restart() {
	rt.mu.Lock()
	rt.due = time.Now().Add(rt.timeout)
	rt.mu.Unlock()
}

func (rt *requestTimer) stop() {
	rt.mu.Lock()
	rt.stopped = true
	rt.timer.Stop()
	rt.mu.Unlock()
	rt.cancel(context.Canceled)
}

// restartingBody restarts a request's timer with each read that brings some of the body.
type restartingBody struct {
	io.ReadCloser
	timer *requestTimer
}

func (b *restartingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.timer.restart()
	}
	return n, err
}

// readBody reads a reply's body, at most limit bytes of it: a longer one is errReplyTooLarge,
// found before reading when its Content-Length says so.
func readBody(resp *http.Response, limit int64) ([]byte, error) {
	if resp.ContentLength > limit {
		return nil, errReplyTooLarge
	}
	// Trust a declared length only as far as a small buffer: a peer that declares 63 MiB
	// and sends nothing must not make every poll hold 63 MiB.
	if resp.ContentLength > 0 && resp.ContentLength <= maxPrealloc {
		b := make([]byte, resp.ContentLength)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err == nil && int64(len(b)) > limit {
		return nil, errReplyTooLarge
	}
	return b, err
}

// maxPrealloc is the largest declared Content-Length readBody allocates before reading.
const maxPrealloc = 1 << 20

// errReplyTooLarge is readBody's error for a body over Timing.MaxReplyBytes.
var errReplyTooLarge = errors.New("reply too large")

// statusError turns a non-success reply into a *StatusError with a truncated
// body from which the API key and any JWT are scrubbed (before truncating, so
// that a credential cut in two is scrubbed too).
func (c *Client) statusError(cl *call, r *response) *StatusError {
	text := c.redact(string(r.body))
	if len(text) > maxErrorBody {
		text = text[:maxErrorBody] + "…"
	}
	return &StatusError{Method: cl.method, Endpoint: cl.name, StatusCode: r.status, Body: strings.TrimSpace(text)}
}

// serviceText is text the service wrote for its user (a message, a reason) as it may be
// logged: without credentials, and truncated as an error body is.
func (c *Client) serviceText(s string) string {
	s = c.redact(s)
	if len(s) > maxErrorBody {
		s = s[:maxErrorBody] + "…"
	}
	return s
}

// do runs the HTTP retry layer of §6.1 around roundTrip: up to cl.maxRetries
// retries of connection errors and of replies whose x-should-retry is "true"
// or, absent that header, whose status is 408, 409, 429 or 5xx. The delay is a
// usable Retry-After (0 < v ≤ 60 s) or min(0.5 s·2^n, 10 s)·(1−0.25·U). One
// idempotency key serves all retries. The final reply is returned whatever its
// status.
func (c *Client) do(ctx context.Context, cl *call) (*response, error) {
	idem := ""
	if cl.method != http.MethodGet {
		idem = newIdempotencyKey()
	}
	for n := 0; ; n++ {
		r, err := c.roundTrip(ctx, cl, n, idem)
		if err != nil {
			var ce *ConnectionError
			if !errors.As(err, &ce) || n >= cl.maxRetries {
				return nil, err
			}
		} else if n >= cl.maxRetries || !shouldRetry(r) {
			return r, nil
		}
		var d time.Duration
		ok := false
		if r != nil {
			d, ok = retryAfter(r.header, c.clock.Now())
		}
		if !ok {
			d = httpBackoff(n, c.t.HTTPRetryBase, c.t.HTTPRetryMax, rand.Float64())
		}
		ev := Event{Kind: EventRetry, Endpoint: cl.name, Layer: LayerHTTP, Delay: d, Attempt: n, Err: err, SamplerID: cl.samplerID}
		if r != nil {
			ev.StatusCode = r.status
			ev.Err = c.statusError(cl, r)
		}
		c.emit(ev)
		if err := c.clock.Sleep(ctx, d); err != nil {
			return nil, fmt.Errorf("tinker: %s: %w", cl.name, err)
		}
	}
}

// shouldRetry is the §6.1 rule.
func shouldRetry(r *response) bool {
	switch strings.ToLower(r.header.Get("X-Should-Retry")) {
	case "true":
		return true
	case "false":
		return false
	}
	return retryableStatus(r.status)
}

// httpBackoff is the §6.1 delay before retry n: min(base·2^n, max), reduced by
// up to 25 % (u uniform in [0,1)).
func httpBackoff(n int, base, max time.Duration, u float64) time.Duration {
	if n > 1000 {
		n = 1000
	}
	d := float64(base) * math.Pow(2, float64(n))
	if d > float64(max) {
		d = float64(max)
	}
	return time.Duration(d * (1 - 0.25*u))
}

// retryAfter parses the server's retry hint (§6.1) in the SDK's order:
// retry-after-ms (float milliseconds), retry-after as float seconds, then
// retry-after as an HTTP date minus now. Only 0 < d ≤ 60 s is usable.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	var d time.Duration
	found := false
	if v := h.Get("Retry-After-Ms"); v != "" {
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && !math.IsNaN(f) {
			d, found = time.Duration(f*float64(time.Millisecond)), true
		}
	}
	if !found {
		v := strings.TrimSpace(h.Get("Retry-After"))
		if v == "" {
			return 0, false
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) {
			d, found = time.Duration(f*float64(time.Second)), true
		} else if t, err := http.ParseTime(v); err == nil {
			d, found = t.Sub(now), true
		} else if t, err := time.Parse(time.RFC1123Z, v); err == nil {
			d, found = t.Sub(now), true
		}
	}
	if !found || d <= 0 || d > 60*time.Second {
		return 0, false
	}
	return d, true
}

// doJSON runs do and decodes a 2xx JSON reply into out (nil: ignore the body).
// A non-2xx reply is a *StatusError.
func (c *Client) doJSON(ctx context.Context, cl *call, out any) error {
	r, err := c.do(ctx, cl)
	if err != nil {
		return err
	}
	if r.status < 200 || r.status > 299 {
		return c.statusError(cl, r)
	}
	if out == nil || len(r.body) == 0 && r.status == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(r.body, out); err != nil {
		return &ProtocolError{Endpoint: cl.name, Msg: "decode JSON reply", Err: err}
	}
	return nil
}

// withRetries is execute_with_retries (§6.2): retry timeouts, connection errors
// and HTTP 408/409/429/5xx with waits of min(2^attempt, 30) s, each truncated to
// the 300 s deadline, giving up once the deadline passed; a 402 inside the
// billing window sleeps 5 s without counting as an attempt. check, when not nil,
// runs before every try (stuck detection, §6.3).
func (c *Client) withRetries(ctx context.Context, name, samplerID string, check func() error, fn func(context.Context) error) error {
	start := c.clock.Now()
	deadline := start.Add(c.t.SubmitRetryDeadline)
	attempt := 0
	var last error // the failure retried, which a stuck check's error names (as Sample's does)
	for {
		if check != nil {
			if err := check(); err != nil {
				if last != nil {
					return fmt.Errorf("%w (last error: %v)", err, last)
				}
				return err
			}
		}
		err := fn(ctx)
		last = err
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		var se *StatusError
		if errors.As(err, &se) && se.StatusCode == http.StatusPaymentRequired {
			if !c.billingPause(name, samplerID) {
				return err
			}
			if serr := c.clock.Sleep(ctx, c.t.BillingRetry); serr != nil {
				return fmt.Errorf("tinker: %s: %w", name, serr)
			}
			continue
		}
		var ce *ConnectionError
		retryable := errors.As(err, &ce) || (se != nil && retryableStatus(se.StatusCode))
		now := c.clock.Now()
		if !retryable || !now.Before(deadline) {
			return err
		}
		d := submitBackoff(attempt, c.t.SubmitRetryBase, c.t.SubmitRetryMax)
		if rem := deadline.Sub(now); d > rem {
			d = rem
		}
		c.emit(Event{Kind: EventRetry, Endpoint: name, Layer: LayerSubmit, Delay: d, Attempt: attempt, Err: err, SamplerID: samplerID})
		if serr := c.clock.Sleep(ctx, d); serr != nil {
			return fmt.Errorf("tinker: %s: %w", name, serr)
		}
		attempt++
	}
}

// submitBackoff is min(base·2^attempt, max) (§6.2).
func submitBackoff(attempt int, base, max time.Duration) time.Duration {
	if attempt > 30 {
		return max
	}
	d := base << attempt
	if d > max || d <= 0 {
		d = max
	}
	return d
}

// billingPause records a 402 (§2.3) and reports whether the billing window is
// still open. The window is measured from the first 402 of an incident; an
// incident ends when no 402 was seen for 300 s. A warning is logged at most
// every 60 s and an EventBillingPaused is emitted while the window is open.
func (c *Client) billingPause(endpoint, samplerID string) bool {
	now := c.clock.Now()
	c.billingMu.Lock()
	// §2.3 / SDK _should_pause_on_billing: the incident ends when no 402 was *logged* for
	// 300 s; a 402 past the window neither logs nor moves that time.
	if !c.billingLogged.IsZero() && now.Sub(c.billingLogged) > 300*time.Second {
		c.billingFirst, c.billingLogged = time.Time{}, time.Time{}
	}
	open := c.billingFirst.IsZero() || now.Sub(c.billingFirst) <= c.flags.BillingExceptionMaxPauseDuration
	logIt := open && (c.billingLogged.IsZero() || now.Sub(c.billingLogged) >= 60*time.Second)
	if logIt {
		c.billingLogged = now
	}
	if open && c.billingFirst.IsZero() {
		c.billingFirst = now
	}
	c.billingMu.Unlock()
	if logIt {
		c.log.Warn("tinker: paused for billing (HTTP 402); retrying", "endpoint", endpoint)
	}
	if open {
		c.emit(Event{Kind: EventBillingPaused, Endpoint: endpoint, StatusCode: http.StatusPaymentRequired, SamplerID: samplerID, Delay: c.t.BillingRetry})
	}
	return open
}

func (c *Client) emit(e Event) {
	if e.Kind == EventRetry {
		if se := (*StatusError)(nil); e.StatusCode == 0 && errors.As(e.Err, &se) {
			e.StatusCode = se.StatusCode // the outer layers know the status from their error only
		}
		c.logRetry(e)
	}
	if c.onEvent != nil {
		c.onEvent(e)
	}
}

// retryLogInterval is the least time between two retry warnings of a client.
const retryLogInterval = 30 * time.Second

// logRetry warns that requests fail and are retried, at most every retryLogInterval, with
// how many were since the last warning. Dial against a service it cannot reach retries
// client/config for five minutes (§6.1, §6.2), and in an outage every sample in flight
// retries for as long: without a word, both would pass unseen but in the metrics. A sample's
// 429 is left out: it is the service's backpressure, which the dispatch and the backoff
// handle (§5).
func (c *Client) logRetry(e Event) {
	if e.SamplerID != "" && e.StatusCode == http.StatusTooManyRequests {
		return
	}
	c.retried.Add(1)
	now := c.clock.Now().UnixNano()
	last := c.retryLogged.Load()
	if last != 0 && now-last < int64(retryLogInterval) || !c.retryLogged.CompareAndSwap(last, now) {
		return
	}
	c.log.Warn("tinker: request failed; retrying", "endpoint", e.Endpoint, "status", e.StatusCode, "attempt", e.Attempt+1,
		"in", e.Delay.Round(time.Millisecond), "retried", c.retried.Swap(0), "err", e.Err)
}
