package backoff

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Queue states of a sampler, as reported by retrieve_future (§4.3).
const (
	QueueActive          = "active"
	QueuePausedRateLimit = "paused_rate_limit"
	QueuePausedCapacity  = "paused_capacity"
	QueueUnknown         = "unknown"
)

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

// ObserverConfig configures a QueueStateObserver. All fields are optional.
type ObserverConfig struct {
	// Gauge, if set, must have exactly one label (the state); its value per
	// state is the number of samplers whose last observed state it is.
	Gauge *prometheus.GaugeVec
	// OnGauge, if set, is called with the same numbers whenever they change.
	OnGauge func(state string, samplers int)
}

// QueueStateObserver is the §4.3 observer shared by the samplers of a
// worker: it keeps a per-state count of samplers. It neither logs (the Tinker
// client logs paused samplers, as the SDK does) nor signals a backoff; the
// caller decides (see PausedBackoff).
type QueueStateObserver struct {
	cfg ObserverConfig

	mu       sync.Mutex
	samplers map[string]string // the last state of each sampler
	counts   map[string]int
}

// NewQueueStateObserver returns an observer.
func NewQueueStateObserver(cfg ObserverConfig) *QueueStateObserver {
	return &QueueStateObserver{cfg: cfg, samplers: map[string]string{}, counts: map[string]int{}}
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
	o.mu.Lock()
	defer o.mu.Unlock()
	if old, seen := o.samplers[samplerID]; old != state {
		var changed []string
		if seen {
			o.counts[old]--
			changed = append(changed, old)
		}
		o.counts[state]++
		o.samplers[samplerID] = state
		o.publish(append(changed, state))
	}
	return state != QueueActive
}

// Forget drops a sampler (its session ended) from the counts.
func (o *QueueStateObserver) Forget(samplerID string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	state, seen := o.samplers[samplerID]
	if !seen {
		return
	}
	delete(o.samplers, samplerID)
	o.counts[state]--
	o.publish([]string{state})
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
