package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// HeldReport is a worker's answer to AskHeld: the results it holds because the NATS server
// cannot store them (StoreUnavailable). It travels over core NATS, which stores nothing: a
// server whose store is full refuses the workers' presence notes too, and a reader that went
// by the notes alone would take workers that hold their results for workers that crashed.
type HeldReport struct {
	Host string `json:"host,omitempty"` // the worker's host name (a pod's name)
	Held int    `json:"held"`           // results held
	// For is how long the server has refused the worker's results.
	For time.Duration `json:"for"`
	// Full says that the server answered it has no room (StoreFull), rather than no answer
	// or no leader.
	Full  bool   `json:"full,omitempty"`
	Error string `json:"error,omitempty"` // the latest refusal
}

// AskHeldWait is how long AskHeld gathers answers. Workers answer at once, over the
// connection they already have, so this is a few round trips across a cluster.
const AskHeldWait = 300 * time.Millisecond

// maxHeldReports bounds the answers AskHeld reads: a fleet's worth, and a bound on memory.
const maxHeldReports = 1000

// AnswerHeld answers AskHeld for one worker until the returned subscription is
// unsubscribed: report says what it holds, and false when it holds nothing (it then keeps
// quiet, so that a healthy fleet sends nothing back).
func (q *Queue) AnswerHeld(report func() (HeldReport, bool)) (*nats.Subscription, error) {
	sub, err := q.JS.Conn().Subscribe(q.Names.HeldSubject(), func(m *nats.Msg) {
		r, ok := report()
		if !ok || m.Reply == "" {
			return
		}
		r.Error = clip(r.Error, maxNoteError)
		data, err := json.Marshal(r)
		if err != nil {
			return
		}
		_ = m.Respond(data) // a lost answer: the reader asks again at its next look
	})
	if err != nil {
		return nil, fmt.Errorf("answer held results: %w", err)
	}
	return sub, nil
}

// AskHeld asks every worker which results it holds because the server cannot store them,
// and gathers the answers for up to wait (AskHeldWait), or until the server says that no
// worker listens. Workers that hold nothing do not answer.
func (q *Queue) AskHeld(ctx context.Context, wait time.Duration) ([]HeldReport, error) {
	nc := q.JS.Conn()
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("ask for held results: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(q.Names.HeldSubject(), inbox, nil); err != nil {
		return nil, fmt.Errorf("ask for held results: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var reports []HeldReport
	for len(reports) < maxHeldReports {
		m, err := sub.NextMsgWithContext(ctx)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return nil, nil // no worker listens
		case err != nil && ctx.Err() != nil:
			return reports, nil // every worker that holds results had its time to say so
		case err != nil:
			return reports, fmt.Errorf("ask for held results: %w", err)
		}
		var r HeldReport
		if json.Unmarshal(m.Data, &r) == nil && r.Held > 0 {
			reports = append(reports, r)
		}
	}
	return reports, nil
}
