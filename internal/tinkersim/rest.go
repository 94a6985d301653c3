package tinkersim

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// checkpoint is a Checkpoint of §3.14.
type checkpoint struct {
	CheckpointID   string  `json:"checkpoint_id"`
	CheckpointType string  `json:"checkpoint_type"`
	Time           string  `json:"time"`
	TinkerPath     string  `json:"tinker_path"`
	SizeBytes      int64   `json:"size_bytes"`
	Public         bool    `json:"public"`
	ExpiresAt      *string `json:"expires_at"`
}

// trainingRun is a TrainingRun of §3.14, with its checkpoints kept aside.
type trainingRun struct {
	TrainingRunID         string            `json:"training_run_id"`
	BaseModel             string            `json:"base_model"`
	ModelOwner            string            `json:"model_owner"`
	IsLora                bool              `json:"is_lora"`
	Corrupted             bool              `json:"corrupted"`
	LoraRank              int               `json:"lora_rank"`
	LastRequestTime       string            `json:"last_request_time"`
	LastCheckpoint        *checkpoint       `json:"last_checkpoint"`
	LastSamplerCheckpoint *checkpoint       `json:"last_sampler_checkpoint"`
	UserMetadata          map[string]string `json:"user_metadata"`
	checkpoints           []checkpoint
	sessionID             string
}

// cursor is the paging cursor of §3.14.
type cursor struct {
	Offset     int `json:"offset"`
	Limit      int `json:"limit"`
	TotalCount int `json:"total_count"`
}

// syntheticRuns builds Config.TrainingRuns deterministic training runs, each with a training
// and a sampler checkpoint (tinker://<run>/weights/step-N and .../sampler_weights/step-N).
func syntheticRuns(c Config) []trainingRun {
	rng := rand.New(rand.NewPCG(uint64(c.Seed), 0x7275))
	base := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	var runs []trainingRun
	for i := 0; i < c.TrainingRuns; i++ {
		a, b := rng.Uint64(), rng.Uint64()
		sess := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", uint32(a>>32), uint16(a>>16), uint16(a)&0xfff, uint16(b>>48)&0xfff, b&0xffffffffffff)
		id := sess + ":train:0"
		at := base.Add(time.Duration(i) * time.Hour).Format(time.RFC3339)
		step := 100 * (i + 1)
		ckW := checkpoint{CheckpointID: fmt.Sprintf("weights/step-%d", step), CheckpointType: "training", Time: at,
			TinkerPath: fmt.Sprintf("tinker://%s/weights/step-%d", id, step), SizeBytes: 285212672}
		ckS := checkpoint{CheckpointID: fmt.Sprintf("sampler_weights/step-%d", step), CheckpointType: "sampler", Time: at,
			TinkerPath: fmt.Sprintf("tinker://%s/sampler_weights/step-%d", id, step), SizeBytes: 142606336}
		runs = append(runs, trainingRun{
			TrainingRunID: id, BaseModel: c.Models[i%len(c.Models)].Name, ModelOwner: "sim-user", IsLora: true,
			LoraRank: 32, LastRequestTime: at, LastCheckpoint: &ckW, LastSamplerCheckpoint: &ckS,
			UserMetadata: map[string]string{"simulated": "true"}, checkpoints: []checkpoint{ckW, ckS}, sessionID: sess,
		})
	}
	return runs
}

// runForPath finds the synthetic run a tinker:// path points into.
func (s *Server) runForPath(path string) (trainingRun, bool) {
	rest := strings.TrimPrefix(path, "tinker://")
	runID, _, _ := strings.Cut(rest, "/")
	for _, run := range s.runs {
		if run.TrainingRunID == runID {
			return run, true
		}
	}
	return trainingRun{}, false
}

// paging reads offset/limit (and rejects unknown query parameters, like the strict service).
func paging(q url.Values, defLimit int, allowed ...string) (offset, limit int, e *httpError) {
	allowed = append(allowed, "offset", "limit")
	for k := range q {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok {
			return 0, 0, unprocessable("unknown query parameter %q", k)
		}
	}
	if s := q.Get("access_scope"); s != "" && s != "owned" && s != "accessible" {
		return 0, 0, unprocessable("query parameter \"access_scope\" must be owned or accessible")
	}
	read := func(name string, def, lo, hi int) (int, *httpError) {
		v := q.Get(name)
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return 0, unprocessable("query parameter %q must be an integer in [%d, %d]", name, lo, hi)
		}
		return n, nil
	}
	if offset, e = read("offset", 0, 0, 1<<30); e != nil {
		return 0, 0, e
	}
	if limit, e = read("limit", defLimit, 1, 1000); e != nil {
		return 0, 0, e
	}
	return offset, limit, nil
}

func page[T any](all []T, offset, limit int) []T {
	if offset >= len(all) {
		return []T{}
	}
	return all[offset:min(len(all), offset+limit)]
}

// handleREST implements the read-only listing endpoints of §3.14 with offset/limit paging.
func (s *Server) handleREST(w http.ResponseWriter, r *http.Request, rest string) {
	if !requireMethod(w, r, http.MethodGet) {
		return
	}
	q := r.URL.Query()
	parts := strings.Split(rest, "/")
	switch {
	case rest == epCheckpoints:
		offset, limit, e := paging(q, 100)
		if e != nil {
			writeHTTPError(w, e)
			return
		}
		var all []checkpoint
		for _, run := range s.runs {
			all = append(all, run.checkpoints...)
		}
		writeJSON(w, http.StatusOK, map[string]any{"checkpoints": page(all, offset, limit),
			"cursor": cursor{Offset: offset, Limit: limit, TotalCount: len(all)}})
	case rest == epTrainingRuns:
		offset, limit, e := paging(q, 20, "access_scope", "project_id")
		if e != nil {
			writeHTTPError(w, e)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"training_runs": page(s.runs, offset, limit),
			"cursor": cursor{Offset: offset, Limit: limit, TotalCount: len(s.runs)}})
	case parts[0] == epTrainingRuns && (len(parts) == 2 || len(parts) == 3 && parts[2] == epCheckpoints):
		if _, _, e := paging(q, 20, "access_scope"); e != nil {
			writeHTTPError(w, e)
			return
		}
		run, ok := s.runForPath("tinker://" + parts[1])
		if !ok {
			writeJSONError(w, http.StatusNotFound, "training run not found: "+parts[1])
			return
		}
		if len(parts) == 2 {
			writeJSON(w, http.StatusOK, run)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"checkpoints": run.checkpoints, "cursor": nil})
	case rest == epSessions:
		offset, limit, e := paging(q, 20, "access_scope")
		if e != nil {
			writeHTTPError(w, e)
			return
		}
		s.mu.Lock()
		s.expireSessionsLocked(time.Now())
		ids := make([]string, 0, len(s.sessions))
		for id := range s.sessions {
			ids = append(ids, id)
		}
		s.mu.Unlock()
		slices.Sort(ids)
		writeJSON(w, http.StatusOK, map[string]any{"sessions": page(ids, offset, limit)})
	case parts[0] == epSessions && len(parts) == 2:
		s.mu.Lock()
		sess := s.sessionLocked(parts[1], time.Now())
		var samplers []string
		if sess != nil {
			samplers = append([]string{}, sess.samplerIDs...)
		}
		s.mu.Unlock()
		if sess == nil {
			writeJSONError(w, http.StatusNotFound, "session not found: "+parts[1])
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"training_run_ids": []string{}, "sampler_ids": samplers})
	default:
		writeJSONError(w, http.StatusNotFound, "no such endpoint: /api/v1/"+rest)
	}
}
