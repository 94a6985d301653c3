package worker

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
)

// The samplers' states move as polls report them, a completed sample makes its sampler
// active, and a sampler the service forgot leaves the gauge.
func TestSamplerStatesFollowPollsSamplesAndForgottenSamplers(t *testing.T) {
	gauge := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "states"}, []string{"state"})
	s := samplerStates{gauge: gauge}
	want := func(step string, active, capacity, unknown float64) {
		t.Helper()
		for state, n := range map[tinker.QueueState]float64{
			tinker.QueueActive: active, tinker.QueuePausedCapacity: capacity, tinker.QueueUnknown: unknown,
		} {
			var m dto.Metric
			if err := gauge.WithLabelValues(string(state)).Write(&m); err != nil {
				t.Fatal(err)
			}
			if got := m.GetGauge().GetValue(); got != n {
				t.Fatalf("%s: %v samplers %s, want %v", step, got, state, n)
			}
		}
	}
	s.sampled("s1")
	want("a sample of a sampler never reported", 0, 0, 0)
	s.observe("s1", tinker.QueueActive)
	s.observe("s2", tinker.QueuePausedCapacity)
	s.observe("s2", tinker.QueuePausedCapacity)
	s.observe("s3", tinker.QueueUnknown)
	want("reported", 1, 1, 1)
	s.sampled("s2")
	want("s2 sampled", 2, 0, 1)
	s.observe("s2", tinker.QueuePausedCapacity)
	s.forget("s2")
	s.forget("s9")
	want("s2 forgotten", 1, 0, 1)
	s.sampled("s3")
	want("s3 sampled", 2, 0, 0)
	if n := s.inactive.Load(); n != 0 {
		t.Fatalf("%d samplers inactive, want 0", n)
	}
}
