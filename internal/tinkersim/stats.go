package tinkersim

import (
	"maps"
	"time"
)

// Stats is what the server saw since it started or was last reset.
type Stats struct {
	// Requests counts replies by endpoint name and HTTP status, e.g. Requests["asample"][429];
	// status 0 counts the requests dropped without a reply (FaultDrop).
	Requests map[string]map[int]int64 `json:"requests"`
	// SamplesAccepted counts asample calls that created a new future.
	SamplesAccepted int64 `json:"samples_accepted"`
	// IdempotentReplays counts asample calls answered with an existing future (same
	// sampling_session_id and seq_id, §8).
	IdempotentReplays int64 `json:"idempotent_replays"`
	// SessionsExpired counts sessions forgotten because they went Config.SessionTimeout
	// without a heartbeat (§3.4).
	SessionsExpired int64 `json:"sessions_expired"`
	// SamplesCompleted counts futures that completed successfully.
	SamplesCompleted int64 `json:"samples_completed"`
	// SamplesFailed counts futures that completed as failed (injected or context overflow).
	SamplesFailed int64 `json:"samples_failed"`
	// CapacityRejections counts asample calls answered 429 because the backend was full.
	CapacityRejections int64 `json:"capacity_rejections"`
	// HTTP2Requests counts requests that came over HTTP/2 (ListenTLS, §1.4).
	HTTP2Requests int64 `json:"http2_requests"`
	// Connections counts the TCP connections its listeners accepted. A client that keeps its
	// connections open (as the reference client does, §1.4) opens about as many as it has
	// requests in flight at once; one that does not opens one per request.
	Connections int64 `json:"connections"`
	// TokensMinted counts JWTs minted by auth/token (§3.2).
	TokensMinted int64 `json:"tokens_minted"`
	// JWTRejections counts API requests answered 401 because, with Config.JWTAuth, X-API-Key
	// did not hold a valid, unexpired JWT of this server (a plain API key included, §2.2).
	JWTRejections int64 `json:"jwt_rejections"`
	// Concurrent is the number of samples holding a capacity slot now.
	Concurrent int `json:"concurrent"`
	// Queued is the number of accepted samples waiting for a slot (no backpressure header).
	Queued int `json:"queued"`
	// PollsHeld is the number of retrieve_future calls long-polling now.
	PollsHeld int64 `json:"polls_held"`
	// PeakConcurrent is the largest Concurrent seen.
	PeakConcurrent int `json:"peak_concurrent"`
	// Windows lists every injected 429, 402, 401 and pause window with the asample calls that
	// arrived inside it, in injection order.
	Windows []WindowStats `json:"windows"`
}

// WindowStats is one injected window and the asample calls seen inside it.
type WindowStats struct {
	// FaultID is the injected fault.
	FaultID FaultID `json:"fault_id"`
	// Kind is the fault kind (429, 402, 401, paused_capacity, paused_rate_limit).
	Kind FaultKind `json:"kind"`
	// Start is when the window opened.
	Start time.Time `json:"start"`
	// End is when it closed or will close; zero while open-ended. Removing the fault closes it.
	End time.Time `json:"end"`
	// AsampleCalls counts authenticated asample calls that arrived inside the window,
	// whatever their answer.
	AsampleCalls int64 `json:"asample_calls"`
}

// windowStat is the mutable form of WindowStats.
type windowStat struct {
	WindowStats
}

// stats is the mutable state behind Stats, guarded by Server.mu.
type stats struct {
	requests           map[string]map[int]int64
	accepted           int64
	replays            int64
	sessionsExpired    int64
	completed          int64
	failed             int64
	capacityRejections int64
	tokensMinted       int64
	jwtRejections      int64
	http2              int64
	connections        int64
	peak               int
	windows            []*windowStat
}

func newStats() stats { return stats{requests: map[string]map[int]int64{}} }

func (st *stats) record(endpoint string, status int) {
	m := st.requests[endpoint]
	if m == nil {
		m = map[int]int64{}
		st.requests[endpoint] = m
	}
	m[status]++
}

// Stats returns a snapshot of what the server saw.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Stats{
		Requests:           make(map[string]map[int]int64, len(s.st.requests)),
		SamplesAccepted:    s.st.accepted,
		IdempotentReplays:  s.st.replays,
		SessionsExpired:    s.st.sessionsExpired,
		SamplesCompleted:   s.st.completed,
		SamplesFailed:      s.st.failed,
		CapacityRejections: s.st.capacityRejections,
		TokensMinted:       s.st.tokensMinted,
		HTTP2Requests:      s.st.http2,
		Connections:        s.st.connections,
		JWTRejections:      s.st.jwtRejections,
		Concurrent:         s.running,
		Queued:             len(s.queue),
		PollsHeld:          s.pollsHeld.Load(),
		PeakConcurrent:     s.st.peak,
		Windows:            make([]WindowStats, 0, len(s.st.windows)),
	}
	for ep, m := range s.st.requests {
		out.Requests[ep] = maps.Clone(m)
	}
	for _, w := range s.st.windows {
		out.Windows = append(out.Windows, w.WindowStats)
	}
	return out
}
