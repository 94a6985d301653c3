package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/tinkerfleet/tinkerfleet/internal/envflag"
	"github.com/tinkerfleet/tinkerfleet/internal/queue"
)

// batchCommand parses the flags of a subcommand that takes one batch id.
func batchCommand(name string, args []string, env *environment, extra func(*flag.FlagSet, *envflag.Set)) (connOptions, string, error) {
	var o connOptions
	fs, s := newFlagSet(name, env)
	o.register(s)
	if extra != nil {
		extra(fs, s)
	}
	if err := s.Err(); err != nil {
		return o, "", err
	}
	fs.Usage = func() {
		fmt.Fprintf(env.stderr, "usage: submit %s [flags] BATCH\n\nFlags:\n", name)
		fs.PrintDefaults()
	}
	rest, err := envflag.Parse(fs, args)
	if err != nil {
		return o, "", err
	}
	if err := o.checkLocal(fs); err != nil {
		return o, "", err
	}
	switch {
	case len(rest) == 0: // the flags are not what is missing
		return o, "", fmt.Errorf("%s needs a batch id (submit list shows them; submit %s -h, the flags): %w", name, name, errUsage)
	case len(rest) > 1:
		fs.Usage()
		return o, "", fmt.Errorf("%s takes one batch id, not %q: %w", name, rest, errUsage)
	}
	if o.conn.URL == "" || o.local {
		o.dataDir = storeOf(o.dataDir, rest[0])
	}
	return o, rest[0], queue.ValidateBatchID(rest[0])
}

// openBatch is batchCommand, then open: for a subcommand on one batch with no checks of its
// own before it connects. The caller closes the session.
func openBatch(ctx context.Context, name string, args []string, env *environment, extra func(*flag.FlagSet, *envflag.Set)) (*session, string, error) {
	o, batch, err := batchCommand(name, args, env, extra)
	if err != nil {
		return nil, "", err
	}
	sess, err := open(ctx, o, env)
	return sess, batch, err
}

// batchStatus is what `submit status` prints (as JSON with --json).
type batchStatus struct {
	queue.Manifest
	Results   int `json:"results"`
	OK        int `json:"ok"`
	Failed    int `json:"error"`
	Cancelled int `json:"cancelled"`
	// Usage sums the tokens of the ok results.
	Usage   queue.Tokens `json:"usage"`
	Waiting int          `json:"waiting"` // jobs still in the jobs stream (not yet acked)
	Done    bool         `json:"done"`    // every job of the batch has its result
	// Lost counts the results that will never come: none of the batch's jobs is left in the
	// queue, and its results expired (--results-max-age) or were removed.
	Lost int `json:"lost,omitempty"`
	// Activity says, while the batch is not done, what holds up its results: the fleet
	// paused, no worker, or how many jobs are at the workers.
	Activity string `json:"activity,omitempty"`
	// Workers, while the batch is not done, counts the workers running (from their presence
	// notes); absent when nobody can tell (no worker of the fleet backs off fleet-wide:
	// such workers keep no notes).
	Workers *workerCount `json:"workers,omitempty"`
}

// workerCount is batchStatus.Workers.
type workerCount struct {
	Running int      `json:"running"`
	Hosts   []string `json:"hosts"` // their host names, one per worker, sorted
}

func runStatus(ctx context.Context, args []string, env *environment) error {
	var asJSON bool
	sess, batch, err := openBatch(ctx, "status", args, env, func(fs *flag.FlagSet, _ *envflag.Set) {
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	})
	if err != nil {
		return err
	}
	defer sess.close()
	st, err := status(ctx, sess.q, batch, sess.alone())
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(env.stdout).Encode(st)
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "batch\t%s\n", st.BatchID)
	switch {
	case st.Done:
		fmt.Fprintf(tw, "status\t%s: done, every job has its result\n", st.Status)
	case st.Status == queue.BatchDeleted:
		fmt.Fprintf(tw, "status\t%s %s: its jobs, results and dead letters are removed\n", st.Status, st.DeletedAt.Local().Format(time.DateTime))
	case st.Lost > 0:
		fmt.Fprintf(tw, "status\t%s: %s\n", st.Status, lostPhrase(sess.q, st.Manifest, st.Lost))
	case st.Status == queue.BatchPublishing:
		fmt.Fprintf(tw, "status\t%s: its submit is publishing the jobs (if it was interrupted, run it again to finish)\n", st.Status)
	default:
		fmt.Fprintf(tw, "status\t%s: %s without a result yet\n", st.Status, plural(st.Jobs-st.Results, "job"))
	}
	fmt.Fprintf(tw, "created\t%s\n", st.CreatedAt.Local().Format(time.DateTime))
	fmt.Fprintf(tw, "jobs\t%d (%d lines rejected)\n", st.Jobs, st.Rejected)
	fmt.Fprintf(tw, "results\t%d of %d: ok %d, error %d, cancelled %d\n", st.Results, st.Jobs, st.OK, st.Failed, st.Cancelled)
	if st.Usage != (queue.Tokens{}) {
		fmt.Fprintf(tw, "tokens\t%s\n", tokensPhrase(st.Usage))
	}
	fmt.Fprintf(tw, "waiting\t%s in the queue\n", plural(st.Waiting, "job"))
	if st.Activity != "" {
		fmt.Fprintf(tw, "activity\t%s\n", st.Activity)
	}
	if w := st.Workers; w != nil {
		fmt.Fprintf(tw, "workers\t%s\n", workersPhrase(*w))
	}
	return tw.Flush()
}

// status counts a batch's results by status (reading headers only) and its waiting jobs, and
// says what holds up the rest; alone is session.alone.
func status(ctx context.Context, q *queue.Queue, batch string, alone bool) (batchStatus, error) {
	m, _, err := q.GetManifest(ctx, batch)
	if err != nil {
		return batchStatus{}, err
	}
	st := batchStatus{Manifest: m}
	if m.Status == queue.BatchDeleted {
		return st, nil // nothing of it is left to count
	}
	// The jobs first: a job leaves the queue only once its result is stored, so the results
	// counted after it include those of every job it no longer holds.
	if st.Waiting, _, err = jobsWaiting(ctx, q, batch); err != nil {
		return st, err
	}
	sum, err := follow(ctx, q, m, nil, resultNative, false, progressOptions{mode: "none"}, &environment{})
	if err != nil {
		return st, err
	}
	st.Results, st.OK, st.Failed, st.Cancelled, st.Usage = sum.total(), sum.ok, sum.failed, sum.cancelled, sum.tokens
	if st.Done = batchDone(m, st.Results); st.Done {
		return st, nil
	}
	if st.Lost = lost(m, st.Waiting, st.Results); st.Lost > 0 {
		return st, nil
	}
	s, err := examine(ctx, q, m, nil)
	if err != nil {
		return st, err
	}
	s.waiting, s.missing, s.alone = st.Waiting, m.Jobs-st.Results, alone
	_, st.Activity = s.why(statusLookBack)
	if a := s.attendance; a != nil {
		running := a.Running
		if alone {
			// No worker can reach a server of this command's own: a recent note is one a
			// worker left as it crashed with the run that held the store, and counts for
			// PresenceWindow, but runs no more.
			running = nil
		}
		st.Workers = &workerCount{Running: len(running), Hosts: make([]string, 0, len(running))}
		for _, p := range running {
			st.Workers.Hosts = append(st.Workers.Hosts, cmp.Or(p.Host, "?"))
		}
		slices.Sort(st.Workers.Hosts)
	}
	return st, nil
}

// workersPhrase words a count of workers for status: "2 running (host-a, host-b)"; past
// maxHostsShown hosts, how many more.
func workersPhrase(w workerCount) string {
	if w.Running == 0 {
		return "none running"
	}
	text := fmt.Sprintf("%d running (%s", w.Running, strings.Join(w.Hosts[:min(len(w.Hosts), maxHostsShown)], ", "))
	if more := len(w.Hosts) - maxHostsShown; more > 0 {
		text += fmt.Sprintf(" and %d more", more)
	}
	return text + ")"
}

// maxHostsShown bounds the hosts status names.
const maxHostsShown = 5

// statusLookBack is how recent a pause of the fleet must be for status to name it.
const statusLookBack = 10 * time.Second

func runResults(ctx context.Context, args []string, env *environment) error {
	var (
		output, format string
		wait           bool
		po             progressOptions
	)
	o, batch, err := batchCommand("results", args, env, func(fs *flag.FlagSet, s *envflag.Set) {
		po.register(s)
		fs.StringVar(&output, "o", "", "write the results to this JSONL file (.zst, .gz: compressed), resuming it if it exists (default standard output)")
		s.Bool(&wait, "wait", "TINKERFLEET_WAIT", false, "wait until every job has a result")
		registerResultFormat(s, &format)
	})
	if err != nil {
		return err
	}
	rf, err := parseResultFormat(format)
	if err != nil {
		return err
	}
	if err := po.check(); err != nil {
		return err
	}
	sess, err := open(ctx, o, env)
	if err != nil {
		return err
	}
	defer sess.close()
	m, err := resultsManifest(ctx, sess.q, batch)
	if err != nil {
		return err
	}
	// With no worker that can reach this server, a wait would never end, and would keep the
	// data directory from the submit --local run that samples the rest: read what is stored.
	stranded := wait && sess.alone()
	if stranded {
		wait = false
	}
	var sum summary
	if output == "" {
		if po.mode == "auto" && (writesToTerminal(env.stdout) || !isTerminal(env)) {
			// A bar on the terminal, and nothing else: the results on the terminal too, the
			// bar would come between them; and standard error off a terminal may be the
			// results' own file (nohup sends it there).
			po.mode = "none"
		}
		sum, err = follow(ctx, sess.q, m, env.stdout, rf, wait, po, env)
	} else {
		sum, err = followToFile(ctx, sess.q, m, output, rf, wait, po, env)
	}
	if err != nil && ctx.Err() != nil {
		goOn := "run the same command again to go on"
		if output == "" {
			goOn = "run it again to read them all (with -o FILE, a run appends only what the file lacks)"
		}
		return interruptedWith(sum, m, output, goOn)
	}
	if ended := sess.hostEnded(); err != nil && ended != "" {
		return fmt.Errorf("stopped with %d of %d results of batch %s%s: %s (%w); run the same command again to go on",
			sum.total(), m.Jobs, m.BatchID, outputNote(output), ended, err)
	}
	if err != nil {
		return err
	}
	if stranded && sum.total() < m.Jobs {
		// Results that will never come are not sampled by a rerun either, which would only
		// stop with this error.
		if lost, err := lostResults(ctx, sess.q, m, sum.total()); err == nil && lost > 0 {
			return lostErr(sess.q, m, lost)
		}
		return fmt.Errorf("%d of %d results of batch %s%s; no worker can take the rest: the NATS server runs in this command, which only reads; run the batch's submit --local command again (with -o) to sample them",
			sum.total(), m.Jobs, m.BatchID, outputNote(output))
	}
	fmt.Fprintf(env.stderr, "batch %s: %d of %d results (%d ok, %d error, %d cancelled)%s%s\n",
		batch, sum.total(), m.Jobs, sum.ok, sum.failed, sum.cancelled, outputNote(output), tokensNote(sum.tokens))
	if lost, err := lostResults(ctx, sess.q, m, sum.total()); err == nil && lost > 0 {
		fmt.Fprintf(env.stderr, "batch %s: %s\n", batch, lostPhrase(sess.q, m, lost))
	}
	return nil
}

func runCancel(ctx context.Context, args []string, env *environment) error {
	sess, batch, err := openBatch(ctx, "cancel", args, env, nil)
	if err != nil {
		return err
	}
	defer sess.close()
	results, err := sess.q.ResultsStored(ctx, batch)
	if err != nil {
		return err
	}
	m, err := sess.q.UpdateManifest(ctx, batch, func(m *queue.Manifest) error {
		switch {
		case m.Status == queue.BatchDeleted:
			return deletedErr(*m)
		case m.Status == queue.BatchCancelled:
			return errAlreadyCancelled
		case batchDone(*m, results):
			return errAlreadyDone // marking it cancelled would only mislabel its results
		}
		m.Status, m.CancelledAt = queue.BatchCancelled, time.Now().UTC()
		return nil
	})
	switch {
	case errors.Is(err, errAlreadyCancelled):
		fmt.Fprintf(env.stderr, "batch %s was already cancelled\n", batch)
		return nil
	case errors.Is(err, errAlreadyDone):
		fmt.Fprintf(env.stderr, "batch %s is done (every job has its result): nothing to cancel\n", batch)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stderr, "batch %s cancelled: its jobs not yet sampled end as cancelled results\n", m.BatchID)
	return nil
}

func runDelete(ctx context.Context, args []string, env *environment) error {
	sess, batch, err := openBatch(ctx, "delete", args, env, nil)
	if err != nil {
		return err
	}
	defer sess.close()
	m, _, err := sess.q.GetManifest(ctx, batch)
	if err != nil {
		return err
	}
	results, err := sess.q.ResultsStored(ctx, batch)
	if err != nil {
		return err
	}
	if !m.Ended() && !batchDone(m, results) {
		// A batch whose results were lost can go: nothing more will happen to it.
		waiting, _, err := jobsWaiting(ctx, sess.q, batch)
		if err != nil {
			return err
		}
		if lost(m, waiting, results) == 0 {
			return fmt.Errorf("batch %s is not done (%d of %d results): cancel it first (submit cancel %s), or wait for its results", batch, results, m.Jobs, batch)
		}
	}
	if err := sess.q.DeleteBatch(ctx, batch); err != nil {
		return err
	}
	fmt.Fprintf(env.stderr, "batch %s deleted: its %s, its jobs and dead letters are removed from the NATS server\n", batch, plural(results, "result"))
	return nil
}

// resultsManifest reads the manifest of batch for a command that reads its results: a
// deleted batch is an error (deletedErr).
func resultsManifest(ctx context.Context, q *queue.Queue, batch string) (queue.Manifest, error) {
	m, _, err := q.GetManifest(ctx, batch)
	if err == nil && m.Status == queue.BatchDeleted {
		err = deletedErr(m)
	}
	return m, err
}

// deletedErr says that the batch of m was deleted.
func deletedErr(m queue.Manifest) error {
	return fmt.Errorf("batch %s was deleted on %s: its results are gone", m.BatchID, m.DeletedAt.Local().Format(time.DateTime))
}

var (
	errAlreadyCancelled = errors.New("already cancelled")
	errAlreadyDone      = errors.New("already done")
)

func runList(ctx context.Context, args []string, env *environment) error {
	var o connOptions
	var asJSON bool
	fs, s := newFlagSet("list", env)
	o.register(s)
	fs.BoolVar(&asJSON, "json", false, "print JSON lines")
	if err := s.Err(); err != nil {
		return err
	}
	fs.Usage = func() {
		fmt.Fprint(env.stderr, "usage: submit list [flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	rest, err := envflag.Parse(fs, args)
	if err != nil {
		return err
	}
	if err := o.checkLocal(fs); err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("list takes no arguments, not %q (submit status BATCH tells of one batch): %w", rest, errUsage)
	}
	batches, err := listBatches(ctx, o, env)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(env.stdout)
		for _, b := range batches {
			if err := enc.Encode(b); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BATCH\tSTATUS\tJOBS\tRESULTS\tDONE\tREJECTED\tCREATED")
	for _, b := range batches {
		done := "no"
		switch {
		case b.Status == queue.BatchDeleted:
			done = "-" // its results are gone on purpose: neither done nor waiting
		case b.Done:
			done = "yes"
		case b.Lost > 0:
			done = fmt.Sprintf("no (%d lost)", b.Lost)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%s\n", b.BatchID, b.Status, b.Jobs, b.Results, done, b.Rejected, b.CreatedAt.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// listBatches lists the batches of o's store and, for a local store, those of its --simulate
// runs, kept in a store of their own (simulatedDataDir): a newcomer who ran the README's
// first command finds that batch here too, by its sim- id, which the other commands take.
func listBatches(ctx context.Context, o connOptions, env *environment) ([]listedBatch, error) {
	batches, err := listStore(ctx, o, env)
	local := o.conn.URL == "" || o.local
	if !local || isSimulatedDataDir(o.dataDir) {
		return batches, err
	}
	sim := o
	sim.dataDir = simulatedDataDir(o.dataDir)
	if fi, serr := os.Stat(sim.dataDir); serr != nil || !fi.IsDir() {
		return batches, err // no --simulate run here
	}
	if err != nil && !errors.Is(err, queue.ErrNoDataDir) {
		return nil, err
	}
	simulated, serr := listStore(ctx, sim, env)
	switch {
	case serr == nil:
		return append(batches, simulated...), nil
	case errors.Is(serr, queue.ErrNoDataDir) && err == nil:
		return batches, nil
	case errors.Is(serr, queue.ErrNoDataDir):
		return nil, err // neither store holds anything: the first error says where to look
	case err == nil:
		// The real batches are listed all the same: a --simulate run starting or ending
		// beside this command is no reason to print none.
		fmt.Fprintf(env.stderr, "the --simulate runs' batches in %s are not listed: %v\n", sim.dataDir, serr)
		return batches, nil
	default:
		return nil, fmt.Errorf("the --simulate runs' batches in %s: %w", sim.dataDir, serr)
	}
}

// listStore lists the batches of one store.
func listStore(ctx context.Context, o connOptions, env *environment) ([]listedBatch, error) {
	sess, err := open(ctx, o, env)
	if err != nil {
		return nil, err
	}
	defer sess.close()
	ms, err := sess.q.Manifests(ctx)
	if err != nil {
		return nil, err
	}
	// The jobs first: a job leaves the queue only once its result is stored.
	waiting, err := jobsWaitingAll(ctx, sess.q)
	if err != nil {
		return nil, err
	}
	counts, err := countResults(ctx, sess.q, ms)
	if err != nil {
		return nil, err
	}
	batches := make([]listedBatch, len(ms))
	for i, m := range ms {
		queued := int(waiting[sess.q.Names.JobSubject(m.BatchID)])
		batches[i] = listedBatch{Manifest: m, Results: counts[i], Done: batchDone(m, counts[i]), Lost: lost(m, queued, counts[i])}
	}
	return batches, nil
}

// countResults counts the results stored for each batch of ms, listCounters at a time: each
// count is two round trips to the server, which on a remote one add up over many batches.
func countResults(ctx context.Context, q *queue.Queue, ms []queue.Manifest) ([]int, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	counts := make([]int, len(ms))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(listCounters, len(ms)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(ms) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				n, err := q.ResultsStored(ctx, ms[i].BatchID)
				if err != nil {
					cancel(err) // the first error is the cause; the other counters stop
					return
				}
				counts[i] = n
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, err
	}
	return counts, nil
}

// listCounters is how many batches `submit list` counts the results of at once.
const listCounters = 8

// listedBatch is one line of `submit list` (as JSON with --json).
type listedBatch struct {
	queue.Manifest
	Results int  `json:"results"`        // jobs with a result stored
	Done    bool `json:"done"`           // every job of the batch has its result
	Lost    int  `json:"lost,omitempty"` // results that will never come (batchStatus.Lost)
}

// batchDone says whether a batch whose manifest is m, with results stored, is done: every
// job has its result and no submit is still publishing.
func batchDone(m queue.Manifest, results int) bool {
	return m.Status != queue.BatchPublishing && results >= m.Jobs
}
