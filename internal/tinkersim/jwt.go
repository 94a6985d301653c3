package tinkersim

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// This file is the server side of the JWT exchange (§2.2, §3.2). With Config.JWTAuth,
// client/config answers pjwt_auth_enabled true, POST auth/token exchanges an accepted API key
// for a JWT signed with HMAC-SHA256 under a per-server random secret, and every other API
// endpoint but client/config requires such a JWT, unexpired, in X-API-Key.

// jwtHeaderB64 is the base64url form of the fixed JOSE header of every minted JWT.
var jwtHeaderB64 = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))

// jwtClaims is the payload of a minted JWT. sub and email are what the SDK reads for whoami()
// (§2.2), exp what it schedules refreshes by; iat and exp are NumericDates (Unix seconds).
type jwtClaims struct {
	Sub   string `json:"sub"`
	Email string `json:"email"`
	Iat   int64  `json:"iat"`
	Exp   int64  `json:"exp"`
}

// jwtSecret is an HMAC-SHA256 signing key.
type jwtSecret [32]byte

// newJWTSecret returns a fresh random signing key.
func newJWTSecret() *jwtSecret {
	var k jwtSecret
	_, _ = rand.Read(k[:]) // crypto/rand.Read never fails (it aborts the program instead)
	return &k
}

// RevokeJWTs invalidates every JWT minted so far, as a rotation of the signing key would:
// requests carrying one get 401 until the client exchanges its API key again at auth/token.
// It lets tests see what a client does when its JWT is refused after the exchange.
func (s *Server) RevokeJWTs() { s.jwtKey.Store(newJWTSecret()) }

// jwtSubject is the sub claim for the holder of an API key: an HMAC of the key under a
// per-server salt, so that one key always maps to one user and the claim reveals nothing of
// the key.
func (s *Server) jwtSubject(apiKey string) string {
	mac := hmac.New(sha256.New, s.subSalt[:])
	mac.Write([]byte(apiKey))
	return "tinkersim-user-" + hex.EncodeToString(mac.Sum(nil)[:8])
}

// mintJWT returns a JWT for the user sub issued at now (§2.2). exp is rounded up to a whole
// second, so the token is valid for at least Config.JWTLifetime.
func (s *Server) mintJWT(sub string, now time.Time) string {
	exp := now.Add(s.cfg.JWTLifetime)
	expSec := exp.Unix()
	if exp.Nanosecond() > 0 {
		expSec++
	}
	// A struct of strings and integers always marshals.
	payload, _ := json.Marshal(jwtClaims{Sub: sub, Email: sub + "@tinkersim.invalid", Iat: now.Unix(), Exp: expSec})
	signed := jwtHeaderB64 + "." + base64.RawURLEncoding.EncodeToString(payload)
	return signed + "." + base64.RawURLEncoding.EncodeToString(jwtSign(s.jwtKey.Load(), signed))
}

// jwtSign is the HS256 signature of a JWT's signing input (header.payload).
func jwtSign(key *jwtSecret, signed string) []byte {
	mac := hmac.New(sha256.New, key[:])
	mac.Write([]byte(signed))
	return mac.Sum(nil)
}

// checkJWT returns "" when tok is a JWT minted by this server (HS256 under the current signing
// key) that has not expired at now, and otherwise the detail of the 401 reply. The token is
// never part of the detail.
func (s *Server) checkJWT(tok string, now time.Time) string {
	_, detail := s.jwtOf(tok, now)
	return detail
}

// jwtOf returns the claims of tok when checkJWT accepts it, and otherwise checkJWT's detail.
func (s *Server) jwtOf(tok string, now time.Time) (jwtClaims, string) {
	if tok == "" {
		return jwtClaims{}, "missing X-API-Key: JWT auth is on, exchange the API key at POST /api/v1/auth/token (§2.2)"
	}
	if strings.HasPrefix(tok, "tml-") {
		return jwtClaims{}, "an API key is not accepted here: JWT auth is on, exchange it at POST /api/v1/auth/token (§2.2)"
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return jwtClaims{}, "Invalid JWT"
	}
	var hdr struct {
		Alg string `json:"alg"`
		Typ string `json:"typ"`
	}
	hb, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || json.Unmarshal(hb, &hdr) != nil || hdr.Alg != "HS256" {
		return jwtClaims{}, "Invalid JWT"
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, jwtSign(s.jwtKey.Load(), parts[0]+"."+parts[1])) {
		return jwtClaims{}, "Invalid JWT"
	}
	var claims jwtClaims
	pb, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || json.Unmarshal(pb, &claims) != nil || claims.Exp == 0 {
		return jwtClaims{}, "Invalid JWT"
	}
	if !now.Before(time.Unix(claims.Exp, 0)) {
		return jwtClaims{}, "JWT expired: exchange the API key again at POST /api/v1/auth/token (§2.2)"
	}
	return claims, ""
}

// authenticate checks X-API-Key (§1.2, §12) for endpoint and answers 401 with a JSON detail
// when it fails. Without Config.JWTAuth every endpoint takes an accepted API key. With it
// (§2.2): client/config and auth/token take an accepted API key or a JWT of this server (the
// SDK fetches the flags before it knows about the exchange, and exchanges a JWT given as its
// credential like an API key: internal_client_holder of 0.25.0), and every other endpoint
// only a valid, unexpired JWT of this server; those refusals are counted in
// Stats.JWTRejections.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, endpoint string, now time.Time) bool {
	cred := r.Header.Get("X-API-Key")
	switch {
	case !s.cfg.JWTAuth:
		if s.authorized(r) {
			return true
		}
	case endpoint == epClientConfig || endpoint == epAuthToken:
		if s.authorized(r) || s.checkJWT(cred, now) == "" {
			return true
		}
	default:
		msg := s.checkJWT(cred, now)
		if msg == "" {
			return true
		}
		s.mu.Lock()
		s.st.jwtRejections++
		s.mu.Unlock()
		writeJSONError(w, http.StatusUnauthorized, msg)
		return false
	}
	writeJSONError(w, http.StatusUnauthorized, "invalid or missing X-API-Key")
	return false
}

// handleAuthToken implements POST /api/v1/auth/token (§3.2): body {}, an accepted API key or a
// JWT of this server in X-API-Key (checked by authenticate), reply {"jwt": …} for the same
// user. Without Config.JWTAuth it answers 404, as a service with pjwt_auth_enabled false need
// not serve it (§12).
func (s *Server) handleAuthToken(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.JWTAuth {
		writeJSONError(w, http.StatusNotFound, "JWT exchange is off (pjwt_auth_enabled is false)")
		return
	}
	var req struct{}
	if !s.decodePost(w, r, &req) {
		return
	}
	now := time.Now()
	cred := r.Header.Get("X-API-Key")
	sub := s.jwtSubject(cred)
	if claims, detail := s.jwtOf(cred, now); detail == "" {
		sub = claims.Sub // a JWT given as the credential: the same user, a fresh token
	}
	tok := s.mintJWT(sub, now)
	s.mu.Lock()
	s.st.tokensMinted++
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"jwt": tok})
}
