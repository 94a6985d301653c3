package tinker

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
)

// testJWT builds a JWT-shaped token whose payload has the exp claim exp (raw JSON) and a
// marker n. The client never checks the signature (§2.2), so it is a placeholder.
func testJWT(exp string, n int) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." +
		enc([]byte(fmt.Sprintf(`{"sub":"user-%d","email":"user-%d@example.invalid","iat":1,"exp":%s}`, n, n, exp))) + "." +
		enc([]byte(fmt.Sprintf("signature-%d", n)))
}

// expIn is a fractional NumericDate d from now.
func expIn(d time.Duration) string {
	return strconv.FormatFloat(float64(time.Now().Add(d).UnixMilli())/1000, 'f', 3, 64)
}

// jwtMinter serves auth/token for a fakeTinker (§3.2): the i-th JWT expires life(i) after it
// was minted.
type jwtMinter struct {
	mu     sync.Mutex
	life   func(i int) time.Duration
	tokens []string
}

func (m *jwtMinter) mint(w http.ResponseWriter, r *http.Request, body []byte) {
	m.mu.Lock()
	tok := testJWT(expIn(m.life(len(m.tokens))), len(m.tokens))
	m.tokens = append(m.tokens, tok)
	m.mu.Unlock()
	jsonReply(200, `{"jwt":"`+tok+`"}`)(w, r, body)
}

func (m *jwtMinter) minted() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.tokens)
}

// jwtFake is a fake with the JWT exchange on (§2.2): client/config says pjwt_auth_enabled,
// auth/token mints JWTs that expire after life(i), client/config and auth/token take the API
// key, every other endpoint only a minted JWT.
func jwtFake(t *testing.T, life func(i int) time.Duration) (*fakeTinker, *jwtMinter) {
	f := newFake(t)
	m := &jwtMinter{life: life}
	f.set("client/config", jsonReply(200, `{"pjwt_auth_enabled": true}`))
	f.set("auth/token", m.mint)
	f.set("healthz", jsonReply(200, `{"status":"ok"}`))
	f.setAccept(func(ep, cred string) bool {
		if ep == "client/config" || ep == "auth/token" {
			return cred == string(testKey)
		}
		return slices.Contains(m.minted(), cred)
	})
	return f, m
}

func hourLife(int) time.Duration { return time.Hour }

// debugLogger logs everything to w (a fleettest.Buffer: the background refresh logs from its
// own goroutine).
func debugLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// §2 step 2, §2.2, §3.2: after client/config, POST auth/token with body {} and the API key;
// every later request (dynamic config, session, sampler, asample, polls, REST) carries the
// JWT as X-API-Key.
func TestJWTExchangeWire(t *testing.T) {
	f, m := jwtFake(t, hourLife)
	c, _, _ := dial(t, f, nil)
	if !c.Flags().PJWTAuthEnabled {
		t.Fatal("pjwt_auth_enabled not applied")
	}
	if _, err := sampler(t, c).Sample(testCtx(t), basicRequest()); err != nil {
		t.Fatal(err)
	}
	if err := c.Healthz(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	toks := m.minted()
	if len(toks) != 1 {
		t.Fatalf("%d JWTs minted, want 1", len(toks))
	}
	all := f.requests("")
	var order []string
	for _, r := range all {
		order = append(order, r.Endpoint)
	}
	if got := strings.Join(order[:4], ","); got != "client/config,auth/token,client/dynamic_config,create_session" {
		t.Fatalf("start-up order %v", order)
	}
	at := all[1]
	if at.Method != "POST" || string(at.Body) != "{}" || at.Header.Get("X-Api-Key") != string(testKey) ||
		at.Header.Get("Content-Type") != "application/json" || at.Header.Get("X-Idempotency-Key") == "" {
		t.Fatalf("auth/token request %+v", at)
	}
	if all[0].Header.Get("X-Api-Key") != string(testKey) {
		t.Fatal("client/config did not carry the API key")
	}
	for _, r := range all[2:] {
		if r.Header.Get("X-Api-Key") != toks[0] {
			t.Fatalf("%s carried X-API-Key %q, want the JWT", r.Endpoint, APIKey(r.Header.Get("X-Api-Key")))
		}
	}
	if !slices.Contains(order, "retrieve_future") || !slices.Contains(order, "healthz") {
		t.Fatalf("requests %v", order)
	}
}

// §2.2: a request that finds no more than JWTRefreshOnDemand left refreshes first and uses the
// new JWT; a failed on-demand refresh (10 HTTP retries, §3.2) logs a warning and falls back to
// the cached JWT.
func TestJWTOnDemandRefresh(t *testing.T) {
	t.Run("refresh", func(t *testing.T) {
		f, m := jwtFake(t, func(i int) time.Duration { return time.Duration(2*i+1) * time.Hour }) // 1 h, 3 h, …
		dial(t, f, func(cfg *Config) { cfg.Timing.JWTRefreshOnDemand = 2 * time.Hour })
		toks := m.minted()
		if len(toks) != 2 || len(f.requests("auth/token")) != 2 {
			t.Fatalf("%d JWTs minted, want 2 (at Dial, then on demand)", len(toks))
		}
		for _, ep := range []string{"client/dynamic_config", "create_session"} {
			if got := f.requests(ep)[0].Header.Get("X-Api-Key"); got != toks[1] {
				t.Fatalf("%s did not carry the refreshed JWT", ep)
			}
		}
	})
	t.Run("failure falls back", func(t *testing.T) {
		f, m := jwtFake(t, hourLife)
		f.push("auth/token", m.mint)
		f.set("auth/token", jsonReply(503, `{"error":"Service Unavailable"}`))
		logs := &fleettest.Buffer{}
		dial(t, f, func(cfg *Config) {
			cfg.Logger = debugLogger(logs)
			cfg.Timing.JWTRefreshOnDemand = 2 * time.Hour
		})
		toks := m.minted()
		at := f.requests("auth/token")
		// One exchange at Dial, then one failed on-demand refresh of 11 attempts before each of
		// client/dynamic_config and create_session.
		if len(toks) != 1 || len(at) != 1+2*11 {
			t.Fatalf("%d minted, %d auth/token requests; want 1 and 23", len(toks), len(at))
		}
		for i, r := range at[1:12] {
			if r.Header.Get("X-Stainless-Retry-Count") != strconv.Itoa(i) || r.Header.Get("X-Api-Key") != string(testKey) {
				t.Fatalf("on-demand attempt %d: retry count %q", i, r.Header.Get("X-Stainless-Retry-Count"))
			}
		}
		for _, ep := range []string{"client/dynamic_config", "create_session"} {
			if got := f.requests(ep)[0].Header.Get("X-Api-Key"); got != toks[0] {
				t.Fatalf("%s did not fall back to the cached JWT", ep)
			}
		}
		if n := strings.Count(logs.String(), "on-demand JWT refresh failed"); n != 2 {
			t.Fatalf("%d on-demand failure warnings, want 2: %s", n, logs.String())
		}
	})
}

// §2.2: the background refresh runs JWTRefreshBeforeExpiry before exp; after a failure it
// waits JWTRefreshRetry and tries again; later requests carry the new JWT; Close stops it.
func TestJWTBackgroundRefresh(t *testing.T) {
	f, m := jwtFake(t, func(i int) time.Duration { return time.Duration(i+1) * time.Hour }) // 1 h, 2 h, …
	f.push("auth/token", m.mint)
	for range 11 {
		f.push("auth/token", jsonReply(500, `{"error":"Internal Server Error"}`))
	}
	logs := &fleettest.Buffer{}
	c, _, _ := dial(t, f, func(cfg *Config) {
		cfg.Logger = debugLogger(logs)
		cfg.Timing.JWTRefreshBeforeExpiry = time.Hour - 100*time.Millisecond // first refresh ~100 ms after Dial
		cfg.Timing.JWTRefreshRetry = 20 * time.Millisecond
	})
	// Minted by the server is not yet stored by the client: wait for the client to hold it.
	waitFor(t, func() bool {
		toks := m.minted()
		if len(toks) != 2 {
			return false
		}
		tok, _ := c.jwt.current()
		return string(tok) == toks[1]
	})
	if n := len(f.requests("auth/token")); n != 1+11+1 {
		t.Fatalf("%d auth/token requests, want 13 (exchange, a failed refresh of 11 attempts, a retry)", n)
	}
	if !strings.Contains(logs.String(), "background JWT refresh failed") {
		t.Fatalf("no warning for the failed refresh: %s", logs.String())
	}
	if err := c.Healthz(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	toks := m.minted()
	if got := f.requests("healthz")[0].Header.Get("X-Api-Key"); got != toks[1] {
		t.Fatal("healthz after the refresh did not carry the new JWT")
	}
	// The second JWT lives 2 h: the next refresh is an hour away, and Close ends the wait.
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not stop the background refresh")
	}
	select {
	case <-c.jwt.done:
	default:
		t.Fatal("the refresh goroutine is still running after Close")
	}
	if n := len(f.requests("auth/token")); n != 13 || len(m.minted()) != 2 {
		t.Fatalf("auth/token requests after Close: %d", n)
	}
}

// §2.1, §2.2 as the SDK's code has them (internal_client_holder, resolve_auth_provider): a
// JWT given as the API key is sent as it is without the exchange, and exchanged like any key
// with it, never replaced by the credential command. credential_default_source
// "credential_cmd" without a credential command fails Dial; without the exchange the flag
// means nothing (only plain API keys are sent). The command's own rules are in credcmd_test.go.
func TestJWTCredentialRules(t *testing.T) {
	const cmdConfig = `{"pjwt_auth_enabled": true, "credential_default_source": "credential_cmd"}`
	direct := APIKey(testJWT(expIn(time.Hour), 7))
	t.Run("JWT credential, no JWT exchange", func(t *testing.T) {
		f := newFake(t)
		f.setAccept(func(_, cred string) bool { return cred == string(direct) })
		c, _, _ := dial(t, f, func(cfg *Config) { cfg.APIKey = direct })
		sampler(t, c)
		if n := len(f.requests("auth/token")); n != 0 || c.jwt != nil {
			t.Fatalf("a JWT credential was exchanged (%d auth/token requests) by a server that does not exchange", n)
		}
		if len(f.requests("create_sampling_session")) != 1 {
			t.Fatalf("requests %d", len(f.requests("")))
		}
	})
	t.Run("JWT credential, JWT exchange, credential_cmd", func(t *testing.T) {
		f, m := jwtFake(t, hourLife)
		f.set("client/config", jsonReply(200, cmdConfig))
		f.setAccept(func(ep, cred string) bool {
			switch ep {
			case "client/config", "auth/token":
				return cred == string(direct)
			}
			return len(m.minted()) > 0 && cred == m.minted()[len(m.minted())-1]
		})
		ran := filepath.Join(t.TempDir(), "ran")
		c, _, _ := dial(t, f, func(cfg *Config) {
			cfg.APIKey = direct
			cfg.CredentialCmd = "touch " + ran + "; echo " + cmdKey
		})
		sampler(t, c)
		if len(m.minted()) != 1 || len(f.requests("auth/token")) != 1 {
			t.Fatalf("%d JWTs minted in %d exchanges, want the JWT credential exchanged once", len(m.minted()), len(f.requests("auth/token")))
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatal("the credential command ran although the API key is a JWT")
		}
	})
	t.Run("credential_cmd with JWT exchange, no command", func(t *testing.T) {
		f, m := jwtFake(t, hourLife)
		f.set("client/config", jsonReply(200, cmdConfig))
		err := dialErr(t, f, func(cfg *Config) { cfg.APIKey = testKey })
		if err == nil || !strings.Contains(err.Error(), "set TINKER_CREDENTIAL_CMD") || strings.Contains(err.Error(), string(testKey)) {
			t.Fatalf("Dial: %v, want an error that asks for TINKER_CREDENTIAL_CMD", err)
		}
		if len(m.minted()) != 0 || len(f.requests("create_session")) != 0 {
			t.Fatalf("%d JWTs minted, %d sessions after the error", len(m.minted()), len(f.requests("create_session")))
		}
	})
	t.Run("credential_cmd without JWT exchange", func(t *testing.T) {
		f := newFake(t)
		f.set("client/config", jsonReply(200, `{"credential_default_source": "credential_cmd"}`))
		logs := &fleettest.Buffer{}
		c, _, _ := dial(t, f, func(cfg *Config) { cfg.Logger = debugLogger(logs) })
		sampler(t, c)
		if n := strings.Count(logs.String(), "TINKER_CREDENTIAL_CMD"); n != 0 || len(f.requests("auth/token")) != 0 {
			t.Fatalf("%d warnings, %d exchanges: %s", n, len(f.requests("auth/token")), logs.String())
		}
	})
}

// A failed exchange fails Dial (401 is not retried, §6.1); a reply without a usable JWT is a
// protocol error. No error quotes the token.
func TestJWTDialFailures(t *testing.T) {
	unreadable := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256"}`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(`not json`)) + ".c2ln"
	cases := []struct {
		name  string
		reply reply
		check func(t *testing.T, err error)
	}{{
		name: "401", reply: jsonReply(401, `{"detail":"Invalid API key"}`),
		check: func(t *testing.T, err error) {
			var se *StatusError
			if !errors.As(err, &se) || se.StatusCode != 401 || !strings.Contains(err.Error(), "JWT exchange") {
				t.Fatalf("err %v", err)
			}
		},
	}, {
		name: "no jwt", reply: jsonReply(200, `{}`),
		check: func(t *testing.T, err error) {
			var pe *ProtocolError
			if !errors.As(err, &pe) || pe.Endpoint != "auth/token" {
				t.Fatalf("err %v", err)
			}
		},
	}, {
		name: "unreadable payload", reply: jsonReply(200, `{"jwt":"`+unreadable+`"}`),
		check: func(t *testing.T, err error) {
			var pe *ProtocolError
			if !errors.As(err, &pe) || strings.Contains(err.Error(), unreadable) || strings.Contains(err.Error(), "bm90IGpzb24") {
				t.Fatalf("err %v", err)
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.set("client/config", jsonReply(200, `{"pjwt_auth_enabled": true}`))
			f.set("auth/token", tc.reply)
			_, err := Dial(testCtx(t), Config{BaseURL: f.url(), APIKey: testKey, Timing: Timing{Clock: newFakeClock()}})
			tc.check(t, err)
			if n := len(f.requests("auth/token")); n != 1 {
				t.Fatalf("%d auth/token requests, want 1", n)
			}
			if n := len(f.requests("client/dynamic_config")); n != 0 {
				t.Fatal("Dial went on after a failed exchange")
			}
		})
	}
}

// §2.2: exp is read from the base64url payload, integer or fractional, padded or not;
// malformed tokens are refused with errors that never quote them.
func TestJWTExpiry(t *testing.T) {
	enc := base64.RawURLEncoding.EncodeToString
	hdr := enc([]byte(`{"alg":"HS256","typ":"JWT"}`))
	tok := func(payload string) string { return hdr + "." + enc([]byte(payload)) + ".c2ln" }
	good := map[string]time.Time{
		tok(`{"exp":1900000000}`):       time.Unix(1900000000, 0),
		tok(`{"exp":1900000000.25}`):    time.Unix(1900000000, 250_000_000),
		tok(`{"exp":"1900000000"}`):     time.Unix(1900000000, 0),
		tok(`{"sub":"x","exp":2e9}`):    time.Unix(2_000_000_000, 0),
		tok(`{"exp":1900000000}`) + "=": time.Unix(1900000000, 0),
		hdr + "." + base64.URLEncoding.EncodeToString([]byte(`{"exp":1900000000}`)) + ".c2ln": time.Unix(1900000000, 0),
	}
	for s, want := range good {
		got, err := jwtExpiry(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("jwtExpiry(%s) = %v, %v; want %v", s, got, err, want)
		}
	}
	bad := []string{
		tok(`{"sub":"x"}`), tok(`{"exp":null}`), tok(`{"exp":-5}`), tok(`{"exp":"soon"}`), tok(`[1]`),
		hdr + "." + enc([]byte(`{"exp":1900000000}`)), hdr + ".!!!.c2ln", "", "..", "eyJ",
		tok(`{"exp":1900000000}`) + "\r\nX-Evil: 1", tok(`{"exp":1900000000}`) + " ",
	}
	for _, s := range bad {
		_, err := jwtExpiry(s)
		if err == nil {
			t.Errorf("jwtExpiry(%q) accepted", s)
		} else if len(s) > 4 && strings.Contains(err.Error(), s[4:]) {
			t.Errorf("error %q quotes the token", err)
		}
	}
}

// The JWT, like the API key, appears nowhere but in the X-API-Key header: not in errors
// (a server echoing it, also across the 1 KiB truncation of error bodies, and foreign
// JWT-shaped text), logs, events or a printed Client.
func TestJWTNeverLeaks(t *testing.T) {
	f, m := jwtFake(t, hourLife)
	logs := &fleettest.Buffer{}
	c, _, ev := dial(t, f, func(cfg *Config) { cfg.Logger = debugLogger(logs) })
	tok := m.minted()[0]
	foreign := testJWT("1900000000", 99)
	// The last copy of the JWT straddles the truncation point of error bodies.
	head := `{"detail":"JWT ` + tok + ` (key ` + string(testKey) + `) refused","other":"` + foreign + `","pad":"`
	pad := maxErrorBody - len(head) - len(tok)/2
	if pad < 0 {
		t.Fatal("test body too long")
	}
	f.set("create_sampling_session", jsonReply(403, head+strings.Repeat("x", pad)+tok+`"}`))
	_, err := c.NewSampler(testCtx(t), SamplerSpec{BaseModel: "m"})
	if err == nil {
		t.Fatal("403 accepted")
	}
	if !strings.Contains(err.Error(), redactedText) {
		t.Fatalf("echoed JWT not redacted: %v", err)
	}
	cur, _ := c.jwt.current()
	c.log.Info("client", "client", c, "cfg", fmt.Sprintf("%+v", c), "jwt", cur)
	var all strings.Builder
	fmt.Fprintf(&all, "%s %+v %#v %s", err.Error(), err, err, logs.String())
	for _, e := range ev.ev {
		fmt.Fprintf(&all, "%+v", e)
	}
	text := all.String()
	for _, jwt := range []string{tok, foreign} {
		for _, seg := range strings.Split(jwt, ".")[1:] {
			if strings.Contains(text, seg[:12]) {
				t.Fatalf("a JWT segment leaked: %s", text)
			}
		}
	}
	if strings.Contains(text, "TESTSECRET") {
		t.Fatalf("the API key leaked: %s", text)
	}
	if got := f.requests("create_sampling_session")[0].Header.Get("X-Api-Key"); got != tok {
		t.Fatal("X-API-Key header is not the JWT")
	}
	if string(cur) != tok || fmt.Sprint(cur) != "eyJ"+redactedText {
		t.Fatalf("the stored JWT prints as %v", cur)
	}
}

// TestTheStartupJWTExchangeRetriesInTheSubmitLoop: the SDK runs the start-up JWT exchange
// in the 300 s loop of §6.2, on top of the 10 HTTP retries (InternalClientHolder.__init__,
// SDK 0.25.0; §3's table lists only the latter). Dial gave up after the HTTP retries, about a
// minute of auth/token outage, where the SDK starts.
func TestTheStartupJWTExchangeRetriesInTheSubmitLoop(t *testing.T) {
	f, _ := jwtFake(t, hourLife)
	unavailable := jsonReply(503, `{"detail":"unavailable"}`)
	for range 12 { // 1 + 10 HTTP retries, then one more: the 300 s loop's second try
		f.push("auth/token", unavailable)
	}
	fc := newFakeClock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, Config{BaseURL: f.url(), APIKey: testKey, Timing: Timing{Clock: fc, HeartbeatInterval: time.Hour}})
	if err != nil {
		t.Fatalf("Dial failed after %d auth/token requests over %s of (virtual) retries: %v",
			len(f.requests("auth/token")), sum(fc.Sleeps()), err)
	}
	_ = c.Close()
}

func sum(ds []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s
}
