package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
}

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
		case e := <-w.Updates():
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
