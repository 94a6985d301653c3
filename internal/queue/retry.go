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
	// At is when the note was stored, in the NATS server's clock (set by ReadNotes).
	At time.Time `json:"-"`
}

// RetryIn is how long the job waited, from At, for its next delivery.
func (n RetryNote) RetryIn() time.Duration { return time.Duration(n.RetryInMS) * time.Millisecond }

// ServiceNote says what a worker's Tinker client last retried: a request the service failed
// (5xx) or that did not reach it. The client retries such requests inside a job for minutes
// (the SDK's retry layers, §6 of the wire notes) before the job fails, so without the note a
// user waiting on a batch sees only that its jobs are at the workers. Or, with Stopped, the
// refusal of the worker's key that stopped it (or kept it from starting). The latest note of
// the fleet is kept, whichever worker and account it came from.
type ServiceNote struct {
	Endpoint  string `json:"endpoint"`    // the request retried: asample, retrieve_future, …
	Status    int    `json:"status"`      // its HTTP status; 0: it did not reach the service
	RetryInMS int64  `json:"retry_in_ms"` // how long the client waits before it tries again
	Error     string `json:"error"`
	// Stopped says the worker stopped on it, or could not start: the service refuses its key.
	Stopped bool `json:"stopped,omitempty"`
	// At is when the note was stored, in the NATS server's clock (set by ReadNotes).
	At time.Time `json:"-"`
}

// RetryIn is how long the client waited, from At, to try the request again.
func (n ServiceNote) RetryIn() time.Duration { return time.Duration(n.RetryInMS) * time.Millisecond }

// maxNoteError bounds a note's error text, in bytes.
const maxNoteError = 1024

// retryNoteKey is the key of batch's retry note in the backoff bucket: two tokens, apart
// from the accounts' keys (one token) and their capacity reports (three).
func retryNoteKey(batch string) string { return "retry." + batch }

// serviceNoteKey is the key of the fleet's service note: two tokens, and no batch's, whose
// notes begin with "retry.".
const serviceNoteKey = "service.retry"

// NoteRetry stores n as batch's latest retry note. It does not wait for the server, nor
// learn whether it stored the note (a publish to the bucket's subject): a note is a hint,
// and the job it is about is settled without waiting. Without the bucket (a fleet that
// backs off per process), nothing is stored.
func (q *Queue) NoteRetry(batch string, n RetryNote) error {
	n.Error = clip(n.Error, maxNoteError)
	if err := q.publishNote(retryNoteKey(batch), n); err != nil {
		return fmt.Errorf("retry note of batch %s: %w", batch, err)
	}
	return nil
}

// NoteServiceRetry stores n as the fleet's latest service note, as NoteRetry does.
func (q *Queue) NoteServiceRetry(n ServiceNote) error {
	n.Error = clip(n.Error, maxNoteError)
	if err := q.publishNote(serviceNoteKey, n); err != nil {
		return fmt.Errorf("service note: %w", err)
	}
	return nil
}

// ForgetKeyRefusal removes the fleet's service note if it is a refused key's (Stopped): a
// worker whose key the service has just accepted shows that the refusal is over, as far as
// the note can tell, so that a reader no longer takes it for why no worker runs. A note
// stored meanwhile, by another worker, is kept. Without the bucket there is nothing to remove.
func (q *Queue) ForgetKeyRefusal(ctx context.Context) error {
	kv, err := q.JS.KeyValue(ctx, q.Names.BackoffBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("service note: %w", err)
	}
	e, err := kv.Get(ctx, serviceNoteKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("service note: %w", err)
	}
	var n ServiceNote
	if json.Unmarshal(e.Value(), &n) != nil || !n.Stopped {
		return nil
	}
	err = kv.Delete(ctx, serviceNoteKey, jetstream.LastRevision(e.Revision()))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil // a newer note came meanwhile: it stands
	}
	if err != nil {
		return fmt.Errorf("service note: %w", err)
	}
	return nil
}

// Notes is what the workers last noted about a batch and about the service; nil: nothing.
type Notes struct {
	Retry   *RetryNote   // why a worker last put off a job of the batch
	Service *ServiceNote // what a worker's Tinker client last retried, for any batch
}

// ReadNotes reads batch's retry note and the fleet's service note. Without the bucket there
// are none.
func (q *Queue) ReadNotes(ctx context.Context, batch string) (Notes, error) {
	var notes Notes
	kv, err := q.JS.KeyValue(ctx, q.Names.BackoffBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return notes, nil
	}
	if err != nil {
		return notes, fmt.Errorf("notes of batch %s: %w", batch, err)
	}
	var retry RetryNote
	if retry.At, err = readNote(ctx, kv, retryNoteKey(batch), &retry); err != nil {
		return notes, fmt.Errorf("retry note of batch %s: %w", batch, err)
	}
	var service ServiceNote
	if service.At, err = readNote(ctx, kv, serviceNoteKey, &service); err != nil {
		return notes, fmt.Errorf("service note: %w", err)
	}
	if !retry.At.IsZero() {
		notes.Retry = &retry
	}
	if !service.At.IsZero() {
		notes.Service = &service
	}
	return notes, nil
}

// clip bounds s to limit bytes, cut at a character's start and marked with an ellipsis.
func clip(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// publishNote publishes v, as JSON, to key's subject in the backoff bucket.
func (q *Queue) publishNote(key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return q.JS.Conn().Publish("$KV."+q.Names.BackoffBucket()+"."+key, data)
}

// readNote reads the note under key into v and says when it was stored: never (the zero
// time) when there is none.
func readNote(ctx context.Context, kv jetstream.KeyValue, key string, v any) (time.Time, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	if err := json.Unmarshal(e.Value(), v); err != nil {
		return time.Time{}, err
	}
	return e.Created(), nil
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
