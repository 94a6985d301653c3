package queue

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestAskHeldGathersTheWorkersThatHoldResults: the workers that hold results answer, with
// what they hold and why; those that hold none keep quiet, and with nobody listening the
// question ends with no answer.
func TestAskHeldGathersTheWorkersThatHoldResults(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx := context.Background()
	// The server's "no responders" ends the question: it does not wait out its minute.
	start := time.Now()
	if got, err := b.q.AskHeld(ctx, time.Minute); err != nil || len(got) != 0 {
		t.Fatalf("nobody listens: %+v, %v", got, err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("with nobody listening the question took %v: it waited for answers", took)
	}

	// Each worker answers on a connection of its own, as in a fleet.
	answer := func(r HeldReport, holds bool) *nats.Subscription {
		t.Helper()
		q := &Queue{JS: connect(t, b.emb.ClientURL(), r.Host), Names: b.q.Names}
		sub, err := q.AnswerHeld(func() (HeldReport, bool) { return r, holds })
		if err != nil {
			t.Fatal(err)
		}
		if err := q.JS.Conn().Flush(); err != nil { // the subscription is known to the server
			t.Fatal(err)
		}
		return sub
	}
	full := answer(HeldReport{Host: "a", Held: 5, For: time.Minute, Full: true, Error: "insufficient resources"}, true)
	answer(HeldReport{Host: "b", Held: 2, For: time.Second, Error: strings.Repeat("x", 10_000)}, true)
	answer(HeldReport{Host: "c"}, false)

	hosts := func() []string {
		t.Helper()
		got, err := b.q.AskHeld(ctx, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var hosts []string
		for _, r := range got {
			hosts = append(hosts, fmt.Sprintf("%s:%d:%v:%v", r.Host, r.Held, r.For, r.Full))
			if len(r.Error) > maxNoteError+len("…") {
				t.Errorf("%s's error is %d bytes; want at most %d", r.Host, len(r.Error), maxNoteError)
			}
		}
		slices.Sort(hosts)
		return hosts
	}
	if got, want := hosts(), []string{"a:5:1m0s:true", "b:2:1s:false"}; !slices.Equal(got, want) {
		t.Errorf("answers %v, want %v", got, want)
	}
	if err := full.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if got, want := hosts(), []string{"b:2:1s:false"}; !slices.Equal(got, want) {
		t.Errorf("answers after a worker stopped answering %v, want %v", got, want)
	}
}
