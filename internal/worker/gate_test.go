package worker

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/dispatch"
	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestTheClientsBackoffReasonsAreTheFleets: Gate.Backoff passes the Tinker client's reason
// to the fleet's backoff as it is, and reads a 429 by it (the capacity learning, the
// metrics, submit's account of a pause); the client spells them apart so that it needs no
// NATS, so they must stay the same words.
func TestTheClientsBackoffReasonsAreTheFleets(t *testing.T) {
	t.Parallel()
	for client, fleet := range map[string]string{
		tinker.BackoffRateLimited: backoff.ReasonRateLimited,
		tinker.BackoffBilling:     backoff.ReasonBilling,
	} {
		if client != fleet {
			t.Errorf("the client's backoff reason %q differs from the fleet's %q", client, fleet)
		}
	}
}

// TestAPanicWhileSubmittingGivesBackTheDispatchPermits: a panic between a sample's dispatch
// permits and the end of its asample (here in the client's event hook, as a metrics bug would
// raise it) is recovered by the worker (work), which ends that one job and goes on. The
// permits must go back with it: kept, each such panic took a count permit, a throttled one
// and a byte charge for good, and ten of them during backoffs left no throttled permit, so
// that every sample after a 429 waited for ever.
func TestAPanicWhileSubmittingGivesBackTheDispatchPermits(t *testing.T) {
	t.Parallel()
	_, url := fleettest.Sim(t, tinkersim.Config{})
	b := backoff.NewLocal(nil)
	l := dispatch.New(dispatch.Config{Throttled: 1, BackoffUntil: b.Until})
	var boom atomic.Bool
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := tinker.Dial(ctx, tinker.Config{
		BaseURL: url, APIKey: fleettest.APIKey, Dispatcher: NewGate(l, b, nil),
		OnEvent: func(e tinker.Event) {
			if e.Kind == tinker.EventRequest && e.Endpoint == "asample" && boom.CompareAndSwap(true, false) {
				var cells []int
				_ = cells[len(e.Endpoint)] // a runtime error, as a bug would raise
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSampler(ctx, tinker.SamplerSpec{BaseModel: "Qwen/Qwen3-8B"})
	if err != nil {
		t.Fatal(err)
	}
	req := tinker.SampleRequest{Prompt: tinker.EncodedText([]int{1, 2, 3}), NumSamples: 1,
		Params: tinker.SamplingParams{MaxTokens: intp(2)}}
	sample := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panicked: %v", p)
			}
		}()
		_, err = s.Sample(ctx, req)
		return err
	}

	// A 429 a moment ago: the sample takes the one throttled permit and 20 times its bytes.
	if err := b.Signal(ctx, backoff.ReasonRateLimited, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	boom.Store(true)
	if err := sample(); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("sample = %v, want the panic", err)
	}
	if st := l.Stats(); st.CountInUse != 0 || st.ThrottledInUse != 0 || st.BytesCharged != 0 || st.BytesEstimated != 0 {
		t.Fatalf("after the panic the limiter holds %+v, want nothing", st)
	}
	// The backoff is still recent: the next sample needs the throttled permit.
	if err := sample(); err != nil {
		t.Fatalf("the sample after the panic: %v", err)
	}
}
