package cluster

import (
	"context"
	"testing"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// TestAClosingPullerOnAnotherNodeLeavesNoJobToNobody: a worker's puller connected to a node
// other than the jobs consumer's leader closes just as a job comes for the request it gave
// up on. The leader may send the job before the puller's unsubscribe reaches it over the
// route, to a node where the puller's inbox is gone; Close waits for such a job, and hands
// it back, rather than leave it to wait out AckWait.
func TestAClosingPullerOnAnotherNodeLeavesNoJobToNobody(t *testing.T) {
	t.Parallel()
	c := fleettest.StartCluster(t, 3)
	ctx := context.Background()
	admin := c.Connect(t, 0, "admin", queue.Config{Replicas: 3})
	cons, err := admin.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.Index(info.Cluster.Leader)
	q := c.Connect(t, (leader+1)%c.Len(), "puller", queue.Config{Replicas: 3})
	fleettest.ClosePullersAsJobsCome(t, q, admin, 20)
}
