package worker

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// settler stores results and settles their jobs in groups (group commit). The jobs that finish
// while one group waits for the stream's acks form the next group, so a busy worker writes to
// the NATS server and waits for it about once per group rather than once per job, and a quiet
// one settles each job at once: no job waits for a group to fill. A job is acked (or termed)
// only after its result is stored (invariant 2); a job whose result was not stored is left to
// its handler.
type settler struct {
	queue *queue.Queue
	in    chan *settlement
}

// maxSettleGroup bounds one group: the results of a group are in nats.go's buffer at once.
const maxSettleGroup = 256

func newSettler(q *queue.Queue, capacity int) *settler {
	return &settler{queue: q, in: make(chan *settlement, capacity)}
}

// settlement is one job to settle. A job handler owns one and reuses it, and its encode
// buffer, for each of its jobs.
type settlement struct {
	msg   jetstream.Msg
	store bool // publish result first; false when the job's result is stored already
	term  bool // Term rather than Ack: a permanent failure

	// Set by the settler before it signals done.
	publishErr error // the result was not stored: the message is not settled
	settleErr  error // the result is stored, but the ack or term failed

	done   chan struct{}
	result *nats.Msg // the job's result, reused from job to job (nil: none yet)
	buf    []byte    // the result's encoding; result.Data may point into it until done
}

func newSettlement() *settlement { return &settlement{done: make(chan struct{}, 1)} }

// settle hands s to the settler and waits until it is settled or its result failed to store.
func (st *settler) settle(s *settlement) {
	s.publishErr, s.settleErr = nil, nil
	st.in <- s
	<-s.done
}

// close ends run once the settlements handed in so far are settled. Call it when no handler
// can call settle any more.
func (st *settler) close() { close(st.in) }

// run settles groups until close and returns how many it settled. ctx bounds the waits for
// the stream's acks.
func (st *settler) run(ctx context.Context) (groups int) {
	group := make([]*settlement, 0, maxSettleGroup)
	msgs := make([]*nats.Msg, 0, maxSettleGroup)
	errs := make([]error, maxSettleGroup)
	for first := range st.in {
		groups++
		group = append(group[:0], first)
	fill:
		for len(group) < maxSettleGroup {
			select {
			case s, ok := <-st.in:
				if !ok {
					break fill
				}
				group = append(group, s)
			default:
				break fill
			}
		}
		msgs = msgs[:0]
		for _, s := range group {
			if s.store {
				msgs = append(msgs, s.result)
			}
		}
		st.queue.PublishResults(ctx, msgs, errs[:len(msgs)])
		k := 0
		for _, s := range group {
			if s.store {
				s.publishErr = errs[k]
				k++
				if s.publishErr != nil {
					continue
				}
			}
			// The result is stored; a lost ack only means a redelivery, which finds it.
			if s.term {
				s.settleErr = s.msg.Term()
			} else {
				s.settleErr = s.msg.Ack()
			}
		}
		for _, s := range group {
			s.done <- struct{}{}
		}
	}
	return groups
}
