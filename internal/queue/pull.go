package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JobPuller pulls jobs from the workers' consumer over one inbox of its own, kept for its
// whole life. It sends the pull requests jetstream's Fetch sends, without what Fetch adds to
// every call and message: a subscription, a goroutine, a JSON encoding of the request, and per
// message a timer, a parse of the delivery metadata and a hand-off from that goroutine to the
// caller. The jobs go from the connection's read loop straight to the channel Pull reads.
//
// It also tells the server's answers apart, where Fetch's caller sees only an ended batch: a
// request the server cannot serve (a 409: the consumer is gone, the batch is above its limits;
// JetStream does not answer) is an error, so that the worker waits before the next; with Fetch
// a worker whose consumer was deleted sent about 12,000 requests a second.
//
// The inbox outlives a request, so a job that comes after its request was given up on (the
// server answered late, say across a reconnect) is not lost: the next Pull delivers it, or
// Close hands it back. Use it from one goroutine.
type JobPuller struct {
	nc      *nats.Conn
	subject string // the consumer's next-message API subject
	inbox   string // request i is answered on inbox.i
	sub     *nats.Subscription
	msgs    chan *nats.Msg
	seq     uint64 // the last request's number
	body    []byte
	// abandoned is the last request Pull gave up on, which the server may answer until it
	// expires (zero: none, or it has ended). Pull gives up only when its ctx ends, which for
	// a worker is its stop; Close waits briefly for what that request still brings.
	abandoned abandonedRequest
}

// abandonedRequest is a pull request given up on: where the server answers it, when it
// expires, and how many jobs it may still bring.
type abandonedRequest struct {
	reply   string
	expires time.Time
	owed    int
}

// pullerBuffer is how many messages the inbox holds before the read loop drops the next (a
// slow consumer, which a dropped job survives: it is redelivered after AckWait). A request
// asks for at most MaxPull, so only jobs of several given-up requests could fill it.
const pullerBuffer = 1024

// MaxPull is the most jobs one Pull asks for.
const MaxPull = 256

// NewJobPuller checks that the workers' consumer exists and subscribes to a fresh inbox for
// its jobs.
func (q *Queue) NewJobPuller(ctx context.Context) (*JobPuller, error) {
	if _, err := q.Consumer(ctx); err != nil {
		return nil, err
	}
	nc := q.JS.Conn()
	if nc == nil {
		return nil, errors.New("queue: job puller: no NATS connection")
	}
	prefix := q.JS.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	p := &JobPuller{
		nc:      nc,
		subject: prefix + "CONSUMER.MSG.NEXT." + q.Names.JobsStream() + "." + ConsumerName,
		inbox:   nc.NewInbox(),
		msgs:    make(chan *nats.Msg, pullerBuffer),
	}
	sub, err := nc.ChanSubscribe(p.inbox+".*", p.msgs)
	if err != nil {
		return nil, fmt.Errorf("queue: job puller: subscribe: %w", err)
	}
	p.sub = sub
	return p, nil
}

// Pull asks for up to n jobs (at most MaxPull) and calls deliver for each job that comes,
// never more than n times, until n came, the server ended the request (none left before it
// expired), expires and a second passed without an answer, or ctx is done. It returns how
// many it delivered. An error means the request was not sent (the connection is down) or the
// server cannot serve it (a 409: the consumer is gone or limits the request; JetStream does
// not answer); the caller should wait before the next.
func (p *JobPuller) Pull(ctx context.Context, n int, expires time.Duration, deliver func(jetstream.Msg)) (int, error) {
	if n < 1 || n > MaxPull {
		return 0, fmt.Errorf("queue: pull of %d jobs: between 1 and %d", n, MaxPull)
	}
	if !p.nc.IsConnected() {
		// nats.go would buffer the request and send it on reconnect, where the server would
		// serve it long after it was given up on, and one more for every pull meanwhile.
		return 0, fmt.Errorf("queue: pull request: %w", nats.ErrConnectionReconnecting)
	}
	p.seq++
	reply := p.inbox + "." + strconv.FormatUint(p.seq, 10)
	b := append(p.body[:0], `{"batch":`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `,"expires":`...)
	b = strconv.AppendInt(b, int64(expires), 10)
	p.body = append(b, '}')
	if err := p.nc.PublishRequest(p.subject, reply, p.body); err != nil {
		return 0, fmt.Errorf("queue: pull request: %w", err)
	}
	expiry := time.Now().Add(expires)
	// The server answers an expired request with a 408; wait a second longer for that, and
	// take the request as gone after it (a lost connection takes its answer along).
	t := time.NewTimer(expires + time.Second)
	defer t.Stop()
	got := 0
	for got < n {
		select {
		case m := <-p.msgs:
			code, isStatus := statusOf(m)
			if !isStatus {
				got++
				deliver(&jobMsg{msg: m, nc: p.nc})
				continue
			}
			if m.Subject != reply {
				if m.Subject == p.abandoned.reply && code != "100" {
					p.abandoned = abandonedRequest{} // it has ended
				}
				continue // the end of a request given up on earlier
			}
			if err := requestEnd(code, m); err != nil || code != "100" {
				return got, err
			}
		case <-t.C:
			return got, nil // expired at the server
		case <-ctx.Done():
			// The server may still answer it until it expires.
			p.abandoned = abandonedRequest{reply: reply, expires: expiry, owed: n - got}
			return got, ctx.Err()
		}
	}
	return got, nil // it got all it asked for, which ends it
}

// statusOf returns the status code of a status message of the server (no data, a Status
// header), as jetstream's checkMsg reads it.
func statusOf(m *nats.Msg) (string, bool) {
	if len(m.Data) > 0 || len(m.Header) == 0 {
		return "", false
	}
	code := m.Header.Get("Status")
	return code, code != ""
}

// requestEnd says what a status message for the current request means: nil for a heartbeat
// (100, which does not end it) and for the normal ends of a request (408 expired, 404 nothing
// there), an error for the rest. A 409 is an error too, though some pass (a leadership change,
// a server shutting down): others do not (the consumer deleted, a batch or expiry above the
// consumer's limits, too many requests waiting), and asking again at once would repeat them
// as fast as the server answers.
func requestEnd(code string, m *nats.Msg) error {
	descr := m.Header.Get("Description")
	switch code {
	case "100", "404", "408":
		return nil
	case "409":
		if strings.Contains(strings.ToLower(descr), "consumer deleted") {
			return fmt.Errorf("queue: pull request: %w", jetstream.ErrConsumerDeleted)
		}
	case "503":
		return fmt.Errorf("queue: pull request: %w", nats.ErrNoResponders)
	}
	return fmt.Errorf("queue: pull request: status %s %s", code, descr)
}

// Close ends the puller, and hands back (HandBack) every job that came for a request Pull
// gave up on, or that the server sends as it goes: such a job would otherwise go to nobody
// and wait out AckWait, as a job or two did once in a few stops of a busy worker, whose last
// request the server answered as it unsubscribed.
//
// It waits briefly for the last request given up on (closeLinger): a server that has jobs
// answers at once. Then it drains the inbox: the server takes the unsubscribe after the
// requests sent before it, and what it sent before is read. Only a job for a request still
// waiting, sent by the consumer's leader on another server of a cluster before the
// unsubscribe reached it, can still go to nobody. The jobs are handed back last, once the
// server knows of no request here: one handed back into an open request would come back,
// each time one delivery closer to MaxDeliver.
//
// held, if not nil, says whether the caller still works on an earlier delivery of the job at
// a stream sequence (its ack wait passed while its link was down, say): such a late job is
// left alone, as the caller will settle that delivery. Handed back, it would go at once to
// another worker, which would sample it a second time.
func (p *JobPuller) Close(held func(streamSeq uint64) bool) error {
	var late []*nats.Msg
	if a := p.abandoned; a.owed > 0 && time.Now().Before(a.expires) {
		late = awaitEnd(p.msgs, a, time.Now().Add(closeLinger))
	}
	err := p.unsubscribe()
read:
	for {
		select {
		case m := <-p.msgs:
			if _, isStatus := statusOf(m); !isStatus {
				late = append(late, m)
			}
		default:
			break read
		}
	}
	for _, m := range late {
		if held != nil {
			if seq, ok := numberFromAckSubject(m.Reply, ackStreamSeq); ok && held(seq) {
				continue
			}
		}
		p.handBack(m)
	}
	return err
}

// unsubscribe ends the puller's interest in its inbox. Connected, it drains: the server
// takes the unsubscribe after the requests sent before it, and once drained, what it sent
// before is in the inbox. Without a connection there is no server to drain from or wait for.
func (p *JobPuller) unsubscribe() error {
	if p.nc.IsConnected() {
		closed := p.sub.StatusChanged(nats.SubscriptionClosed)
		if err := p.sub.Drain(); err == nil {
			select {
			case <-closed:
			case <-time.After(drainWait):
			}
			return nil
		}
	}
	return p.sub.Unsubscribe()
}

const (
	// closeLinger is how long Close waits for the jobs a request given up on may still
	// bring: a server with jobs answers within a round trip.
	closeLinger = 100 * time.Millisecond
	// drainWait bounds Close's wait for the server to take the unsubscribe.
	drainWait = 2 * time.Second
)

// awaitEnd returns the jobs that come on msgs until the abandoned request a has ended (its
// end came, a status, or it brought all it owed) or deadline.
func awaitEnd(msgs <-chan *nats.Msg, a abandonedRequest, deadline time.Time) (late []*nats.Msg) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for a.owed > 0 {
		select {
		case m := <-msgs:
			code, isStatus := statusOf(m)
			switch {
			case !isStatus:
				a.owed--
				late = append(late, m)
			case m.Subject == a.reply && code != "100":
				return late
			}
		case <-t.C:
			return late
		}
	}
	return late
}

// handBack hands back a job that came for nobody.
func (p *JobPuller) handBack(m *nats.Msg) {
	_ = HandBack(context.Background(), &jobMsg{msg: m, nc: p.nc})
}

// handBackWait bounds HandBack's wait: the server takes a job at once unless it is
// unavailable, and a job it did not take comes back after AckWait.
const handBackWait = 5 * time.Second

// jobMsg is a job pulled by a JobPuller: a jetstream.Msg, which settles itself by publishing
// to its ack subject, with the bodies jetstream's messages send.
type jobMsg struct {
	msg   *nats.Msg
	nc    *nats.Conn
	acked atomic.Bool // acked, naked or termed: the server has let go of it
}

var _ jetstream.Msg = (*jobMsg)(nil)

// The acknowledgement bodies JetStream takes on an ack subject.
const (
	ackAck      = "+ACK"
	ackNak      = "-NAK"
	ackProgress = "+WPI"
	ackTerm     = "+TERM"
	// ackNakStored is a nak for a delivery at once, sent with the shortest delay: the server
	// stores a delayed nak with the consumer's state (as a delivery whose AckWait is over),
	// where a plain nak only queues the job again in its memory. A job nak'd plainly just
	// before its server stopped (an interrupted submit --local stops its embedded server
	// with its worker; a restart; a new stream leader) waited out AckWait, 30 s, once a
	// server ran on the store again.
	ackNakStored = ackNak + ` {"delay": 1}`
)

func (j *jobMsg) Data() []byte         { return j.msg.Data }
func (j *jobMsg) Headers() nats.Header { return j.msg.Header }
func (j *jobMsg) Subject() string      { return j.msg.Subject }
func (j *jobMsg) Reply() string        { return j.msg.Reply }
func (j *jobMsg) Ack() error           { return j.settle([]byte(ackAck)) }
func (j *jobMsg) Nak() error           { return j.settle([]byte(ackNakStored)) }
func (j *jobMsg) Term() error          { return j.settle([]byte(ackTerm)) }
func (j *jobMsg) InProgress() error    { return j.send([]byte(ackProgress)) }
func (j *jobMsg) TermWithReason(reason string) error {
	return j.settle([]byte(ackTerm + " " + reason))
}

// NakWithDelay hands the job back for a delivery after delay at the earliest.
func (j *jobMsg) NakWithDelay(delay time.Duration) error {
	if delay <= 0 {
		return j.Nak()
	}
	return j.settle(fmt.Appendf(nil, `%s {"delay": %d}`, ackNak, delay.Nanoseconds()))
}

// HandBack gives msg, a job that a JobPuller delivered, back for another delivery at once,
// and returns once the server has taken it (or ctx ends, or 5 s pass). The server stores it
// so (see ackNakStored), and, unlike a nak, it is waited for: the server handles acks in a
// queue of its own, after the client's flush has returned, and a server stopped right after
// a nak may never get to it. Either way the job would wait out AckWait. A message of another
// kind is nak'd the same way, but not waited for.
func HandBack(ctx context.Context, msg jetstream.Msg) error {
	j, ok := msg.(*jobMsg)
	if !ok {
		return msg.NakWithDelay(time.Nanosecond)
	}
	if j.acked.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if j.msg.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	if !j.nc.IsConnected() {
		// No server to wait for: nats.go keeps the nak for the reconnect, as it would a
		// request, which would only wait out ctx.
		return j.Nak()
	}
	ctx, cancel := context.WithTimeout(ctx, handBackWait)
	defer cancel()
	if _, err := j.nc.RequestWithContext(ctx, j.msg.Reply, []byte(ackNakStored)); err != nil {
		return fmt.Errorf("hand back job: %w", err)
	}
	j.acked.Store(true)
	return nil
}

// PublishAgain publishes the job of msg, which a JobPuller delivered, again as a new message,
// with every delivery ahead of it and marked as published again (it may have a result by
// then), and then ends msg. It serves a job handed back on its last delivery: the server
// would otherwise keep it as a dead letter, although it never failed. Each step waits for the
// server to take it (or ctx to end, or 5 s).
//
// msg must end once its copy is stored: left to run out of deliveries, it would become a dead
// letter whose error result could be stored before the copy's. So should its term not reach
// the server, msg is deleted from the stream, which ends it too (jetstream-notes §4: a dead
// letter's handler finds it gone). Only if that fails as well does an error say so.
func (q *Queue) PublishAgain(ctx context.Context, msg jetstream.Msg) error {
	batch := q.Names.BatchFromJobSubject(msg.Subject())
	customID := CustomID(msg.Headers())
	seq, _ := StreamSeq(msg)
	again := nats.NewMsg(msg.Subject())
	setCustomID(again.Header, customID)
	again.Header.Set(HeaderRepublished, "1")
	again.Data = msg.Data()
	// A Nats-Msg-Id of its own: the job's first one may still be in the duplicate window. It
	// starts with what no batch id can hold, so that it is no other job's first one: a custom
	// id may hold anything after the batch's "/" ("x/again/7" would be the copy of "x").
	id := fmt.Sprintf("again:%d:%s", seq, MsgID(batch, customID))
	pubCtx, cancel := context.WithTimeout(ctx, handBackWait)
	defer cancel()
	if _, err := q.JS.PublishMsg(pubCtx, again, jetstream.WithMsgID(id)); err != nil {
		return fmt.Errorf("publish job %s/%s again: %w", batch, customID, err)
	}
	termErr := q.endPublishedAgain(ctx, msg)
	if termErr == nil {
		return nil
	}
	delCtx, cancel := context.WithTimeout(ctx, handBackWait)
	defer cancel()
	// Gone already, if the term reached the server and only its answer was lost.
	if err := q.DeleteJob(delCtx, seq); err != nil {
		return fmt.Errorf("end job %s/%s, published again: %w; nor could it be deleted: %w", batch, customID, termErr, err)
	}
	if j, ok := msg.(*jobMsg); ok {
		j.acked.Store(true)
	}
	return nil
}

// DeleteJob deletes the job at stream sequence seq from the jobs stream, which ends it for
// the consumer too. A job gone already (acked, ended, deleted by another worker) is no error.
func (q *Queue) DeleteJob(ctx context.Context, seq uint64) error {
	err := q.Jobs.DeleteMsg(ctx, seq)
	if err == nil {
		return nil
	}
	// The server says "no message found" as an error code of its own: ask whether it is gone.
	if _, getErr := q.Jobs.GetMsg(ctx, seq); errors.Is(getErr, jetstream.ErrMsgNotFound) {
		return nil
	}
	return fmt.Errorf("delete job %d: %w", seq, err)
}

// endPublishedAgain terms msg, published again, and waits for the server to take it.
func (q *Queue) endPublishedAgain(ctx context.Context, msg jetstream.Msg) error {
	j, ok := msg.(*jobMsg)
	if !ok {
		return msg.TermWithReason(publishedAgain)
	}
	ctx, cancel := context.WithTimeout(ctx, handBackWait)
	defer cancel()
	if _, err := j.nc.RequestWithContext(ctx, j.msg.Reply, []byte(ackTerm+" "+publishedAgain)); err != nil {
		return err
	}
	j.acked.Store(true)
	return nil
}

// publishedAgain is the reason a job published again ends with.
const publishedAgain = "published again"

// DoubleAck acks and waits for the server to confirm it.
func (j *jobMsg) DoubleAck(ctx context.Context) error {
	if j.acked.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if _, err := j.nc.RequestWithContext(ctx, j.msg.Reply, []byte(ackAck)); err != nil {
		return err
	}
	j.acked.Store(true)
	return nil
}

// Metadata parses the delivery metadata of the message's ack subject.
func (j *jobMsg) Metadata() (*jetstream.MsgMetadata, error) {
	m, err := j.msg.Metadata()
	if err != nil {
		return nil, err
	}
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Consumer: m.Sequence.Consumer, Stream: m.Sequence.Stream},
		NumDelivered: m.NumDelivered,
		NumPending:   m.NumPending,
		Timestamp:    m.Timestamp,
		Stream:       m.Stream,
		Consumer:     m.Consumer,
		Domain:       m.Domain,
	}, nil
}

// settle sends a final acknowledgement, once.
func (j *jobMsg) settle(body []byte) error {
	if j.acked.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if err := j.send(body); err != nil {
		return err
	}
	j.acked.Store(true)
	return nil
}

func (j *jobMsg) send(body []byte) error {
	if j.msg.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	return j.nc.Publish(j.msg.Reply, body)
}
