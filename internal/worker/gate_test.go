package worker

import (
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/tinker"
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
