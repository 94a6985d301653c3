package main

import (
	"context"
	"fmt"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// A batch's results can be lost: the results stream keeps each result for --results-max-age
// (7 days by default), and an operator may purge it, but the batch's manifest stays. Once
// none of a batch's jobs is left in the queue (a job leaves it only after its result is
// stored) and no submit is publishing it, the results it lacks will never come, and a reader
// that waits for them would wait for ever.

// lost counts the results of batch m that will never come, given its jobs still in the queue
// (waiting) and its results stored (results), counted in that order: none while a job of it
// is in the queue or its submit is publishing, nor once it is done or deleted.
func lost(m queue.Manifest, waiting, results int) int {
	if waiting > 0 || m.Status == queue.BatchPublishing || m.Status == queue.BatchDeleted {
		return 0
	}
	return max(0, m.Jobs-results)
}

// lostResults asks the server how many results of batch m will never come (lost), got of
// them read already by the caller.
func lostResults(ctx context.Context, q *queue.Queue, m queue.Manifest, got int) (int, error) {
	if lost(m, 0, got) == 0 {
		return 0, nil // publishing, deleted, or read whole: nothing to ask
	}
	waiting, _, err := jobsWaiting(ctx, q, m.BatchID)
	if err != nil || waiting > 0 {
		return 0, err
	}
	stored, err := q.ResultsStored(ctx, m.BatchID)
	if err != nil {
		return 0, err
	}
	return lost(m, waiting, max(got, stored)), nil
}

// lostCause says why lost results of batch m will never come: they expired, if it was
// created longer ago than the results stream keeps results, or were removed.
func lostCause(q *queue.Queue, m queue.Manifest) string {
	const gone = "none of its jobs is left in the queue"
	if m.Status == queue.BatchCancelled && m.SubmittedAt.IsZero() {
		return gone + ", and it was cancelled before it was all published: run the same submit command again, and the rest are ended as cancelled"
	}
	if keep := q.Results.CachedInfo().Config.MaxAge; keep > 0 && time.Since(m.CreatedAt) > keep {
		return fmt.Sprintf("%s, and the NATS server keeps results for %s (--results-max-age): they expired", gone, span(keep))
	}
	return gone + ", and its results were removed from the NATS server"
}

// lostPhrase says that lost results of batch m will never come, and why.
func lostPhrase(q *queue.Queue, m queue.Manifest, lost int) string {
	return lostPhraseOf(lost, lostCause(q, m))
}

// lostPhraseOf says that lost results will never come, for cause (lostCause).
func lostPhraseOf(lost int, cause string) string {
	return fmt.Sprintf("%s will never come: %s", plural(lost, "result"), cause)
}

// lostErr is the error of a reader that waits for results of batch m of which lost will never
// come.
func lostErr(q *queue.Queue, m queue.Manifest, lost int) error {
	return fmt.Errorf("batch %s: %s; submit failed %s writes their lines, to run them again as a new batch (submit delete %s then removes what is left of this one)",
		m.BatchID, lostPhrase(q, m, lost), m.BatchID, m.BatchID)
}

// span writes d in whole days when it is whole days, as retention periods usually are.
func span(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= day && d%day == 0 {
		return plural(int(d/day), "day")
	}
	return d.String()
}

// resultsGone returns an error when the results of batch that a reader waits for, got of
// them read, will never come: the batch was deleted, or the results it lacks are lost. It
// returns nil when they may still come, and when the server cannot tell now.
func resultsGone(ctx context.Context, q *queue.Queue, batch string, got int) error {
	m, _, err := q.GetManifest(ctx, batch)
	if err != nil {
		return nil
	}
	if m.Status == queue.BatchDeleted {
		return deletedErr(m)
	}
	if lost, err := lostResults(ctx, q, m, got); err == nil && lost > 0 {
		return lostErr(q, m, lost)
	}
	return nil
}
