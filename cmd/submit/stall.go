package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tinkerfleet/tinkerfleet/internal/backoff"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// stall is what the NATS server knows about a batch whose results have stopped coming:
// enough to tell a user who waits whether a worker is missing, the fleet is paused, or the
// jobs are simply at the workers.
type stall struct {
	missing    int    // the batch's jobs without a result
	waiting    int    // its jobs still in the jobs stream, at a worker or not
	publishing bool   // its submit has not finished publishing
	lostCause  string // why results would never come once none of its jobs is left (lostCause)

	noConsumer  bool          // no worker has set up the shared consumer on this server
	queued      int           // jobs of every batch not yet taken by a worker
	inFlight    int           // jobs of every batch at a worker (taken, not acked)
	maxInFlight int           // the consumer's cap on jobs in flight (MaxAckPending)
	pulls       int           // pull requests waiting at the server: workers with room for jobs
	ackWait     time.Duration // how long a job not heard of stays with its worker

	// attendance is the workers that noted their presence lately (queue.Present), if anyone
	// can tell: with them the stall tells a fleet whose every slot is busy from one that is
	// gone, which the consumer cannot (both show jobs in flight and no pull request).
	attendance *queue.Attendance

	pause   *backoff.Pause     // the latest account backoff, if any
	retry   *queue.RetryNote   // why a worker last put off a job of the batch, if one did
	trouble *queue.ServiceNote // what a worker's Tinker client last retried, if anything
	now     time.Time          // the server's clock when it was asked
	local   bool               // the worker runs in this process (submit --local)
	opening bool               // that worker is still opening its Tinker session
	alone   bool               // no worker can reach the NATS server (session.alone): status only
	dataDir string             // the embedded server's data directory, for submit --local
	// held is the results the workers hold because the server cannot store them, the
	// in-process worker's count or what the workers said (queue.AskHeld), whichever is more;
	// holders is what they said.
	held    int
	holders []queue.HeldReport
}

// explain asks the server why batch m, of whose results got have been read, has had none for
// quiet, and says so in a phrase that begins with that; or nothing (stallNone) if the server
// cannot tell now. local is progressOptions.local.
func explain(ctx context.Context, q *queue.Queue, m queue.Manifest, got int, local *inProcess, quiet time.Duration) (stallKind, string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := examine(ctx, q, m, local)
	if err != nil {
		return stallNone, ""
	}
	if s.missing = m.Jobs - got; s.waiting == 0 && s.missing > 0 {
		// A job leaves the queue once its result is stored: results that came since got was
		// counted are all stored now.
		stored, err := q.ResultsStored(ctx, m.BatchID)
		if err != nil {
			return stallNone, ""
		}
		s.missing = m.Jobs - max(got, stored)
	}
	kind, why := s.why(quiet)
	if kind == stallNone {
		return stallNone, ""
	}
	return kind, fmt.Sprintf("no result for %s: %s", quiet.Round(time.Second), why)
}

// jobsWaiting counts the jobs of batch still in the jobs stream, at a worker or not, and says
// when the server counted them, in its clock.
func jobsWaiting(ctx context.Context, q *queue.Queue, batch string) (n int, at time.Time, err error) {
	subject := q.Names.JobSubject(batch)
	info, err := q.Jobs.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, at, fmt.Errorf("jobs stream: %w", err)
	}
	return int(info.State.Subjects[subject]), info.TimeStamp, nil
}

// jobsWaitingAll counts the jobs of every batch still in the jobs stream, by job subject.
func jobsWaitingAll(ctx context.Context, q *queue.Queue) (map[string]uint64, error) {
	info, err := q.Jobs.Info(ctx, jetstream.WithSubjectFilter(q.Names.JobSubject("*")))
	if err != nil {
		return nil, fmt.Errorf("jobs stream: %w", err)
	}
	return info.State.Subjects, nil
}

// examine asks the server about batch m and the fleet, and the workers what they hold;
// local is the worker of submit --local, if any. The caller sets missing.
func examine(ctx context.Context, q *queue.Queue, m queue.Manifest, local *inProcess) (stall, error) {
	// The workers are given their time to answer (AskHeldWait) while the server is asked.
	var (
		holders []queue.HeldReport
		asking  sync.WaitGroup
	)
	asking.Go(func() { holders, _ = q.AskHeld(ctx, queue.AskHeldWait) })
	s, err := examineServer(ctx, q, m)
	asking.Wait()
	s.holders = holders
	for _, h := range holders {
		s.held += h.Held
	}
	if s.local = local != nil; s.local {
		s.held, s.dataDir = max(s.held, local.held()), local.dataDir
		s.opening = local.opening()
	}
	return s, err
}

// examineServer asks the server about batch m and the fleet.
func examineServer(ctx context.Context, q *queue.Queue, m queue.Manifest) (stall, error) {
	s := stall{publishing: m.Status == queue.BatchPublishing, lostCause: lostCause(q, m)}
	if latest, _, err := q.GetManifest(ctx, m.BatchID); err == nil {
		s.publishing = latest.Status == queue.BatchPublishing
	}
	var err error
	if s.waiting, s.now, err = jobsWaiting(ctx, q, m.BatchID); err != nil {
		return s, err
	}
	switch cons, err := q.Consumer(ctx); {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		s.noConsumer = true
	case err != nil:
		return s, err
	default:
		ci, err := cons.Info(ctx)
		if err != nil {
			return s, fmt.Errorf("workers' consumer: %w", err)
		}
		s.queued, s.inFlight, s.maxInFlight, s.pulls = int(ci.NumPending), ci.NumAckPending, ci.Config.MaxAckPending, ci.NumWaiting
		s.ackWait = ci.Config.AckWait
	}
	// The backoff comes last, and without it (a user whose permissions do not reach the bucket)
	// the other causes are still named.
	bctx, cancel := context.WithTimeout(ctx, backoffReadTimeout)
	defer cancel()
	pauses, _ := backoff.Pauses(bctx, q.JS, q.Names.BackoffBucket())
	for i := range pauses {
		if s.pause == nil || pauses[i].Left > s.pause.Left {
			s.pause = &pauses[i]
		}
	}
	if notes, err := q.ReadNotes(bctx, m.BatchID); err == nil {
		s.retry, s.trouble = notes.Retry, notes.Service
	}
	// A worker went silent at most a period after its last note, and the jobs it held go out
	// again at most an ack wait after that: one silent longer holds none.
	if a, known, err := q.Present(bctx, queue.PresenceWindow, s.ackWait+queue.PresencePeriod); err == nil && known {
		s.attendance = &a
	}
	return s, nil
}

// backoffReadTimeout bounds examine's read of the fleet's backoff.
const backoffReadTimeout = 2 * time.Second

// stallKind names why results stopped, so that a reader says it again only when the cause
// changes, not when its numbers do.
type stallKind int

const (
	stallNone stallKind = iota
	stallHeld
	stallPaused
	stallPublishing
	stallGone
	stallNoConsumer
	stallNoWorker
	stallRetrying
	stallServiceFails
	stallOpening
	stallKeyRefused
	stallSilent
	stallAtWorkers
)

// why says in one phrase why the results have stopped, the likeliest cause first; since is
// how long they have, so that a pause that ended within it still counts.
func (s stall) why(since time.Duration) (stallKind, string) {
	switch {
	case s.missing <= 0:
		return stallNone, "" // every result is stored; the reader has yet to read the last
	case s.held > 0:
		return stallHeld, s.heldPhrase()
	case s.alone && !s.publishing && s.waiting > 0:
		// Before any pause: a pause the crashed run's worker met (its last 429) ends by itself,
		// and no worker here would wait it out.
		return stallNoWorker, fmt.Sprintf("%s, and no worker can take %s: the NATS server runs in this command, which only reads; run the batch's submit --local command again to sample %[2]s", jobsWait(s.waiting), them(s.waiting))
	case s.pause != nil && s.pause.Left >= time.Second:
		return stallPaused, fmt.Sprintf("the fleet is paused for %s more: %s", s.pause.Left.Round(time.Second), pauseCause(s.pause.Reason))
	case s.pause != nil && -s.pause.Left < since: // short pauses, one after another
		return stallPaused, "the fleet keeps pausing: " + pauseCause(s.pause.Reason)
	case s.publishing:
		return stallPublishing, "its jobs are still being published (if that submit stopped, run it again to finish)"
	case s.waiting == 0:
		return stallGone, lostPhraseOf(s.missing, s.lostCause)
	case s.noConsumer:
		return stallNoConsumer, fmt.Sprintf("no worker has joined this NATS server yet: %s; start one (worker --nats-url)", jobsWait(s.waiting))
	case s.opening && s.troubled(since):
		return stallServiceFails, fmt.Sprintf("%s, and the worker in this process cannot open its Tinker session yet (it keeps trying for about 5 minutes): %s",
			jobsWait(s.waiting), troublePhrase(*s.trouble, s.now))
	case s.opening:
		return stallOpening, fmt.Sprintf("%s, and the worker in this process is still opening its Tinker session", jobsWait(s.waiting))
	case s.troubled(since) && s.trouble.Stopped:
		return stallKeyRefused, fmt.Sprintf("%s, and the Tinker service refuses the workers' key: %s", jobsWait(s.waiting), troublePhrase(*s.trouble, s.now))
	case s.trouble != nil && s.trouble.Stopped && s.gone():
		// However old: a worker that opened its session since would have removed the note.
		return stallKeyRefused, fmt.Sprintf("no worker is running: %s; the Tinker service refused the workers' key, and no worker has opened a session since: %s",
			jobsWait(s.waiting), troublePhrase(*s.trouble, s.now))
	case s.idle() && s.troubled(since):
		return stallServiceFails, fmt.Sprintf("no worker is taking jobs: %s, and the Tinker service fails the workers' requests: %s", jobsWait(s.waiting), troublePhrase(*s.trouble, s.now))
	case s.idle() && s.local:
		return stallNoWorker, fmt.Sprintf("the worker in this process takes no jobs: %s; see its warnings above (-v shows more)", jobsWait(s.waiting))
	case s.gone() && len(s.attendance.Silent) == 1:
		return stallNoWorker, fmt.Sprintf("no worker is running: %s; %s (it crashed, or lost its link to the NATS server): start one, or see its log", jobsWait(s.waiting), silentWho(*s.attendance))
	case s.gone() && len(s.attendance.Silent) > 1:
		return stallNoWorker, fmt.Sprintf("no worker is running: %s; %s (they crashed, or lost their link to the NATS server): start one, or see their logs", jobsWait(s.waiting), silentWho(*s.attendance))
	case s.gone():
		return stallNoWorker, fmt.Sprintf("no worker is running: %s; start one, or see in the workers' logs why they stopped", jobsWait(s.waiting))
	case s.idle():
		return stallNoWorker, fmt.Sprintf("no worker is taking jobs: %s; start one, or see the workers' logs", jobsWait(s.waiting))
	case s.retrying(since):
		return stallRetrying, fmt.Sprintf("%s at the workers; some of its jobs failed and wait to be tried again, %s", plural(s.inFlight, "job"), retryPhrase(*s.retry, s.now))
	case s.troubled(since):
		return stallServiceFails, fmt.Sprintf("%s at the workers; the Tinker service fails requests, which the workers try again: %s", plural(s.inFlight, "job"), troublePhrase(*s.trouble, s.now))
	case s.inFlight > 0 && s.attendance != nil && len(s.attendance.Silent) > 0:
		return stallSilent, fmt.Sprintf("%s at the workers; %s", plural(s.inFlight, "job"), silentPhrase(*s.attendance, s.ackWait))
	}
	text := plural(s.inFlight, "job") + " at the workers"
	if s.maxInFlight > 0 && s.inFlight >= s.maxInFlight {
		text += ", the fleet's cap (--max-ack-pending)"
	}
	if others := s.queued + s.inFlight - s.waiting; others > 0 {
		text += fmt.Sprintf("; %s of other batches queued or at work", plural(others, "job"))
	}
	return stallAtWorkers, text
}

// jobsWait says that n jobs wait, in the singular for one.
func jobsWait(n int) string {
	if n == 1 {
		return "1 job waits"
	}
	return plural(n, "job") + " wait"
}

// them is the pronoun for n jobs.
func them(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}

// heldPhrase says who holds results that the server cannot store, for how long, why, and
// what makes room.
func (s stall) heldPhrase() string {
	var longest *queue.HeldReport // the answer of the worker refused longest
	for i := range s.holders {
		if longest == nil || s.holders[i].For > longest.For {
			longest = &s.holders[i]
		}
	}
	who := "the workers hold"
	switch {
	case s.local:
		who = "the worker holds"
	case len(s.holders) == 1:
		who = "a worker on " + cmp.Or(longest.Host, "an unknown host") + " holds"
	case len(s.holders) > 1:
		who = fmt.Sprintf("%d workers hold", len(s.holders))
	}
	text := fmt.Sprintf("%s %s that the NATS server cannot store", who, plural(s.held, "result"))
	switch {
	case longest == nil: // the in-process worker's count, without its answer
		return text + " (is its disk full?)"
	case longest.Full && s.local:
		return fmt.Sprintf("%s, for %s: its store is full; delete finished batches (submit delete) or free disk space where %s is, and they are stored within seconds",
			text, longest.For.Round(time.Second), s.dataDir)
	case longest.Full:
		return fmt.Sprintf("%s, for %s: its JetStream store is full; make room (delete finished batches: submit delete; or raise the server's max_file_store) and they are stored at once",
			text, longest.For.Round(time.Second))
	case s.local:
		return fmt.Sprintf("%s, for %s (%s): is the disk of %s full? free space there, stop this command and run it again",
			text, longest.For.Round(time.Second), longest.Error, s.dataDir)
	}
	return fmt.Sprintf("%s, for %s (%s); they are tried again until the stream answers (a stream without a leader, a server restarting)",
		text, longest.For.Round(time.Second), longest.Error)
}

// idle reports whether no worker takes jobs: none asks for any, and none holds any, or no
// worker runs (a job handed back, or held by a worker that crashed, stays in flight until
// another worker takes it).
func (s stall) idle() bool {
	return s.gone() || s.pulls == 0 && s.inFlight == 0
}

// gone reports whether the workers' presence notes say that none runs.
func (s stall) gone() bool {
	return s.attendance != nil && len(s.attendance.Running) == 0 && s.pulls == 0
}

// silentPhrase words the workers that went silent without handing back their jobs (a
// crash, a lost connection): the jobs they held go out again once their ack wait passes.
func silentPhrase(a queue.Attendance, ackWait time.Duration) string {
	if len(a.Silent) > 1 {
		return fmt.Sprintf("%s, without handing back their jobs, which go out again once their ack wait (%s, --ack-wait) has passed", silentWho(a), ackWait)
	}
	return fmt.Sprintf("%s without handing back its jobs, which go out again once their ack wait (%s, --ack-wait) has passed", silentWho(a), ackWait)
}

// silentWho names the workers that went silent: the one, or how many and the last.
func silentWho(a queue.Attendance) string {
	last := a.Silent[0]
	for _, p := range a.Silent[1:] {
		if p.At.After(last.At) {
			last = p
		}
	}
	ago := max(a.Now.Sub(last.At), 0).Round(time.Second)
	host := cmp.Or(last.Host, "an unknown host")
	if len(a.Silent) == 1 {
		return fmt.Sprintf("a worker on %s went silent %s ago", host, ago)
	}
	return fmt.Sprintf("%d workers went silent, the last %s ago on %s", len(a.Silent), ago, host)
}

// retrying reports whether a worker put off a job of the batch lately.
func (s stall) retrying(since time.Duration) bool {
	return s.retry != nil && lately(s.retry.At, s.retry.RetryIn(), s.now, since)
}

// troubled reports whether a worker's client retried a request the service failed lately,
// or a worker stopped on a refused key about when the results stopped: its last results
// and its note leave it together, in either order.
func (s stall) troubled(since time.Duration) bool {
	if s.trouble == nil {
		return false
	}
	wait := s.trouble.RetryIn()
	if s.trouble.Stopped {
		wait = stoppedNoteSlack
	}
	return lately(s.trouble.At, wait, s.now, since)
}

// stoppedNoteSlack is how long before the results stopped a note of a worker that stopped
// may have been stored and still be why.
const stoppedNoteSlack = 5 * time.Second

// lately reports whether a note stored at at, of something put off for wait, concerns a
// reader who has had no result for since, at now in the server's clock: it was stored within
// since, or the wait had not ended since.
func lately(at time.Time, wait time.Duration, now time.Time, since time.Duration) bool {
	return now.Sub(at) <= wait+since
}

// noteTime words, at now in the server's clock, when a note of something put off for wait was
// stored and when that is due again: "the last 14s ago", "again in 6s".
func noteTime(at time.Time, wait time.Duration, now time.Time) (ago, next string) {
	since := max(now.Sub(at), 0)
	next = "due now"
	if left := wait - since; left >= time.Second {
		next = "again in " + left.Round(time.Second).String()
	}
	return "the last " + since.Round(time.Second).String() + " ago", next
}

// retryPhrase words a retry note as seen at now: the job, its delivery, when it is due again
// and why it failed.
func retryPhrase(n queue.RetryNote, now time.Time) string {
	ago, next := noteTime(n.At, n.RetryIn(), now)
	return fmt.Sprintf("%s: %q on delivery %d of %d, %s: %s", ago, n.CustomID, n.Delivery, n.MaxDeliver, next, n.Error)
}

// troublePhrase words a service note as seen at now: the request, what became of it, when it
// is tried again and the error.
func troublePhrase(n queue.ServiceNote, now time.Time) string {
	ago, next := noteTime(n.At, n.RetryIn(), now)
	what := fmt.Sprintf("%s answered %d", n.Endpoint, n.Status)
	if n.Status == 0 {
		what = n.Endpoint + " did not reach it"
	}
	if n.Stopped {
		next = "and a worker stopped"
	}
	return fmt.Sprintf("%s, %s, %s: %s", ago, what, next, n.Error)
}

// pauseCause says what a backoff's reason means.
func pauseCause(reason string) string {
	switch reason {
	case backoff.ReasonRateLimited:
		return "the Tinker service answers 429 (rate limited)"
	case backoff.ReasonBilling:
		return "the Tinker service answers 402 (payment required)"
	case backoff.ReasonPausedCapacity:
		return "the Tinker service's queue is paused for capacity"
	case backoff.ReasonPausedRateLimit:
		return "the Tinker service's queue is paused for the rate limit"
	}
	return "a worker signalled " + reason
}
