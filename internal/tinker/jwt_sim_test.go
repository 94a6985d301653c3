package tinker_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// The JWT exchange (§2.2) against the simulator with JWTAuth on: there every endpoint but
// client/config and auth/token refuses the API key, so a client that did not exchange it, or
// that sent a stale JWT, would see 401s.

// jwtCreds returns the JWTs among the credentials the simulator received.
func (e *simEnv) jwtCreds() []string {
	var out []string
	for _, c := range e.credentials() {
		if strings.HasPrefix(c, "eyJ") {
			out = append(out, c)
		}
	}
	return out
}

// no401 fails if the simulator answered 401 anywhere or refused a JWT.
func (e *simEnv) no401(t *testing.T) {
	t.Helper()
	st := e.sim.Stats()
	if st.JWTRejections != 0 {
		t.Errorf("the simulator refused %d requests for a missing or invalid JWT", st.JWTRejections)
	}
	for ep, m := range st.Requests {
		if m[http.StatusUnauthorized] != 0 {
			t.Errorf("%s answered 401 %d times", ep, m[http.StatusUnauthorized])
		}
	}
}

// TestSimJWTAuth: Dial exchanges the key once (§2 step 2); the session, sampler, sample,
// heartbeats and REST reads all carry the JWT; a raw request with the plain API key is
// refused.
func TestSimJWTAuth(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{JWTAuth: true, TrainingRuns: 2},
		func(c *tinker.Config) { c.Timing.HeartbeatInterval = 20 * time.Millisecond })
	if !e.client.Flags().PJWTAuthEnabled {
		t.Fatal("the client did not see pjwt_auth_enabled")
	}
	s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	res, err := s.Sample(e.ctx, simRequest(3))
	if err != nil {
		t.Fatalf("sample with JWT auth: %v", err)
	}
	checkSequences(t, res.Response, 1, 16)
	if _, err := e.client.Capabilities(e.ctx); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, err := range e.client.TrainingRuns(e.ctx, tinker.ListOptions{PageSize: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if _, err := s.Info(e.ctx); err != nil || n != 2 {
		t.Fatalf("sampler info %v; %d training runs", err, n)
	}
	deadline := time.Now().Add(20 * time.Second)
	for e.requests("session_heartbeat", 200) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("heartbeats: %v", e.sim.Stats().Requests["session_heartbeat"])
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := e.sim.Stats()
	if st.TokensMinted != 1 || st.SamplesCompleted != 1 || st.Requests["auth/token"][200] != 1 {
		t.Fatalf("%d JWTs minted, %d samples completed, auth/token %v; want 1, 1, one 200",
			st.TokensMinted, st.SamplesCompleted, st.Requests["auth/token"])
	}
	e.no401(t)
	if creds := e.credentials(); len(creds) != 2 || len(e.jwtCreds()) != 1 {
		t.Fatalf("%d distinct credentials on the wire, want the API key (config, token) and one JWT", len(creds))
	}

	// Raw HTTP: the API key alone no longer opens a session.
	req, _ := http.NewRequestWithContext(e.ctx, "POST", e.base+"/api/v1/create_session",
		strings.NewReader(`{"tags":[],"user_metadata":{},"sdk_version":"0.25.0","type":"create_session"}`))
	req.Header.Set("X-API-Key", simKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"detail"`) {
		t.Fatalf("create_session with the API key: %d %s, want 401 with a detail", resp.StatusCode, body)
	}
}

// TestSimJWTCredential: a JWT given as the API key is exchanged like a key when the server
// exchanges (the SDK's internal_client_holder does so), and sampling works on the result.
func TestSimJWTCredential(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{JWTAuth: true}, nil)
	req, _ := http.NewRequestWithContext(e.ctx, "POST", e.base+"/api/v1/auth/token", strings.NewReader(`{}`))
	req.Header.Set("X-API-Key", simKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var minted struct{ JWT string }
	err = json.NewDecoder(resp.Body).Decode(&minted)
	resp.Body.Close()
	if err != nil || !strings.HasPrefix(minted.JWT, "eyJ") {
		t.Fatalf("auth/token: %v %q", err, minted.JWT)
	}
	before := e.sim.Stats().TokensMinted

	c, err := tinker.Dial(e.ctx, tinker.Config{BaseURL: e.base, APIKey: tinker.APIKey(minted.JWT)})
	if err != nil {
		t.Fatalf("Dial with a JWT credential: %v", err)
	}
	defer c.Close()
	s, err := c.NewSampler(e.ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sample(e.ctx, simRequest(2)); err != nil {
		t.Fatalf("sample: %v", err)
	}
	if got := e.sim.Stats().TokensMinted - before; got != 1 {
		t.Fatalf("%d JWTs minted for the client with a JWT credential, want its one exchange", got)
	}
	e.no401(t)
}

// TestSimJWTRefreshBeforeExpiry: with 2 s JWTs and the refresh moved to 1.5 s before expiry
// (on demand at 1 s), the idle client re-mints in the background, and a sample sent after the
// first JWT expired succeeds without a single 401.
func TestSimJWTRefreshBeforeExpiry(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{JWTAuth: true, JWTLifetime: 2 * time.Second}, func(c *tinker.Config) {
		c.Timing.JWTRefreshBeforeExpiry = 1500 * time.Millisecond
		c.Timing.JWTRefreshOnDemand = time.Second
	})
	// The first JWT was minted before Dial returned and lives less than 3 s (exp is rounded
	// up to a whole second).
	firstExpired := time.Now().Add(3 * time.Second)
	s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if _, err := s.Sample(e.ctx, simRequest(5)); err != nil {
		t.Fatal(err)
	}
	// No request is in flight now (the heartbeat is 10 s away): only the background refresh
	// can mint.
	deadline := time.Now().Add(20 * time.Second)
	for e.sim.Stats().TokensMinted < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the client never refreshed its JWT in the background")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Until(firstExpired))
	if _, err := s.Sample(e.ctx, simRequest(6)); err != nil {
		t.Fatalf("sample after the first JWT expired: %v", err)
	}
	if st := e.sim.Stats(); st.SamplesCompleted != 2 || st.TokensMinted < 2 {
		t.Fatalf("%d samples completed, %d JWTs minted", st.SamplesCompleted, st.TokensMinted)
	}
	e.no401(t)
	if n := len(e.jwtCreds()); n < 2 {
		t.Fatalf("%d distinct JWTs on the wire, want the first and a refreshed one", n)
	}
}

// TestSimJWTNeverLeaks: when the simulator stops accepting the client's JWT after the exchange
// (RevokeJWTs), the sample fails with a 401 whose error, like the logs and events, holds
// neither the API key nor any JWT that went over the wire.
func TestSimJWTNeverLeaks(t *testing.T) {
	t.Parallel()
	logs := &fleettest.Buffer{}
	e := newSimEnv(t, tinkersim.Config{JWTAuth: true}, func(c *tinker.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if _, err := s.Sample(e.ctx, simRequest(8)); err != nil {
		t.Fatal(err)
	}
	e.sim.RevokeJWTs()
	_, err := s.Sample(e.ctx, simRequest(9))
	var se *tinker.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusUnauthorized || tinker.IsRetryable(err) {
		t.Fatalf("sample with a revoked JWT: %v, want a non-retryable 401", err)
	}
	jwts := e.jwtCreds()
	if len(jwts) != 1 || e.sim.Stats().JWTRejections == 0 {
		t.Fatalf("%d JWTs on the wire, %d refusals", len(jwts), e.sim.Stats().JWTRejections)
	}
	var all strings.Builder
	fmt.Fprintf(&all, "%s %+v %#v %s %+v", err.Error(), err, err, logs.String(), e.client)
	for _, ev := range e.eventsOf(tinker.EventRequest) {
		fmt.Fprintf(&all, "%+v", ev)
	}
	for _, ev := range e.eventsOf(tinker.EventRetry) {
		fmt.Fprintf(&all, "%+v", ev)
	}
	for _, secret := range append(jwts, simKey) {
		if strings.Contains(all.String(), secret) {
			t.Fatalf("a credential leaked into errors, logs or events: %s", all.String())
		}
	}
	for _, seg := range strings.Split(jwts[0], ".")[1:] {
		if strings.Contains(all.String(), seg) {
			t.Fatalf("a JWT segment leaked: %s", all.String())
		}
	}
}

// TestSimCredentialCmd: with no API key, a credential command (TINKER_CREDENTIAL_CMD, §2.1)
// authenticates client/config and every JWT exchange, the background refresh included, and
// runs again for each of them (the SDK never caches what it prints); the simulator accepts
// the plain credential nowhere else, so a client that sent it past the exchange would see
// 401s.
func TestSimCredentialCmd(t *testing.T) {
	t.Parallel()
	runs := t.TempDir() + "/runs"
	e := newSimEnv(t, tinkersim.Config{JWTAuth: true, JWTLifetime: 2 * time.Second}, func(c *tinker.Config) {
		c.APIKey = ""
		c.CredentialCmd = fmt.Sprintf("echo run >> %s; printf '  %%s\\n' %s", runs, simKey)
		c.Timing.JWTRefreshBeforeExpiry = 1500 * time.Millisecond
		c.Timing.JWTRefreshOnDemand = time.Second
	})
	s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if _, err := s.Sample(e.ctx, simRequest(3)); err != nil {
		t.Fatalf("sample with the credential command's key: %v", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for e.sim.Stats().TokensMinted < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the client never refreshed its JWT in the background")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The simulator counts a JWT minted before the client has taken it in: sample until the
	// new one is on the wire.
	for {
		if _, err := s.Sample(e.ctx, simRequest(4)); err != nil {
			t.Fatalf("sample after the refresh: %v", err)
		}
		if len(e.jwtCreds()) >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.no401(t)
	// Stopped, the client runs the command no more; a refresh that Close cut short may have
	// run it without a JWT minted for it.
	_ = e.client.Close()
	data, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	// client/config once, then one run per exchange: Dial's and the refresh's at least.
	minted := e.sim.Stats().TokensMinted
	if n := int64(strings.Count(string(data), "run")); n < 1+minted || n > 2+minted || minted < 2 {
		t.Fatalf("the command ran %d times for %d JWTs minted, want one per exchange and one for client/config", n, minted)
	}
	if got := e.credentials(); !slices.Contains(got, simKey) || len(e.jwtCreds()) < 2 {
		t.Fatalf("credentials on the wire: %d, want the command's key and two JWTs", len(got))
	}
}
