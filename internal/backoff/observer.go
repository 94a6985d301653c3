package backoff

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Queue states of a sampler, as reported by retrieve_future (§4.3).
const (
	QueueActive          = "active"
	QueuePausedRateLimit = "paused_rate_limit"
	QueuePausedCapacity  = "paused_capacity"
	QueueUnknown         = "unknown"
)

// DefaultLogInterval is the minimum time between two log lines for one
// sampler (§4.3).
const DefaultLogInterval = 60 * time.Second

// NormalizeQueueState maps a server queue_state onto the four §4.3 values
// (anything unrecognised is "unknown").
func NormalizeQueueState(state string) string {
	switch state {
	case QueueActive, QueuePausedRateLimit, QueuePausedCapacity:
		return state
	default:
		return QueueUnknown
	}
}

// Paused reports whether a queue state is a paused one (anything but active).
func Paused(state string) bool { return NormalizeQueueState(state) != QueueActive }

// DefaultReason is the §4.3 text logged when the server gives no reason.
func DefaultReason(state string) string {
	switch NormalizeQueueState(state) {
	case QueuePausedRateLimit:
		return "concurrent sampler weights limit hit"
	case QueuePausedCapacity:
		return "Tinker backend is running short on capacity, please wait"
	default:
		return "unknown"
	}
}

// ObserverConfig configures a QueueStateObserver. All fields are optional.
type ObserverConfig struct {
	// Logger receives the warnings (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock for the debounce (default time.Now).
	Now func() time.Time
	// Interval is the minimum time between two log lines per sampler
	// (default 60 s).
	Interval time.Duration
	// Gauge, if set, must have exactly one label (the state); its value per
	// state is the number of samplers whose last observed state it is.
	Gauge *prometheus.GaugeVec
	// OnGauge, if set, is called with the same numbers whenever they change.
	OnGauge func(state string, samplers int)
}

// QueueStateObserver is the §4.3 observer shared by the samplers of a
// worker: it logs a paused sampler at most once per Interval (the first
// paused observation always logs) with the server's reason or the default
// text, and keeps a per-state count of samplers. It does not signal a
// backoff; the caller decides (see PausedBackoff).
type QueueStateObserver struct {
	cfg ObserverConfig

	mu       sync.Mutex
	samplers map[string]*samplerState
	counts   map[string]int
}

type samplerState struct {
	state   string
	lastLog time.Time
	logged  bool
}

// NewQueueStateObserver returns an observer.
func NewQueueStateObserver(cfg ObserverConfig) *QueueStateObserver {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultLogInterval
	}
	return &QueueStateObserver{cfg: cfg, samplers: map[string]*samplerState{}, counts: map[string]int{}}
}

// Observe records the queue state of a sampler seen while polling (a 200
// try_again or a 408 body, §4.2). An empty state with no reason is ignored
// (§4.2 notifies only when a state or reason is given). It reports whether
// the state is a paused one.
func (o *QueueStateObserver) Observe(samplerID, state, reason string) (paused bool) {
	if state == "" && reason == "" {
		return false
	}
	state = NormalizeQueueState(state)
	now := o.cfg.Now()
	o.mu.Lock()
	s := o.samplers[samplerID]
	if s == nil {
		s = &samplerState{}
		o.samplers[samplerID] = s
	}
	var changed []string
	if s.state != state {
		if s.state != "" {
			o.counts[s.state]--
			changed = append(changed, s.state)
		}
		o.counts[state]++
		changed = append(changed, state)
		s.state = state
	}
	logIt := false
	if state != QueueActive && (!s.logged || now.Sub(s.lastLog) >= o.cfg.Interval) {
		s.logged, s.lastLog, logIt = true, now, true
	}
	o.publish(changed)
	o.mu.Unlock()
	if logIt {
		if reason == "" {
			reason = DefaultReason(state)
		}
		o.cfg.Logger.Warn("Sampling is paused for sampler "+samplerID+". Reason: "+reason,
			"sampler", samplerID, "queue_state", state)
	}
	return state != QueueActive
}

// Forget drops a sampler (its session ended) from the counts.
func (o *QueueStateObserver) Forget(samplerID string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.samplers[samplerID]
	if s == nil {
		return
	}
	delete(o.samplers, samplerID)
	o.counts[s.state]--
	o.publish([]string{s.state})
}

// Count returns the number of samplers whose last observed state is state.
func (o *QueueStateObserver) Count(state string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[NormalizeQueueState(state)]
}

// publish pushes changed counts to the gauge and callback. Caller holds mu,
// which keeps gauge updates in order.
func (o *QueueStateObserver) publish(states []string) {
	for _, st := range states {
		n := o.counts[st]
		if o.cfg.Gauge != nil {
			o.cfg.Gauge.WithLabelValues(st).Set(float64(n))
		}
		if o.cfg.OnGauge != nil {
			o.cfg.OnGauge(st, n)
		}
	}
}
