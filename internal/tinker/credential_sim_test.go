package tinker_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// After the service stops honouring the client's JWT (RevokeJWTs), samples are refused with
// 401; CheckCredential mints a new JWT and finds the credential accepted, and the next sample
// goes through on it.
func TestCheckCredentialRenewsARevokedJWT(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{JWTAuth: true}, nil)
	s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	e.sim.RevokeJWTs()
	_, err := s.Sample(e.ctx, simRequest(1))
	if !tinker.CredentialRefused(err) {
		t.Fatalf("sample with a revoked JWT: %v, want a refused credential", err)
	}
	if err := e.client.CheckCredential(e.ctx); err != nil {
		t.Fatalf("check the credential: %v", err)
	}
	if _, err := s.Sample(e.ctx, simRequest(2)); err != nil {
		t.Fatalf("sample after the check: %v", err)
	}
	if n := len(e.jwtCreds()); n != 2 {
		t.Fatalf("%d JWTs on the wire, want the revoked one and the one the check minted", n)
	}
}

// A key the service refuses (a 401 fault: the key revoked) fails CheckCredential with an
// error CredentialRefused recognises, which does not hold the key; a heartbeat that fails
// otherwise (a 503) says nothing about the credential; and once the key is accepted again,
// the check passes.
func TestCheckCredentialTellsARefusedKey(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{}, nil)
	refused, err := e.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultUnauthorized})
	if err != nil {
		t.Fatal(err)
	}
	err = e.client.CheckCredential(e.ctx)
	if !tinker.CredentialRefused(err) || strings.Contains(err.Error(), simKey) {
		t.Fatalf("check a revoked key: %v, want a refused credential", err)
	}
	e.sim.RemoveFault(refused)

	down, err := e.sim.Inject(tinkersim.Fault{Kind: tinkersim.FaultServerError, Status: 503, Endpoints: []string{"session_heartbeat"}})
	if err != nil {
		t.Fatal(err)
	}
	err = e.client.CheckCredential(e.ctx)
	var se *tinker.StatusError
	if err == nil || tinker.CredentialRefused(err) || !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("check with the heartbeat failing: %v, want the 503 and no verdict on the credential", err)
	}
	e.sim.RemoveFault(down)

	if err := e.client.CheckCredential(e.ctx); err != nil {
		t.Fatalf("check an accepted key: %v", err)
	}
	if n := e.requests("session_heartbeat", http.StatusUnauthorized); n != 1 {
		t.Fatalf("%d heartbeats refused, want the check's one", n)
	}
}

// SetAPIKey takes a rotated key: after the service accepts only the new key, the client's
// requests are refused until it holds it, and go through after. A credential of another kind,
// or an invalid one, is refused, and the key in use is kept.
func TestSetAPIKeyTakesARotatedKey(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{}, nil)
	const rotated = "tml-rotated"
	if err := e.sim.SetAPIKeys(rotated); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CheckCredential(e.ctx); !tinker.CredentialRefused(err) {
		t.Fatalf("the old key after the rotation: %v, want refused", err)
	}
	for _, bad := range []tinker.APIKey{"eyJhbGciOi.x.y", "not-a-key", ""} {
		if changed, err := e.client.SetAPIKey(bad); err == nil || changed {
			t.Errorf("SetAPIKey(%q) = %v, %v; want an error", bad, changed, err)
		}
	}
	if changed, err := e.client.SetAPIKey(rotated); err != nil || !changed {
		t.Fatalf("SetAPIKey(the rotated key) = %v, %v", changed, err)
	}
	if changed, err := e.client.SetAPIKey(rotated); err != nil || changed {
		t.Fatalf("SetAPIKey(the key in use) = %v, %v; want no change", changed, err)
	}
	if err := e.client.CheckCredential(e.ctx); err != nil {
		t.Fatalf("the rotated key: %v", err)
	}
}

// With the JWT exchange on, a rotated key is what the next exchange sends: the check after
// the rotation is refused (the old key cannot be exchanged), and after SetAPIKey the check
// mints a JWT from the new key.
func TestSetAPIKeyIsExchangedForJWTs(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{JWTAuth: true}, nil)
	const rotated = "tml-rotated"
	if err := e.sim.SetAPIKeys(rotated); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CheckCredential(e.ctx); !tinker.CredentialRefused(err) {
		t.Fatalf("the old key after the rotation: %v, want refused", err)
	}
	if changed, err := e.client.SetAPIKey(rotated); err != nil || !changed {
		t.Fatalf("SetAPIKey = %v, %v", changed, err)
	}
	if err := e.client.CheckCredential(e.ctx); err != nil {
		t.Fatalf("the rotated key: %v", err)
	}
	s := e.sampler(t, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if _, err := s.Sample(e.ctx, simRequest(1)); err != nil {
		t.Fatalf("sample on the JWT of the rotated key: %v", err)
	}
}

// A session the service no longer knows (it restarted) does not make the credential look
// refused: the heartbeat's 404 was answered to an accepted key.
func TestCheckCredentialAcceptsAForgottenSession(t *testing.T) {
	t.Parallel()
	e := newSimEnv(t, tinkersim.Config{}, func(c *tinker.Config) { c.Timing.HeartbeatInterval = time.Hour })
	e.sim.ForgetSessions()
	if err := e.client.CheckCredential(e.ctx); err != nil {
		t.Fatalf("check with a forgotten session: %v", err)
	}
	if n := e.requests("session_heartbeat", http.StatusNotFound); n != 1 {
		t.Fatalf("%d heartbeats answered 404, want the check's one", n)
	}
}
