package queue

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
)

// TestRetryNotesKeepTheLatestPerBatchUntilItIsDeleted: the latest note of a batch is the one
// read, with the server's time of storing it, beside the fleet's service note; a long error is
// cut on a character boundary; a deleted batch's note goes with it, and other batches keep
// theirs.
func TestRetryNotesKeepTheLatestPerBatchUntilItIsDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if n, err := b.q.ReadNotes(ctx, "b-1"); n.Retry != nil || n.Service != nil || err != nil {
		t.Fatalf("without the backoff bucket: %+v, err %v; want none", n, err)
	}
	// The bucket is the fleet's backoff bucket, which the workers' internal/backoff creates.
	if _, err := b.q.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.q.Names.BackoffBucket()}); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	long := strings.Repeat("é", maxNoteError) // two bytes each
	notes := []struct {
		batch string
		note  RetryNote
	}{
		{"b-1", RetryNote{CustomID: "q-1", Delivery: 1, MaxDeliver: 10, RetryInMS: 5000, Error: "first"}},
		{"b-2", RetryNote{CustomID: "q-9", Delivery: 2, MaxDeliver: 10, RetryInMS: 10000, Error: "other batch"}},
		{"b-1", RetryNote{CustomID: "q-2", Delivery: 3, MaxDeliver: 10, RetryInMS: 20000, Error: "x" + long}},
	}
	for _, n := range notes {
		if err := b.q.NoteRetry(n.batch, n.note); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.q.NoteServiceRetry(ServiceNote{Endpoint: "asample", Status: 503, RetryInMS: 1000, Error: "unavailable"}); err != nil {
		t.Fatal(err)
	}
	if err := b.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var got RetryNote
	var service *ServiceNote
	for deadline := time.Now().Add(10 * time.Second); got.CustomID != "q-2" || service == nil; time.Sleep(10 * time.Millisecond) {
		n, err := b.q.ReadNotes(ctx, "b-1")
		if err != nil {
			t.Fatal(err)
		}
		if n.Retry != nil {
			got = *n.Retry
		}
		service = n.Service
		if time.Now().After(deadline) {
			t.Fatalf("the latest note of b-1 and the service note never came: %+v, %+v", got, service)
		}
	}
	if service.Endpoint != "asample" || service.Status != 503 || service.RetryIn() != time.Second || service.Error != "unavailable" || service.At.IsZero() {
		t.Errorf("service note = %+v", service)
	}
	if got.Delivery != 3 || got.MaxDeliver != 10 || got.RetryIn() != 20*time.Second {
		t.Errorf("note = %+v", got)
	}
	if got.At.Before(before.Add(-time.Minute)) || got.At.After(time.Now().Add(time.Minute)) {
		t.Errorf("stored at %v, want about now", got.At)
	}
	if !utf8.ValidString(got.Error) || len(got.Error) > maxNoteError+len("…") || !strings.HasPrefix(got.Error, "xé") || !strings.HasSuffix(got.Error, "é…") {
		t.Errorf("a long error is kept as %d bytes: %.20q…", len(got.Error), got.Error)
	}

	if _, err := b.q.PutManifest(ctx, Manifest{BatchID: "b-1", Status: BatchSubmitted, Jobs: 2}, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.q.DeleteBatch(ctx, "b-1"); err != nil {
		t.Fatal(err)
	}
	if n, err := b.q.ReadNotes(ctx, "b-1"); n.Retry != nil || err != nil {
		t.Errorf("after the delete: %+v, err %v; want none", n.Retry, err)
	}
	if n, err := b.q.ReadNotes(ctx, "b-2"); n.Retry == nil || err != nil || n.Retry.Error != "other batch" {
		t.Errorf("another batch's note after the delete: %+v, err %v", n.Retry, err)
	}
}

// TestForgetKeyRefusalRemovesOnlyARefusedKeysNote: a worker whose key was accepted removes
// the note that a refused key stopped a worker, and no other note; without the bucket there
// is nothing to do.
func TestForgetKeyRefusalRemovesOnlyARefusedKeysNote(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.q.ForgetKeyRefusal(ctx); err != nil {
		t.Fatalf("without the backoff bucket: %v", err)
	}
	kv, err := b.q.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.q.Names.BackoffBucket()})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.q.ForgetKeyRefusal(ctx); err != nil {
		t.Fatalf("without a note: %v", err)
	}
	// note stores n and waits until it is stored (a put on the same connection comes after it).
	note := func(n ServiceNote) {
		t.Helper()
		if err := b.q.NoteServiceRetry(n); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "test-sync", nil); err != nil {
			t.Fatal(err)
		}
	}
	service := func() *ServiceNote {
		t.Helper()
		n, err := b.q.ReadNotes(ctx, "b-1")
		if err != nil {
			t.Fatal(err)
		}
		return n.Service
	}
	note(ServiceNote{Endpoint: "asample", Status: 503, RetryInMS: 1000, Error: "unavailable"})
	if err := b.q.ForgetKeyRefusal(ctx); err != nil {
		t.Fatal(err)
	}
	if n := service(); n == nil || n.Status != 503 {
		t.Fatalf("a 5xx note after ForgetKeyRefusal: %+v; want it kept", n)
	}
	note(ServiceNote{Endpoint: "client/config", Status: 401, Error: "refused", Stopped: true})
	if n := service(); n == nil || !n.Stopped {
		t.Fatalf("the refusal was not stored: %+v", n)
	}
	if err := b.q.ForgetKeyRefusal(ctx); err != nil {
		t.Fatal(err)
	}
	if n := service(); n != nil {
		t.Fatalf("a refused key's note after ForgetKeyRefusal: %+v; want none", n)
	}
}
