package queue

import (
	"context"
	"testing"
	"time"
)

// TestADeadLetterIsKeptOnceWhileJobIDsAreRemembered: a job's payload is dead-lettered under an
// id of its own (PublishDead), by every worker that hears of the job and by each try again
// of one that failed (every 5 s to a minute, for as long as its result cannot be stored).
// The dead stream remembers those ids for the duplicate window, as the jobs stream does the
// jobs', not for the server's default of 2 minutes, after which each try added a copy.
func TestADeadLetterIsKeptOnceWhileJobIDsAreRemembered(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DuplicateWindow: time.Hour})
	ctx := context.Background()
	for range 2 {
		if err := b.q.PublishDead(ctx, "b1", "x", "max deliveries", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	info, err := b.q.Dead.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("%d dead letters of one job; want 1", info.State.Msgs)
	}
	if got := info.Config.Duplicates; got != time.Hour {
		t.Errorf("dead letters' duplicate window %v; want the jobs' (1h)", got)
	}
	short := setup(t, Config{DuplicateWindow: time.Hour, DeadMaxAge: 10 * time.Minute})
	if got := short.q.Dead.CachedInfo().Config.Duplicates; got != 10*time.Minute {
		t.Errorf("dead letters' duplicate window %v; want their max age (10m)", got)
	}
}
