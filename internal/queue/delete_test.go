package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestDeletingABatchMakesRoomInAFullStore: a server whose store is full refuses every write,
// a batch's deleted mark among them; deleting a finished batch, the way to make room, still
// removes its results, marks it deleted and leaves room for others. StoreFull tells that
// refusal from a store that does not answer.
func TestDeletingABatchMakesRoomInAFullStore(t *testing.T) {
	t.Parallel()
	b := smallStore(t, 256<<10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.q.PutManifest(ctx, Manifest{BatchID: "old", Status: BatchSubmitted, Jobs: 1000, CreatedAt: time.Now()}, 0); err != nil {
		t.Fatal(err)
	}
	result := make([]byte, 1024)
	var refused error
	for i := 0; refused == nil; i++ {
		if i == 1000 {
			t.Fatal("1,000 results of 1 KiB went into a store of 256 KiB")
		}
		_, refused = b.q.JS.Publish(ctx, b.q.Names.ResultSubject("old", fmt.Sprint(i)), result)
	}
	if !StoreFull(refused) {
		t.Fatalf("StoreFull(%v) = false for a full store", refused)
	}
	for _, err := range []error{nats.ErrNoResponders, errNoAck, jetstream.ErrNoStreamResponse, errors.New("other")} {
		if StoreFull(err) {
			t.Errorf("StoreFull(%v) = true", err)
		}
	}

	if err := b.q.DeleteBatch(ctx, "old"); err != nil {
		t.Fatalf("delete a batch to make room: %v", err)
	}
	if m, _, err := b.q.GetManifest(ctx, "old"); err != nil || m.Status != BatchDeleted {
		t.Errorf("manifest after the delete: %+v, %v", m, err)
	}
	if n, err := b.q.ResultsStored(ctx, "old"); err != nil || n != 0 {
		t.Errorf("%d results of the deleted batch left (%v)", n, err)
	}
	if _, err := b.q.JS.Publish(ctx, b.q.Names.ResultSubject("new", "1"), result); err != nil {
		t.Errorf("a result after the delete: %v", err)
	}
}

// smallStore is setup on a server whose JetStream store holds maxStore bytes.
func smallStore(t *testing.T, maxStore int64) *testBundle {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		JetStreamMaxStore: maxStore, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	return setupOn(t, srv.ClientURL(), Config{})
}
