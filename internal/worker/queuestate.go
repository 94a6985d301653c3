package worker

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// samplerStates keeps the queue state (§4.3) of each of the worker's samplers, for the
// tinkerfleet_sampler_queue_state gauge: how many samplers are in each state.
//
// The service reports a state only on a poll it answers without a result, so a sampler
// reported paused would stay so until a long poll of it expired. A sample it completes says
// its queue runs again: the worker counts it active then (sampled). A sampler the service
// no longer knows leaves the count (forget).
type samplerStates struct {
	gauge    *prometheus.GaugeVec // nil without metrics
	inactive atomic.Int64         // samplers counted in a state other than active: sampled's fast path

	mu     sync.Mutex
	last   map[string]tinker.QueueState // by sampler id
	counts map[tinker.QueueState]int
}

// observe records the state a poll of sampler id reported.
func (s *samplerStates) observe(id string, q tinker.QueueState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, seen := s.last[id]
	if seen && old == q {
		return
	}
	if s.last == nil {
		s.last, s.counts = make(map[string]tinker.QueueState), make(map[tinker.QueueState]int)
	}
	if seen {
		s.move(old, -1)
	}
	s.last[id] = q
	s.move(q, +1)
}

// sampled notes that sampler id completed a sample: its queue is active.
func (s *samplerStates) sampled(id string) {
	if s.inactive.Load() == 0 {
		return // every sampler is active already, as almost always
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, seen := s.last[id]; seen && old != tinker.QueueActive {
		s.move(old, -1)
		s.last[id] = tinker.QueueActive
		s.move(tinker.QueueActive, +1)
	}
}

// forget drops sampler id, which the service no longer knows.
func (s *samplerStates) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, seen := s.last[id]; seen {
		delete(s.last, id)
		s.move(old, -1)
	}
}

// move adds delta samplers to state q. The caller holds mu, which keeps the gauge's updates
// in order.
func (s *samplerStates) move(q tinker.QueueState, delta int) {
	s.counts[q] += delta
	if q != tinker.QueueActive {
		s.inactive.Add(int64(delta))
	}
	if s.gauge != nil {
		s.gauge.WithLabelValues(string(q)).Set(float64(s.counts[q]))
	}
}
