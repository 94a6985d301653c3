package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
)

// sentBack is the jobs this worker sent back to the stream to wait out a delay (its retry
// delay after a transient failure, up to 5 minutes, or a fleet pause longer than NakAbove),
// by stream sequence, until the server is to deliver them again. The server keeps such a job
// to itself until then: a job of a batch cancelled meanwhile ended as cancelled only when it
// came back, and a reader waited on the batch for as long after the cancel. So the worker
// that sent it back ends it on the cancel (endSentBack), as the dead letters are ended: its
// cancelled result stored, the job deleted from the stream.
//
// It holds no more than the jobs waiting in the consumer, which the consumer's MaxAckPending
// bounds. A job sent back by a worker that stopped since still waits out its delay.
type sentBack struct {
	mu   sync.Mutex
	jobs map[uint64]sentBackJob
	// prune is the size at which add next forgets the jobs whose delay is over.
	prune int
	// wake (of capacity 1, made by Open) has a value when a batch was cancelled, or a job of a
	// cancelled batch was sent back: endSentBack looks at the jobs then.
	wake chan struct{}
}

// sentBackJob is one job sent back: its batch, custom id and when its delay is over.
type sentBackJob struct {
	batch, customID string
	until           time.Time
}

// sentBackMargin is how long a job's delay must have left to be ended on a cancel by the
// worker that sent it back: one due sooner comes back to a worker, which ends it as
// cancelled, and is not taken from under it.
const sentBackMargin = time.Second

// add notes the job at stream sequence seq, sent back until until. cancelled tells whether
// its batch is cancelled already (the cancel came while the job was at work).
func (s *sentBack) add(seq uint64, batch, customID string, until time.Time, cancelled bool) {
	s.mu.Lock()
	if s.jobs == nil {
		s.jobs = make(map[uint64]sentBackJob)
	}
	if len(s.jobs) >= s.prune {
		now := time.Now()
		for seq, j := range s.jobs {
			if !now.Before(j.until) {
				delete(s.jobs, seq)
			}
		}
		s.prune = max(64, 2*len(s.jobs))
	}
	s.jobs[seq] = sentBackJob{batch: batch, customID: customID, until: until}
	s.mu.Unlock()
	if cancelled {
		s.poke()
	}
}

// forget drops the job at stream sequence seq: it was delivered again.
func (s *sentBack) forget(seq uint64) {
	s.mu.Lock()
	delete(s.jobs, seq)
	s.mu.Unlock()
}

// poke wakes endSentBack (none without wake).
func (s *sentBack) poke() {
	select {
	case s.wake <- struct{}{}:
	default: // awake already
	}
}

// take returns, and forgets, the jobs of the batches cancelled says are cancelled whose delay
// has more than sentBackMargin left, by stream sequence.
func (s *sentBack) take(cancelled func(batch string) bool) map[uint64]sentBackJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out map[uint64]sentBackJob
	soon := time.Now().Add(sentBackMargin)
	for seq, j := range s.jobs {
		if !cancelled(j.batch) {
			continue
		}
		delete(s.jobs, seq)
		if j.until.After(soon) {
			if out == nil {
				out = make(map[uint64]sentBackJob)
			}
			out[seq] = j
		}
	}
	return out
}

// endSentBack ends the jobs this worker sent back to wait in the stream whose batch is
// cancelled, whenever one is, until ctx is done. One it cannot end waits out its delay, and
// ends as cancelled when it is delivered again.
func (w *Worker) endSentBack(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.sentBack.wake:
		}
		for seq, j := range w.sentBack.take(w.cancelled.has) {
			if ctx.Err() != nil {
				return
			}
			if err := w.endCancelled(ctx, seq, j); err != nil && ctx.Err() == nil {
				w.jobLog(j.batch, j.customID, 0).Warn("end a job of a cancelled batch sent back to the stream; it ends when it is delivered again", "err", err)
			}
		}
	}
}

// endCancelled ends the job j at stream sequence seq, sent back to the stream, of a cancelled
// batch: its cancelled result is stored (none for a deleted batch, whose results are purged),
// then the job is deleted from the stream, which ends it for the consumer. The job keeps a
// result stored already. A worker that takes the job meanwhile stores none of its own: the
// stream keeps one result per job.
func (w *Worker) endCancelled(ctx context.Context, seq uint64, j sentBackJob) error {
	q := w.cfg.Queue
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	raw, err := q.Jobs.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // ended already
	}
	if err != nil {
		return fmt.Errorf("read job %d: %w", seq, err)
	}
	if !w.cancelled.deleted(j.batch) {
		done, err := q.HasResult(ctx, j.batch, j.customID)
		if err != nil {
			return err
		}
		if !done {
			job, err := jobs.DecodeJob(raw.Data)
			if err != nil {
				job = jobs.Job{CustomID: j.customID}
			}
			res := cancelled(job, j.batch).result
			first, err := w.publish(ctx, j.batch, res)
			if err != nil {
				return err
			}
			if first {
				w.metrics.finished(res, 0)
			}
		}
	}
	return q.DeleteJob(ctx, seq)
}
