package tinkersim

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FaultKind names one kind of injected fault.
type FaultKind string

// The fault kinds. Each applies to a default set of endpoints (overridable with
// Fault.Endpoints where it makes sense).
const (
	// FaultRateLimit answers 429 with Retry-After and a JSON body (default endpoint asample, §5.3).
	FaultRateLimit FaultKind = "429"
	// FaultServerError answers a 5xx (Fault.Status, default 500) with the production body shape
	// {"error","message"} (§7.1); default endpoints asample and retrieve_future.
	FaultServerError FaultKind = "5xx"
	// FaultTimeout answers 408; on retrieve_future with a try_again body (§4.2) at once instead
	// of long-polling. Default endpoint retrieve_future.
	FaultTimeout FaultKind = "408"
	// FaultTryAgain200 answers retrieve_future with a 200 try_again at once (§3.7 reply 2).
	FaultTryAgain200 FaultKind = "try_again_200"
	// FaultExpired answers retrieve_future with 410: the future is dropped, so later polls also
	// get 410 and the client must resubmit (§4.2).
	FaultExpired FaultKind = "410"
	// FaultPaymentRequired answers 402 (billing pause, §2.3); default endpoint asample.
	FaultPaymentRequired FaultKind = "402"
	// FaultPausedCapacity is a paused_capacity queue state: polls answer try_again with that
	// queue_state and Fault.Reason, and no future completes while it lasts (§4.3).
	FaultPausedCapacity FaultKind = "paused_capacity"
	// FaultPausedRateLimit is the paused_rate_limit queue state, otherwise like FaultPausedCapacity.
	FaultPausedRateLimit FaultKind = "paused_rate_limit"
	// FaultNeverComplete makes accepted samples never complete (polls long-poll forever); the
	// capacity slot is released at once. Default endpoint asample.
	FaultNeverComplete FaultKind = "never_complete"
	// FaultFailed makes accepted samples complete as failed futures, 200
	// {"error","category"} with Fault.Category user|server|unknown (§7.2).
	FaultFailed FaultKind = "failed"
	// FaultBare400 answers 400 with no body and Content-Length 0, the "Cloudflare reject" of
	// §1.4; default endpoints asample and retrieve_future.
	FaultBare400 FaultKind = "bare_400"
	// FaultDrop answers nothing: the server drops the request (HTTP/1.1 closes the connection,
	// HTTP/2 resets the stream), which a client sees as a connection error, the class §4.2
	// and §6.2 retry with their own waits: a load balancer or a service that is down. Counted
	// in Stats.Requests under status 0. Default endpoints asample and retrieve_future; with
	// endpoints auth/token it is an outage of the JWT exchange (§2.2), which Dial retries in
	// the loop of §6.2.
	FaultDrop FaultKind = "drop"
	// FaultSlowHeartbeat delays session_heartbeat replies by Fault.Delay (§3.4).
	FaultSlowHeartbeat FaultKind = "slow_heartbeat"
	// FaultSlowAccept delays the reply to an accepted asample by Fault.Delay; the sample holds
	// its capacity slot from acceptance, before the reply leaves. A loaded service turns a
	// request away faster than it takes one in, so a client reads some 429s while acceptances
	// sent before them are still on the wire.
	FaultSlowAccept FaultKind = "slow_accept"
	// FaultUnauthorized refuses the credential: requests answer 401 with the detail of an
	// unknown key (or Fault.Reason), as after the key was revoked (§7.1 AuthenticationError).
	// Default endpoints: every API endpoint ("*"); admin endpoints are not affected.
	FaultUnauthorized FaultKind = "401"
	// FaultForbidden answers 403 with a JSON detail (Fault.Reason): the key may not do what
	// the request asks, a model of another account, say (§7.1 PermissionDeniedError); default
	// endpoint asample. On every endpoint ("*") it refuses the key as FaultUnauthorized does.
	FaultForbidden FaultKind = "403"
)

// Fault is one injected misbehaviour. It is active from Start (zero: when injected) for
// Duration (zero: until cleared). Within that window it hits each matching request with
// probability Rate (zero or ≥ 1: every request), drawn from the server's seeded RNG, until
// it has hit Count requests (zero: no bound).
type Fault struct {
	// Kind selects the misbehaviour.
	Kind FaultKind
	// Endpoints restricts the fault to these endpoint names ("asample", "retrieve_future",
	// "create_session", "client/config", "auth/token", … or "*"); empty means the kind's default.
	Endpoints []string
	// Rate is the probability per matching request; 0 means always.
	Rate float64
	// Count bounds the requests the fault hits (0: no bound); Count 1 with kind 429 is a
	// lone 429, as from another client's load for a moment.
	Count int
	// Start is when the window opens; zero means at injection.
	Start time.Time
	// Duration is the window length; zero means until cleared.
	Duration time.Duration
	// Reason is the queue_state_reason of a pause, or the message of an error body.
	Reason string
	// Category is the failure category of FaultFailed: "user", "server" or "unknown".
	Category string
	// Status is the HTTP status of FaultServerError (500–599, default 500).
	Status int
	// Delay is the added latency of FaultSlowHeartbeat and FaultSlowAccept.
	Delay time.Duration
	// RetryAfter overrides Config.RetryAfter for FaultRateLimit.
	RetryAfter time.Duration
	// ShouldRetry, "true" or "false", adds the header x-should-retry with that value to the
	// reply of a kind that answers with a status (429, 5xx, 408, 402, bare_400, 401, 403).
	// The SDK's HTTP retry layer obeys it over the status (§6.1): "false" forbids retrying
	// any status, "true" retries even one it otherwise would not (a 403, say). Calls without
	// HTTP-level retries (asample, retrieve_future, session_heartbeat: §1.3, §3.6) ignore it.
	// Empty: no header.
	ShouldRetry string
}

// FaultID identifies an injected fault.
type FaultID int

// defaultEndpoints lists where each kind applies when Fault.Endpoints is empty.
var defaultEndpoints = map[FaultKind][]string{
	FaultRateLimit:       {epAsample},
	FaultServerError:     {epAsample, epRetrieveFuture},
	FaultTimeout:         {epRetrieveFuture},
	FaultTryAgain200:     {epRetrieveFuture},
	FaultExpired:         {epRetrieveFuture},
	FaultPaymentRequired: {epAsample},
	FaultPausedCapacity:  {epRetrieveFuture},
	FaultPausedRateLimit: {epRetrieveFuture},
	FaultNeverComplete:   {epAsample},
	FaultFailed:          {epAsample},
	FaultBare400:         {epAsample, epRetrieveFuture},
	FaultDrop:            {epAsample, epRetrieveFuture},
	FaultSlowHeartbeat:   {epHeartbeat},
	FaultSlowAccept:      {epAsample},
	FaultUnauthorized:    {"*"},
	FaultForbidden:       {epAsample},
}

// statusKinds answer with an HTTP status, so their reply can carry x-should-retry.
var statusKinds = map[FaultKind]bool{
	FaultRateLimit: true, FaultServerError: true, FaultTimeout: true, FaultPaymentRequired: true,
	FaultBare400: true, FaultUnauthorized: true, FaultForbidden: true,
}

// fixedEndpointKinds cannot be moved to other endpoints: their effect is specific to one.
var fixedEndpointKinds = map[FaultKind]bool{
	FaultTryAgain200: true, FaultExpired: true, FaultPausedCapacity: true, FaultPausedRateLimit: true,
	FaultNeverComplete: true, FaultFailed: true, FaultSlowHeartbeat: true,
	FaultSlowAccept: true,
}

// validate checks f and fills in defaults.
func (f Fault) validate() (Fault, error) {
	def, ok := defaultEndpoints[f.Kind]
	if !ok {
		return f, fmt.Errorf("unknown fault kind %q", f.Kind)
	}
	if f.Rate < 0 || math.IsNaN(f.Rate) {
		return f, fmt.Errorf("fault %s: rate must be a probability, not %v", f.Kind, f.Rate)
	}
	if f.Count < 0 {
		return f, fmt.Errorf("fault %s: count must not be negative", f.Kind)
	}
	if f.Duration < 0 || f.Delay < 0 || f.RetryAfter < 0 {
		return f, fmt.Errorf("fault %s: durations must not be negative", f.Kind)
	}
	if len(f.Endpoints) == 0 {
		f.Endpoints = def
	} else if fixedEndpointKinds[f.Kind] && !slices.Equal(f.Endpoints, def) {
		return f, fmt.Errorf("fault %s only applies to %s", f.Kind, strings.Join(def, ","))
	}
	for _, e := range f.Endpoints {
		if e != "*" && !slices.Contains(apiEndpoints, e) { // a typo would match nothing, silently
			return f, fmt.Errorf("fault %s: no endpoint is called %q (the names are those of /api/v1/: %s, or *)", f.Kind, e, strings.Join(apiEndpoints, ", "))
		}
	}
	switch f.ShouldRetry {
	case "":
	case "true", "false":
		if !statusKinds[f.Kind] {
			return f, fmt.Errorf("fault %s: should_retry needs a kind that answers with a status (429, 5xx, 408, 402, bare_400, 401, 403)", f.Kind)
		}
	default:
		return f, fmt.Errorf("fault %s: should_retry %q is not true or false", f.Kind, f.ShouldRetry)
	}
	switch f.Kind {
	case FaultServerError:
		if f.Status == 0 {
			f.Status = 500
		}
		if f.Status < 500 || f.Status > 599 {
			return f, fmt.Errorf("fault 5xx: status %d is not 5xx", f.Status)
		}
	case FaultFailed:
		if f.Category == "" {
			f.Category = "unknown"
		}
		if f.Category != "user" && f.Category != "server" && f.Category != "unknown" {
			return f, fmt.Errorf("fault failed: category %q is not user, server or unknown", f.Category)
		}
	case FaultSlowHeartbeat, FaultSlowAccept:
		if f.Delay == 0 {
			return f, fmt.Errorf("fault %s: needs a delay", f.Kind)
		}
	case FaultPausedCapacity, FaultPausedRateLimit:
		if (f.Rate != 0 && f.Rate < 1) || f.Count != 0 {
			return f, fmt.Errorf("fault %s: is a window, a rate or count makes no sense", f.Kind)
		}
	}
	return f, nil
}

// windowed reports whether the stats keep a per-window count of asample calls for this kind.
func (k FaultKind) windowed() bool {
	switch k {
	case FaultRateLimit, FaultPaymentRequired, FaultPausedCapacity, FaultPausedRateLimit, FaultUnauthorized:
		return true
	}
	return false
}

// pause reports whether the kind is a paused queue state.
func (k FaultKind) pause() bool { return k == FaultPausedCapacity || k == FaultPausedRateLimit }

// activeFault is an injected fault with its window resolved.
type activeFault struct {
	id    FaultID
	f     Fault
	start time.Time
	end   time.Time // zero: open
	win   *windowStat
	hits  int // requests hit so far (bounded by f.Count)
}

func (a *activeFault) activeAt(now time.Time) bool {
	return !now.Before(a.start) && (a.end.IsZero() || now.Before(a.end))
}

func (a *activeFault) appliesTo(endpoint string) bool {
	for _, e := range a.f.Endpoints {
		if e == endpoint || e == "*" {
			return true
		}
	}
	return false
}

// ParseFault reads the command-line form of a fault: comma-separated key=value pairs, e.g.
// "kind=429,duration=30s", "kind=5xx,rate=0.05,status=503,endpoints=asample+retrieve_future",
// "kind=paused_capacity,start=10s,duration=20s,reason=short on capacity",
// "kind=failed,category=user,rate=0.1", "kind=slow_heartbeat,delay=15s",
// "kind=403,endpoints=create_sampling_session,count=1,should_retry=true".
// Keys: kind, rate, count, start (delay from injection), duration, reason, category, status,
// delay, retry_after, should_retry, endpoints (joined by "+"). The reason must come last if it contains commas.
func ParseFault(spec string, now time.Time) (Fault, error) {
	var f Fault
	rest := spec
	for rest != "" {
		var part string
		part, rest, _ = strings.Cut(rest, ",")
		key, val, ok := strings.Cut(part, "=")
		if !ok {
			return f, fmt.Errorf("fault %q: %q is not key=value", spec, part)
		}
		key = strings.TrimSpace(key)
		var err error
		switch key {
		case "kind":
			f.Kind = FaultKind(val)
		case "rate":
			f.Rate, err = strconv.ParseFloat(val, 64)
		case "count":
			f.Count, err = strconv.Atoi(val)
		case "start":
			var d time.Duration
			d, err = time.ParseDuration(val)
			if err == nil && d < 0 {
				err = errors.New("a delay from injection must not be negative")
			}
			f.Start = now.Add(d)
		case "duration":
			f.Duration, err = time.ParseDuration(val)
		case "reason":
			f.Reason = val
			if rest != "" {
				f.Reason += "," + rest
				rest = ""
			}
		case "category":
			f.Category = val
		case "status":
			f.Status, err = strconv.Atoi(val)
		case "delay":
			f.Delay, err = time.ParseDuration(val)
		case "retry_after":
			f.RetryAfter, err = time.ParseDuration(val)
		case "should_retry":
			f.ShouldRetry = val
		case "endpoints":
			f.Endpoints = strings.Split(val, "+")
		default:
			return f, fmt.Errorf("fault %q: unknown key %q", spec, key)
		}
		if err != nil {
			return f, fmt.Errorf("fault %q: key %s: %w", spec, key, err)
		}
	}
	v, err := f.validate()
	if err != nil {
		return f, fmt.Errorf("fault %q: %w", spec, err)
	}
	return v, nil
}

// faultJSON is the admin-endpoint form of a Fault (durations as Go duration strings).
type faultJSON struct {
	Kind       *string  `json:"kind"`
	Endpoints  []string `json:"endpoints,omitempty"`
	Rate       float64  `json:"rate,omitempty"`
	Count      int      `json:"count,omitempty"`
	StartIn    string   `json:"start_in,omitempty"`
	Duration   string   `json:"duration,omitempty"`
	Reason     string   `json:"reason,omitempty"`
	Category   string   `json:"category,omitempty"`
	Status     int      `json:"status,omitempty"`
	Delay      string   `json:"delay,omitempty"`
	RetryAfter string   `json:"retry_after,omitempty"`
	// ShouldRetry is a JSON boolean here; absent means no header.
	ShouldRetry *bool `json:"should_retry,omitempty"`
}

// toFault converts the admin form, resolving start_in against now.
func (j *faultJSON) toFault(now time.Time) (Fault, error) {
	if j.Kind == nil {
		return Fault{}, errors.New("field \"kind\" is required")
	}
	f := Fault{Kind: FaultKind(*j.Kind), Endpoints: j.Endpoints, Rate: j.Rate, Count: j.Count, Reason: j.Reason, Category: j.Category, Status: j.Status}
	if j.ShouldRetry != nil {
		f.ShouldRetry = strconv.FormatBool(*j.ShouldRetry)
	}
	parse := func(name, v string, dst *time.Duration) error {
		if v == "" {
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("field %q: %w", name, err)
		}
		*dst = d
		return nil
	}
	var startIn time.Duration
	if err := errors.Join(parse("start_in", j.StartIn, &startIn), parse("duration", j.Duration, &f.Duration),
		parse("delay", j.Delay, &f.Delay), parse("retry_after", j.RetryAfter, &f.RetryAfter)); err != nil {
		return Fault{}, err
	}
	if startIn < 0 {
		return Fault{}, errors.New("field \"start_in\": a delay from injection must not be negative")
	}
	if startIn > 0 {
		f.Start = now.Add(startIn)
	}
	return f, nil
}

// FaultInfo describes an injected fault, as listed by Faults and GET /admin/faults.
type FaultInfo struct {
	// ID identifies the fault for RemoveFault.
	ID FaultID `json:"id"`
	// Kind is the fault kind.
	Kind FaultKind `json:"kind"`
	// Endpoints are the endpoints it applies to.
	Endpoints []string `json:"endpoints"`
	// Rate is the per-request probability (0: always).
	Rate float64 `json:"rate,omitempty"`
	// Count bounds the requests the fault hits (0: no bound), and Hits is those it hit.
	Count int `json:"count,omitempty"`
	Hits  int `json:"hits"`
	// Start is when the window opens.
	Start time.Time `json:"start"`
	// End is when it closes; nil when open-ended.
	End *time.Time `json:"end,omitempty"`
	// Reason is the pause reason or error message.
	Reason string `json:"reason,omitempty"`
	// Category is the failure category of a "failed" fault.
	Category string `json:"category,omitempty"`
	// Status is the HTTP status of a "5xx" fault.
	Status int `json:"status,omitempty"`
	// ShouldRetry is the x-should-retry value the fault's replies carry ("": none).
	ShouldRetry string `json:"should_retry,omitempty"`
}
