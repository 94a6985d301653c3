package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/jobs"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// maxDeliveriesAdvisory is the part of the server's max-deliveries advisory we use
// (jetstream-notes §4).
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// deadLetters ends jobs whose last delivery died with its worker: the server keeps such a
// message in the work queue and announces it with an advisory; a worker publishes its error
// result, keeps the payload in the dead stream and deletes it.
//
// The server announces a job once, and what it announces must not be lost: dropped, the job
// would stay in the work queue for ever, never delivered again, and its batch would never be
// done. So every worker hears every announcement, not one of a queue group: the server
// would give some to a worker whose link died without a word, which it counts until its own
// pings give up (minutes). Each worker acts on it; the first to get there dead-letters the
// job, and the others find it done (deadLetter). Announcements wait here in a list of their
// own, unbounded (a few dozen bytes each), for their turn: a bounded channel dropped those
// of a burst beyond its size, a fleet's jobs dying together, as a slow consumer. And one
// whose dead-lettering fails (a full store, a stream leader election) is tried again here,
// every deadLetterRetry at first and then less often, until it succeeds or the worker stops.
func (w *Worker) deadLetters(ctx context.Context) {
	q := w.cfg.Queue
	heard := announcements{wake: make(chan struct{}, 1)}
	sub, err := q.JS.Conn().Subscribe(maxDeliveriesSubject(q.Names), func(m *nats.Msg) {
		var adv maxDeliveriesAdvisory
		if err := json.Unmarshal(m.Data, &adv); err != nil {
			w.log.Warn("undecodable max-deliveries advisory", "err", err)
			return
		}
		heard.add(adv)
	})
	if err != nil {
		w.log.Error("subscribe to max-deliveries advisories", "err", err)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(-1, -1); err != nil { // the handler only lists them
		w.log.Error("lift the pending limits of the max-deliveries advisories", "err", err)
	}
	var failed []maxDeliveriesAdvisory // to try again
	retry := time.NewTimer(maxDeadLetterRetry)
	retry.Stop()
	defer retry.Stop()
	delay := w.deadLetterRetry
	try := func(adv maxDeliveriesAdvisory) (done bool) {
		err := w.deadLetter(ctx, adv)
		if err != nil && ctx.Err() == nil {
			w.log.Error("dead-letter job; it is tried again", "stream_seq", adv.StreamSeq, "err", err)
		}
		return err == nil
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-heard.wake:
			for _, adv := range heard.take() {
				if ctx.Err() != nil {
					return
				}
				if try(adv) {
					continue
				}
				if len(failed) == 0 {
					delay = w.deadLetterRetry
					retry.Reset(delay)
				}
				failed = append(failed, adv)
			}
		case <-retry.C:
			// In order, and no further than the first that fails again: the rest would most
			// likely fail alike, each after its wait, while advisories queue up meanwhile.
			for len(failed) > 0 && try(failed[0]) {
				failed = failed[1:]
			}
			if len(failed) > 0 {
				delay = min(2*delay, maxDeadLetterRetry)
				retry.Reset(delay)
			}
		}
	}
}

// announcements are the max-deliveries advisories heard and not yet taken, in order; wake
// (of capacity 1) has a value while there are any.
type announcements struct {
	mu   sync.Mutex
	list []maxDeliveriesAdvisory
	wake chan struct{}
}

// add lists adv and wakes the taker.
func (a *announcements) add(adv maxDeliveriesAdvisory) {
	a.mu.Lock()
	a.list = append(a.list, adv)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default: // already awake
	}
}

// take returns the advisories listed so far and forgets them.
func (a *announcements) take() []maxDeliveriesAdvisory {
	a.mu.Lock()
	defer a.mu.Unlock()
	list := a.list
	a.list = nil
	return list
}

// maxDeliveriesSubject is the subject of the server's max-deliveries advisories for the
// workers' consumer (jetstream-notes §4).
func maxDeliveriesSubject(names queue.Names) string {
	return "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + names.JobsStream() + "." + queue.ConsumerName
}

// The delays between tries of a dead letter that failed: deadLetterRetry (a Worker's, 5 s
// unless a test shortens it) at first, doubled per try up to maxDeadLetterRetry.
const (
	deadLetterRetry    = 5 * time.Second
	maxDeadLetterRetry = time.Minute
)

func (w *Worker) deadLetter(ctx context.Context, adv maxDeliveriesAdvisory) error {
	q := w.cfg.Queue
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	raw, err := q.Jobs.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // another worker got there first (every worker hears the advisory)
	}
	if err != nil {
		return fmt.Errorf("read job %d: %w", adv.StreamSeq, err)
	}
	batch := q.Names.BatchFromJobSubject(raw.Subject)
	customID := queue.CustomID(raw.Header)
	done, err := q.HasResult(ctx, batch, customID)
	if err != nil {
		return err
	}
	if !done {
		res := deadLetterResult(raw.Data, batch, customID, unfinished(int(adv.Deliveries)))
		if w.cancelled.has(batch) {
			res = cancelledResult(raw.Data, batch, customID)
		} else if err := q.PublishDead(ctx, batch, customID, "max deliveries", raw.Data); err != nil {
			return err
		}
		first, err := w.publish(ctx, batch, &res)
		if err != nil {
			return err
		}
		if first { // another worker handling the same advisory may have stored it first
			w.metrics.finished(&res, 0)
		}
	}
	if err := q.DeleteJob(ctx, adv.StreamSeq); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	return nil
}

// outOfDeliveries ends a job on the consumer's delivery kept for its dead letter (see
// queue.Config.MaxDeliver): no worker finished it in the deliveries it had, each worker
// having died with it (or handed it back on the last, the publish again failing). It is not
// worked on again, as it may be what killed them; a worker that died between storing its
// result and the ack may have finished it, though. A job of a cancelled batch ends as
// cancelled, as every job of that batch without a result does, rather than as a dead letter.
func (w *Worker) outOfDeliveries(ctx context.Context, msg jetstream.Msg, batch, customID string) outcome {
	done, err := w.cfg.Queue.HasResult(ctx, batch, customID)
	if err != nil {
		return transient(err) // handle dead-letters it all the same: this is its last delivery
	}
	if done {
		return outcome{settle: settleAck}
	}
	if w.cancelled.has(batch) {
		res := cancelledResult(msg.Data(), batch, customID)
		return outcome{result: &res, settle: settleAck}
	}
	return w.deadLettered(ctx, msg, batch, customID, unfinished(w.maxDeliver), "max deliveries")
}

// deadLettered is the outcome of a job delivered in msg that ends as a dead letter: an error
// result that says message, to store, and the payload kept in the dead stream with reason.
func (w *Worker) deadLettered(ctx context.Context, msg jetstream.Msg, batch, customID, message, reason string) outcome {
	res := deadLetterResult(msg.Data(), batch, customID, message)
	if err := w.cfg.Queue.PublishDead(ctx, batch, customID, reason, msg.Data()); err != nil {
		w.jobLog(batch, customID, queue.NumDelivered(msg)).Error("keep dead-letter payload", "err", err)
	}
	return outcome{result: &res, settle: settleTerm}
}

// deadLetterResult is the error result of a job, its payload data, that ends as a dead letter
// for the reason message.
func deadLetterResult(data []byte, batch, customID, message string) jobs.Result {
	job := namedJob(data, customID)
	return errorResult(job, batch, jobs.ResultError{
		Code:      jobs.CodeDeadLetter,
		Message:   message,
		Category:  jobs.CategoryServer,
		Retryable: true,
	})
}

// cancelledResult is the result of a job of a cancelled batch, its payload data, that ends
// unsampled.
func cancelledResult(data []byte, batch, customID string) jobs.Result {
	return *cancelled(namedJob(data, customID), batch).result
}

// namedJob decodes a job message's payload for a result that ends it unsampled, named by the
// message's custom id header, as work names its results; without the header, by its line's.
// Undecodable, the job is its custom id alone.
func namedJob(data []byte, customID string) jobs.Job {
	job, err := jobs.DecodeJob(data)
	if err != nil {
		return jobs.Job{CustomID: customID}
	}
	if customID != "" {
		job.CustomID = customID
	}
	return job
}

// unfinished is a dead letter's message for a job that no worker finished in n deliveries.
func unfinished(n int) string {
	return "no worker finished the job in " + deliveries(n)
}

// deliveries words n deliveries: "1 delivery", "3 deliveries".
func deliveries(n int) string {
	if n == 1 {
		return "1 delivery"
	}
	return strconv.Itoa(n) + " deliveries"
}
