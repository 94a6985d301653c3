package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestNumDeliveredCountsRedeliveries fetches one job three times from a real server, nak'ing
// it in between, and checks the count against the full metadata parse each time.
func TestNumDeliveredCountsRedeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	publishJob(t, b.q, "b1", "job-1")
	cons, err := b.q.Consumer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for want := uint64(1); want <= 3; want++ {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("delivery %d: %v", want, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := numberFromAckSubject(msg.Reply(), ackDelivered); !ok {
			t.Fatalf("the server's ack subject %q was not read", msg.Reply())
		}
		if got := NumDelivered(msg); got != want || got != meta.NumDelivered {
			t.Fatalf("delivery %d: NumDelivered = %d, metadata says %d", want, got, meta.NumDelivered)
		}
		if got, ok := StreamSeq(msg); !ok || got != meta.Sequence.Stream {
			t.Fatalf("delivery %d: StreamSeq = %d, %v, metadata says %d", want, got, ok, meta.Sequence.Stream)
		}
		if err := msg.Nak(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNumbersFromAckSubject reads both forms of the ack subject and refuses what is neither.
func TestNumbersFromAckSubject(t *testing.T) {
	for _, c := range []struct {
		subject string
		want    uint64 // the delivery count
		ok      bool
	}{
		{"$JS.ACK.JOBS.workers.3.41.40.1732368000000000000.12", 3, true},
		{"$JS.ACK._.AbCdEf.JOBS.workers.7.41.40.1732368000000000000.12", 7, true},
		{"$JS.ACK.hub.AbCdEf.JOBS.workers.12.41.40.1732368000000000000.12.Xy9", 12, true},
		{"$JS.ACK.JOBS.workers.3.41.40.1732368000000000000", 0, false},     // 8 tokens
		{"$JS.ACK.x.y.JOBS.workers.3.41.40.1732368000000000000", 0, false}, // 10 tokens
		{"$JS.ACK.JOBS.workers.x.41.40.1732368000000000000.12", 0, false},  // not a number
		{"$JS.ACK.JOBS.workers.0.41.40.1732368000000000000.12", 0, false},  // never delivered
		{"_INBOX.abc.def.1.2.3.4.5.6", 0, false},                           // not an ack subject
		{"", 0, false},
	} {
		got, ok := numberFromAckSubject(c.subject, ackDelivered)
		if got != c.want || ok != c.ok {
			t.Errorf("delivered of %q = %d, %v; want %d, %v", c.subject, got, ok, c.want, c.ok)
		}
		// Every readable subject above has stream sequence 41.
		if seq, ok := numberFromAckSubject(c.subject, ackStreamSeq); c.ok && (seq != 41 || !ok) {
			t.Errorf("stream sequence of %q = %d, %v; want 41", c.subject, seq, ok)
		}
	}
}
