package tinker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Client is a Tinker session: server flags, a session id and its heartbeat. It
// is safe for concurrent use. Create it with [Dial] and stop it with Close.
type Client struct {
	base      string                 // base URL with a trailing slash (§1.1)
	key       atomic.Pointer[APIKey] // "" with cmd alone; replaced by SetAPIKey (printing the struct shows an address)
	keyMu     sync.Mutex             // serialises SetAPIKey; guards retired
	retired   []APIKey               // the last keys SetAPIKey replaced, still redacted (at most maxRetiredKeys)
	cmd       *credentialCmd         // TINKER_CREDENTIAL_CMD (§2.1); nil when not set
	viaCmd    bool                   // the JWT exchange sends the command's credential, not the key (§2.2)
	jwt       *jwtAuth               // the JWT that replaces key in X-API-Key (§2.2); nil when not exchanged
	cf        CloudflareAccess       // sent on every request; zero: none
	hc        *http.Client
	ownHC     bool
	pool      *poolTransport // the default client's transport, replaced after a bare 400 (§1.4); nil with Config.HTTPClient
	log       *slog.Logger
	disp      Dispatcher
	onEvent   func(Event)
	clock     Clock
	t         Timing
	userAgent string
	flags     Flags
	// futureTimeout is Config.FutureTimeout.
	futureTimeout time.Duration

	sessionID   atomic.Pointer[string] // nil when sessionless; replaced by renewSession
	sessionBody []byte                 // the create_session request, sent again by renewSession
	renewing    chan struct{}          // one renewSession at a time: a lock a waiter's context can abandon

	samplerSeq  atomic.Int64                    // sampling_session_seq_id counter (§3.5)
	retryLogged atomic.Int64                    // clock time (unix nanos) of the last retry warning (logRetry)
	retried     atomic.Int64                    // requests retried since the last retry warning
	bare400     [numTrafficClasses]atomic.Int64 // remaining bare-400 conversions per traffic class (§1.4)
	inflight    *byteSemaphore

	billingMu     sync.Mutex
	billingFirst  time.Time
	billingLogged time.Time

	closeOnce sync.Once
	closed    atomic.Bool
	hbCancel  context.CancelFunc
	hbDone    chan struct{}
}

// Dial starts a client the way the reference SDK does (§2): client/config
// (§3.1), the JWT exchange when the server sets pjwt_auth_enabled (§2.2),
// client/dynamic_config (404 → defaults), create_session (§3.3) and a heartbeat
// every Timing.HeartbeatInterval (§3.4). With Config.Sessionless it stops after
// the flags.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	if err := c.start(ctx, cfg); err != nil {
		_ = c.Close() // stops a JWT refresh already started
		return nil, err
	}
	return c, nil
}

func newClient(cfg Config) (*Client, error) {
	base := cfg.BaseURL
	if base == "" {
		base = os.Getenv("TINKER_BASE_URL")
	}
	if base == "" {
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("tinker: invalid base URL %q", shownURL(base))
	}
	if strings.Contains(u.Path+u.RawQuery+u.Fragment, "@") {
		// A password holding an unescaped '/', '?' or '#' ended the host there: the request
		// would go to the password's start, and its errors would show the rest as a path.
		return nil, fmt.Errorf("tinker: base URL %q: its user information cannot be read: percent-encode a '/', '?', '#' or '%%' of a password in the URL (%%2F, %%3F, %%23, %%25)", shownURL(base))
	}
	if !strings.HasSuffix(base, "/") {
		base += "/" // §1.1: force a trailing slash, then append the relative path
	}
	key, cmd := cfg.APIKey, strings.TrimSpace(cfg.CredentialCmd)
	if key == "" && cmd == "" {
		if key, cmd, err = CredentialsFrom(os.Getenv); err != nil {
			return nil, err
		}
	} else if key != "" {
		if err := key.Validate(); err != nil {
			return nil, err
		}
	}
	c := &Client{
		base:          base,
		cf:            cloudflareAccessFrom(cfg.CloudflareAccess, os.Getenv),
		hc:            cfg.HTTPClient,
		log:           cfg.Logger,
		disp:          cfg.Dispatcher,
		onEvent:       cfg.OnEvent,
		t:             cfg.Timing.withDefaults(),
		userAgent:     cfg.UserAgent,
		flags:         DefaultFlags(),
		futureTimeout: cfg.FutureTimeout,
		renewing:      make(chan struct{}, 1),
	}
	c.key.Store(&key)
	c.clock = c.t.Clock
	if cmd != "" {
		c.cmd = &credentialCmd{cmd: cmd}
	}
	if c.hc == nil {
		c.pool = newPoolTransport(defaultTransport(cfg.RootCAs))
		c.hc, c.ownHC = &http.Client{Transport: c.pool}, true
	}
	c.hc = keepCredentialHome(c.hc)
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.disp == nil {
		c.disp = &localDispatcher{clock: c.clock}
	}
	if c.userAgent == "" {
		c.userAgent = "tinkerfleet-go/" + SDKVersion
	}
	for i := range c.bare400 {
		c.bare400[i].Store(int64(c.t.Bare400Budget))
	}
	return c, nil
}

func defaultTransport(roots *x509.CertPool) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if roots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 512
	tr.ForceAttemptHTTP2 = true
	// HTTP/2 carries every request over one connection, and a request's timeout resets only
	// its own stream: a connection whose link died without closing (a NAT or load balancer
	// that forgot the flow) took each request to its timeout and the next ones with it, for
	// as long as TCP took to give up. Pinged after h2PingAfter without a frame, and closed
	// when the pong is h2PingAfter late, it ends 10-20 s after its last frame; its requests
	// then fail as connection errors, which are tried again on a new connection (§6.2).
	tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: h2PingAfter, PingTimeout: h2PingAfter}
	return tr
}

// poolTransport is the default client's transport: one pool of connections that a bare 400
// replaces by a fresh one, as the SDK replaces the pool client that met it (§1.4). Closing
// the idle connections alone is not enough over HTTP/2: every request shares one
// connection, which is not idle while any other request (a long poll) is in flight, so the
// retry went down the very connection that was rejected. The old pool's requests in flight
// finish on it; its connections close as they fall idle (IdleConnTimeout), or at
// CloseIdleConnections (Client.Close), which closes the idle ones of the old pools too.
type poolTransport struct {
	mu      sync.Mutex
	cur     atomic.Pointer[http.Transport]
	gen     atomic.Uint64 // bumped by each replacement
	retired []retiredPool // the pools replaced within the last retiredFor
}

// retiredPool is a pool a bare 400 replaced, and when.
type retiredPool struct {
	tr *http.Transport
	at time.Time
}

// retiredFor is how long a replaced pool is kept for CloseIdleConnections: longer than a
// request it carried lasts and then its connections' IdleConnTimeout, after which they have
// closed by themselves.
const retiredFor = 10 * time.Minute

func newPoolTransport(tr *http.Transport) *poolTransport {
	p := &poolTransport{}
	p.cur.Store(tr)
	return p
}

func (p *poolTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return p.cur.Load().RoundTrip(r)
}

// CloseIdleConnections closes the idle connections of the current pool and of the pools it
// replaced (http.Client's closeIdler).
func (p *poolTransport) CloseIdleConnections() {
	p.mu.Lock()
	retired := slices.Clone(p.retired)
	p.mu.Unlock()
	for _, r := range retired {
		r.tr.CloseIdleConnections()
	}
	p.cur.Load().CloseIdleConnections()
}

// replace puts a fresh pool in place of the one of generation gen (read before the rejected
// request was sent), unless another bare 400 has replaced it already.
func (p *poolTransport) replace(gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen.Load() != gen {
		return
	}
	old := p.cur.Load()
	p.cur.Store(old.Clone())
	p.gen.Add(1)
	old.CloseIdleConnections()
	now := time.Now()
	p.retired = slices.DeleteFunc(p.retired, func(r retiredPool) bool { return now.Sub(r.at) > retiredFor })
	p.retired = append(p.retired, retiredPool{tr: old, at: now})
}

// keepCredentialHome returns a copy of hc that follows a redirect (§1.4: the SDK does) only
// to the host it was sent to, and never from https to http. A redirect carries every header
// of the request on, and Go leaves out only Authorization and cookies on one to another
// domain: X-API-Key would reach the other host. A redirect it does not follow ends the
// request with a *redirectedAwayError. hc's own redirect policy, if any, applies after.
func keepCredentialHome(hc *http.Client) *http.Client {
	kept := *hc
	next := hc.CheckRedirect
	kept.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		from, to := via[0].URL, req.URL
		if !strings.EqualFold(to.Host, from.Host) || (from.Scheme == "https" && to.Scheme != "https") {
			return &redirectedAwayError{to: to.Scheme + "://" + to.Host}
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &kept
}

// shownURL is raw as errors and logs show it: without the user information before its last
// '@' (a proxy's password, or a token as the user name), even where raw does not parse.
// net/http's own errors hide only a password, and only of a URL that parses.
func shownURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		scheme, rest = "", raw
	} else {
		scheme += "://"
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return raw
	}
	return scheme + "redacted@" + rest[at+1:]
}

// redirectedAwayError is the error of a redirect keepCredentialHome does not follow.
type redirectedAwayError struct{ to string } // scheme and host only: a URL may hold secrets

func (e *redirectedAwayError) Error() string {
	return fmt.Sprintf("redirected to %s, not followed: the credential goes to the Tinker service's host only (is the base URL right?)", e.to)
}

// h2PingAfter is how long an HTTP/2 connection of the default client may be silent before
// it is pinged, and how long the pong may take before the connection is closed.
const h2PingAfter = 10 * time.Second

type sdkVersionBody struct {
	SDKVersion string `json:"sdk_version"`
}

func (c *Client) start(ctx context.Context, cfg Config) error {
	body := mustJSON(sdkVersionBody{SDKVersion: SDKVersion})
	// 1. client/config, wrapped in the 300 s loop; a 404 is fatal (§2).
	var fw flagsWire
	err := c.withRetries(ctx, "client/config", "", nil, func(ctx context.Context) error {
		fw = flagsWire{}
		return c.doJSON(ctx, &call{name: "client/config", method: http.MethodPost, path: "api/v1/client/config",
			body: body, maxRetries: c.t.HTTPMaxRetries}, &fw)
	})
	if err != nil {
		return fmt.Errorf("tinker: fetch client config: %w", err)
	}
	fw.apply(&c.flags)
	// 2. JWT exchange when pjwt_auth_enabled (§2 step 2, §2.2): every later request
	// carries the JWT.
	if err := c.startAuth(ctx); err != nil {
		return err
	}
	// 3. client/dynamic_config: no HTTP retries, 10 s timeout, 300 s loop at start-up;
	// 404 means defaults (§2 step 3).
	var dyn struct {
		RefreshIntervalSec *float64 `json:"refresh_interval_sec"`
	}
	err = c.withRetries(ctx, "client/dynamic_config", "", nil, func(ctx context.Context) error {
		return c.doJSON(ctx, &call{name: "client/dynamic_config", method: http.MethodPost,
			path: "api/v1/client/dynamic_config", body: body, timeout: 10 * time.Second}, &dyn)
	})
	var se *StatusError
	switch {
	case errors.As(err, &se) && se.StatusCode == http.StatusNotFound:
	case err != nil:
		return fmt.Errorf("tinker: fetch dynamic config: %w", err)
	case dyn.RefreshIntervalSec != nil:
		c.flags.DynamicConfigRefreshInterval = time.Duration(*dyn.RefreshIntervalSec * float64(time.Second))
	}
	c.inflight = newByteSemaphore(c.flags.InflightResponseBytesSemaphoreSize)
	if cfg.Sessionless {
		return nil
	}
	// 4. create_session (§3.3), 10 HTTP retries.
	if err := c.createSession(ctx, cfg); err != nil {
		return err
	}
	// 5. heartbeat (§3.4), owned by the client and stopped by Close.
	hctx, cancel := context.WithCancel(context.Background())
	c.hbCancel, c.hbDone = cancel, make(chan struct{})
	go c.heartbeat(hctx)
	return nil
}

type createSessionBody struct {
	Tags         []string          `json:"tags"`
	UserMetadata map[string]string `json:"user_metadata"`
	SDKVersion   string            `json:"sdk_version"`
	ProjectID    string            `json:"project_id,omitempty"`
	Type         string            `json:"type"`
}

func (c *Client) createSession(ctx context.Context, cfg Config) error {
	b := createSessionBody{Tags: cfg.Tags, UserMetadata: cfg.UserMetadata, SDKVersion: SDKVersion,
		ProjectID: cfg.ProjectID, Type: "create_session"}
	if b.ProjectID == "" {
		b.ProjectID = os.Getenv("TINKER_PROJECT_ID")
	}
	if b.Tags == nil {
		b.Tags = envTags(os.Getenv("TINKER_TAGS"))
	}
	if b.UserMetadata == nil {
		b.UserMetadata = map[string]string{}
	}
	c.sessionBody = mustJSON(b)
	id, err := c.openSession(ctx)
	if err != nil {
		return err
	}
	c.setSession(id)
	return nil
}

// openSession sends create_session (§3.3) and returns the new session's id.
func (c *Client) openSession(ctx context.Context) (string, error) {
	var out struct {
		SessionID      string  `json:"session_id"`
		InfoMessage    *string `json:"info_message"`
		WarningMessage *string `json:"warning_message"`
		ErrorMessage   *string `json:"error_message"`
	}
	cl := &call{name: "create_session", method: http.MethodPost, path: "api/v1/create_session",
		body: c.sessionBody, maxRetries: c.t.HTTPMaxRetries}
	if err := c.doJSON(ctx, cl, &out); err != nil {
		return "", fmt.Errorf("tinker: create session: %w", err)
	}
	if out.SessionID == "" {
		return "", &ProtocolError{Endpoint: "create_session", Msg: "reply has no session_id"}
	}
	// The service's messages to its user, without the credentials they may name.
	if out.InfoMessage != nil {
		c.log.Info("tinker: " + c.serviceText(*out.InfoMessage))
	}
	if out.WarningMessage != nil {
		c.log.Warn("tinker: " + c.serviceText(*out.WarningMessage))
	}
	if out.ErrorMessage != nil {
		c.log.Error("tinker: " + c.serviceText(*out.ErrorMessage))
	}
	return out.SessionID, nil
}

func (c *Client) setSession(id string) { c.sessionID.Store(&id) }

// renewSession replaces the session stale, which the service no longer knows (it restarted,
// or ended the session after heartbeats it missed, §3.4), with a new one. The SDK keeps such
// a session, and every sampler it creates later fails; a worker of a fleet must go on.
// Callers that find the same stale session share one create_session; one that waits for
// another's gives up when its ctx ends (the other's may retry for minutes, §6.1).
func (c *Client) renewSession(ctx context.Context, stale string) error {
	select {
	case c.renewing <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("tinker: renew session %s, which the service no longer knows: %w", stale, ctx.Err())
	}
	defer func() { <-c.renewing }()
	if c.SessionID() != stale {
		return nil // renewed already
	}
	id, err := c.openSession(ctx)
	if err != nil {
		return fmt.Errorf("tinker: renew session %s, which the service no longer knows: %w", stale, err)
	}
	c.samplerSeq.Store(0) // a new session's sampling sessions count from 0 again (§3.5)
	c.setSession(id)
	c.log.Warn("tinker: the service no longer knows the session (restarted, or ended it after missed heartbeats): a new one replaces it",
		"old_session_id", stale, "session_id", id)
	return nil
}

// sessionLost reports whether the service no longer knows session id: one heartbeat of it
// answers 404.
func (c *Client) sessionLost(ctx context.Context, id string) bool {
	var se *StatusError
	err := c.doJSON(ctx, c.heartbeatCall(id), nil)
	return errors.As(err, &se) && se.StatusCode == http.StatusNotFound
}

// CheckCredential asks the service whether it accepts this client's credential now, after a
// request was refused with 401 or 403 (§7.1): with JWT exchange on, it first mints a new JWT
// (the service may have stopped honouring the one in use, §2.2), then sends one
// session_heartbeat (§3.4). It returns nil when the service accepted the credential (a
// heartbeat answered 404, for a session the service no longer knows, accepted it too), an
// error for which CredentialRefused is true when the service refused it, and another error
// when it could not tell (the service unreachable, say).
func (c *Client) CheckCredential(ctx context.Context) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if a := c.jwt; a != nil {
		if !a.lock(ctx) {
			return fmt.Errorf("tinker: check credential: %w", ctx.Err())
		}
		err := a.refresh(ctx)
		a.unlock()
		if err != nil {
			return fmt.Errorf("tinker: check credential: %w", err)
		}
	}
	err := c.doJSON(ctx, c.heartbeatCall(c.SessionID()), nil)
	var se *StatusError
	if err == nil || errors.As(err, &se) && se.StatusCode == http.StatusNotFound {
		return nil
	}
	return fmt.Errorf("tinker: check credential: %w", err)
}

// apiKey is the API key in use ("" when the credential command alone authenticates).
func (c *Client) apiKey() APIKey { return *c.key.Load() }

// SetAPIKey replaces the API key that later requests send (§2.1), or exchange for JWTs
// (§2.2), as after the key was rotated: a worker reads TINKER_API_KEY_FILE again when the
// service refuses its key. k must pass [APIKey.Validate] and be of the kind of the key in use
// (an API key for an API key, a JWT for a JWT), since that kind decided at Dial how the
// client authenticates. SetAPIKey reports whether k differs from the key in use.
func (c *Client) SetAPIKey(k APIKey) (changed bool, err error) {
	if err := k.Validate(); err != nil {
		return false, err
	}
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	old := c.apiKey()
	if isJWT := strings.HasPrefix(string(k), "eyJ"); old == "" || isJWT != strings.HasPrefix(string(old), "eyJ") {
		return false, errors.New("tinker: the new credential is not of the kind of the one in use (an API key for an API key, a JWT for a JWT)")
	}
	if k == old {
		return false, nil
	}
	c.key.Store(&k)
	// A reply may still echo the key just replaced (a request sent before the swap), or the
	// one before it: those stay redacted.
	c.retired = append(c.retired, old)
	if len(c.retired) > maxRetiredKeys {
		c.retired = c.retired[len(c.retired)-maxRetiredKeys:]
	}
	return true, nil
}

// maxRetiredKeys is how many replaced keys the client still redacts.
const maxRetiredKeys = 4

// retiredKeys returns the keys SetAPIKey replaced that the client still redacts.
func (c *Client) retiredKeys() []APIKey {
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	return slices.Clone(c.retired)
}

// heartbeatCall is one session_heartbeat of session id (§3.4): no retries, a 10 s timeout.
func (c *Client) heartbeatCall(id string) *call {
	body := mustJSON(struct {
		SessionID string `json:"session_id"`
		Type      string `json:"type"`
	}{id, "session_heartbeat"})
	return &call{name: "session_heartbeat", method: http.MethodPost, path: "api/v1/session_heartbeat",
		body: body, timeout: c.t.HeartbeatTimeout}
}

func envTags(s string) []string {
	tags := []string{}
	seen := map[string]bool{}
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" && !seen[t] {
			seen[t] = true
			tags = append(tags, t)
		}
	}
	return tags
}

// heartbeat sends session_heartbeat every interval (sleep first), with no
// retries and a 10 s timeout; failures are reported and, after 120 s without
// success, logged as warnings (§3.4). A 404 says the service no longer knows the
// session: a new one replaces it (renewSession).
func (c *Client) heartbeat(ctx context.Context) {
	defer close(c.hbDone)
	id := c.SessionID()
	cl := c.heartbeatCall(id)
	lastOK := time.Now()
	t := time.NewTimer(c.t.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if now := c.SessionID(); now != id {
			id, cl = now, c.heartbeatCall(now)
		}
		err := c.doJSON(ctx, cl, nil)
		var se *StatusError
		switch {
		case err == nil:
			lastOK = time.Now()
		case ctx.Err() != nil:
			return
		case errors.As(err, &se) && se.StatusCode == http.StatusNotFound:
			c.emit(Event{Kind: EventHeartbeatFailed, Endpoint: cl.name, Err: err})
			if rerr := c.renewSession(ctx, id); rerr != nil && ctx.Err() == nil {
				c.log.Warn("tinker: session lost; a new one is tried again at the next heartbeat", "err", rerr)
			}
		default:
			c.emit(Event{Kind: EventHeartbeatFailed, Endpoint: cl.name, Err: err})
			if since := time.Since(lastOK); since > c.t.HeartbeatWarn {
				c.log.Warn("tinker: session heartbeat failing; the session will be terminated",
					"session_id", id, "since", since.Round(time.Second), "err", err)
			}
		}
		t.Reset(c.t.HeartbeatInterval)
	}
}

// Close stops the heartbeat and the background JWT refresh (§2.2) and releases
// idle connections of a client-owned transport. It is idempotent. In-flight calls
// are not interrupted (cancel their contexts for that); new samplers and samples
// fail with ErrClosed.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		if c.hbCancel != nil {
			c.hbCancel()
			<-c.hbDone
		}
		if c.jwt != nil {
			c.jwt.stop()
		}
		c.closeTransport()
	})
	return nil
}

func (c *Client) closeTransport() {
	if c.ownHC {
		c.hc.CloseIdleConnections()
	}
}

// Flags returns the server flags read at Dial (§3.1).
func (c *Client) Flags() Flags { return c.flags }

// SessionID returns the session id from create_session ("" when sessionless); it changes when
// the service no longer knows the session and a new one replaces it.
func (c *Client) SessionID() string {
	if id := c.sessionID.Load(); id != nil {
		return *id
	}
	return ""
}

// SupportedModel is one entry of get_server_capabilities (§3.8).
type SupportedModel struct {
	ModelName        string `json:"model_name"`
	MaxContextLength int    `json:"max_context_length"` // 0 when the server did not say
}

// Capabilities is the reply of get_server_capabilities (§3.8).
type Capabilities struct {
	SupportedModels []SupportedModel `json:"supported_models"`
}

// Model returns the entry for name, if the server supports it.
func (c *Capabilities) Model(name string) (SupportedModel, bool) {
	for _, m := range c.SupportedModels {
		if m.ModelName == name {
			return m, true
		}
	}
	return SupportedModel{}, false
}

// Capabilities fetches the supported models (§3.8; 10 HTTP retries and the
// 300 s loop).
func (c *Client) Capabilities(ctx context.Context) (*Capabilities, error) {
	var out Capabilities
	cl := &call{name: "get_server_capabilities", method: http.MethodGet, path: "api/v1/get_server_capabilities",
		maxRetries: c.t.HTTPMaxRetries}
	if err := c.restJSON(ctx, cl, &out); err != nil {
		return nil, fmt.Errorf("tinker: server capabilities: %w", err)
	}
	if out.SupportedModels == nil {
		return nil, &ProtocolError{Endpoint: cl.name, Msg: "reply has no supported_models"}
	}
	return &out, nil
}

// SamplerInfo is the reply of samplers/{id} (§3.9).
type SamplerInfo struct {
	SamplerID string `json:"sampler_id"`
	BaseModel string `json:"base_model"`
	ModelPath string `json:"model_path"` // "" when null
}

// SamplerInfo fetches the base model of a sampler (§3.9).
func (c *Client) SamplerInfo(ctx context.Context, samplerID string) (*SamplerInfo, error) {
	var out SamplerInfo
	cl := &call{name: "samplers", method: http.MethodGet, path: "api/v1/samplers/" + url.PathEscape(samplerID),
		maxRetries: c.t.HTTPMaxRetries, samplerID: samplerID}
	if err := c.restJSON(ctx, cl, &out); err != nil {
		return nil, fmt.Errorf("tinker: sampler info: %w", err)
	}
	return &out, nil
}

// WeightsInfo is the reply of weights_info (§3.11).
type WeightsInfo struct {
	BaseModel    string `json:"base_model"`
	IsLora       bool   `json:"is_lora"`
	LoraRank     *int   `json:"lora_rank"`
	TrainUnembed *bool  `json:"train_unembed"`
	TrainMLP     *bool  `json:"train_mlp"`
	TrainAttn    *bool  `json:"train_attn"`
}

// WeightsInfo fetches checkpoint metadata for a tinker:// path (§3.11).
func (c *Client) WeightsInfo(ctx context.Context, tinkerPath string) (*WeightsInfo, error) {
	var out WeightsInfo
	cl := &call{name: "weights_info", method: http.MethodPost, path: "api/v1/weights_info",
		body: mustJSON(struct {
			TinkerPath string `json:"tinker_path"`
		}{tinkerPath}), maxRetries: c.t.HTTPMaxRetries}
	if err := c.restJSON(ctx, cl, &out); err != nil {
		return nil, fmt.Errorf("tinker: weights info: %w", err)
	}
	return &out, nil
}

// Healthz calls GET healthz (§3.13) and checks for {"status": "ok"}.
func (c *Client) Healthz(ctx context.Context) error {
	var out struct {
		Status string `json:"status"`
	}
	cl := &call{name: "healthz", method: http.MethodGet, path: "api/v1/healthz", maxRetries: c.t.HTTPMaxRetries}
	if err := c.doJSON(ctx, cl, &out); err != nil {
		return fmt.Errorf("tinker: healthz: %w", err)
	}
	if out.Status != "ok" {
		return &ProtocolError{Endpoint: cl.name, Msg: fmt.Sprintf("status %.64q, want \"ok\"", out.Status)} // the service's text, cut
	}
	return nil
}

// restJSON is a REST read: doJSON (with its HTTP retries) inside the 300 s loop.
func (c *Client) restJSON(ctx context.Context, cl *call, out any) error {
	return c.withRetries(ctx, cl.name, cl.samplerID, nil, func(ctx context.Context) error {
		return c.doJSON(ctx, cl, out)
	})
}
