package tinkersim

import (
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// serveAdmin implements the admin endpoints (JSON):
//
//	POST   /admin/faults      body: one fault object or a list → {"ids":[…]}
//	GET    /admin/faults      → the injected faults
//	DELETE /admin/faults      → clears every fault
//	DELETE /admin/faults/{id} → removes one fault
//	GET    /admin/stats       → Stats
//	POST   /admin/reset       → clears faults and stats
//	POST   /admin/forget_sessions → forgets every session, sampler and future (a restart)
//	PUT    /admin/api_keys    body: {"api_keys":["tml-…"]} → the keys accepted from now on (a rotation)
//
// A fault object: {"kind":"429","rate":0.5,"count":1,"start_in":"1s","duration":"30s",
// "reason":"…","category":"user","status":503,"delay":"15s","retry_after":"2s",
// "endpoints":["asample"]}.
func (s *Server) serveAdmin(w http.ResponseWriter, r *http.Request, rest string) {
	if !s.adminAuthorized(r) {
		writeJSONError(w, http.StatusUnauthorized, "admin: invalid or missing credentials")
		return
	}
	switch {
	case rest == "stats":
		if requireMethod(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, s.Stats())
		}
	case rest == "reset":
		if requireMethod(w, r, http.MethodPost) {
			s.Reset()
			writeJSON(w, http.StatusOK, map[string]string{"status": "reset"})
		}
	case rest == "forget_sessions":
		if requireMethod(w, r, http.MethodPost) {
			s.ForgetSessions()
			writeJSON(w, http.StatusOK, map[string]string{"status": "forgotten"})
		}
	case rest == "api_keys":
		if requireMethod(w, r, http.MethodPut) {
			s.adminSetAPIKeys(w, r)
		}
	case rest == "faults":
		switch r.Method {
		case http.MethodGet:
			writeJSON(w, http.StatusOK, map[string]any{"faults": s.Faults()})
		case http.MethodDelete:
			s.ClearFaults()
			writeJSON(w, http.StatusOK, map[string]string{"status": "cleared"})
		case http.MethodPost:
			s.adminInject(w, r)
		default:
			w.Header().Set("Allow", "GET, POST, DELETE")
			writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed")
		}
	case strings.HasPrefix(rest, "faults/"):
		if !requireMethod(w, r, http.MethodDelete) {
			return
		}
		id, err := strconv.Atoi(strings.TrimPrefix(rest, "faults/"))
		if err != nil || !s.RemoveFault(FaultID(id)) {
			writeJSONError(w, http.StatusNotFound, "no such fault: "+strings.TrimPrefix(rest, "faults/"))
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "removed"})
	default:
		writeJSONError(w, http.StatusNotFound, "no such admin endpoint: "+rest)
	}
}

// adminAuthorized checks X-Admin-Token when Config.AdminToken is set, else X-API-Key.
func (s *Server) adminAuthorized(r *http.Request) bool {
	if s.cfg.AdminToken == "" {
		return s.authorized(r)
	}
	return subtle.ConstantTimeCompare([]byte(s.cfg.AdminToken), []byte(r.Header.Get("X-Admin-Token"))) == 1
}

// adminSetAPIKeys replaces the accepted API keys (SetAPIKeys) with the body's api_keys.
func (s *Server) adminSetAPIKeys(w http.ResponseWriter, r *http.Request) {
	var req struct {
		APIKeys []string `json:"api_keys"`
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		writeHTTPError(w, badRequest("read body: %v", err))
		return
	}
	if e := decodeBytesStrict(raw, &req); e != nil {
		writeHTTPError(w, e)
		return
	}
	if err := s.SetAPIKeys(req.APIKeys...); err != nil {
		writeHTTPError(w, unprocessable("%v", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"api_keys": len(req.APIKeys)})
}

// adminInject reads one fault object or a list of them and injects them all (or none).
func (s *Server) adminInject(w http.ResponseWriter, r *http.Request) {
	var raw json.RawMessage
	body := http.MaxBytesReader(w, r.Body, 1<<20)
	if err := json.NewDecoder(body).Decode(&raw); err != nil {
		writeHTTPError(w, badRequest("malformed JSON: %v", err))
		return
	}
	var list []faultJSON
	if t := strings.TrimSpace(string(raw)); strings.HasPrefix(t, "[") {
		if e := decodeBytesStrict(raw, &list); e != nil {
			writeHTTPError(w, e)
			return
		}
	} else {
		var one faultJSON
		if e := decodeBytesStrict(raw, &one); e != nil {
			writeHTTPError(w, e)
			return
		}
		list = []faultJSON{one}
	}
	now := time.Now()
	faults := make([]Fault, 0, len(list))
	for i := range list {
		f, err := list[i].toFault(now)
		if err == nil {
			f, err = f.validate()
		}
		if err != nil {
			writeHTTPError(w, unprocessable("fault #%d: %v", i+1, err))
			return
		}
		faults = append(faults, f)
	}
	s.mu.Lock()
	ids := make([]FaultID, 0, len(faults))
	for _, f := range faults {
		ids = append(ids, s.injectLocked(f, now))
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"ids": ids})
}
