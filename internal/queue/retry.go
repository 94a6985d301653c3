package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
)

// RetryNote says why a worker last gave a job of a batch back for a later delivery. Workers
// keep the latest note of each batch in the backoff bucket, so that submit can tell a user
// who waits on the batch what the workers' logs, on other machines, say: a job that fails
// this way is tried again for up to --max-deliver deliveries, some twenty minutes with the
// defaults.
type RetryNote struct {
	CustomID   string `json:"custom_id"`
	Delivery   uint64 `json:"delivery"`    // the delivery that failed
	MaxDeliver int    `json:"max_deliver"` // its last delivery, which ends it as a dead letter
	RetryInMS  int64  `json:"retry_in_ms"` // how long the job waits for its next delivery
	Error      string `json:"error"`
	// At is when the note was stored, in the NATS server's clock (set by LastRetry).
	At time.Time `json:"-"`
}

// RetryIn is how long the job waited, from At, for its next delivery.
func (n RetryNote) RetryIn() time.Duration { return time.Duration(n.RetryInMS) * time.Millisecond }

// maxRetryError bounds a note's error text, in bytes.
const maxRetryError = 1024

// retryNoteKey is the key of batch's retry note in the backoff bucket: two tokens, apart
// from the accounts' keys (one token) and their capacity reports (three).
func retryNoteKey(batch string) string { return "retry." + batch }

// NoteRetry stores n as batch's latest retry note. It does not wait for the server, nor
// learn whether it stored the note (a publish to the bucket's subject): a note is a hint,
// and the job it is about is settled without waiting. Without the bucket (a fleet that
// backs off per process), nothing is stored.
func (q *Queue) NoteRetry(batch string, n RetryNote) error {
	if len(n.Error) > maxRetryError {
		cut := maxRetryError
		for cut > 0 && !utf8.RuneStart(n.Error[cut]) {
			cut--
		}
		n.Error = n.Error[:cut] + "…"
	}
	data, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("retry note of batch %s: %w", batch, err)
	}
	if err := q.JS.Conn().Publish("$KV."+q.Names.BackoffBucket()+"."+retryNoteKey(batch), data); err != nil {
		return fmt.Errorf("retry note of batch %s: %w", batch, err)
	}
	return nil
}

// LastRetry reads batch's latest retry note; ok is false when it has none.
func (q *Queue) LastRetry(ctx context.Context, batch string) (n RetryNote, ok bool, err error) {
	kv, err := q.JS.KeyValue(ctx, q.Names.BackoffBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return n, false, nil
	}
	if err != nil {
		return n, false, fmt.Errorf("retry note of batch %s: %w", batch, err)
	}
	e, err := kv.Get(ctx, retryNoteKey(batch))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return n, false, nil
	}
	if err != nil {
		return n, false, fmt.Errorf("retry note of batch %s: %w", batch, err)
	}
	if err := json.Unmarshal(e.Value(), &n); err != nil {
		return n, false, fmt.Errorf("retry note of batch %s: %w", batch, err)
	}
	n.At = e.Created()
	return n, true, nil
}

// forgetRetries removes batch's retry note, if it has one.
func (q *Queue) forgetRetries(ctx context.Context, batch string) error {
	kv, err := q.JS.KeyValue(ctx, q.Names.BackoffBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err == nil {
		if _, err = kv.Get(ctx, retryNoteKey(batch)); err == nil {
			err = kv.Purge(ctx, retryNoteKey(batch))
		} else if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil // most batches have none: leave no marker
		}
	}
	if err != nil {
		return fmt.Errorf("retry note of batch %s: %w", batch, err)
	}
	return nil
}
