package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// message in the work queue and announces it with an advisory; one worker of the fleet (a
// queue group) publishes its error result, keeps the payload in the dead stream and deletes it.
func (w *Worker) deadLetters(ctx context.Context) {
	q := w.cfg.Queue
	nc := q.JS.Conn()
	subject := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + q.Names.JobsStream() + "." + queue.ConsumerName
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanQueueSubscribe(subject, q.Names.Prefix+"-dead-letters", ch)
	if err != nil {
		w.log.Error("subscribe to max-deliveries advisories", "err", err)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-ch:
			var adv maxDeliveriesAdvisory
			if err := json.Unmarshal(m.Data, &adv); err != nil {
				w.log.Warn("undecodable max-deliveries advisory", "err", err)
				continue
			}
			if err := w.deadLetter(ctx, adv); err != nil {
				w.log.Error("dead-letter job", "stream_seq", adv.StreamSeq, "err", err)
			}
		}
	}
}

func (w *Worker) deadLetter(ctx context.Context, adv maxDeliveriesAdvisory) error {
	q := w.cfg.Queue
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	raw, err := q.Jobs.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // another worker got there first
	}
	if err != nil {
		return fmt.Errorf("read job %d: %w", adv.StreamSeq, err)
	}
	batch := q.Names.BatchFromJobSubject(raw.Subject)
	customID := raw.Header.Get(queue.HeaderCustomID)
	done, err := q.HasResult(ctx, batch, customID)
	if err != nil {
		return err
	}
	if !done {
		job, decErr := jobs.DecodeJob(raw.Data)
		if decErr != nil {
			job = jobs.Job{CustomID: customID}
		}
		res := errorResult(job, batch, jobs.ResultError{
			Code:      jobs.CodeDeadLetter,
			Message:   fmt.Sprintf("no worker finished the job in %d deliveries", adv.Deliveries),
			Category:  jobs.CategoryServer,
			Retryable: true,
		})
		if err := q.PublishDead(ctx, batch, customID, "max deliveries", raw.Data); err != nil {
			return err
		}
		first, err := w.publish(ctx, batch, &res)
		if err != nil {
			return err
		}
		if first { // another worker handling the same advisory may have stored it first
			w.metrics.deadLetter()
			w.metrics.finished(&res, 0)
		}
	}
	if err := q.Jobs.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("delete dead job %d: %w", adv.StreamSeq, err)
	}
	return nil
}
