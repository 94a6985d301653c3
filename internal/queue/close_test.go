package queue_test

import (
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestJobPullerCloseLeavesNoJobToNobody: a job that the server sends to a request Pull gave
// up on as the puller closes is handed back, not sent to an inbox nobody reads, where it
// would wait out AckWait. (internal/cluster repeats this with the consumer's leader on
// another node.)
func TestJobPullerCloseLeavesNoJobToNobody(t *testing.T) {
	t.Parallel()
	q := fleettest.Queue(t, fleettest.NATS(t).ClientURL(), queue.Config{}) // AckWait 30 s
	fleettest.ClosePullersAsJobsCome(t, q, q, 20)
}
