package tinker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"
)

// This file is the JWT exchange of §2.2. When client/config says pjwt_auth_enabled, Dial
// trades the API key (or the credential command's output) for a server-minted JWT at POST
// auth/token (§3.2), and every later request sends the JWT as X-API-Key. The JWT is refreshed
// in the background Timing.JWTRefreshBeforeExpiry (300 s) before its exp, by a goroutine owned
// by the Client and stopped by Close, and on demand inside a request when no more than
// Timing.JWTRefreshOnDemand (60 s) remains. A failed background refresh is retried after
// Timing.JWTRefreshRetry (60 s).
//
// exp is the server's wall-clock time, so the schedule runs on real time (like the heartbeat),
// not on Timing.Clock: a virtual clock whose Sleep returns at once would make the refresh loop
// spin.

// jwtShape matches anything that looks like a JWT (or a truncated one): base64url of a JSON
// object starts with "eyJ". Error bodies are scrubbed of such text whoever minted it.
var jwtShape = regexp.MustCompile(`eyJ[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_=-]*){0,2}`)

// jwtAuth holds the JWT that replaces the API key (§2.2) and keeps it fresh.
type jwtAuth struct {
	c *Client

	mu  sync.Mutex // guards tok, exp and old
	tok APIKey     // the JWT in use; an APIKey, so that printing it shows a redacted form
	exp time.Time  // its exp claim
	old APIKey     // the JWT before tok, still scrubbed from error bodies

	// mint serialises exchanges (background and on-demand) so that waiting requests reuse a
	// refresh in progress instead of starting their own: a lock that a context can abandon.
	mint chan struct{}

	cancel context.CancelFunc // stops the background refresh (Close)
	done   chan struct{}      // closed when it has stopped
}

// startAuth applies the credential rules of §2.1 and §2.2 once client/config is known. Without
// pjwt_auth_enabled the API key (or a JWT given as the key) is sent as it is, and the
// credential command alone is an error, as in the SDK. With it, a credential is exchanged for
// a JWT and the background refresh starts: the API key when it is a JWT ("eyJ…", which the SDK
// exchanges too, never running the command for it), else the command's output when the
// server's credential_default_source is "credential_cmd" or there is no API key, else the API
// key. A server that asks for the command's credential when none is set is an error, as in
// the SDK (resolve_auth_provider).
func (c *Client) startAuth(ctx context.Context) error {
	key := c.apiKey()
	if !c.flags.PJWTAuthEnabled {
		if key == "" {
			return errors.New("tinker: the server does not exchange credentials for JWTs (pjwt_auth_enabled is off), so TINKER_CREDENTIAL_CMD alone is not enough: set TINKER_API_KEY or TINKER_API_KEY_FILE (§2.1)")
		}
		return nil // §2.1: the plain API key
	}
	isJWT := strings.HasPrefix(string(key), "eyJ")
	switch {
	case key == "":
		c.viaCmd = true
	case isJWT: // exchanged as it is, whatever the server's default source
	case c.flags.CredentialDefaultSource == "credential_cmd" && c.cmd != nil:
		c.viaCmd = true
	case c.flags.CredentialDefaultSource == "credential_cmd":
		return errors.New(`tinker: the server requires credentials from a command (credential_default_source "credential_cmd"): set TINKER_CREDENTIAL_CMD to a command that prints a valid credential (§2.2)`)
	}
	// SDK 0.25.0: execute_with_retries(self._default_auth.init): the 300 s loop of §6.2.
	var tok APIKey
	var exp time.Time
	err := c.withRetries(ctx, "auth/token", "", nil, func(ctx context.Context) error {
		var err error
		tok, exp, err = c.exchangeJWT(ctx)
		return err
	})
	if err != nil {
		return err
	}
	a := &jwtAuth{c: c, tok: tok, exp: exp, mint: make(chan struct{}, 1), done: make(chan struct{})}
	rctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	c.jwt = a
	go a.refreshLoop(rctx)
	return nil
}

// exchangeJWT is POST auth/token (§2.2, §3.2): body {}, the API key (or the credential
// command's output, see startAuth) in X-API-Key, the HTTP retries of §6.1 (10, as the table
// of §3 says for this call), reply {"jwt": …}. It returns the JWT and its exp. No error
// carries the JWT.
func (c *Client) exchangeJWT(ctx context.Context) (APIKey, time.Time, error) {
	var out struct {
		JWT *string `json:"jwt"`
	}
	cl := &call{name: "auth/token", method: http.MethodPost, path: "api/v1/auth/token", body: []byte("{}"),
		maxRetries: c.t.HTTPMaxRetries, useAPIKey: true}
	if err := c.doJSON(ctx, cl, &out); err != nil {
		return "", time.Time{}, fmt.Errorf("tinker: JWT exchange: %w", err)
	}
	if out.JWT == nil || *out.JWT == "" {
		return "", time.Time{}, &ProtocolError{Endpoint: cl.name, Msg: "reply has no jwt"}
	}
	exp, err := jwtExpiry(*out.JWT)
	if err != nil {
		return "", time.Time{}, &ProtocolError{Endpoint: cl.name, Msg: "unusable JWT", Err: err}
	}
	return APIKey(*out.JWT), exp, nil
}

// jwtExpiry decodes the payload of a JWT (base64url, no signature check, §2.2) and returns its
// exp claim, a NumericDate (seconds since the epoch, possibly fractional). It also checks that
// the token is three base64url segments, so that it is a valid header value. Its errors never
// quote the token.
func jwtExpiry(tok string) (time.Time, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return time.Time{}, errors.New("not three dot-separated segments")
	}
	for _, r := range tok {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '=') {
			return time.Time{}, errors.New("a character outside base64url")
		}
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, errors.New("payload is not base64url")
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, errors.New("payload is not a JSON object with a numeric exp")
	}
	if claims.Exp == "" {
		return time.Time{}, errors.New("payload has no exp claim")
	}
	f, err := claims.Exp.Float64()
	if err != nil || math.IsInf(f, 0) || f <= 0 || f > 1<<40 {
		return time.Time{}, errors.New("exp claim is not a usable time")
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}

// credential is the X-API-Key value of one HTTP request of cl (§1.2): the JWT while the
// exchange is on (§2.2; refreshed first if it is about to expire), except for calls that must
// carry the credential itself (auth/token); otherwise the API key, or what the credential
// command prints where that is the credential (§2.1; it runs for each such request).
func (c *Client) credential(ctx context.Context, cl *call) (APIKey, error) {
	if c.jwt != nil && !cl.useAPIKey {
		return c.jwt.token(ctx), nil
	}
	if c.cmd != nil && (c.apiKey() == "" || cl.useAPIKey && c.viaCmd) {
		return c.cmd.fetch(ctx)
	}
	return c.apiKey(), nil
}

// current returns the JWT in use and its exp.
func (a *jwtAuth) current() (APIKey, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tok, a.exp
}

// set installs a freshly minted JWT.
func (a *jwtAuth) set(tok APIKey, exp time.Time) {
	a.mu.Lock()
	a.old, a.tok, a.exp = a.tok, tok, exp
	a.mu.Unlock()
}

// secrets returns the JWTs that error bodies are scrubbed of.
func (a *jwtAuth) secrets() (APIKey, APIKey) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tok, a.old
}

// lock takes the mint lock, or gives up when ctx is done.
func (a *jwtAuth) lock(ctx context.Context) bool {
	select {
	case a.mint <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (a *jwtAuth) unlock() { <-a.mint }

// refresh mints a new JWT and installs it.
func (a *jwtAuth) refresh(ctx context.Context) error {
	tok, exp, err := a.c.exchangeJWT(ctx)
	if err != nil {
		return err
	}
	a.set(tok, exp)
	a.c.log.Debug("tinker: JWT refreshed", "exp", exp)
	return nil
}

// token returns the JWT for a request. When no more than Timing.JWTRefreshOnDemand remains it
// refreshes first (§2.2), or waits for a refresh already in progress; if that refresh fails
// it logs a warning and falls back to the cached JWT, as the SDK does (the background refresh
// keeps trying, and a server that refuses the JWT answers 401).
func (a *jwtAuth) token(ctx context.Context) APIKey {
	onDemand := a.c.t.JWTRefreshOnDemand
	tok, exp := a.current()
	if time.Until(exp) > onDemand {
		return tok
	}
	if !a.lock(ctx) {
		return tok // the request fails on its context anyway
	}
	defer a.unlock()
	if tok, exp = a.current(); time.Until(exp) > onDemand {
		return tok // refreshed while this request waited
	}
	if err := a.refresh(ctx); err != nil {
		if ctx.Err() == nil {
			a.c.log.Warn("tinker: on-demand JWT refresh failed; using the cached JWT", "err", err)
		}
		return tok
	}
	tok, _ = a.current()
	return tok
}

// nextRefresh is the wait before the next background refresh (§2.2): until
// Timing.JWTRefreshBeforeExpiry before exp. A JWT that lives shorter than that would, by the
// rule alone, be re-minted back to back; it is refreshed halfway through its remaining life
// instead, and no sooner than Timing.JWTRefreshRetry (requests still refresh on demand).
func (a *jwtAuth) nextRefresh() time.Duration {
	_, exp := a.current()
	left := time.Until(exp)
	if d := left - a.c.t.JWTRefreshBeforeExpiry; d > 0 {
		return d
	}
	return max(left/2, a.c.t.JWTRefreshRetry)
}

// refreshLoop is the background refresh (§2.2), owned by the Client and stopped by Close
// (which cancels ctx and waits for done). After a failed refresh it waits
// Timing.JWTRefreshRetry and tries again.
func (a *jwtAuth) refreshLoop(ctx context.Context) {
	defer close(a.done)
	t := time.NewTimer(a.nextRefresh())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !a.lock(ctx) {
			return
		}
		var err error
		if _, exp := a.current(); time.Until(exp) <= a.c.t.JWTRefreshBeforeExpiry {
			err = a.refresh(ctx)
		} // else an on-demand refresh got there first
		a.unlock()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			a.c.log.Warn("tinker: background JWT refresh failed; retrying", "in", a.c.t.JWTRefreshRetry, "err", err)
			t.Reset(a.c.t.JWTRefreshRetry)
		default:
			t.Reset(a.nextRefresh())
		}
	}
}

// stop stops the background refresh and waits for it.
func (a *jwtAuth) stop() {
	a.cancel()
	<-a.done
}

// redact removes every credential from s (an error body): the API key and those it replaced,
// the JWTs in use (§2.2) and anything shaped like a JWT.
func (c *Client) redact(s string) string {
	secrets := append([]APIKey{c.apiKey(), c.cf.ClientSecret}, c.retiredKeys()...)
	if c.cmd != nil {
		printed := c.cmd.secrets()
		secrets = append(secrets, printed[:]...)
	}
	if c.jwt != nil {
		tok, old := c.jwt.secrets()
		secrets = append(secrets, tok, old)
	}
	for _, k := range secrets {
		if k != "" && strings.Contains(s, string(k)) {
			s = strings.ReplaceAll(s, string(k), redactedText)
		}
	}
	return jwtShape.ReplaceAllString(s, redactedText)
}
