package tinkersim

import (
	"context"
	crand "crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoint names, as used in Stats.Requests and Fault.Endpoints.
const (
	epClientConfig          = "client/config"
	epDynamicConfig         = "client/dynamic_config"
	epAuthToken             = "auth/token"
	epCreateSession         = "create_session"
	epHeartbeat             = "session_heartbeat"
	epCreateSamplingSession = "create_sampling_session"
	epAsample               = "asample"
	epRetrieveFuture        = "retrieve_future"
	epTelemetry             = "telemetry"
	epSamplers              = "samplers"
	epCapabilities          = "get_server_capabilities"
	epHealthz               = "healthz"
	epWeightsInfo           = "weights_info"
	epCheckpoints           = "checkpoints"
	epTrainingRuns          = "training_runs"
	epSessions              = "sessions"
	epAdmin                 = "admin"
	epUnknown               = "unknown"
)

// apiPrefix marks the API part of a request path (§1.1): everything before it is a mount
// prefix and is ignored.
const apiPrefix = "/api/v1/"

// Server is the simulated Tinker service. It is an http.Handler; create it with New and stop
// it with Close (or Shutdown).
type Server struct {
	cfg  Config
	gen  generator
	runs []trainingRun

	mu  sync.Mutex
	rng *rand.Rand // fault rates, from Config.Seed
	// ids draws session and request ids: random per Server, so that a restarted simulator
	// never gives a client's session id to another (the real service never reuses one, §8).
	ids      *rand.Rand
	sessions map[string]*session
	samplers map[string]*sampler
	futures  map[string]*future
	running  int
	queue    []*future
	deferred map[*future]struct{}
	// windowTimers release deferred futures when pause windows end; Close stops them.
	windowTimers map[*time.Timer]struct{}
	faults       []*activeFault
	nextID       FaultID
	st           stats
	// pollsHeld counts retrieve_future calls currently long-polling.
	pollsHeld atomic.Int64
	// jwtKey signs and checks the JWTs of auth/token (§2.2); RevokeJWTs replaces it.
	jwtKey atomic.Pointer[jwtSecret]
	// apiKeys are the accepted API keys (Config.APIKeys); SetAPIKeys replaces them.
	apiKeys atomic.Pointer[[]string]
	// subSalt keys the HMAC that turns an API key into a JWT sub claim.
	subSalt jwtSecret

	closed    chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	httpSrvs  []*http.Server
}

// session is a client session (§3.3).
type session struct {
	id            string
	created       time.Time
	lastHeartbeat time.Time
	samplerIDs    []string
}

// sampler is a sampling session (§3.5).
type sampler struct {
	id        string
	session   string // the id of the session it was created in
	baseModel string
	modelPath *string
	maxCtx    int
}

// New validates cfg, fills in defaults and returns a running Server (its janitor goroutine
// runs until Close).
func New(cfg Config) (*Server, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("tinkersim config: %w", err)
	}
	s := &Server{
		cfg:          c,
		gen:          generator{minGen: c.MinGenTokens, tokenMin: c.TokenMin, tokenMax: c.TokenMax, stopProb: c.StopTokenProbability},
		rng:          rand.New(rand.NewPCG(uint64(c.Seed), 0x5eed)),
		ids:          rand.New(rand.NewChaCha8(randomSeed())),
		sessions:     map[string]*session{},
		samplers:     map[string]*sampler{},
		futures:      map[string]*future{},
		deferred:     map[*future]struct{}{},
		windowTimers: map[*time.Timer]struct{}{},
		st:           newStats(),
		closed:       make(chan struct{}),
	}
	s.jwtKey.Store(newJWTSecret())
	s.apiKeys.Store(&c.APIKeys)
	s.subSalt = *newJWTSecret()
	s.runs = syntheticRuns(c)
	for _, f := range c.Faults {
		if _, err := s.Inject(f); err != nil {
			return nil, fmt.Errorf("tinkersim config: %w", err)
		}
	}
	s.wg.Add(1)
	go s.janitor()
	return s, nil
}

// Config returns the effective configuration (defaults filled in).
func (s *Server) Config() Config { return s.cfg }

// Listen serves s on addr (e.g. "127.0.0.1:0") in the background until ctx is done or the
// server is closed, and returns the base URL, e.g. "http://127.0.0.1:41234". ListenTLS and
// ListenTLSWithCert do the same over HTTPS.
func (s *Server) Listen(ctx context.Context, addr string) (string, error) {
	return s.listen(ctx, addr, nil)
}

// listen is the common part of Listen, ListenTLS and ListenTLSWithCert: it serves s on addr
// in the background until ctx is done or s is closed (Close, Shutdown), over TLS when tlsCfg
// is not nil, and returns the base URL. Over TLS, net/http offers HTTP/2 by ALPN next to
// HTTP/1.1, as the real service does (§1.4).
func (s *Server) listen(ctx context.Context, addr string, tlsCfg *tls.Config) (string, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("tinkersim listen on %s: %w", addr, err)
	}
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsCfg,
		ConnState: s.countConnection}
	scheme, serve := "http", hs.Serve
	if tlsCfg != nil {
		// ServeTLS adds "h2" and "http/1.1" to the NextProtos of a clone of tlsCfg and
		// wraps ln in a TLS listener; the certificate comes from tlsCfg.Certificates.
		scheme = "https"
		serve = func(l net.Listener) error { return hs.ServeTLS(l, "", "") }
	}
	s.mu.Lock()
	select {
	case <-s.closed:
		s.mu.Unlock()
		_ = ln.Close()
		return "", errors.New("tinkersim listen: server closed")
	default:
	}
	s.httpSrvs = append(s.httpSrvs, hs)
	s.mu.Unlock()
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.cfg.Logger.Error("tinkersim serve", "addr", ln.Addr().String(), "err", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		select {
		case <-ctx.Done():
			_ = hs.Close()
		case <-s.closed:
		}
	}()
	return scheme + "://" + ln.Addr().String(), nil
}

// countConnection counts each new connection in Stats.Connections.
func (s *Server) countConnection(_ net.Conn, state http.ConnState) {
	if state == http.StateNew {
		s.mu.Lock()
		s.st.connections++
		s.mu.Unlock()
	}
}

// Shutdown stops the listeners started by Listen and ListenTLS gracefully: it wakes held long
// polls (they answer 408 try_again), waits for in-flight requests until ctx is done, then
// closes s.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closeOnce.Do(func() { close(s.closed) })
	s.mu.Lock()
	srvs := s.httpSrvs
	s.mu.Unlock()
	var errs []error
	for _, hs := range srvs {
		if err := hs.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("tinkersim shutdown: %w", err))
		}
	}
	s.Close()
	return errors.Join(errs...)
}

// Close stops the server's goroutines, timers and listeners at once. Held long polls answer
// 408 try_again; later requests answer 503. Close is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closed) })
	s.mu.Lock()
	for _, f := range s.futures {
		if f.timer != nil {
			f.timer.Stop()
		}
	}
	for t := range s.windowTimers {
		t.Stop()
	}
	srvs := s.httpSrvs
	s.mu.Unlock()
	for _, hs := range srvs {
		_ = hs.Close()
	}
	s.wg.Wait()
}

func (s *Server) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// janitor drops futures finished longer than ResultTTL ago, or answered in full longer than
// ReadTTL ago; they then answer 410.
func (s *Server) janitor() {
	defer s.wg.Done()
	every := min(s.cfg.ReadTTL/4, time.Minute) // ReadTTL ≤ ResultTTL
	t := time.NewTicker(max(every, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			return
		case now := <-t.C:
			s.mu.Lock()
			s.expireSessionsLocked(now)
			for id, f := range s.futures {
				if f.state != futureDone {
					continue
				}
				if now.Sub(f.doneAt) > s.cfg.ResultTTL || !f.readAt.IsZero() && now.Sub(f.readAt) > s.cfg.ReadTTL {
					delete(s.futures, id)
				}
			}
			s.mu.Unlock()
		}
	}
}

// sessionLocked returns the session id, or nil when there is none or it expired (it is then
// forgotten, with its sampling sessions).
func (s *Server) sessionLocked(id string, now time.Time) *session {
	sess := s.sessions[id]
	if sess != nil && s.expiredLocked(sess, now) {
		return nil
	}
	return sess
}

// samplerLocked returns the sampling session id, or nil when there is none or its session
// expired.
func (s *Server) samplerLocked(id string, now time.Time) *sampler {
	sm := s.samplers[id]
	if sm == nil {
		return nil
	}
	if sess := s.sessions[sm.session]; sess != nil && s.expiredLocked(sess, now) {
		return nil
	}
	return sm
}

// expiredLocked reports whether sess has gone Config.SessionTimeout without a heartbeat and
// if so forgets it and its sampling sessions (§3.4).
func (s *Server) expiredLocked(sess *session, now time.Time) bool {
	if s.cfg.SessionTimeout <= 0 || now.Sub(sess.lastHeartbeat) <= s.cfg.SessionTimeout {
		return false
	}
	delete(s.sessions, sess.id)
	for _, id := range sess.samplerIDs {
		delete(s.samplers, id)
	}
	s.st.sessionsExpired++
	return true
}

// expireSessionsLocked forgets every session that expired by now.
func (s *Server) expireSessionsLocked(now time.Time) {
	if s.cfg.SessionTimeout <= 0 {
		return
	}
	for _, sess := range s.sessions {
		s.expiredLocked(sess, now)
	}
}

// statusRecorder counts the reply in Stats when its status is written, i.e. before the client
// can see it (so a test reading Stats after a reply always finds it counted).
type statusRecorder struct {
	http.ResponseWriter
	s        *Server
	endpoint string
	status   int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
		r.s.mu.Lock()
		r.s.st.record(r.endpoint, code)
		r.s.mu.Unlock()
	}
	r.ResponseWriter.WriteHeader(code)
}

// drop counts a request answered with nothing (FaultDrop) under status 0, and keeps
// ServeHTTP from writing a 200 for it.
func (r *statusRecorder) drop() {
	if r.status == 0 {
		r.status = -1
		r.s.mu.Lock()
		r.s.st.record(r.endpoint, 0)
		r.s.mu.Unlock()
	}
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	n, err := r.ResponseWriter.Write(b)
	if err != nil {
		return n, fmt.Errorf("tinkersim write reply: %w", err)
	}
	return n, nil
}

// ServeHTTP serves the API under any path containing /api/v1/ (so the handler works at the
// root, under http.StripPrefix, or directly under a prefix such as /services/tinker-prod, §1.1)
// and the admin endpoints under any path containing /admin/.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w, s: s, endpoint: epUnknown}
	if r.ProtoMajor == 2 {
		s.mu.Lock()
		s.st.http2++
		s.mu.Unlock()
	}
	start := time.Now()
	defer func() {
		if rec.status == 0 {
			rec.WriteHeader(http.StatusOK)
		}
		// The request log of Config.Logger: no header and no query, so never a key. Asked
		// first, so that a simulator under load builds no record it does not log.
		if s.cfg.Logger.Enabled(r.Context(), slog.LevelDebug) {
			s.cfg.Logger.Debug("tinkersim request", "method", r.Method, "path", r.URL.Path, "endpoint", rec.endpoint,
				"status", max(rec.status, 0), "duration", time.Since(start))
		}
	}()
	path := r.URL.Path
	apiAt, adminAt := strings.Index(path, apiPrefix), strings.Index(path, "/admin/")
	var rest string
	switch {
	case apiAt >= 0:
		rest = path[apiAt+len(apiPrefix):]
		rec.endpoint = endpointName(rest)
	case adminAt >= 0:
		rest = path[adminAt+len("/admin/"):]
		rec.endpoint = epAdmin
	}
	if s.isClosed() {
		writeJSONError(rec, http.StatusServiceUnavailable, "simulator is shutting down")
		return
	}
	switch {
	case apiAt >= 0:
		s.serveAPI(rec, r, rec.endpoint, rest)
		return
	case adminAt >= 0:
		s.serveAdmin(rec, r, rest)
		return
	}
	writeJSONError(rec, http.StatusNotFound, "not found: "+path)
}

// apiEndpoints are the names endpointName gives the API's endpoints: those a fault may name.
var apiEndpoints = []string{epClientConfig, epDynamicConfig, epAuthToken, epCreateSession, epHeartbeat,
	epCreateSamplingSession, epAsample, epRetrieveFuture, epTelemetry, epSamplers, epCapabilities, epHealthz,
	epWeightsInfo, epCheckpoints, epTrainingRuns, epSessions}

// endpointName maps the path after /api/v1/ to the endpoint name used in stats and faults.
func endpointName(rest string) string {
	switch rest {
	case epClientConfig, epDynamicConfig, epAuthToken, epCreateSession, epHeartbeat, epCreateSamplingSession,
		epAsample, epRetrieveFuture, epTelemetry, epCapabilities, epHealthz, epWeightsInfo, epCheckpoints,
		epTrainingRuns, epSessions:
		return rest
	}
	first, _, _ := strings.Cut(rest, "/")
	switch first {
	case epSamplers, epTrainingRuns, epSessions:
		return first
	}
	return epUnknown
}

// SetAPIKeys replaces the accepted API keys (Config.APIKeys), as a key rotation does: a
// request with a key no longer among them is refused with 401 from then on. No keys accept
// any "tml-" key again.
func (s *Server) SetAPIKeys(keys ...string) error {
	if err := checkAPIKeys(keys); err != nil {
		return fmt.Errorf("tinkersim: %w", err)
	}
	keys = slices.Clone(keys)
	s.apiKeys.Store(&keys)
	return nil
}

// authorized reports whether X-API-Key holds an accepted API key (§1.2, §12), compared in
// constant time; the key is never logged. JWTs are checked by checkJWT.
func (s *Server) authorized(r *http.Request) bool {
	key := r.Header.Get("X-API-Key")
	if !strings.HasPrefix(key, "tml-") || len(key) <= len("tml-") {
		return false
	}
	keys := *s.apiKeys.Load()
	if len(keys) == 0 {
		return true
	}
	ok := false
	for _, k := range keys {
		if subtle.ConstantTimeCompare([]byte(k), []byte(key)) == 1 {
			ok = true
		}
	}
	return ok
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request, endpoint, rest string) {
	if endpoint == epUnknown {
		writeJSONError(w, http.StatusNotFound, "no such endpoint: /api/v1/"+rest)
		return
	}
	now := time.Now()
	if !s.authenticate(w, r, endpoint, now) {
		return
	}
	if endpoint == epAsample {
		s.countAsampleInWindows(now)
	}
	if s.refuseCredential(w, endpoint, now) {
		return
	}
	if endpoint != epRetrieveFuture && s.genericFault(w, endpoint, "", now) {
		return
	}
	switch endpoint {
	case epClientConfig:
		s.handleClientConfig(w, r)
	case epDynamicConfig:
		s.handleDynamicConfig(w, r)
	case epAuthToken:
		s.handleAuthToken(w, r)
	case epCreateSession:
		s.handleCreateSession(w, r)
	case epHeartbeat:
		s.handleHeartbeat(w, r)
	case epCreateSamplingSession:
		s.handleCreateSamplingSession(w, r)
	case epAsample:
		s.handleAsample(w, r)
	case epRetrieveFuture:
		s.handleRetrieveFuture(w, r)
	case epTelemetry:
		s.handleTelemetry(w, r)
	case epCapabilities:
		s.handleCapabilities(w, r)
	case epHealthz:
		if requireMethod(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}
	case epWeightsInfo:
		s.handleWeightsInfo(w, r)
	case epSamplers:
		s.handleGetSampler(w, r, strings.TrimPrefix(rest, epSamplers+"/"))
	case epCheckpoints, epTrainingRuns, epSessions:
		s.handleREST(w, r, rest)
	}
}

// decodePost accepts only POST and decodes its body strictly into req; when it returns false
// it has already answered the request.
func (s *Server) decodePost(w http.ResponseWriter, r *http.Request, req any) bool {
	if !requireMethod(w, r, http.MethodPost) {
		return false
	}
	if e := decodeStrict(r, s.cfg.MaxBodyBytes, req); e != nil {
		writeHTTPError(w, e)
		return false
	}
	return true
}

// requireMethod answers 405 unless r uses method.
func requireMethod(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	w.Header().Set("Allow", method)
	writeJSONError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed, use %s", r.Method, method))
	return false
}

// writeJSON writes v with Content-Type and Content-Length.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"Internal Server Error","message":"encoding reply failed"}`)
	}
	writeBody(w, status, "application/json", body)
}

// writeBody writes a body with an explicit Content-Length (§1.4).
func writeBody(w http.ResponseWriter, status int, contentType string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeJSONError writes {"detail": msg}, FastAPI's error shape, always with a Content-Length.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"detail": msg})
}

func writeHTTPError(w http.ResponseWriter, e *httpError) { writeJSONError(w, e.status, e.msg) }

// newIDLocked returns a UUID-shaped id, random and never the same from one Server to the
// next (callers hold s.mu).
func (s *Server) newIDLocked() string {
	a, b := s.ids.Uint64(), s.ids.Uint64()
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", uint32(a>>32), uint16(a>>16), uint16(a)&0x0fff|0x4000,
		uint16(b>>48)&0x3fff|0x8000, b&0xffffffffffff)
}

// randomSeed returns a seed from crypto/rand.
func randomSeed() [32]byte {
	var seed [32]byte
	_, _ = crand.Read(seed[:]) // never fails (crypto/rand's documentation)
	return seed
}
