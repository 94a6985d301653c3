package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/fleettest"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
	"github.com/tinkerfleet/tinkerfleet/internal/tinkersim"
)

// TestSubmitRidesOutTheJobsLeaderStopping: the node that leads the jobs stream of a
// three-node cluster stops while submit publishes, whether submit is connected to it (its
// connection drops, and every job waiting for an ack fails at once) or to another node (the
// jobs sent to the stopped leader are never answered). Submit waits out the election,
// publishes the rest, and follows the results to the end: every line has exactly one
// result, and the stream has stored each job once.
func TestSubmitRidesOutTheJobsLeaderStopping(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node NATS cluster; skipped with -short")
	}
	for _, onLeader := range []bool{true, false} {
		name := map[bool]string{true: "submit on the leader", false: "submit on another node"}[onLeader]
		t.Run(name, func(t *testing.T) { submitThroughFailover(t, onLeader) })
	}
}

func submitThroughFailover(t *testing.T, onLeader bool) {
	const total = 10000
	c := fleettest.StartCluster(t, 3)
	qcfg := queue.Config{Replicas: 3, AckWait: 4 * time.Second}
	f := &fleet{t: t, qcfg: qcfg, tok: builtinTokens()}
	f.sim, f.url = fleettest.Sim(t, tinkersim.Config{Capacity: 512, BaseLatency: 5 * time.Millisecond})
	admin := c.Connect(t, 0, "admin", qcfg) // sets the streams up: their leaders are known now
	for i := range c.Len() {
		f.startWorkerOn(c.Connect(t, i, fmt.Sprintf("worker-%d", i+1), qcfg), 64)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	info, err := admin.Jobs.Info(ctx)
	if err != nil || info.Cluster == nil || c.Index(info.Cluster.Leader) < 0 {
		t.Fatalf("jobs stream leader: %+v, %v", info, err)
	}
	leader := c.Index(info.Cluster.Leader)
	first := leader
	if !onLeader {
		first = (leader + 1) % c.Len()
	}

	lines := jobLines(total)
	in, out := writeLines(t, lines), filepath.Join(t.TempDir(), "results.jsonl")
	var stderr fleettest.Buffer
	env := &environment{getenv: func(string) string { return "" }, stdin: strings.NewReader(""), stdout: &fleettest.Buffer{}, stderr: &stderr, tty: 0}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", c.URLs(first), "--replicas", "3", "--progress", "none", "--store-wait", "60s", in, "-o", out}, env)
	}()

	// Stop the leader as soon as the first job is stored.
	for deadline := time.Now().Add(time.Minute); info.State.LastSeq == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no job published in a minute:\n%s", stderr.String())
		}
		if info, err = admin.Jobs.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if info.State.LastSeq == total {
		t.Fatal("every job was published before the leader could be stopped")
	}
	t.Logf("stopping %s, the jobs stream's leader, with %d of %d jobs published", c.Name(leader), info.State.LastSeq, total)
	c.Stop(leader)

	if err := <-done; err != nil {
		t.Fatalf("submit: %v\n%s", err, stderr.String())
	}
	if got := readResults(t, out); len(got) != total {
		t.Errorf("%d results in the output, want %d", len(got), total)
	}
	// The workers ack each job after its result is stored, without waiting for the server: the
	// last acks may not have reached the stream when submit has read every result.
	fleettest.Eventually(t, 20*time.Second, "every job acked", func() bool {
		info, err = admin.Jobs.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	if info.State.LastSeq != total {
		t.Errorf("jobs stream: last sequence %d; want %d (no job stored twice)", info.State.LastSeq, total)
	}
}
