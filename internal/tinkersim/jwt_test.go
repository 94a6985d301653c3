package tinkersim

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

var sessionBody = map[string]any{"tags": []string{}, "user_metadata": map[string]any{}, "sdk_version": "0.25.0", "type": "create_session"}

// mint exchanges the harness's API key for a JWT at auth/token (§3.2).
func (h *harness) mint() string {
	h.t.Helper()
	r := h.do("POST", "/api/v1/auth/token", "{}")
	mustStatus(h.t, r, 200)
	tok, _ := r.json(h.t)["jwt"].(string)
	if tok == "" {
		h.t.Fatalf("auth/token reply %q has no jwt", r.body)
	}
	return tok
}

// decodeSegment decodes one base64url JWT segment into a JSON object.
func decodeSegment(t *testing.T, seg string) map[string]any {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		t.Fatalf("segment %q is not base64url: %v", seg, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("segment %s is not a JSON object: %v", b, err)
	}
	return m
}

// TestJWTAuthExchange: with JWTAuth, client/config announces pjwt_auth_enabled (§3.1);
// auth/token trades an accepted API key, body {}, for an HS256 JWT with sub, email, iat and exp
// (§2.2, §3.2); the other endpoints then take that JWT and refuse the plain API key.
func TestJWTAuthExchange(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{JWTAuth: true, JWTLifetime: 90 * time.Second})
	cfg := h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`)
	mustStatus(t, cfg, 200)
	if flags := cfg.json(t); flags["pjwt_auth_enabled"] != true || flags["credential_default_source"] != "api_key" {
		t.Fatalf("client/config %s", cfg.body)
	}

	before := time.Now().Unix()
	tok := h.mint()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || !strings.HasPrefix(tok, "eyJ") {
		t.Fatalf("JWT has %d parts", len(parts))
	}
	if hdr := decodeSegment(t, parts[0]); len(hdr) != 2 || hdr["alg"] != "HS256" || hdr["typ"] != "JWT" {
		t.Fatalf("JWT header %v", hdr)
	}
	claims := decodeSegment(t, parts[1])
	sub, _ := claims["sub"].(string)
	email, _ := claims["email"].(string)
	iat, _ := claims["iat"].(float64)
	exp, _ := claims["exp"].(float64)
	if sub == "" || !strings.Contains(email, "@") || int64(iat) < before || exp-iat < 90 || exp-iat > 91 {
		t.Fatalf("JWT claims %v", claims)
	}
	if strings.Contains(tok, testKey) || strings.Contains(sub, testKey) {
		t.Fatal("the JWT carries the API key")
	}
	// HS256 under the server's secret: recompute the signature independently.
	mac := hmac.New(sha256.New, h.srv.jwtKey.Load()[:])
	mac.Write([]byte(parts[0] + "." + parts[1]))
	if want := base64.RawURLEncoding.EncodeToString(mac.Sum(nil)); parts[2] != want {
		t.Fatal("signature is not HMAC-SHA256 of header.payload under the server's secret")
	}
	// The same key maps to the same subject.
	second := h.mint()
	if c := decodeSegment(t, strings.Split(second, ".")[1]); c["sub"] != sub || c["email"] != email {
		t.Fatalf("second JWT for the same key: %v, first sub %q", c, sub)
	}

	// A plain API key is refused everywhere but client/config and auth/token.
	for _, ep := range []struct{ method, path string }{{"POST", "/api/v1/create_session"}, {"GET", "/api/v1/healthz"},
		{"GET", "/api/v1/get_server_capabilities"}, {"GET", "/api/v1/training_runs"}} {
		var body any
		if ep.method == "POST" {
			body = sessionBody
		}
		r := h.do(ep.method, ep.path, body)
		if d := mustJSONError(t, r, http.StatusUnauthorized); !strings.Contains(d["detail"].(string), "auth/token") {
			t.Fatalf("%s with the API key: %q", ep.path, r.body)
		}
		mustStatus(t, h.do(ep.method, ep.path, body, "X-API-Key", tok), 200)
	}
	// client/config and auth/token take either (a JWT credential is exchanged for a fresh one
	// of the same user, as the SDK exchanges a JWT given as its key); a wrong key gets nothing.
	mustStatus(t, h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`, "X-API-Key", tok), 200)
	again := h.do("POST", "/api/v1/auth/token", "{}", "X-API-Key", tok)
	mustStatus(t, again, 200)
	tok2, _ := again.json(t)["jwt"].(string)
	if parts2 := strings.Split(tok2, "."); len(parts2) != 3 || decodeSegment(t, parts2[1])["sub"] != sub {
		t.Fatalf("the JWT of %q exchanged for %q", sub, tok2)
	}
	mustJSONError(t, h.do("POST", "/api/v1/auth/token", "{}", "X-API-Key", "tml-wrong"), http.StatusUnauthorized)
	mustJSONError(t, h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`, "X-API-Key", "tml-wrong"), http.StatusUnauthorized)
	// auth/token validates like every endpoint: body {} only, POST only.
	mustJSONError(t, h.do("POST", "/api/v1/auth/token", `{"api_key":"x"}`), http.StatusUnprocessableEntity)
	mustJSONError(t, h.do("GET", "/api/v1/auth/token", nil), http.StatusMethodNotAllowed)

	// A whole sampling round trip on the JWT.
	r := h.do("POST", "/api/v1/create_session", sessionBody, "X-API-Key", tok)
	mustStatus(t, r, 200)
	r = h.do("POST", "/api/v1/create_sampling_session", map[string]any{"session_id": r.json(t)["session_id"],
		"sampling_session_seq_id": 0, "base_model": "Qwen/Qwen3-8B", "type": "create_sampling_session"}, "X-API-Key", tok)
	mustStatus(t, r, 200)
	ssid := r.json(t)["sampling_session_id"].(string)
	r = h.do("POST", "/api/v1/asample", sampleBody(ssid, 0, []int32{1, 2, 3}, nil), "X-API-Key", tok)
	mustStatus(t, r, 200)
	id := r.json(t)["request_id"].(string)
	for {
		r = h.do("POST", "/api/v1/retrieve_future", map[string]any{"request_id": id, "allow_metadata_only": true},
			"X-API-Key", tok, "Accept", "application/x-protobuf")
		if r.status != http.StatusRequestTimeout {
			break
		}
	}
	mustStatus(t, r, 200)

	// Admin endpoints keep taking the API key.
	mustStatus(t, h.do("GET", "/admin/stats", nil), 200)
	st := h.srv.Stats()
	if st.TokensMinted != 3 || st.JWTRejections != 4 || st.SamplesCompleted != 1 {
		t.Fatalf("stats: %d minted, %d JWT rejections, %d completed; want 3, 4, 1",
			st.TokensMinted, st.JWTRejections, st.SamplesCompleted)
	}
	if st.Requests["auth/token"][200] != 3 || st.Requests["create_session"][401] != 1 {
		t.Fatalf("requests %v", st.Requests)
	}
}

// TestJWTAuthRefusesBadTokens: tampered, foreign, unsigned, malformed, expired and revoked
// JWTs get 401 with a JSON detail that does not echo the token.
func TestJWTAuthRefusesBadTokens(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{JWTAuth: true})
	other := newHarness(t, Config{JWTAuth: true})
	tok := h.mint()
	parts := strings.Split(tok, ".")
	claims := decodeSegment(t, parts[1])
	claims["exp"] = claims["exp"].(float64) + 3600
	longer, _ := json.Marshal(claims)
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	expired := h.srv.mintJWT(h.srv.jwtSubject(testKey), time.Now().Add(-2*time.Hour))
	bad := map[string]string{
		"tampered payload":    parts[0] + "." + base64.RawURLEncoding.EncodeToString(longer) + "." + parts[2],
		"tampered signature":  parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2])),
		"alg none":            none + "." + parts[1] + ".",
		"another server's":    other.mint(),
		"two parts":           parts[0] + "." + parts[1],
		"not base64":          "eyJ!.eyJ!.sig",
		"expired":             expired,
		"empty":               "",
		"a key not a JWT":     "sk-" + testKey,
		"an accepted API key": testKey,
	}
	for name, cred := range bad {
		r := h.do("POST", "/api/v1/create_session", sessionBody, "X-API-Key", cred)
		d := mustJSONError(t, r, http.StatusUnauthorized)
		detail, _ := d["detail"].(string)
		if detail == "" || (cred != "" && strings.Contains(string(r.body), cred)) {
			t.Fatalf("%s: 401 body %q", name, r.body)
		}
		if name == "expired" && !strings.Contains(detail, "expired") {
			t.Fatalf("expired JWT: detail %q", detail)
		}
	}
	if got := h.srv.Stats().JWTRejections; got != int64(len(bad)) {
		t.Fatalf("%d JWT rejections counted, want %d", got, len(bad))
	}
	// The untouched token still works; after RevokeJWTs it does not, a new one does.
	mustStatus(t, h.do("POST", "/api/v1/create_session", sessionBody, "X-API-Key", tok), 200)
	h.srv.RevokeJWTs()
	mustJSONError(t, h.do("POST", "/api/v1/create_session", sessionBody, "X-API-Key", tok), http.StatusUnauthorized)
	mustStatus(t, h.do("POST", "/api/v1/create_session", sessionBody, "X-API-Key", h.mint()), 200)
}

// TestJWTAuthOffAndLifetime: without JWTAuth, client/config says pjwt_auth_enabled false,
// auth/token answers 404 and a JWT is no credential (§12); ClientConfig may still override the
// flag. A short JWTLifetime expires tokens: valid right after minting, refused after exp.
func TestJWTAuthOffAndLifetime(t *testing.T) {
	t.Parallel()
	h := newHarness(t, Config{})
	mustStatus(t, h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`), 200)
	if h.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`).json(t)["pjwt_auth_enabled"] != false {
		t.Fatal("pjwt_auth_enabled is not false by default")
	}
	mustJSONError(t, h.do("POST", "/api/v1/auth/token", "{}"), http.StatusNotFound)
	jwt := h.srv.mintJWT(h.srv.jwtSubject(testKey), time.Now())
	mustJSONError(t, h.do("GET", "/api/v1/healthz", nil, "X-API-Key", jwt), http.StatusUnauthorized)
	if st := h.srv.Stats(); st.TokensMinted != 0 || st.JWTRejections != 0 {
		t.Fatalf("stats without JWT auth: %+v", st)
	}

	o := newHarness(t, Config{JWTAuth: true, ClientConfig: map[string]any{"pjwt_auth_enabled": false}})
	if o.do("POST", "/api/v1/client/config", `{"sdk_version":"0.25.0"}`).json(t)["pjwt_auth_enabled"] != false {
		t.Fatal("ClientConfig did not override pjwt_auth_enabled")
	}

	if _, err := New(Config{JWTLifetime: -time.Second}); err == nil {
		t.Fatal("a negative JWTLifetime was accepted")
	}
	if got := h.srv.Config().JWTLifetime; got != time.Hour {
		t.Fatalf("default JWTLifetime %v, want 1h", got)
	}

	// Expiry against the server's own clock: a token minted now with a 1 s lifetime is
	// valid now and refused 2 s later (checkJWT takes the time as an argument).
	s := newHarness(t, Config{JWTAuth: true, JWTLifetime: time.Second}).srv
	now := time.Now()
	tok := s.mintJWT(s.jwtSubject(testKey), now)
	if msg := s.checkJWT(tok, now); msg != "" {
		t.Fatalf("fresh token refused: %s", msg)
	}
	if msg := s.checkJWT(tok, now.Add(2*time.Second)); !strings.Contains(msg, "expired") {
		t.Fatalf("token 2 s after a 1 s lifetime: %q, want expired", msg)
	}
}
