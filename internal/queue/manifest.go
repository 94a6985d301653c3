package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Batch statuses recorded in a manifest.
const (
	// BatchPublishing: submit is publishing the jobs; counts are not final.
	BatchPublishing = "publishing"
	// BatchSubmitted: every accepted job is in the jobs stream.
	BatchSubmitted = "submitted"
	// BatchCancelled: workers end the batch's remaining jobs as cancelled results.
	BatchCancelled = "cancelled"
	// BatchDeleted: the batch's jobs, results and dead letters are removed (DeleteBatch).
	// The manifest stays, so that the id is not used again while the stream's duplicate
	// window may still drop its job ids, and workers end a job of it without storing a result
	// (its results are purged; nobody could read one stored later).
	BatchDeleted = "deleted"
)

// Manifest is what the batches bucket records about one batch.
type Manifest struct {
	BatchID     string    `json:"batch_id"`
	Status      string    `json:"status"`
	Files       []string  `json:"files"`
	Digest      string    `json:"digest"` // sha256 of the input files, in order
	Jobs        int       `json:"jobs"`   // accepted jobs, each ends with one result
	Rejected    int       `json:"rejected"`
	CreatedAt   time.Time `json:"created_at"`
	SubmittedAt time.Time `json:"submitted_at,omitzero"`
	CancelledAt time.Time `json:"cancelled_at,omitzero"`
	DeletedAt   time.Time `json:"deleted_at,omitzero"`
}

// Ended reports whether the batch's jobs are to be ended without sampling: it is cancelled
// or deleted.
func (m Manifest) Ended() bool { return m.Status == BatchCancelled || m.Status == BatchDeleted }

// ErrNoBatch is returned for a batch id without a manifest.
var ErrNoBatch = errors.New("no such batch")

// GetManifest reads the manifest of batch and its revision.
func (q *Queue) GetManifest(ctx context.Context, batch string) (Manifest, uint64, error) {
	e, err := q.Batches.Get(ctx, batch)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Manifest{}, 0, fmt.Errorf("batch %s: %w", batch, ErrNoBatch)
	}
	if err != nil {
		return Manifest{}, 0, fmt.Errorf("batch %s: read manifest: %w", batch, err)
	}
	var m Manifest
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return Manifest{}, 0, fmt.Errorf("batch %s: decode manifest: %w", batch, err)
	}
	return m, e.Revision(), nil
}

// PutManifest writes m, replacing revision rev (0 creates it and fails if it exists).
func (q *Queue) PutManifest(ctx context.Context, m Manifest, rev uint64) (uint64, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return 0, fmt.Errorf("batch %s: encode manifest: %w", m.BatchID, err)
	}
	if rev == 0 {
		rev, err = q.Batches.Create(ctx, m.BatchID, data)
	} else {
		rev, err = q.Batches.Update(ctx, m.BatchID, data, rev)
	}
	if err != nil {
		return 0, fmt.Errorf("batch %s: write manifest: %w", m.BatchID, err)
	}
	return rev, nil
}

// UpdateManifest applies change to the current manifest of batch with compare-and-swap,
// retrying when another process wrote in between.
func (q *Queue) UpdateManifest(ctx context.Context, batch string, change func(*Manifest) error) (Manifest, error) {
	for {
		m, rev, err := q.GetManifest(ctx, batch)
		if err != nil {
			return Manifest{}, err
		}
		if err := change(&m); err != nil {
			return Manifest{}, err
		}
		_, err = q.PutManifest(ctx, m, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		return m, err
	}
}

// DeleteBatch removes what the server holds of batch, its jobs still queued, its dead letters,
// its results and its retry note, and marks its manifest deleted. The jobs go first: a user who may not purge
// streams (deploy/'s submit user) changes nothing. Then the mark, so that workers ack a job of
// it they took without sampling it (one already sampling finishes), and store no result of
// it: one stored after the purge would stay until the results' max age, with nobody to read
// it. Only a result stored in the moment between the mark and a worker hearing of it can
// outlive the purge; deleting a deleted batch removes again whatever came since.
//
// A batch is often deleted to make room in a server whose store is full, which refuses the
// mark too: then its results and dead letters go before the mark, and once more after it.
func (q *Queue) DeleteBatch(ctx context.Context, batch string) error {
	if err := q.purgeJobs(ctx, batch); err != nil {
		return fmt.Errorf("delete batch %s: remove its jobs: %w", batch, err)
	}
	mark := func(m *Manifest) error {
		if m.Status != BatchDeleted {
			m.Status, m.DeletedAt = BatchDeleted, time.Now().UTC()
		}
		return nil
	}
	_, err := q.UpdateManifest(ctx, batch, mark)
	if StoreFull(err) {
		if err := q.purgeStored(ctx, batch); err != nil {
			return err
		}
		_, err = q.UpdateManifest(ctx, batch, mark)
	}
	if err != nil {
		return fmt.Errorf("delete batch %s: %w", batch, err)
	}
	if err := q.purgeStored(ctx, batch); err != nil {
		return err
	}
	if err := q.forgetRetries(ctx, batch); err != nil {
		return fmt.Errorf("delete batch %s: %w", batch, err)
	}
	return nil
}

// purgeStored removes batch's dead letters and results.
func (q *Queue) purgeStored(ctx context.Context, batch string) error {
	if err := q.Dead.Purge(ctx, jetstream.WithPurgeSubject(q.Names.DeadSubject(batch))); err != nil {
		return fmt.Errorf("delete batch %s: remove its dead letters: %w", batch, err)
	}
	if err := q.Results.Purge(ctx, jetstream.WithPurgeSubject(q.Names.ResultsFilter(batch))); err != nil {
		return fmt.Errorf("delete batch %s: remove its results: %w", batch, err)
	}
	return nil
}

// purgeJobs removes batch's jobs from the jobs stream. A purge the user may not make is not
// answered, and its request would wait for ctx's deadline: the server's refusal arrives apart,
// as the connection's last error, which is watched meanwhile so that the refusal ends the
// request at once and says what to do.
func (q *Queue) purgeJobs(ctx context.Context, batch string) error {
	nc := q.JS.Conn()
	before := nc.LastError()
	refused := func() error {
		if last := nc.LastError(); last != before && errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), ".STREAM.PURGE.") {
			return fmt.Errorf("%w (deleting a batch needs a NATS user that may purge streams, such as deploy/'s admin)", last)
		}
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	purged := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(refusalLook)
		defer tick.Stop()
		for {
			select {
			case <-purged:
				return
			case <-tick.C:
				if err := refused(); err != nil {
					cancel(err)
					return
				}
			}
		}
	}()
	err := q.Jobs.Purge(ctx, jetstream.WithPurgeSubject(q.Names.JobSubject(batch)))
	close(purged)
	<-watched
	if err != nil {
		if why := refused(); why != nil {
			return why
		}
	}
	return err
}

// refusalLook is how often purgeJobs looks for the server's refusal.
const refusalLook = 20 * time.Millisecond

// Manifests lists every batch manifest, oldest write first. One watch of the bucket delivers
// them all with their values: no request per batch, which a remote server would make a round
// trip each.
func (q *Queue) Manifests(ctx context.Context) ([]Manifest, error) {
	w, err := q.Batches.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list batches: %w", err)
	}
	defer w.Stop()
	var out []Manifest
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("list batches: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok { // nats.go ended the watch (its connection closed, its consumer lost)
				return nil, fmt.Errorf("list batches: the watch ended after %d manifests, before the last", len(out))
			}
			if e == nil { // every manifest stored when the watch began has come
				if err := ctx.Err(); err != nil { // or the watch was stopped
					return nil, fmt.Errorf("list batches: %w", err)
				}
				return out, nil
			}
			var m Manifest
			if err := json.Unmarshal(e.Value(), &m); err != nil {
				return nil, fmt.Errorf("batch %s: decode manifest: %w", e.Key(), err)
			}
			out = append(out, m)
		}
	}
}
