package queue

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestReadingLargeResultsBuffersABoundedNumberOfBytes: a reader that writes results slower
// than the server sends them (a slow disk, a pipe) holds at most readAheadBytes of results it
// has not read, not readAhead results of up to the max payload each (8 GiB on the embedded
// server).
func TestReadingLargeResultsBuffersABoundedNumberOfBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size, results = 1 << 20, 48 // 48 MiB: more than the bound
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rand.Uint32())
	}
	for i := range results {
		if _, err := b.q.JS.Publish(ctx, b.q.Names.ResultSubject("big", strconv.Itoa(i)), data); err != nil {
			t.Fatal(err)
		}
	}
	reader := connect(t, b.emb.ClientURL(), "reader")
	q := *b.q
	q.JS = reader
	it, err := q.ReadResults(ctx, "big", false)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Stop()
	if _, err := it.Next(jetstream.NextMaxWait(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the read-ahead comes in meanwhile
	if in := reader.Conn().Stats().InBytes; in > readAheadBytes+2*size {
		t.Fatalf("the reader took in %d MiB having read 1 result of 1 MiB; want at most %d MiB", in>>20, (readAheadBytes+2*size)>>20)
	}
	for i := 1; i < results; i++ { // and the rest come as they are read
		if _, err := it.Next(jetstream.NextMaxWait(10 * time.Second)); err != nil {
			t.Fatalf("result %d: %v", i+1, err)
		}
	}
}
