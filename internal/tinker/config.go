package tinker

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// DefaultBaseURL is the production base URL (§1.1).
const DefaultBaseURL = "https://tinker.thinkingmachines.dev/services/tinker-prod"

// SDKVersion is the sdk_version sent in client/config and create_session bodies:
// the reference SDK version whose behaviour this client follows (§0).
const SDKVersion = "0.25.0"

// Config configures [Dial]. Only APIKey (or the environment) is required.
type Config struct {
	// BaseURL is the service root; a path prefix is kept (§1.1). "" means
	// TINKER_BASE_URL, or DefaultBaseURL when that is unset or empty.
	BaseURL string
	// APIKey is the credential. When it and CredentialCmd are both "", both come from the
	// environment ([CredentialsFrom]).
	APIKey APIKey
	// CredentialCmd is a shell command whose trimmed standard output is the credential
	// (TINKER_CREDENTIAL_CMD, §2.1). It runs for every token fetch: for client/config when
	// APIKey is "", and for each JWT exchange (§2.2) when APIKey is "" or the server's
	// credential_default_source is "credential_cmd" (unless APIKey is a JWT, which is
	// exchanged itself, as in the SDK). Without an API key it serves only a
	// server that exchanges credentials for JWTs. Neither the command nor what it prints
	// appears in a log line or an error.
	CredentialCmd string
	// CloudflareAccess is the service token of a Cloudflare Access application in front of
	// the service, sent on every request (§1.1, §1.2). Zero means the environment's
	// CLOUDFLARE_ACCESS_CLIENT_ID and CLOUDFLARE_ACCESS_CLIENT_SECRET, as in the SDK.
	CloudflareAccess CloudflareAccess
	// HTTPClient is used for every request; nil means a client with a pooled
	// transport (HTTP/2 when offered) and a 5 s connect timeout (§1.3). Its
	// Timeout should be 0: per-request timeouts come from Timing.
	HTTPClient *http.Client
	// RootCAs, when set, replaces the system roots in the default client's TLS check of the
	// service (a private CA, the simulator's ListenTLS); ignored when HTTPClient is set. The
	// system roots also follow SSL_CERT_FILE and SSL_CERT_DIR.
	RootCAs *x509.CertPool
	// Logger receives warnings (heartbeat failures, paused queues, billing pauses,
	// failed JWT refreshes); nil discards them. Neither the API key nor a JWT is
	// ever logged.
	Logger *slog.Logger
	// Dispatcher gates asample submissions (§5.1); nil means a per-client gate that
	// only keeps the backoff deadline and has no limits.
	Dispatcher Dispatcher
	// OnEvent is called synchronously for every [Event]; it must be cheap and must
	// not block. nil disables events.
	OnEvent func(Event)
	// Tags and UserMetadata are sent with create_session (§3.3); ProjectID ""
	// means TINKER_PROJECT_ID (omitted when empty).
	Tags         []string
	UserMetadata map[string]string
	ProjectID    string
	// Sessionless makes Dial stop after the flags (a REST-only client, §2): no
	// session and no heartbeat; NewSampler then fails.
	Sessionless bool
	// UserAgent overrides the User-Agent header.
	UserAgent string
	// FutureTimeout gives up a future the service has not answered this long after it
	// accepted the sample: Sample then fails with ErrFutureTimeout, which it does not retry.
	// Zero means no limit: the SDK polls a future for ever (§4.1), so one the service lost
	// holds its caller for ever. It is checked at every poll reply (each long poll, §4.2).
	FutureTimeout time.Duration
	// Timing holds every delay and limit; zero fields take the protocol defaults.
	Timing Timing
}

// CloudflareAccess is a Cloudflare Access service token: each part set is sent in its header,
// CF-Access-Client-Id and CF-Access-Client-Secret.
type CloudflareAccess struct {
	ClientID string
	// ClientSecret is printed redacted, as a key is, and scrubbed from errors.
	ClientSecret APIKey
}

// cloudflareAccessFrom returns a, or, when a is zero, the token getenv gives.
func cloudflareAccessFrom(a CloudflareAccess, getenv func(string) string) CloudflareAccess {
	if a != (CloudflareAccess{}) {
		return a
	}
	return CloudflareAccess{
		ClientID:     strings.TrimSpace(getenv("CLOUDFLARE_ACCESS_CLIENT_ID")),
		ClientSecret: APIKey(strings.TrimSpace(getenv("CLOUDFLARE_ACCESS_CLIENT_SECRET"))),
	}
}

// Clock is the time source of the retry layers, back-off waits, billing window
// and stuck detection. Tests inject a virtual clock so that protocol-sized delays
// (seconds to hours) cost nothing. HTTP timeouts, the heartbeat interval and the
// JWT refresh schedule (§2.2: it follows the server's wall-clock exp claim, and a
// periodic loop on a virtual clock would spin) use real time.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep waits for d or until ctx is done, returning ctx.Err() in that case.
	Sleep(ctx context.Context, d time.Duration) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Timing holds the numbers of the protocol; a zero field takes the default shown.
type Timing struct {
	Clock Clock // nil: the real clock

	// A request's timeout bounds the wait for its reply's headers, then restarts with each
	// piece of the body, as httpx's read timeout does (§1.3).
	RequestTimeout time.Duration // 60 s, per HTTP request (§1.3)
	PollTimeout    time.Duration // 45 s, per retrieve_future request (§1.3)

	HeartbeatInterval time.Duration // 10 s (§3.4)
	HeartbeatTimeout  time.Duration // 10 s (§3.4)
	HeartbeatWarn     time.Duration // 120 s without a successful heartbeat → warning (§3.4)

	JWTRefreshBeforeExpiry time.Duration // 300 s: background JWT refresh this long before exp (§2.2)
	JWTRefreshOnDemand     time.Duration // 60 s: a request refreshes the JWT first when no more remains (§2.2)
	JWTRefreshRetry        time.Duration // 60 s wait after a failed background JWT refresh (§2.2)

	HTTPMaxRetries int           // 10 (§6.1); negative means none
	HTTPRetryBase  time.Duration // 0.5 s (§6.1)
	HTTPRetryMax   time.Duration // 10 s (§6.1)

	SubmitRetryDeadline time.Duration // 300 s (§6.2)
	SubmitRetryBase     time.Duration // 1 s, doubled per attempt (§6.2)
	SubmitRetryMax      time.Duration // 30 s (§6.2)
	BillingRetry        time.Duration // 5 s sleep on 402 inside the billing window (§2.3)

	SampleRetryBase time.Duration // 0.5 s (§6.3)
	SampleRetryMax  time.Duration // 10 s (§6.3)
	SampleJitter    float64       // 0.25 (§6.3)
	ProgressTimeout time.Duration // 7200 s (§6.3)

	PollBackoffBase time.Duration // 1 s, doubled per 429/connection error on polls (§4.2)
	PollBackoffMax  time.Duration // 30 s (§4.2)
	PollFloor       time.Duration // 0: sleep before an immediate re-poll (try_again, 408, 5xx) (§11.6)
	// PollServerErrorBase and PollServerErrorMax space the polls after a 5xx that follows
	// another: 10 ms, doubled per 5xx in a row, up to 1 s. §4.2 polls again at once after
	// every 5xx, which a proxy answering 503 at once through an outage turns into a storm
	// (about 19,000 polls a second for one sample on loopback); §11.6 allows a floor for
	// servers that do not long-poll. The first 5xx is still polled again at once.
	PollServerErrorBase time.Duration
	PollServerErrorMax  time.Duration

	PollBadRequests int // 3 retries of a 400 with a body (§4.2)

	BackoffSmall          time.Duration // 1 s dispatch backoff on asample 429 (§5.3)
	BackoffLarge          time.Duration // 5 s for prompts estimated above BackoffLargeThreshold
	BackoffLargeThreshold int64         // 131072 bytes (§5.1)

	QueueLogEvery time.Duration // 60 s debounce of paused-queue log lines (§4.3)
	Bare400Budget int           // 16 bare 400s converted to connection errors, per traffic class (§1.4)

	// MaxReplyBytes bounds the body of any reply read: 256 MiB, far past the largest result
	// a request can ask for (a long prompt's top-20 logprobs are tens of MiB), so that a
	// misbehaving service or proxy cannot make the client read without end. A larger reply
	// is a *ProtocolError, read no further and not retried.
	MaxReplyBytes int64
}

func (t Timing) withDefaults() Timing {
	d := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	if t.Clock == nil {
		t.Clock = realClock{}
	}
	d(&t.RequestTimeout, 60*time.Second)
	d(&t.PollTimeout, 45*time.Second)
	d(&t.HeartbeatInterval, 10*time.Second)
	d(&t.HeartbeatTimeout, 10*time.Second)
	d(&t.HeartbeatWarn, 120*time.Second)
	d(&t.JWTRefreshBeforeExpiry, 300*time.Second)
	d(&t.JWTRefreshOnDemand, 60*time.Second)
	d(&t.JWTRefreshRetry, 60*time.Second)
	if t.HTTPMaxRetries == 0 {
		t.HTTPMaxRetries = 10
	} else if t.HTTPMaxRetries < 0 {
		t.HTTPMaxRetries = 0
	}
	d(&t.HTTPRetryBase, 500*time.Millisecond)
	d(&t.HTTPRetryMax, 10*time.Second)
	d(&t.PollServerErrorBase, 10*time.Millisecond)
	d(&t.PollServerErrorMax, time.Second)
	d(&t.SubmitRetryDeadline, 300*time.Second)
	d(&t.SubmitRetryBase, time.Second)
	d(&t.SubmitRetryMax, 30*time.Second)
	d(&t.BillingRetry, 5*time.Second)
	d(&t.SampleRetryBase, 500*time.Millisecond)
	d(&t.SampleRetryMax, 10*time.Second)
	if t.SampleJitter == 0 {
		t.SampleJitter = 0.25
	}
	d(&t.ProgressTimeout, 7200*time.Second)
	d(&t.PollBackoffBase, time.Second)
	d(&t.PollBackoffMax, 30*time.Second)
	if t.PollBadRequests == 0 {
		t.PollBadRequests = 3
	}
	d(&t.BackoffSmall, time.Second)
	d(&t.BackoffLarge, 5*time.Second)
	if t.BackoffLargeThreshold == 0 {
		t.BackoffLargeThreshold = 128 << 10
	}
	d(&t.QueueLogEvery, 60*time.Second)
	if t.Bare400Budget == 0 {
		t.Bare400Budget = 16
	}
	if t.MaxReplyBytes == 0 {
		t.MaxReplyBytes = 256 << 20
	}
	return t
}

// Flags are the server feature flags of client/config (§3.1) that matter for
// sampling, with the documented defaults applied for absent fields, plus the
// refresh interval from client/dynamic_config.
type Flags struct {
	PJWTAuthEnabled                    bool          // pjwt_auth_enabled: exchange the API key for a JWT (§2.2)
	CredentialDefaultSource            string        // credential_default_source: what the JWT exchange sends, "api_key" or "credential_cmd" (§2.2)
	SampleDispatchBytesSemaphoreSize   int64         // sample_dispatch_bytes_semaphore_size, 10 MiB (§5.2)
	InflightResponseBytesSemaphoreSize int64         // inflight_response_bytes_semaphore_size, 50 MiB (§4.4)
	BillingExceptionMaxPauseDuration   time.Duration // billing_exception_max_pause_duration_sec, 3600 s (§2.3)
	SampleNoRetries                    bool          // sample_no_retries: bypass §6.3
	SampleEnableStuckDetection         bool          // sample_enable_stuck_detection, true (§6.3)
	SampleMaxConcurrentRequests        int           // sample_max_concurrent_requests, 2000 (§5.4)
	UsePyqwestTransport                bool          // use_pyqwest_transport (informational)
	DynamicConfigRefreshInterval       time.Duration // refresh_interval_sec of dynamic_config, 300 s
}

// DefaultFlags returns the flags a server that sends nothing implies (§3.1).
func DefaultFlags() Flags {
	return Flags{
		CredentialDefaultSource:            "api_key",
		SampleDispatchBytesSemaphoreSize:   10485760,
		InflightResponseBytesSemaphoreSize: 52428800,
		BillingExceptionMaxPauseDuration:   3600 * time.Second,
		SampleEnableStuckDetection:         true,
		SampleMaxConcurrentRequests:        2000,
		UsePyqwestTransport:                true,
		DynamicConfigRefreshInterval:       300 * time.Second,
	}
}

// flagsWire is client/config as JSON: pointers so that absent (or null) fields
// keep their defaults; unknown fields are ignored.
type flagsWire struct {
	PJWTAuthEnabled                    *bool    `json:"pjwt_auth_enabled"`
	CredentialDefaultSource            *string  `json:"credential_default_source"`
	SampleDispatchBytesSemaphoreSize   *int64   `json:"sample_dispatch_bytes_semaphore_size"`
	InflightResponseBytesSemaphoreSize *int64   `json:"inflight_response_bytes_semaphore_size"`
	BillingExceptionMaxPauseSec        *float64 `json:"billing_exception_max_pause_duration_sec"`
	SampleNoRetries                    *bool    `json:"sample_no_retries"`
	SampleEnableStuckDetection         *bool    `json:"sample_enable_stuck_detection"`
	SampleMaxConcurrentRequests        *int     `json:"sample_max_concurrent_requests"`
	UsePyqwestTransport                *bool    `json:"use_pyqwest_transport"`
}

func (w *flagsWire) apply(f *Flags) {
	if w.PJWTAuthEnabled != nil {
		f.PJWTAuthEnabled = *w.PJWTAuthEnabled
	}
	if w.CredentialDefaultSource != nil {
		f.CredentialDefaultSource = *w.CredentialDefaultSource
	}
	if w.SampleDispatchBytesSemaphoreSize != nil {
		f.SampleDispatchBytesSemaphoreSize = *w.SampleDispatchBytesSemaphoreSize
	}
	if w.InflightResponseBytesSemaphoreSize != nil {
		f.InflightResponseBytesSemaphoreSize = *w.InflightResponseBytesSemaphoreSize
	}
	if w.BillingExceptionMaxPauseSec != nil {
		f.BillingExceptionMaxPauseDuration = time.Duration(*w.BillingExceptionMaxPauseSec * float64(time.Second))
	}
	if w.SampleNoRetries != nil {
		f.SampleNoRetries = *w.SampleNoRetries
	}
	if w.SampleEnableStuckDetection != nil {
		f.SampleEnableStuckDetection = *w.SampleEnableStuckDetection
	}
	if w.SampleMaxConcurrentRequests != nil && *w.SampleMaxConcurrentRequests > 0 {
		f.SampleMaxConcurrentRequests = *w.SampleMaxConcurrentRequests
	}
	if w.UsePyqwestTransport != nil {
		f.UsePyqwestTransport = *w.UsePyqwestTransport
	}
}

// Dispatcher is the gate around asample (§5.1). The worker plugs in a fleet-wide
// implementation (dispatch limiter plus fleet backoff); nil in Config means a
// per-client gate that only keeps the backoff deadline.
type Dispatcher interface {
	// Acquire blocks until a submission whose prompt is estimated at estimatedBytes
	// (§5.2) may be sent. release is called once asample is over: with accepted true
	// when the service took the sample (a future came back), false when the
	// submission failed, was refused, or was never sent.
	Acquire(ctx context.Context, estimatedBytes int64) (release func(accepted bool), err error)
	// Wait blocks while a backoff is active.
	Wait(ctx context.Context) error
	// Backoff records that asample answered 429 (or 402 inside the billing
	// window) and that submissions should pause for d (§5.3); reason is
	// BackoffRateLimited or BackoffBilling.
	Backoff(ctx context.Context, reason string, d time.Duration)
}

// The reasons Sampler gives Dispatcher.Backoff. They are the fleet backoff's own (package
// backoff records them as they are), spelled here so that the wire client needs no NATS.
const (
	// BackoffRateLimited: asample answered 429 (§5.1, §5.3).
	BackoffRateLimited = "rate_limited"
	// BackoffBilling: asample answered 402 inside the billing window (§2.3).
	BackoffBilling = "billing"
)
