package tinkersim

import (
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"
)

// model looks a served base model up by name.
func (s *Server) model(name string) (Model, bool) {
	for _, m := range s.cfg.Models {
		if m.Name == name {
			return m, true
		}
	}
	return Model{}, false
}

// handleClientConfig implements POST /api/v1/client/config (§3.1): the SDK defaults, with
// pjwt_auth_enabled set by Config.JWTAuth (§2.2), overridden by Config.ClientConfig.
func (s *Server) handleClientConfig(w http.ResponseWriter, r *http.Request) {
	var req sdkVersionRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	flags := map[string]any{
		"pjwt_auth_enabled":                        s.cfg.JWTAuth,
		"credential_default_source":                "api_key",
		"sample_dispatch_bytes_semaphore_size":     10485760,
		"inflight_response_bytes_semaphore_size":   52428800,
		"billing_exception_max_pause_duration_sec": 3600,
		"sample_no_retries":                        false,
		"sample_enable_stuck_detection":            true,
		"sample_max_concurrent_requests":           2000,
		"use_pyqwest_transport":                    true,
	}
	maps.Copy(flags, s.cfg.ClientConfig)
	writeJSON(w, http.StatusOK, flags)
}

// handleDynamicConfig implements POST /api/v1/client/dynamic_config (§3.1b), or 404 when
// disabled (the SDK then falls back to defaults).
func (s *Server) handleDynamicConfig(w http.ResponseWriter, r *http.Request) {
	if s.cfg.DisableDynamicConfig {
		writeJSONError(w, http.StatusNotFound, "not found")
		return
	}
	var req sdkVersionRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"refresh_interval_sec": 300})
}

// handleCreateSession implements POST /api/v1/create_session (§3.3).
func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	var req createSessionRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	if e := checkLiteral("type", req.Type, "create_session", true); e != nil {
		writeHTTPError(w, e)
		return
	}
	if req.SDKVersion == nil {
		writeHTTPError(w, unprocessable("field \"sdk_version\" is required"))
		return
	}
	now := time.Now()
	s.mu.Lock()
	id := s.newIDLocked()
	s.sessions[id] = &session{id: id, created: now, lastHeartbeat: now}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"type": "create_session", "session_id": id,
		"info_message": nil, "warning_message": nil, "error_message": nil})
}

// handleHeartbeat implements POST /api/v1/session_heartbeat (§3.4), slowed by an injected
// slow_heartbeat fault. A session that went Config.SessionTimeout without one has expired
// and answers 404.
func (s *Server) handleHeartbeat(w http.ResponseWriter, r *http.Request) {
	var req heartbeatRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	if e := checkLiteral("type", req.Type, "session_heartbeat", true); e != nil {
		writeHTTPError(w, e)
		return
	}
	if req.SessionID == nil {
		writeHTTPError(w, unprocessable("field \"session_id\" is required"))
		return
	}
	now := time.Now()
	s.mu.Lock()
	sess := s.sessionLocked(*req.SessionID, now)
	if sess != nil {
		sess.lastHeartbeat = now
	}
	slow := s.hitLocked(epHeartbeat, now, FaultSlowHeartbeat)
	s.mu.Unlock()
	if sess == nil {
		writeJSONError(w, http.StatusNotFound, "session not found: "+*req.SessionID)
		return
	}
	if slow != nil {
		s.delay(r, slow.f.Delay)
	}
	writeJSON(w, http.StatusOK, map[string]string{"type": "session_heartbeat"})
}

// handleCreateSamplingSession implements POST /api/v1/create_sampling_session (§3.5). The id
// is <session_id>:sample:<sampling_session_seq_id>, so a repeated request gets the same sampler.
func (s *Server) handleCreateSamplingSession(w http.ResponseWriter, r *http.Request) {
	var req createSamplingSessionRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	if e := checkLiteral("type", req.Type, "create_sampling_session", true); e != nil {
		writeHTTPError(w, e)
		return
	}
	if req.SessionID == nil || req.SamplingSessionSeqID == nil {
		writeHTTPError(w, unprocessable("fields \"session_id\" and \"sampling_session_seq_id\" are required"))
		return
	}
	if *req.SamplingSessionSeqID < 0 {
		writeHTTPError(w, unprocessable("field \"sampling_session_seq_id\" must not be negative"))
		return
	}
	if req.BaseModel == nil && req.ModelPath == nil {
		writeHTTPError(w, unprocessable("one of \"base_model\" or \"model_path\" is required"))
		return
	}
	var m Model
	if req.BaseModel != nil {
		var ok bool
		if m, ok = s.model(*req.BaseModel); !ok {
			writeHTTPError(w, badRequest("unsupported base_model %q", *req.BaseModel))
			return
		}
	}
	if req.ModelPath != nil {
		if !strings.HasPrefix(*req.ModelPath, "tinker://") {
			writeHTTPError(w, badRequest("model_path must start with tinker://"))
			return
		}
		if req.BaseModel == nil {
			// The base model "is inferred from model_path": from a synthetic run if known.
			m = s.cfg.Models[0]
			if run, ok := s.runForPath(*req.ModelPath); ok {
				m, _ = s.model(run.BaseModel)
			}
		}
	}
	s.mu.Lock()
	sess := s.sessionLocked(*req.SessionID, time.Now())
	if sess == nil {
		s.mu.Unlock()
		writeJSONError(w, http.StatusNotFound, "session not found: "+*req.SessionID)
		return
	}
	id := fmt.Sprintf("%s:sample:%d", sess.id, *req.SamplingSessionSeqID)
	if _, ok := s.samplers[id]; !ok {
		s.samplers[id] = &sampler{id: id, session: sess.id, baseModel: m.Name, modelPath: req.ModelPath, maxCtx: m.MaxContextLength}
		sess.samplerIDs = append(sess.samplerIDs, id)
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]string{"type": "create_sampling_session", "sampling_session_id": id})
}

// handleGetSampler implements GET /api/v1/samplers/{id} (§3.9).
func (s *Server) handleGetSampler(w http.ResponseWriter, r *http.Request, id string) {
	if !requireMethod(w, r, http.MethodGet) {
		return
	}
	s.mu.Lock()
	sm := s.samplerLocked(id, time.Now())
	s.mu.Unlock()
	if sm == nil {
		writeJSONError(w, http.StatusNotFound, "sampler not found: "+id)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"sampler_id": sm.id, "base_model": sm.baseModel, "model_path": sm.modelPath})
}

// handleTelemetry implements POST /api/v1/telemetry (§3.12): accepted and dropped.
func (s *Server) handleTelemetry(w http.ResponseWriter, r *http.Request) {
	var req telemetryRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "accepted"})
}

// handleCapabilities implements GET /api/v1/get_server_capabilities (§3.8).
func (s *Server) handleCapabilities(w http.ResponseWriter, r *http.Request) {
	if !requireMethod(w, r, http.MethodGet) {
		return
	}
	type entry struct {
		ModelName        string `json:"model_name"`
		MaxContextLength int    `json:"max_context_length"`
	}
	list := make([]entry, 0, len(s.cfg.Models))
	for _, m := range s.cfg.Models {
		list = append(list, entry{m.Name, m.MaxContextLength})
	}
	writeJSON(w, http.StatusOK, map[string]any{"supported_models": list})
}

// handleWeightsInfo implements POST /api/v1/weights_info (§3.11) for the synthetic checkpoints.
func (s *Server) handleWeightsInfo(w http.ResponseWriter, r *http.Request) {
	var req weightsInfoRequest
	if !s.decodePost(w, r, &req) {
		return
	}
	if req.TinkerPath == nil {
		writeHTTPError(w, unprocessable("field \"tinker_path\" is required"))
		return
	}
	for _, run := range s.runs {
		for _, c := range run.checkpoints {
			if c.TinkerPath == *req.TinkerPath {
				writeJSON(w, http.StatusOK, map[string]any{"base_model": run.BaseModel, "is_lora": run.IsLora,
					"lora_rank": run.LoraRank, "train_unembed": true, "train_mlp": true, "train_attn": true})
				return
			}
		}
	}
	writeJSONError(w, http.StatusNotFound, "checkpoint not found: "+*req.TinkerPath)
}

// delay waits d before a reply, or less if the request ends or the server closes.
func (s *Server) delay(r *http.Request, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
	case <-s.closed:
	}
}
